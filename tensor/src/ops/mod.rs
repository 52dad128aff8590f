//! Tensor operations, a file per family. Every op checks its operands (dtype,
//! device, shape) and returns an error naming the problem; the loops
//! themselves live in `brasa-kernels` and know nothing about tensors.

mod adaptive_pool;
pub(crate) mod attention;
mod batch_norm;
mod binary;
pub(crate) mod common;
mod compare;
mod concat;
pub(crate) mod conv;
mod conv1d;
mod conv_transpose;
pub(crate) mod elementwise;
pub(crate) mod fused_adam;
pub(crate) mod fused_sgd;
mod index;
mod inplace_arith;
mod inplace_unary;
mod layer_norm;
pub(crate) mod matmul;
pub(crate) mod memory_format;
mod mm;
pub(crate) mod pool;
pub(crate) mod reduce;
mod scatter;
mod softmax;
mod unary;

pub use attention::{FusedAttention, FusedAttentionBackward, FusedAttentionConfig};
pub use conv::Conv2dParams;
pub use conv1d::{Conv1dParams, ConvTranspose1dParams};
pub use conv_transpose::ConvTranspose2dParams;
pub use fused_adam::{fused_adam_, AdamOptions, AdamParam};
pub use fused_sgd::{fused_sgd_, SgdOptions, SgdParam};
pub use pool::Pool2dParams;
pub use scatter::ScatterReduce;
