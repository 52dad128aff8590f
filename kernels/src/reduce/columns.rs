//! Column reductions: rows of a strided matrix combined element-wise into
//! one output row. Row `r` is `src[base + row_offsets[r] ..][..width]`, so the
//! rows may lie anywhere (an outer dimension of a tensor, or several outer
//! dimensions flattened into a list of offsets), while each row itself is
//! contiguous and the loops over it vectorise.

use super::replaces;
use crate::error::{KernelError, Result};
use crate::scalar::{Accumulator, Float, ReduceElement, BLOCK};
use crate::scratch::{try_vec, try_with_capacity};

/// Groups of at most this many rows are summed sequentially; larger groups
/// are split in two and summed pairwise, so the error of a column sum grows
/// like `log2(rows)`.
pub const COLUMN_MIN_ROWS_PAIRWISE: usize = 8;

/// Errors unless every row `base + offset .. + width` lies inside `src_len`.
fn check_rows(src_len: usize, base: usize, row_offsets: &[usize], width: usize) -> Result<()> {
    if width == 0 {
        return Ok(());
    }
    let furthest = row_offsets.iter().copied().max().unwrap_or(0);
    let end = base
        .checked_add(furthest)
        .and_then(|s| s.checked_add(width))
        .ok_or(KernelError::Overflow { operand: "src" })?;
    if !row_offsets.is_empty() && end > src_len {
        return Err(KernelError::OutOfBounds { operand: "src", required: end, len: src_len });
    }
    Ok(())
}

/// Row `r`; in bounds once [`check_rows`] passed.
#[inline(always)]
fn row<T>(src: &[T], base: usize, offset: usize, width: usize) -> &[T] {
    let start = base + offset;
    &src[start..start + width]
}

/// Adds one row into `acc` a block at a time: `add_block(acc_block,
/// widened_row_block, first_column)` does the element-wise work on plain
/// accumulator slices, which vectorises.
#[inline(always)]
fn add_row<T: ReduceElement>(
    acc: &mut [T::Acc],
    row: &[T],
    buf: &mut [T::Acc; BLOCK],
    add_block: &impl Fn(&mut [T::Acc], &[T::Acc], usize),
) {
    for (b, (acc, block)) in acc.chunks_mut(BLOCK).zip(row.chunks(BLOCK)).enumerate() {
        add_block(acc, T::widen(block, buf), b * BLOCK);
    }
}

/// Pairwise sum over rows (each added by `add_block`) into `out`; `scratch`
/// holds one row per level of the recursion below this one.
fn pairwise_columns<T: ReduceElement>(
    src: &[T],
    base: usize,
    row_offsets: &[usize],
    out: &mut [T::Acc],
    scratch: &mut [T::Acc],
    buf: &mut [T::Acc; BLOCK],
    add_block: &impl Fn(&mut [T::Acc], &[T::Acc], usize),
) {
    let width = out.len();
    if row_offsets.len() <= COLUMN_MIN_ROWS_PAIRWISE || scratch.len() < width {
        out.fill(T::Acc::ZERO);
        for &offset in row_offsets {
            add_row(out, row(src, base, offset, width), buf, add_block);
        }
        return;
    }
    let (left, right) = row_offsets.split_at(row_offsets.len() / 2);
    pairwise_columns(src, base, left, out, scratch, buf, add_block);
    let (partial, rest) = scratch.split_at_mut(width);
    pairwise_columns(src, base, right, partial, rest, buf, add_block);
    for (o, &p) in out.iter_mut().zip(partial.iter()) {
        *o = o.add(p);
    }
}

/// Scratch rows the pairwise recursion needs for `rows` rows.
fn pairwise_depth(rows: usize) -> usize {
    let mut depth = 0;
    let mut n = rows;
    while n > COLUMN_MIN_ROWS_PAIRWISE {
        n = n.div_ceil(2);
        depth += 1;
    }
    depth
}

fn sum_columns_by<T: ReduceElement>(
    src: &[T],
    base: usize,
    row_offsets: &[usize],
    out: &mut [T::Acc],
    add_block: impl Fn(&mut [T::Acc], &[T::Acc], usize) + Sync,
) -> Result<()> {
    check_rows(src.len(), base, row_offsets, out.len())?;
    if row_offsets.len().saturating_mul(out.len()) >= PARALLEL_MIN {
        return parallel_pairwise_columns(src, base, row_offsets, out, &add_block);
    }
    sequential_pairwise_columns(src, base, row_offsets, out, &add_block)
}

/// [`pairwise_columns`] with its own scratch.
fn sequential_pairwise_columns<T: ReduceElement>(
    src: &[T],
    base: usize,
    row_offsets: &[usize],
    out: &mut [T::Acc],
    add_block: &impl Fn(&mut [T::Acc], &[T::Acc], usize),
) -> Result<()> {
    // At most ~64 rows of `out`'s width; `out` is the caller's, so this can
    // be more than memory holds: an error, not an abort.
    // (A product past usize saturates, which `try_vec` refuses.)
    let len = out.len().saturating_mul(pairwise_depth(row_offsets.len()));
    let mut scratch = try_vec(len, T::Acc::ZERO)?;
    let mut buf = [T::Acc::ZERO; BLOCK];
    pairwise_columns(src, base, row_offsets, out, &mut scratch, &mut buf, add_block);
    Ok(())
}

/// Rows x columns at least this large are summed by several threads, the
/// top levels of the pairwise tree run side by side; parts below
/// [`PARALLEL_LEAF`] elements go sequentially. The tree is the same as on
/// one thread, so are the sums, bit for bit. A bias gradient of a
/// 2048 x 1024 activation (one block of columns, so one task before) took
/// as long on 16 Xeon cores as on 2.
const PARALLEL_MIN: usize = super::PARALLEL_MIN;

/// See [`PARALLEL_MIN`].
const PARALLEL_LEAF: usize = 1 << 16;

/// [`pairwise_columns`] splitting rows in two exactly as it does, each half
/// on its own thread while the halves are large.
fn parallel_pairwise_columns<T: ReduceElement>(
    src: &[T],
    base: usize,
    row_offsets: &[usize],
    out: &mut [T::Acc],
    add_block: &(impl Fn(&mut [T::Acc], &[T::Acc], usize) + Sync),
) -> Result<()> {
    let width = out.len();
    if row_offsets.len() <= COLUMN_MIN_ROWS_PAIRWISE || row_offsets.len().saturating_mul(width) < 2 * PARALLEL_LEAF {
        return sequential_pairwise_columns(src, base, row_offsets, out, add_block);
    }
    let (left, right) = row_offsets.split_at(row_offsets.len() / 2);
    let (done, partial) = rayon::join(
        || parallel_pairwise_columns(src, base, left, out, add_block),
        || -> Result<Vec<T::Acc>> {
            let mut partial = try_vec(width, T::Acc::ZERO)?;
            parallel_pairwise_columns(src, base, right, &mut partial, add_block)?;
            Ok(partial)
        },
    );
    done?;
    for (o, &p) in out.iter_mut().zip(partial?.iter()) {
        *o = o.add(p);
    }
    Ok(())
}

/// `out[k] = Σ_r src[base + row_offsets[r] + k]` for `k < out.len()`, in the
/// accumulator type, pairwise over rows. No rows gives zeros. Errors when a
/// row reaches past `src`.
pub fn sum_columns<T: ReduceElement>(src: &[T], base: usize, row_offsets: &[usize], out: &mut [T::Acc]) -> Result<()> {
    sum_columns_by(src, base, row_offsets, out, |acc, row, _| {
        for (a, &v) in acc.iter_mut().zip(row) {
            *a = a.add(v);
        }
    })
}

/// `out[k] = Σ_r (src[base + row_offsets[r] + k] - mean[k])^2`: the second
/// pass of a column variance. Errors when a row reaches past `src` or `mean`
/// is not as long as `out`.
pub fn sq_dev_columns<T: ReduceElement>(
    src: &[T],
    base: usize,
    row_offsets: &[usize],
    mean: &[T::Acc],
    out: &mut [T::Acc],
) -> Result<()>
where
    T::Acc: Float,
{
    if mean.len() != out.len() {
        return Err(KernelError::ShapeMismatch {
            detail: format!("mean has {} columns but out has {}", mean.len(), out.len()),
        });
    }
    sum_columns_by(src, base, row_offsets, out, |acc, row, at| {
        let mean = mean.get(at..at + acc.len()).unwrap_or(&[]);
        for ((a, &v), &m) in acc.iter_mut().zip(row).zip(mean) {
            let d = v - m;
            *a = a.add(d * d);
        }
    })
}

/// Element-wise max (`MAX`) or min over the rows, in the accumulator type.
fn extreme_columns<T: ReduceElement, const MAX: bool>(
    src: &[T],
    base: usize,
    row_offsets: &[usize],
    width: usize,
) -> Result<Vec<T::Acc>> {
    check_rows(src.len(), base, row_offsets, width)?;
    let Some((&first, rest)) = row_offsets.split_first() else {
        return Err(KernelError::ShapeMismatch { detail: "the max or min of zero rows is undefined".into() });
    };
    let mut best: Vec<T::Acc> = try_with_capacity(width)?;
    best.extend(row(src, base, first, width).iter().map(|&v| v.to_acc()));
    let mut buf = [T::Acc::ZERO; BLOCK];
    for &offset in rest {
        for (best, block) in best.chunks_mut(BLOCK).zip(row(src, base, offset, width).chunks(BLOCK)) {
            for (b, &v) in best.iter_mut().zip(T::widen(block, &mut buf)) {
                *b = if replaces::<_, MAX>(v, *b) { v } else { *b };
            }
        }
    }
    Ok(best)
}

/// `out[k] = max_r src[base + row_offsets[r] + k]` (NaN if any is NaN).
/// Errors when there are no rows or a row reaches past `src`.
pub fn max_columns<T: ReduceElement>(src: &[T], base: usize, row_offsets: &[usize], out: &mut [T]) -> Result<()> {
    let best = extreme_columns::<T, true>(src, base, row_offsets, out.len())?;
    for (o, b) in out.iter_mut().zip(best) {
        *o = T::from_acc(b);
    }
    Ok(())
}

/// `out[k] = min_r src[base + row_offsets[r] + k]` (NaN if any is NaN).
/// Errors when there are no rows or a row reaches past `src`.
pub fn min_columns<T: ReduceElement>(src: &[T], base: usize, row_offsets: &[usize], out: &mut [T]) -> Result<()> {
    let best = extreme_columns::<T, false>(src, base, row_offsets, out.len())?;
    for (o, b) in out.iter_mut().zip(best) {
        *o = T::from_acc(b);
    }
    Ok(())
}

/// The row index of each column's max (`MAX`) or min: the first on ties, the
/// first NaN if any.
fn arg_extreme_columns<T: ReduceElement, const MAX: bool>(
    src: &[T],
    base: usize,
    row_offsets: &[usize],
    out: &mut [i64],
) -> Result<()> {
    let width = out.len();
    check_rows(src.len(), base, row_offsets, width)?;
    let Some((&first, rest)) = row_offsets.split_first() else {
        return Err(KernelError::ShapeMismatch { detail: "the argmax or argmin of zero rows is undefined".into() });
    };
    let mut best: Vec<T::Acc> = try_with_capacity(width)?;
    best.extend(row(src, base, first, width).iter().map(|&v| v.to_acc()));
    out.fill(0);
    let mut buf = [T::Acc::ZERO; BLOCK];
    for (r, &offset) in rest.iter().enumerate() {
        let r = (r + 1) as i64;
        for ((best, index), block) in
            best.chunks_mut(BLOCK).zip(out.chunks_mut(BLOCK)).zip(row(src, base, offset, width).chunks(BLOCK))
        {
            for ((b, i), &v) in best.iter_mut().zip(index.iter_mut()).zip(T::widen(block, &mut buf)) {
                // Once a column holds a NaN it keeps its first one.
                let take = replaces::<_, MAX>(v, *b) && !b.is_nan();
                *b = if take { v } else { *b };
                *i = if take { r } else { *i };
            }
        }
    }
    Ok(())
}

/// `out[k]` = the row index `r` of `max_r src[base + row_offsets[r] + k]`:
/// the first on ties, the first NaN if any. Errors when there are no rows or
/// a row reaches past `src`.
pub fn argmax_columns<T: ReduceElement>(src: &[T], base: usize, row_offsets: &[usize], out: &mut [i64]) -> Result<()> {
    arg_extreme_columns::<T, true>(src, base, row_offsets, out)
}

/// Like [`argmax_columns`] for the min.
pub fn argmin_columns<T: ReduceElement>(src: &[T], base: usize, row_offsets: &[usize], out: &mut [i64]) -> Result<()> {
    arg_extreme_columns::<T, false>(src, base, row_offsets, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_data::xorshift;
    use half::bf16;

    /// Rows x columns past the threshold take the threaded pairwise tree,
    /// which is the sequential one: the same sums bit for bit (f32 and
    /// bf16 inputs, a width that is not a multiple of the block, strided
    /// rows, an odd row count), also for the squared deviations.
    #[test]
    fn threaded_column_sums_equal_the_sequential_tree_bit_for_bit() -> Result<()> {
        let (rows, width, stride) = (1999, 700, 713);
        assert!(rows * width >= PARALLEL_MIN);
        let values: Vec<f32> = xorshift(7).take(rows * stride).map(|r| (r % 20_011) as f32 * 1.37e-3 - 13.0).collect();
        let halves: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
        let offsets: Vec<usize> = (0..rows).map(|r| r * stride).collect();
        let add = |acc: &mut [f32], row: &[f32], _: usize| {
            for (a, &v) in acc.iter_mut().zip(row) {
                *a += v;
            }
        };
        let (mut threaded, mut sequential) = (vec![0f32; width], vec![0f32; width]);
        sum_columns(&values, 5, &offsets, &mut threaded)?;
        sequential_pairwise_columns(&values, 5, &offsets, &mut sequential, &add)?;
        assert_eq!(threaded, sequential);
        sum_columns(&halves, 5, &offsets, &mut threaded)?;
        sequential_pairwise_columns(&halves, 5, &offsets, &mut sequential, &add)?;
        assert_eq!(threaded, sequential);
        let mean: Vec<f32> = sequential.iter().map(|s| s / rows as f32).collect();
        let square = |acc: &mut [f32], row: &[f32], at: usize| {
            for ((a, &v), &m) in acc.iter_mut().zip(row).zip(&mean[at..]) {
                *a += (v - m) * (v - m);
            }
        };
        sq_dev_columns(&values, 5, &offsets, &mean, &mut threaded)?;
        sequential_pairwise_columns(&values, 5, &offsets, &mut sequential, &square)?;
        assert_eq!(threaded, sequential);
        Ok(())
    }
}
