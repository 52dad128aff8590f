//! The host's fused optimizer steps, Adam and SGD: each parameter's storages
//! locked together (the parameter and its state for writing, the gradient
//! for reading), then one pass of `brasa_kernels::optim::adam_step` or
//! `sgd_step` over the elements, in parallel chunks for large parameters
//! and several small parameters at once on the pool's threads.
//! Elements are independent, so the result does not depend on the chunking.

use crate::backend::host::PARALLEL_MIN_WORK;
use crate::backend::AdamUpdate;
use crate::backend::SgdUpdate;
use crate::dispatch::dispatch_float;
use crate::dtype::WithDType;
use crate::error::{Result, TensorError};
use crate::storage::{lock_storages, Storage};
use crate::tensor::Tensor;
use brasa_kernels::elementwise::FloatElement;
use brasa_kernels::optim::{adam_step as adam_kernel, sgd_step as sgd_kernel};
use rayon::prelude::*;

const OP: &str = "fused_adam_";
const SGD_OP: &str = "fused_sgd_";

/// Elements one parallel task updates.
const CHUNK: usize = 1 << 14;

/// Runs `one` on every update: parameters of at least
/// [`PARALLEL_MIN_WORK`] elements one after another (each splits into
/// parallel chunks itself), the smaller ones on the pool's threads, whole
/// parameters each, when together they are that much work. A model of many
/// small matrices (`train_gpt`'s CPU configuration: none above 65,536
/// elements) otherwise stepped on one core. Parameters are independent (a
/// tied one is one update), so the order does not change the result;
/// updates that share a storage take turns on its lock.
fn each_update<U: Sync>(
    updates: &[&U],
    numel: impl Fn(&U) -> usize + Sync,
    one: impl Fn(&U) -> Result<()> + Sync,
) -> Result<()> {
    let (large, small): (Vec<&U>, Vec<&U>) = updates.iter().copied().partition(|u| numel(u) >= PARALLEL_MIN_WORK);
    large.into_iter().try_for_each(&one)?;
    let small_work: usize = small.iter().map(|u| numel(u)).sum();
    if small.len() > 1 && small_work >= PARALLEL_MIN_WORK {
        small.into_par_iter().try_for_each(&one)
    } else {
        small.into_iter().try_for_each(&one)
    }
}

/// See [`crate::backend::DeviceOps::adam_step`].
pub(super) fn adam_step(updates: &[&AdamUpdate<'_>]) -> Result<()> {
    each_update(
        updates,
        |u| u.grad.numel(),
        |update| {
            dispatch_float!(update.param.dtype(), T => step::<T>(update),
            Err(TensorError::invalid(OP, format!("needs float tensors, got {}", update.param.dtype()))))
        },
    )
}

/// `t`'s elements within its storage's slice.
fn window<'a, T>(op: &'static str, data: &'a mut [T], t: &Tensor) -> Result<&'a mut [T]> {
    let (offset, n) = (t.layout().offset(), t.numel());
    let len = data.len();
    data.get_mut(offset..offset + n)
        .ok_or_else(|| TensorError::internal(op, format!("{offset}+{n} is past {len} elements")))
}

/// Locks `written` for writing and `grad` for reading, then runs `update`
/// on the gradient's elements and each written tensor's elements (in the
/// order given).
fn with_update_slices<T: WithDType>(
    op: &'static str,
    grad: &Tensor,
    written: &[&Tensor],
    update: impl FnOnce(&[T], Vec<&mut [T]>) -> Result<()>,
) -> Result<()> {
    let storages: Vec<&Storage> = written.iter().map(|t| &**t.storage()).collect();
    let mut locks = lock_storages(&[grad.storage()], &storages);
    let (slices, reads) = locks.write_many::<T>(&storages, op)?;
    let grad_data = reads.read::<T>(grad.storage(), op)?;
    let offset = grad.layout().offset();
    let grad_elements = grad_data
        .get(offset..offset + grad.numel())
        .ok_or_else(|| TensorError::internal(op, "the gradient is past its storage"))?;
    let mut views = Vec::with_capacity(slices.len());
    for (data, t) in slices.into_iter().zip(written) {
        views.push(window(op, data, t)?);
    }
    update(grad_elements, views)
}

fn step<T: WithDType + FloatElement>(update: &AdamUpdate<'_>) -> Result<()> {
    let written: Vec<&Tensor> = std::iter::once(update.param).chain(update.state.iter().copied()).collect();
    let c = update.coefficients;
    let kernel = |e| TensorError::kernel(OP, e);
    with_update_slices::<T>(OP, &update.grad, &written, |grad, views| {
        let mut views = views.into_iter();
        let (Some(param), Some(exp_avg), Some(exp_avg_sq)) = (views.next(), views.next(), views.next()) else {
            return Err(TensorError::internal(OP, "a parameter without its two moments"));
        };
        let max = views.next();
        if grad.len() < PARALLEL_MIN_WORK {
            return adam_kernel(&c, param, grad, exp_avg, exp_avg_sq, max).map_err(kernel);
        }
        let chunks = param.par_chunks_mut(CHUNK).zip(grad.par_chunks(CHUNK)).zip(exp_avg.par_chunks_mut(CHUNK));
        let chunks = chunks.zip(exp_avg_sq.par_chunks_mut(CHUNK));
        match max {
            Some(max) => chunks
                .zip(max.par_chunks_mut(CHUNK))
                .try_for_each(|((((p, g), m), v), x)| adam_kernel(&c, p, g, m, v, Some(x)).map_err(kernel)),
            None => chunks.try_for_each(|(((p, g), m), v)| adam_kernel(&c, p, g, m, v, None).map_err(kernel)),
        }
    })
}

/// See [`crate::backend::DeviceOps::sgd_step`].
pub(super) fn sgd_step(updates: &[&SgdUpdate<'_>]) -> Result<()> {
    each_update(
        updates,
        |u| u.grad.numel(),
        |update| {
            dispatch_float!(update.param.dtype(), T => sgd::<T>(update),
            Err(TensorError::invalid(SGD_OP, format!("needs float tensors, got {}", update.param.dtype()))))
        },
    )
}

fn sgd<T: WithDType + FloatElement>(update: &SgdUpdate<'_>) -> Result<()> {
    let written: Vec<&Tensor> = std::iter::once(update.param).chain(update.momentum_buffer).collect();
    let c = update.coefficients;
    let kernel = |e| TensorError::kernel(SGD_OP, e);
    with_update_slices::<T>(SGD_OP, &update.grad, &written, |grad, views| {
        let mut views = views.into_iter();
        let Some(param) = views.next() else {
            return Err(TensorError::internal(SGD_OP, "an update without its parameter"));
        };
        let buffer = views.next();
        if grad.len() < PARALLEL_MIN_WORK {
            return sgd_kernel(&c, param, grad, buffer).map_err(kernel);
        }
        let chunks = param.par_chunks_mut(CHUNK).zip(grad.par_chunks(CHUNK));
        match buffer {
            Some(buffer) => chunks
                .zip(buffer.par_chunks_mut(CHUNK))
                .try_for_each(|((p, g), b)| sgd_kernel(&c, p, g, Some(b)).map_err(kernel)),
            None => chunks.try_for_each(|(p, g)| sgd_kernel(&c, p, g, None).map_err(kernel)),
        }
    })
}
