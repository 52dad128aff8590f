//! [`Identity`]: returns its input (PyTorch's `nn.Identity`), a placeholder
//! where a model's shape wants a layer.

use crate::error::Result;
use crate::module::Module;
use brasa_autograd::Var;

/// The layer that returns its input unchanged.
#[derive(crate::Parameters, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Identity;

impl Module for Identity {
    fn forward(&self, input: &Var) -> Result<Var> {
        Ok(input.clone())
    }
}
