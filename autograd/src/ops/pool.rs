//! Max and average pooling through brasa-tensor's pooling backward ops;
//! the `_with` variants take a [`Pool2dParams`] (with `ceil_mode`).

use crate::error::Result;
use crate::var::{record, Var};
use brasa_tensor::Pool2dParams;

impl Var {
    /// Max pooling over `[N, C, H, W]` (or `[C, H, W]`); the gradient goes to
    /// each window's maximum (the first on ties).
    pub fn max_pool2d(&self, kernel: (usize, usize), stride: (usize, usize), padding: (usize, usize)) -> Result<Var> {
        self.max_pool2d_with(Pool2dParams::new(kernel).with_stride(stride).with_padding(padding))
    }

    /// Max pooling with its window as [`Pool2dParams`] (see
    /// `Tensor::max_pool2d_with`); the gradient goes to each window's
    /// maximum (the first on ties).
    pub fn max_pool2d_with(&self, params: Pool2dParams) -> Result<Var> {
        let (out, indices) = self.tensor().max_pool2d_with(params)?;
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
        self.avg_pool2d_with(Pool2dParams::new(kernel).with_stride(stride).with_padding(padding), count_include_pad)
    }

    /// Average pooling with its window as [`Pool2dParams`] (see
    /// `Tensor::avg_pool2d_with`, `ceil_mode` included).
    pub fn avg_pool2d_with(&self, params: Pool2dParams, count_include_pad: bool) -> Result<Var> {
        let out = self.tensor().avg_pool2d_with(params, count_include_pad)?;
        let shape = self.dims().to_vec();
        Ok(record("avg_pool2d", &[self], out, Vec::new, move |c| {
            let g = c.grad.contiguous()?;
            Ok(vec![Some(g.avg_pool2d_backward_with(shape.clone(), params, count_include_pad)?)])
        }))
    }
}
