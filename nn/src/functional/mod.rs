//! Stateless functions behind the layers and the losses (PyTorch's
//! `torch.nn.functional`): cross entropy and the other losses, batch and
//! layer normalisation.

mod loss;
mod norm;

pub use loss::*;
pub use norm::*;
