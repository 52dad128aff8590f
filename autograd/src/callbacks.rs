//! Callbacks run when the backward pass that queued them ends (PyTorch's
//! `Variable._execution_engine.queue_callback`): data-parallel training
//! queues one from its first gradient hook, then waits there for the last
//! gradient all-reduce, so `loss.backward()` returns with gradients synced.
//!
//! Callbacks belong to the outermost backward running on this thread: one
//! queued inside a nested backward (a checkpointed segment's recomputation)
//! runs when the outer backward ends. They run in the order queued; the
//! first error ends the backward with that error. When backward fails, its
//! queued callbacks are dropped without running.

use crate::error::{AutogradError, Result};
use std::cell::RefCell;

type Callback = Box<dyn FnOnce() -> Result<()>>;

#[derive(Default)]
struct Queue {
    depth: usize,
    callbacks: Vec<Callback>,
}

thread_local! {
    static QUEUE: RefCell<Queue> = RefCell::new(Queue::default());
}

/// Queues `callback` to run when the backward running on this thread ends
/// (after every gradient was accumulated and every hook ran). An error when
/// no backward runs on this thread.
pub fn queue_callback(callback: impl FnOnce() -> Result<()> + 'static) -> Result<()> {
    QUEUE.with(|queue| {
        let mut queue = queue.borrow_mut();
        if queue.depth == 0 {
            return Err(AutogradError::invalid(
                "queue_callback",
                "no backward is running on this thread; callbacks can only be queued from hooks during backward",
            ));
        }
        queue.callbacks.push(Box::new(callback));
        Ok(())
    })
}

/// Whether a backward is running on this thread.
pub fn in_backward() -> bool {
    QUEUE.with(|queue| queue.borrow().depth > 0)
}

/// Marks one backward running on this thread; the outermost one runs the
/// queued callbacks when it [`finish`](BackwardScope::finish)es.
pub(crate) struct BackwardScope {
    finished: bool,
}

impl BackwardScope {
    pub(crate) fn enter() -> BackwardScope {
        QUEUE.with(|queue| queue.borrow_mut().depth += 1);
        BackwardScope { finished: false }
    }

    /// Ends the scope after a successful backward: the outermost one runs
    /// the callbacks (callbacks may queue more; those run too).
    pub(crate) fn finish(mut self) -> Result<()> {
        self.finished = true;
        let outermost = QUEUE.with(|queue| {
            let mut queue = queue.borrow_mut();
            queue.depth -= 1;
            queue.depth == 0
        });
        if !outermost {
            return Ok(());
        }
        loop {
            let batch = QUEUE.with(|queue| std::mem::take(&mut queue.borrow_mut().callbacks));
            if batch.is_empty() {
                return Ok(());
            }
            let mut callbacks = batch.into_iter();
            for callback in callbacks.by_ref() {
                if let Err(err) = callback() {
                    // The rest would act on a backward that failed.
                    drop(callbacks);
                    QUEUE.with(|queue| queue.borrow_mut().callbacks.clear());
                    return Err(err);
                }
            }
        }
    }
}

impl Drop for BackwardScope {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        // Backward failed (or unwound): leave the depth as it was and drop
        // what the outermost backward had queued.
        QUEUE.with(|queue| {
            let mut queue = queue.borrow_mut();
            queue.depth -= 1;
            if queue.depth == 0 {
                queue.callbacks.clear();
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::var::Var;
    use brasa_tensor::Tensor;

    #[test]
    fn callbacks_run_after_every_leaf_hook() -> Result<()> {
        let a = Var::param(Tensor::from_vec(vec![1.0f64, 2.0], [2])?)?;
        let b = Var::param(Tensor::from_vec(vec![3.0f64], [1])?)?;
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        for (name, v) in [("a", &a), ("b", &b)] {
            let order = std::sync::Arc::clone(&order);
            v.register_post_accumulate_grad_hook(move |_| {
                order.lock().unwrap().push(name);
                if name == "a" || name == "b" {
                    let order = std::sync::Arc::clone(&order);
                    // Queued from a hook: runs once, after both hooks.
                    if order.lock().unwrap().len() == 1 {
                        queue_callback(move || {
                            order.lock().unwrap().push("end");
                            Ok(())
                        })?;
                    }
                }
                Ok(())
            })?;
        }
        a.mul(&b.broadcast_as([2])?)?.sum_all()?.backward()?;
        let seen = order.lock().unwrap().clone();
        assert_eq!(seen.len(), 3);
        assert_eq!(seen[2], "end");
        assert!(!in_backward());
        Ok(())
    }

    #[test]
    fn a_failing_callback_fails_backward_and_is_not_kept() -> Result<()> {
        let a = Var::param(Tensor::from_vec(vec![1.0f64], [1])?)?;
        a.register_post_accumulate_grad_hook(|_| queue_callback(|| Err(AutogradError::invalid("test", "refused"))))?;
        let err = a.sum_all()?.backward().unwrap_err();
        assert!(matches!(&err, AutogradError::Invalid { op: "test", message } if message == "refused"), "{err:?}");
        // Nothing left queued: the next backward (whose own callback runs) succeeds.
        let ran = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let b = Var::param(Tensor::from_vec(vec![1.0f64], [1])?)?;
        let seen = std::sync::Arc::clone(&ran);
        b.register_post_accumulate_grad_hook(move |_| {
            let seen = std::sync::Arc::clone(&seen);
            queue_callback(move || {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            })
        })?;
        b.sum_all()?.backward()?;
        assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 1);
        Ok(())
    }

    #[test]
    fn queueing_outside_backward_is_an_error() {
        let err = queue_callback(|| Ok(())).unwrap_err();
        assert!(matches!(err, AutogradError::Invalid { op: "queue_callback", .. }), "{err:?}");
    }
}
