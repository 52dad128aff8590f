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

/// How one operand's matrices are handed to cuBLAS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlasMatrix {
    /// `OP_T` when the matrix lies column by column.
    pub transposed: bool,
    /// The leading dimension.
    pub ld: i64,
}

/// The cuBLAS description of a `rows × cols` row-major view with strides
/// `(rs, cs)` as the column-major transpose cuBLAS reads, or `None` when
/// neither its rows nor its columns are contiguous (the caller copies it).
pub(crate) fn blas_matrix(rows: usize, cols: usize, rs: isize, cs: isize) -> Option<BlasMatrix> {
    let (rows, cols) = (rows as i64, cols as i64);
    let (rs, cs) = (rs as i64, cs as i64);
    // Rows contiguous: cuBLAS sees the transpose (cols × rows), leading dim
    // = the row stride, which must cover a row.
    if cols <= 1 || cs == 1 {
        let ld = if rows <= 1 { cols.max(1) } else { rs };
        if ld >= cols.max(1) {
            return Some(BlasMatrix { transposed: false, ld });
        }
    }
    // Columns contiguous: cuBLAS sees the matrix itself (rows × cols), read
    // transposed.
    if rows <= 1 || rs == 1 {
        let ld = if cols <= 1 { rows.max(1) } else { cs };
        if ld >= rows.max(1) {
            return Some(BlasMatrix { transposed: true, ld });
        }
    }
    None
}

/// One operand of a cuBLAS strided-batched product: its matrices as cuBLAS
/// reads them and the stride between batch entries (0 when shared).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlasOperand {
    pub matrix: BlasMatrix,
    pub batch_stride: i64,
}

/// `t` (`[batch.., rows, cols]`) as one operand of a cuBLAS strided-batched
/// call, or `None` when neither its rows nor its columns are contiguous or
/// its batch does not step evenly: the CUDA backend then multiplies a
/// contiguous copy, and a meta device imitating CUDA allocates that copy.
pub(crate) fn blas_operand(t: &Tensor, rows: usize, cols: usize) -> Option<BlasOperand> {
    let rank = t.rank();
    let s = t.layout().strides();
    let batch_dims = &t.dims()[..rank - 2];
    let batch_strides: Vec<usize> = s[..rank - 2].iter().map(|&x| x as usize).collect();
    let matrix = blas_matrix(rows, cols, s[rank - 2], s[rank - 1])?;
    let batch_stride = merged_stride(batch_dims, &batch_strides)?;
    Some(BlasOperand { matrix, batch_stride: batch_stride as i64 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_major_column_major_and_uncopyable_views() {
        // A contiguous [3, 4]: rows contiguous, ld 4.
        assert_eq!(blas_matrix(3, 4, 4, 1), Some(BlasMatrix { transposed: false, ld: 4 }));
        // Its transpose [4, 3] with strides (1, 4): columns contiguous.
        assert_eq!(blas_matrix(4, 3, 1, 4), Some(BlasMatrix { transposed: true, ld: 4 }));
        // A narrowed [3, 2] of a [3, 4]: rows contiguous, ld 4.
        assert_eq!(blas_matrix(3, 2, 4, 1), Some(BlasMatrix { transposed: false, ld: 4 }));
        // Vectors: a [1, k] row and a [k, 1] column with odd strides.
        assert_eq!(blas_matrix(1, 5, 99, 1), Some(BlasMatrix { transposed: false, ld: 5 }));
        assert_eq!(blas_matrix(5, 1, 1, 7), Some(BlasMatrix { transposed: false, ld: 1 }));
        // Every other element: neither rows nor columns contiguous.
        assert_eq!(blas_matrix(3, 4, 8, 2), None);
        // A broadcast row (stride 0 between rows) cannot be a leading dim.
        assert_eq!(blas_matrix(3, 4, 0, 1), None);
    }
}
