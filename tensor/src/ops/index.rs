//! Indexing ops: `index_select`, `gather`, `scatter_add` (and in-place
//! `scatter_add_`), `embedding` and `one_hot`, with PyTorch's semantics.
//!
//! Indices are `i64` tensors. An index outside `0..size` (negative ones
//! included) is an error naming the index, where it was, the dim and its
//! size; nothing is written when one is bad. Host indices are read and
//! checked here. Indices on a device are checked there: their minimum and
//! maximum are reduced on the device and only those two numbers are read
//! back (a wait for the work queued before, but no copy of the indices);
//! only when one is out of range are all of them read, to name it. The
//! device then runs the op ([`crate::backend::DeviceOps::index_select`] and
//! the others) on the index tensor itself.

use crate::backend::{ops_for, runtime_for, Indices};
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::ops::common::{expect_dtype, expect_rank, same_device};
use crate::shape::{resolve_dim, DimIndex, Shape};
use crate::tensor::Tensor;
use brasa_kernels::index::IndexError;

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
/// index sits in the index tensor of shape `index_dims` (a
/// [`TensorError::Index`]); a refusal other than a bad index is a
/// [`TensorError::Internal`].
pub(super) fn index_error(op: &'static str, what: &str, index_dims: &[usize], error: IndexError) -> TensorError {
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
        // Any other refusal means the op handed the kernel operands that do
        // not fit: a broken invariant, not the caller's bad index.
        _ => TensorError::internal(
            op,
            format!("the index kernel refused the operands for {what} (index shape {index_dims:?}): {error}"),
        ),
    }
}

/// The indices of an `i64` tensor in row-major order (none from a device
/// without values: a plan assumes the indices are in range).
pub(super) fn index_values(op: &'static str, index: &Tensor) -> Result<Vec<i64>> {
    expect_dtype(op, index, DType::I64)?;
    if !runtime_for(index.device())?.holds_values() {
        return Ok(Vec::new());
    }
    index.to_vec::<i64>()
}

/// Checks that every index of the `i64` tensor `index` lies in `0..size`
/// (`error` turns a bad one into the op's error) and returns them in
/// row-major order as the host kernels need them; for indices on a device
/// that the host does not need (`keep` false) the device may check them
/// where they are and return none ([`crate::backend::DeviceOps::checked_indices`]).
pub(super) fn checked_ids(
    op: &'static str,
    index: &Tensor,
    size: usize,
    keep: bool,
    error: impl Fn(IndexError) -> TensorError,
) -> Result<Vec<i64>> {
    expect_dtype(op, index, DType::I64)?;
    ops_for(index.device())?.checked_indices(op, index, size, keep, &error)
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

/// A scatter's operands, checked: the destination (at least 1-d), the
/// dim, the index with its values read to the host and checked against the
/// dim's size, and `src` narrowed to the index's shape (a copy when it
/// shared the destination's storage). Shared by `scatter_add_` and the ops
/// in `ops/scatter.rs`.
pub(super) struct Scatter {
    /// The destination, a view of the caller's tensor (0-d seen as 1-d).
    pub(super) x: Tensor,
    /// The scattered dim, resolved.
    pub(super) dim: usize,
    /// The index, at least 1-d.
    pub(super) index: Tensor,
    /// The index's values in row-major order, each within `0..x.dims()[dim]`.
    pub(super) ids: Vec<i64>,
    /// `src` narrowed to the index's shape (`None` for a scatter of a value).
    pub(super) src: Option<Tensor>,
}

/// Checks a scatter of `src` (or of a value, without `src`) into `dst`
/// along `dim` as PyTorch does, before anything is written: devices,
/// dtypes, ranks, the index's shape against both, and every index value.
pub(super) fn check_scatter(
    op: &'static str,
    dst: &Tensor,
    dim: impl DimIndex,
    index: &Tensor,
    src: Option<&Tensor>,
    keep_ids: bool,
) -> Result<Scatter> {
    let mut operands = vec![dst, index];
    operands.extend(src);
    same_device(op, &operands)?;
    if let Some(src) = src {
        expect_dtype(op, src, dst.dtype())?;
    }
    let (x, index) = (at_least_1d(dst)?, at_least_1d(index)?);
    let d = resolve_dim(dim, x.rank(), op)?;
    check_index_shape(op, &index, &x, "self", d, false)?;
    let src = match src {
        Some(src) => {
            let mut src = at_least_1d(src)?;
            check_index_shape(op, &index, &src, "src", d, true)?;
            // Only the part of src that index covers is read.
            for (axis, &size) in index.dims().iter().enumerate() {
                src = src.narrow(axis, 0, size)?;
            }
            if src.shares_storage_with(&x) {
                src = src.copy_to(src.device(), src.dtype())?;
            }
            Some(src)
        }
        None => None,
    };
    let what = format!("dim {d}");
    let ids = checked_ids(op, &index, x.dims()[d], keep_ids, |e| index_error(op, &what, index.dims(), e))?;
    Ok(Scatter { x, dim: d, index, ids, src })
}

impl Scatter {
    /// Adds the checked `src` into `dst` (the destination or a tensor of
    /// its shape not sharing `src`'s storage) in place and bumps its
    /// version; the caller checked that `dst` is writable.
    pub(super) fn add_into(&self, op: &'static str, dst: &Tensor) -> Result<()> {
        let Some(src) = &self.src else {
            return Err(TensorError::internal(op, "a scatter-add without src"));
        };
        let ids = Indices { values: &self.ids, tensor: &self.index };
        ops_for(dst.device())?.scatter_add(op, dst, self.dim, ids, src)?;
        dst.storage().bump_version();
        Ok(())
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
        expect_dtype(OP, indices, DType::I64)?;
        let dims = self.dims();
        let (size, inner) = (dims[d], dims[d + 1..].iter().product::<usize>());
        let mut out_dims = dims.to_vec();
        out_dims[d] = indices.numel();
        let what = format!("dim {d}");
        let ids = checked_ids(OP, indices, size, false, |e| index_error(OP, &what, &[indices.numel()], e))?;
        self.select_rows(OP, &ids, indices, size, inner, Shape::from(out_dims))
    }

    /// Shared by `index_select` and `embedding`: rows `index` (checked, its
    /// values `ids` on the host) of the `[outer, size, inner]` view of this
    /// tensor into a new tensor of `shape`.
    fn select_rows(
        &self,
        op: &'static str,
        ids: &[i64],
        index: &Tensor,
        size: usize,
        inner: usize,
        shape: Shape,
    ) -> Result<Tensor> {
        let x = self.contiguous()?;
        let index = index.contiguous()?;
        ops_for(x.device())?.index_select(op, &x, Indices { values: ids, tensor: &index }, size, inner, &shape)
    }

    /// Looks up rows of `weight` (`[vocabulary, dim]`) for `ids` (`i64`, any
    /// shape): the result has shape `[ids..., dim]`. An id outside the
    /// vocabulary is an error naming it.
    pub fn embedding(weight: &Tensor, ids: &Tensor) -> Result<Tensor> {
        const OP: &str = "embedding";
        let _range = brasa_profile::record_op(OP, &[weight.dims(), ids.dims()]);
        same_device(OP, &[weight, ids])?;
        expect_rank(OP, weight, 2)?;
        let (vocabulary, width) = (weight.dims()[0], weight.dims()[1]);
        let mut shape = ids.dims().to_vec();
        shape.push(width);
        let what = format!("the vocabulary (weight {:?})", weight.dims());
        let values = checked_ids(OP, ids, vocabulary, false, |e| match e {
            // Name the id's place in the ids tensor rather than in the flat list.
            IndexError::OutOfRange { position, index, size } if ids.rank() > 1 => TensorError::Index {
                op: OP,
                message: format!(
                    "id {index} at {:?} is out of range for {what} of size {size}",
                    coordinates(ids.dims(), position)
                ),
                source: e,
            },
            other => index_error(OP, &what, &[ids.numel()], other),
        })?;
        weight.select_rows(OP, &values, ids, vocabulary, width, Shape::from(shape))
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
        let what = format!("dim {d}");
        let ids = checked_ids(OP, &index, x.dims()[d], false, |e| index_error(OP, &what, index.dims(), e))?;
        let result = ops_for(x.device())?.gather(OP, &x, d, Indices { values: &ids, tensor: &index })?;
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
        let s = check_scatter(OP, self, dim, index, Some(src), false)?;
        s.x.check_writable(OP)?;
        s.add_into(OP, &s.x)
    }

    /// One-hot encoding of an `i64` tensor of class ids: shape `[..., num_classes]`,
    /// `i64`, 1 at each id's class and 0 elsewhere. An id outside
    /// `0..num_classes` is an error naming it.
    pub fn one_hot(&self, num_classes: usize) -> Result<Tensor> {
        const OP: &str = "one_hot";
        let mut shape = self.dims().to_vec();
        shape.push(num_classes);
        let shape = Shape::from(shape);
        let ids = checked_ids(OP, self, num_classes, false, |e| match e {
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
        })?;
        let index = self.contiguous()?;
        ops_for(self.device())?.one_hot(Indices { values: &ids, tensor: &index }, num_classes, &shape)
    }
}

#[cfg(test)]
mod tests {
    use crate::{DType, Device, IndexError, Tensor, TensorError};

    fn ids(values: &[i64], shape: &[usize]) -> Tensor {
        Tensor::from_slice_on(values, shape, Device::CPU).unwrap()
    }

    #[test]
    fn select_gather_scatter_embedding_one_hot() {
        let x = Tensor::arange_on(0.0, 6.0, 1.0, DType::F32, Device::CPU).unwrap().reshape(&[2, 3]).unwrap();
        let picked = x.index_select(1, &ids(&[2, 0, 2], &[3])).unwrap();
        assert_eq!(picked.to_vec::<f32>().unwrap(), [2.0, 0.0, 2.0, 5.0, 3.0, 5.0]);
        let error = x.index_select(0, &ids(&[0, 2], &[2])).unwrap_err();
        let bad = IndexError::OutOfRange { position: 1, index: 2, size: 2 };
        assert!(matches!(&error, TensorError::Index { op: "index_select", source, .. } if *source == bad), "{error:?}");
        let gathered = x.gather(1, &ids(&[2, 1, 0, 0], &[2, 2])).unwrap();
        assert_eq!(gathered.to_vec::<f32>().unwrap(), [2.0, 1.0, 3.0, 3.0]);
        let error = x.gather(1, &ids(&[2, 1, 0, 3], &[2, 2])).unwrap_err();
        let bad = IndexError::OutOfRange { position: 3, index: 3, size: 3 };
        assert!(matches!(&error, TensorError::Index { op: "gather", source, .. } if *source == bad), "{error:?}");
        let total = x.zeros_like().unwrap().scatter_add(1, &ids(&[0, 0, 1, 2], &[2, 2]), &x).unwrap();
        assert_eq!(total.to_vec::<f32>().unwrap(), [1.0, 0.0, 0.0, 0.0, 3.0, 4.0]);
        let table = Tensor::arange_on(0.0, 8.0, 1.0, DType::F32, Device::CPU).unwrap().reshape(&[4, 2]).unwrap();
        let rows = Tensor::embedding(&table, &ids(&[3, 0, 1, 3], &[2, 2])).unwrap();
        assert_eq!(rows.dims(), [2, 2, 2]);
        assert_eq!(rows.to_vec::<f32>().unwrap(), [6.0, 7.0, 0.0, 1.0, 2.0, 3.0, 6.0, 7.0]);
        let error = Tensor::embedding(&table, &ids(&[3, 0, 4, 3], &[2, 2])).unwrap_err();
        let bad = IndexError::OutOfRange { position: 2, index: 4, size: 4 };
        assert!(matches!(&error, TensorError::Index { op: "embedding", source, .. } if *source == bad), "{error:?}");
        let hot = ids(&[1, 0], &[2]).one_hot(3).unwrap();
        assert_eq!(hot.to_vec::<i64>().unwrap(), [0, 1, 0, 1, 0, 0]);
        let error = ids(&[1, 5], &[2]).one_hot(3).unwrap_err();
        let bad = IndexError::OutOfRange { position: 1, index: 5, size: 3 };
        assert!(matches!(&error, TensorError::Index { op: "one_hot", source, .. } if *source == bad), "{error:?}");
    }
}
