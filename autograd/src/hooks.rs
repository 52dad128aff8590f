//! Gradient hooks: [`Var::register_hook`] sees (and may replace) the
//! gradient of a `Var` as backward reaches it; a post-accumulate hook runs
//! on a leaf right after its `.grad` was updated (data-parallel training
//! starts communication there while backward goes on); [`Var::retain_grad`]
//! keeps a non-leaf's gradient in its `.grad`.

use crate::error::{AutogradError, Result};
use crate::graph::{lock, VarInner};
use crate::var::Var;
use brasa_tensor::Tensor;
use std::sync::Arc;

impl Var {
    /// Runs `hook` with this `Var`'s gradient whenever backward computes it;
    /// returning `Some` replaces the gradient for everything downstream
    /// (including a leaf's `.grad`). Hooks run in registration order.
    pub fn register_hook(
        &self,
        hook: impl Fn(&Tensor) -> Result<Option<Tensor>> + Send + Sync + 'static,
    ) -> Result<()> {
        let node = self.hook_node("register_hook")?;
        lock(&node.pre_hooks).push(Arc::new(hook));
        Ok(())
    }

    /// Runs `hook` on this leaf right after a gradient was accumulated into
    /// its `.grad` (`register_post_accumulate_grad_hook`).
    pub fn register_post_accumulate_grad_hook(
        &self,
        hook: impl Fn(&Var) -> Result<()> + Send + Sync + 'static,
    ) -> Result<()> {
        if !self.is_leaf() || !self.requires_grad() {
            return Err(AutogradError::invalid(
                "register_post_accumulate_grad_hook",
                "only leaves that require grad accumulate gradients",
            ));
        }
        lock(&self.0.post_accumulate_hooks).push(Arc::new(move |leaf: &Arc<VarInner>| hook(&Var(Arc::clone(leaf)))));
        Ok(())
    }

    /// Keeps this non-leaf's gradient in `.grad` at the next backward (a
    /// no-op on leaves that require grad, which always do). An error on a
    /// `Var` that does not require grad: no gradient would ever come
    /// (PyTorch: "can't retain_grad on Tensor that has requires_grad=False").
    pub fn retain_grad(&self) -> Result<()> {
        if !self.requires_grad() {
            return Err(AutogradError::invalid(
                "retain_grad",
                "can't retain_grad on a Var that has requires_grad=false (no gradient will reach it)",
            ));
        }
        if self.is_leaf() {
            return Ok(());
        }
        let node = self.hook_node("retain_grad")?;
        *lock(&node.retained) = Some(Arc::downgrade(&self.0));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brasa_tensor::DType;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn values(t: Option<Tensor>) -> Vec<f64> {
        t.and_then(|t| t.to_vec::<f64>().ok()).unwrap_or_default()
    }

    #[test]
    fn hook_replaces_gradient() -> Result<()> {
        let x = Var::param(Tensor::from_vec(vec![1.0f64, 2.0], [2])?)?;
        let y = x.mul_scalar(3.0)?;
        y.register_hook(|g| Ok(Some(g.mul_scalar(10.0)?)))?;
        y.retain_grad()?;
        y.sum_all()?.backward()?;
        assert_eq!(values(x.grad()), [30.0, 30.0]);
        assert_eq!(values(y.grad()), [10.0, 10.0]);
        Ok(())
    }

    #[test]
    fn leaf_hooks_run_once_with_the_summed_gradient() -> Result<()> {
        let x = Var::param(Tensor::from_vec(vec![1.0f64], [1])?)?;
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&calls);
        x.register_post_accumulate_grad_hook(move |v| {
            seen.fetch_add(1, Ordering::SeqCst);
            assert_eq!(v.grad().and_then(|g| g.to_vec::<f64>().ok()), Some(vec![3.0]));
            Ok(())
        })?;
        x.register_hook(|g| Ok(Some(g.add_scalar(1.0)?)))?;
        let y = x.add(&x)?.sum_all()?;
        y.backward()?;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let c = Var::new(Tensor::ones([1], DType::F64)?);
        assert!(c.register_hook(|_| Ok(None)).is_err());
        Ok(())
    }
}
