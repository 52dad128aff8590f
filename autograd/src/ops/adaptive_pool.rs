//! Adaptive average and max pooling (PyTorch's `adaptive_avg_pool2d` and
//! `adaptive_max_pool2d`) through brasa-tensor's adaptive ops: the average's
//! gradient is `Tensor::adaptive_avg_pool2d_backward`, the maximum's is
//! `Tensor::max_pool2d_backward` with the indices of the forward pass (they
//! name input positions the same way).

use crate::error::Result;
use crate::var::{record, Var};
use brasa_tensor::Tensor;

impl Var {
    /// Adaptive average pooling of `[N, C, H, W]` (or `[C, H, W]`) to
    /// `output_size` (height, width), with PyTorch's unequal, overlapping
    /// windows (see `Tensor::adaptive_avg_pool2d`).
    ///
    /// The gradient of a channels-last input is channels-last (PyTorch's
    /// rule: the input's memory format): the gradient of a channels-last
    /// network's global pooling then keeps the whole backward channels-last.
    pub fn adaptive_avg_pool2d(&self, output_size: (usize, usize)) -> Result<Var> {
        let out = self.tensor().adaptive_avg_pool2d(output_size)?;
        let shape = self.dims().to_vec();
        let x = self.tensor();
        let channels_last = !x.is_contiguous() && x.is_channels_last();
        Ok(record("adaptive_avg_pool2d", &[self], out, Vec::new, move |c| {
            let g = c.grad.adaptive_avg_pool2d_backward(shape.clone())?;
            Ok(vec![Some(if channels_last { g.to_channels_last()? } else { g })])
        }))
    }

    /// Adaptive max pooling of `[N, C, H, W]` (or `[C, H, W]`) to
    /// `output_size`: the maxima (recorded; the gradient goes to each
    /// window's maximum, the first on ties) and, as a plain i64 tensor, their
    /// flat indices `h·W + w` in the input plane (see
    /// `Tensor::adaptive_max_pool2d`).
    pub fn adaptive_max_pool2d(&self, output_size: (usize, usize)) -> Result<(Var, Tensor)> {
        let (out, indices) = self.tensor().adaptive_max_pool2d(output_size)?;
        let shape = self.dims().to_vec();
        let saved = indices.clone();
        let values = record(
            "adaptive_max_pool2d",
            &[self],
            out,
            || vec![saved],
            move |c| Ok(vec![Some(c.grad.contiguous()?.max_pool2d_backward(&c.saved[0], shape.clone())?)]),
        );
        Ok((values, indices))
    }
}
