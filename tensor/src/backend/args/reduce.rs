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
