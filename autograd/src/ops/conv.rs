//! 2-d convolution through brasa-tensor's backward kernels for input,
//! weight and bias.

use crate::error::Result;
use crate::op_names;
use crate::precision::autocast_inputs;
use crate::var::{record, Var};
use brasa_tensor::{Conv2dParams, Tensor};

impl Var {
    /// `conv2d` of this `[N, C_in, H, W]` (or unbatched `[C_in, H, W]`)
    /// input with `weight` and an optional `bias`.
    pub fn conv2d(&self, weight: &Var, bias: Option<&Var>, params: Conv2dParams) -> Result<Var> {
        let inputs: Vec<&Var> = [self, weight].into_iter().chain(bias).collect();
        if let Some(c) = autocast_inputs(op_names::CONV2D, &inputs)? {
            return c[0].conv2d(&c[1], c.get(2), params);
        }
        // The gradients are written for a batch: an unbatched input is a
        // batch of one, as a view (else backward fails on the 3-d shape).
        if self.rank() == 3 {
            return self.unsqueeze(0usize)?.conv2d(weight, bias, params)?.squeeze(0usize);
        }
        let out = self.tensor().conv2d(weight.tensor(), bias.map(|b| b.tensor()), params)?;
        let (x_shape, w_shape) = (self.dims().to_vec(), weight.dims().to_vec());
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        let saved = || vec![self.tensor().clone(), weight.tensor().clone()];
        Ok(record("conv2d", &inputs, out, saved, move |c| {
            let (x, w) = (&c.saved[0], &c.saved[1]);
            let g = dense_grad(c.grad)?;
            let mut grads = vec![
                c.needs(0).then(|| g.conv2d_backward_input(w, x_shape.clone(), params)).transpose()?,
                c.needs(1).then(|| x.conv2d_backward_weight(&g, w_shape.clone(), params)).transpose()?,
            ];
            if c.needs.len() > 2 {
                grads.push(c.needs(2).then(|| g.conv2d_backward_bias()).transpose()?);
            }
            Ok(grads)
        }))
    }
}

/// The output gradient dense in its own memory format, as PyTorch's
/// `grad_output.contiguous(suggest_memory_format)`: a channels-last
/// gradient stays as it is (the devices' channels-last convolutions read it
/// in place), anything else not row-major becomes a row-major copy — once,
/// for both gradients.
pub(crate) fn dense_grad(g: &Tensor) -> Result<Tensor> {
    if g.is_contiguous() || g.is_channels_last() {
        Ok(g.clone())
    } else {
        Ok(g.contiguous()?)
    }
}
