//! Batch normalisation's per-channel passes on CUDA (`norm.cu`): a block of
//! threads per channel for the two reductions, a thread per element
//! (grid-stride) for the two elementwise passes. `x` and `dy` arrive as
//! contiguous `[N, C, S]` of any float dtype, per-channel operands as
//! contiguous `[C]` of the compute dtype.

use super::elementwise::finish;
use super::{address, grid_for, output_address, suffix, CudaOps};
use crate::backend::BatchNormBackwardElemt;
use crate::dtype::DType;
use crate::error::Result;
use crate::storage::UninitTensor;
use crate::tensor::Tensor;
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// One block per channel, up to the grid's limit (blocks loop over the rest).
fn channels_config(channels: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (channels.clamp(1, 65_535) as u32, 1, 1),
        block_dim: (brasa_kernels::cuda_ptx::BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn compute_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Launches `<family>_<dtype of x>` with `(i64 n, i64 c, i64 s)` and then
/// `addresses`.
///
/// # Safety
/// The addresses are those the kernel's ABI (kernels/cuda/ABI.md, "norm")
/// asks for, of live device memory of the right sizes and dtypes.
unsafe fn launch(
    backend: &CudaOps,
    op: &'static str,
    family: &str,
    x: &Tensor,
    addresses: &[u64],
    config: LaunchConfig,
) -> Result<()> {
    let kernel = format!("{family}_{}", suffix(x.dtype()));
    let f = backend.function(op, "norm", &kernel)?;
    let stream = backend.current_stream()?;
    let d = x.dims();
    let (n, c, s) = (d[0] as i64, d[1] as i64, d[2] as i64);
    let mut launch = stream.launch_builder(&f);
    launch.arg(&n).arg(&c).arg(&s);
    for address in addresses {
        launch.arg(address);
    }
    let span = backend.launch_span(&kernel);
    // SAFETY: the caller's promise.
    unsafe { launch.launch(config) }.map_err(|e| backend.call_error(op, format!("launching {kernel}"), e))?;
    drop(span);
    Ok(())
}

/// Two fresh `[C]` tensors of the compute dtype.
fn pair_out(backend: &CudaOps, x: &Tensor) -> Result<(UninitTensor, UninitTensor)> {
    let (c, dtype) = (x.dims()[1], compute_dtype(x.dtype()));
    Ok((UninitTensor::new([c], dtype, backend.device)?, UninitTensor::new([c], dtype, backend.device)?))
}

/// See [`crate::backend::DeviceOps::batch_norm_stats`].
pub(super) fn batch_norm_stats(backend: &CudaOps, x: &Tensor) -> Result<(Tensor, Tensor)> {
    const OP: &str = "batch_norm_stats";
    let (mean, var) = pair_out(backend, x)?;
    if x.dims()[1] == 0 {
        return Ok((finish(mean), finish(var)));
    }
    let addresses = [address(OP, x)?, output_address(OP, &mean)?, output_address(OP, &var)?];
    // SAFETY: `x` contiguous `[n, c, s]`, two fresh `[c]` outputs of its
    // compute type: `(i64, i64, i64, const T*, C*, C*)`.
    unsafe { launch(backend, OP, "batch_norm_stats", x, &addresses, channels_config(x.dims()[1]))? };
    Ok((finish(mean), finish(var)))
}

/// See [`crate::backend::DeviceOps::batch_norm_elemt`].
pub(super) fn batch_norm_elemt(
    backend: &CudaOps,
    x: &Tensor,
    mean: &Tensor,
    scale: &Tensor,
    shift: &Tensor,
) -> Result<Tensor> {
    const OP: &str = "batch_norm_elemt";
    let out = UninitTensor::new(x.shape().clone(), x.dtype(), backend.device)?;
    if x.numel() == 0 {
        return Ok(finish(out));
    }
    let addresses =
        [address(OP, x)?, address(OP, mean)?, address(OP, scale)?, address(OP, shift)?, output_address(OP, &out)?];
    // SAFETY: `x` contiguous `[n, c, s]`, three `[c]` of its compute type, a
    // fresh output like `x`: `(i64, i64, i64, const T*, const C*, const C*,
    // const C*, T*)`.
    unsafe { launch(backend, OP, "batch_norm_elemt", x, &addresses, grid_for(x.numel()))? };
    Ok(finish(out))
}

/// See [`crate::backend::DeviceOps::batch_norm_backward_reduce`].
pub(super) fn batch_norm_backward_reduce(
    backend: &CudaOps,
    dy: &Tensor,
    x: &Tensor,
    mean: &Tensor,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "batch_norm_backward_reduce";
    let (sum_dy, sum_dy_xmu) = pair_out(backend, x)?;
    if x.dims()[1] == 0 {
        return Ok((finish(sum_dy), finish(sum_dy_xmu)));
    }
    let addresses = [
        address(OP, dy)?,
        address(OP, x)?,
        address(OP, mean)?,
        output_address(OP, &sum_dy)?,
        output_address(OP, &sum_dy_xmu)?,
    ];
    // SAFETY: `dy` and `x` contiguous `[n, c, s]` of one type, `[c]` mean
    // and two fresh `[c]` outputs of the compute type: `(i64, i64, i64,
    // const T*, const T*, const C*, C*, C*)`.
    unsafe { launch(backend, OP, "batch_norm_bwd_reduce", x, &addresses, channels_config(x.dims()[1]))? };
    Ok((finish(sum_dy), finish(sum_dy_xmu)))
}

/// See [`crate::backend::DeviceOps::batch_norm_backward_elemt`].
pub(super) fn batch_norm_backward_elemt(backend: &CudaOps, args: BatchNormBackwardElemt<'_>) -> Result<Tensor> {
    const OP: &str = "batch_norm_backward_elemt";
    let BatchNormBackwardElemt { dy, x, mean, scale, mean_dy, k } = args;
    let out = UninitTensor::new(x.shape().clone(), x.dtype(), backend.device)?;
    if x.numel() == 0 {
        return Ok(finish(out));
    }
    let addresses = [
        address(OP, dy)?,
        address(OP, x)?,
        address(OP, mean)?,
        address(OP, scale)?,
        address(OP, mean_dy)?,
        address(OP, k)?,
        output_address(OP, &out)?,
    ];
    // SAFETY: `dy` and `x` contiguous `[n, c, s]` of one type, four `[c]`
    // of the compute type, a fresh output like `x`: `(i64, i64, i64,
    // const T*, const T*, const C*, const C*, const C*, const C*, T*)`.
    unsafe { launch(backend, OP, "batch_norm_bwd_elemt", x, &addresses, grid_for(x.numel()))? };
    Ok(finish(out))
}
