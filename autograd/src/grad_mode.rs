//! Grad mode: a thread-local flag saying whether operations on [`crate::Var`]
//! record the graph, with RAII guards that restore the previous mode when
//! they drop (`torch.no_grad()`, `torch.enable_grad()`).
//!
//! The guards live on a per-thread stack: the mode is the one set by the
//! most recent guard still alive (grad on when none is). Dropping guards in
//! any order therefore leaves the right mode — dropping an outer guard
//! before an inner one removes only the outer entry, and the inner guard
//! still rules until it drops too. A guard is not `Send`: it belongs to the
//! thread whose mode it set.

use std::cell::RefCell;
use std::marker::PhantomData;

/// The thread's live guards, oldest first: (guard id, mode it set).
#[derive(Default)]
struct Modes {
    stack: Vec<(u64, bool)>,
    next_id: u64,
}

thread_local! {
    static MODES: RefCell<Modes> = RefCell::new(Modes::default());
}

/// Whether operations record the graph on this thread.
pub fn is_grad_enabled() -> bool {
    MODES.with(|m| m.borrow().stack.last().is_none_or(|&(_, enabled)| enabled))
}

/// Restores the previous grad mode when dropped, whatever the order guards
/// are dropped in (see the module docs).
#[must_use = "grad mode reverts as soon as the guard is dropped"]
pub struct GradModeGuard {
    id: u64,
    _not_send: PhantomData<*const ()>,
}

impl Drop for GradModeGuard {
    fn drop(&mut self) {
        // `try_with`: a guard dropped while the thread's locals are torn
        // down has nothing left to restore.
        let _ = MODES.try_with(|m| {
            let mut modes = m.borrow_mut();
            if let Some(i) = modes.stack.iter().rposition(|&(id, _)| id == self.id) {
                modes.stack.remove(i);
            }
        });
    }
}

impl std::fmt::Debug for GradModeGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GradModeGuard({})", self.id)
    }
}

/// Sets grad mode on this thread until the guard drops.
pub fn set_grad_enabled(enabled: bool) -> GradModeGuard {
    let id = MODES.with(|m| {
        let mut modes = m.borrow_mut();
        let id = modes.next_id;
        modes.next_id += 1;
        modes.stack.push((id, enabled));
        id
    });
    GradModeGuard { id, _not_send: PhantomData }
}

/// No graph is recorded until the guard drops (evaluation, optimizer steps).
///
/// ```
/// use brasa_autograd::{no_grad, Var};
/// use brasa_tensor::{DType, Tensor};
/// let w = Var::param(Tensor::ones([2], DType::F32)?)?;
/// let y = { let _g = no_grad(); w.mul_scalar(2.0)? };
/// assert!(!y.requires_grad());
/// # Ok::<(), brasa_autograd::AutogradError>(())
/// ```
pub fn no_grad() -> GradModeGuard {
    set_grad_enabled(false)
}

/// The graph is recorded until the guard drops, even inside [`no_grad`].
pub fn enable_grad() -> GradModeGuard {
    set_grad_enabled(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_nest_and_restore() {
        assert!(is_grad_enabled());
        {
            let _a = no_grad();
            assert!(!is_grad_enabled());
            {
                let _b = enable_grad();
                assert!(is_grad_enabled());
            }
            assert!(!is_grad_enabled());
        }
        assert!(is_grad_enabled());
    }

    #[test]
    fn guards_dropped_out_of_order_leave_the_right_mode() {
        assert!(is_grad_enabled());
        let outer = no_grad();
        let inner = enable_grad();
        drop(outer);
        // The inner guard is still alive: it rules.
        assert!(is_grad_enabled());
        let innermost = no_grad();
        drop(inner);
        assert!(!is_grad_enabled());
        drop(innermost);
        assert!(is_grad_enabled());
        // The other way round.
        let a = enable_grad();
        let b = no_grad();
        drop(a);
        assert!(!is_grad_enabled());
        drop(b);
        assert!(is_grad_enabled());
    }

    #[test]
    fn mode_is_per_thread() {
        let _a = no_grad();
        let other = std::thread::spawn(is_grad_enabled).join().unwrap_or(false);
        assert!(other);
        assert!(!is_grad_enabled());
    }
}
