//! # brasa
//!
//! A deep-learning training runtime in Rust (umbrella crate; being assembled).

pub use brasa_alloc as alloc;
pub use brasa_autograd as autograd;
pub use brasa_kernels as kernels;
pub use brasa_nn as nn;
pub use brasa_profile as profile;
pub use brasa_tensor as tensor;
