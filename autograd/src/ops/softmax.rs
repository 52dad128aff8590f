//! Softmax and log-softmax along a dim, differentiated from their outputs.

use crate::error::Result;
use crate::op_names;
use crate::precision::autocast_inputs;
use crate::var::{record, Var};
use brasa_tensor::{resolve_dim, TensorError};

impl Var {
    /// Softmax along `dim`: `dx = y (g - Σ g y)`.
    pub fn softmax(&self, dim: isize) -> Result<Var> {
        if let Some(c) = autocast_inputs(op_names::SOFTMAX, &[self])? {
            return c[0].softmax(dim);
        }
        let out = self.tensor().softmax(dim)?;
        let d = resolve_dim(dim, self.rank().max(1), "softmax").map_err(TensorError::from)? as isize;
        let keep = out.clone();
        Ok(record(
            "softmax",
            &[self],
            out,
            || vec![keep],
            move |c| {
                let y = &c.saved[0];
                let gy = c.grad.mul(y)?;
                Ok(vec![Some(gy.sub(&y.mul(&gy.sum(&[d], true)?)?)?)])
            },
        ))
    }

    /// Log-softmax along `dim`: `dx = g - exp(y) Σ g`.
    pub fn log_softmax(&self, dim: isize) -> Result<Var> {
        if let Some(c) = autocast_inputs(op_names::LOG_SOFTMAX, &[self])? {
            return c[0].log_softmax(dim);
        }
        let out = self.tensor().log_softmax(dim)?;
        let d = resolve_dim(dim, self.rank().max(1), "log_softmax").map_err(TensorError::from)? as isize;
        let keep = out.clone();
        Ok(record(
            "log_softmax",
            &[self],
            out,
            || vec![keep],
            move |c| {
                let y = &c.saved[0];
                Ok(vec![Some(c.grad.sub(&y.exp()?.mul(&c.grad.sum(&[d], true)?)?)?)])
            },
        ))
    }
}
