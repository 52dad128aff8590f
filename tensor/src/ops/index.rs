//! Indexing ops: `index_select`, `gather`, `scatter_add` (and in-place
//! `scatter_add_`), `embedding` and `one_hot`, with PyTorch's semantics.
//!
//! Indices are `i64` tensors. An index outside `0..size` (negative ones
//! included) is an error naming the index, where it was, the dim and its
//! size; nothing is written when one is bad. The loops live in
//! `brasa_kernels::index`.

use crate::dispatch::dispatch_dtype;
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::ops::common::{expect_dtype, expect_rank, output, same_device};
use crate::ops::reduce::PARALLEL_MIN_WORK;
use crate::shape::{resolve_dim, DimIndex, Shape};
use crate::storage::lock_storages;
use crate::tensor::Tensor;
use brasa_kernels::index::{self as kernels, IndexError};
use rayon::prelude::*;

/// Indices per parallel task of a large embedding lookup.
const IDS_PER_TASK: usize = 256;

/// The row-major coordinates of flat position `position` in `dims`.
fn coordinates(dims: &[usize], mut position: usize) -> Vec<usize> {
    let mut coords = vec![0; dims.len()];
    for (c, &size) in coords.iter_mut().zip(dims).rev() {
        if size > 0 {
            *c = position % size;
            position /= size;
        }
    }
    coords
}

/// Turns a kernel's error into one naming the op, the dim and where the bad
/// index sits in the index tensor of shape `index_dims`.
fn index_error(op: &'static str, what: &str, index_dims: &[usize], error: IndexError) -> TensorError {
    match &error {
        &IndexError::OutOfRange { position, index, size } => {
            let at = if index_dims.len() > 1 {
                format!("{:?}", coordinates(index_dims, position))
            } else {
                format!("position {position}")
            };
            TensorError::Index {
                op,
                message: format!("index {index} at {at} is out of range for {what} of size {size}"),
                source: error,
            }
        }
        _ => TensorError::Index { op, message: format!("internal error in a kernel: {error}"), source: error },
    }
}

/// The indices of an `i64` tensor in row-major order.
fn index_values(op: &'static str, index: &Tensor) -> Result<Vec<i64>> {
    expect_dtype(op, index, DType::I64)?;
    index.to_vec::<i64>()
}

/// A contiguous source as one slice: `(tensor, start offset)`.
fn contiguous_source(x: &Tensor) -> Result<(Tensor, usize)> {
    let x = x.contiguous()?;
    let offset = x.layout().offset();
    Ok((x, offset))
}

/// Slice `start..start + len` of `data`, or an error (never a panic).
fn span<'a, T>(op: &'static str, data: &'a [T], start: usize, len: usize) -> Result<&'a [T]> {
    data.get(start..start.saturating_add(len))
        .ok_or_else(|| TensorError::invalid(op, format!("internal: {start}+{len} is past {} elements", data.len())))
}

/// Layout over `x`'s storage with `index`'s shape: the strides of `x`, with
/// dim `dim` given stride 0, so its offsets are the bases of a gather or
/// scatter along `dim`. `index` fits inside `x` in every other dim.
fn bases_layout(op: &'static str, x: &Tensor, index_dims: &[usize], dim: usize) -> Result<Layout> {
    let mut strides = x.strides().to_vec();
    if let Some(stride) = strides.get_mut(dim) {
        *stride = 0;
    }
    Layout::new(index_dims, strides, x.layout().offset())
        .map_err(|source| TensorError::OpLayout { op, source: source.into() })
}

/// Errors unless `index` has `x`'s rank and fits inside `limit` in every dim
/// except `dim` (PyTorch's rule for gather and scatter).
fn check_index_shape(
    op: &'static str,
    index: &Tensor,
    limit: &Tensor,
    name: &str,
    dim: usize,
    all: bool,
) -> Result<()> {
    if index.rank() != limit.rank() {
        return Err(TensorError::shape(
            op,
            format!(
                "index has shape {:?} but {name} has shape {:?}; they need the same rank",
                index.dims(),
                limit.dims()
            ),
        ));
    }
    for (d, (&i, &s)) in index.dims().iter().zip(limit.dims()).enumerate() {
        if (all || d != dim) && i > s {
            return Err(TensorError::shape(
                op,
                format!(
                    "index has size {i} in dim {d} but {name} has size {s} (index {:?}, {name} {:?})",
                    index.dims(),
                    limit.dims()
                ),
            ));
        }
    }
    Ok(())
}

/// A 0-d tensor seen as 1-d (gather and scatter treat it so).
fn at_least_1d(x: &Tensor) -> Result<Tensor> {
    if x.rank() == 0 {
        x.unsqueeze(0)
    } else {
        Ok(x.clone())
    }
}

impl Tensor {
    /// The slices `indices[j]` of dim `dim`, in order: the result has this
    /// tensor's shape with dim `dim` of size `indices.numel()`. `indices` is
    /// a 0-d or 1-d `i64` tensor; repeats are allowed.
    pub fn index_select(&self, dim: impl DimIndex, indices: &Tensor) -> Result<Tensor> {
        const OP: &str = "index_select";
        let _range = brasa_profile::record_op(OP, &[self.dims(), indices.dims()]);
        same_device(OP, &[self, indices])?;
        if indices.rank() > 1 {
            return Err(TensorError::shape(OP, format!("indices must be 0-d or 1-d, got shape {:?}", indices.dims())));
        }
        if self.rank() == 0 {
            // As in PyTorch: dim 0 or -1, exactly one index (which must be 0),
            // and a 0-d result.
            resolve_dim(dim, 1, OP)?;
            if indices.numel() != 1 {
                return Err(TensorError::shape(
                    OP,
                    format!("index to a 0-d tensor can have only 1 value, got {} values", indices.numel()),
                ));
            }
            return self.reshape(&[1])?.index_select(0, &indices.reshape(&[1])?)?.reshape(&[]);
        }
        let d = resolve_dim(dim, self.rank(), OP)?;
        let ids = index_values(OP, indices)?;
        let dims = self.dims();
        let (size, inner) = (dims[d], dims[d + 1..].iter().product::<usize>());
        let mut out_dims = dims.to_vec();
        out_dims[d] = ids.len();
        let what = format!("dim {d}");
        self.select_rows(OP, &what, &ids, size, inner, Shape::from(out_dims))
    }

    /// Shared by `index_select` and `embedding`: rows `ids` of the
    /// `[outer, size, inner]` view of this tensor into a new tensor of `shape`.
    fn select_rows(
        &self,
        op: &'static str,
        what: &str,
        ids: &[i64],
        size: usize,
        inner: usize,
        shape: Shape,
    ) -> Result<Tensor> {
        kernels::check_indices(ids, size).map_err(|e| index_error(op, what, &[ids.len()], e))?;
        let (x, offset) = contiguous_source(self)?;
        let result = output(x.device(), x.dtype(), &shape)?;
        dispatch_dtype!(x.dtype(), T => {
            let data = x.storage().read::<T>(op)?;
            let src = span(op, &data, offset, x.numel())?;
            // SAFETY: `index_select` writes all of its output (`inner`
            // elements per id, for every outer block), reading none; split
            // by ids, the chunks cover the output.
            unsafe { result.init_with::<T>(op, |out| {
                let error = |e| index_error(op, what, &[ids.len()], e);
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

    /// Looks up rows of `weight` (`[vocabulary, dim]`) for `ids` (`i64`, any
    /// shape): the result has shape `[ids..., dim]`. An id outside the
    /// vocabulary is an error naming it.
    pub fn embedding(weight: &Tensor, ids: &Tensor) -> Result<Tensor> {
        const OP: &str = "embedding";
        let _range = brasa_profile::record_op(OP, &[weight.dims(), ids.dims()]);
        same_device(OP, &[weight, ids])?;
        expect_rank(OP, weight, 2)?;
        let values = index_values(OP, ids)?;
        let (vocabulary, width) = (weight.dims()[0], weight.dims()[1]);
        let mut shape = ids.dims().to_vec();
        shape.push(width);
        let what = format!("the vocabulary (weight {:?})", weight.dims());
        weight.select_rows(OP, &what, &values, vocabulary, width, Shape::from(shape)).map_err(|e| match e {
            // Name the id's place in the ids tensor rather than in the flat list.
            TensorError::Index { op, message, source } if ids.rank() > 1 => TensorError::Index {
                op,
                source,
                message: values
                    .iter()
                    .position(|&i| !(0..vocabulary as i64).contains(&i))
                    .map(|p| {
                        format!(
                            "id {} at {:?} is out of range for {what} of size {vocabulary}",
                            values[p],
                            coordinates(ids.dims(), p)
                        )
                    })
                    .unwrap_or(message),
            },
            other => other,
        })
    }

    /// PyTorch's `gather`: `out[i][j][k] = self[i][index[i][j][k]][k]` for
    /// `dim == 1`, and so on. `index` is `i64` with this tensor's rank and at
    /// most its size in every other dim; the result has `index`'s shape.
    pub fn gather(&self, dim: impl DimIndex, index: &Tensor) -> Result<Tensor> {
        const OP: &str = "gather";
        let _range = brasa_profile::record_op(OP, &[self.dims(), index.dims()]);
        same_device(OP, &[self, index])?;
        let out_shape = index.shape().clone();
        let (x, index) = (at_least_1d(self)?, at_least_1d(index)?);
        let d = resolve_dim(dim, x.rank(), OP)?;
        check_index_shape(OP, &index, &x, "input", d, false)?;
        let ids = index_values(OP, &index)?;
        let size = x.dims()[d];
        let stride = usize::try_from(x.strides()[d]).unwrap_or(0);
        let bases = bases_layout(OP, &x, index.dims(), d)?;
        let result = output(x.device(), x.dtype(), index.shape())?;
        let result = dispatch_dtype!(x.dtype(), T => {
            let src = x.storage().read::<T>(OP)?;
            // SAFETY: `gather` writes one output element per id (the output
            // has the index's shape), reading none.
            unsafe {
                result.init_with::<T>(OP, |out| {
                    kernels::gather(&src, bases.offsets(), &ids, size, stride, out)
                        .map_err(|e| index_error(OP, &format!("dim {d}"), index.dims(), e))
                })
            }
        })?;
        Ok(result.with_layout(Layout::contiguous(out_shape)?))
    }

    /// PyTorch's `scatter_add` without modifying this tensor: a copy of it
    /// with `src[i][j][k]` added at `[i][index[i][j][k]][k]` (for `dim == 1`).
    /// See [`Tensor::scatter_add_`].
    pub fn scatter_add(&self, dim: impl DimIndex, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        let out = self.copy_to(self.device(), self.dtype())?;
        out.scatter_add_(dim, index, src)?;
        Ok(out)
    }

    /// Adds `src[i][j][k]` into `self[i][index[i][j][k]][k]` (for `dim ==
    /// 1`, and so on), in place; repeated indices accumulate. `index` is
    /// `i64` with the rank of `self` and `src`, at most `src`'s size in every
    /// dim and at most `self`'s in every dim but `dim`; `src` has `self`'s
    /// dtype. `f16`/`bf16` add in `f32`; integers wrap.
    pub fn scatter_add_(&self, dim: impl DimIndex, index: &Tensor, src: &Tensor) -> Result<()> {
        const OP: &str = "scatter_add_";
        same_device(OP, &[self, index, src])?;
        expect_dtype(OP, src, self.dtype())?;
        let (x, index, src) = (at_least_1d(self)?, at_least_1d(index)?, at_least_1d(src)?);
        let d = resolve_dim(dim, x.rank(), OP)?;
        check_index_shape(OP, &index, &x, "self", d, false)?;
        check_index_shape(OP, &index, &src, "src", d, true)?;
        x.check_writable(OP)?;
        let ids = index_values(OP, &index)?;
        // Only the part of src that index covers is read.
        let mut src = src;
        for (axis, &size) in index.dims().iter().enumerate() {
            src = src.narrow(axis, 0, size)?;
        }
        if src.shares_storage_with(&x) {
            src = src.copy_to(src.device(), src.dtype())?;
        }
        let size = x.dims()[d];
        let stride = usize::try_from(x.strides()[d]).unwrap_or(0);
        let bases = bases_layout(OP, &x, index.dims(), d)?;
        {
            let mut locks = lock_storages(&[src.storage()], &[x.storage()]);
            dispatch_dtype!(x.dtype(), T => {
                // The storages differ (src was copied if they did not).
                let (dst, reads) = locks.write::<T>(x.storage(), OP)?;
                let values = reads.read::<T>(src.storage(), OP)?;
                let values = src.layout().offsets().map(|o| values.get(o).copied().unwrap_or(T::ZERO));
                kernels::scatter_add(dst, bases.offsets(), &ids, size, stride, values)
                    .map_err(|e| index_error(OP, &format!("dim {d}"), index.dims(), e))?;
            });
        }
        x.storage().bump_version();
        Ok(())
    }

    /// One-hot encoding of an `i64` tensor of class ids: shape `[..., num_classes]`,
    /// `i64`, 1 at each id's class and 0 elsewhere. An id outside
    /// `0..num_classes` is an error naming it.
    pub fn one_hot(&self, num_classes: usize) -> Result<Tensor> {
        const OP: &str = "one_hot";
        let ids = index_values(OP, self)?;
        let mut shape = self.dims().to_vec();
        shape.push(num_classes);
        let shape = Shape::from(shape);
        let result = output(self.device(), DType::I64, &shape)?;
        // SAFETY: `one_hot` writes every element of its output (a row of
        // `num_classes` per id, zeros but the one), reading none.
        unsafe {
            result.init_with::<i64>(OP, |out| {
                kernels::one_hot(&ids, num_classes, out).map_err(|e| match e {
                    IndexError::OutOfRange { position, index, size } => {
                        let source = e.clone();
                        let at = if self.rank() > 1 {
                            format!("{:?}", coordinates(self.dims(), position))
                        } else {
                            format!("position {position}")
                        };
                        TensorError::Index {
                            op: OP,
                            message: format!("class {index} at {at} is out of range for {size} classes"),
                            source,
                        }
                    }
                    other => index_error(OP, "the classes", self.dims(), other),
                })
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{DType, Device, Tensor};

    fn ids(values: &[i64], shape: &[usize]) -> Tensor {
        Tensor::from_slice_on(values, shape, Device::CPU).unwrap()
    }

    #[test]
    fn select_gather_scatter_embedding_one_hot() {
        let x = Tensor::arange_on(0.0, 6.0, 1.0, DType::F32, Device::CPU).unwrap().reshape(&[2, 3]).unwrap();
        let picked = x.index_select(1, &ids(&[2, 0, 2], &[3])).unwrap();
        assert_eq!(picked.to_vec::<f32>().unwrap(), [2.0, 0.0, 2.0, 5.0, 3.0, 5.0]);
        let error = x.index_select(0, &ids(&[0, 2], &[2])).unwrap_err().to_string();
        assert!(error.contains("index 2 at position 1") && error.contains("dim 0 of size 2"), "{error}");
        let gathered = x.gather(1, &ids(&[2, 1, 0, 0], &[2, 2])).unwrap();
        assert_eq!(gathered.to_vec::<f32>().unwrap(), [2.0, 1.0, 3.0, 3.0]);
        let error = x.gather(1, &ids(&[2, 1, 0, 3], &[2, 2])).unwrap_err().to_string();
        assert!(error.contains("index 3 at [1, 1]") && error.contains("dim 1 of size 3"), "{error}");
        let total = x.zeros_like().unwrap().scatter_add(1, &ids(&[0, 0, 1, 2], &[2, 2]), &x).unwrap();
        assert_eq!(total.to_vec::<f32>().unwrap(), [1.0, 0.0, 0.0, 0.0, 3.0, 4.0]);
        let table = Tensor::arange_on(0.0, 8.0, 1.0, DType::F32, Device::CPU).unwrap().reshape(&[4, 2]).unwrap();
        let rows = Tensor::embedding(&table, &ids(&[3, 0, 1, 3], &[2, 2])).unwrap();
        assert_eq!(rows.dims(), [2, 2, 2]);
        assert_eq!(rows.to_vec::<f32>().unwrap(), [6.0, 7.0, 0.0, 1.0, 2.0, 3.0, 6.0, 7.0]);
        let error = Tensor::embedding(&table, &ids(&[3, 0, 4, 3], &[2, 2])).unwrap_err().to_string();
        assert!(error.contains("id 4 at [1, 0]"), "{error}");
        let hot = ids(&[1, 0], &[2]).one_hot(3).unwrap();
        assert_eq!(hot.to_vec::<i64>().unwrap(), [0, 1, 0, 1, 0, 0]);
        let error = ids(&[1, 5], &[2]).one_hot(3).unwrap_err().to_string();
        assert!(error.contains("class 5 at position 1") && error.contains("3 classes"), "{error}");
    }
}
