//! The engine: from the roots, count how many consumers feed each reachable
//! node, then run every node once all of them have contributed its gradient
//! (a node's incoming gradients are summed). Each node's saved tensors are
//! released right after its backward ran unless the graph is retained, so
//! memory falls as backward goes. Iterative throughout: deep graphs do not
//! overflow the stack.

use crate::error::{AutogradError, Result};
use crate::grad_mode::no_grad;
use crate::graph::{lock, reachable, BackwardCtx, BackwardFn, Node, NodeKind, TensorMeta, VarInner};
use crate::var::{check_grad_fits, check_grad_meta, Var};
use crate::view_region::ViewRegion;
use brasa_tensor::Tensor;
use std::collections::HashMap;
use std::sync::Arc;

/// What a run of the engine does with gradients reaching leaves and the
/// nodes it was asked about.
pub(crate) struct RunOptions<'a> {
    pub(crate) retain_graph: bool,
    /// Accumulate into the `.grad` of leaves (false for [`grad`]).
    pub(crate) accumulate_leaves: bool,
    /// Nodes whose incoming gradient is returned; captured leaf
    /// accumulators do not accumulate.
    pub(crate) capture: &'a [Arc<Node>],
}

/// Whether `g` is referenced nowhere else and spans its whole storage.
fn is_exclusive(g: &Tensor) -> bool {
    Arc::strong_count(g.storage()) == 1 && g.storage().len() == g.numel()
}

/// `g` as a gradient the caller may keep and update in place: dense (in
/// its own order: a channels-last gradient stays so) and not sharing
/// storage with anything else.
fn owned(g: Tensor) -> Result<Tensor> {
    if is_exclusive(&g) && g.dense_dim_order().is_some() {
        return Ok(g);
    }
    Ok(g.copy_in_layout_of(&g)?)
}

/// `g` as the new `.grad` of `tensor`: owned as by [`owned`], and laid out
/// as `tensor` is: row-major, or in `tensor`'s order when that is dense in
/// another one (a channels-last weight gets a channels-last gradient:
/// PyTorch's layout contract for accumulated gradients), so that a parameter, its gradient
/// and optimizer state made with `zeros_like_preserve_format` walk memory
/// in step and the fused optimizers take them without copies.
fn owned_in_layout_of(g: Tensor, tensor: &Tensor) -> Result<Tensor> {
    let laid_out = match tensor.dense_dim_order() {
        Some(order) if !tensor.is_contiguous() => g.permute(&order)?.is_contiguous(),
        _ => g.is_contiguous(),
    };
    if laid_out && is_exclusive(&g) {
        return Ok(g);
    }
    Ok(g.copy_in_layout_of(tensor)?)
}

/// Adds `g` into `slot`: in place when a gradient is there (no allocation),
/// else `g` itself (copied if it is shared, or not laid out as `tensor` is:
/// see [`owned_in_layout_of`]). `g` must have
/// `tensor`'s shape and device (a dtype of its own is converted).
pub(crate) fn accumulate_into(slot: &mut Option<Tensor>, g: Tensor, tensor: &Tensor) -> Result<()> {
    check_grad_fits("backward", "computed", &g, tensor, false)?;
    let g = if g.dtype() != tensor.dtype() { g.to_dtype(tensor.dtype())? } else { g };
    match slot {
        Some(existing) => existing.add_(&g)?,
        None => {
            // The leaf's own copy from now on: counted as a gradient.
            let g = owned_in_layout_of(g, tensor)?;
            g.storage().set_category(brasa_tensor::memory::MemoryCategory::Gradient);
            *slot = Some(g);
        }
    }
    Ok(())
}

fn accumulate_leaf(var: &Arc<VarInner>, g: Tensor) -> Result<()> {
    accumulate_into(&mut lock(&var.grad), g, &var.tensor)?;
    let hooks = lock(&var.post_accumulate_hooks).clone();
    for hook in hooks {
        hook(var)?;
    }
    Ok(())
}

/// A node's incoming gradient while its consumers contribute to it.
struct Pending {
    grad: Tensor,
    /// Made by the engine and referenced nowhere else, so later
    /// contributions may be added into it in place.
    exclusive: bool,
}

/// What a node's backward gives one of its inputs.
#[derive(Clone)]
enum Contribution {
    /// A gradient of the input's shape.
    Whole(Tensor),
    /// The gradient of a view: zero outside `region` of the input.
    Placed(Tensor, ViewRegion),
}

fn add_grad(pending: &mut HashMap<usize, Pending>, key: usize, g: Tensor) -> Result<()> {
    let entry = match pending.remove(&key) {
        // Out of place: either gradient may alias another one still in use.
        Some(existing) => Pending { grad: existing.grad.add(&g)?, exclusive: true },
        None => Pending { grad: g, exclusive: false },
    };
    pending.insert(key, entry);
    Ok(())
}

/// Adds the gradient of a view into `region` of the pending gradient of
/// the node described by `meta`: into the engine's own gradient in place,
/// else into a new one (zeros, or a copy of a gradient others hold).
fn add_placed(
    pending: &mut HashMap<usize, Pending>,
    key: usize,
    meta: &TensorMeta,
    g: Tensor,
    region: ViewRegion,
    op: &'static str,
) -> Result<()> {
    let (full, fresh) = match pending.remove(&key) {
        Some(Pending { grad, exclusive: true }) => (grad, false),
        Some(Pending { grad, exclusive: false }) => (owned(grad)?, false),
        None => (Tensor::zeros_on(meta.dims.as_slice(), meta.dtype, meta.device)?, true),
    };
    let target = region.of(&full)?;
    // The region has the view's shape by construction; a gradient of another
    // shape would be broadcast into it.
    if target.dims() != g.dims() {
        return Err(AutogradError::GradShape {
            op,
            context: "backward returned",
            got: g.dims().to_vec(),
            expected: target.dims().to_vec(),
        });
    }
    if g.device() != meta.device {
        return Err(AutogradError::GradDevice {
            op,
            context: "backward returned",
            got: g.device(),
            expected: meta.device,
        });
    }
    let g = if g.dtype() != full.dtype() { g.to_dtype(full.dtype())? } else { g };
    if fresh {
        target.copy_(&g)?;
    } else {
        target.add_(&g)?;
    }
    pending.insert(key, Pending { grad: full, exclusive: true });
    Ok(())
}

/// Runs backward from `roots` (each with its output gradient) and returns
/// the gradients reaching `options.capture`, in order.
pub(crate) fn run_backward(roots: Vec<(Arc<Node>, Tensor)>, options: RunOptions) -> Result<Vec<Option<Tensor>>> {
    let scope = crate::callbacks::BackwardScope::enter();
    let captured = run_graph(roots, options)?;
    scope.finish()?;
    Ok(captured)
}

fn run_graph(roots: Vec<(Arc<Node>, Tensor)>, options: RunOptions) -> Result<Vec<Option<Tensor>>> {
    let root_nodes: Vec<Arc<Node>> = roots.iter().map(|(n, _)| Arc::clone(n)).collect();
    let nodes = reachable(&root_nodes);
    let mut dependencies: HashMap<usize, usize> = nodes.iter().map(|n| (Node::key(n), 0)).collect();
    for node in &nodes {
        for child in node.next.iter().flatten() {
            *dependencies.entry(Node::key(child)).or_insert(0) += 1;
        }
    }
    drop(nodes);
    let capture_index: HashMap<usize, usize> =
        options.capture.iter().enumerate().map(|(i, n)| (Node::key(n), i)).collect();
    let mut captured: Vec<Option<Tensor>> = vec![None; options.capture.len()];
    let mut pending: HashMap<usize, Pending> = HashMap::new();
    let mut ready: Vec<Arc<Node>> = Vec::new();
    for (node, g) in roots {
        let key = Node::key(&node);
        add_grad(&mut pending, key, g)?;
        if dependencies.get(&key) == Some(&0) && !ready.iter().any(|n| Node::key(n) == key) {
            ready.push(node);
        }
    }
    let _no_grad = no_grad();
    while let Some(node) = ready.pop() {
        let key = Node::key(&node);
        let mut grad = pending.remove(&key).map(|p| p.grad);
        if let Some(g) = grad.take() {
            grad = Some(run_pre_hooks(&node, g)?);
        }
        if let Some(i) = capture_index.get(&key) {
            captured[*i] = grad.clone();
        }
        let outputs = match &node.kind {
            NodeKind::Accumulate(var) => {
                if let (Some(g), Some(var), true) = (grad, var.upgrade(), options.accumulate_leaves) {
                    if !capture_index.contains_key(&key) {
                        accumulate_leaf(&var, g)?;
                    }
                }
                continue;
            }
            NodeKind::Op(slot) => match grad {
                None => vec![None; node.next.len()],
                Some(g) => run_op(&node, slot, g, options.retain_graph)?,
            },
        };
        if outputs.len() != node.next.len() {
            return Err(AutogradError::invalid(
                node.name,
                format!("backward returned {} gradients for {} inputs", outputs.len(), node.next.len()),
            ));
        }
        for (child, g) in node.next.iter().zip(outputs) {
            let Some(child) = child else { continue };
            let child_key = Node::key(child);
            match g {
                Some(Contribution::Whole(g)) => {
                    // A backward (a custom one above all) that returns a
                    // gradient of another shape or device would otherwise be
                    // broadcast or carried into what follows.
                    check_grad_meta(node.name, "backward returned", &g, &child.meta, false)?;
                    add_grad(&mut pending, child_key, g)?;
                }
                Some(Contribution::Placed(g, region)) => {
                    add_placed(&mut pending, child_key, &child.meta, g, region, node.name)?;
                }
                None => {}
            }
            if let Some(count) = dependencies.get_mut(&child_key) {
                *count -= 1;
                if *count == 0 {
                    ready.push(Arc::clone(child));
                }
            }
        }
    }
    Ok(captured)
}

fn run_pre_hooks(node: &Node, mut g: Tensor) -> Result<Tensor> {
    let hooks = lock(&node.pre_hooks).clone();
    for hook in hooks {
        if let Some(replaced) = hook(&g)? {
            // PyTorch: "hook has changed the size / type of value". A
            // replacement of another shape would be broadcast into `.grad`.
            check_grad_meta("register_hook", "the hook returned", &replaced, &node.meta, false)?;
            if replaced.dtype() != g.dtype() {
                return Err(AutogradError::GradDtype {
                    op: "register_hook",
                    context: "the hook returned",
                    got: replaced.dtype(),
                    expected: g.dtype(),
                });
            }
            g = replaced;
        }
    }
    let retained = lock(&node.retained).as_ref().and_then(std::sync::Weak::upgrade);
    if let Some(var) = retained {
        accumulate_into(&mut lock(&var.grad), g.clone(), &var.tensor)?;
    }
    Ok(g)
}

fn run_op(
    node: &Node,
    slot: &std::sync::Mutex<Option<crate::graph::OpBackward>>,
    g: Tensor,
    retain_graph: bool,
) -> Result<Vec<Option<Contribution>>> {
    // Taken out of the node while it runs, so a backward that runs the
    // engine itself (checkpoint) holds no lock.
    let mut backward = lock(slot).take().ok_or(AutogradError::GraphReleased { op: node.name })?;
    // A profiler range per node ("backward: linear"), named only while one records.
    let _range = brasa_profile::enabled()
        .then(|| brasa_profile::record_function_with_shapes(format!("backward: {}", node.name), &[g.dims()]));
    let needs: Vec<bool> = node.next.iter().map(Option::is_some).collect();
    // Unpacked (by saved-tensor hooks) for this backward only: dropped as
    // soon as it returns.
    let whole = |grads: Vec<Option<Tensor>>| grads.into_iter().map(|g| g.map(Contribution::Whole)).collect();
    let result = match (backward.saved.unpack(node.name), &mut backward.f) {
        (Ok(saved), BackwardFn::Borrowed(f)) => f(&BackwardCtx { grad: &g, saved: &saved, needs: &needs }).map(whole),
        (Ok(saved), BackwardFn::Owned(f)) => f(g, &saved, &needs).map(whole),
        (Ok(_), BackwardFn::Place(region)) => Ok(vec![Some(Contribution::Placed(g, *region))]),
        (Err(e), _) => Err(e),
    };
    if retain_graph || result.is_err() {
        *lock(slot) = Some(backward);
    }
    // Otherwise `backward` drops here: the saved tensors are released.
    result
}

/// Gradients of `outputs` (with `grad_outputs`, ones for one-element
/// outputs when `None`) with respect to `inputs`, without touching any
/// `.grad` (`torch.autograd.grad`). `None` for an input the outputs do not
/// depend on.
pub fn grad(
    outputs: &[&Var],
    inputs: &[&Var],
    grad_outputs: Option<&[&Tensor]>,
    retain_graph: bool,
) -> Result<Vec<Option<Tensor>>> {
    let roots = roots_of(outputs, grad_outputs)?;
    let capture: Vec<Arc<Node>> = inputs
        .iter()
        .map(|v| v.grad_node().ok_or_else(|| AutogradError::invalid("grad", "an input does not require grad")))
        .collect::<Result<_>>()?;
    run_backward(roots, RunOptions { retain_graph, accumulate_leaves: false, capture: &capture })
}

fn roots_of(outputs: &[&Var], grad_outputs: Option<&[&Tensor]>) -> Result<Vec<(Arc<Node>, Tensor)>> {
    if let Some(g) = grad_outputs {
        if g.len() != outputs.len() {
            return Err(AutogradError::invalid(
                "backward",
                format!("{} gradients given for {} outputs", g.len(), outputs.len()),
            ));
        }
    }
    let mut roots = Vec::with_capacity(outputs.len());
    for (i, out) in outputs.iter().enumerate() {
        let node = out.grad_node().ok_or_else(|| {
            AutogradError::NoGraph(
                "backward: this Var does not require grad and has no graph (was it computed under no_grad, or \
                 from inputs that do not require grad?)"
                    .into(),
            )
        })?;
        let g = match grad_outputs {
            Some(g) => {
                check_grad_fits("backward", "was given", g[i], out.tensor(), false)?;
                if g[i].dtype() != out.dtype() {
                    g[i].to_dtype(out.dtype())?
                } else {
                    g[i].clone()
                }
            }
            None if out.numel() == 1 => out.tensor().ones_like()?,
            None => {
                return Err(AutogradError::invalid(
                    "backward",
                    format!(
                        "an implicit gradient needs a one-element output, got shape {:?}; pass the output's \
                         gradient with backward_with",
                        out.dims()
                    ),
                ))
            }
        };
        roots.push((node, g));
    }
    Ok(roots)
}

impl Var {
    /// Backpropagates from this one-element `Var` (gradient 1), accumulating
    /// into the `.grad` of every leaf that requires grad, and releases the
    /// graph's saved tensors as it goes.
    pub fn backward(&self) -> Result<()> {
        self.backward_opts(None, false)
    }

    /// [`Var::backward`] with the gradient of this `Var` given.
    pub fn backward_with(&self, grad: &Tensor) -> Result<()> {
        self.backward_opts(Some(grad), false)
    }

    /// Backward with an optional output gradient; `retain_graph` keeps the
    /// saved tensors so backward can run through the graph again.
    pub fn backward_opts(&self, grad: Option<&Tensor>, retain_graph: bool) -> Result<()> {
        let grads = grad.map(|g| [g]);
        let roots = roots_of(&[self], grads.as_ref().map(|g| g.as_slice()))?;
        run_backward(roots, RunOptions { retain_graph, accumulate_leaves: true, capture: &[] })?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brasa_tensor::DType;

    fn vec(t: &Tensor) -> Vec<f64> {
        t.to_dtype(DType::F64).and_then(|t| t.to_vec::<f64>()).unwrap_or_default()
    }

    #[test]
    fn diamond_sums_gradients() -> Result<()> {
        let x = Var::param(Tensor::from_vec(vec![1.0f64, 2.0], [2])?)?;
        let a = x.mul_scalar(2.0)?;
        let b = x.mul(&x)?;
        let y = a.add(&b)?.sum_all()?;
        y.backward()?;
        assert_eq!(vec(&x.grad().unwrap_or(x.tensor().zeros_like()?)), [4.0, 6.0]);
        Ok(())
    }

    #[test]
    fn a_leaf_gets_its_gradient_in_its_own_dense_layout() -> Result<()> {
        use brasa_tensor::Conv2dParams;
        let x = Var::new(Tensor::arange(0.0, 2.0 * 3.0 * 5.0 * 5.0, 1.0, DType::F32)?.reshape(&[2, 3, 5, 5])?);
        let w_values = Tensor::arange(-40.0, 41.0, 1.0, DType::F32)?.mul_scalar(0.01)?.reshape(&[3, 3, 3, 3])?;
        let params = Conv2dParams::default().with_padding((1, 1));
        let mut grads = Vec::new();
        for w in [w_values.clone(), w_values.to_channels_last()?] {
            let w = Var::param(w)?;
            // Twice: the second backward adds into the first's gradient.
            for _ in 0..2 {
                let y = x.conv2d(&w, None, params)?;
                y.mul(&y)?.sum_all()?.backward()?;
            }
            let g = w.grad().ok_or_else(|| AutogradError::invalid("test", "no gradient"))?;
            assert_eq!(g.strides(), w.tensor().strides(), "the gradient follows the weight's layout");
            grads.push(vec(&g));
        }
        // A channels-last weight runs the channels-last convolution, which
        // sums in another order: the same values up to rounding.
        for (a, b) in grads[0].iter().zip(&grads[1]) {
            assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0), "same values in either layout: {a} vs {b}");
        }
        // A transposed matrix parameter: a transposed gradient.
        let m = Var::param(Tensor::ones([3, 4], DType::F32)?.transpose(0, 1)?)?;
        m.mul_scalar(2.0)?.sum_all()?.backward()?;
        let g = m.grad().ok_or_else(|| AutogradError::invalid("test", "no gradient"))?;
        assert_eq!((g.strides(), vec(&g)), (m.tensor().strides(), vec![2.0; 12]));
        Ok(())
    }

    #[test]
    fn a_gradient_already_laid_out_and_unshared_is_kept_not_copied() -> Result<()> {
        let weight = Tensor::zeros([4, 3, 2, 2], DType::F32)?.to_channels_last()?;
        for like in [weight.clone(), weight.contiguous()?] {
            let g = Tensor::ones([4, 3, 2, 2], DType::F32)?.copy_in_layout_of(&like)?;
            let probe = g.permute(&[0, 1, 2, 3])?; // shares g's storage
            let mut slot = None;
            accumulate_into(&mut slot, g, &like)?;
            let kept = slot.ok_or_else(|| AutogradError::invalid("test", "no gradient"))?;
            assert!(!kept.shares_storage_with(&probe), "a gradient shared with a probe is copied...");
            drop(probe);
            // ...and one nobody else holds is kept as it is.
            let g = Tensor::ones([4, 3, 2, 2], DType::F32)?.copy_in_layout_of(&like)?;
            let storage = std::sync::Arc::as_ptr(g.storage());
            let mut slot = None;
            accumulate_into(&mut slot, g, &like)?;
            let kept = slot.ok_or_else(|| AutogradError::invalid("test", "no gradient"))?;
            assert_eq!(std::sync::Arc::as_ptr(kept.storage()), storage, "strides {:?}", like.strides());
            assert_eq!(kept.strides(), like.strides());
        }
        Ok(())
    }

    #[test]
    fn accumulates_across_calls_and_second_backward_errors() -> Result<()> {
        let x = Var::param(Tensor::from_vec(vec![3.0f64], [1])?)?;
        let y = x.mul(&x)?.sum_all()?;
        y.backward_opts(None, true)?;
        y.backward()?;
        assert_eq!(vec(&x.grad().unwrap_or(x.tensor().zeros_like()?)), [12.0]);
        let err = y.backward().unwrap_err();
        assert!(matches!(err, AutogradError::GraphReleased { op: "sum" }), "{err:?}");
        // The advice is the point: PyTorch's words, and what to pass.
        assert!(err.to_string().contains("second time") && err.to_string().contains("retain_graph"), "{err}");
        Ok(())
    }

    #[test]
    fn backward_needs_scalar_or_grad() -> Result<()> {
        let x = Var::param(Tensor::ones([2], DType::F64)?)?;
        let y = x.mul_scalar(2.0)?;
        let err = y.backward().unwrap_err();
        assert!(matches!(err, AutogradError::Invalid { op: "backward", .. }), "{err:?}");
        y.backward_with(&Tensor::from_vec(vec![1.0f64, 10.0], [2])?)?;
        assert_eq!(vec(&x.grad().unwrap_or(x.tensor().zeros_like()?)), [2.0, 20.0]);
        let c = Var::new(Tensor::ones([1], DType::F64)?);
        assert!(matches!(c.backward(), Err(AutogradError::NoGraph(_))));
        Ok(())
    }

    #[test]
    fn grad_does_not_touch_dot_grad() -> Result<()> {
        let x = Var::param(Tensor::from_vec(vec![2.0f64], [1])?)?;
        let w = Var::param(Tensor::from_vec(vec![5.0f64], [1])?)?;
        let y = x.mul(&w)?.sum_all()?;
        let g = grad(&[&y], &[&x], None, false)?;
        assert_eq!(vec(g[0].as_ref().unwrap_or(x.tensor())), [5.0]);
        assert!(x.grad().is_none() && w.grad().is_none());
        let unused = Var::param(Tensor::ones([1], DType::F64)?)?;
        let z = x.exp()?.sum_all()?;
        assert!(grad(&[&z], &[&unused], None, false)?[0].is_none());
        Ok(())
    }

    #[test]
    fn in_place_change_of_saved_tensor_is_an_error() -> Result<()> {
        let x = Var::param(Tensor::from_vec(vec![1.0f64, 2.0], [2])?)?;
        let c = Var::new(Tensor::from_vec(vec![3.0f64, 4.0], [2])?);
        let y = x.mul(&c)?.sum_all()?;
        c.tensor().add_scalar_(1.0)?;
        let err = y.backward().unwrap_err();
        assert!(matches!(err, AutogradError::ModifiedInPlace { op: "mul", version: 1, expected: 0 }), "{err:?}");
        Ok(())
    }

    #[test]
    fn deep_chain_does_not_overflow() -> Result<()> {
        let x = Var::param(Tensor::from_vec(vec![1.0f64], [1])?)?;
        let mut y = x.clone();
        for _ in 0..50_000 {
            y = y.add_scalar(1.0)?;
        }
        y.sum_all()?.backward()?;
        assert_eq!(vec(&x.grad().unwrap_or(x.tensor().zeros_like()?)), [1.0]);
        drop(y);
        Ok(())
    }
}
