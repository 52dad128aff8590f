//! Grad mode: a thread-local flag saying whether operations on [`crate::Var`]
//! record the graph, with RAII guards that restore the previous mode when
//! they drop (`torch.no_grad()`, `torch.enable_grad()`).

use std::cell::Cell;

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// Whether operations record the graph on this thread.
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(Cell::get)
}

/// Restores the previous grad mode when dropped.
#[must_use = "grad mode reverts as soon as the guard is dropped"]
pub struct GradModeGuard {
    previous: bool,
}

impl Drop for GradModeGuard {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|g| g.set(self.previous));
    }
}

/// Sets grad mode on this thread until the guard drops.
pub fn set_grad_enabled(enabled: bool) -> GradModeGuard {
    let previous = GRAD_ENABLED.with(|g| g.replace(enabled));
    GradModeGuard { previous }
}

/// No graph is recorded until the guard drops (evaluation, optimizer steps).
///
/// ```
/// use brasa_autograd::{no_grad, Var};
/// use brasa_tensor::{DType, Tensor};
/// let w = Var::param(Tensor::ones([2], DType::F32)?);
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
    fn mode_is_per_thread() {
        let _a = no_grad();
        let other = std::thread::spawn(is_grad_enabled).join().unwrap_or(false);
        assert!(other);
        assert!(!is_grad_enabled());
    }
}
