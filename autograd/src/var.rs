//! [`Var`]: a tensor with `requires_grad`, an optional accumulated gradient,
//! and the node that produced it. Cheap to clone (one `Arc`).

use crate::error::{AutogradError, Result};
use crate::grad_mode::is_grad_enabled;
use crate::graph::{lock, BackwardCtx, BackwardFn, Node, OpBackward, PostAccumulateHook, SavedTensors};
use brasa_tensor::{DType, Device, Shape, Tensor};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

pub(crate) struct VarInner {
    pub(crate) tensor: Tensor,
    pub(crate) requires_grad: AtomicBool,
    pub(crate) grad: Mutex<Option<Tensor>>,
    pub(crate) grad_fn: Option<Arc<Node>>,
    /// A leaf's accumulation node, made on first use so all consumers share it.
    pub(crate) accumulator: OnceLock<Arc<Node>>,
    pub(crate) post_accumulate_hooks: Mutex<Vec<PostAccumulateHook>>,
}

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

    /// A leaf that requires grad (a parameter).
    pub fn param(tensor: Tensor) -> Var {
        Var::make(tensor, true, None)
    }

    /// A leaf that requires grad or not.
    pub fn from_tensor(tensor: Tensor, requires_grad: bool) -> Var {
        Var::make(tensor, requires_grad, None)
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
        if requires_grad && !self.dtype().is_float() {
            return Err(AutogradError::invalid(
                "requires_grad_",
                format!("only floating-point Vars can require grad, got {}", self.dtype()),
            ));
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

    /// Replaces the gradient.
    pub fn set_grad(&self, grad: Option<Tensor>) {
        *lock(&self.0.grad) = grad;
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

    /// Where this `Var`'s gradient goes: its producing node, or its
    /// accumulator when it is a leaf that requires grad.
    pub(crate) fn grad_node(&self) -> Option<Arc<Node>> {
        if let Some(node) = &self.0.grad_fn {
            return Some(Arc::clone(node));
        }
        if self.requires_grad() {
            return Some(Arc::clone(self.0.accumulator.get_or_init(|| Node::accumulate(Arc::downgrade(&self.0)))));
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

impl std::fmt::Debug for Var {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Var[{:?}, requires_grad {}", self.0.tensor, self.requires_grad())?;
        if let Some(name) = self.grad_fn_name() {
            write!(f, ", grad_fn {name}")?;
        }
        write!(f, "]")
    }
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

fn record_node(
    name: &'static str,
    inputs: &[&Var],
    output: Tensor,
    saved: impl FnOnce() -> Vec<Tensor>,
    f: BackwardFn,
) -> Var {
    if !is_grad_enabled() {
        return Var::new(output);
    }
    let next = inputs.iter().map(|v| v.grad_node()).collect();
    let node = Node::op(name, next, OpBackward { saved: SavedTensors::new(saved()), f });
    Var::make(output, true, Some(node))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaf_flags_and_detach() -> Result<()> {
        let w = Var::param(Tensor::ones([3], DType::F32)?);
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
