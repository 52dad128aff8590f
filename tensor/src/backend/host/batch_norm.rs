//! The host's batch normalisation passes: each channel's reductions on one
//! rayon task (`brasa_kernels::batch_norm`, run by run in a fixed order, so
//! results do not depend on the number of threads), the elementwise passes
//! split by runs of `S` elements.
//!
//! An input of spatial size 1 (`[rows, C, 1]`: a 2-d input, or a
//! channels-last activation seen as `[N·H·W, C, 1]`) has runs of one
//! element; its passes go row by row across the channels instead
//! (`*_rows`), the reductions over a fixed tree of rows.

use super::norm::elements;
use super::PARALLEL_MIN_WORK;
use crate::backend::BatchNormBackwardElemt;
use crate::dispatch::dispatch_float;
use crate::dtype::WithDType;
use crate::error::{Result, TensorError};
use crate::storage::UninitTensor;
use crate::tensor::Tensor;
use brasa_kernels::batch_norm::{
    add_backward_rows, add_rows, add_sq_dev_rows, backward_elemt_rows, backward_elemt_run, channel_backward_reduce,
    channel_stats, elemt_rows, elemt_run, row_tree_sum, ChannelLayout,
};
use brasa_kernels::scalar::{Float, ReduceElement};
use rayon::prelude::*;

const STATS: &str = "batch_norm_stats";
const ELEMT: &str = "batch_norm_elemt";
const REDUCE: &str = "batch_norm_backward_reduce";
const BACKWARD_ELEMT: &str = "batch_norm_backward_elemt";

/// An element the passes read: f32, f64, f16, bf16, computed in `Acc`.
trait BnElement: ReduceElement<Acc = Self::Compute> + WithDType {
    type Compute: Float + WithDType;
}
impl<T: ReduceElement + WithDType> BnElement for T
where
    T::Acc: Float + WithDType,
{
    type Compute = T::Acc;
}

fn layout_of(x: &Tensor) -> ChannelLayout {
    let d = x.dims();
    ChannelLayout { batch: d[0], channels: d[1], spatial: d[2] }
}

fn kernel_error(op: &'static str) -> impl Fn(brasa_kernels::KernelError) -> TensorError {
    move |e| TensorError::kernel(op, e)
}

/// A `[C]` tensor of the compute dtype from per-channel values.
fn per_channel<A: WithDType>(op: &'static str, like: &Tensor, values: &[A]) -> Result<Tensor> {
    UninitTensor::new([values.len()], A::DTYPE, like.device())?.copy_from_slice(op, values)
}

/// Runs `channel` for every channel, on several threads for large tensors.
fn per_channel_pairs<A: Send>(
    layout: ChannelLayout,
    channel: impl Fn(usize) -> Result<(A, A)> + Sync,
) -> Result<(Vec<A>, Vec<A>)> {
    let pairs: Result<Vec<(A, A)>> = if layout.len() < PARALLEL_MIN_WORK {
        (0..layout.channels).map(channel).collect()
    } else {
        (0..layout.channels).into_par_iter().map(&channel).collect()
    };
    Ok(pairs?.into_iter().unzip())
}

/// Whether the passes go row by row: runs of one element, and something to
/// walk.
fn by_rows(layout: ChannelLayout) -> bool {
    layout.spatial == 1 && layout.channels > 0 && layout.batch > 0
}

/// Writes `out` (`[rows, C]`) in blocks of whole rows:
/// `rows(first_row, out_rows)`, on several threads for large tensors.
fn per_row_block<T: Send>(
    layout: ChannelLayout,
    out: &mut [T],
    rows: impl Fn(usize, &mut [T]) -> Result<()> + Sync,
) -> Result<()> {
    let c = layout.channels;
    let per_task = (1usize << 14).div_ceil(c).max(1) * c;
    if out.len() < PARALLEL_MIN_WORK {
        rows(0, out)
    } else {
        out.par_chunks_mut(per_task).enumerate().try_for_each(|(i, o)| rows(i * per_task / c, o))
    }
}

/// Writes `out` run by run: `run(c, run_index, out_run)` for each of the
/// `N · C` runs of `S` elements.
fn per_run<T: Send>(
    layout: ChannelLayout,
    out: &mut [T],
    run: impl Fn(usize, usize, &mut [T]) -> Result<()> + Sync,
) -> Result<()> {
    let s = layout.spatial;
    if s == 0 || out.is_empty() {
        return Ok(());
    }
    let c = layout.channels;
    if out.len() < PARALLEL_MIN_WORK {
        out.chunks_mut(s).enumerate().try_for_each(|(r, o)| run(r % c, r, o))
    } else {
        let per_task = (1usize << 14).div_ceil(s).max(1);
        out.par_chunks_mut(s).enumerate().with_min_len(per_task).try_for_each(|(r, o)| run(r % c, r, o))
    }
}

/// See [`crate::backend::DeviceOps::batch_norm_stats`].
pub(super) fn batch_norm_stats(x: &Tensor) -> Result<(Tensor, Tensor)> {
    dispatch_float!(x.dtype(), T => stats::<T>(x), Err(TensorError::internal(STATS, format!("float input, got {}", x.dtype()))))
}

fn stats<T: BnElement>(x: &Tensor) -> Result<(Tensor, Tensor)> {
    let layout = layout_of(x);
    let data = x.storage().read::<T>(STATS)?;
    let xs = elements(STATS, x, &data)?;
    if by_rows(layout) {
        // Two passes, as a channel's: the mean, then Σ(x − mean)².
        let (rows, c) = (layout.batch, layout.channels);
        let count = <T::Compute as Float>::from_f64(rows as f64);
        let sums = row_tree_sum(rows, c, &|r, s: &mut [T::Compute]| add_rows(xs, r, s)).map_err(kernel_error(STATS))?;
        let mean: Vec<T::Compute> = sums.into_iter().map(|v| v / count).collect();
        let squares = row_tree_sum(rows, c, &|r, s: &mut [T::Compute]| add_sq_dev_rows(xs, r, &mean, s))
            .map_err(kernel_error(STATS))?;
        let var: Vec<T::Compute> = squares.into_iter().map(|v| v / count).collect();
        return Ok((per_channel(STATS, x, &mean)?, per_channel(STATS, x, &var)?));
    }
    let (mean, var) = per_channel_pairs(layout, |c| channel_stats(xs, layout, c).map_err(kernel_error(STATS)))?;
    Ok((per_channel(STATS, x, &mean)?, per_channel(STATS, x, &var)?))
}

/// See [`crate::backend::DeviceOps::batch_norm_elemt`].
pub(super) fn batch_norm_elemt(x: &Tensor, mean: &Tensor, scale: &Tensor, shift: &Tensor) -> Result<Tensor> {
    dispatch_float!(x.dtype(), T => elemt::<T>(x, mean, scale, shift), Err(TensorError::internal(ELEMT, format!("float input, got {}", x.dtype()))))
}

fn elemt<T: BnElement>(x: &Tensor, mean: &Tensor, scale: &Tensor, shift: &Tensor) -> Result<Tensor> {
    let layout = layout_of(x);
    let s = layout.spatial;
    let (xd, md, sd, hd) = (
        x.storage().read::<T>(ELEMT)?,
        mean.storage().read::<T::Compute>(ELEMT)?,
        scale.storage().read::<T::Compute>(ELEMT)?,
        shift.storage().read::<T::Compute>(ELEMT)?,
    );
    let xs = elements(ELEMT, x, &xd)?;
    let (m, sc, sh) = (elements(ELEMT, mean, &md)?, elements(ELEMT, scale, &sd)?, elements(ELEMT, shift, &hd)?);
    let out = UninitTensor::like(x, x.dtype(), x.device())?;
    if by_rows(layout) {
        let c = layout.channels;
        // SAFETY: the blocks of rows tile the output and each call writes
        // its whole block.
        return unsafe {
            out.init_with::<T>(ELEMT, |out| {
                per_row_block(layout, out, |first, o| {
                    elemt_rows(&xs[first * c..][..o.len()], m, sc, sh, o).map_err(kernel_error(ELEMT))
                })
            })
        };
    }
    // SAFETY: the runs tile the output and each call writes its whole run.
    unsafe {
        out.init_with::<T>(ELEMT, |out| {
            per_run(layout, out, |c, r, o| {
                elemt_run(&xs[r * s..][..s], m[c], sc[c], sh[c], o).map_err(kernel_error(ELEMT))
            })
        })
    }
}

/// See [`crate::backend::DeviceOps::batch_norm_backward_reduce`].
pub(super) fn batch_norm_backward_reduce(dy: &Tensor, x: &Tensor, mean: &Tensor) -> Result<(Tensor, Tensor)> {
    dispatch_float!(x.dtype(), T => backward_reduce::<T>(dy, x, mean), Err(TensorError::internal(REDUCE, format!("float input, got {}", x.dtype()))))
}

fn backward_reduce<T: BnElement>(dy: &Tensor, x: &Tensor, mean: &Tensor) -> Result<(Tensor, Tensor)> {
    let layout = layout_of(x);
    let (gd, xd, md) =
        (dy.storage().read::<T>(REDUCE)?, x.storage().read::<T>(REDUCE)?, mean.storage().read::<T::Compute>(REDUCE)?);
    let (gs, xs, m) = (elements(REDUCE, dy, &gd)?, elements(REDUCE, x, &xd)?, elements(REDUCE, mean, &md)?);
    if by_rows(layout) {
        let c = layout.channels;
        let mut sums = row_tree_sum(layout.batch, 2 * c, &|r, s: &mut [T::Compute]| add_backward_rows(gs, xs, r, m, s))
            .map_err(kernel_error(REDUCE))?;
        let sum_dy_xmu = sums.split_off(c);
        return Ok((per_channel(REDUCE, x, &sums)?, per_channel(REDUCE, x, &sum_dy_xmu)?));
    }
    let (sum_dy, sum_dy_xmu) =
        per_channel_pairs(layout, |c| channel_backward_reduce(gs, xs, layout, c, m[c]).map_err(kernel_error(REDUCE)))?;
    Ok((per_channel(REDUCE, x, &sum_dy)?, per_channel(REDUCE, x, &sum_dy_xmu)?))
}

/// See [`crate::backend::DeviceOps::batch_norm_backward_elemt`].
pub(super) fn batch_norm_backward_elemt(args: BatchNormBackwardElemt<'_>) -> Result<Tensor> {
    let dtype = args.dy.dtype();
    dispatch_float!(dtype, T => backward_elemt::<T>(args), Err(TensorError::internal(BACKWARD_ELEMT, format!("float input, got {dtype}"))))
}

fn backward_elemt<T: BnElement>(args: BatchNormBackwardElemt<'_>) -> Result<Tensor> {
    const OP: &str = BACKWARD_ELEMT;
    let BatchNormBackwardElemt { dy, x, mean, scale, mean_dy, k } = args;
    let layout = layout_of(x);
    let s = layout.spatial;
    let (gd, xd) = (dy.storage().read::<T>(OP)?, x.storage().read::<T>(OP)?);
    let (md, sd, mdd, kd) = (
        mean.storage().read::<T::Compute>(OP)?,
        scale.storage().read::<T::Compute>(OP)?,
        mean_dy.storage().read::<T::Compute>(OP)?,
        k.storage().read::<T::Compute>(OP)?,
    );
    let (gs, xs) = (elements(OP, dy, &gd)?, elements(OP, x, &xd)?);
    let (m, sc) = (elements(OP, mean, &md)?, elements(OP, scale, &sd)?);
    let (mdy, kk) = (elements(OP, mean_dy, &mdd)?, elements(OP, k, &kd)?);
    let out = UninitTensor::like(dy, dy.dtype(), dy.device())?;
    if by_rows(layout) {
        let c = layout.channels;
        // SAFETY: the blocks of rows tile the output and each call writes
        // its whole block.
        return unsafe {
            out.init_with::<T>(OP, |out| {
                per_row_block(layout, out, |first, o| {
                    let (g, v) = (&gs[first * c..][..o.len()], &xs[first * c..][..o.len()]);
                    backward_elemt_rows(g, v, m, sc, mdy, kk, o).map_err(kernel_error(OP))
                })
            })
        };
    }
    // SAFETY: the runs tile the output and each call writes its whole run.
    unsafe {
        out.init_with::<T>(OP, |out| {
            per_run(layout, out, |c, r, o| {
                let (g, v) = (&gs[r * s..][..s], &xs[r * s..][..s]);
                backward_elemt_run(g, v, m[c], sc[c], mdy[c], kk[c], o).map_err(kernel_error(OP))
            })
        })
    }
}
