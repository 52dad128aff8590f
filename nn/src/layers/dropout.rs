//! [`Dropout`]: zeroes each element with probability `p` in training mode
//! and scales the rest by `1 / (1 - p)`; the identity in evaluation mode
//! (PyTorch's `nn.Dropout`). The mask comes from the seeded generator.

use crate::error::{NnError, Result};
use crate::flags::Training;
use crate::module::Module;
use brasa_autograd::Var;

/// Dropout with probability `p`, active only in training mode.
///
/// ```
/// use brasa_nn::{Dropout, Module, ModuleExt};
/// use brasa_autograd::Var;
/// use brasa_tensor::{DType, Tensor};
///
/// let mut dropout = Dropout::new(0.5)?;
/// let x = Var::new(Tensor::ones([4, 4], DType::F32)?);
/// let y = dropout.forward(&x)?.tensor().to_vec::<f32>()?;
/// assert!(y.iter().all(|&v| v == 0.0 || v == 2.0));
/// dropout.eval();
/// assert_eq!(dropout.forward(&x)?.tensor().to_vec::<f32>()?, [1.0; 16]);
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
#[derive(crate::Parameters, Clone, Copy, Debug)]
pub struct Dropout {
    training: Training,
    #[module(skip)]
    p: f64,
}

impl Dropout {
    /// Dropout with probability `p` in `[0, 1]`, in training mode.
    pub fn new(p: f64) -> Result<Dropout> {
        if !(0.0..=1.0).contains(&p) {
            return Err(NnError::invalid("Dropout", format!("p must be in [0, 1], got {p}")));
        }
        Ok(Dropout { training: Training::default(), p })
    }

    /// The probability of zeroing an element.
    pub fn p(&self) -> f64 {
        self.p
    }
}

impl Default for Dropout {
    /// PyTorch's default, `p = 0.5`.
    fn default() -> Dropout {
        Dropout { training: Training::default(), p: 0.5 }
    }
}

impl Module for Dropout {
    fn forward(&self, input: &Var) -> Result<Var> {
        Ok(input.dropout(self.p, self.training.get())?)
    }
}
