//! Index operands: validated `i64` indices, and the host's check of them.

use crate::error::{Result, TensorError};
use crate::tensor::Tensor;
use brasa_kernels::index::{check_indices, IndexError};

/// Validated `i64` indices (every one within `0..size` of the indexed dim,
/// checked by the op so errors name the offending index and its position):
/// the tensor, on the operands' device, and for host tensors its values.
pub(crate) struct Indices<'a> {
    /// The values, row-major, read to the host for host tensors. Empty for
    /// device tensors, which are checked on the device and read there from
    /// `tensor` (copying them out would cost a transfer per op).
    pub values: &'a [i64],
    /// The index tensor (`i64`, on the operands' device).
    pub tensor: &'a Tensor,
}

/// The values of the `i64` tensor `index` in row-major order (read to the
/// host), each checked to lie in `0..size`; `error` turns a bad one into
/// the op's error.
pub(crate) fn read_checked_indices(
    index: &Tensor,
    size: usize,
    error: &dyn Fn(IndexError) -> TensorError,
) -> Result<Vec<i64>> {
    let ids = index.to_vec::<i64>()?;
    check_indices(&ids, size).map_err(error)?;
    Ok(ids)
}
