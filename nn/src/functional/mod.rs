//! Stateless functions behind the layers and the losses (PyTorch's
//! `torch.nn.functional`): cross entropy and the other losses, batch and
//! layer normalisation.

mod attention;
mod loss;
mod norm;

pub use attention::*;
pub use loss::*;
pub use norm::*;
