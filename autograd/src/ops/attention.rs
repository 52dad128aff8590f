//! Scaled dot-product attention computed block by block, as memory-efficient
//! and flash attention do: the `[.., L, S]` score matrix is never held whole.
//!
//! The queries are processed in chunks of `c` rows. For each chunk the
//! forward forms the score block `q_c·kᵀ·scale` (plus the mask slice and the
//! causal fill), its row maximum `m` and `p = softmax(scores)` (one fused
//! pass), writes `out_c = p·v`, and keeps only `out` and the per-row
//! log-sum-exp `lse = m − ln(max p)` (`= m + ln Σ exp(scores − m)`). The
//! backward recomputes each chunk's probabilities — the block's softmax,
//! which is `exp(scores − lse)` — and accumulates `dV += pᵀ·dO`,
//! `dS = p ∘ (dO·vᵀ − rowsum(dO ∘ out))`, `dQ = dS·k·scale`,
//! `dK += dSᵀ·q·scale`. Memory is therefore O(L + S) plus one score block,
//! in forward and backward alike; the work is the naive composition's plus
//! one recomputed `q·kᵀ` and softmax in backward. With the causal mask a
//! chunk only reads the keys its rows can see.
//!
//! Rows whose every key is masked give an output of 0 and gradients of 0
//! (what PyTorch's memory-efficient kernel returns; its naive composition
//! returns NaN there). Dropout draws each chunk's keep mask from the
//! process-wide generator in forward; backward restores the generator state
//! taken before those draws, draws the same masks again, and puts the
//! caller's state back.
//!
//! f16 and bf16 inputs keep their dtype as operands of the products, which
//! return f32 sums ([`Tensor::matmul_out_dtype`]: the half kernels read them
//! as they are, as PyTorch's flash attention does on CPUs); scores, their
//! softmax statistics and the accumulators stay f32 (half precision would
//! lose too much there), and the probabilities and score gradients are
//! rounded to the inputs' dtype only as operands of the next products. The
//! scale multiplies the scores and the score gradients in place, in every
//! dtype, rather than the queries (a strided view of the heads, which
//! scaling would copy). The output
//! is converted back; what backward needs (`q`, `k`, `v`, the output) is
//! saved in the inputs' dtype, so under autocast attention keeps half the
//! bytes.
//!
//! Where the device has a fused kernel for the operands
//! ([`Tensor::fused_attention`]: CUDA in f16 and bf16 with head dims up to
//! 128, the host in f32 and f64 without dropout) and no
//! [`SdpaOptions::chunk_rows`] asks for the composition, none of the above
//! runs: one kernel computes the output and the log-sum-exp (a head at a
//! time on the host, FlashAttention-2 on CUDA), and one kernel the three
//! gradients. CUDA's dropout decisions come from the same generator but
//! are not the blocks' masks above, so a seeded run with dropout differs
//! between the host and CUDA (as PyTorch's fused and math kernels differ).

use crate::error::{AutogradError, Result};
use crate::op_names;
use crate::precision::autocast_inputs;
use crate::var::{record, Var};
use brasa_tensor::{
    broadcast_shapes, rng_state, set_rng_state, DType, Device, FusedAttention, FusedAttentionConfig, GeneratorState,
    Shape, Tensor,
};

const OP: &str = op_names::SCALED_DOT_PRODUCT_ATTENTION;

/// The number of score elements one chunk may hold by default (64 MiB of
/// f32): large enough for efficient matrix products, small enough that the
/// score block stays far below the whole matrix at long sequences.
const DEFAULT_BLOCK_ELEMENTS: usize = 1 << 24;

/// The options of [`Var::scaled_dot_product_attention`], with PyTorch's
/// defaults: no mask, not causal, no dropout, `scale = 1/√E`.
///
/// ```
/// use brasa_autograd::SdpaOptions;
/// use brasa_tensor::{DType, Tensor};
/// let mask = Tensor::ones([4, 6], DType::Bool)?;
/// let options = SdpaOptions::new().attn_mask(mask).dropout_p(0.1).scale(0.5);
/// assert!(!options.is_causal && options.dropout_p == 0.1);
/// # Ok::<(), brasa_autograd::AutogradError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct SdpaOptions {
    /// A mask broadcastable to `[.., L, S]`: bool (`true` = may attend,
    /// PyTorch's convention) or floating point (added to the scores). No
    /// gradient flows to it.
    pub attn_mask: Option<Tensor>,
    /// PyTorch's top-left causal mask: query `i` attends keys `j ≤ i`.
    /// Together with `attn_mask` it is an error, as in PyTorch.
    pub is_causal: bool,
    /// The probability of dropping an attention weight (applied after the
    /// softmax, survivors scaled by `1/(1 − p)`).
    pub dropout_p: f64,
    /// The factor applied to `q·kᵀ`; `None` is `1/√E`.
    pub scale: Option<f64>,
    /// Query rows per block of the composed attention; `None` picks a
    /// block of about 64 MiB of f32 scores, or lets the device's fused
    /// kernel run where it has one (`Some` always composes). Results do
    /// not depend on it (beyond rounding), except which dropout mask is
    /// drawn.
    pub chunk_rows: Option<usize>,
}

impl SdpaOptions {
    /// PyTorch's defaults (see [`SdpaOptions`]).
    pub fn new() -> SdpaOptions {
        SdpaOptions::default()
    }

    /// With this bool or additive mask.
    pub fn attn_mask(self, mask: Tensor) -> SdpaOptions {
        SdpaOptions { attn_mask: Some(mask), ..self }
    }

    /// With or without the causal mask.
    pub fn causal(self, is_causal: bool) -> SdpaOptions {
        SdpaOptions { is_causal, ..self }
    }

    /// With dropout probability `p` on the attention weights.
    pub fn dropout_p(self, p: f64) -> SdpaOptions {
        SdpaOptions { dropout_p: p, ..self }
    }

    /// With this scale instead of `1/√E`.
    pub fn scale(self, scale: f64) -> SdpaOptions {
        SdpaOptions { scale: Some(scale), ..self }
    }

    /// Composed from tensor ops in blocks of `rows` query rows, even where
    /// the device has a fused kernel.
    pub fn chunk_rows(self, rows: usize) -> SdpaOptions {
        SdpaOptions { chunk_rows: Some(rows), ..self }
    }
}

/// What one forward fixed, shared by the forward and the backward passes.
struct Plan {
    /// Query rows `L` and key rows `S`.
    l: usize,
    s: usize,
    scale: f64,
    causal: bool,
    dropout_p: f64,
    chunk: usize,
    /// The mask with leading dims of size 1 added up to the score rank;
    /// each of its dims is 1 or the score's.
    mask: Option<Tensor>,
    /// The dtype the arithmetic runs in (f32 for half inputs).
    compute: DType,
    /// The dtype of the products' operands: the inputs' (f16 or bf16
    /// operands give f32 products), else `compute`.
    operand: DType,
    device: Device,
}

impl Plan {
    /// The key rows a chunk starting at query `start` with `rows` rows can
    /// see: every key, or with the causal mask only keys up to its last row.
    fn keys(&self, start: usize, rows: usize) -> usize {
        if self.causal {
            (start + rows).min(self.s)
        } else {
            self.s
        }
    }

    /// The chunks, as `(start, rows)`.
    fn chunks(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.l).step_by(self.chunk).map(move |start| (start, self.chunk.min(self.l - start)))
    }

    fn scalar(&self, value: f64) -> Result<Tensor> {
        Ok(Tensor::full_on([], value, self.compute, self.device)?)
    }

    /// Whether the products take half operands into f32 sums.
    fn half_operands(&self) -> bool {
        self.operand != self.compute
    }

    /// `a · b` in the compute dtype, from operands in `self.operand`.
    fn product(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        Ok(if self.half_operands() { a.matmul_out_dtype(b, self.compute)? } else { a.matmul(b)? })
    }

    /// A compute-dtype block (probabilities, score gradients) as an operand
    /// of the next product.
    fn as_operand(&self, t: &Tensor) -> Result<Tensor> {
        in_dtype(t, self.operand)
    }

    /// `q_c·kᵀ·scale` of one chunk with the mask and causal fill added;
    /// `q_c` is the chunk's queries. The scale multiplies the scores in
    /// place (in the compute dtype, before half operands are rounded), not
    /// the queries: those are a strided view of the heads, and scaling them
    /// would copy them.
    fn scores(&self, q_c: &Tensor, k: &Tensor, start: usize, rows: usize) -> Result<Tensor> {
        let keys = self.keys(start, rows);
        let scores = self.product(q_c, &k.narrow(-2, 0, keys)?.transpose(-2, -1)?)?;
        scores.mul_scalar_(self.scale)?;
        if let Some(mask) = &self.mask {
            let rank = mask.rank();
            let mut m = mask.clone();
            if m.dims()[rank - 2] != 1 {
                m = m.narrow(-2, start, rows)?;
            }
            if m.dims()[rank - 1] != 1 {
                m = m.narrow(-1, 0, keys)?;
            }
            if m.dtype() == DType::Bool {
                m = m.where_cond(&self.scalar(0.0)?, &self.scalar(f64::NEG_INFINITY)?)?;
            } else if m.dtype() != self.compute {
                m = m.to_dtype(self.compute)?;
            }
            scores.add_(&m)?;
        }
        if self.causal {
            // Key j is hidden from query row i when j > i.
            let query = Tensor::arange_on(start as f64, (start + rows) as f64, 1.0, DType::I64, self.device)?
                .reshape(&[rows as isize, 1])?;
            let key =
                Tensor::arange_on(0.0, keys as f64, 1.0, DType::I64, self.device)?.reshape(&[1, keys as isize])?;
            let hidden = key.gt(&query)?;
            scores.add_(&hidden.where_cond(&self.scalar(f64::NEG_INFINITY)?, &self.scalar(0.0)?)?)?;
        }
        Ok(scores)
    }

    /// `flags` (`[.., rows, 1]`, true on rows that see no key) when some
    /// row is flagged. Only a mask can hide every key of a row (a causal
    /// row always sees key 0), so without one this reads nothing back.
    fn empty_rows(&self, flags: &Tensor) -> Result<Option<Tensor>> {
        if self.mask.is_none() || flags.to_dtype(DType::F32)?.sum_all()?.item::<f64>()? == 0.0 {
            return Ok(None);
        }
        Ok(Some(flags.clone()))
    }

    /// `p` with the `empty` rows (whose softmax is NaN) set to 0.
    fn zero_rows(&self, empty: &Tensor, p: &Tensor) -> Result<Tensor> {
        Ok(empty.where_cond(&self.scalar(0.0)?, p)?)
    }

    /// This chunk's dropout multiplier (the keep mask scaled by `1/(1 − p)`,
    /// or all zeros when `p = 1`), drawn from the process-wide generator.
    fn dropout_mask(&self, dims: &[usize]) -> Result<Tensor> {
        let keep = Tensor::bernoulli_on(dims, 1.0 - self.dropout_p, self.compute, self.device)?;
        if self.dropout_p < 1.0 {
            keep.mul_scalar_(1.0 / (1.0 - self.dropout_p))?;
        }
        Ok(keep)
    }
}

/// Puts the caller's generator state back when dropped (also on an error).
struct RestoreRng(GeneratorState);

impl Drop for RestoreRng {
    fn drop(&mut self) {
        set_rng_state(self.0);
    }
}

fn in_dtype(t: &Tensor, dtype: DType) -> Result<Tensor> {
    Ok(if t.dtype() == dtype { t.clone() } else { t.to_dtype(dtype)? })
}

/// Checks the inputs and fixes the plan.
fn plan(q: &Var, k: &Var, v: &Var, options: &SdpaOptions) -> Result<Plan> {
    let invalid = |message: String| AutogradError::invalid(OP, message);
    let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
    if qd.len() < 2 || kd.len() != qd.len() || vd.len() != qd.len() {
        return Err(invalid(format!(
            "query, key and value must have the same rank ≥ 2 ([.., L, E], [.., S, E], [.., S, Ev]), got {qd:?}, {kd:?} and {vd:?}"
        )));
    }
    let r = qd.len();
    if qd[..r - 2] != kd[..r - 2] || qd[..r - 2] != vd[..r - 2] {
        return Err(invalid(format!(
            "query, key and value must have the same leading (batch, head) dims, got {qd:?}, {kd:?} and {vd:?}"
        )));
    }
    if kd[r - 1] != qd[r - 1] || vd[r - 2] != kd[r - 2] {
        return Err(invalid(format!(
            "key must be [.., S, E] for query [.., L, E] and value [.., S, Ev]: got query {qd:?}, key {kd:?}, value {vd:?}"
        )));
    }
    if q.dtype() != k.dtype() || q.dtype() != v.dtype() || !q.dtype().is_float() {
        return Err(invalid(format!(
            "query, key and value must share one floating-point dtype, got {}, {} and {}",
            q.dtype(),
            k.dtype(),
            v.dtype()
        )));
    }
    if kd[r - 2] == 0 {
        return Err(invalid(format!("key and value need at least one key (S ≥ 1), got key {kd:?}")));
    }
    if !(0.0..=1.0).contains(&options.dropout_p) {
        return Err(invalid(format!("dropout_p must be in [0, 1], got {}", options.dropout_p)));
    }
    let scale = options.scale.unwrap_or(1.0 / (qd[r - 1].max(1) as f64).sqrt());
    if !scale.is_finite() {
        return Err(invalid(format!("scale must be finite, got {scale}")));
    }
    if options.chunk_rows == Some(0) {
        return Err(invalid("chunk_rows must be at least 1".to_string()));
    }
    let (l, s) = (qd[r - 2], kd[r - 2]);
    let mut score_dims = qd[..r - 2].to_vec();
    score_dims.extend([l, s]);
    let mask = match &options.attn_mask {
        None => None,
        Some(_) if options.is_causal => {
            return Err(invalid(
                "attn_mask and is_causal cannot both be given (PyTorch refuses them together too); put the causal \
                 mask into attn_mask instead"
                    .to_string(),
            ))
        }
        Some(mask) => {
            if mask.dtype() != DType::Bool && !mask.dtype().is_float() {
                return Err(invalid(format!("attn_mask must be bool or floating point, got {}", mask.dtype())));
            }
            let fits = mask.rank() <= r
                && broadcast_shapes(mask.shape(), &Shape::from(score_dims.as_slice()))
                    .is_ok_and(|b| b.dims() == score_dims.as_slice());
            if !fits {
                return Err(invalid(format!(
                    "attn_mask of shape {:?} does not broadcast to the scores' shape {score_dims:?} ([.., L, S])",
                    mask.dims()
                )));
            }
            let mut m = mask.clone();
            while m.rank() < r {
                m = m.unsqueeze(0)?;
            }
            Some(m)
        }
    };
    if mask.as_ref().is_some_and(|m| m.device() != q.device()) {
        return Err(invalid(format!(
            "attn_mask is on {} but query is on {}",
            mask.as_ref().map(|m| m.device()).unwrap_or(q.device()),
            q.device()
        )));
    }
    let compute = match q.dtype() {
        DType::F16 | DType::BF16 => DType::F32,
        other => other,
    };
    // Half operands multiplied as they are where the device's kernels sum
    // them into f32; elsewhere (CUDA) the products run on widened operands.
    let operand = if q.device().multiplies_half_into_f32() { q.dtype() } else { compute };
    let batch: usize = qd[..r - 2].iter().product::<usize>().max(1);
    let chunk =
        options.chunk_rows.unwrap_or_else(|| (DEFAULT_BLOCK_ELEMENTS / (batch * s).max(1)).max(1)).min(l.max(1));
    Ok(Plan {
        l,
        s,
        scale,
        causal: options.is_causal,
        dropout_p: options.dropout_p,
        chunk,
        mask,
        compute,
        operand,
        device: q.device(),
    })
}

/// The forward: the output `[.., L, Ev]` and the log-sum-exp `[.., L, 1]`
/// (`+∞` on rows that see no key), both in the compute dtype.
fn forward(plan: &Plan, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
    let r = q.rank();
    let mut out_dims = q.dims().to_vec();
    out_dims[r - 1] = v.dims()[r - 1];
    let out = Tensor::zeros_on(out_dims.as_slice(), plan.compute, plan.device)?;
    let mut lse_dims = q.dims().to_vec();
    lse_dims[r - 1] = 1;
    let lse = Tensor::zeros_on(lse_dims.as_slice(), plan.compute, plan.device)?;
    let inf = plan.scalar(f64::INFINITY)?;
    for (start, rows) in plan.chunks() {
        let scores = plan.scores(&q.narrow(-2, start, rows)?, k, start, rows)?;
        let max = scores.max(&[-1], true)?;
        let p = scores.softmax(-1)?;
        drop(scores);
        // The largest probability is exp(max − lse) = 1/l, so
        // lse = max − ln(max p), without another exp pass over the block.
        let mut row_lse = max.sub(&p.max(&[-1], true)?.log()?)?;
        let empty = plan.empty_rows(&max.eq_scalar(f64::NEG_INFINITY)?)?;
        let p = match &empty {
            Some(empty) => {
                row_lse = empty.where_cond(&inf, &row_lse)?;
                plan.zero_rows(empty, &p)?
            }
            None => p,
        };
        if plan.dropout_p > 0.0 {
            p.mul_(&plan.dropout_mask(p.dims())?)?;
        }
        let keys = plan.keys(start, rows);
        out.narrow(-2, start, rows)?.copy_(&plan.product(&plan.as_operand(&p)?, &v.narrow(-2, 0, keys)?)?)?;
        lse.narrow(-2, start, rows)?.copy_(&row_lse)?;
    }
    Ok((out, lse))
}

/// The backward: gradients of q, k and v in the compute dtype (k's and v's
/// only when `needs` asks for them). `q`, `k`, `v` and `grad` are in the
/// operand dtype, `out` in the compute dtype.
#[allow(clippy::too_many_arguments)]
fn backward(
    plan: &Plan,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    lse: &Tensor,
    grad: &Tensor,
    needs: [bool; 3],
) -> Result<[Tensor; 3]> {
    let dq = Tensor::zeros_on(q.dims(), plan.compute, plan.device)?;
    let dk = Tensor::zeros_on(k.dims(), plan.compute, plan.device)?;
    let dv = Tensor::zeros_on(v.dims(), plan.compute, plan.device)?;
    for (start, rows) in plan.chunks() {
        let keys = plan.keys(start, rows);
        let (k_c, v_c) = (k.narrow(-2, 0, keys)?, v.narrow(-2, 0, keys)?);
        let q_c = q.narrow(-2, start, rows)?;
        // The block's softmax again: exp(scores − lse), in one fused pass.
        let p = plan.scores(&q_c, k, start, rows)?.softmax(-1)?;
        let p = match plan.empty_rows(&lse.narrow(-2, start, rows)?.eq_scalar(f64::INFINITY)?)? {
            Some(empty) => plan.zero_rows(&empty, &p)?,
            None => p,
        };
        let g = grad.narrow(-2, start, rows)?;
        let dp = plan.product(&g, &v_c.transpose(-2, -1)?)?;
        let kept = if plan.dropout_p > 0.0 {
            let mask = plan.dropout_mask(p.dims())?;
            dp.mul_(&mask)?;
            Some(p.mul(&mask)?)
        } else {
            None
        };
        if needs[2] {
            let p_op = plan.as_operand(kept.as_ref().unwrap_or(&p))?;
            dv.narrow(-2, 0, keys)?.add_(&plan.product(&p_op.transpose(-2, -1)?, &g)?)?;
        }
        drop(kept);
        let row_dot = in_dtype(&g, plan.compute)?.mul(&out.narrow(-2, start, rows)?)?.sum(&[-1], true)?;
        dp.sub_(&row_dot)?;
        dp.mul_(&p)?;
        drop(p);
        // dS·k·scale and dSᵀ·q·scale: the scale goes on dS, in the compute
        // dtype before half operands are rounded.
        dp.mul_scalar_(plan.scale)?;
        let ds = plan.as_operand(&dp)?;
        dq.narrow(-2, start, rows)?.copy_(&plan.product(&ds, &k_c)?)?;
        if needs[1] {
            dk.narrow(-2, 0, keys)?.add_(&plan.product(&ds.transpose(-2, -1)?, &q_c)?)?;
        }
    }
    Ok([dq, dk, dv])
}

/// The attention as the device's fused kernels compute it, when it has them
/// for these operands (see the module docs).
fn fused(q: &Var, k: &Var, v: &Var, plan: &Plan, options: &SdpaOptions) -> Result<Option<Var>> {
    if options.chunk_rows.is_some() {
        return Ok(None);
    }
    let config = FusedAttentionConfig {
        scale: plan.scale,
        causal: plan.causal,
        mask: options.attn_mask.clone(),
        dropout_p: plan.dropout_p,
    };
    let Some(FusedAttention { out, lse, backward }) = q.tensor().fused_attention(k.tensor(), v.tensor(), &config)?
    else {
        return Ok(None);
    };
    let saved = {
        let (q, k, v, out) = (q.tensor().clone(), k.tensor().clone(), v.tensor().clone(), out.clone());
        move || vec![q, k, v, out, lse]
    };
    Ok(Some(record(OP, &[q, k, v], out, saved, move |c| {
        let [q, k, v, out, lse] = c.saved else {
            return Err(AutogradError::invalid(OP, "backward found the wrong number of saved tensors"));
        };
        let grad = in_dtype(c.grad, out.dtype())?;
        let [dq, dk, dv] = backward.run(q, k, v, out, lse, &grad)?;
        Ok(vec![c.needs(0).then_some(dq), c.needs(1).then_some(dk), c.needs(2).then_some(dv)])
    })))
}

impl Var {
    /// Scaled dot-product attention, PyTorch's
    /// `F.scaled_dot_product_attention`: `softmax(q·kᵀ·scale + mask)·v` with
    /// optional causal mask and dropout, for `q` `[.., L, E]`, `k`
    /// `[.., S, E]`, `v` `[.., S, Ev]` (the same leading dims, usually
    /// `[N, heads]`); the output is `[.., L, Ev]`.
    ///
    /// Computed block by block (see the module docs), or by one fused kernel
    /// each way on CUDA for f16 and bf16 with head dims up to 128: forward
    /// and backward hold O(L + S) memory plus one block of scores, never
    /// the whole `[.., L, S]` matrix. A row whose keys are all masked gives 0 and a
    /// zero gradient. Under autocast it asks for
    /// `"scaled_dot_product_attention"` (a low-precision op in PyTorch's
    /// lists).
    ///
    /// ```
    /// use brasa_autograd::{SdpaOptions, Var};
    /// use brasa_tensor::{DType, Tensor};
    /// let q = Var::param(Tensor::randn([2, 4, 10, 8], DType::F32)?)?;
    /// let kv = Var::new(Tensor::randn([2, 4, 12, 8], DType::F32)?);
    /// let out = q.scaled_dot_product_attention(&kv, &kv, &SdpaOptions::new())?;
    /// assert_eq!(out.dims(), &[2, 4, 10, 8]);
    /// out.sum_all()?.backward()?;
    /// assert_eq!(q.grad().unwrap().dims(), &[2, 4, 10, 8]);
    /// # Ok::<(), brasa_autograd::AutogradError>(())
    /// ```
    pub fn scaled_dot_product_attention(&self, key: &Var, value: &Var, options: &SdpaOptions) -> Result<Var> {
        if let Some(c) = autocast_inputs(OP, &[self, key, value])? {
            return c[0].scaled_dot_product_attention(&c[1], &c[2], options);
        }
        let plan = plan(self, key, value, options)?;
        if let Some(fused) = fused(self, key, value, &plan, options)? {
            return Ok(fused);
        }
        let dtype = self.dtype();
        let (q, k, v) = (
            in_dtype(self.tensor(), plan.operand)?,
            in_dtype(key.tensor(), plan.operand)?,
            in_dtype(value.tensor(), plan.operand)?,
        );
        // The generator state the dropout masks are drawn from, for backward.
        let rng = (plan.dropout_p > 0.0).then(rng_state);
        let (out, lse) = forward(&plan, &q, &k, &v)?;
        drop((q, k, v));
        let result = in_dtype(&out, dtype)?;
        // Saved in the inputs' dtype (bf16 under autocast: half the bytes of
        // the f32 copies computed with) and widened again in backward, as
        // PyTorch's attention kernels save their half-precision operands;
        // only the log-sum-exp stays f32.
        let (q, k, v, out) = (self.tensor().clone(), key.tensor().clone(), value.tensor().clone(), result.clone());
        let saved = || vec![q, k, v, out, lse];
        Ok(record(OP, &[self, key, value], result, saved, move |c| {
            let [q, k, v, out, lse] = c.saved else {
                return Err(AutogradError::invalid(OP, "backward found the wrong number of saved tensors"));
            };
            let operand = |t: &Tensor| in_dtype(t, plan.operand);
            let (q, k, v) = (&operand(q)?, &operand(k)?, &operand(v)?);
            let out = &in_dtype(out, plan.compute)?;
            let grad = in_dtype(c.grad, plan.operand)?;
            let _restore = rng.map(|state| {
                let caller = RestoreRng(rng_state());
                set_rng_state(state);
                caller
            });
            let needs = [c.needs(0), c.needs(1), c.needs(2)];
            let [dq, dk, dv] = backward(&plan, q, k, v, out, lse, &grad, needs)?;
            let cast = |t: Tensor, need: bool| -> Result<Option<Tensor>> {
                Ok(if need { Some(in_dtype(&t, dtype)?) } else { None })
            };
            Ok(vec![cast(dq, needs[0])?, cast(dk, needs[1])?, cast(dv, needs[2])?])
        }))
    }
}
