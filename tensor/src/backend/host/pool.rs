//! The host's pooling: the `H x W` planes split over rayon's threads and
//! pooled by the loops of `brasa_kernels::pool`, read in place whatever their
//! strides; f16 and bf16 average pooling in f32.

use super::strided::offsets_vec;
use crate::backend::host::dense_elements;
use crate::backend::output;
use crate::backend::PoolPlan;
use crate::dispatch::dispatch_dtype;
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::shape::Shape;
use crate::storage::{lock_storages, UninitTensor};
use crate::tensor::Tensor;
use brasa_kernels::elementwise::FloatElement;
use brasa_kernels::pool::{
    avg_pool2d_backward_plane, avg_pool2d_plane, max_pool2d_backward_plane, max_pool2d_plane, AvgPoolElement,
};
use brasa_kernels::KernelError;
use rayon::prelude::*;

/// Work (in window elements) below which a thread gets more than one plane.
const PLANES_TASK_WORK: usize = 1 << 14;

/// Planes per parallel task: enough to pay for the task.
fn planes_per_task(per_plane: usize) -> usize {
    (PLANES_TASK_WORK / per_plane.max(1)).max(1)
}

/// Storage offset of every plane of `layout`, and the plane strides.
fn plane_offsets(plan: &PoolPlan, op: &'static str, layout: &Layout) -> Result<(Vec<usize>, [usize; 2])> {
    let rank = layout.rank();
    let strides = layout.strides();
    let lead = Layout::new(plan.lead.clone(), strides[..rank - 2].to_vec(), layout.offset())?;
    // Non-negative: the callers copy tensors with negative strides.
    Ok((offsets_vec(op, &lead)?, [strides[rank - 2] as usize, strides[rank - 1] as usize]))
}

/// `t` itself when all strides are non-negative, else a contiguous copy.
pub(in crate::backend) fn non_negative(t: &Tensor) -> Result<Tensor> {
    if t.strides().iter().all(|&s| s >= 0) {
        Ok(t.clone())
    } else {
        t.contiguous()
    }
}

fn pool_error(op: &'static str) -> impl Fn(KernelError) -> TensorError {
    move |source| TensorError::kernel(op, source)
}

/// See [`crate::backend::DeviceOps::max_pool2d`].
pub(super) fn max_pool2d(input: &Tensor, plan: &PoolPlan) -> Result<(Tensor, Tensor)> {
    const OP: &str = "max_pool2d";
    let input = non_negative(input)?;
    let shape = plan.output_shape();
    let values = output(input.device(), input.dtype(), &shape)?;
    let indices = output(input.device(), DType::I64, &shape)?;
    let (offsets, strides) = plane_offsets(plan, OP, input.layout())?;
    let geometry = plan.geometry;
    let olen = geometry.output_len();
    let per_task = planes_per_task(olen.saturating_mul(plan.window));
    dispatch_dtype!(input.dtype(), T => {
        let x = input.storage().read::<T>(OP)?;
        // SAFETY: every plane of both outputs (one per offset) is set by
        // `max_pool2d_plane`, which reads neither.
        unsafe {
            UninitTensor::init_pair_with::<T, i64>(values, indices, OP, |out, idx| {
                out.par_chunks_mut(olen)
                    .zip(idx.par_chunks_mut(olen))
                    .zip(offsets.par_iter())
                    .with_min_len(per_task)
                    .try_for_each(|((o, i), &offset)| max_pool2d_plane(&geometry, &x, offset, strides, o, i))
                    .map_err(pool_error(OP))
            })
        }
    })
}

/// See [`crate::backend::DeviceOps::max_pool2d_backward`].
pub(super) fn max_pool2d_backward(grad: &Tensor, indices: &Tensor, input_shape: &Shape) -> Result<Tensor> {
    const OP: &str = "max_pool2d_backward";
    let input = input_shape.dims();
    let olen = grad.dims()[grad.rank() - 2] * grad.dims()[grad.rank() - 1];
    let ilen = input[input.len() - 2] * input[input.len() - 1];
    let result = output(grad.device(), grad.dtype(), input_shape)?;
    let planes = (grad, indices, olen, ilen);
    match grad.dtype() {
        DType::F32 => max_backward::<f32>(planes, result),
        DType::F64 => max_backward::<f64>(planes, result),
        DType::F16 => max_backward::<half::f16>(planes, result),
        DType::BF16 => max_backward::<half::bf16>(planes, result),
        other => Err(TensorError::invalid(OP, format!("needs a floating-point tensor, got {other}"))),
    }
}

/// See [`crate::backend::DeviceOps::avg_pool2d`].
pub(super) fn avg_pool2d(input: &Tensor, plan: &PoolPlan, count_include_pad: bool) -> Result<Tensor> {
    match input.dtype() {
        DType::F64 => avg_forward::<f64>(input, plan, count_include_pad),
        DType::F32 => avg_forward::<f32>(input, plan, count_include_pad),
        other => avg_forward::<f32>(&input.to_dtype(DType::F32)?, plan, count_include_pad)?.to_dtype(other),
    }
}

/// See [`crate::backend::DeviceOps::avg_pool2d_backward`].
pub(super) fn avg_pool2d_backward(grad: &Tensor, plan: &PoolPlan, count_include_pad: bool) -> Result<Tensor> {
    match grad.dtype() {
        DType::F64 => avg_backward::<f64>(grad, plan, count_include_pad),
        DType::F32 => avg_backward::<f32>(grad, plan, count_include_pad),
        other => avg_backward::<f32>(&grad.to_dtype(DType::F32)?, plan, count_include_pad)?.to_dtype(other),
    }
}

/// Scatters `grad` (contiguous, planes of `olen`) to the positions `indices`
/// name in the `ilen`-element planes of `out`.
fn max_backward<T: WithDType + FloatElement + Default>(
    (grad, indices, olen, ilen): (&Tensor, &Tensor, usize, usize),
    out: UninitTensor,
) -> Result<Tensor> {
    const OP: &str = "max_pool2d_backward";
    let per_task = (PLANES_TASK_WORK / (olen + ilen).max(1)).max(1);
    let locks = lock_storages(&[grad.storage(), indices.storage()], &[]);
    let (g, idx) = (locks.read::<T>(grad.storage(), OP)?, locks.read::<i64>(indices.storage(), OP)?);
    let g = dense_elements(OP, g, grad)?;
    let idx = dense_elements(OP, idx, indices)?;
    // SAFETY: the output is filled with zeros, or every plane of it (one
    // per gradient plane) is set by `max_pool2d_backward_plane`, which
    // zeroes it before adding; nothing is read first.
    unsafe {
        out.init_with::<T>(OP, |out| {
            if olen == 0 {
                out.fill(T::ZERO);
                return Ok(());
            }
            out.par_chunks_mut(ilen)
                .zip(g.par_chunks(olen).zip(idx.par_chunks(olen)))
                .with_min_len(per_task)
                .try_for_each(|(o, (g, i))| max_pool2d_backward_plane(g, i, o))
                .map_err(pool_error(OP))
        })
    }
}

fn avg_forward<T: AvgPoolElement + WithDType>(
    input: &Tensor,
    plan: &PoolPlan,
    count_include_pad: bool,
) -> Result<Tensor> {
    const OP: &str = "avg_pool2d";
    let input = non_negative(input)?;
    let shape = plan.output_shape();
    let result = output(input.device(), input.dtype(), &shape)?;
    let (offsets, strides) = plane_offsets(plan, OP, input.layout())?;
    let geometry = plan.geometry;
    let olen = geometry.output_len();
    let per_task = planes_per_task(olen.saturating_mul(plan.window));
    let x = input.storage().read::<T>(OP)?;
    // SAFETY: every plane of the output (one per offset) is set by
    // `avg_pool2d_plane`, which reads none of it.
    unsafe {
        result.init_with::<T>(OP, |out| {
            out.par_chunks_mut(olen)
                .zip(offsets.par_iter())
                .with_min_len(per_task)
                .try_for_each(|(o, &offset)| avg_pool2d_plane(&geometry, &x, offset, strides, o, count_include_pad))
                .map_err(pool_error(OP))
        })
    }
}

fn avg_backward<T: AvgPoolElement + WithDType>(
    grad: &Tensor,
    plan: &PoolPlan,
    count_include_pad: bool,
) -> Result<Tensor> {
    const OP: &str = "avg_pool2d_backward";
    let grad = grad.contiguous()?;
    let shape = plan.input_shape();
    let result = output(grad.device(), grad.dtype(), &shape)?;
    let geometry = plan.geometry;
    let (olen, ilen) = (geometry.output_len(), geometry.input_len());
    let per_task = planes_per_task(olen.saturating_mul(plan.window));
    let g = grad.storage().read::<T>(OP)?;
    let g = dense_elements(OP, &g, &grad)?;
    // SAFETY: every plane of the output (one per gradient plane) is set by
    // `avg_pool2d_backward_plane`, which zeroes it before adding.
    unsafe {
        result.init_with::<T>(OP, |out| {
            out.par_chunks_mut(ilen)
                .zip(g.par_chunks(olen))
                .with_min_len(per_task)
                .try_for_each(|(o, g)| avg_pool2d_backward_plane(&geometry, g, o, count_include_pad))
                .map_err(pool_error(OP))
        })
    }
}
