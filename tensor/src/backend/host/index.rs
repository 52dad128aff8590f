//! The host's indexing kernels (`brasa_kernels::index`): row selection
//! (`index_select`, `embedding`; a large lookup split over rayon's threads
//! by ids), `gather`, `scatter_add_` and `one_hot`. Indices arrive checked.

use crate::backend::host::PARALLEL_MIN_WORK;
use crate::backend::output;
use crate::backend::Indices;
use crate::dispatch::dispatch_dtype;
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::shape::Shape;
use crate::storage::lock_storages;
use crate::tensor::Tensor;
use brasa_kernels::index::{self as kernels, IndexError};
use rayon::prelude::*;

/// Indices per parallel task of a large embedding lookup.
const IDS_PER_TASK: usize = 256;

/// A kernel's index error: the indices were checked, so a bug in brasa (a
/// [`TensorError::Internal`] naming the op), never a panic.
fn kernel_error(op: &'static str) -> impl Fn(IndexError) -> TensorError {
    move |source| TensorError::internal(op, format!("a host index kernel refused indices already checked: {source}"))
}

/// Slice `start..start + len` of `data`, or an error (never a panic).
fn span<'a, T>(op: &'static str, data: &'a [T], start: usize, len: usize) -> Result<&'a [T]> {
    data.get(start..start.saturating_add(len))
        .ok_or_else(|| TensorError::internal(op, format!("{start}+{len} is past {} elements", data.len())))
}

/// Layout over `x`'s storage with the index's shape: the strides of `x`,
/// with dim `dim` given stride 0, so its offsets are the bases of a gather
/// or scatter along `dim`.
pub(crate) fn bases_layout(op: &'static str, x: &Tensor, index_dims: &[usize], dim: usize) -> Result<Layout> {
    let mut strides = x.strides().to_vec();
    if let Some(stride) = strides.get_mut(dim) {
        *stride = 0;
    }
    Layout::new(index_dims, strides, x.layout().offset())
        .map_err(|source| TensorError::OpLayout { op, source: source.into() })
}

/// See [`crate::backend::DeviceOps::index_select`].
pub(super) fn index_select(
    op: &'static str,
    x: &Tensor,
    ids: Indices<'_>,
    size: usize,
    inner: usize,
    shape: &Shape,
) -> Result<Tensor> {
    let ids = ids.values;
    let offset = x.layout().offset();
    let result = output(x.device(), x.dtype(), shape)?;
    dispatch_dtype!(x.dtype(), T => {
        let data = x.storage().read::<T>(op)?;
        let src = span(op, &data, offset, x.numel())?;
        // SAFETY: `index_select` writes all of its output (`inner`
        // elements per id, for every outer block), reading none; split
        // by ids, the chunks cover the output.
        unsafe { result.init_with::<T>(op, |out| {
            let error = kernel_error(op);
            let outer = shape.numel().checked_div(ids.len() * inner).unwrap_or(0);
            if outer == 1 && out.len() >= PARALLEL_MIN_WORK && inner > 0 {
                // One table, many ids (an embedding lookup): split the ids.
                out.par_chunks_mut(IDS_PER_TASK * inner)
                    .zip(ids.par_chunks(IDS_PER_TASK))
                    .try_for_each(|(out, ids)| kernels::index_select(src, size, inner, ids, out))
                    .map_err(error)?;
            } else {
                kernels::index_select(src, size, inner, ids, out).map_err(error)?;
            }
            Ok(())
        }) }
    })
}

/// See [`crate::backend::DeviceOps::gather`].
pub(super) fn gather(op: &'static str, x: &Tensor, dim: usize, index: Indices<'_>) -> Result<Tensor> {
    let size = x.dims()[dim];
    let stride = usize::try_from(x.strides()[dim]).unwrap_or(0);
    let bases = bases_layout(op, x, index.tensor.dims(), dim)?;
    let result = output(x.device(), x.dtype(), index.tensor.shape())?;
    dispatch_dtype!(x.dtype(), T => {
        let src = x.storage().read::<T>(op)?;
        // SAFETY: `gather` writes one output element per id (the output
        // has the index's shape), reading none.
        unsafe {
            result.init_with::<T>(op, |out| {
                kernels::gather(&src, bases.offsets(), index.values, size, stride, out).map_err(kernel_error(op))
            })
        }
    })
}

/// See [`crate::backend::DeviceOps::scatter_add`].
pub(super) fn scatter_add(op: &'static str, dst: &Tensor, dim: usize, index: Indices<'_>, src: &Tensor) -> Result<()> {
    let size = dst.dims()[dim];
    let stride = usize::try_from(dst.strides()[dim]).unwrap_or(0);
    let bases = bases_layout(op, dst, index.tensor.dims(), dim)?;
    let mut locks = lock_storages(&[src.storage()], &[dst.storage()]);
    dispatch_dtype!(dst.dtype(), T => {
        // The storages differ (the op copies a sharing src first).
        let (data, reads) = locks.write::<T>(dst.storage(), op)?;
        let values = reads.read::<T>(src.storage(), op)?;
        let values = src.layout().offsets().map(|o| values.get(o).copied().unwrap_or(T::ZERO));
        kernels::scatter_add(data, bases.offsets(), index.values, size, stride, values).map_err(kernel_error(op))?;
    });
    Ok(())
}

/// See [`crate::backend::DeviceOps::one_hot`].
pub(super) fn one_hot(ids: Indices<'_>, num_classes: usize, shape: &Shape) -> Result<Tensor> {
    const OP: &str = "one_hot";
    let result = output(ids.tensor.device(), DType::I64, shape)?;
    // SAFETY: `one_hot` writes every element of its output (a row of
    // `num_classes` per id, zeros but the one), reading none.
    unsafe {
        result.init_with::<i64>(OP, |out| kernels::one_hot(ids.values, num_classes, out).map_err(kernel_error(OP)))
    }
}
