//! [`TransformerEncoderLayer`]: PyTorch's `nn.TransformerEncoderLayer`, a
//! self-attention block and a feed-forward block, each with dropout and a
//! residual connection, normalised after (post-norm, PyTorch's default) or
//! before (pre-norm, `norm_first`) each block:
//!
//! - post-norm: `x = norm1(x + sa(x))`, then `x = norm2(x + ff(x))`;
//! - pre-norm: `x = x + sa(norm1(x))`, then `x = x + ff(norm2(x))`;
//!
//! with `sa(x) = dropout1(self_attn(x, x, x))` and
//! `ff(x) = dropout2(linear2(dropout(activation(linear1(x)))))`.

use crate::error::{NnError, Result};
use crate::layers::{
    AttentionMasks, Dropout, LayerNorm, LayerNormConfig, Linear, MultiheadAttention, MultiheadAttentionConfig,
};
use crate::module::Module;
use brasa_autograd::Var;
use brasa_tensor::{DType, Device};

/// The feed-forward activation of a [`TransformerEncoderLayer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransformerActivation {
    /// `max(x, 0)` (PyTorch's default).
    Relu,
    /// The exact (erf) GELU.
    Gelu,
}

/// How a [`TransformerEncoderLayer`] is built; the default is PyTorch's
/// (`dim_feedforward` 2048, dropout 0.1, ReLU, `layer_norm_eps` 1e-5,
/// sequence-first inputs, post-norm, biases) in f32.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TransformerEncoderLayerConfig {
    /// The hidden width of the feed-forward block.
    pub dim_feedforward: usize,
    /// The dropout probability everywhere (attention weights, feed-forward, residuals).
    pub dropout: f64,
    /// The feed-forward activation.
    pub activation: TransformerActivation,
    /// The layer norms' `eps`.
    pub layer_norm_eps: f64,
    /// Inputs and output are `[N, L, E]` (else `[L, N, E]`).
    pub batch_first: bool,
    /// Pre-norm (`true`) or post-norm.
    pub norm_first: bool,
    /// Whether the linear layers and the norms have biases.
    pub bias: bool,
    /// The dtype of the parameters.
    pub dtype: DType,
}

impl Default for TransformerEncoderLayerConfig {
    fn default() -> TransformerEncoderLayerConfig {
        TransformerEncoderLayerConfig {
            dim_feedforward: 2048,
            dropout: 0.1,
            activation: TransformerActivation::Relu,
            layer_norm_eps: 1e-5,
            batch_first: false,
            norm_first: false,
            bias: true,
            dtype: DType::F32,
        }
    }
}

impl TransformerEncoderLayerConfig {
    /// PyTorch's defaults (see [`TransformerEncoderLayerConfig`]).
    pub fn new() -> TransformerEncoderLayerConfig {
        TransformerEncoderLayerConfig::default()
    }

    /// With this feed-forward width.
    pub fn dim_feedforward(self, dim_feedforward: usize) -> TransformerEncoderLayerConfig {
        TransformerEncoderLayerConfig { dim_feedforward, ..self }
    }

    /// With this dropout probability.
    pub fn dropout(self, dropout: f64) -> TransformerEncoderLayerConfig {
        TransformerEncoderLayerConfig { dropout, ..self }
    }

    /// With this activation.
    pub fn activation(self, activation: TransformerActivation) -> TransformerEncoderLayerConfig {
        TransformerEncoderLayerConfig { activation, ..self }
    }

    /// With this layer-norm `eps`.
    pub fn layer_norm_eps(self, layer_norm_eps: f64) -> TransformerEncoderLayerConfig {
        TransformerEncoderLayerConfig { layer_norm_eps, ..self }
    }

    /// With `[N, L, E]` inputs (`true`) or `[L, N, E]` ones.
    pub fn batch_first(self, batch_first: bool) -> TransformerEncoderLayerConfig {
        TransformerEncoderLayerConfig { batch_first, ..self }
    }

    /// Pre-norm (`true`) or post-norm.
    pub fn norm_first(self, norm_first: bool) -> TransformerEncoderLayerConfig {
        TransformerEncoderLayerConfig { norm_first, ..self }
    }

    /// With or without biases.
    pub fn bias(self, bias: bool) -> TransformerEncoderLayerConfig {
        TransformerEncoderLayerConfig { bias, ..self }
    }

    /// With parameters in `dtype`.
    pub fn dtype(self, dtype: DType) -> TransformerEncoderLayerConfig {
        TransformerEncoderLayerConfig { dtype, ..self }
    }
}

/// One transformer encoder layer (see the module docs for the arithmetic).
/// Parameter names are PyTorch's (`self_attn.in_proj_weight`,
/// `linear1.weight`, `norm1.weight`, ...).
///
/// ```
/// use brasa_nn::{Module, ModuleExt, TransformerEncoderLayer, TransformerEncoderLayerConfig};
/// use brasa_autograd::Var;
/// use brasa_tensor::{DType, Device, Tensor};
///
/// let config = TransformerEncoderLayerConfig::new().dim_feedforward(64).batch_first(true).norm_first(true);
/// let mut layer = TransformerEncoderLayer::with_config(32, 4, config, Device::CPU)?;
/// layer.eval();
/// let x = Var::new(Tensor::randn([2, 10, 32], DType::F32)?);
/// assert_eq!(layer.forward(&x)?.dims(), &[2, 10, 32]);
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
#[derive(crate::Parameters)]
pub struct TransformerEncoderLayer {
    /// The self-attention.
    pub self_attn: MultiheadAttention,
    /// `d_model → dim_feedforward`.
    pub linear1: Linear,
    /// Dropout after the activation.
    pub dropout: Dropout,
    /// `dim_feedforward → d_model`.
    pub linear2: Linear,
    /// The norm of the attention block.
    pub norm1: LayerNorm,
    /// The norm of the feed-forward block.
    pub norm2: LayerNorm,
    /// Dropout on the attention block's output.
    pub dropout1: Dropout,
    /// Dropout on the feed-forward block's output.
    pub dropout2: Dropout,
    #[module(skip)]
    activation: TransformerActivation,
    #[module(skip)]
    norm_first: bool,
}

impl TransformerEncoderLayer {
    /// A layer with PyTorch's defaults (see [`TransformerEncoderLayerConfig`]).
    pub fn new(d_model: usize, nhead: usize, device: Device) -> Result<TransformerEncoderLayer> {
        TransformerEncoderLayer::with_config(d_model, nhead, TransformerEncoderLayerConfig::default(), device)
    }

    /// A layer built as `config` says; `nhead` must divide `d_model`.
    pub fn with_config(
        d_model: usize,
        nhead: usize,
        config: TransformerEncoderLayerConfig,
        device: Device,
    ) -> Result<TransformerEncoderLayer> {
        if config.dim_feedforward == 0 {
            return Err(NnError::invalid("TransformerEncoderLayer", "dim_feedforward must be positive, got 0"));
        }
        let attention = MultiheadAttentionConfig::new()
            .dropout(config.dropout)
            .bias(config.bias)
            .batch_first(config.batch_first)
            .dtype(config.dtype);
        let self_attn = MultiheadAttention::with_config(d_model, nhead, attention, device)?;
        let norm = LayerNormConfig::new().eps(config.layer_norm_eps).bias(config.bias).dtype(config.dtype);
        Ok(TransformerEncoderLayer {
            self_attn,
            linear1: Linear::with_options(d_model, config.dim_feedforward, config.bias, config.dtype, device)?,
            dropout: Dropout::new(config.dropout)?,
            linear2: Linear::with_options(config.dim_feedforward, d_model, config.bias, config.dtype, device)?,
            norm1: LayerNorm::with_config([d_model], norm, device)?,
            norm2: LayerNorm::with_config([d_model], norm, device)?,
            dropout1: Dropout::new(config.dropout)?,
            dropout2: Dropout::new(config.dropout)?,
            activation: config.activation,
            norm_first: config.norm_first,
        })
    }

    /// Whether the norms come before each block.
    pub fn norm_first(&self) -> bool {
        self.norm_first
    }

    /// The layer on `src` with attention masks (PyTorch's `src_mask`,
    /// `src_key_padding_mask` and `is_causal`, in
    /// [`MultiheadAttention`]'s convention).
    pub fn encode(&self, src: &Var, masks: &AttentionMasks) -> Result<Var> {
        if self.norm_first {
            let x = src.add(&self.self_attention_block(&self.norm1.forward(src)?, masks)?)?;
            Ok(x.add(&self.feed_forward_block(&self.norm2.forward(&x)?)?)?)
        } else {
            let x = self.norm1.forward(&src.add(&self.self_attention_block(src, masks)?)?)?;
            self.norm2.forward(&x.add(&self.feed_forward_block(&x)?)?)
        }
    }

    fn self_attention_block(&self, x: &Var, masks: &AttentionMasks) -> Result<Var> {
        self.dropout1.forward(&self.self_attn.attend(x, x, x, masks)?)
    }

    fn feed_forward_block(&self, x: &Var) -> Result<Var> {
        let hidden = self.linear1.forward(x)?;
        let hidden = match self.activation {
            TransformerActivation::Relu => hidden.relu()?,
            TransformerActivation::Gelu => hidden.gelu()?,
        };
        self.dropout2.forward(&self.linear2.forward(&self.dropout.forward(&hidden)?)?)
    }
}

impl Module for TransformerEncoderLayer {
    /// The layer without masks.
    fn forward(&self, input: &Var) -> Result<Var> {
        self.encode(input, &AttentionMasks::default())
    }
}
