//! 2-d transposed convolution ([`Var::conv_transpose2d`]) through
//! brasa-tensor's transposed-convolution gradients for input and weight and
//! the convolution's bias gradient (a sum over N, H and W).

use super::conv::dense_grad;
use crate::error::Result;
use crate::op_names;
use crate::precision::autocast_inputs;
use crate::var::{record, Var};
use brasa_tensor::ConvTranspose2dParams;

impl Var {
    /// `conv_transpose2d` (PyTorch's) of this `[N, C_in, H, W]` (or
    /// unbatched `[C_in, H, W]`) input with `weight` `[C_in, C_out / groups,
    /// kH, kW]` and an optional `bias` `[C_out]`; see
    /// [`brasa_tensor::Tensor::conv_transpose2d`]. Under autocast it runs in
    /// the low dtype, as PyTorch's does.
    pub fn conv_transpose2d(&self, weight: &Var, bias: Option<&Var>, params: ConvTranspose2dParams) -> Result<Var> {
        let inputs: Vec<&Var> = [self, weight].into_iter().chain(bias).collect();
        if let Some(c) = autocast_inputs(op_names::CONV_TRANSPOSE2D, &inputs)? {
            return c[0].conv_transpose2d(&c[1], c.get(2), params);
        }
        // The gradients are written for a batch: an unbatched input is a
        // batch of one, as a view.
        if self.rank() == 3 {
            return self.unsqueeze(0usize)?.conv_transpose2d(weight, bias, params)?.squeeze(0usize);
        }
        let out = self.tensor().conv_transpose2d(weight.tensor(), bias.map(|b| b.tensor()), params)?;
        let (x_shape, w_shape) = (self.dims().to_vec(), weight.dims().to_vec());
        let saved = || vec![self.tensor().clone(), weight.tensor().clone()];
        Ok(record("conv_transpose2d", &inputs, out, saved, move |c| {
            let (x, w) = (&c.saved[0], &c.saved[1]);
            let g = dense_grad(c.grad)?;
            let mut grads = vec![
                c.needs(0).then(|| g.conv_transpose2d_backward_input(w, x_shape.clone(), params)).transpose()?,
                c.needs(1).then(|| x.conv_transpose2d_backward_weight(&g, w_shape.clone(), params)).transpose()?,
            ];
            if c.needs.len() > 2 {
                grads.push(c.needs(2).then(|| g.conv2d_backward_bias()).transpose()?);
            }
            Ok(grads)
        }))
    }
}
