//! [`Flatten`]: merges a range of dims into one (PyTorch's `nn.Flatten`,
//! by default every dim but the batch dim).

use crate::error::{NnError, Result};
use crate::module::Module;
use brasa_autograd::Var;
use brasa_tensor::resolve_dim;

/// Flattens dims `start_dim..=end_dim` (negative counts from the end).
///
/// ```
/// use brasa_nn::{Flatten, Module};
/// use brasa_autograd::Var;
/// use brasa_tensor::{DType, Tensor};
///
/// let x = Var::new(Tensor::zeros([8, 3, 4, 5], DType::F32)?);
/// assert_eq!(Flatten::new().forward(&x)?.dims(), &[8, 60]);
/// assert_eq!(Flatten::range(1, 2).forward(&x)?.dims(), &[8, 12, 5]);
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
#[derive(crate::Parameters, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flatten {
    #[module(skip)]
    start_dim: isize,
    #[module(skip)]
    end_dim: isize,
}

impl Flatten {
    /// Flattens every dim but the first (`start_dim = 1`, `end_dim = -1`).
    pub fn new() -> Flatten {
        Flatten { start_dim: 1, end_dim: -1 }
    }

    /// Flattens dims `start_dim..=end_dim`.
    pub fn range(start_dim: isize, end_dim: isize) -> Flatten {
        Flatten { start_dim, end_dim }
    }

    /// `(start_dim, end_dim)`.
    pub fn dims(&self) -> (isize, isize) {
        (self.start_dim, self.end_dim)
    }
}

impl Default for Flatten {
    fn default() -> Flatten {
        Flatten::new()
    }
}

impl Module for Flatten {
    fn forward(&self, input: &Var) -> Result<Var> {
        let dims = input.dims();
        // A 0-d input flattens to one element, as in PyTorch.
        if dims.is_empty() {
            return Ok(input.reshape(&[1])?);
        }
        let range = resolve_dim(self.start_dim, dims.len(), "Flatten")
            .and_then(|start| Ok((start, resolve_dim(self.end_dim, dims.len(), "Flatten")?)));
        match range {
            Ok((start, end)) if start <= end => Ok(input.flatten(start, end)?),
            _ => Err(NnError::invalid(
                "Flatten",
                format!("dims {}..={} do not name a range of an input of shape {dims:?}", self.start_dim, self.end_dim),
            )),
        }
    }
}
