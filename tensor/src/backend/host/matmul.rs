//! The host's matrix products: `brasa_kernels::gemm` straight on the
//! operands' strided views (a transposed or narrowed operand is not copied),
//! one tall product when the batch folds into rows, else batched calls.

use crate::backend::merged_stride;
use crate::backend::output;
use crate::backend::MatmulOperands;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::shape::Shape;
use crate::storage::lock_storages;
use crate::tensor::Tensor;
use brasa_kernels::gemm::{
    batched_gemm, gemm, gemm_into_f32_with, BatchMut, BatchRef, GemmElement, GemmIntoF32, GemmOptions, MatMut, MatRef,
    Parallelism, PARALLEL_BATCH_THRESHOLD_FLOPS,
};
use half::{bf16, f16};
use rayon::prelude::*;

const OP: &str = "matmul";

/// A kernel error in a product whose operands were already checked: a bug
/// somewhere, reported rather than panicked on.
pub(super) fn gemm_error(op: &'static str, error: brasa_kernels::KernelError) -> TensorError {
    TensorError::kernel(op, error)
}

/// See [`crate::backend::DeviceOps::matmul`].
pub(super) fn matmul(operands: MatmulOperands<'_>) -> Result<Tensor> {
    let MatmulOperands { a, b, batch, m, n, k } = operands;
    let mut full = batch.to_vec();
    full.extend([m, n]);
    let full = Shape::from(full);
    match output(a.device(), a.dtype(), &full)?.if_empty() {
        Ok(empty) => Ok(empty),
        Err(result) => {
            let locks = lock_storages(&[a.storage(), b.storage()], &[]);
            let problem = Problem { a: a.layout(), b: b.layout(), batch, m, n, k };
            macro_rules! run {
                ($t:ty, $one:expr, $zero:expr) => {{
                    let (x, y) = (locks.read::<$t>(a.storage(), OP)?, locks.read::<$t>(b.storage(), OP)?);
                    // SAFETY: the product sets every element of the output
                    // (`out = 1·x·y + 0·out`, which does not read `out` when
                    // beta is zero).
                    unsafe { result.init_with::<$t>(OP, |out| problem.run::<$t>($one, $zero, x, y, out)) }
                }};
            }
            match a.dtype() {
                DType::F32 => run!(f32, 1.0, 0.0),
                DType::F64 => run!(f64, 1.0, 0.0),
                DType::F16 => run!(f16, 1.0, 0.0),
                DType::BF16 => run!(bf16, 1.0, 0.0),
                // Refused by the op.
                other => Err(TensorError::invalid(OP, format!("unsupported dtype {other}"))),
            }
        }
    }
}

/// See [`crate::backend::DeviceOps::matmul_into_f32`]: half operands read as
/// they are by the mixed-precision products (`gemm_into_f32_with`).
pub(super) fn matmul_into_f32(operands: MatmulOperands<'_>) -> Result<Tensor> {
    let MatmulOperands { a, b, batch, m, n, k } = operands;
    let mut full = batch.to_vec();
    full.extend([m, n]);
    match output(a.device(), DType::F32, &Shape::from(full))?.if_empty() {
        Ok(empty) => Ok(empty),
        Err(result) => {
            let locks = lock_storages(&[a.storage(), b.storage()], &[]);
            let problem = Problem { a: a.layout(), b: b.layout(), batch, m, n, k };
            macro_rules! run {
                ($t:ty) => {{
                    let (x, y) = (locks.read::<$t>(a.storage(), OP)?, locks.read::<$t>(b.storage(), OP)?);
                    // SAFETY: every matrix of the output is one product's C
                    // with beta 0, which sets each element without reading it.
                    unsafe { result.init_with::<f32>(OP, |out| problem.run_into_f32::<$t>(x, y, out)) }
                }};
            }
            match a.dtype() {
                DType::F16 => run!(f16),
                DType::BF16 => run!(bf16),
                DType::F32 => run!(f32),
                // Refused by the op.
                other => Err(TensorError::invalid(OP, format!("no f32 product of {other} operands"))),
            }
        }
    }
}

/// One matmul after broadcasting: `a` is `[batch.., m, k]`, `b` is
/// `[batch.., k, n]`, both with non-negative strides; the output is dense.
struct Problem<'a> {
    a: &'a Layout,
    b: &'a Layout,
    batch: &'a [usize],
    m: usize,
    n: usize,
    k: usize,
}

/// A group of batch dims that steps with one stride in each operand.
#[derive(Clone, Copy, Debug)]
struct BatchGroup {
    count: usize,
    a_stride: usize,
    b_stride: usize,
}

impl Problem<'_> {
    fn strides(layout: &Layout) -> Vec<usize> {
        // Non-negative: checked by `non_negative`.
        layout.strides().iter().map(|&s| s as usize).collect()
    }

    /// `[batch.., m, k] · [k, n]` with rows of A evenly spaced across the
    /// batch and B shared: one tall product (better packing and threading
    /// than many small ones), as for a linear layer on a 3-d input. The
    /// stride of A's rows when so.
    fn tall_row_stride(&self) -> Option<usize> {
        let rank = self.batch.len();
        let (sa, sb) = (Self::strides(self.a), Self::strides(self.b));
        let b_broadcast = (0..rank).all(|d| self.batch[d] == 1 || sb[d] == 0);
        let mut row_dims = self.batch.to_vec();
        row_dims.push(self.m);
        let row_strides = sa[..=rank].to_vec();
        merged_stride(&row_dims, &row_strides).filter(|_| b_broadcast)
    }

    /// The product with an f32 output: one tall product where the batch
    /// folds into rows, else one product per matrix — on threads of their
    /// own when there are several and the work is worth it, as attention's
    /// per-head products.
    fn run_into_f32<T: GemmIntoF32>(&self, x: &[T], y: &[T], out: &mut [f32]) -> Result<()> {
        let (m, n, k) = (self.m, self.n, self.k);
        let rank = self.batch.len();
        let (sa, sb) = (Self::strides(self.a), Self::strides(self.b));
        let (a_rs, a_cs, b_rs, b_cs) = (sa[rank], sa[rank + 1], sb[rank], sb[rank + 1]);
        let err = |e| gemm_error(OP, e);
        let auto = GemmOptions::default();
        if let Some(rs) = self.tall_row_stride() {
            let rows = self.batch.iter().product::<usize>() * m;
            let a = MatRef::new(x, self.a.offset(), [rows, k], [rs, a_cs]).map_err(err)?;
            let b = MatRef::new(y, self.b.offset(), [k, n], [b_rs, b_cs]).map_err(err)?;
            let c = MatMut::row_major(out, rows, n).map_err(err)?;
            return gemm_into_f32_with(&auto, 1.0, a, b, 0.0, c).map_err(err);
        }
        let batch_a = Layout::new(self.batch.to_vec(), self.a.strides()[..rank].to_vec(), 0)?;
        let batch_b = Layout::new(self.batch.to_vec(), self.b.strides()[..rank].to_vec(), 0)?;
        let one = |options: &GemmOptions, ((a_off, b_off), c): ((usize, usize), &mut [f32])| -> Result<()> {
            let a = MatRef::new(x, self.a.offset() + a_off, [m, k], [a_rs, a_cs]).map_err(err)?;
            let b = MatRef::new(y, self.b.offset() + b_off, [k, n], [b_rs, b_cs]).map_err(err)?;
            let c = MatMut::row_major(c, m, n).map_err(err)?;
            gemm_into_f32_with(options, 1.0, a, b, 0.0, c).map_err(err)
        };
        // Not empty (the caller returned early): m * n >= 1.
        let calls = batch_a.offsets().zip(batch_b.offsets()).zip(out.chunks_exact_mut(m * n));
        let count: usize = self.batch.iter().product();
        let flops = 2usize.saturating_mul(count).saturating_mul(m).saturating_mul(n).saturating_mul(k);
        if count > 1 && flops >= PARALLEL_BATCH_THRESHOLD_FLOPS {
            let alone = GemmOptions { parallelism: Parallelism::Sequential, ..auto };
            calls.collect::<Vec<_>>().into_par_iter().try_for_each(|call| one(&alone, call))
        } else {
            calls.into_iter().try_for_each(|call| one(&auto, call))
        }
    }

    fn run<T: GemmElement>(&self, one: T::Scalar, zero: T::Scalar, x: &[T], y: &[T], out: &mut [T]) -> Result<()> {
        let (m, n, k) = (self.m, self.n, self.k);
        let rank = self.batch.len();
        let sa = Self::strides(self.a);
        let sb = Self::strides(self.b);
        let (a_rs, a_cs) = (sa[rank], sa[rank + 1]);
        let (b_rs, b_cs) = (sb[rank], sb[rank + 1]);
        let batch_count: usize = self.batch.iter().product();
        let err = |e| gemm_error(OP, e);

        if let Some(rs) = self.tall_row_stride() {
            let rows = batch_count * m;
            let a = MatRef::new(x, self.a.offset(), [rows, k], [rs, a_cs]).map_err(err)?;
            let b = MatRef::new(y, self.b.offset(), [k, n], [b_rs, b_cs]).map_err(err)?;
            let c = MatMut::row_major(out, rows, n).map_err(err)?;
            return gemm(one, a, b, zero, c).map_err(err);
        }

        // Otherwise: the innermost batch dims that step evenly in both
        // operands make one batched call; the outer ones are looped over.
        let mut group = BatchGroup { count: 1, a_stride: 0, b_stride: 0 };
        let mut outer = rank;
        while outer > 0 {
            let d = outer - 1;
            let size = self.batch[d];
            if size != 1 {
                let fits = |stride: usize, inner: usize| group.count == 1 || stride == group.count * inner;
                if !(fits(sa[d], group.a_stride) && fits(sb[d], group.b_stride)) {
                    break;
                }
                if group.count == 1 {
                    group.a_stride = sa[d];
                    group.b_stride = sb[d];
                }
                group.count *= size;
            }
            outer = d;
        }
        let outer_layout_a = Layout::new(self.batch[..outer].to_vec(), self.a.strides()[..outer].to_vec(), 0)?;
        let outer_layout_b = Layout::new(self.batch[..outer].to_vec(), self.b.strides()[..outer].to_vec(), 0)?;
        let per_call = group.count * m * n;
        let one_call = |((a_off, b_off), chunk): ((usize, usize), &mut [T])| -> Result<()> {
            let a = BatchRef::new(x, self.a.offset() + a_off, [group.count, m, k], [group.a_stride, a_rs, a_cs])
                .map_err(err)?;
            let b = BatchRef::new(y, self.b.offset() + b_off, [group.count, k, n], [group.b_stride, b_rs, b_cs])
                .map_err(err)?;
            let c = BatchMut::new(chunk, 0, [group.count, m, n], [m * n, n, 1]).map_err(err)?;
            batched_gemm(one, a, b, zero, c).map_err(err)
        };
        let calls = outer_layout_a.offsets().zip(outer_layout_b.offsets()).zip(out.chunks_exact_mut(per_call.max(1)));
        // Attention's per-head products of a packed q/k/v projection step
        // unevenly over batch and heads: many calls of a few small matrices
        // each, each too small to share out. The calls go to the threads
        // instead (each still threads its own matrices when they are large).
        let flops = 2usize.saturating_mul(batch_count).saturating_mul(m).saturating_mul(n).saturating_mul(k);
        if batch_count > group.count && flops >= PARALLEL_BATCH_THRESHOLD_FLOPS {
            calls.collect::<Vec<_>>().into_par_iter().try_for_each(one_call)
        } else {
            calls.into_iter().try_for_each(one_call)
        }
    }
}
