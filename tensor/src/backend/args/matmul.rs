//! Matrix-product operands, as the devices see them.

use crate::tensor::Tensor;

/// A matrix product as the backend sees it, after PyTorch's shape rules:
/// `a` is a view of shape `[batch.., m, k]` and `b` of `[batch.., k, n]`,
/// both with non-negative strides (batch dims broadcast by stride 0, so one
/// operand may be shared by every batch entry), and the output is a new
/// contiguous `[batch.., m, n]`. Row and column strides are arbitrary; the
/// backend chooses between transposition flags, strided batches and copies.
pub(crate) struct MatmulOperands<'a> {
    /// `[batch.., m, k]`.
    pub a: &'a Tensor,
    /// `[batch.., k, n]`.
    pub b: &'a Tensor,
    /// The broadcast batch dims.
    pub batch: &'a [usize],
    /// Rows of each product.
    pub m: usize,
    /// Columns of each product.
    pub n: usize,
    /// The summed dimension.
    pub k: usize,
}

/// The stride of the one dim that `dims` (with `strides`) merge into, when
/// they step evenly through memory in row-major order; `None` otherwise.
/// Dims of size 1 do not matter.
pub(crate) fn merged_stride(dims: &[usize], strides: &[usize]) -> Option<usize> {
    let mut merged: Option<(usize, usize)> = None; // (stride, elements spanned)
    for (&size, &stride) in dims.iter().zip(strides).rev() {
        if size == 1 {
            continue;
        }
        merged = match merged {
            None => Some((stride, size)),
            Some((inner, count)) if stride == count * inner => Some((inner, count * size)),
            Some(_) => return None,
        };
    }
    Some(merged.map_or(strides.last().copied().unwrap_or(1), |(stride, _)| stride))
}
