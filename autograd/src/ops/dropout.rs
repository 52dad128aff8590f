//! Dropout: zeroes each element with probability `p` and scales the rest by
//! `1 / (1 - p)`, with a mask from the process-wide generator (so
//! checkpointing, which restores the generator, repeats it).

use crate::error::{AutogradError, Result};
use crate::var::{record, Var};
use brasa_tensor::Tensor;

impl Var {
    /// Dropout with probability `p` when `train`, else the identity.
    pub fn dropout(&self, p: f64, train: bool) -> Result<Var> {
        if !(0.0..=1.0).contains(&p) {
            return Err(AutogradError::invalid("dropout", format!("p must be in [0, 1], got {p}")));
        }
        if !train || p == 0.0 {
            return Ok(self.clone());
        }
        let keep = Tensor::bernoulli_on(self.dims(), 1.0 - p, self.dtype(), self.device())?;
        let mask = if p < 1.0 { keep.mul_scalar(1.0 / (1.0 - p))? } else { keep };
        let out = self.tensor().mul(&mask)?;
        Ok(record("dropout", &[self], out, || vec![mask], |c| Ok(vec![Some(c.grad.mul(&c.saved[0])?)])))
    }
}
