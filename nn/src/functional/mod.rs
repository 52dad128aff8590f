//! Stateless functions behind the layers and the losses (PyTorch's
//! `torch.nn.functional`): cross entropy and the other losses, batch and
//! layer normalisation.

mod cross_entropy_probs;
mod loss;
mod norm;

pub use cross_entropy_probs::*;
pub use loss::*;
pub use norm::*;
