//! Reduction loops over slices: sums, extrema and their positions, sums of
//! squared deviations, the same along columns (adding rows into an
//! accumulator row), and softmax rows and columns.
//!
//! Two shapes of work cover every tensor reduction once the tensor layer has
//! arranged the data:
//!
//! - **Rows** ([`sum`], [`max`], [`argmax`], [`sum_sq_dev`], ...): reduce a
//!   contiguous slice to one value. The slice is cut into blocks of
//!   [`BLOCK`] elements, widened to the accumulator type (`f16`/`bf16` to
//!   `f32`, integers and `bool` to `i64`) and folded into 16 independent
//!   lanes, a loop the compiler vectorises.
//! - **Columns** ([`sum_columns`], [`max_columns`], ...): reduce rows of a
//!   strided matrix element-wise, `out[k] = Σ_r src[base + row_offsets[r] + k]`,
//!   which is how an outer dimension of a contiguous tensor is reduced
//!   without transposing it.
//!
//! # Accuracy of float sums
//! Sums are pairwise over blocks: each block of 256 is summed in 16 lanes
//! (16 sequential additions each), and block sums are combined as a balanced
//! binary tree. The rounding error grows like `log2(n)` rather than `n`:
//! summing 10^7 copies of `0.1f32` gives 999 999.9 (relative error ~1e-7),
//! where a sequential loop gives 1 087 937 (9 %). Column sums are pairwise
//! over rows in the same way. PyTorch's CPU sum uses a similar cascade.
//!
//! # Threads
//! A row of at least [`PARALLEL_MIN`] elements is split into chunks of
//! [`PARALLEL_CHUNK`] elements over rayon's threads. The chunking depends only
//! on the length, so results do not depend on the number of threads.
//!
//! NaN propagates: the max, min or sum of a row holding a NaN is NaN, and
//! [`argmax`]/[`argmin`] return the position of the first NaN (PyTorch's rule).

mod columns;
mod softmax;

pub use crate::math::{exp_f32, exp_shifted_f32};
/// The floating-point accumulators (`f32`, `f64`): [`Float`],
/// under the name the reductions have used.
pub use crate::scalar::Float as FloatAccumulator;
pub use crate::scalar::{Accumulator, ReduceElement, BLOCK};
pub use columns::{
    argmax_columns, argmin_columns, max_columns, min_columns, sq_dev_columns, sum_columns, COLUMN_MIN_ROWS_PAIRWISE,
};
pub use softmax::{log_softmax_columns, log_softmax_row, softmax_columns, softmax_row};

use crate::scalar::Float;
use rayon::prelude::*;

/// Elements per task when one long row is split over threads; a multiple of
/// [`BLOCK`].
pub const PARALLEL_CHUNK: usize = 1 << 16;

/// Rows at least this long are reduced on several threads. Measured with
/// `sum` of one `f32` row on one thread and on two (2-core Zen 5): two
/// threads lose up to 2^17 elements (~10 µs on one core, about the cost of
/// a fork-join), and win from 2^19 (1.15x, rising with the length).
pub const PARALLEL_MIN: usize = 1 << 18;

/// Independent accumulators per block: enough vector registers in flight to
/// hide the add latency.
const LANES: usize = 16;

/// Folds 16 lanes into one as a balanced tree.
#[inline(always)]
fn fold_lanes<A: Copy>(mut lanes: [A; LANES], combine: impl Fn(A, A) -> A) -> A {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            lanes[i] = combine(lanes[i], lanes[i + width]);
        }
    }
    lanes[0]
}

/// `Σ f(x[i])` in 16 lanes.
#[inline(always)]
pub(crate) fn lane_sum_by<A: Accumulator>(x: &[A], f: impl Fn(A) -> A) -> A {
    let mut lanes = [A::ZERO; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane = lane.add(f(v));
        }
    }
    let mut total = fold_lanes(lanes, A::add);
    for &v in chunks.remainder() {
        total = total.add(f(v));
    }
    total
}

/// Pairwise sum of `block_sum` over the blocks of `x`.
fn pairwise<T: ReduceElement>(x: &[T], buf: &mut [T::Acc; BLOCK], block_sum: &impl Fn(&[T::Acc]) -> T::Acc) -> T::Acc {
    if x.len() <= BLOCK {
        return block_sum(T::widen(x, buf));
    }
    let blocks = x.len().div_ceil(BLOCK);
    let (left, right) = x.split_at(blocks / 2 * BLOCK);
    let left = pairwise(left, buf, block_sum);
    left.add(pairwise(right, buf, block_sum))
}

/// Pairwise sum of accumulator values (per-chunk partial sums).
fn pairwise_acc<A: Accumulator>(values: &[A]) -> A {
    if values.len() <= 8 {
        return values.iter().fold(A::ZERO, |acc, &v| acc.add(v));
    }
    let (left, right) = values.split_at(values.len() / 2);
    pairwise_acc(left).add(pairwise_acc(right))
}

/// Pairwise sum of `block_sum` over `x`, on several threads for long rows.
fn blocked_sum<T: ReduceElement>(x: &[T], block_sum: impl Fn(&[T::Acc]) -> T::Acc + Sync) -> T::Acc {
    if x.len() < PARALLEL_MIN {
        let mut buf = [T::Acc::ZERO; BLOCK];
        return pairwise(x, &mut buf, &block_sum);
    }
    let partials: Vec<T::Acc> = x
        .par_chunks(PARALLEL_CHUNK)
        .map(|chunk| {
            let mut buf = [T::Acc::ZERO; BLOCK];
            pairwise(chunk, &mut buf, &block_sum)
        })
        .collect();
    pairwise_acc(&partials)
}

/// The sum of `x` in its accumulator type (0 for an empty slice). Integer
/// sums wrap on overflow.
pub fn sum<T: ReduceElement>(x: &[T]) -> T::Acc {
    blocked_sum(x, |block| lane_sum_by(block, |v| v))
}

/// `Σ (x[i] - mean)^2` in the accumulator type: the numerator of a variance
/// computed in two passes (first the mean, then this), which stays accurate
/// when the mean is large compared with the spread.
pub fn sum_sq_dev<T: ReduceElement>(x: &[T], mean: T::Acc) -> T::Acc
where
    T::Acc: Float,
{
    blocked_sum(x, |block| {
        lane_sum_by(block, |v| {
            let d = v - mean;
            d * d
        })
    })
}

/// Whether `candidate` replaces `best` in a running max (`MAX`) or min:
/// it is larger (smaller), or a NaN, which then sticks because nothing
/// compares greater than a NaN.
#[inline(always)]
pub(crate) fn replaces<A: Accumulator, const MAX: bool>(candidate: A, best: A) -> bool {
    (if MAX { candidate > best } else { candidate < best }) || candidate.is_nan()
}

/// The max (`MAX`) or min of a non-empty row starting from `init`, in the
/// accumulator type; NaN if the row holds one.
fn extreme_seq<T: ReduceElement, const MAX: bool>(x: &[T], init: T::Acc) -> T::Acc {
    let mut buf = [T::Acc::ZERO; BLOCK];
    let mut lanes = [init; LANES];
    let mut tail = init;
    for block in x.chunks(BLOCK) {
        let widened = T::widen(block, &mut buf);
        let mut chunks = widened.chunks_exact(LANES);
        for chunk in &mut chunks {
            for (lane, &v) in lanes.iter_mut().zip(chunk) {
                *lane = if replaces::<_, MAX>(v, *lane) { v } else { *lane };
            }
        }
        for &v in chunks.remainder() {
            tail = if replaces::<_, MAX>(v, tail) { v } else { tail };
        }
    }
    let pick = |a, b| if replaces::<_, MAX>(b, a) { b } else { a };
    pick(fold_lanes(lanes, pick), tail)
}

/// Max or min of `x` in the accumulator type, `None` when empty.
fn extreme<T: ReduceElement, const MAX: bool>(x: &[T]) -> Option<T::Acc> {
    let init = x.first()?.to_acc();
    if x.len() < PARALLEL_MIN {
        return Some(extreme_seq::<T, MAX>(x, init));
    }
    let partials: Vec<T::Acc> = x.par_chunks(PARALLEL_CHUNK).map(|chunk| extreme_seq::<T, MAX>(chunk, init)).collect();
    Some(partials.into_iter().fold(init, |a, b| if replaces::<_, MAX>(b, a) { b } else { a }))
}

/// The largest element, `None` for an empty slice; NaN if any element is NaN.
pub fn max<T: ReduceElement>(x: &[T]) -> Option<T> {
    extreme::<T, true>(x).map(T::from_acc)
}

/// The smallest element, `None` for an empty slice; NaN if any element is NaN.
pub fn min<T: ReduceElement>(x: &[T]) -> Option<T> {
    extreme::<T, false>(x).map(T::from_acc)
}

/// The first position where `matches` holds for the widened element.
fn position<T: ReduceElement>(x: &[T], matches: impl Fn(T::Acc) -> bool + Sync) -> Option<usize> {
    let search = |chunk: &[T]| {
        let mut buf = [T::Acc::ZERO; BLOCK];
        chunk
            .chunks(BLOCK)
            .enumerate()
            .find_map(|(i, block)| T::widen(block, &mut buf).iter().position(|&v| matches(v)).map(|p| i * BLOCK + p))
    };
    if x.len() < PARALLEL_MIN {
        return search(x);
    }
    let chunk = x.par_chunks(PARALLEL_CHUNK).position_first(|chunk| search(chunk).is_some())?;
    let start = chunk * PARALLEL_CHUNK;
    search(x.get(start..)?).map(|p| start + p)
}

/// Position of the max (`MAX`) or min: the first NaN if there is one, else
/// the first element equal to the extremum.
fn arg_extreme<T: ReduceElement, const MAX: bool>(x: &[T]) -> Option<usize> {
    let best = extreme::<T, MAX>(x)?;
    if best.is_nan() {
        position(x, |v| v.is_nan())
    } else {
        position(x, |v| v == best)
    }
}

/// Index of the largest element (the first one on ties, the first NaN if
/// any), `None` for an empty slice.
pub fn argmax<T: ReduceElement>(x: &[T]) -> Option<usize> {
    arg_extreme::<T, true>(x)
}

/// Index of the smallest element (the first one on ties, the first NaN if
/// any), `None` for an empty slice.
pub fn argmin<T: ReduceElement>(x: &[T]) -> Option<usize> {
    arg_extreme::<T, false>(x)
}

#[cfg(test)]
mod tests;
