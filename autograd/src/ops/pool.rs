//! Max and average pooling through brasa-tensor's pooling backward ops.

use crate::error::Result;
use crate::var::{record, Var};

impl Var {
    /// Max pooling over `[N, C, H, W]` (or `[C, H, W]`); the gradient goes to
    /// each window's maximum (the first on ties).
    pub fn max_pool2d(&self, kernel: (usize, usize), stride: (usize, usize), padding: (usize, usize)) -> Result<Var> {
        let (out, indices) = self.tensor().max_pool2d(kernel, stride, padding)?;
        let shape = self.dims().to_vec();
        Ok(record(
            "max_pool2d",
            &[self],
            out,
            || vec![indices],
            move |c| Ok(vec![Some(c.grad.contiguous()?.max_pool2d_backward(&c.saved[0], shape.clone())?)]),
        ))
    }

    /// Average pooling (see `Tensor::avg_pool2d`).
    pub fn avg_pool2d(
        &self,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
        count_include_pad: bool,
    ) -> Result<Var> {
        let out = self.tensor().avg_pool2d(kernel, stride, padding, count_include_pad)?;
        let shape = self.dims().to_vec();
        Ok(record("avg_pool2d", &[self], out, Vec::new, move |c| {
            let g = c.grad.contiguous()?;
            Ok(vec![Some(g.avg_pool2d_backward(shape.clone(), kernel, stride, padding, count_include_pad)?)])
        }))
    }
}
