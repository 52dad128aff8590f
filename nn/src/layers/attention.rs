//! [`MultiheadAttention`]: PyTorch's `nn.MultiheadAttention` (embedding
//! dim `E` split over `num_heads` heads; parameters `in_proj_weight`
//! `[3E, E]`, `in_proj_bias` `[3E]`, `out_proj`), computed with the
//! memory-efficient [`crate::functional::scaled_dot_product_attention`].
//!
//! Masks follow PyTorch's `nn.MultiheadAttention` convention, which is the
//! opposite of `scaled_dot_product_attention`'s for bool masks: `true`
//! marks a key that may *not* be attended. Float masks are added to the
//! scores. The averaged attention weights (`need_weights=True`) are not
//! computed: they are the `[L, S]` matrix this layer exists to avoid.

use crate::error::{NnError, Result};
use crate::flags::Training;
use crate::functional::{scaled_dot_product_attention, SdpaOptions};
use crate::init;
use crate::layers::Linear;
use crate::module::Module;
use brasa_autograd::Var;
use brasa_tensor::{DType, Device, Tensor};

/// How a [`MultiheadAttention`] is built; the default is PyTorch's (no
/// dropout, biases, sequence-first `[L, N, E]` inputs) in f32.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MultiheadAttentionConfig {
    /// Dropout probability on the attention weights (training mode only).
    pub dropout: f64,
    /// Whether the input and output projections have biases.
    pub bias: bool,
    /// Inputs and output are `[N, L, E]` (else `[L, N, E]`).
    pub batch_first: bool,
    /// The dtype of the parameters.
    pub dtype: DType,
}

impl Default for MultiheadAttentionConfig {
    fn default() -> MultiheadAttentionConfig {
        MultiheadAttentionConfig { dropout: 0.0, bias: true, batch_first: false, dtype: DType::F32 }
    }
}

impl MultiheadAttentionConfig {
    /// PyTorch's defaults (see [`MultiheadAttentionConfig`]).
    pub fn new() -> MultiheadAttentionConfig {
        MultiheadAttentionConfig::default()
    }

    /// With this dropout probability on the attention weights.
    pub fn dropout(self, dropout: f64) -> MultiheadAttentionConfig {
        MultiheadAttentionConfig { dropout, ..self }
    }

    /// With or without biases.
    pub fn bias(self, bias: bool) -> MultiheadAttentionConfig {
        MultiheadAttentionConfig { bias, ..self }
    }

    /// With `[N, L, E]` inputs (`true`) or `[L, N, E]` ones.
    pub fn batch_first(self, batch_first: bool) -> MultiheadAttentionConfig {
        MultiheadAttentionConfig { batch_first, ..self }
    }

    /// With parameters in `dtype`.
    pub fn dtype(self, dtype: DType) -> MultiheadAttentionConfig {
        MultiheadAttentionConfig { dtype, ..self }
    }
}

/// The masks of one attention call, in `nn.MultiheadAttention`'s
/// convention (bool `true` = may not attend; float = added to the scores).
#[derive(Clone, Debug, Default)]
pub struct AttentionMasks {
    /// `[N, S]` (`[S]` for an unbatched input): keys to ignore per sample.
    pub key_padding_mask: Option<Tensor>,
    /// `[L, S]` for every sample and head, or `[N·num_heads, L, S]`.
    pub attn_mask: Option<Tensor>,
    /// The causal mask (query `i` attends keys `j ≤ i`). As in PyTorch it is
    /// a hint when `attn_mask` is given (which is then used as it is).
    pub is_causal: bool,
}

impl AttentionMasks {
    /// No masks.
    pub fn new() -> AttentionMasks {
        AttentionMasks::default()
    }

    /// With this key padding mask.
    pub fn key_padding_mask(self, mask: Tensor) -> AttentionMasks {
        AttentionMasks { key_padding_mask: Some(mask), ..self }
    }

    /// With this attention mask.
    pub fn attn_mask(self, mask: Tensor) -> AttentionMasks {
        AttentionMasks { attn_mask: Some(mask), ..self }
    }

    /// With or without the causal mask.
    pub fn causal(self, is_causal: bool) -> AttentionMasks {
        AttentionMasks { is_causal, ..self }
    }
}

/// Multi-head attention: `out_proj(concat_h(attention(q W_qʰ, k W_kʰ, v W_vʰ)))`.
///
/// ```
/// use brasa_nn::{AttentionMasks, Module, MultiheadAttention, MultiheadAttentionConfig};
/// use brasa_autograd::Var;
/// use brasa_tensor::{DType, Device, Tensor};
///
/// let config = MultiheadAttentionConfig::new().batch_first(true);
/// let mha = MultiheadAttention::with_config(32, 4, config, Device::CPU)?;
/// let x = Var::new(Tensor::randn([2, 10, 32], DType::F32)?);
/// assert_eq!(mha.forward(&x)?.dims(), &[2, 10, 32]);              // self-attention
/// let memory = Var::new(Tensor::randn([2, 7, 32], DType::F32)?);
/// let padding = Tensor::zeros([2, 7], DType::Bool)?;                // nothing padded
/// let masks = AttentionMasks::new().key_padding_mask(padding);
/// assert_eq!(mha.attend(&x, &memory, &memory, &masks)?.dims(), &[2, 10, 32]);
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
///
/// Cloning gives a handle on the same parameters (a `Var` is shared, not
/// copied) with the same train/eval flag at the time of the clone.
#[derive(crate::Parameters, Clone)]
pub struct MultiheadAttention {
    /// `[3E, E]`: the query, key and value projections stacked.
    pub in_proj_weight: Var,
    /// `[3E]`, if the layer has biases.
    pub in_proj_bias: Option<Var>,
    /// The output projection `E → E`.
    pub out_proj: Linear,
    training: Training,
    #[module(skip)]
    num_heads: usize,
    #[module(skip)]
    dropout: f64,
    #[module(skip)]
    batch_first: bool,
}

impl MultiheadAttention {
    /// A layer with PyTorch's defaults (see [`MultiheadAttentionConfig`]).
    pub fn new(embed_dim: usize, num_heads: usize, device: Device) -> Result<MultiheadAttention> {
        MultiheadAttention::with_config(embed_dim, num_heads, MultiheadAttentionConfig::default(), device)
    }

    /// A layer built as `config` says, initialised as PyTorch does
    /// (`in_proj_weight` Xavier-uniform, biases zero, `out_proj.weight` as a
    /// `Linear`'s). `num_heads` must divide `embed_dim`.
    pub fn with_config(
        embed_dim: usize,
        num_heads: usize,
        config: MultiheadAttentionConfig,
        device: Device,
    ) -> Result<MultiheadAttention> {
        if num_heads == 0 || embed_dim == 0 || !embed_dim.is_multiple_of(num_heads) {
            return Err(NnError::invalid(
                "MultiheadAttention",
                format!("embed_dim ({embed_dim}) must be a positive multiple of num_heads ({num_heads})"),
            ));
        }
        if !(0.0..=1.0).contains(&config.dropout) {
            return Err(NnError::invalid(
                "MultiheadAttention",
                format!("dropout must be in [0, 1], got {}", config.dropout),
            ));
        }
        let (dtype, e) = (config.dtype, embed_dim);
        let in_proj_weight = Var::param(init::xavier_uniform(&[3 * e, e], 1.0, dtype, device)?)?;
        let in_proj_bias =
            if config.bias { Some(Var::param(Tensor::zeros_on([3 * e], dtype, device)?)?) } else { None };
        let out_proj = Linear::with_options(e, e, config.bias, dtype, device)?;
        if let Some(b) = &out_proj.bias {
            b.tensor().zero_()?;
        }
        Ok(MultiheadAttention {
            in_proj_weight,
            in_proj_bias,
            out_proj,
            training: Training::default(),
            num_heads,
            dropout: config.dropout,
            batch_first: config.batch_first,
        })
    }

    /// `E`.
    pub fn embed_dim(&self) -> usize {
        self.in_proj_weight.dims()[1]
    }

    /// The number of heads.
    pub fn num_heads(&self) -> usize {
        self.num_heads
    }

    /// Whether inputs are `[N, L, E]`.
    pub fn batch_first(&self) -> bool {
        self.batch_first
    }

    /// Attention of `query` (`[L, N, E]`, or `[N, L, E]` when batch first,
    /// or unbatched `[L, E]`) over `key` and `value` (`[S, N, E]` likewise)
    /// with `masks`; the output has the query's shape. Dropout on the
    /// attention weights applies in training mode.
    pub fn attend(&self, query: &Var, key: &Var, value: &Var, masks: &AttentionMasks) -> Result<Var> {
        let e = self.embed_dim();
        let unbatched = query.rank() == 2;
        let want_rank = if unbatched { 2 } else { 3 };
        if query.rank() != want_rank
            || key.rank() != want_rank
            || value.rank() != want_rank
            || [query, key, value].iter().any(|v| v.dims()[want_rank - 1] != e)
        {
            return Err(NnError::invalid(
                "MultiheadAttention",
                format!(
                    "query, key and value must all be [L, N, {e}] ([N, L, {e}] batch first, [L, {e}] unbatched), got {:?}, {:?} and {:?}",
                    query.dims(),
                    key.dims(),
                    value.dims()
                ),
            ));
        }
        // Everything below works on [N, L, E].
        let to_batch_first = |v: &Var| -> Result<Var> {
            Ok(if unbatched {
                v.unsqueeze(0)?
            } else if self.batch_first {
                v.clone()
            } else {
                v.transpose(0, 1)?
            })
        };
        let (q, k, v) = (to_batch_first(query)?, to_batch_first(key)?, to_batch_first(value)?);
        let (n, l, s) = (q.dims()[0], q.dims()[1], k.dims()[1]);
        if k.dims()[0] != n || v.dims()[0] != n || v.dims()[1] != s {
            return Err(NnError::invalid(
                "MultiheadAttention",
                format!(
                    "key and value must have the query's batch size and one sequence length: query {:?}, key {:?}, value {:?}",
                    query.dims(),
                    key.dims(),
                    value.dims()
                ),
            ));
        }
        let (q, k, v) = self.project(query, key, value, &q, &k, &v)?;
        let (h, d) = (self.num_heads, e / self.num_heads);
        let heads = |x: &Var, len: usize| -> Result<Var> {
            Ok(x.reshape(&[n as isize, len as isize, h as isize, d as isize])?.transpose(1, 2)?)
        };
        let (q, k, v) = (heads(&q, l)?, heads(&k, s)?, heads(&v, s)?);
        let mut options = self.sdpa_masks(masks, n, l, s, unbatched, q.device())?;
        options.dropout_p = if self.training.get() { self.dropout } else { 0.0 };
        let attended = scaled_dot_product_attention(&q, &k, &v, &options)?;
        let merged = attended.transpose(1, 2)?.reshape(&[n as isize, l as isize, e as isize])?;
        let out = self.out_proj.forward(&merged)?;
        Ok(if unbatched {
            out.squeeze(0)?
        } else if self.batch_first {
            out
        } else {
            out.transpose(0, 1)?
        })
    }

    /// The query, key and value projections (one product when all three
    /// inputs are the same `Var`, as in self-attention).
    fn project(&self, query: &Var, key: &Var, value: &Var, q: &Var, k: &Var, v: &Var) -> Result<(Var, Var, Var)> {
        let e = self.embed_dim();
        let bias = |i: usize| -> Result<Option<Var>> {
            Ok(match &self.in_proj_bias {
                Some(b) => Some(b.narrow(0, i * e, e)?),
                None => None,
            })
        };
        if query.same_var(key) && key.same_var(value) {
            let qkv = q.linear(&self.in_proj_weight, self.in_proj_bias.as_ref())?;
            return Ok((qkv.narrow(-1, 0, e)?, qkv.narrow(-1, e, e)?, qkv.narrow(-1, 2 * e, e)?));
        }
        let part = |x: &Var, i: usize| -> Result<Var> {
            Ok(x.linear(&self.in_proj_weight.narrow(0, i * e, e)?, bias(i)?.as_ref())?)
        };
        Ok((part(q, 0)?, part(k, 1)?, part(v, 2)?))
    }

    /// `masks` (PyTorch MHA convention) as one sdpa mask (bool `true` =
    /// attend, or additive), broadcastable to `[N, H, L, S]`, or the causal flag.
    fn sdpa_masks(
        &self,
        masks: &AttentionMasks,
        n: usize,
        l: usize,
        s: usize,
        unbatched: bool,
        device: Device,
    ) -> Result<SdpaOptions> {
        let h = self.num_heads;
        let invalid = |message: String| NnError::invalid("MultiheadAttention", message);
        let check_dtype = |m: &Tensor, what: &str| -> Result<()> {
            if m.dtype() == DType::Bool || m.dtype().is_float() {
                Ok(())
            } else {
                Err(invalid(format!("{what} must be bool or floating point, got {}", m.dtype())))
            }
        };
        let padding = match &masks.key_padding_mask {
            None => None,
            Some(m) => {
                check_dtype(m, "key_padding_mask")?;
                let want: &[usize] = if unbatched { &[s] } else { &[n, s] };
                if m.dims() != want {
                    return Err(invalid(format!("key_padding_mask must be {want:?}, got {:?}", m.dims())));
                }
                Some(allowed(&m.reshape(&[n as isize, 1, 1, s as isize])?)?)
            }
        };
        let attn = match &masks.attn_mask {
            None if masks.is_causal && padding.is_some() => {
                // The causal mask must meet the padding mask: build it.
                let query = Tensor::arange_on(0.0, l as f64, 1.0, DType::I64, device)?.reshape(&[l as isize, 1])?;
                let key = Tensor::arange_on(0.0, s as f64, 1.0, DType::I64, device)?.reshape(&[1, s as isize])?;
                Some(key.le(&query)?)
            }
            None => None,
            Some(m) => {
                check_dtype(m, "attn_mask")?;
                let per_head = if unbatched { [h, l, s] } else { [n * h, l, s] };
                let m = if m.dims() == [l, s] {
                    m.clone()
                } else if m.dims() == per_head {
                    m.reshape(&[if unbatched { 1 } else { n } as isize, h as isize, l as isize, s as isize])?
                } else {
                    return Err(invalid(format!(
                        "attn_mask must be [{l}, {s}] or {per_head:?} (L, S and N·num_heads), got {:?}",
                        m.dims()
                    )));
                };
                Some(allowed(&m)?)
            }
        };
        let mask = match (padding, attn) {
            (None, None) => None,
            (Some(m), None) | (None, Some(m)) => Some(m),
            (Some(a), Some(b)) if a.dtype() == DType::Bool && b.dtype() == DType::Bool => {
                Some(a.where_cond(&b, &Tensor::zeros_on([], DType::Bool, device)?)?)
            }
            (Some(a), Some(b)) => {
                let dtype = if a.dtype().is_float() { a.dtype() } else { b.dtype() };
                Some(additive(&a, dtype)?.add(&additive(&b, dtype)?)?)
            }
        };
        let causal = masks.is_causal && mask.is_none();
        Ok(SdpaOptions { attn_mask: mask, is_causal: causal, ..SdpaOptions::default() })
    }
}

/// A PyTorch-MHA mask in sdpa's convention: bool flipped (`true` = attend),
/// float unchanged.
fn allowed(mask: &Tensor) -> Result<Tensor> {
    Ok(if mask.dtype() == DType::Bool { mask.eq_scalar(0.0)? } else { mask.clone() })
}

/// An sdpa mask as additive scores in `dtype` (bool: 0 where attended, −∞ elsewhere).
fn additive(mask: &Tensor, dtype: DType) -> Result<Tensor> {
    if mask.dtype() != DType::Bool {
        return Ok(mask.to_dtype(dtype)?);
    }
    let zero = Tensor::zeros_on([], dtype, mask.device())?;
    let blocked = Tensor::full_on([], f64::NEG_INFINITY, dtype, mask.device())?;
    Ok(mask.where_cond(&zero, &blocked)?)
}

impl Module for MultiheadAttention {
    /// Self-attention without masks: `attend(x, x, x)`.
    fn forward(&self, input: &Var) -> Result<Var> {
        self.attend(input, input, input, &AttentionMasks::default())
    }
}
