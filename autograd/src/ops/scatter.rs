//! Differentiable scatters: `scatter_add`, `scatter` (overwrite),
//! `scatter_reduce` (sum) and `index_add`, with PyTorch's derivatives
//! (`derivatives.yaml`):
//!
//! - `scatter_add`, `scatter_reduce` sum with `include_self`: the self
//!   gradient is the output's, `src`'s is `g.gather(dim, index)`;
//! - `scatter`, `scatter_reduce` sum without `include_self`: the same, but
//!   the self gradient is zero where the output was written (self's value
//!   did not reach it). As in PyTorch, every `src` element gets its
//!   gathered gradient, also one whose repeated index lost the overwrite;
//! - `index_add`: the self gradient is the output's, `source`'s is
//!   `alpha · g.index_select(dim, index)`.
//!
//! A `src` larger than the index gets a zero gradient outside the part the
//! index covers (that part was never read).

use crate::error::Result;
use crate::var::{record, Var};
use brasa_tensor::{resolve_dim, ScatterReduce, Tensor, TensorError};

/// `g.gather(dim, index)` grown with zeros to `src_dims` (the index may
/// cover only a leading part of `src`).
fn gathered(g: &Tensor, dim: usize, index: &Tensor, src_dims: &[usize]) -> Result<Tensor> {
    let part = g.contiguous()?.gather(dim, index)?;
    if part.dims() == src_dims {
        return Ok(part);
    }
    let full = part.new_zeros(src_dims.to_vec())?;
    let mut region = full.clone();
    for (axis, &size) in part.dims().iter().enumerate() {
        region = region.narrow(axis, 0, size)?;
    }
    region.copy_(&part)?;
    Ok(full)
}

/// Records a scatter of `src` into `self` whose forward made `out`; with
/// `keeps_self` the self gradient is the output's, otherwise it is zero
/// where an index points.
fn record_scatter(
    name: &'static str,
    x: &Var,
    dim: usize,
    index: &Tensor,
    src: &Var,
    out: Tensor,
    keeps_self: bool,
) -> Var {
    let src_dims = src.dims().to_vec();
    let index = index.clone();
    record(
        name,
        &[x, src],
        out,
        || vec![index],
        move |c| {
            let index = &c.saved[0];
            let g_self = match (c.needs(0), keeps_self) {
                (false, _) => None,
                (true, true) => Some(c.grad.clone()),
                (true, false) => Some(c.grad.scatter_value(dim, index, 0.0)?),
            };
            let g_src = if c.needs(1) { Some(gathered(c.grad, dim, index, &src_dims)?) } else { None };
            Ok(vec![g_self, g_src])
        },
    )
}

/// `dim` resolved against `x`'s rank (a 0-d tensor counts as 1-d here).
fn scatter_dim(op: &'static str, x: &Var, dim: isize) -> Result<usize> {
    Ok(resolve_dim(dim, x.rank().max(1), op).map_err(TensorError::from)?)
}

impl Var {
    /// PyTorch's `scatter_add` (see `Tensor::scatter_add_` for the shape
    /// rules): differentiable in `self` and `src`.
    ///
    /// ```
    /// use brasa_autograd::Var;
    /// use brasa_tensor::{DType, Tensor};
    /// let x = Var::param(Tensor::zeros([3], DType::F64)?)?;
    /// let src = Var::param(Tensor::from_vec(vec![1.0f64, 2.0, 3.0], [3])?)?;
    /// let index = Tensor::from_vec(vec![0i64, 0, 2], [3])?;
    /// let out = x.scatter_add(0, &index, &src)?;
    /// assert_eq!(out.tensor().to_vec::<f64>()?, [3.0, 0.0, 3.0]);
    /// out.mul(&Var::new(Tensor::from_vec(vec![1.0f64, 10.0, 100.0], [3])?))?.sum_all()?.backward()?;
    /// assert_eq!(src.grad().unwrap().to_vec::<f64>()?, [1.0, 1.0, 100.0]);
    /// # Ok::<(), brasa_autograd::AutogradError>(())
    /// ```
    pub fn scatter_add(&self, dim: isize, index: &Tensor, src: &Var) -> Result<Var> {
        let d = scatter_dim("scatter_add", self, dim)?;
        let out = self.tensor().scatter_add(d, index, src.tensor())?;
        Ok(record_scatter("scatter_add", self, d, index, src, out, true))
    }

    /// PyTorch's `scatter` from `src` (overwrite; the last of repeated
    /// indices wins, see `Tensor::scatter_`): differentiable in `self`
    /// (zero gradient where overwritten) and `src`.
    pub fn scatter(&self, dim: isize, index: &Tensor, src: &Var) -> Result<Var> {
        let d = scatter_dim("scatter", self, dim)?;
        let out = self.tensor().scatter(d, index, src.tensor())?;
        Ok(record_scatter("scatter", self, d, index, src, out, false))
    }

    /// PyTorch's `scatter_reduce` (see `Tensor::scatter_reduce_`):
    /// differentiable in `self` and `src`.
    pub fn scatter_reduce(
        &self,
        dim: isize,
        index: &Tensor,
        src: &Var,
        reduce: ScatterReduce,
        include_self: bool,
    ) -> Result<Var> {
        let d = scatter_dim("scatter_reduce", self, dim)?;
        let out = self.tensor().scatter_reduce(d, index, src.tensor(), reduce, include_self)?;
        Ok(record_scatter("scatter_reduce", self, d, index, src, out, include_self))
    }

    /// PyTorch's `index_add`: `alpha · source[..., j, ...]` added into
    /// `self[..., index[j], ...]` along `dim` (see `Tensor::index_add_`);
    /// differentiable in `self` and `source`.
    ///
    /// ```
    /// use brasa_autograd::Var;
    /// use brasa_tensor::{DType, Tensor};
    /// let x = Var::param(Tensor::zeros([2, 2], DType::F64)?)?;
    /// let source = Var::param(Tensor::ones([3, 2], DType::F64)?)?;
    /// let index = Tensor::from_vec(vec![1i64, 1, 0], [3])?;
    /// let out = x.index_add(0, &index, &source, 2.0)?;
    /// assert_eq!(out.tensor().to_vec::<f64>()?, [2.0, 2.0, 4.0, 4.0]);
    /// out.sum_all()?.backward()?;
    /// assert_eq!(source.grad().unwrap().to_vec::<f64>()?, [2.0; 6]);
    /// # Ok::<(), brasa_autograd::AutogradError>(())
    /// ```
    pub fn index_add(&self, dim: isize, index: &Tensor, source: &Var, alpha: f64) -> Result<Var> {
        let d = scatter_dim("index_add", self, dim)?;
        let out = self.tensor().index_add(d, index, source.tensor(), alpha)?;
        let source_dims: Vec<isize> = source.dims().iter().map(|&s| s as isize).collect();
        let index = index.clone();
        Ok(record(
            "index_add",
            &[self, source],
            out,
            || vec![index],
            move |c| {
                let g_self = if c.needs(0) { Some(c.grad.clone()) } else { None };
                let g_source = if c.needs(1) {
                    let picked = c.grad.index_select(d, &c.saved[0])?.reshape(&source_dims)?;
                    Some(if alpha == 1.0 { picked } else { picked.mul_scalar(alpha)? })
                } else {
                    None
                };
                Ok(vec![g_self, g_source])
            },
        ))
    }
}
