//! The layers: each in its own file, all re-exported at the crate root.

mod activation;
mod attention;
mod batch_norm;
mod conv;
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
pub use attention::{AttentionMasks, MultiheadAttention, MultiheadAttentionConfig};
pub use batch_norm::{BatchNorm1d, BatchNorm2d, BatchNormConfig};
pub use conv::{Conv2d, Conv2dConfig};
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
