//! The allocations of the CUDA backend (`backend/cuda/`) where they differ
//! from the host's, for meta devices imitating a CUDA device: each function
//! here allocates what its CUDA counterpart allocates, in the same order,
//! and frees it at the same point, and computes nothing. Sizing rules that
//! decide whether a temporary exists (a reduction's copy and partial sums,
//! a convolution's joined groups) are shared with the CUDA backend through
//! `backend/args`, so the two cannot drift apart.
//!
//! Matrix products copy the operands cuBLAS cannot read as they lie, as
//! the CUDA backend does. Convolutions follow the CUDA backend's im2col path (the path taken
//! without cuDNN, or with `crate::cudnn::set_enabled(false)`): cuDNN's
//! workspaces depend on the algorithm the library picks on the GPU at run
//! time and are not modelled. While cuDNN is switched on, each such call is
//! counted in the plan's assumptions ([`assume_im2col`]), so the plan says
//! so instead of guessing silently.

use super::{meta_state, planned, reduced_dtype};
use crate::backend::args::{batch_norm_row_pieces, blas_operand, column_chunks, reduce_layout, ReduceLayout};
use crate::backend::im2col::ColumnKernels;
use crate::backend::{out_dims, ConvPlan, MatmulOperands, PoolPlan, ReduceOp};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::Shape;
use crate::tensor::Tensor;

/// `values` as the `&[isize]` that `reshape` takes.
fn dims(values: &[usize]) -> Vec<isize> {
    values.iter().map(|&v| v as isize).collect()
}

/// As `cuda::reduce::reduce`: the output first (of the output's shape, no
/// expanding copy), then the source's contiguous copy when its reduced dims
/// cannot be walked in place, then the partial sums of a split reduction;
/// the partial sums are freed first, then the copy.
pub(super) fn reduce(op: ReduceOp, name: &'static str, x: &Tensor, mask: &[bool], keepdim: bool) -> Result<Tensor> {
    let out_shape = Shape::from(out_dims(x.dims(), mask, keepdim));
    let out_dtype = reduced_dtype(op, x.dtype());
    let out = planned(name, x.device(), out_dtype, out_shape.clone())?;
    let len: usize = x.dims().iter().zip(mask).filter(|(_, &m)| m).map(|(&d, _)| d).product();
    // No outputs, or runs of nothing (filled with the op's empty value):
    // no source walked.
    if out_shape.numel() == 0 || len == 0 {
        return Ok(out);
    }
    let (source, [outer, len, inner]) = match reduce_layout(x.dims(), x.is_contiguous(), mask, len) {
        ReduceLayout::View(runs) => (None, runs),
        ReduceLayout::Moved { order, runs } => (Some(x.permute(&order)?.contiguous()?), runs),
    };
    if let Some(chunks) = column_chunks(op, outer, len, inner) {
        let partial = planned(name, x.device(), out_dtype, [outer * chunks * inner])?;
        drop(partial);
    }
    drop(source);
    Ok(out)
}

/// As `cuda::batch_norm`'s reductions after their two `[C]` outputs: the
/// `[2, pieces, C]` partial results of an input seen as `[rows, C, 1]`,
/// freed when the merge is queued.
pub(super) fn batch_norm_partials(op: &'static str, x: &Tensor, dtype: DType) -> Result<()> {
    let d = x.dims();
    if let Some(plan) = batch_norm_row_pieces([d[0], d[1], d[2]]) {
        drop(planned(op, x.device(), dtype, [plan.partial_len(d[1])])?);
    }
    Ok(())
}

/// As `cuda::matmul::matmul`: the output first, then a contiguous copy of
/// each operand cuBLAS cannot read as it lies (neither its rows nor its
/// columns contiguous, or a batch that does not step evenly; the rule is
/// the CUDA backend's own, `args::blas_operand`), both held until the
/// product is done and freed the second operand's first.
pub(super) fn matmul(operands: MatmulOperands<'_>) -> Result<Tensor> {
    let MatmulOperands { a, b, batch, m, n, k } = operands;
    let mut dims = batch.to_vec();
    dims.extend([m, n]);
    let out = planned("matmul", a.device(), a.dtype(), dims)?;
    if out.numel() == 0 {
        return Ok(out);
    }
    let copied = |t: &Tensor, rows: usize, cols: usize| -> Result<Option<Tensor>> {
        Ok(if blas_operand(t, rows, cols).is_none() { Some(t.contiguous()?) } else { None })
    };
    // Held to the end and dropped in reverse order, `_pb` then `_pa`, as
    // the CUDA backend's `prepare`d operands are.
    let (_pa, _pb) = (copied(a, m, k)?, copied(b, k, n)?);
    Ok(out)
}

/// What a CUDA-target plan assumes of a convolution while cuDNN is on.
const IM2COL_ASSUMPTION: &str = "planned on the im2col path; on a GPU with cuDNN the convolution runs on \
     cuDNN instead, whose workspace depends on the algorithm it picks there (cudnn::set_enabled(false) makes the run \
     take the planned path)";

/// Counts, on `device`'s plan, a convolution call planned on im2col where
/// the run would use cuDNN if the GPU has it (`crate::cudnn::enabled()`).
pub(super) fn assume_im2col(op: &'static str, device: Device) -> Result<()> {
    if crate::cudnn::enabled() {
        meta_state(device)?.assume(op, IM2COL_ASSUMPTION);
    }
    Ok(())
}

/// The CUDA backend's im2col kernels as a meta device runs them: their
/// outputs allocated, nothing computed. With `backend::im2col`'s
/// composition over them, a CUDA-target meta device allocates what
/// `cuda::conv` allocates without cuDNN.
pub(super) struct PlannedColumns;

impl ColumnKernels for PlannedColumns {
    /// As `cuda::conv::im2col`: the columns `[N, K, P]` of one group.
    fn im2col(&self, op: &'static str, input: &Tensor, _group: usize, plan: &ConvPlan) -> Result<Tensor> {
        let (k, p) = (plan.geometry.col_rows(), plan.geometry.col_cols());
        planned(op, input.device(), input.dtype(), [plan.batch, k, p])
    }

    /// As `cuda::conv::col2im`: the image `[N, C_in/g, H, W]`.
    fn col2im(&self, op: &'static str, col: &Tensor, plan: &ConvPlan) -> Result<Tensor> {
        let (h, w) = plan.geometry.input();
        planned(op, col.device(), col.dtype(), [plan.batch, plan.geometry.channels(), h, w])
    }
}

/// As `cuda::pool::max_pool2d`: values and positions, read through any strides.
pub(super) fn max_pool2d(input: &Tensor, plan: &PoolPlan) -> Result<(Tensor, Tensor)> {
    const OP: &str = "max_pool2d";
    let shape = plan.output_shape();
    let values = planned(OP, input.device(), input.dtype(), shape.clone())?;
    let indices = planned(OP, input.device(), DType::I64, shape)?;
    Ok((values, indices))
}

/// As `cuda::pool::max_pool2d_backward`: zeros of the input's planes and a
/// `scatter_add_` into them (with its device bounds check and bad-index flag).
pub(super) fn max_pool2d_backward(grad: &Tensor, indices: &Tensor, input_shape: &Shape) -> Result<Tensor> {
    let rank = input_shape.rank();
    let shape_dims = input_shape.dims();
    let plane_in = shape_dims[rank - 2] * shape_dims[rank - 1];
    let planes: usize = shape_dims[..rank - 2].iter().product();
    let plane_out = grad.dims()[rank - 2] * grad.dims()[rank - 1];
    let as2 = |t: &Tensor, per_plane: usize| t.reshape(&[planes as isize, per_plane as isize]);
    let grad_in = Tensor::zeros_on([planes, plane_in], grad.dtype(), grad.device())?;
    grad_in.scatter_add_(1, &as2(indices, plane_out)?, &as2(grad, plane_out)?)?;
    grad_in.reshape(&dims(shape_dims))
}

/// As `cuda::pool::avg_pool2d`: the output in the input's dtype (half
/// precision included), read through any strides.
pub(super) fn avg_pool2d(input: &Tensor, plan: &PoolPlan) -> Result<Tensor> {
    planned("avg_pool2d", input.device(), input.dtype(), plan.output_shape())
}

/// As `cuda::pool::avg_pool2d_backward`: a dense gradient, then the output
/// in its dtype.
pub(super) fn avg_pool2d_backward(grad: &Tensor, plan: &PoolPlan) -> Result<Tensor> {
    const OP: &str = "avg_pool2d_backward";
    let grad = grad.contiguous()?;
    planned(OP, grad.device(), grad.dtype(), plan.input_shape())
}

/// As `cuda::random::random`: drawn straight into the requested dtype.
pub(super) fn random(op: &'static str, shape: &Shape, dtype: DType, device: Device) -> Result<Tensor> {
    planned(op, device, dtype, shape.clone())
}

/// The 0-d `i64` flag `cuda::index` allocates for a kernel to report a bad
/// index through, alive while the kernel is queued (freed on return).
pub(super) fn bad_index_flag(op: &'static str, device: Device) -> Result<()> {
    drop(planned(op, device, DType::I64, Shape::scalar())?);
    Ok(())
}

/// As `cuda::elementwise::fill`: a view that stays strided once its
/// broadcast dims are dropped is filled by copying a 0-d tensor of the
/// value into it.
pub(super) fn fill(name: &'static str, dst: &Tensor) -> Result<()> {
    let view = dst.with_layout(dst.layout().without_broadcast_dims());
    if view.numel() > 0 && !view.is_contiguous() {
        drop(planned(name, dst.device(), dst.dtype(), Shape::scalar())?);
    }
    Ok(())
}
