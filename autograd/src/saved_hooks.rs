//! Saved-tensor hooks (`torch.autograd.graph.saved_tensors_hooks`): while
//! a guard from [`saved_tensors_hooks`] or [`install_saved_tensor_hooks`]
//! lives, every tensor an operation saves for its backward on this thread
//! goes through the hooks' `pack`, and what `pack` made is kept in the
//! graph instead of the tensor; when backward (or a checkpoint's
//! recomputation) needs the tensor, the same hooks' `unpack` gives it back.
//! [`crate::save_on_host`] is built on them.
//!
//! ```
//! use brasa_autograd::{saved_tensors_hooks, Packed, Var};
//! use brasa_tensor::{DType, Device, Tensor};
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//!
//! let packed = Arc::new(AtomicUsize::new(0));
//! let count = Arc::clone(&packed);
//! let w = Var::param(Tensor::ones([4, 4], DType::F32)?)?;
//! let loss = {
//!     // Keep every saved tensor as a contiguous copy on the host.
//!     let _hooks = saved_tensors_hooks(
//!         move |t: &Tensor| {
//!             count.fetch_add(1, Ordering::Relaxed);
//!             Ok(Packed::value(t.contiguous()?.to(Device::CPU)?))
//!         },
//!         |packed| Ok(Packed::downcast_ref::<Tensor>(packed, "my unpack")?.clone()),
//!     );
//!     w.mul(&w)?.relu()?.sum_all()?
//! };
//! assert_eq!(packed.load(Ordering::Relaxed), 3); // mul saved w twice, relu its input
//! loss.backward()?; // unpack runs here, after the guard dropped
//! assert_eq!(w.grad().unwrap().to_vec::<f32>()?, [2.0; 16]);
//! # Ok::<(), brasa_autograd::AutogradError>(())
//! ```
//!
//! The rules, PyTorch's:
//! - Hooks nest: the innermost guard alive rules, and guards may drop in any
//!   order (as [`crate::no_grad`]'s). They are per thread, and a guard is
//!   not `Send`.
//! - A tensor is unpacked by the hooks that packed it, whatever guards are
//!   alive when backward runs; a graph kept with `retain_graph` unpacks it
//!   again at each backward, and what `pack` returned is dropped when the
//!   node's saved tensors are released.
//! - Nothing is packed where nothing is saved: under [`crate::no_grad`],
//!   for operations whose inputs do not require grad, and for integer
//!   results.
//! - A hook runs with no hooks active, so the tensor operations it does on
//!   `Var`s save nothing through itself.
//! - A checkpoint keeps its inputs through the hooks alive at forward
//!   time; its recomputation during backward saves through the hooks alive
//!   while backward runs (none, unless backward runs inside a guard).
//!
//! brasa's additions: `pack` may return [`Packed::Keep`] to keep a tensor as
//! it is (it is then counted by [`crate::saved_tensor_bytes`], tagged as an
//! activation and checked for in-place changes exactly as without hooks);
//! an in-place change of a packed tensor's storage, while that storage is
//! still alive, is reported at unpack as [`crate::AutogradError::ModifiedInPlace`];
//! and an `unpack` that returns another shape, dtype or device than the
//! saved tensor's is an error rather than a wrong gradient.
//!
//! Errors of either hook are [`crate::AutogradError::SavedTensorHook`]
//! naming the operation. An `unpack` error is backward's error. A `pack`
//! error cannot end the forward operation (operations record their graph
//! infallibly): the node is recorded without its saved tensors and backward
//! through it returns the error, naming the operation and the pack stage.

use crate::error::{AutogradError, Result};
use brasa_tensor::Tensor;
use std::any::Any;
use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::Arc;

/// What a pack hook makes of a saved tensor.
pub enum Packed {
    /// Keep the tensor itself, as without hooks; unpack is not called for it.
    Keep,
    /// A value that the same hooks' unpack turns back into the tensor.
    Value(Box<dyn Any + Send + Sync>),
}

impl Packed {
    /// [`Packed::Value`] holding `value`.
    pub fn value<T: Any + Send + Sync>(value: T) -> Packed {
        Packed::Value(Box::new(value))
    }

    /// The `T` an unpack hook was given, or an error naming `op` when the
    /// packed value is something else.
    pub fn downcast_ref<'a, T: Any>(packed: &'a (dyn Any + Send + Sync), op: &'static str) -> Result<&'a T> {
        packed.downcast_ref::<T>().ok_or_else(|| {
            AutogradError::invalid(
                op,
                format!("the packed value is not a {} (was it packed by other hooks?)", std::any::type_name::<T>()),
            )
        })
    }
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Packed::Keep => write!(f, "Packed::Keep"),
            Packed::Value(_) => write!(f, "Packed::Value(..)"),
        }
    }
}

/// A pair of saved-tensor hooks (see the module docs).
pub trait SavedTensorHooks: Send + Sync {
    /// Called when an operation saves `tensor` for its backward.
    fn pack(&self, tensor: &Tensor) -> Result<Packed>;

    /// Called when backward needs the tensor back, with what `pack`
    /// returned in [`Packed::Value`]; possibly several times (a retained
    /// graph).
    fn unpack(&self, packed: &(dyn Any + Send + Sync)) -> Result<Tensor>;
}

/// Saved-tensor hooks of two closures.
struct FnHooks<P, U> {
    pack: P,
    unpack: U,
}

impl<P, U> SavedTensorHooks for FnHooks<P, U>
where
    P: Fn(&Tensor) -> Result<Packed> + Send + Sync,
    U: Fn(&(dyn Any + Send + Sync)) -> Result<Tensor> + Send + Sync,
{
    fn pack(&self, tensor: &Tensor) -> Result<Packed> {
        (self.pack)(tensor)
    }

    fn unpack(&self, packed: &(dyn Any + Send + Sync)) -> Result<Tensor> {
        (self.unpack)(packed)
    }
}

/// The thread's live guards, oldest first: (guard id, hooks it set; `None`
/// while a hook runs).
#[derive(Default)]
struct HookStack {
    stack: Vec<(u64, Option<Arc<dyn SavedTensorHooks>>)>,
    next_id: u64,
}

thread_local! {
    static HOOKS: RefCell<HookStack> = RefCell::new(HookStack::default());
}

fn push(hooks: Option<Arc<dyn SavedTensorHooks>>) -> u64 {
    HOOKS.with(|h| {
        let mut h = h.borrow_mut();
        let id = h.next_id;
        h.next_id += 1;
        h.stack.push((id, hooks));
        id
    })
}

/// Removes its hooks from this thread's stack when dropped, whatever the
/// order guards are dropped in (see the module docs).
#[must_use = "the hooks are removed as soon as the guard is dropped"]
pub struct SavedTensorsHooksGuard {
    id: u64,
    _not_send: PhantomData<*const ()>,
}

impl Drop for SavedTensorsHooksGuard {
    fn drop(&mut self) {
        // `try_with`: a guard dropped while the thread's locals are torn
        // down has nothing left to remove.
        let _ = HOOKS.try_with(|h| {
            let mut h = h.borrow_mut();
            if let Some(i) = h.stack.iter().rposition(|(id, _)| *id == self.id) {
                h.stack.remove(i);
            }
        });
    }
}

impl std::fmt::Debug for SavedTensorsHooksGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SavedTensorsHooksGuard({})", self.id)
    }
}

/// Packs every tensor saved for backward on this thread with `pack`, and
/// unpacks it with `unpack`, until the guard drops
/// (`torch.autograd.graph.saved_tensors_hooks(pack, unpack)`).
pub fn saved_tensors_hooks<P, U>(pack: P, unpack: U) -> SavedTensorsHooksGuard
where
    P: Fn(&Tensor) -> Result<Packed> + Send + Sync + 'static,
    U: Fn(&(dyn Any + Send + Sync)) -> Result<Tensor> + Send + Sync + 'static,
{
    install_saved_tensor_hooks(Arc::new(FnHooks { pack, unpack }))
}

/// [`saved_tensors_hooks`] with hooks that are a type of their own.
pub fn install_saved_tensor_hooks(hooks: Arc<dyn SavedTensorHooks>) -> SavedTensorsHooksGuard {
    SavedTensorsHooksGuard { id: push(Some(hooks)), _not_send: PhantomData }
}

/// The hooks that tensors saved on this thread now go through.
pub(crate) fn current_hooks() -> Option<Arc<dyn SavedTensorHooks>> {
    HOOKS.with(|h| h.borrow().stack.last().and_then(|(_, hooks)| hooks.clone()))
}

/// Runs `f` (a hook) with no hooks active on this thread.
pub(crate) fn without_hooks<T>(f: impl FnOnce() -> T) -> T {
    let _none = SavedTensorsHooksGuard { id: push(None), _not_send: PhantomData };
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keep() -> SavedTensorsHooksGuard {
        saved_tensors_hooks(|_| Ok(Packed::Keep), |_| Err(AutogradError::invalid("test", "never unpacked")))
    }

    fn is(hooks: &Option<Arc<dyn SavedTensorHooks>>, guard_hooks: &Arc<dyn SavedTensorHooks>) -> bool {
        hooks.as_ref().is_some_and(|h| Arc::ptr_eq(h, guard_hooks))
    }

    #[test]
    fn innermost_rules_and_guards_drop_in_any_order() {
        assert!(current_hooks().is_none());
        let outer = keep();
        let outer_hooks = current_hooks().unwrap();
        let inner = keep();
        let inner_hooks = current_hooks().unwrap();
        assert!(!Arc::ptr_eq(&outer_hooks, &inner_hooks));
        // Dropping the outer guard first leaves the inner one ruling.
        drop(outer);
        assert!(is(&current_hooks(), &inner_hooks));
        let again = keep();
        assert!(!is(&current_hooks(), &inner_hooks));
        drop(again);
        assert!(is(&current_hooks(), &inner_hooks));
        drop(inner);
        assert!(current_hooks().is_none());
    }

    #[test]
    fn hooks_are_off_while_a_hook_runs_and_per_thread() {
        let _g = keep();
        assert!(current_hooks().is_some());
        assert!(without_hooks(current_hooks).is_none());
        assert!(current_hooks().is_some());
        let other = std::thread::spawn(|| current_hooks().is_none()).join().unwrap_or(false);
        assert!(other);
    }

    #[test]
    fn downcast_names_the_op() {
        let value: Box<dyn Any + Send + Sync> = Box::new(3u32);
        assert_eq!(Packed::downcast_ref::<u32>(value.as_ref(), "test").ok(), Some(&3));
        let err = Packed::downcast_ref::<Tensor>(value.as_ref(), "my_unpack").err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.starts_with("my_unpack:")));
    }
}
