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

/// The ids of a scatter-add that moves whole rows: along dim 0 of a
/// row-major `dst`, with a row-major `src` and an index of `src`'s shape
/// whose trailing dims are `dst`'s and that is constant along each row (an
/// embedding's backward, `index_add_` along dim 0). `None` otherwise.
fn row_ids(dst: &Tensor, dim: usize, index: &Indices<'_>, src: &Tensor) -> Option<Vec<i64>> {
    let dims = index.tensor.dims();
    let whole_rows = dim == 0
        && dims.len() == dst.rank()
        && dims.len() >= 2
        && dims[1..] == dst.dims()[1..]
        && src.dims() == dims
        && dst.is_contiguous()
        && src.is_contiguous();
    let inner: usize = dims.get(1..)?.iter().product();
    if !whole_rows || inner == 0 || index.values.len() != dims[0] * inner {
        return None;
    }
    let rows = index.values.chunks_exact(inner);
    rows.map(|row| row.iter().all(|&v| v == row[0]).then_some(row[0])).collect()
}

/// See [`crate::backend::DeviceOps::scatter_add`].
pub(super) fn scatter_add(op: &'static str, dst: &Tensor, dim: usize, index: Indices<'_>, src: &Tensor) -> Result<()> {
    if let Some(ids) = row_ids(dst, dim, &index, src) {
        return scatter_add_rows(op, dst, &ids, src);
    }
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

/// [`scatter_add`] of whole rows (see [`row_ids`]): row `ids[j]` of `dst`
/// gets row `j` of `src` added, vectorised along the row.
fn scatter_add_rows(op: &'static str, dst: &Tensor, ids: &[i64], src: &Tensor) -> Result<()> {
    let size = dst.dims()[0];
    let inner = dst.numel().checked_div(size).unwrap_or(0);
    let mut locks = lock_storages(&[src.storage()], &[dst.storage()]);
    dispatch_dtype!(dst.dtype(), T => {
        // The storages differ (the op copies a sharing src first).
        let (data, reads) = locks.write::<T>(dst.storage(), op)?;
        let values = reads.read::<T>(src.storage(), op)?;
        let values = span(op, values, src.layout().offset(), src.numel())?;
        let (start, len) = (dst.layout().offset(), dst.numel());
        let data_len = data.len();
        let rows = data
            .get_mut(start..start.saturating_add(len))
            .ok_or_else(|| TensorError::internal(op, format!("{start}+{len} is past {data_len} elements")))?;
        kernels::scatter_add_rows(rows, size, inner, ids, values).map_err(kernel_error(op))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(values: &[i64], dims: &[usize]) -> Tensor {
        Tensor::from_vec(values.to_vec(), dims.to_vec()).unwrap()
    }

    #[test]
    fn whole_rows_are_found_only_where_the_row_kernel_applies() {
        let dst = Tensor::zeros([4, 3], DType::F32).unwrap();
        let src = Tensor::ones([2, 3], DType::F32).unwrap();
        let rows = ids(&[3, 3, 3, 1, 1, 1], &[2, 3]);
        let at = |index: &Tensor, dst: &Tensor, dim: usize, src: &Tensor| {
            let values = index.to_vec::<i64>().unwrap();
            row_ids(dst, dim, &Indices { values: &values, tensor: index }, src)
        };
        assert_eq!(at(&rows, &dst, 0, &src), Some(vec![3, 1]));
        // A row that is not constant, another dim, a strided dst or src, a
        // narrower index (not whole rows): the element-wise kernel.
        assert_eq!(at(&ids(&[3, 3, 2, 1, 1, 1], &[2, 3]), &dst, 0, &src), None);
        assert_eq!(at(&rows, &dst, 1, &src), None);
        let wide = Tensor::zeros([4, 6], DType::F32).unwrap().narrow(1, 0, 3).unwrap();
        assert_eq!(at(&rows, &wide, 0, &src), None);
        let src_t = Tensor::ones([3, 2], DType::F32).unwrap().t().unwrap();
        assert_eq!(at(&rows, &dst, 0, &src_t), None);
        let narrow = ids(&[3, 3, 1, 1], &[2, 2]);
        assert_eq!(at(&narrow, &dst, 0, &Tensor::ones([2, 2], DType::F32).unwrap()), None);
    }

    #[test]
    fn index_add_along_rows_equals_the_elementwise_path() {
        // bf16 rounds per addition: the same bits show the same order.
        let source = Tensor::arange(0.0, 40.0, 1.0, DType::F32).unwrap().mul_scalar(0.37).unwrap();
        let source = source.reshape(&[8, 5]).unwrap().to_dtype(DType::BF16).unwrap();
        let index = ids(&[2, 0, 2, 3, 2, 0, 1, 2], &[8]);
        // Row-major: the row kernel. A transposed copy (same values): the
        // element-wise one.
        let fast = Tensor::ones([4, 5], DType::BF16).unwrap();
        fast.index_add_(0, &index, &source, 1.0).unwrap();
        let slow = Tensor::ones([5, 4], DType::BF16).unwrap().t().unwrap();
        slow.index_add_(0, &index, &source, 1.0).unwrap();
        let bits = |t: &Tensor| t.to_vec::<half::bf16>().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fast), bits(&slow));
        // At an offset in its storage (a parameter in a flat buffer).
        let flat = Tensor::ones([30], DType::BF16).unwrap();
        let view = flat.narrow(0, 10, 20).unwrap().reshape(&[4, 5]).unwrap();
        view.index_add_(0, &index, &source, 1.0).unwrap();
        assert_eq!(bits(&view), bits(&fast));
        assert!(flat.narrow(0, 0, 10).unwrap().to_vec::<half::bf16>().unwrap().iter().all(|v| v.to_f32() == 1.0));
    }
}
