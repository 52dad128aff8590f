//! Reductions: sum, mean, variance, standard deviation, max and min. The
//! gradient of a reduced element is broadcast back over the dims it came from.

use super::mask_as;
use crate::error::Result;
use crate::op_names;
use crate::precision::autocast_inputs;
use crate::var::{record, Var};
use brasa_tensor::{resolve_dim, Tensor, TensorError};

/// The input's shape with the reduced dims (empty = all) set to 1, and the
/// number of elements reduced into each output.
fn kept_shape(dims: &[usize], reduce: &[isize], op: &'static str) -> Result<(Vec<isize>, usize)> {
    let rank = dims.len();
    let mut shape: Vec<isize> = dims.iter().map(|&d| d as isize).collect();
    let mut count = 1;
    if reduce.is_empty() {
        shape.iter_mut().for_each(|d| *d = 1);
        count = dims.iter().product();
    } else {
        for &d in reduce {
            let d = resolve_dim(d, rank, op).map_err(TensorError::from)?;
            count *= dims[d];
            shape[d] = 1;
        }
    }
    Ok((shape, count))
}

/// `grad` of a reduction output broadcast back to `dims`.
fn expand_back(grad: &Tensor, kept: &[isize], dims: &[usize]) -> Result<Tensor> {
    Ok(grad.reshape(kept)?.broadcast_as(dims)?)
}

impl Var {
    /// The sum over `dims` (empty = all), keeping reduced dims as size 1 with `keepdim`.
    pub fn sum(&self, dims: &[isize], keepdim: bool) -> Result<Var> {
        if let Some(c) = autocast_inputs(op_names::SUM, &[self])? {
            return c[0].sum(dims, keepdim);
        }
        let out = self.tensor().sum(dims, keepdim)?;
        let (kept, _) = kept_shape(self.dims(), dims, "sum")?;
        let (shape, dtype) = (self.dims().to_vec(), self.dtype());
        Ok(record("sum", &[self], out, Vec::new, move |c| {
            Ok(vec![Some(expand_back(&c.grad.to_dtype(dtype)?, &kept, &shape)?)])
        }))
    }

    /// The sum of every element, a 0-d `Var`.
    pub fn sum_all(&self) -> Result<Var> {
        if let Some(c) = autocast_inputs(op_names::SUM, &[self])? {
            return c[0].sum_all();
        }
        self.sum(&[], false)
    }

    /// The mean over `dims` (empty = all).
    pub fn mean(&self, dims: &[isize], keepdim: bool) -> Result<Var> {
        if let Some(c) = autocast_inputs(op_names::MEAN, &[self])? {
            return c[0].mean(dims, keepdim);
        }
        let out = self.tensor().mean(dims, keepdim)?;
        let (kept, count) = kept_shape(self.dims(), dims, "mean")?;
        let shape = self.dims().to_vec();
        Ok(record("mean", &[self], out, Vec::new, move |c| {
            Ok(vec![Some(expand_back(&c.grad.div_scalar(count as f64)?, &kept, &shape)?)])
        }))
    }

    /// The mean of every element, a 0-d `Var`.
    pub fn mean_all(&self) -> Result<Var> {
        if let Some(c) = autocast_inputs(op_names::MEAN, &[self])? {
            return c[0].mean_all();
        }
        self.mean(&[], false)
    }

    /// The variance over `dims` (empty = all) with `correction` (1: unbiased).
    pub fn var(&self, dims: &[isize], correction: usize, keepdim: bool) -> Result<Var> {
        if let Some(c) = autocast_inputs(op_names::VAR, &[self])? {
            return c[0].var(dims, correction, keepdim);
        }
        let out = self.tensor().var_with_correction(dims, correction, keepdim)?;
        let (kept, count) = kept_shape(self.dims(), dims, "var")?;
        let shape = self.dims().to_vec();
        let dims = dims.to_vec();
        Ok(record(
            "var",
            &[self],
            out,
            || vec![self.tensor().clone()],
            move |c| {
                let x = &c.saved[0];
                let centered = x.sub(&x.mean(&dims, true)?)?;
                let scale = 2.0 / (count as f64 - correction as f64);
                let g = expand_back(c.grad, &kept, &shape)?;
                Ok(vec![Some(g.mul(&centered)?.mul_scalar(scale)?)])
            },
        ))
    }

    /// The standard deviation over `dims` (empty = all) with `correction`.
    pub fn std(&self, dims: &[isize], correction: usize, keepdim: bool) -> Result<Var> {
        if let Some(c) = autocast_inputs(op_names::STD, &[self])? {
            return c[0].std(dims, correction, keepdim);
        }
        self.var(dims, correction, keepdim)?.sqrt()
    }

    /// The largest value over `dims` (empty = all); the gradient is shared
    /// evenly between tied maxima (PyTorch's `amax`).
    pub fn max(&self, dims: &[isize], keepdim: bool) -> Result<Var> {
        self.extreme_reduce(dims, keepdim, true)
    }

    /// The smallest value over `dims` (empty = all); ties share the gradient.
    pub fn min(&self, dims: &[isize], keepdim: bool) -> Result<Var> {
        self.extreme_reduce(dims, keepdim, false)
    }

    fn extreme_reduce(&self, dims: &[isize], keepdim: bool, max: bool) -> Result<Var> {
        let out = if max { self.tensor().max(dims, keepdim)? } else { self.tensor().min(dims, keepdim)? };
        let (kept, _) = kept_shape(self.dims(), dims, "max")?;
        let shape = self.dims().to_vec();
        let reduce = dims.to_vec();
        let keep = out.clone();
        Ok(record(
            if max { "max" } else { "min" },
            &[self],
            out,
            || vec![self.tensor().clone(), keep],
            move |c| {
                let (x, y) = (&c.saved[0], &c.saved[1]);
                let hit = mask_as(&x.eq(&expand_back(y, &kept, &shape)?)?, x.dtype())?;
                let count = hit.sum(&reduce, true)?;
                let g = expand_back(c.grad, &kept, &shape)?;
                Ok(vec![Some(g.mul(&hit)?.div(&count)?)])
            },
        ))
    }
}
