//! Reductions a device runs, and the shape of their results.

/// A reduction over some dims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReduceOp {
    /// The sum (in the accumulator dtype).
    Sum,
    /// The mean (floats).
    Mean,
    /// The variance `Σ(x − mean)² / max(N − correction, 0)`, or its square
    /// root (floats).
    Var {
        /// Subtracted from the element count (1: Bessel's correction).
        correction: usize,
        /// The standard deviation instead.
        sqrt: bool,
    },
    /// The largest element (NaN wins).
    Max,
    /// The smallest element (NaN wins).
    Min,
    /// The first position of the largest element (or of the first NaN).
    ArgMax,
    /// The first position of the smallest element (or of the first NaN).
    ArgMin,
}

/// The output dims: kept dims, and reduced ones as 1 with `keepdim`.
pub(crate) fn out_dims(dims: &[usize], mask: &[bool], keepdim: bool) -> Vec<usize> {
    dims.iter().zip(mask).filter_map(|(&d, &m)| if m { keepdim.then_some(1) } else { Some(d) }).collect()
}

/// How a device walks a reduction's source as a contiguous
/// `[outer, len, inner]` with the reduced dims (`len` elements) in the
/// middle (see [`reduce_layout`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ReduceLayout {
    /// The source itself is that view: no copy.
    View([usize; 3]),
    /// A contiguous copy of the source permuted by `order` (the kept dims,
    /// then the reduced ones) is `runs` (`[outer, len, 1]`).
    Moved {
        /// The permutation whose contiguous copy is walked.
        order: Vec<usize>,
        /// The copy as `[outer, len, 1]`.
        runs: [usize; 3],
    },
}

/// How a CUDA reduction over `mask` (`len` elements per run, at least one)
/// of a tensor with `dims` walks it: the source itself when it is
/// `contiguous` and its reduced dims that move through memory are
/// neighbours, else a copy with the reduced dims moved last. Shared by the
/// CUDA backend and the meta device imitating it, so that both allocate
/// (or not) the same copy.
pub(crate) fn reduce_layout(dims: &[usize], contiguous: bool, mask: &[bool], len: usize) -> ReduceLayout {
    // The reduced dims that move through memory (size-1 dims do not).
    let spread: Vec<usize> = (0..dims.len()).filter(|&d| mask[d] && dims[d] > 1).collect();
    if contiguous {
        match (spread.first(), spread.last()) {
            (None, _) | (_, None) => return ReduceLayout::View([dims.iter().product(), 1, 1]),
            (Some(&first), Some(&last)) if (first..=last).all(|d| mask[d] || dims[d] == 1) => {
                let outer = dims[..first].iter().product();
                let inner = dims[last + 1..].iter().product();
                return ReduceLayout::View([outer, len, inner]);
            }
            _ => {}
        }
    }
    let order: Vec<usize> = (0..dims.len()).filter(|&d| !mask[d]).chain((0..dims.len()).filter(|&d| mask[d])).collect();
    let numel: usize = dims.iter().product();
    // `len` ≥ 1 by the caller's promise; `max` keeps a broken promise from dividing by zero.
    ReduceLayout::Moved { order, runs: [numel / len.max(1), len, 1] }
}

/// How many equal pieces the CUDA backend folds each column of a
/// `[outer, len, inner]` sum or mean in first, when the column kernel (a
/// thread per output, `inner > 1`) would leave most of the GPU idle: fewer
/// than 16,384 outputs over long runs (a bias gradient: 384 columns of
/// 16,384 rows ran 384 threads for 55 µs). `None` keeps one pass. The
/// pieces' partial results are a temporary `[outer · chunks · inner]` of
/// the accumulator dtype; the meta device imitating a CUDA device
/// allocates it from this same rule.
pub(crate) fn column_chunks(op: ReduceOp, outer: usize, len: usize, inner: usize) -> Option<usize> {
    const THREADS: usize = 1 << 15;
    const MIN_PIECE: usize = 32;
    let outputs = outer * inner;
    if !matches!(op, ReduceOp::Sum | ReduceOp::Mean) || inner == 1 || outputs >= THREADS / 2 || len < 4 * MIN_PIECE {
        return None;
    }
    let mut chunks = (THREADS / outputs).min(len / MIN_PIECE);
    while chunks > 1 && !len.is_multiple_of(chunks) {
        chunks -= 1;
    }
    (chunks > 1).then_some(chunks)
}

#[cfg(test)]
mod tests {
    use super::{column_chunks, reduce_layout, ReduceLayout, ReduceOp};

    #[test]
    fn long_columns_are_folded_in_equal_pieces() {
        // A bias gradient: 384 columns of 16,384 rows.
        let chunks = column_chunks(ReduceOp::Sum, 1, 16_384, 384);
        assert_eq!(chunks, Some(64));
        // A length with few divisors still splits evenly.
        let c = column_chunks(ReduceOp::Mean, 1, 3 * 1009, 10);
        assert_eq!(c, Some(3));
        // Many outputs, short columns, rows (inner = 1), other ops or a
        // prime length: one pass.
        assert_eq!(column_chunks(ReduceOp::Sum, 1, 16_384, 65_536), None);
        assert_eq!(column_chunks(ReduceOp::Sum, 1, 64, 384), None);
        assert_eq!(column_chunks(ReduceOp::Sum, 384, 16_384, 1), None);
        assert_eq!(column_chunks(ReduceOp::Max, 1, 16_384, 384), None);
        assert_eq!(column_chunks(ReduceOp::Var { correction: 1, sqrt: false }, 1, 16_384, 384), None);
        assert_eq!(column_chunks(ReduceOp::Sum, 1, 8_191, 384), None);
    }

    #[test]
    fn the_pieces_are_as_many_as_the_threads_allow() {
        // 16 outputs: 2,048 pieces would fill 32,768 threads, capped by the
        // 32-element pieces a 4,096-long column has (128).
        assert_eq!(column_chunks(ReduceOp::Sum, 2, 4_096, 8), Some(128));
        // 1,000 outputs: 32 pieces fill the threads.
        assert_eq!(column_chunks(ReduceOp::Sum, 1, 4_096, 1_000), Some(32));
        // 16,384 outputs reach half the threads: one pass.
        assert_eq!(column_chunks(ReduceOp::Sum, 1, 4_096, 16_384), None);
        // The shortest column that splits: 128 elements.
        assert_eq!(column_chunks(ReduceOp::Sum, 1, 127, 4), None);
        assert_eq!(column_chunks(ReduceOp::Sum, 1, 128, 4), Some(4));
    }

    #[test]
    fn neighbouring_reduced_dims_of_a_contiguous_tensor_are_walked_in_place() {
        // [N, C] over dim 0: [1, N, C].
        assert_eq!(reduce_layout(&[64, 10], true, &[true, false], 64), ReduceLayout::View([1, 64, 10]));
        // [A, B, C, D] over dims 1 and 2: [A, B·C, D].
        assert_eq!(reduce_layout(&[2, 3, 4, 5], true, &[false, true, true, false], 12), ReduceLayout::View([2, 12, 5]));
        // A size-1 kept dim between reduced ones does not move anything.
        assert_eq!(reduce_layout(&[3, 1, 4, 5], true, &[true, false, true, false], 12), ReduceLayout::View([1, 12, 5]));
        // Only size-1 dims reduced: every element is its own run.
        assert_eq!(reduce_layout(&[3, 1, 4], true, &[false, true, false], 1), ReduceLayout::View([12, 1, 1]));
    }

    #[test]
    fn separated_reduced_dims_or_a_strided_source_are_copied_with_them_last() {
        // [N, C, H, W] over 0, 2, 3 (a convolution's bias gradient): copied.
        assert_eq!(
            reduce_layout(&[2, 3, 4, 5], true, &[true, false, true, true], 40),
            ReduceLayout::Moved { order: vec![1, 0, 2, 3], runs: [3, 40, 1] }
        );
        // A non-contiguous source is copied even when its dims neighbour.
        assert_eq!(
            reduce_layout(&[6, 4], false, &[true, false], 6),
            ReduceLayout::Moved { order: vec![1, 0], runs: [4, 6, 1] }
        );
    }
}
