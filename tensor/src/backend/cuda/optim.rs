//! The fused Adam on CUDA: `adam_step_<T>` of `optim.cu`, one launch per
//! parameter on the current stream, replaying the composed update per
//! element as the host does.

use super::{address, grid_for, suffix, CudaBackend};
use crate::error::Result;
use crate::ops::fused_adam::AdamUpdate;
use cudarc::driver::PushKernelArg;

const OP: &str = "fused_adam_";

/// See [`crate::backend::Backend::adam_step`].
pub(super) fn adam_step(backend: &CudaBackend, updates: &[&AdamUpdate<'_>]) -> Result<()> {
    let stream = backend.current_stream()?;
    for update in updates {
        let n = update.param.numel();
        if n == 0 {
            continue;
        }
        let kernel = format!("adam_step_{}", suffix(update.param.dtype()));
        let f = backend.function(OP, "optim", &kernel)?;
        let (param, grad) = (address(OP, update.param)?, address(OP, &update.grad)?);
        let (exp_avg, exp_avg_sq) = (address(OP, update.state[0])?, address(OP, update.state[1])?);
        let max = update.state.get(2).map_or(Ok(0), |t| address(OP, t))?;
        let c = update.coefficients;
        let flags = i32::from(c.decoupled) | (i32::from(c.amsgrad) << 1) | (i32::from(c.maximize) << 2);
        let n_ = n as i64;
        let span = backend.launch_span(&kernel);
        // SAFETY: the parameter, its contiguous gradient and its state are
        // contiguous tensors of `n` elements of one dtype on this device (the
        // op checked them), the amsgrad buffer is given when the flag is set;
        // the parameters are the ABI's `(i64 n, T*, const T*, T*, T*, T*,
        // f64 × 7, i32 flags)`.
        unsafe {
            stream
                .launch_builder(&f)
                .arg(&n_)
                .arg(&param)
                .arg(&grad)
                .arg(&exp_avg)
                .arg(&exp_avg_sq)
                .arg(&max)
                .arg(&c.lr)
                .arg(&c.beta1)
                .arg(&c.beta2)
                .arg(&c.eps)
                .arg(&c.weight_decay)
                .arg(&c.step_size)
                .arg(&c.inv_bias_correction2_sqrt)
                .arg(&flags)
                .launch(grid_for(n))
        }
        .map_err(|e| backend.call_error(OP, format!("launching {kernel}"), e))?;
        drop(span);
    }
    Ok(())
}
