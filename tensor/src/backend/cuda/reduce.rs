//! Reductions on CUDA: the reduced dims are brought into the middle of a
//! contiguous `[outer, len, inner]` view (as they are when a contiguous
//! tensor is reduced over a run of neighbouring dims, e.g. a bias gradient,
//! `[N, C]` over dim 0: `[1, N, C]`), else by a copy with the reduced dims
//! moved last (`[outer, len, 1]`); one kernel then folds each run.
//!
//! Softmax and log-softmax use the same `[outer, n, inner]` form.
//!
//! Launch rule (ABI): with `inner == 1` a block of 256 threads folds each
//! run (blocks loop over runs); otherwise a thread folds each column.

use super::elementwise::{finish, launch_fill};
use super::{address, grid_for, output_address, suffix, CudaOps};
use crate::backend::args::{column_chunks, reduce_layout, ReduceLayout};
use crate::backend::out_dims;
use crate::backend::ReduceOp;
use crate::dispatch::dispatch_dtype;
use crate::dtype::{DType, WithDType};
use crate::error::Result;
use crate::shape::Shape;
use crate::storage::UninitTensor;
use crate::tensor::Tensor;
use cudarc::driver::{LaunchConfig, PushKernelArg};

/// The dtype sums, means and variances of `dtype` accumulate in.
fn accumulator(dtype: DType) -> DType {
    match dtype {
        DType::F64 => DType::F64,
        d if d.is_float() => DType::F32,
        _ => DType::I64,
    }
}

/// `x` as a contiguous `[outer, len, inner]` with the reduced dims (`mask`,
/// `len` elements, at least one) in the middle: `x` itself or a copy with
/// the reduced dims moved last, as [`reduce_layout`] decides (the meta
/// device imitating a CUDA device allocates the same copy from it).
fn middle_view(x: &Tensor, mask: &[bool], len: usize) -> Result<(Tensor, [usize; 3])> {
    match reduce_layout(x.dims(), x.is_contiguous(), mask, len) {
        ReduceLayout::View(runs) => Ok((x.clone(), runs)),
        ReduceLayout::Moved { order, runs } => Ok((x.permute(&order)?.contiguous()?, runs)),
    }
}

/// The ABI's launch for folding `[outer, len, inner]` runs: a block per run
/// when `inner == 1`, else a thread per column.
fn runs_config(outer: usize, inner: usize) -> LaunchConfig {
    if inner == 1 {
        let blocks = outer.clamp(1, 65_535) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (brasa_kernels::cuda_ptx::BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    } else {
        grid_for(outer * inner)
    }
}

pub(super) fn reduce(
    backend: &CudaOps,
    op: ReduceOp,
    name: &'static str,
    x: &Tensor,
    mask: &[bool],
    keepdim: bool,
) -> Result<Tensor> {
    let out_shape = Shape::from(out_dims(x.dims(), mask, keepdim));
    let out_dtype = match op {
        ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Var { .. } => accumulator(x.dtype()),
        ReduceOp::Max | ReduceOp::Min => x.dtype(),
        ReduceOp::ArgMax | ReduceOp::ArgMin => DType::I64,
    };
    let out = UninitTensor::new(out_shape.clone(), out_dtype, backend.device)?;
    let outputs = out_shape.numel();
    if outputs == 0 {
        return Ok(finish(out));
    }
    let len: usize = x.dims().iter().zip(mask).filter(|(_, &m)| m).map(|(&d, _)| d).product();
    let dst = output_address(name, &out)?;
    if len == 0 {
        // Max, min and positions of nothing are refused by the op.
        let value = if op == ReduceOp::Sum { 0.0 } else { f64::NAN };
        dispatch_dtype!(out_dtype, T => launch_fill::<T>(backend, name, out_dtype, outputs, T::from_f64(value), dst))?;
        return Ok(finish(out));
    }
    let (source, [outer, len, inner]) = middle_view(x, mask, len)?;
    let kernel_op = match op {
        ReduceOp::Sum => "sum",
        ReduceOp::Mean => "mean",
        ReduceOp::Var { sqrt: false, .. } => "var",
        ReduceOp::Var { sqrt: true, .. } => "std",
        ReduceOp::Max => "max",
        ReduceOp::Min => "min",
        ReduceOp::ArgMax => "argmax",
        ReduceOp::ArgMin => "argmin",
    };
    if let Some(chunks) = column_chunks(op, outer, len, inner) {
        // Few long columns: fold each in `chunks` equal pieces first (as
        // many threads as outputs × chunks), then fold the pieces. Equal
        // pieces keep a mean of means the mean.
        let fold = |dtype: DType| format!("reduce_{kernel_op}_{}", suffix(dtype));
        let partial = UninitTensor::new(Shape::from(vec![outer * chunks * inner]), out_dtype, backend.device)?;
        let partial_dst = output_address(name, &partial)?;
        let source_address = address(name, &source)?;
        // SAFETY: `source` is a contiguous `[outer · chunks, len / chunks,
        // inner]` view and `partial` holds one accumulator per piece.
        unsafe {
            launch_runs(
                backend,
                name,
                "reduce",
                &fold(x.dtype()),
                [outer * chunks, len / chunks, inner],
                source_address,
                partial_dst,
            )?
        };
        let partial = finish(partial);
        // SAFETY: `partial` is a contiguous `[outer, chunks, inner]` of the
        // accumulator dtype and `out` holds `outer · inner` of it.
        unsafe {
            launch_runs(
                backend,
                name,
                "reduce",
                &fold(out_dtype),
                [outer, chunks, inner],
                address(name, &partial)?,
                dst,
            )?
        };
        return Ok(finish(out));
    }
    let kernel = format!("reduce_{kernel_op}_{}", suffix(x.dtype()));
    let f = backend.function(name, "reduce", &kernel)?;
    let stream = backend.current_stream()?;
    let src = address(name, &source)?;
    let (outer_, len_, inner_) = (outer as i64, len as i64, inner as i64);
    let config = if inner == 1 {
        let blocks = outer.clamp(1, 65_535) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (brasa_kernels::cuda_ptx::BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    } else {
        grid_for(outer * inner)
    };
    let mut launch = stream.launch_builder(&f);
    launch.arg(&outer_).arg(&len_).arg(&inner_);
    let correction = match op {
        ReduceOp::Var { correction, .. } => correction as i64,
        _ => 0,
    };
    if matches!(op, ReduceOp::Var { .. }) {
        launch.arg(&correction);
    }
    launch.arg(&src).arg(&dst);
    let span = backend.launch_span(&kernel);
    // SAFETY: `source` is a contiguous `[outer, len, inner]` view of live
    // device memory and `out` holds `outer · inner` elements of the kernel's
    // output type; the parameters are the ABI's
    // `(i64 outer, i64 len, i64 inner, [i64 correction,] const T*, O*)`.
    unsafe { launch.launch(config) }.map_err(|e| backend.call_error(name, format!("launching {kernel}"), e))?;
    drop(span);
    Ok(finish(out))
}

/// Launches `kernel` of `module`, whose parameters are `(i64 outer, i64
/// len, i64 inner, const T* src, O* dst)`, over the contiguous
/// `[outer, len, inner]` runs at `src` (sums, means, softmax).
///
/// # Safety
/// `src` and `dst` must be live device memory on this device of the sizes
/// and types the kernel's ABI asks for.
unsafe fn launch_runs(
    backend: &CudaOps,
    name: &'static str,
    module: &'static str,
    kernel: &str,
    [outer, len, inner]: [usize; 3],
    src: u64,
    dst: u64,
) -> Result<()> {
    let f = backend.function(name, module, kernel)?;
    let stream = backend.current_stream()?;
    let (outer_, len_, inner_) = (outer as i64, len as i64, inner as i64);
    let span = backend.launch_span(kernel);
    // SAFETY: the caller's promise.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&outer_)
            .arg(&len_)
            .arg(&inner_)
            .arg(&src)
            .arg(&dst)
            .launch(runs_config(outer, inner))
    }
    .map_err(|e| backend.call_error(name, format!("launching {kernel}"), e))?;
    drop(span);
    Ok(())
}

/// See [`crate::backend::DeviceOps::softmax`].
pub(super) fn softmax(
    backend: &CudaOps,
    name: &'static str,
    x: &Tensor,
    n: usize,
    inner: usize,
    log: bool,
) -> Result<Tensor> {
    let out = UninitTensor::new(x.shape().clone(), x.dtype(), backend.device)?;
    if x.numel() == 0 {
        return Ok(finish(out));
    }
    let outer = x.numel() / (n * inner);
    let kernel = format!("{}softmax_{}", if log { "log_" } else { "" }, suffix(x.dtype()));
    // SAFETY: `x` is a contiguous `[outer, n, inner]` view and `out` a new
    // tensor of its shape and dtype (the ABI's `(i64, i64, i64, const T*, T*)`).
    unsafe {
        launch_runs(
            backend,
            name,
            "softmax",
            &kernel,
            [outer, n, inner],
            address(name, x)?,
            output_address(name, &out)?,
        )?
    };
    Ok(finish(out))
}

#[cfg(test)]
mod tests {
    use super::accumulator;
    use crate::dtype::DType;

    #[test]
    fn accumulators_follow_the_host() {
        assert_eq!(accumulator(DType::BF16), DType::F32);
        assert_eq!(accumulator(DType::F64), DType::F64);
        assert_eq!(accumulator(DType::U8), DType::I64);
        assert_eq!(accumulator(DType::Bool), DType::I64);
    }
}
