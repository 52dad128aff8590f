//! The layers: each in its own file, all re-exported at the crate root.

mod activation;
mod adaptive_pool;
mod attention;
mod batch_norm;
mod conv;
mod conv1d;
mod conv_args;
mod conv_transpose;
mod conv_transpose1d;
mod dropout;
mod embedding;
mod flatten;
mod group_norm;
mod identity;
mod layer_norm;
mod linear;
mod pair;
mod pool;
mod sequential;
mod transformer;

pub use activation::{
    Celu, Elu, Gelu, GeluTanh, Hardsigmoid, Hardswish, LeakyRelu, LogSigmoid, Mish, Relu, Selu, Sigmoid, Silu,
    Softplus, Tanh,
};
pub use adaptive_pool::{AdaptiveAvgPool2d, AdaptiveMaxPool2d};
pub use attention::{AttentionMasks, MultiheadAttention, MultiheadAttentionConfig};
pub use batch_norm::{BatchNorm1d, BatchNorm2d, BatchNormConfig};
pub use conv::{Conv2d, Conv2dConfig};
pub use conv1d::{Conv1d, Conv1dConfig};
pub use conv_transpose::{ConvTranspose2d, ConvTranspose2dConfig};
pub use conv_transpose1d::{ConvTranspose1d, ConvTranspose1dConfig};
pub use dropout::Dropout;
pub use embedding::Embedding;
pub use flatten::Flatten;
pub use group_norm::{GroupNorm, GroupNormConfig};
pub use identity::Identity;
pub use layer_norm::{LayerNorm, LayerNormConfig};
pub use linear::Linear;
pub use pair::IntoPair;
pub use pool::{AvgPool2d, MaxPool2d};
pub use sequential::Sequential;
pub use transformer::{TransformerActivation, TransformerEncoderLayer, TransformerEncoderLayerConfig};
