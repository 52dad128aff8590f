//! Layer normalisation on CUDA (`norm.cu`): a block of threads per row for
//! the forward and the input's gradient, a thread per column for the
//! parameter gradients. Operands arrive contiguous, in f32 or f64.

use super::elementwise::finish;
use super::{address, grid_for, output_address, suffix, CudaBackend};
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
        other => Err(TensorError::invalid(op, format!("internal: computes in f32 or f64, got {other}"))),
    }
}

/// See [`crate::backend::Backend::layer_norm`].
pub(super) fn layer_norm(
    backend: &CudaBackend,
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

/// See [`crate::backend::Backend::layer_norm_backward`].
pub(super) fn layer_norm_backward(
    backend: &CudaBackend,
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
    let stream = backend.current_stream()?;
    let (g, xs, m, s) = (address(OP, grad)?, address(OP, x)?, address(OP, mean)?, address(OP, rstd)?);
    let (rows_, width_) = (rows as i64, width as i64);
    let mut dx = None;
    if needs[0] {
        let out = UninitTensor::new(x.shape().clone(), dtype, backend.device)?;
        let kernel = format!("layer_norm_bwd_dx_{}", suffix(dtype));
        let f = backend.function(OP, "norm", &kernel)?;
        let (w, dst) = (optional_address(OP, weight)?, output_address(OP, &out)?);
        let span = backend.launch_span(&kernel);
        // SAFETY: contiguous `[rows, width]` gradient and input, `[rows]`
        // statistics, `[width]` weight or null, a fresh `[rows, width]` output;
        // the ABI's `(i64, i64, const T*, const T*, const T*, const T*, const T*, T*)`.
        unsafe {
            stream
                .launch_builder(&f)
                .arg(&rows_)
                .arg(&width_)
                .arg(&g)
                .arg(&xs)
                .arg(&m)
                .arg(&s)
                .arg(&w)
                .arg(&dst)
                .launch(rows_config(rows))
        }
        .map_err(|e| backend.call_error(OP, format!("launching {kernel}"), e))?;
        drop(span);
        dx = Some(finish(out));
    }
    let (mut dw, mut db) = (None, None);
    if want_dw || want_db {
        let dw_out = want_dw.then(|| UninitTensor::new([width], dtype, backend.device)).transpose()?;
        let db_out = want_db.then(|| UninitTensor::new([width], dtype, backend.device)).transpose()?;
        let dw_addr = dw_out.as_ref().map_or(Ok(0), |t| output_address(OP, t))?;
        let db_addr = db_out.as_ref().map_or(Ok(0), |t| output_address(OP, t))?;
        let kernel = format!("layer_norm_bwd_param_{}", suffix(dtype));
        let f = backend.function(OP, "norm", &kernel)?;
        let span = backend.launch_span(&kernel);
        // SAFETY: as above, with fresh `[width]` outputs or null; the ABI's
        // `(i64, i64, const T*, const T*, const T*, const T*, T*, T*)`.
        unsafe {
            stream
                .launch_builder(&f)
                .arg(&rows_)
                .arg(&width_)
                .arg(&g)
                .arg(&xs)
                .arg(&m)
                .arg(&s)
                .arg(&dw_addr)
                .arg(&db_addr)
                .launch(grid_for(width))
        }
        .map_err(|e| backend.call_error(OP, format!("launching {kernel}"), e))?;
        drop(span);
        dw = dw_out.map(finish);
        db = db_out.map(finish);
    }
    Ok([dx, dw, db])
}
