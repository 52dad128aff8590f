//! 1-d convolutions, [`Var::conv1d`] and [`Var::conv_transpose1d`]: each
//! one node whose gradients are the 2-d ones on `[N, C, 1, L]` views of
//! the saved tensors and the output gradient (brasa-tensor runs the 1-d
//! ops that way too).

use crate::error::Result;
use crate::op_names;
use crate::precision::autocast_inputs;
use crate::var::{record, Var};
use brasa_tensor::{Conv1dParams, ConvTranspose1dParams, Tensor};

/// `t` as `[.., .., 1, L]`.
fn unit_height(t: &Tensor) -> Result<Tensor> {
    Ok(t.unsqueeze(2usize)?)
}

/// A 2-d gradient `[.., .., 1, L]` back to `[.., .., L]`.
fn drop_height(t: Tensor) -> Result<Tensor> {
    Ok(t.squeeze(2usize)?)
}

/// `[a, b, L]` as `[a, b, 1, L]`.
fn with_unit_height(dims: &[usize]) -> Vec<usize> {
    let mut dims = dims.to_vec();
    dims.insert(2.min(dims.len()), 1);
    dims
}

impl Var {
    /// `conv1d` (PyTorch's) of this `[N, C_in, L]` (or unbatched `[C_in,
    /// L]`) input with `weight` `[C_out, C_in / groups, k]` and an optional
    /// `bias` `[C_out]`; see [`brasa_tensor::Tensor::conv1d`]. Under
    /// autocast it runs in the low dtype, as PyTorch's does.
    pub fn conv1d(&self, weight: &Var, bias: Option<&Var>, params: Conv1dParams) -> Result<Var> {
        let inputs: Vec<&Var> = [self, weight].into_iter().chain(bias).collect();
        if let Some(c) = autocast_inputs(op_names::CONV1D, &inputs)? {
            return c[0].conv1d(&c[1], c.get(2), params);
        }
        if self.rank() == 2 {
            return self.unsqueeze(0usize)?.conv1d(weight, bias, params)?.squeeze(0usize);
        }
        let out = self.tensor().conv1d(weight.tensor(), bias.map(|b| b.tensor()), params)?;
        let (x_shape, w_shape) = (with_unit_height(self.dims()), with_unit_height(weight.dims()));
        let params = params.as_2d();
        let saved = || vec![self.tensor().clone(), weight.tensor().clone()];
        Ok(record("conv1d", &inputs, out, saved, move |c| {
            let (x, w) = (unit_height(&c.saved[0])?, unit_height(&c.saved[1])?);
            let g = unit_height(&c.grad.contiguous()?)?;
            let mut grads = vec![
                c.needs(0).then(|| drop_height(g.conv2d_backward_input(&w, x_shape.clone(), params)?)).transpose()?,
                c.needs(1).then(|| drop_height(x.conv2d_backward_weight(&g, w_shape.clone(), params)?)).transpose()?,
            ];
            if c.needs.len() > 2 {
                grads.push(c.needs(2).then(|| g.conv2d_backward_bias()).transpose()?);
            }
            Ok(grads)
        }))
    }

    /// `conv_transpose1d` (PyTorch's) of this `[N, C_in, L]` (or unbatched
    /// `[C_in, L]`) input with `weight` `[C_in, C_out / groups, k]` and an
    /// optional `bias` `[C_out]`; see
    /// [`brasa_tensor::Tensor::conv_transpose1d`]. Under autocast it runs
    /// in the low dtype, as PyTorch's does.
    pub fn conv_transpose1d(&self, weight: &Var, bias: Option<&Var>, params: ConvTranspose1dParams) -> Result<Var> {
        let inputs: Vec<&Var> = [self, weight].into_iter().chain(bias).collect();
        if let Some(c) = autocast_inputs(op_names::CONV_TRANSPOSE1D, &inputs)? {
            return c[0].conv_transpose1d(&c[1], c.get(2), params);
        }
        if self.rank() == 2 {
            return self.unsqueeze(0usize)?.conv_transpose1d(weight, bias, params)?.squeeze(0usize);
        }
        let out = self.tensor().conv_transpose1d(weight.tensor(), bias.map(|b| b.tensor()), params)?;
        let (x_shape, w_shape) = (with_unit_height(self.dims()), with_unit_height(weight.dims()));
        let params = params.as_2d();
        let saved = || vec![self.tensor().clone(), weight.tensor().clone()];
        Ok(record("conv_transpose1d", &inputs, out, saved, move |c| {
            let (x, w) = (unit_height(&c.saved[0])?, unit_height(&c.saved[1])?);
            let g = unit_height(&c.grad.contiguous()?)?;
            let mut grads = vec![
                c.needs(0)
                    .then(|| drop_height(g.conv_transpose2d_backward_input(&w, x_shape.clone(), params)?))
                    .transpose()?,
                c.needs(1)
                    .then(|| drop_height(x.conv_transpose2d_backward_weight(&g, w_shape.clone(), params)?))
                    .transpose()?,
            ];
            if c.needs.len() > 2 {
                grads.push(c.needs(2).then(|| g.conv2d_backward_bias()).transpose()?);
            }
            Ok(grads)
        }))
    }
}
