//! Views: the forward shares storage, the backward maps the gradient back
//! to the input's shape (a view where possible; for narrow, slice and
//! select the engine places it in the input's gradient, `view_region.rs`).

use super::sum_to;
use crate::error::Result;
use crate::var::{record, record_view, Var};
use crate::view_region::ViewRegion;
use brasa_tensor::{resolve_dim, DimIndex, Shape, TensorError};

fn to_isize(dims: &[usize]) -> Vec<isize> {
    dims.iter().map(|&d| d as isize).collect()
}

impl Var {
    fn reshaped_as(&self, name: &'static str, out: brasa_tensor::Tensor) -> Var {
        let back = to_isize(self.dims());
        record(name, &[self], out, Vec::new, move |c| Ok(vec![Some(c.grad.reshape(&back)?)]))
    }

    /// The same elements in another shape (one dim may be -1).
    pub fn reshape(&self, shape: &[isize]) -> Result<Var> {
        let out = self.tensor().reshape(shape)?;
        Ok(self.reshaped_as("reshape", out))
    }

    /// Like [`Var::reshape`] but an error when a view is impossible.
    pub fn view(&self, shape: &[isize]) -> Result<Var> {
        let out = self.tensor().view(shape)?;
        Ok(self.reshaped_as("view", out))
    }

    /// Flattens dims `start..=end` into one.
    pub fn flatten(&self, start: impl DimIndex, end: impl DimIndex) -> Result<Var> {
        let out = self.tensor().flatten(start, end)?;
        Ok(self.reshaped_as("flatten", out))
    }

    /// Removes a dim of size 1.
    pub fn squeeze(&self, dim: impl DimIndex) -> Result<Var> {
        let out = self.tensor().squeeze(dim)?;
        Ok(self.reshaped_as("squeeze", out))
    }

    /// Inserts a dim of size 1.
    pub fn unsqueeze(&self, dim: impl DimIndex) -> Result<Var> {
        let out = self.tensor().unsqueeze(dim)?;
        Ok(self.reshaped_as("unsqueeze", out))
    }

    /// Swaps two dims.
    pub fn transpose(&self, dim0: impl DimIndex, dim1: impl DimIndex) -> Result<Var> {
        let rank = self.rank();
        let d0 = resolve_dim(dim0, rank, "transpose").map_err(TensorError::from)?;
        let d1 = resolve_dim(dim1, rank, "transpose").map_err(TensorError::from)?;
        let out = self.tensor().transpose(d0, d1)?;
        Ok(record("transpose", &[self], out, Vec::new, move |c| Ok(vec![Some(c.grad.transpose(d0, d1)?)])))
    }

    /// The transpose of a matrix.
    pub fn t(&self) -> Result<Var> {
        let out = self.tensor().t()?;
        Ok(record("t", &[self], out, Vec::new, |c| Ok(vec![Some(c.grad.t()?)])))
    }

    /// Reorders the dims.
    pub fn permute(&self, order: &[usize]) -> Result<Var> {
        let out = self.tensor().permute(order)?;
        let mut inverse = vec![0; order.len()];
        for (i, &o) in order.iter().enumerate() {
            inverse[o] = i;
        }
        Ok(record("permute", &[self], out, Vec::new, move |c| Ok(vec![Some(c.grad.permute(&inverse)?)])))
    }

    /// `len` elements of `dim` from `start`.
    pub fn narrow(&self, dim: impl DimIndex, start: usize, len: usize) -> Result<Var> {
        let d = resolve_dim(dim, self.rank(), "narrow").map_err(TensorError::from)?;
        let out = self.tensor().narrow(d, start, len)?;
        Ok(record_view("narrow", self, out, ViewRegion::Narrow { dim: d, start, len }))
    }

    /// Every `step`-th element of `dim` in `start..end` (Python's
    /// `x[start:end:step]`, a view; see [`brasa_tensor::Tensor::slice`]). The gradient is
    /// zero outside the selected elements.
    ///
    /// ```
    /// use brasa_autograd::Var;
    /// use brasa_tensor::{DType, Tensor};
    /// let x = Var::param(Tensor::arange(0.0, 6.0, 1.0, DType::F64)?)?;
    /// x.slice(0, 0, 6, 3)?.sum_all()?.backward()?;
    /// let grad = x.grad().map(|g| g.to_vec::<f64>()).transpose()?;
    /// assert_eq!(grad, Some(vec![1.0, 0.0, 0.0, 1.0, 0.0, 0.0]));
    /// # Ok::<(), brasa_autograd::AutogradError>(())
    /// ```
    pub fn slice(&self, dim: impl DimIndex, start: usize, end: usize, step: usize) -> Result<Var> {
        let d = resolve_dim(dim, self.rank(), "slice").map_err(TensorError::from)?;
        let out = self.tensor().slice(d, start, end, step)?;
        Ok(record_view("slice", self, out, ViewRegion::Slice { dim: d, start, end, step }))
    }

    /// Index `index` of `dim`, removing the dim.
    pub fn select(&self, dim: impl DimIndex, index: usize) -> Result<Var> {
        let d = resolve_dim(dim, self.rank(), "select").map_err(TensorError::from)?;
        let out = self.tensor().select(d, index)?;
        Ok(record_view("select", self, out, ViewRegion::Select { dim: d, index }))
    }

    /// Broadcasts to `shape` (a view); the gradient is summed back.
    pub fn expand(&self, shape: impl Into<Shape>) -> Result<Var> {
        let out = self.tensor().broadcast_as(shape)?;
        let (dims, dtype) = (self.dims().to_vec(), self.dtype());
        Ok(record("expand", &[self], out, Vec::new, move |c| Ok(vec![Some(sum_to(c.grad, &dims, dtype)?)])))
    }

    /// Alias of [`Var::expand`].
    pub fn broadcast_as(&self, shape: impl Into<Shape>) -> Result<Var> {
        self.expand(shape)
    }

    /// A contiguous copy (this storage when already contiguous).
    pub fn contiguous(&self) -> Result<Var> {
        let out = self.tensor().contiguous()?;
        Ok(record("contiguous", &[self], out, Vec::new, |c| Ok(vec![Some(c.grad.clone())])))
    }
}
