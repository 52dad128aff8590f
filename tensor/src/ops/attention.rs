//! Fused scaled dot-product attention: one kernel for the forward and one
//! for the backward on devices that have them (CUDA, f16 and bf16, head
//! dims up to 128: FlashAttention-2; the host, f32 and f64 without dropout:
//! a head at a time, `brasa_kernels::attention`), `None` elsewhere.
//!
//! This is the tensor-level half of `brasa_autograd`'s
//! `scaled_dot_product_attention`, which asks here first and composes the
//! attention from matrix products and softmax blocks where no fused kernel
//! exists (half precision on the host, dropout on the host). The op checks
//! the operands and brings them to the kernels' form — `[n, h, L, E]` views
//! with a contiguous last dim, an additive mask (f32, f64 for f64
//! operands) broadcast to `[n, h, L, S]` without copying, the
//! dropout draws reserved from the process-wide generator — and the
//! device's backend runs it.
//!
//! ```
//! use brasa_tensor::{DType, FusedAttentionConfig, Tensor};
//! let q = Tensor::randn([2, 4, 10, 64], DType::BF16)?;
//! // The host's fused kernel runs f32 and f64; for bf16 the caller
//! // composes the attention.
//! assert!(q.fused_attention(&q, &q, &FusedAttentionConfig::new(0.125))?.is_none());
//! let q = q.to_dtype(DType::F32)?;
//! let fused = q.fused_attention(&q, &q, &FusedAttentionConfig::new(0.125))?.expect("the host's kernel");
//! assert_eq!(fused.out.dims(), &[2, 4, 10, 64]);
//! assert_eq!(fused.lse.dims(), &[2, 4, 10]);
//! # Ok::<(), brasa_tensor::TensorError>(())
//! ```

use crate::backend::{ops_for, AttentionOperands, DropoutDraws};
use crate::default_generator::reserve_draws;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::tensor::Tensor;

const OP: &str = "fused_attention";

/// What a fused attention computes besides `q`, `k` and `v`.
#[derive(Clone, Debug)]
pub struct FusedAttentionConfig {
    /// The factor on `q·kᵀ`.
    pub scale: f64,
    /// PyTorch's top-left causal mask (query `i` sees keys `j ≤ i`).
    pub causal: bool,
    /// A bool (`true` = may attend) or floating-point (added) mask
    /// broadcastable to `[.., L, S]`.
    pub mask: Option<Tensor>,
    /// The probability of dropping an attention weight.
    pub dropout_p: f64,
}

impl FusedAttentionConfig {
    /// No mask, not causal, no dropout.
    pub fn new(scale: f64) -> FusedAttentionConfig {
        FusedAttentionConfig { scale, causal: false, mask: None, dropout_p: 0.0 }
    }
}

/// A fused attention's results.
#[derive(Debug)]
pub struct FusedAttention {
    /// The output `[.., L, Ev]`, in the operands' dtype.
    pub out: Tensor,
    /// Each query row's log-sum-exp `[n·h·L]`-shaped as `[n, h, L]` (f32,
    /// f64 for f64 operands; `+∞` on rows that see no key).
    pub lse: Tensor,
    /// What the backward needs besides the tensors.
    pub backward: FusedAttentionBackward,
}

/// What [`FusedAttentionBackward::run`] needs besides q, k, v, the output
/// and the log-sum-exp: the scale, the mask and the forward's dropout
/// stream (so the backward drops what the forward dropped).
#[derive(Clone, Debug)]
pub struct FusedAttentionBackward {
    scale: f64,
    causal: bool,
    /// The additive mask (f32, f64 for f64 operands) as an `[n, h, L, S]` view.
    mask: Option<Tensor>,
    dropout: Option<DropoutDraws>,
}

/// `[.., R, C]` as `[n, h, R, C]`: rank 2 and 3 by unsqueezing, rank 4 as
/// it is, higher ranks by merging the leading dims (a copy when they do not
/// merge as a view). The last dim is made contiguous.
fn four_d(t: &Tensor) -> Result<Tensor> {
    let r = t.rank();
    let mut x = match r {
        2 => t.unsqueeze(0)?.unsqueeze(0)?,
        3 => t.unsqueeze(0)?,
        4 => t.clone(),
        _ => {
            let d = t.dims();
            let n: usize = d[..r - 3].iter().product();
            t.reshape(&[n as isize, d[r - 3] as isize, d[r - 2] as isize, d[r - 1] as isize])?
        }
    };
    if x.strides()[3] != 1 && x.dims()[3] > 1 {
        x = x.contiguous()?;
    }
    Ok(x)
}

impl Tensor {
    /// Fused scaled dot-product attention `softmax(q·kᵀ·scale + mask)·v` of
    /// `self` (`q`, `[.., L, E]`), `key` (`[.., S, E]`) and `value`
    /// (`[.., S, Ev]`) in one kernel, when the operands' device has one for
    /// their dtype and widths (CUDA: f16 and bf16, `E, Ev ≤ 128`; the host:
    /// f32 and f64 without dropout); `Ok(None)` otherwise, drawing nothing
    /// from the generator. Rows that see no key
    /// give 0. Dropout draws its decisions from the process-wide generator
    /// (not the ones brasa's composed attention draws);
    /// [`FusedAttentionBackward::run`] replays them.
    pub fn fused_attention(
        &self,
        key: &Tensor,
        value: &Tensor,
        config: &FusedAttentionConfig,
    ) -> Result<Option<FusedAttention>> {
        let (q, k, v) = (self, key, value);
        let r = q.rank();
        if r < 2 || k.rank() != r || v.rank() != r {
            return Err(TensorError::invalid(
                OP,
                format!("q, k and v must have one rank ≥ 2, got {:?}, {:?} and {:?}", q.dims(), k.dims(), v.dims()),
            ));
        }
        let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
        if qd[..r - 2] != kd[..r - 2] || qd[..r - 2] != vd[..r - 2] || kd[r - 1] != qd[r - 1] || vd[r - 2] != kd[r - 2]
        {
            return Err(TensorError::invalid(
                OP,
                format!("expected q [.., L, E], k [.., S, E] and v [.., S, Ev], got {qd:?}, {kd:?} and {vd:?}"),
            ));
        }
        if q.dtype() != k.dtype() || q.dtype() != v.dtype() {
            return Err(TensorError::invalid(
                OP,
                format!("q, k and v must share a dtype, got {}, {} and {}", q.dtype(), k.dtype(), v.dtype()),
            ));
        }
        if q.device() != k.device() || q.device() != v.device() {
            return Err(TensorError::invalid(
                OP,
                format!("q, k and v must be on one device, got {}, {} and {}", q.device(), k.device(), v.device()),
            ));
        }
        if !(0.0..=1.0).contains(&config.dropout_p) || !config.scale.is_finite() {
            return Err(TensorError::invalid(
                OP,
                format!("dropout_p must be in [0, 1] and scale finite, got {} and {}", config.dropout_p, config.scale),
            ));
        }
        let (l, s, e, ev) = (qd[r - 2], kd[r - 2], qd[r - 1], vd[r - 1]);
        let backend = ops_for(q.device())?;
        if s == 0 || !backend.supports_fused_attention(q.dtype(), e, ev, config.dropout_p > 0.0) {
            return Ok(None);
        }
        if config.causal && config.mask.is_some() {
            return Err(TensorError::invalid(OP, "a mask and the causal flag cannot both be given"));
        }
        let (q4, k4, v4) = (four_d(q)?, four_d(k)?, four_d(v)?);
        let mask = match &config.mask {
            None => None,
            Some(m) => {
                if m.device() != q.device() {
                    return Err(TensorError::invalid(
                        OP,
                        format!("the mask is on {} but q on {}", m.device(), q.device()),
                    ));
                }
                let mut scores = qd[..r - 2].to_vec();
                scores.extend([l, s]);
                // f32, or f64 with f64 operands (the host's), so that no
                // mask value is rounded below the operands' precision.
                let mask_dtype = if q.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
                let additive = match m.dtype() {
                    DType::Bool => {
                        let zero = Tensor::full_on([], 0.0, mask_dtype, q.device())?;
                        let hidden = Tensor::full_on([], f64::NEG_INFINITY, mask_dtype, q.device())?;
                        m.where_cond(&zero, &hidden)?
                    }
                    dtype if dtype == mask_dtype => m.clone(),
                    dtype if dtype.is_float() => m.to_dtype(mask_dtype)?,
                    dtype => {
                        return Err(TensorError::invalid(OP, format!("the mask must be bool or float, got {dtype}")))
                    }
                };
                let broadcast = additive.broadcast_as(scores.as_slice()).map_err(|_| {
                    TensorError::invalid(
                        OP,
                        format!("a mask of shape {:?} does not broadcast to the scores' {scores:?}", m.dims()),
                    )
                })?;
                Some(four_d(&broadcast)?)
            }
        };
        let dropout = (config.dropout_p > 0.0).then(|| {
            let (n, h) = (q4.dims()[0], q4.dims()[1]);
            let draws = reserve_draws(n * h * l * s.div_ceil(4));
            DropoutDraws { keep_prob: 1.0 - config.dropout_p, seed: draws.seed(), offset: draws.offset() }
        });
        let operands = AttentionOperands {
            q: &q4,
            k: &k4,
            v: &v4,
            mask: mask.as_ref(),
            scale: config.scale,
            causal: config.causal,
            dropout,
        };
        let _range = brasa_profile::record_op(OP, &[qd, kd, vd]);
        let (out4, lse) = backend.attention_forward(&operands)?;
        let mut out_dims: Vec<isize> = qd.iter().map(|&d| d as isize).collect();
        out_dims[r - 1] = ev as isize;
        let out = out4.reshape(&out_dims)?;
        Ok(Some(FusedAttention {
            out,
            lse,
            backward: FusedAttentionBackward { scale: config.scale, causal: config.causal, mask, dropout },
        }))
    }
}

impl FusedAttentionBackward {
    /// The gradients of `q`, `k` and `v` (their dtype and shapes) from the
    /// forward's inputs, its `out` and `lse`, and the output's gradient
    /// `grad`, recomputing the attention tile by tile with the forward's
    /// dropout decisions.
    pub fn run(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        lse: &Tensor,
        grad: &Tensor,
    ) -> Result<[Tensor; 3]> {
        if grad.dims() != out.dims() || grad.dtype() != out.dtype() || q.dtype() != out.dtype() {
            return Err(TensorError::invalid(
                "fused_attention_backward",
                format!(
                    "the output's gradient must be {} {:?} like the output, got {} {:?}",
                    out.dtype(),
                    out.dims(),
                    grad.dtype(),
                    grad.dims()
                ),
            ));
        }
        let (q4, k4, v4) = (four_d(q)?, four_d(k)?, four_d(v)?);
        let o_dims: Vec<isize> = q4.dims()[..3].iter().chain([&v4.dims()[3]]).map(|&d| d as isize).collect();
        let grad4 = grad.contiguous()?.reshape(&o_dims)?;
        let out4 = out.contiguous()?.reshape(&o_dims)?;
        let operands = AttentionOperands {
            q: &q4,
            k: &k4,
            v: &v4,
            mask: self.mask.as_ref(),
            scale: self.scale,
            causal: self.causal,
            dropout: self.dropout,
        };
        let _range = brasa_profile::record_op("fused_attention_backward", &[grad.dims()]);
        let [dq, dk, dv] = ops_for(q.device())?.attention_backward(&operands, &out4, lse, &grad4)?;
        let as_input =
            |t: Tensor, like: &Tensor| t.reshape(&like.dims().iter().map(|&d| d as isize).collect::<Vec<_>>());
        Ok([as_input(dq, q)?, as_input(dk, k)?, as_input(dv, v)?])
    }
}
