//! Layer normalisation on CUDA (`norm.cu`): a block of threads per row for
//! the forward and the input's gradient, a thread per column for the
//! parameter gradients. Operands arrive contiguous, in f32 or f64.

use super::elementwise::finish;
use super::{address, output_address, suffix, CudaOps};
use crate::backend::LayerNormBackward;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::storage::UninitTensor;
use crate::tensor::Tensor;
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// One block per row, up to the grid's limit (blocks loop over the rest).
fn rows_config(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.clamp(1, 65_535) as u32, 1, 1),
        block_dim: (brasa_kernels::cuda_ptx::BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The address of an optional operand (0, the kernels' null, when absent).
fn optional_address(op: &'static str, t: Option<&Tensor>) -> Result<u64> {
    t.map_or(Ok(0), |t| address(op, t))
}

fn check_dtype(op: &'static str, dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 | DType::F64 => Ok(()),
        other => Err(TensorError::internal(op, format!("computes in f32 or f64, got {other}"))),
    }
}

/// See [`crate::backend::DeviceOps::layer_norm`].
pub(super) fn layer_norm(
    backend: &CudaOps,
    x: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    const OP: &str = "layer_norm";
    let dtype = x.dtype();
    check_dtype(OP, dtype)?;
    let [rows, width] = [x.dims()[0], x.dims()[1]];
    if rows == 0 || width == 0 {
        // Nothing to normalise: the statistics of empty rows, as on the host.
        let out = Tensor::zeros_on(x.dims(), dtype, backend.device)?;
        let mean = Tensor::zeros_on([rows], dtype, backend.device)?;
        let rstd = Tensor::full_on([rows], 1.0 / eps.sqrt(), dtype, backend.device)?;
        return Ok((out, mean, rstd));
    }
    let out = UninitTensor::new(x.shape().clone(), dtype, backend.device)?;
    let mean = UninitTensor::new([rows], dtype, backend.device)?;
    let rstd = UninitTensor::new([rows], dtype, backend.device)?;
    let kernel = format!("layer_norm_fwd_{}", suffix(dtype));
    let f = backend.function(OP, "norm", &kernel)?;
    let stream = backend.current_stream()?;
    let (src, w, b) = (address(OP, x)?, optional_address(OP, weight)?, optional_address(OP, bias)?);
    let (dst, mean_dst, rstd_dst) = (output_address(OP, &out)?, output_address(OP, &mean)?, output_address(OP, &rstd)?);
    let (rows_, width_) = (rows as i64, width as i64);
    let mut launch = stream.launch_builder(&f);
    launch.arg(&rows_).arg(&width_).arg(&src).arg(&w).arg(&b);
    let (eps32, eps64) = (eps as f32, eps);
    if dtype == DType::F32 {
        launch.arg(&eps32);
    } else {
        launch.arg(&eps64);
    }
    launch.arg(&dst).arg(&mean_dst).arg(&rstd_dst);
    let span = backend.launch_span(&kernel);
    // SAFETY: `x` is a contiguous `[rows, width]` of `dtype`, `weight`/`bias`
    // contiguous `[width]` of `dtype` or null, the outputs fresh tensors of
    // `[rows, width]`, `[rows]`, `[rows]`; the parameters are the ABI's
    // `(i64, i64, const T*, const T*, const T*, T, T*, T*, T*)`.
    unsafe { launch.launch(rows_config(rows)) }
        .map_err(|e| backend.call_error(OP, format!("launching {kernel}"), e))?;
    drop(span);
    Ok((finish(out), finish(mean), finish(rstd)))
}

/// See [`crate::backend::DeviceOps::layer_norm_backward`].
pub(super) fn layer_norm_backward(
    backend: &CudaOps,
    args: LayerNormBackward<'_>,
    needs: [bool; 3],
) -> Result<[Option<Tensor>; 3]> {
    const OP: &str = "layer_norm_backward";
    let LayerNormBackward { grad, x, mean, rstd, weight } = args;
    let dtype = x.dtype();
    check_dtype(OP, dtype)?;
    let [rows, width] = [x.dims()[0], x.dims()[1]];
    let (want_dw, want_db) = (needs[1] && weight.is_some(), needs[2]);
    if rows == 0 || width == 0 {
        let zeros = |dims: &[usize]| Tensor::zeros_on(dims, dtype, backend.device);
        return Ok([
            needs[0].then(|| zeros(x.dims())).transpose()?,
            want_dw.then(|| zeros(&[width])).transpose()?,
            want_db.then(|| zeros(&[width])).transpose()?,
        ]);
    }
    let operands = [address(OP, grad)?, address(OP, x)?, address(OP, mean)?, address(OP, rstd)?];
    let mut dx = None;
    if needs[0] {
        let out = UninitTensor::new(x.shape().clone(), dtype, backend.device)?;
        let (w, dst) = (optional_address(OP, weight)?, output_address(OP, &out)?);
        // SAFETY: contiguous `[rows, width]` gradient and input, `[rows]`
        // statistics, `[width]` weight or null, a fresh `[rows, width]` output;
        // the ABI's `(i64, i64, const T*, const T*, const T*, const T*, const T*, T*)`.
        unsafe {
            launch_backward(backend, "layer_norm_bwd_dx", dtype, [rows, width], operands, [w, dst], rows_config(rows))?
        };
        dx = Some(finish(out));
    }
    let (mut dw, mut db) = (None, None);
    if want_dw || want_db {
        // The kernel adds each block's partial sums into zeroed outputs.
        let dw_out = want_dw.then(|| Tensor::zeros_on([width], dtype, backend.device)).transpose()?;
        let db_out = want_db.then(|| Tensor::zeros_on([width], dtype, backend.device)).transpose()?;
        let dw_addr = dw_out.as_ref().map_or(Ok(0), |t| address(OP, t))?;
        let db_addr = db_out.as_ref().map_or(Ok(0), |t| address(OP, t))?;
        let config = param_config(rows, width);
        // SAFETY: as above, with zeroed `[width]` outputs or null; the ABI's
        // `(i64, i64, const T*, const T*, const T*, const T*, T*, T*)`.
        unsafe {
            launch_backward(
                backend,
                "layer_norm_bwd_param",
                dtype,
                [rows, width],
                operands,
                [dw_addr, db_addr],
                config,
            )?
        };
        dw = dw_out;
        db = db_out;
    }
    Ok([dx, dw, db])
}

/// The grid of `layer_norm_bwd_param`: 32 columns per block across, and
/// enough row chunks (of at least 64 rows) to give the GPU a few hundred
/// blocks.
fn param_config(rows: usize, width: usize) -> LaunchConfig {
    let across = width.div_ceil(32).clamp(1, 65_535);
    let down = (512 / across).clamp(1, rows.div_ceil(64).max(1)).min(65_535);
    LaunchConfig {
        grid_dim: (across as u32, down as u32, 1),
        block_dim: (brasa_kernels::cuda_ptx::BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches `<family>_<dtype>`, one of the two backward kernels, whose
/// parameters are `(i64 rows, i64 width, g, x, mean, rstd, p0, p1)`.
///
/// # Safety
/// The addresses are those the kernel's ABI asks for, of live device memory
/// of the right sizes (or null where the kernel allows it).
unsafe fn launch_backward(
    backend: &CudaOps,
    family: &str,
    dtype: DType,
    [rows, width]: [usize; 2],
    operands: [u64; 4],
    last: [u64; 2],
    config: LaunchConfig,
) -> Result<()> {
    const OP: &str = "layer_norm_backward";
    let kernel = format!("{family}_{}", suffix(dtype));
    let f = backend.function(OP, "norm", &kernel)?;
    let stream = backend.current_stream()?;
    let (rows, width) = (rows as i64, width as i64);
    let mut launch = stream.launch_builder(&f);
    launch.arg(&rows).arg(&width);
    for address in operands.iter().chain(&last) {
        launch.arg(address);
    }
    let span = backend.launch_span(&kernel);
    // SAFETY: the caller's promise.
    unsafe { launch.launch(config) }.map_err(|e| backend.call_error(OP, format!("launching {kernel}"), e))?;
    drop(span);
    Ok(())
}
