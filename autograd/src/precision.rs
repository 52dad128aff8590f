//! The precision hook: the seam through which mixed precision (the
//! `brasa-amp` crate's `autocast`) changes the dtype an operation computes
//! in, without this crate knowing any policy.
//!
//! Operations whose precision matters (matrix products and convolutions,
//! softmax and log-softmax, exp/log/pow, sums and means, variances,
//! concatenation, and in `brasa-nn` the losses and norms) call
//! [`autocast_inputs`] with their name and floating-point inputs before they
//! compute. With no hook installed on the thread that is one relaxed atomic
//! load; with one, the hook says which dtype the inputs should have and makes
//! the casts (a differentiable `to_dtype`, so backward runs each operation in
//! the dtype its forward used and hands the input its gradient in the
//! input's own dtype).
//!
//! ```
//! use brasa_autograd::{autocast_inputs, set_precision_hook, PrecisionHook, Var};
//! use brasa_tensor::{DType, Device, Tensor};
//! use std::sync::Arc;
//!
//! /// Matrix products in bf16, everything else untouched.
//! struct Bf16Matmul;
//! impl PrecisionHook for Bf16Matmul {
//!     fn target(&self, op: &str, _inputs: &[DType], _device: Device) -> Option<DType> {
//!         (op == "matmul").then_some(DType::BF16)
//!     }
//! }
//!
//! let previous = set_precision_hook(Some(Arc::new(Bf16Matmul)));
//! let a = Var::param(Tensor::ones([2, 3], DType::F32)?)?;
//! let y = a.matmul(&a.t()?)?;
//! assert_eq!(y.dtype(), DType::BF16);
//! y.to_dtype(DType::F32)?.sum_all()?.backward()?;
//! assert_eq!(a.grad().unwrap().dtype(), DType::F32);     // the leaf's own dtype
//! set_precision_hook(previous);
//! # let _ = autocast_inputs;
//! # Ok::<(), brasa_autograd::AutogradError>(())
//! ```

use crate::error::Result;
use crate::var::Var;
use brasa_tensor::{DType, Device, Tensor};
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A precision policy installed on a thread with [`set_precision_hook`].
pub trait PrecisionHook: Send + Sync {
    /// The dtype the floating-point inputs of `op` (whose current dtypes are
    /// `inputs`, on `device`) should be cast to, or `None` to leave them as
    /// they are. The device lets a policy differ per device type, as
    /// PyTorch's autocast lists do for CPU and CUDA.
    fn target(&self, op: &str, inputs: &[DType], device: Device) -> Option<DType>;

    /// Casts `var` to `dtype` (a differentiable `to_dtype`); a policy may
    /// override this to cache the casts of parameters.
    fn cast(&self, var: &Var, dtype: DType) -> Result<Var> {
        var.to_dtype(dtype)
    }

    /// The tensor of `var` cast to `dtype`, with no graph node: for
    /// operations that record one node over their original inputs (see
    /// [`autocast_tensors`]). A policy that caches parameter casts
    /// overrides this to hand out the cached tensor.
    fn cast_tensor(&self, var: &Var, dtype: DType) -> Result<Tensor> {
        Ok(var.tensor().to_dtype(dtype)?)
    }
}

thread_local! {
    static HOOK: RefCell<Option<Arc<dyn PrecisionHook>>> = const { RefCell::new(None) };
}

/// Threads with a hook installed: lets every other thread skip the
/// thread-local lookup with one relaxed load.
static THREADS_WITH_HOOK: AtomicUsize = AtomicUsize::new(0);

/// Installs `hook` on this thread (`None` removes it) and returns the
/// previous one, so scoped guards can restore it.
pub fn set_precision_hook(hook: Option<Arc<dyn PrecisionHook>>) -> Option<Arc<dyn PrecisionHook>> {
    let installing = hook.is_some();
    let previous = HOOK.with(|slot| std::mem::replace(&mut *slot.borrow_mut(), hook));
    match (previous.is_some(), installing) {
        (false, true) => {
            THREADS_WITH_HOOK.fetch_add(1, Ordering::Relaxed);
        }
        (true, false) => {
            THREADS_WITH_HOOK.fetch_sub(1, Ordering::Relaxed);
        }
        _ => {}
    }
    previous
}

/// The hook installed on this thread, if any.
pub fn precision_hook() -> Option<Arc<dyn PrecisionHook>> {
    if THREADS_WITH_HOOK.load(Ordering::Relaxed) == 0 {
        return None;
    }
    HOOK.with(|slot| slot.borrow().clone())
}

/// Asks the installed hook about `op` and returns the inputs cast to the
/// dtype it wants, or `None` when nothing changes (no hook, no opinion, or
/// the inputs already have that dtype). Only floating-point inputs are cast.
/// Custom operations call this too, to take part in autocast.
pub fn autocast_inputs(op: &str, inputs: &[&Var]) -> Result<Option<Vec<Var>>> {
    let Some((hook, target)) = cast_target(op, inputs) else {
        return Ok(None);
    };
    // The hook runs outside itself: its casts are plain operations.
    let _suspended = SuspendHook::new();
    inputs
        .iter()
        .map(|v| if v.dtype().is_float() && v.dtype() != target { hook.cast(v, target) } else { Ok((*v).clone()) })
        .collect::<Result<Vec<Var>>>()
        .map(Some)
}

/// The installed hook and the dtype it wants `op`'s inputs in, when that
/// changes a floating-point input.
fn cast_target(op: &str, inputs: &[&Var]) -> Option<(Arc<dyn PrecisionHook>, DType)> {
    let hook = precision_hook()?;
    let first = inputs.first()?;
    let dtypes: Vec<DType> = inputs.iter().map(|v| v.dtype()).collect();
    // Operations run on one device (they reject mixed devices themselves):
    // the first input's decides which device type's policy applies.
    let target = hook.target(op, &dtypes, first.device())?;
    inputs.iter().any(|v| v.dtype().is_float() && v.dtype() != target).then_some((hook, target))
}

/// [`autocast_inputs`] for an operation that records one graph node over
/// its *original* inputs: returns the inputs' tensors cast to the hook's
/// dtype (parameters through the hook's cache), and records no cast. Its
/// backward must hand each input a gradient in the input's own dtype, which
/// lets it compute a gradient straight into that dtype: `linear` on the host
/// produces an f32 weight's gradient as f32 sums of half operands, where a recorded cast
/// would round it to half and convert it back (one rounding and a pass over
/// the weight less per step, and a more accurate gradient).
pub fn autocast_tensors(op: &str, inputs: &[&Var]) -> Result<Option<Vec<Tensor>>> {
    let Some((hook, target)) = cast_target(op, inputs) else {
        return Ok(None);
    };
    let _suspended = SuspendHook::new();
    inputs
        .iter()
        .map(|v| {
            if v.dtype().is_float() && v.dtype() != target {
                hook.cast_tensor(v, target)
            } else {
                Ok(v.tensor().clone())
            }
        })
        .collect::<Result<Vec<Tensor>>>()
        .map(Some)
}

/// Removes this thread's hook until dropped (casting must not recurse).
struct SuspendHook(Option<Arc<dyn PrecisionHook>>);

impl SuspendHook {
    fn new() -> SuspendHook {
        SuspendHook(set_precision_hook(None))
    }
}

impl Drop for SuspendHook {
    fn drop(&mut self) {
        set_precision_hook(self.0.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brasa_tensor::Tensor;

    struct Always(DType);
    impl PrecisionHook for Always {
        fn target(&self, _op: &str, _inputs: &[DType], _device: Device) -> Option<DType> {
            Some(self.0)
        }
    }

    #[test]
    fn hook_casts_float_inputs_only_and_restores() -> Result<()> {
        assert!(precision_hook().is_none());
        let previous = set_precision_hook(Some(Arc::new(Always(DType::F16))));
        assert!(previous.is_none());
        let x = Var::param(Tensor::ones([2], DType::F32)?)?;
        let ids = Var::new(Tensor::zeros([2], DType::I64)?);
        let cast = autocast_inputs("anything", &[&x, &ids])?.expect("cast");
        assert_eq!((cast[0].dtype(), cast[1].dtype()), (DType::F16, DType::I64));
        assert!(precision_hook().is_some(), "the hook is back after casting");
        set_precision_hook(None);
        assert!(autocast_inputs("anything", &[&x])?.is_none());
        Ok(())
    }

    #[test]
    fn autocast_tensors_casts_without_recording() -> Result<()> {
        let previous = set_precision_hook(Some(Arc::new(Always(DType::BF16))));
        let x = Var::param(Tensor::from_vec(vec![1.0f32, 1.0 + 1.0 / 512.0], [2])?)?;
        let ids = Var::new(Tensor::zeros([2], DType::I64)?);
        let cast = autocast_tensors("anything", &[&x, &ids])?.expect("cast");
        assert_eq!((cast[0].dtype(), cast[1].dtype()), (DType::BF16, DType::I64));
        // Rounded to nearest even, as the recorded cast rounds.
        assert_eq!(cast[0].to_dtype(DType::F32)?.to_vec::<f32>()?, [1.0, 1.0]);
        assert!(precision_hook().is_some(), "the hook is back after casting");
        let same = Var::new(Tensor::ones([2], DType::BF16)?);
        assert!(autocast_tensors("anything", &[&same])?.is_none(), "nothing to cast");
        set_precision_hook(previous);
        assert!(autocast_tensors("anything", &[&x])?.is_none(), "no hook");
        Ok(())
    }
}
