//! The scatters beside `scatter_add` (ops/index.rs), with PyTorch's
//! semantics: `scatter` (overwrite, from a tensor or of one value),
//! `scatter_reduce` (with [`ScatterReduce`], and `include_self`) and
//! `index_add` (with `alpha`), each out of place and in place (`_`).
//!
//! They share `scatter_add_`'s checks (the index is read to the host and
//! every value checked before anything is written), and are compositions
//! of device ops rather than new kernels: since the indices are on the host
//! already, where each element lands is worked out there, once, as a mask
//! of the destination's written positions (and, for `scatter`, which
//! element of `src` each one receives); the device then selects with
//! `where_cond`. That costs a mask (and an `i64` map) of the destination's
//! size, and makes `scatter`'s choice among repeated indices deterministic
//! on every device: the last one in the index's row-major order wins
//! (PyTorch leaves it unspecified).

use crate::error::{Result, TensorError};
use crate::ops::common::{expect_dtype, same_device};
use crate::ops::index::{check_scatter, index_error, index_values, Scatter};
use crate::shape::{resolve_dim, DimIndex};
use crate::tensor::Tensor;
use crate::DType;
use brasa_kernels::index::check_indices;

/// How `scatter_reduce` combines the values that land on one element
/// (PyTorch's `reduce` argument). More reductions may be added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ScatterReduce {
    /// The sum (`reduce="sum"`): with `include_self` the same as
    /// `scatter_add`; without, the written elements start from zero.
    Sum,
}

/// `dims` as a reshape's argument.
fn signed(dims: &[usize]) -> Vec<isize> {
    dims.iter().map(|&d| d as isize).collect()
}

/// The row-major strides of a contiguous tensor of `dims`.
fn contiguous_strides(dims: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; dims.len()];
    for axis in (0..dims.len().saturating_sub(1)).rev() {
        strides[axis] = strides[axis + 1] * dims[axis + 1];
    }
    strides
}

impl Scatter {
    /// Where each index element lands: a flat row-major position in the
    /// destination, in the index's row-major order.
    fn destinations(&self) -> Vec<usize> {
        let index_dims = self.index.dims();
        let strides = contiguous_strides(self.x.dims());
        let mut coords = vec![0usize; index_dims.len()];
        let mut out = Vec::with_capacity(self.ids.len());
        for &id in &self.ids {
            // `id` was checked to be within `0..size`.
            let at = usize::try_from(id).unwrap_or(0);
            let flat = coords
                .iter()
                .zip(&strides)
                .enumerate()
                .map(|(axis, (&c, &s))| if axis == self.dim { at * s } else { c * s })
                .sum();
            out.push(flat);
            // The next coordinates over the index's shape.
            for (c, &size) in coords.iter_mut().zip(index_dims).rev() {
                *c += 1;
                if *c < size {
                    break;
                }
                *c = 0;
            }
        }
        out
    }

    /// A bool tensor of the destination's shape, true where an index
    /// points, and for each destination element the position (in the
    /// index's row-major order) of the last index element landing there.
    fn written(&self) -> Result<(Tensor, Vec<i64>)> {
        let n = self.x.numel();
        let (mut hit, mut from) = (vec![false; n], vec![0i64; n]);
        for (p, d) in self.destinations().into_iter().enumerate() {
            if let (Some(h), Some(f)) = (hit.get_mut(d), from.get_mut(d)) {
                *h = true;
                *f = p as i64;
            }
        }
        let mask = Tensor::from_vec_on(hit, self.x.shape().clone(), self.x.device())?;
        Ok((mask, from))
    }

    /// The destination's values with the written elements replaced by
    /// `src`'s (the last of repeated ones): a new tensor.
    fn overwritten(&self, op: &'static str) -> Result<Tensor> {
        let Some(src) = &self.src else {
            return Err(TensorError::internal(op, "a scatter without src"));
        };
        if self.ids.is_empty() {
            return self.x.copy_to(self.x.device(), self.x.dtype());
        }
        let (mask, from) = self.written()?;
        let from = Tensor::from_vec_on(from, [self.x.numel()], self.x.device())?;
        let picked = src.contiguous()?.reshape(&[-1])?.index_select(0, &from)?.reshape(&signed(self.x.dims()))?;
        mask.where_cond(&picked, &self.x)
    }

    /// The destination's values with the written elements set to `value`: a
    /// new tensor.
    fn filled(&self, value: f64) -> Result<Tensor> {
        let (mask, _) = self.written()?;
        let value = Tensor::full_on([], value, self.x.dtype(), self.x.device())?;
        mask.where_cond(&value, &self.x)
    }

    /// `scatter_reduce` into a new tensor of the destination's (at least
    /// 1-d) shape.
    fn reduced(&self, op: &'static str, reduce: ScatterReduce, include_self: bool) -> Result<Tensor> {
        match reduce {
            ScatterReduce::Sum => {
                let out =
                    if include_self { self.x.copy_to(self.x.device(), self.x.dtype())? } else { self.filled(0.0)? };
                self.add_into(op, &out)?;
                Ok(out)
            }
        }
    }
}

impl Tensor {
    /// PyTorch's `scatter` (`src` form) without modifying this tensor: a
    /// copy with `self[i][index[i][j][k]][k] = src[i][j][k]` (for `dim ==
    /// 1`, and so on). See [`Tensor::scatter_`].
    ///
    /// ```
    /// use brasa_tensor::Tensor;
    /// let x = Tensor::zeros([2, 3], brasa_tensor::DType::F32)?;
    /// let index = Tensor::from_vec(vec![2i64, 0], [2, 1])?;
    /// let src = Tensor::from_vec(vec![1f32, 2.0], [2, 1])?;
    /// assert_eq!(x.scatter(1, &index, &src)?.to_vec::<f32>()?, [0.0, 0.0, 1.0, 2.0, 0.0, 0.0]);
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn scatter(&self, dim: impl DimIndex, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        const OP: &str = "scatter";
        let _range = brasa_profile::record_op(OP, &[self.dims(), index.dims(), src.dims()]);
        let s = check_scatter(OP, self, dim, index, Some(src), true)?;
        s.overwritten(OP)?.reshape(&signed(self.dims()))
    }

    /// Writes `src[i][j][k]` to `self[i][index[i][j][k]][k]` (for `dim ==
    /// 1`, and so on), in place. `index` (`i64`) and `src` (this tensor's
    /// dtype) follow [`Tensor::scatter_add_`]'s shape rules. Where indices
    /// repeat, the last one in the index's row-major order wins, on every
    /// device (PyTorch leaves the winner unspecified). Elements no index
    /// points at keep their values.
    pub fn scatter_(&self, dim: impl DimIndex, index: &Tensor, src: &Tensor) -> Result<()> {
        const OP: &str = "scatter_";
        let s = check_scatter(OP, self, dim, index, Some(src), true)?;
        s.x.check_writable(OP)?;
        let out = s.overwritten(OP)?;
        s.x.copy_(&out)
    }

    /// PyTorch's `scatter` of one value without modifying this tensor: a
    /// copy with `value` at every `[i][index[i][j][k]][k]` (for `dim == 1`).
    /// `value` is converted to this tensor's dtype as [`Tensor::full_on`]
    /// does. See [`Tensor::scatter_value_`].
    pub fn scatter_value(&self, dim: impl DimIndex, index: &Tensor, value: f64) -> Result<Tensor> {
        const OP: &str = "scatter_value";
        let s = check_scatter(OP, self, dim, index, None, true)?;
        s.filled(value)?.reshape(&signed(self.dims()))
    }

    /// Sets `self[i][index[i][j][k]][k] = value` (for `dim == 1`, and so
    /// on), in place. `index` is `i64` with this tensor's rank, at most its
    /// size in every dim but `dim`.
    pub fn scatter_value_(&self, dim: impl DimIndex, index: &Tensor, value: f64) -> Result<()> {
        const OP: &str = "scatter_value_";
        let s = check_scatter(OP, self, dim, index, None, true)?;
        s.x.check_writable(OP)?;
        let out = s.filled(value)?;
        s.x.copy_(&out)
    }

    /// PyTorch's `scatter_reduce` without modifying this tensor. See
    /// [`Tensor::scatter_reduce_`].
    ///
    /// ```
    /// use brasa_tensor::{ScatterReduce, Tensor};
    /// let x = Tensor::from_vec(vec![10f32, 20.0, 30.0], [3])?;
    /// let index = Tensor::from_vec(vec![0i64, 0, 2], [3])?;
    /// let src = Tensor::from_vec(vec![1f32, 2.0, 3.0], [3])?;
    /// let with = x.scatter_reduce(0, &index, &src, ScatterReduce::Sum, true)?;
    /// assert_eq!(with.to_vec::<f32>()?, [13.0, 20.0, 33.0]);
    /// let without = x.scatter_reduce(0, &index, &src, ScatterReduce::Sum, false)?;
    /// assert_eq!(without.to_vec::<f32>()?, [3.0, 20.0, 3.0]);
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn scatter_reduce(
        &self,
        dim: impl DimIndex,
        index: &Tensor,
        src: &Tensor,
        reduce: ScatterReduce,
        include_self: bool,
    ) -> Result<Tensor> {
        const OP: &str = "scatter_reduce";
        let _range = brasa_profile::record_op(OP, &[self.dims(), index.dims(), src.dims()]);
        let s = check_scatter(OP, self, dim, index, Some(src), true)?;
        s.reduced(OP, reduce, include_self)?.reshape(&signed(self.dims()))
    }

    /// Reduces `src[i][j][k]` into `self[i][index[i][j][k]][k]` (for `dim
    /// == 1`, and so on) with `reduce`, in place. With `include_self` the
    /// element's own value takes part; without, only the values scattered
    /// to it do (elements no index points at keep their values either way).
    /// Shapes and dtypes as [`Tensor::scatter_add_`].
    pub fn scatter_reduce_(
        &self,
        dim: impl DimIndex,
        index: &Tensor,
        src: &Tensor,
        reduce: ScatterReduce,
        include_self: bool,
    ) -> Result<()> {
        const OP: &str = "scatter_reduce_";
        let s = check_scatter(OP, self, dim, index, Some(src), true)?;
        s.x.check_writable(OP)?;
        match reduce {
            ScatterReduce::Sum if include_self => s.add_into(OP, &s.x),
            _ => {
                let out = s.reduced(OP, reduce, include_self)?;
                s.x.copy_(&out)
            }
        }
    }

    /// PyTorch's `index_add` without modifying this tensor. See
    /// [`Tensor::index_add_`].
    ///
    /// ```
    /// use brasa_tensor::{DType, Tensor};
    /// let x = Tensor::zeros([3, 2], DType::F32)?;
    /// let index = Tensor::from_vec(vec![2i64, 0, 2], [3])?;
    /// let source = Tensor::ones([3, 2], DType::F32)?;
    /// let out = x.index_add(0, &index, &source, 0.5)?;
    /// assert_eq!(out.to_vec::<f32>()?, [0.5, 0.5, 0.0, 0.0, 1.0, 1.0]);
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn index_add(&self, dim: impl DimIndex, index: &Tensor, source: &Tensor, alpha: f64) -> Result<Tensor> {
        let out = self.copy_to(self.device(), self.dtype())?;
        out.index_add_(dim, index, source, alpha)?;
        Ok(out)
    }

    /// Adds `alpha · source[..., j, ...]` into `self[..., index[j], ...]`
    /// along `dim`, in place; repeated indices accumulate. `index` is a 0-d
    /// or 1-d `i64` tensor; `source` has this tensor's dtype and shape
    /// except in `dim`, where its size is the number of indices. For
    /// integer and bool tensors `alpha` must be a whole number (1 for bool),
    /// as in PyTorch.
    pub fn index_add_(&self, dim: impl DimIndex, index: &Tensor, source: &Tensor, alpha: f64) -> Result<()> {
        const OP: &str = "index_add_";
        let _range = brasa_profile::record_op(OP, &[self.dims(), index.dims(), source.dims()]);
        same_device(OP, &[self, index, source])?;
        expect_dtype(OP, index, DType::I64)?;
        expect_dtype(OP, source, self.dtype())?;
        if index.rank() > 1 {
            return Err(TensorError::shape(OP, format!("index must be 0-d or 1-d, got shape {:?}", index.dims())));
        }
        let whole = alpha.fract() == 0.0 && alpha.is_finite();
        if (self.dtype() == DType::Bool && alpha != 1.0) || (!self.dtype().is_float() && !whole) {
            return Err(TensorError::invalid(
                OP,
                format!("alpha {alpha} does not fit a {} tensor (integers need a whole alpha, bool 1)", self.dtype()),
            ));
        }
        // 0-d tensors are 1-d of size 1 here, as in PyTorch.
        let x = if self.rank() == 0 { self.unsqueeze(0)? } else { self.clone() };
        let source = if source.rank() == 0 { source.unsqueeze(0)? } else { source.clone() };
        let d = resolve_dim(dim, x.rank(), OP)?;
        let count = index.numel();
        let fits = source.rank() == x.rank()
            && source
                .dims()
                .iter()
                .zip(x.dims())
                .enumerate()
                .all(|(a, (&s, &n))| if a == d { s == count } else { s == n });
        if !fits {
            return Err(TensorError::shape(
                OP,
                format!(
                    "source has shape {:?} but self has shape {:?} and there are {count} indices; source needs \
                     self's shape with dim {d} of size {count}",
                    source.dims(),
                    x.dims()
                ),
            ));
        }
        // Checked here so that an error names the place in the 1-d index.
        let ids = index_values(OP, index)?;
        check_indices(&ids, x.dims()[d]).map_err(|e| index_error(OP, &format!("dim {d}"), &[ids.len()], e))?;
        // The index spread over source's shape: a scatter-add along `d`.
        let mut view = vec![1isize; source.rank()];
        view[d] = count as isize;
        let spread = index.reshape(&view)?.broadcast_as(source.shape().clone())?.contiguous()?;
        let source = if alpha == 1.0 { source } else { source.mul_scalar(alpha)? };
        let s = check_scatter(OP, &x, d, &spread, Some(&source), true)?;
        s.x.check_writable(OP)?;
        s.add_into(OP, &s.x)
    }
}
