//! The recorded graph: a [`Node`] per operation that needs a gradient, with
//! edges to the nodes that produced its inputs, and the tensors it saved for
//! its backward. Leaves that require grad get one accumulation node each.
//!
//! Saved tensors (`saved.rs`) are counted by storage (two views of one
//! storage count once), and every live operation node is counted, so a graph
//! kept alive by mistake (a running loss summed as a `Var`) shows up in
//! [`crate::live_nodes`] and [`crate::saved_tensor_bytes`].

use crate::error::Result;
use crate::saved::SavedTensors;
use crate::view_region::ViewRegion;
use brasa_tensor::{DType, Device, Tensor};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

static LIVE_NODES: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Operation nodes alive in this process.
pub(crate) fn live_node_count() -> usize {
    LIVE_NODES.load(Ordering::Relaxed)
}

/// What a backward function is given.
pub struct BackwardCtx<'a> {
    /// The gradient of the operation's output.
    pub grad: &'a Tensor,
    /// The tensors saved at forward time, in the order they were saved.
    pub saved: &'a [Tensor],
    /// Whether each input needs a gradient (others may be returned as `None`).
    pub needs: &'a [bool],
}

impl BackwardCtx<'_> {
    /// Whether input `i` needs a gradient.
    pub fn needs(&self, i: usize) -> bool {
        self.needs.get(i).copied().unwrap_or(false)
    }
}

/// A node's backward: saved tensors plus the function of them.
pub(crate) type BackwardClosure = Box<dyn FnMut(&BackwardCtx) -> Result<Vec<Option<Tensor>>> + Send>;

/// A backward that takes the output gradient by value, so it can let it go
/// as soon as it is consumed (checkpoint hands it to the nested backward).
pub(crate) type OwnedGradClosure = Box<dyn FnMut(Tensor, &[Tensor], &[bool]) -> Result<Vec<Option<Tensor>>> + Send>;

/// How a node's backward receives the output gradient.
pub(crate) enum BackwardFn {
    /// By reference, through a [`BackwardCtx`] (every op).
    Borrowed(BackwardClosure),
    /// By value.
    Owned(OwnedGradClosure),
    /// No function: the node is a view of its one input, and the engine
    /// places the output gradient in that region of the input's gradient
    /// (see `view_region.rs`).
    Place(ViewRegion),
}

pub(crate) struct OpBackward {
    pub(crate) saved: SavedTensors,
    pub(crate) f: BackwardFn,
}

/// A gradient hook: may return a replacement gradient.
pub(crate) type GradHook = Arc<dyn Fn(&Tensor) -> Result<Option<Tensor>> + Send + Sync>;
/// Runs after a leaf's gradient was accumulated, given the leaf (a user's
/// `Fn(&Var)` hook, wrapped by `Var::register_post_accumulate_grad_hook`).
pub(crate) type PostAccumulateHook = Arc<dyn Fn(&Arc<VarInner>) -> Result<()> + Send + Sync>;

/// A variable: what its `Var` handles (var.rs) share, and what the nodes
/// that accumulate or retain its gradient point to (weakly). Defined with
/// the nodes because each refers to the other: a variable holds the node that
/// made it and its leaf accumulator, an accumulator the variable it feeds.
pub(crate) struct VarInner {
    pub(crate) tensor: Tensor,
    pub(crate) requires_grad: AtomicBool,
    pub(crate) grad: Mutex<Option<Tensor>>,
    pub(crate) grad_fn: Option<Arc<Node>>,
    /// A leaf's accumulation node, made on first use so all consumers share it.
    pub(crate) accumulator: OnceLock<Arc<Node>>,
    pub(crate) post_accumulate_hooks: Mutex<Vec<PostAccumulateHook>>,
}

pub(crate) enum NodeKind {
    /// An operation; `None` once its saved tensors were released.
    Op(Mutex<Option<OpBackward>>),
    /// Accumulates into a leaf's `.grad`.
    Accumulate(Weak<VarInner>),
}

/// The shape, dtype and device of the tensor a node's gradient is for:
/// what a gradient reaching the node must fit.
#[derive(Clone, Debug)]
pub(crate) struct TensorMeta {
    pub(crate) dims: Vec<usize>,
    pub(crate) dtype: DType,
    pub(crate) device: Device,
}

impl TensorMeta {
    pub(crate) fn of(t: &Tensor) -> TensorMeta {
        TensorMeta { dims: t.dims().to_vec(), dtype: t.dtype(), device: t.device() }
    }
}

/// One recorded operation (or a leaf's accumulator).
pub(crate) struct Node {
    pub(crate) name: &'static str,
    /// The output this node's incoming gradient is for.
    pub(crate) meta: TensorMeta,
    /// Per input: the node its gradient goes to (`None`: no gradient needed).
    pub(crate) next: Vec<Option<Arc<Node>>>,
    pub(crate) kind: NodeKind,
    /// Hooks on the gradient of this node's output (its `Var`'s hooks).
    pub(crate) pre_hooks: Mutex<Vec<GradHook>>,
    /// The non-leaf `Var` that asked to keep its gradient.
    pub(crate) retained: Mutex<Option<Weak<VarInner>>>,
    /// Nodes a backward through this one reaches without an edge: what a
    /// checkpoint's function read from outside its inputs (parameters
    /// above all), which its recomputation gives gradients to. Followed by
    /// [`reachable_through_recomputation`] only, never by backward itself.
    pub(crate) recomputed_reads: OnceLock<Vec<Arc<Node>>>,
}

impl Node {
    pub(crate) fn op(
        name: &'static str,
        next: Vec<Option<Arc<Node>>>,
        meta: TensorMeta,
        backward: OpBackward,
    ) -> Arc<Node> {
        LIVE_NODES.fetch_add(1, Ordering::Relaxed);
        Arc::new(Node {
            name,
            meta,
            next,
            kind: NodeKind::Op(Mutex::new(Some(backward))),
            pre_hooks: Mutex::new(Vec::new()),
            retained: Mutex::new(None),
            recomputed_reads: OnceLock::new(),
        })
    }

    pub(crate) fn accumulate(var: Weak<VarInner>, meta: TensorMeta) -> Arc<Node> {
        Arc::new(Node {
            name: "accumulate_grad",
            meta,
            next: Vec::new(),
            kind: NodeKind::Accumulate(var),
            pre_hooks: Mutex::new(Vec::new()),
            retained: Mutex::new(None),
            recomputed_reads: OnceLock::new(),
        })
    }

    pub(crate) fn key(node: &Arc<Node>) -> usize {
        Arc::as_ptr(node) as usize
    }

    /// The storages this node's saved tensors hold (empty once released;
    /// tensors packed by saved-tensor hooks hold none).
    pub(crate) fn saved_storages(&self) -> Vec<(usize, usize)> {
        match &self.kind {
            NodeKind::Op(slot) => lock(slot).as_ref().map(|b| b.saved.kept_storages()).unwrap_or_default(),
            NodeKind::Accumulate(_) => Vec::new(),
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if matches!(self.kind, NodeKind::Op(_)) {
            LIVE_NODES.fetch_sub(1, Ordering::Relaxed);
        }
        // Drop long chains iteratively: a recursive drop of a deep graph
        // would overflow the stack.
        let mut stack = std::mem::take(&mut self.next);
        stack.extend(self.recomputed_reads.take().into_iter().flatten().map(Some));
        while let Some(edge) = stack.pop() {
            if let Some(node) = edge {
                if let Ok(mut node) = Arc::try_unwrap(node) {
                    stack.append(&mut node.next);
                    stack.extend(node.recomputed_reads.take().into_iter().flatten().map(Some));
                }
            }
        }
    }
}

/// Every node reachable from `roots` (each once), by iterative depth-first search.
pub(crate) fn reachable(roots: &[Arc<Node>]) -> Vec<Arc<Node>> {
    walk(roots, false)
}

/// [`reachable`], also through what checkpoints will recompute: every node
/// a backward from `roots` gives a gradient to, nested backwards included.
pub(crate) fn reachable_through_recomputation(roots: &[Arc<Node>]) -> Vec<Arc<Node>> {
    walk(roots, true)
}

fn walk(roots: &[Arc<Node>], recomputed: bool) -> Vec<Arc<Node>> {
    let mut seen = std::collections::HashSet::new();
    let mut stack: Vec<Arc<Node>> = roots.to_vec();
    let mut out = Vec::new();
    while let Some(node) = stack.pop() {
        if !seen.insert(Node::key(&node)) {
            continue;
        }
        stack.extend(node.next.iter().flatten().cloned());
        if recomputed {
            stack.extend(node.recomputed_reads.get().into_iter().flatten().cloned());
        }
        out.push(node);
    }
    out
}
