//! Batch normalisation's per-channel passes on CUDA (`norm.cu`): a block of
//! threads per channel for the two reductions, a thread per element
//! (grid-stride) for the two elementwise passes. `x` and `dy` arrive as
//! contiguous `[N, C, S]` of any float dtype, per-channel operands as
//! contiguous `[C]` of the compute dtype.
//!
//! An input seen as `[rows, C, 1]` (channels last, or 2-d) is reduced
//! across instead: blocks of 32 channels fold pieces of rows into a
//! temporary of partial results, and a second kernel folds the pieces
//! ([`batch_norm_row_pieces`] decides, and the meta device imitating a
//! CUDA device allocates the same temporary from it).

use super::elementwise::finish;
use super::{address, grid_for, output_address, suffix, CudaOps};
use crate::backend::args::{batch_norm_row_pieces, RowPieces};
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

/// The grid of the row-piece kernels: tiles of 32 channels across, pieces
/// down (blocks loop over what the grid's limits leave out).
fn pieces_config(channels: usize, pieces: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (channels.div_ceil(32).clamp(1, 1 << 20) as u32, pieces.clamp(1, 65_535) as u32, 1),
        block_dim: (brasa_kernels::cuda_ptx::BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches `kernel` with `(i64 rows, i64 c, i64 rows_per_piece, i64
/// pieces)` and then `addresses`, on the row-piece grid (`pieces` of them
/// down, or one row of blocks for a merge).
///
/// # Safety
/// The addresses are those the kernel's ABI (kernels/cuda/ABI.md, "norm")
/// asks for, of live device memory of the right sizes and dtypes.
unsafe fn launch_pieces(
    backend: &CudaOps,
    op: &'static str,
    kernel: &str,
    [rows, channels]: [usize; 2],
    plan: RowPieces,
    addresses: &[u64],
    down: usize,
) -> Result<()> {
    let f = backend.function(op, "norm", kernel)?;
    let stream = backend.current_stream()?;
    let dims = [rows, channels, plan.rows_per_piece, plan.pieces].map(|d| d as i64);
    let mut launch = stream.launch_builder(&f);
    for d in &dims {
        launch.arg(d);
    }
    for address in addresses {
        launch.arg(address);
    }
    let span = backend.launch_span(kernel);
    // SAFETY: the caller's promise.
    unsafe { launch.launch(pieces_config(channels, down)) }
        .map_err(|e| backend.call_error(op, format!("launching {kernel}"), e))?;
    drop(span);
    Ok(())
}

/// A per-channel reduction of `x` (`[rows, C, 1]`) in pieces:
/// `<family>_rows_<T>` reads `operands` (device addresses in the ABI's
/// order, `x` among them) and writes `[2, pieces, C]` partial results into
/// a temporary; `<family>_merge_<C>` folds them into two fresh `[C]`
/// outputs of the compute dtype.
fn reduce_in_pieces(
    backend: &CudaOps,
    op: &'static str,
    family: &str,
    x: &Tensor,
    operands: &[&Tensor],
    plan: RowPieces,
) -> Result<(Tensor, Tensor)> {
    let (rows, channels) = (x.dims()[0], x.dims()[1]);
    let (first, second) = pair_out(backend, x)?;
    let dtype = compute_dtype(x.dtype());
    let partial = UninitTensor::new([plan.partial_len(channels)], dtype, backend.device)?;
    let mut addresses = operands.iter().map(|t| address(op, t)).collect::<Result<Vec<_>>>()?;
    addresses.push(output_address(op, &partial)?);
    let rows_kernel = format!("{family}_rows_{}", suffix(x.dtype()));
    // SAFETY: `operands` are contiguous `[rows, c, 1]` inputs of one type
    // and, where the family takes one, the `[c]` mean of the compute type;
    // then a fresh `[2, pieces, c]` of the compute type: the ABI's `(i64,
    // i64, i64, i64, const T*…, [const C*,] C*)`.
    unsafe { launch_pieces(backend, op, &rows_kernel, [rows, channels], plan, &addresses, plan.pieces)? };
    let partial = finish(partial);
    let merge_kernel = format!("{family}_merge_{}", suffix(dtype));
    let merge_addresses = [address(op, &partial)?, output_address(op, &first)?, output_address(op, &second)?];
    // SAFETY: the `[2, pieces, c]` partial results just written and two
    // fresh `[c]` outputs of the compute type: `(i64, i64, i64, i64,
    // const C*, C*, C*)`.
    unsafe { launch_pieces(backend, op, &merge_kernel, [rows, channels], plan, &merge_addresses, 1)? };
    Ok((finish(first), finish(second)))
}

/// Two fresh `[C]` tensors of the compute dtype.
fn pair_out(backend: &CudaOps, x: &Tensor) -> Result<(UninitTensor, UninitTensor)> {
    let (c, dtype) = (x.dims()[1], compute_dtype(x.dtype()));
    Ok((UninitTensor::new([c], dtype, backend.device)?, UninitTensor::new([c], dtype, backend.device)?))
}

/// See [`crate::backend::DeviceOps::batch_norm_stats`].
pub(super) fn batch_norm_stats(backend: &CudaOps, x: &Tensor) -> Result<(Tensor, Tensor)> {
    const OP: &str = "batch_norm_stats";
    let d = x.dims();
    if let Some(plan) = batch_norm_row_pieces([d[0], d[1], d[2]]) {
        return reduce_in_pieces(backend, OP, "batch_norm_stats", x, &[x], plan);
    }
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
    let d = x.dims();
    if let Some(plan) = batch_norm_row_pieces([d[0], d[1], d[2]]) {
        return reduce_in_pieces(backend, OP, "batch_norm_bwd_reduce", x, &[dy, x, mean], plan);
    }
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
