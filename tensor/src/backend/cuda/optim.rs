//! The fused optimizer steps on CUDA: `adam_step_<T>` and `sgd_step_<T>` of
//! `optim.cu`, one launch per parameter on the current stream, replaying
//! the composed update per element as the host does.

use super::{address, grid_for, suffix, CudaOps};
use crate::backend::AdamUpdate;
use crate::backend::SgdUpdate;
use crate::error::Result;
use cudarc::driver::PushKernelArg;

const OP: &str = "fused_adam_";
const SGD_OP: &str = "fused_sgd_";

/// See [`crate::backend::DeviceOps::adam_step`].
pub(super) fn adam_step(backend: &CudaOps, updates: &[&AdamUpdate<'_>]) -> Result<()> {
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

/// See [`crate::backend::DeviceOps::sgd_step`].
pub(super) fn sgd_step(backend: &CudaOps, updates: &[&SgdUpdate<'_>]) -> Result<()> {
    let stream = backend.current_stream()?;
    for update in updates {
        let n = update.param.numel();
        if n == 0 {
            continue;
        }
        let kernel = format!("sgd_step_{}", suffix(update.param.dtype()));
        let f = backend.function(SGD_OP, "optim", &kernel)?;
        let (param, grad) = (address(SGD_OP, update.param)?, address(SGD_OP, &update.grad)?);
        // Without momentum the kernel never touches the buffer (ABI: may be null).
        let buffer = update.momentum_buffer.map_or(Ok(0), |t| address(SGD_OP, t))?;
        let c = update.coefficients;
        if c.momentum != 0.0 && buffer == 0 {
            return Err(crate::error::TensorError::internal(SGD_OP, "momentum without its buffer"));
        }
        let flags = i32::from(c.nesterov) | (i32::from(c.maximize) << 1) | (i32::from(c.first_step) << 2);
        let n_ = n as i64;
        let span = backend.launch_span(&kernel);
        // SAFETY: the parameter, its contiguous gradient and its momentum
        // buffer are contiguous tensors of `n` elements of one dtype on this
        // device (the op checked them), the buffer is given whenever
        // momentum is not 0 (checked above); the parameters are the ABI's
        // `(i64 n, T*, const T*, T*, f64 × 4, i32 flags)`.
        unsafe {
            stream
                .launch_builder(&f)
                .arg(&n_)
                .arg(&param)
                .arg(&grad)
                .arg(&buffer)
                .arg(&c.lr)
                .arg(&c.momentum)
                .arg(&c.dampening)
                .arg(&c.weight_decay)
                .arg(&flags)
                .launch(grid_for(n))
        }
        .map_err(|e| backend.call_error(SGD_OP, format!("launching {kernel}"), e))?;
        drop(span);
    }
    Ok(())
}
