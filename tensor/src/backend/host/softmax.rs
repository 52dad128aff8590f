//! The host's softmax and log-softmax over the middle dim of a contiguous
//! `[outer, n, inner]`: for the last dim (`inner == 1`) each row is one
//! kernel call on a slice; for other dims the kernel normalises down
//! columns, so no transposition is needed. Rows (or outer blocks) are split
//! over rayon's threads once the tensor holds [`PARALLEL_MIN_WORK`] elements;
//! f16/bf16 blocks are widened to f32, computed, and rounded once.

use crate::backend::host::PARALLEL_MIN_WORK;
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
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
        .ok_or_else(|| TensorError::internal(op, format!("{offset}+{len} is past {} elements", data.len())))
}

/// See [`crate::backend::DeviceOps::softmax`]: `x` is contiguous, `[outer, n,
/// inner]` around the softmax dim.
pub(super) fn softmax(op: &'static str, x: &Tensor, n: usize, inner: usize, log: bool) -> Result<Tensor> {
    let result = match Tensor::uninit_like(x, x.dtype(), x.device())?.if_empty() {
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
