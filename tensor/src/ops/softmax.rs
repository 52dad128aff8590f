//! `softmax` and `log_softmax` along one dim, numerically stable (the max of
//! each slice is subtracted before exponentiating, so 1000.0 is as safe as
//! 1.0). `f16`/`bf16` are computed in `f32` and rounded once.
//!
//! The input is made contiguous and seen as `[outer, n, inner]` with `n` the
//! softmax dim. For the last dim (`inner == 1`) each row is one kernel call
//! on a slice; for other dims the kernel normalises down columns, so no
//! transposition is needed. Rows (or outer blocks) are split over rayon's
//! threads once the tensor holds [`PARALLEL_MIN_WORK`] elements.

use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::ops::common::expect_float;
use crate::ops::reduce::PARALLEL_MIN_WORK;
use crate::shape::{resolve_dim, DimIndex};
use crate::tensor::Tensor;
use brasa_kernels::reduce::{log_softmax_columns, log_softmax_row, softmax_columns, softmax_row, FloatAccumulator};
use brasa_kernels::scratch::try_resize;
use half::{bf16, f16};
use rayon::prelude::*;

/// Elements one parallel task handles at least.
const TASK_WORK: usize = 1 << 14;

/// The kernel signature shared by the four softmax kernels: `(x, out, inner)`.
type Kernel<F> = fn(&[F], &mut [F], usize) -> brasa_kernels::Result<()>;

fn row_kernel<F: FloatAccumulator + brasa_kernels::reduce::ReduceElement<Acc = F>>(log: bool) -> Kernel<F> {
    if log {
        |x, out, _| log_softmax_row(x, out)
    } else {
        |x, out, _| softmax_row(x, out)
    }
}

fn column_kernel<F: FloatAccumulator>(log: bool) -> Kernel<F> {
    if log {
        log_softmax_columns
    } else {
        softmax_columns
    }
}

/// Element types computed in another float type (`f16`, `bf16` in `f32`).
trait Widen: WithDType {
    fn widen(src: &[Self], dst: &mut [f32]);
    fn narrow(src: &[f32], dst: &mut [Self]);
}

impl Widen for f16 {
    fn widen(src: &[Self], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = f16::from_f32(s);
        }
    }
}

impl Widen for bf16 {
    fn widen(src: &[Self], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = bf16::from_f32(s);
        }
    }
}

/// Runs `kernel` on each `block` of `x` into `out` (blocks are rows or
/// `[n, inner]` slabs), in parallel for big tensors.
fn run_blocks<F: Send + Sync + Copy>(
    op: &'static str,
    x: &[F],
    out: &mut [F],
    block: usize,
    inner: usize,
    kernel: Kernel<F>,
) -> Result<()> {
    let call = |(x, out): (&[F], &mut [F])| kernel(x, out, inner).map_err(|source| TensorError::kernel(op, source));
    if x.len() < PARALLEL_MIN_WORK {
        return x.chunks(block).zip(out.chunks_mut(block)).try_for_each(call);
    }
    let per_task = TASK_WORK.div_ceil(block).max(1);
    x.par_chunks(block).zip(out.par_chunks_mut(block)).with_min_len(per_task).try_for_each(call)
}

/// Like [`run_blocks`] for half types: each block is widened to `f32`,
/// computed, and rounded back.
fn run_blocks_widened<T: Widen>(
    op: &'static str,
    x: &[T],
    out: &mut [T],
    block: usize,
    inner: usize,
    kernel: Kernel<f32>,
) -> Result<()> {
    let call = |buffers: &mut (Vec<f32>, Vec<f32>), (x, out): (&[T], &mut [T])| {
        let (wide_x, wide_out) = buffers;
        // A block is one slice (or `[n, inner]` slab) of the tensor: twice
        // its bytes again in f32, which may be more than the host has.
        let scratch = |e| TensorError::scratch(op, e);
        try_resize(wide_x, x.len(), 0.0).map_err(scratch)?;
        try_resize(wide_out, x.len(), 0.0).map_err(scratch)?;
        T::widen(x, wide_x);
        kernel(wide_x, wide_out, inner).map_err(|source| TensorError::kernel(op, source))?;
        T::narrow(wide_out, out);
        Ok(())
    };
    if x.len() < PARALLEL_MIN_WORK {
        let mut buffers = (Vec::new(), Vec::new());
        return x.chunks(block).zip(out.chunks_mut(block)).try_for_each(|pair| call(&mut buffers, pair));
    }
    let per_task = TASK_WORK.div_ceil(block).max(1);
    x.par_chunks(block)
        .zip(out.par_chunks_mut(block))
        .with_min_len(per_task)
        .try_for_each_init(|| (Vec::new(), Vec::new()), call)
}

/// `data[offset..offset + len]`, or an error (never a panic).
fn within<'a, T>(op: &'static str, data: &'a [T], offset: usize, len: usize) -> Result<&'a [T]> {
    data.get(offset..offset.saturating_add(len))
        .ok_or_else(|| TensorError::invalid(op, format!("internal: {offset}+{len} is past {} elements", data.len())))
}

fn softmax_impl(x: &Tensor, op: &'static str, dim: impl DimIndex, log: bool) -> Result<Tensor> {
    let _range = brasa_profile::record_op(op, &[x.dims()]);
    expect_float(op, x)?;
    let rank = x.rank();
    // A 0-d tensor is a single slice of one element (dim 0 or -1), as in PyTorch.
    let d = resolve_dim(dim, rank.max(1), op)?;
    let x = x.contiguous()?;
    let dims = x.dims();
    let n = dims.get(d).copied().unwrap_or(1);
    let inner: usize = dims.get(d + 1..).map_or(1, |rest| rest.iter().product());
    let result = match Tensor::uninit_like(&x, x.dtype(), x.device())?.if_empty() {
        Ok(empty) => return Ok(empty),
        Err(result) => result,
    };
    {
        let offset = x.layout().offset();
        let numel = x.numel();
        let (block, kernel_inner) = if inner == 1 { (n, 1) } else { (n * inner, inner) };
        macro_rules! native {
            ($F:ty) => {{
                let src = x.storage().read::<$F>(op)?;
                let kernel = if inner == 1 { row_kernel::<$F>(log) } else { column_kernel::<$F>(log) };
                // SAFETY: the blocks tile the output and the kernels set every
                // element of their block, reading none.
                unsafe {
                    result.init_with::<$F>(op, |out| {
                        run_blocks(op, within(op, &src, offset, numel)?, out, block, kernel_inner, kernel)
                    })
                }
            }};
        }
        macro_rules! widened {
            ($T:ty) => {{
                let src = x.storage().read::<$T>(op)?;
                let kernel = if inner == 1 { row_kernel::<f32>(log) } else { column_kernel::<f32>(log) };
                // SAFETY: as above; each block is narrowed into the output whole.
                unsafe {
                    result.init_with::<$T>(op, |out| {
                        run_blocks_widened(op, within(op, &src, offset, numel)?, out, block, kernel_inner, kernel)
                    })
                }
            }};
        }
        match x.dtype() {
            DType::F32 => native!(f32),
            DType::F64 => native!(f64),
            DType::F16 => widened!(f16),
            DType::BF16 => widened!(bf16),
            other => Err(TensorError::invalid(op, format!("needs a floating-point tensor, got {other}"))),
        }
    }
}

impl Tensor {
    /// `exp(x - max) / Σ exp(x - max)` along `dim` (negative counts from the
    /// end): every slice along `dim` sums to 1. Floating-point tensors only;
    /// `f16`/`bf16` are computed in `f32`. A NaN in a slice makes it all NaN.
    pub fn softmax(&self, dim: impl DimIndex) -> Result<Tensor> {
        softmax_impl(self, "softmax", dim, false)
    }

    /// `x - max - ln Σ exp(x - max)` along `dim`: the logarithm of
    /// [`Tensor::softmax`], computed without forming the softmax (accurate
    /// for very negative log-probabilities).
    pub fn log_softmax(&self, dim: impl DimIndex) -> Result<Tensor> {
        softmax_impl(self, "log_softmax", dim, true)
    }
}

#[cfg(test)]
mod tests {
    use crate::{DType, Device, Tensor};

    #[test]
    fn rows_and_columns_sum_to_one() {
        let x = Tensor::from_vec_on(vec![1f32, 2.0, 3.0, 1000.0, 1000.0, 1000.0], [2, 3], Device::CPU).unwrap();
        let rows = x.softmax(-1).unwrap().to_vec::<f32>().unwrap();
        assert!((rows[3] - 1.0 / 3.0).abs() < 1e-6, "{rows:?}");
        assert!((rows[..3].iter().sum::<f32>() - 1.0).abs() < 1e-6);
        let columns = x.softmax(0).unwrap().to_vec::<f32>().unwrap();
        assert!((columns[0] + columns[3] - 1.0).abs() < 1e-6, "{columns:?}");
        assert_eq!(columns[0], 0.0);
        let log = x.log_softmax(1).unwrap().to_vec::<f32>().unwrap();
        assert!((log[3] + 3f32.ln()).abs() < 1e-5, "{log:?}");
        let half = x.to_dtype(DType::BF16).unwrap().softmax(1).unwrap();
        assert_eq!(half.dtype(), DType::BF16);
        let error = Tensor::zeros_on([2], DType::I64, Device::CPU).unwrap().softmax(0).unwrap_err().to_string();
        assert!(error.contains("softmax") && error.contains("i64"), "{error}");
        assert!(x.softmax(2).is_err());
        let scalar = Tensor::scalar_on(3.0f32, Device::CPU).unwrap();
        assert_eq!(scalar.softmax(0).unwrap().item::<f32>().unwrap(), 1.0);
    }
}
