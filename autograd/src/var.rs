//! [`Var`]: a tensor with `requires_grad`, an optional accumulated gradient,
//! and the node that produced it. Cheap to clone (one `Arc`).

use crate::error::{AutogradError, Result};
use crate::grad_mode::is_grad_enabled;
use crate::graph::{lock, BackwardCtx, BackwardFn, Node, OpBackward, TensorMeta, VarInner};
use crate::saved::SavedTensors;
use crate::view_region::ViewRegion;
use brasa_tensor::{DType, Device, Shape, Tensor};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// A tensor that takes part in automatic differentiation.
///
/// Operations on `Var`s record a graph when grad mode is on (see
/// [`crate::no_grad`]) and an input requires grad; [`Var::backward`] walks it
/// back and accumulates gradients into the leaves that require grad.
#[derive(Clone)]
pub struct Var(pub(crate) Arc<VarInner>);

impl Var {
    fn make(tensor: Tensor, requires_grad: bool, grad_fn: Option<Arc<Node>>) -> Var {
        Var(Arc::new(VarInner {
            tensor,
            requires_grad: AtomicBool::new(requires_grad),
            grad: Mutex::new(None),
            grad_fn,
            accumulator: OnceLock::new(),
            post_accumulate_hooks: Mutex::new(Vec::new()),
        }))
    }

    /// A leaf that does not require grad (an input, a constant).
    pub fn new(tensor: Tensor) -> Var {
        Var::make(tensor, false, None)
    }

    /// A leaf that requires grad (a parameter). Only floating-point tensors
    /// can require grad: another dtype is an
    /// [`AutogradError::RequiresGradDtype`] (PyTorch's "only Tensors of
    /// floating point dtype can require gradients").
    pub fn param(tensor: Tensor) -> Result<Var> {
        let var = Var::from_tensor(tensor, true)?;
        // Its memory is a parameter's from now on (memory statistics and plans).
        var.tensor().storage().set_category(brasa_tensor::memory::MemoryCategory::Parameter);
        Ok(var)
    }

    /// A leaf that requires grad or not; requiring grad needs a
    /// floating-point tensor (see [`Var::param`]).
    pub fn from_tensor(tensor: Tensor, requires_grad: bool) -> Result<Var> {
        if requires_grad {
            check_differentiable("Var::from_tensor", tensor.dtype())?;
        }
        Ok(Var::make(tensor, requires_grad, None))
    }

    /// The tensor (a cheap handle to the same storage).
    pub fn tensor(&self) -> &Tensor {
        &self.0.tensor
    }

    /// Whether gradients flow to this `Var`.
    pub fn requires_grad(&self) -> bool {
        self.0.requires_grad.load(Ordering::Relaxed)
    }

    /// Sets `requires_grad` on a leaf; a non-leaf always requires grad, so
    /// turning it off there is an error (use [`Var::detach`]).
    pub fn requires_grad_(&self, requires_grad: bool) -> Result<&Var> {
        if !self.is_leaf() && !requires_grad {
            return Err(AutogradError::invalid(
                "requires_grad_",
                "a non-leaf Var always requires grad; use detach() for a Var outside the graph",
            ));
        }
        if requires_grad {
            check_differentiable("requires_grad_", self.dtype())?;
        }
        self.0.requires_grad.store(requires_grad, Ordering::Relaxed);
        Ok(self)
    }

    /// Whether this `Var` was not produced by a recorded operation.
    pub fn is_leaf(&self) -> bool {
        self.0.grad_fn.is_none()
    }

    /// The name of the operation that produced this `Var`, if recorded.
    pub fn grad_fn_name(&self) -> Option<&'static str> {
        self.0.grad_fn.as_ref().map(|n| n.name)
    }

    /// The accumulated gradient (leaves, and non-leaves with [`Var::retain_grad`]).
    pub fn grad(&self) -> Option<Tensor> {
        lock(&self.0.grad).clone()
    }

    /// Replaces the gradient (`None` drops it). A gradient must have this
    /// `Var`'s shape, dtype and device, as PyTorch's `.grad =` demands
    /// ("assigned grad has data of a different size / type / device"):
    /// otherwise an error, and the gradient is left as it was.
    pub fn set_grad(&self, grad: Option<Tensor>) -> Result<()> {
        if let Some(g) = &grad {
            check_grad_fits("set_grad", "was given", g, self.tensor(), true)?;
        }
        *lock(&self.0.grad) = grad;
        Ok(())
    }

    /// Clears the gradient: `set_to_none` drops it (frees its memory, PyTorch's
    /// default); otherwise it is zeroed in place.
    pub fn zero_grad(&self, set_to_none: bool) -> Result<()> {
        let mut slot = lock(&self.0.grad);
        if set_to_none {
            *slot = None;
        } else if let Some(g) = slot.as_ref() {
            g.zero_()?;
        }
        Ok(())
    }

    /// The same tensor as a new leaf outside the graph.
    pub fn detach(&self) -> Var {
        Var::new(self.0.tensor.clone())
    }

    /// The only element as a number; holds nothing of the graph.
    pub fn item(&self) -> Result<f64> {
        Ok(self.0.tensor.item::<f64>()?)
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        self.0.tensor.shape()
    }

    /// The sizes of the dimensions.
    pub fn dims(&self) -> &[usize] {
        self.0.tensor.dims()
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.tensor.rank()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.0.tensor.numel()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.0.tensor.dtype()
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.0.tensor.device()
    }

    /// Whether two `Var`s are the same object.
    pub fn same_var(&self, other: &Var) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// A handle that does not keep this `Var` alive (for registries keyed
    /// by `Var`s, which must not extend their lives).
    pub fn downgrade(&self) -> WeakVar {
        WeakVar(Arc::downgrade(&self.0))
    }

    /// Where this `Var`'s gradient goes: its producing node, or its
    /// accumulator when it is a leaf that requires grad.
    pub(crate) fn grad_node(&self) -> Option<Arc<Node>> {
        if let Some(node) = &self.0.grad_fn {
            return Some(Arc::clone(node));
        }
        if self.requires_grad() {
            return Some(Arc::clone(
                self.0
                    .accumulator
                    .get_or_init(|| Node::accumulate(Arc::downgrade(&self.0), TensorMeta::of(&self.0.tensor))),
            ));
        }
        None
    }

    /// The node hooks of this `Var` attach to.
    pub(crate) fn hook_node(&self, op: &'static str) -> Result<Arc<Node>> {
        self.grad_node().ok_or_else(|| {
            AutogradError::invalid(op, "this Var does not require grad, so no gradient will reach a hook on it")
        })
    }
}

/// A [`Var`] that is not kept alive by this handle ([`Var::downgrade`]).
#[derive(Clone)]
pub struct WeakVar(std::sync::Weak<VarInner>);

impl WeakVar {
    /// The `Var`, if it is still alive.
    pub fn upgrade(&self) -> Option<Var> {
        self.0.upgrade().map(Var)
    }

    /// Whether this handle points to `var`.
    pub fn is(&self, var: &Var) -> bool {
        std::ptr::eq(self.0.as_ptr(), Arc::as_ptr(&var.0))
    }
}

impl std::fmt::Debug for WeakVar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WeakVar({})", if self.0.strong_count() > 0 { "alive" } else { "dropped" })
    }
}

impl std::fmt::Debug for Var {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Var[{:?}, requires_grad {}", self.0.tensor, self.requires_grad())?;
        if let Some(name) = self.grad_fn_name() {
            write!(f, ", grad_fn {name}")?;
        }
        write!(f, "]")
    }
}

/// An error unless tensors of `dtype` can require grad (floating point).
pub(crate) fn check_differentiable(op: &'static str, dtype: DType) -> Result<()> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(AutogradError::RequiresGradDtype { op, dtype })
    }
}

/// An error unless gradient `grad` fits `tensor`: the same shape and device,
/// and, when `same_dtype`, the same dtype. `context` says where the gradient
/// came from, for the message.
pub(crate) fn check_grad_fits(
    op: &'static str,
    context: &'static str,
    grad: &Tensor,
    tensor: &Tensor,
    same_dtype: bool,
) -> Result<()> {
    check_grad_meta(op, context, grad, &TensorMeta::of(tensor), same_dtype)
}

/// [`check_grad_fits`] against a tensor's recorded shape, dtype and device.
pub(crate) fn check_grad_meta(
    op: &'static str,
    context: &'static str,
    grad: &Tensor,
    meta: &TensorMeta,
    same_dtype: bool,
) -> Result<()> {
    if grad.dims() != meta.dims.as_slice() {
        return Err(AutogradError::GradShape { op, context, got: grad.dims().to_vec(), expected: meta.dims.clone() });
    }
    if grad.device() != meta.device {
        return Err(AutogradError::GradDevice { op, context, got: grad.device(), expected: meta.device });
    }
    if same_dtype && grad.dtype() != meta.dtype {
        return Err(AutogradError::GradDtype { op, context, got: grad.dtype(), expected: meta.dtype });
    }
    Ok(())
}

thread_local! {
    /// While checkpoints run their function without a graph (innermost
    /// last): the nodes of the inputs requiring grad that operations read
    /// without recording them.
    static UNRECORDED_READS: std::cell::RefCell<Vec<Vec<Arc<Node>>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Notes, for the checkpoint running on this thread if any, that an
/// operation read `inputs` without recording a graph.
fn note_unrecorded(inputs: &[&Var]) {
    UNRECORDED_READS.with(|reads| {
        if let Ok(mut reads) = reads.try_borrow_mut() {
            if let Some(top) = reads.last_mut() {
                top.extend(inputs.iter().filter(|v| v.requires_grad()).filter_map(|v| v.grad_node()));
            }
        }
    });
}

/// Ends a [`watch_unrecorded`] scope, even when its function panics.
struct PopReads;

impl Drop for PopReads {
    fn drop(&mut self) {
        UNRECORDED_READS.with(|reads| {
            if let Ok(mut reads) = reads.try_borrow_mut() {
                reads.pop();
            }
        });
    }
}

/// Runs `f` and returns what it returned and the nodes (each once) of the
/// inputs requiring grad that its operations read without recording them
/// (with grad mode off): what a checkpoint's function uses besides its
/// inputs. Nested scopes each see their own reads; an inner scope's reads
/// are the outer one's too.
pub(crate) fn watch_unrecorded<T>(f: impl FnOnce() -> T) -> (T, Vec<Arc<Node>>) {
    UNRECORDED_READS.with(|reads| {
        if let Ok(mut reads) = reads.try_borrow_mut() {
            reads.push(Vec::new());
        }
    });
    let pop = PopReads;
    let out = f();
    let nodes = UNRECORDED_READS.with(|reads| match reads.try_borrow_mut() {
        Ok(mut reads) => reads.last_mut().map(std::mem::take).unwrap_or_default(),
        Err(_) => Vec::new(),
    });
    drop(pop);
    let mut seen = std::collections::HashSet::new();
    let nodes: Vec<Arc<Node>> = nodes.into_iter().filter(|n| seen.insert(Node::key(n))).collect();
    // What the inner scope read, the outer one read too.
    UNRECORDED_READS.with(|reads| {
        if let Ok(mut reads) = reads.try_borrow_mut() {
            if let Some(outer) = reads.last_mut() {
                outer.extend(nodes.iter().cloned());
            }
        }
    });
    (out, nodes)
}

/// Whether an operation on `inputs` is recorded.
pub(crate) fn should_record(inputs: &[&Var]) -> bool {
    is_grad_enabled() && inputs.iter().any(|v| v.requires_grad())
}

/// The output of an operation: recorded with `backward` (given `saved`) when
/// grad mode is on and an input requires grad, else a plain `Var`.
pub(crate) fn record(
    name: &'static str,
    inputs: &[&Var],
    output: Tensor,
    saved: impl FnOnce() -> Vec<Tensor>,
    backward: impl FnMut(&BackwardCtx) -> Result<Vec<Option<Tensor>>> + Send + 'static,
) -> Var {
    if !should_record(inputs) {
        if !is_grad_enabled() {
            note_unrecorded(inputs);
        }
        return Var::new(output);
    }
    record_always(name, inputs, output, saved, backward)
}

/// [`record`] whenever grad mode is on, even if no input requires grad
/// (checkpoint: the function may use parameters that do).
pub(crate) fn record_always(
    name: &'static str,
    inputs: &[&Var],
    output: Tensor,
    saved: impl FnOnce() -> Vec<Tensor>,
    backward: impl FnMut(&BackwardCtx) -> Result<Vec<Option<Tensor>>> + Send + 'static,
) -> Var {
    record_node(name, inputs, output, saved, BackwardFn::Borrowed(Box::new(backward)))
}

/// [`record_always`] for a backward that takes the output gradient by value.
pub(crate) fn record_always_owned(
    name: &'static str,
    inputs: &[&Var],
    output: Tensor,
    saved: impl FnOnce() -> Vec<Tensor>,
    backward: impl FnMut(Tensor, &[Tensor], &[bool]) -> Result<Vec<Option<Tensor>>> + Send + 'static,
) -> Var {
    record_node(name, inputs, output, saved, BackwardFn::Owned(Box::new(backward)))
}

/// Records a view of `input` (`narrow`, `slice`, `select`) whose backward
/// places the gradient in `region` of the input's gradient: the engine does
/// it, into one gradient per input, however many views of it are used.
pub(crate) fn record_view(name: &'static str, input: &Var, output: Tensor, region: ViewRegion) -> Var {
    if !should_record(&[input]) {
        if !is_grad_enabled() {
            note_unrecorded(&[input]);
        }
        return Var::new(output);
    }
    record_node(name, &[input], output, Vec::new, BackwardFn::Place(region))
}

fn record_node(
    name: &'static str,
    inputs: &[&Var],
    output: Tensor,
    saved: impl FnOnce() -> Vec<Tensor>,
    f: BackwardFn,
) -> Var {
    // An integer or bool result has no gradient: it cuts the graph (a cast
    // to an integer dtype, an argmax), as in PyTorch.
    if !is_grad_enabled() {
        note_unrecorded(inputs);
        return Var::new(output);
    }
    if !output.dtype().is_float() {
        return Var::new(output);
    }
    let next = inputs.iter().map(|v| v.grad_node()).collect();
    let meta = TensorMeta::of(&output);
    // The operations return what this records as their `Ok` result, so a
    // saved-tensor pack hook's error cannot end the operation: the node is
    // recorded without its saved tensors, and backward through it returns
    // the error (naming the operation and the hook).
    let saved = SavedTensors::new(name, saved()).unwrap_or_else(SavedTensors::failed);
    let node = Node::op(name, next, meta, OpBackward { saved, f });
    Var::make(output, true, Some(node))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaf_flags_and_detach() -> Result<()> {
        let w = Var::param(Tensor::ones([3], DType::F32)?)?;
        assert!(w.is_leaf() && w.requires_grad());
        let y = w.mul_scalar(3.0)?;
        assert!(!y.is_leaf() && y.requires_grad());
        assert_eq!(y.grad_fn_name(), Some("mul_scalar"));
        let d = y.detach();
        assert!(d.is_leaf() && !d.requires_grad());
        assert!(d.tensor().shares_storage_with(y.tensor()));
        assert!(y.requires_grad_(false).is_err());
        let ints = Var::new(Tensor::zeros([2], DType::I64)?);
        assert!(ints.requires_grad_(true).is_err());
        Ok(())
    }

    #[test]
    fn no_record_without_grad() -> Result<()> {
        let x = Var::new(Tensor::ones([3], DType::F32)?);
        let y = x.exp()?;
        assert!(y.is_leaf() && !y.requires_grad());
        Ok(())
    }
}
