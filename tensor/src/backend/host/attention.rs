//! The host's fused attention: every (batch, head) one call of
//! `brasa_kernels::attention`, the heads shared out to rayon's threads, in
//! f32 and f64 (half precision and dropout take the composed path, whose
//! dropout masks come from the host's generator).
//!
//! The forward allocates the output and the per-row log-sum-exp (in the
//! operands' dtype), the backward the three gradients: nothing of `[L, S]`
//! size reaches the allocator (each thread's scratch is two blocks of
//! `brasa_kernels::attention::QUERY_BLOCK` rows of scores, reused across
//! heads), so a memory plan counts exactly these.

use crate::backend::AttentionOperands;
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::storage::UninitTensor;
use crate::tensor::Tensor;
use brasa_kernels::attention::{
    head_backward, head_forward, AdditiveMask, AttentionFloat, HeadGradInputs, HeadOperands,
};
use brasa_kernels::gemm::MatRef;
use rayon::prelude::*;

const OP: &str = "fused_attention";
const BACKWARD: &str = "fused_attention_backward";

/// See [`crate::backend::DeviceOps::supports_fused_attention`]: f32 and
/// f64 of any non-zero widths, without dropout (also the rule of a meta
/// device imitating the host).
pub(crate) fn supports(dtype: DType, e: usize, ev: usize, dropout: bool) -> bool {
    matches!(dtype, DType::F32 | DType::F64) && e > 0 && ev > 0 && !dropout
}

/// See [`crate::backend::DeviceOps::attention_forward`].
pub(super) fn forward(a: &AttentionOperands<'_>) -> Result<(Tensor, Tensor)> {
    match a.q.dtype() {
        DType::F32 => forward_as::<f32>(a),
        DType::F64 => forward_as::<f64>(a),
        other => Err(TensorError::internal(OP, format!("the host's fused attention runs f32 and f64, got {other}"))),
    }
}

/// See [`crate::backend::DeviceOps::attention_backward`].
pub(super) fn backward(a: &AttentionOperands<'_>, out: &Tensor, lse: &Tensor, grad: &Tensor) -> Result<[Tensor; 3]> {
    match a.q.dtype() {
        DType::F32 => backward_as::<f32>(a, out, lse, grad),
        DType::F64 => backward_as::<f64>(a, out, lse, grad),
        other => {
            Err(TensorError::internal(BACKWARD, format!("the host's fused attention runs f32 and f64, got {other}")))
        }
    }
}

/// `(n, h, L, S, E, Ev)`.
fn dims(a: &AttentionOperands<'_>) -> (usize, usize, usize, usize, usize, usize) {
    let (qd, kd, vd) = (a.q.dims(), a.k.dims(), a.v.dims());
    (qd[0], qd[1], qd[2], kd[2], qd[3], vd[3])
}

/// A 4-d view's strides, which the op layer leaves non-negative.
fn strides(op: &'static str, t: &Tensor) -> Result<[usize; 4]> {
    let s = t.strides();
    let mut out = [0; 4];
    for (o, &x) in out.iter_mut().zip(s) {
        *o = usize::try_from(x).map_err(|_| TensorError::internal(op, format!("a negative stride in {s:?}")))?;
    }
    Ok(out)
}

/// A 4-d operand as its heads are read, its layout taken once: the
/// storage, where head 0 starts, the four strides, each head's
/// `[rows, cols]`.
struct Heads<'a, T> {
    data: &'a [T],
    offset: usize,
    strides: [usize; 4],
    dims: [usize; 2],
}

impl<'a, T> Heads<'a, T> {
    fn of(op: &'static str, t: &Tensor, data: &'a [T]) -> Result<Self> {
        Ok(Heads { data, offset: t.layout().offset(), strides: strides(op, t)?, dims: [t.dims()[2], t.dims()[3]] })
    }

    /// Where head `b` (= batch · h + head) starts.
    fn start(&self, h: usize, b: usize) -> usize {
        self.offset + (b / h) * self.strides[0] + (b % h) * self.strides[1]
    }

    fn matrix(&self, op: &'static str, h: usize, b: usize) -> Result<MatRef<'a, T>> {
        MatRef::new(self.data, self.start(h, b), self.dims, [self.strides[2], self.strides[3]])
            .map_err(|e| TensorError::kernel(op, e))
    }
}

/// The operands read once for every head.
struct Reads<'a, T> {
    q: Heads<'a, T>,
    k: Heads<'a, T>,
    v: Heads<'a, T>,
    mask: Option<Heads<'a, T>>,
    /// Heads per batch entry.
    h: usize,
    scale: T,
    causal: bool,
}

impl<T: AttentionFloat> Reads<'_, T> {
    fn head(&self, op: &'static str, b: usize) -> Result<HeadOperands<'_, T>> {
        let h = self.h;
        let mask = self.mask.as_ref().map(|m| AdditiveMask {
            data: m.data,
            offset: m.start(h, b),
            strides: [m.strides[2], m.strides[3]],
        });
        Ok(HeadOperands {
            q: self.q.matrix(op, h, b)?,
            k: self.k.matrix(op, h, b)?,
            v: self.v.matrix(op, h, b)?,
            mask,
            scale: self.scale,
            causal: self.causal,
        })
    }
}

/// Runs `with` on the operands' storages read as `T` (the mask in the
/// operands' dtype, as the op layer builds it for the host).
fn with_reads<T: AttentionFloat + WithDType, R>(
    op: &'static str,
    a: &AttentionOperands<'_>,
    with: impl FnOnce(&Reads<'_, T>) -> Result<R>,
) -> Result<R> {
    if a.dropout.is_some() {
        return Err(TensorError::internal(op, "the host's fused attention has no dropout"));
    }
    if let Some(m) = a.mask {
        if m.dtype() != T::DTYPE {
            return Err(TensorError::internal(op, format!("a {} mask for {} operands", m.dtype(), T::DTYPE)));
        }
    }
    let (q, k, v) = (a.q.storage().read::<T>(op)?, a.k.storage().read::<T>(op)?, a.v.storage().read::<T>(op)?);
    let mask_data = a.mask.map(|m| m.storage().read::<T>(op)).transpose()?;
    let mask = a.mask.zip(mask_data.as_deref()).map(|(m, data)| Heads::of(op, m, data)).transpose()?;
    with(&Reads {
        q: Heads::of(op, a.q, &q)?,
        k: Heads::of(op, a.k, &k)?,
        v: Heads::of(op, a.v, &v)?,
        mask,
        h: a.q.dims()[1],
        scale: <T as brasa_kernels::scalar::Float>::from_f64(a.scale),
        causal: a.causal,
    })
}

fn forward_as<T: AttentionFloat + WithDType>(a: &AttentionOperands<'_>) -> Result<(Tensor, Tensor)> {
    let (n, h, l, _, _, ev) = dims(a);
    let device = a.q.device();
    let out = UninitTensor::new([n, h, l, ev], T::DTYPE, device)?;
    let lse = UninitTensor::new([n, h, l], T::DTYPE, device)?;
    with_reads::<T, _>(OP, a, |reads| {
        // SAFETY: the heads tile both outputs, and `head_forward` writes
        // every element of its head's output rows and log-sum-exps.
        unsafe {
            UninitTensor::init_pair_with::<T, T>(out, lse, OP, |out, lse| {
                let heads = out.par_chunks_mut((l * ev).max(1)).zip(lse.par_chunks_mut(l.max(1))).enumerate();
                heads.try_for_each_init(Vec::new, |scratch, (b, (out, lse))| {
                    let head = reads.head(OP, b)?;
                    head_forward(&head, out, lse, scratch).map_err(|e| TensorError::kernel(OP, e))
                })
            })
        }
    })
}

fn backward_as<T: AttentionFloat + WithDType>(
    a: &AttentionOperands<'_>,
    out: &Tensor,
    lse: &Tensor,
    grad: &Tensor,
) -> Result<[Tensor; 3]> {
    let (n, h, l, s, e, ev) = dims(a);
    for (name, t) in [("out", out), ("lse", lse), ("grad", grad)] {
        if !t.is_contiguous() || t.dtype() != T::DTYPE {
            return Err(TensorError::internal(BACKWARD, format!("{name} must be contiguous {}", T::DTYPE)));
        }
    }
    let device = a.q.device();
    let dq = UninitTensor::new([n, h, l, e], T::DTYPE, device)?;
    let dk = UninitTensor::new([n, h, s, e], T::DTYPE, device)?;
    let dv = UninitTensor::new([n, h, s, ev], T::DTYPE, device)?;
    if l == 0 {
        // No query: no head to walk, and keys and values get no gradient.
        return Ok([dq.zeros(BACKWARD)?, dk.zeros(BACKWARD)?, dv.zeros(BACKWARD)?]);
    }
    let (outs, lses, grads) =
        (out.storage().read::<T>(BACKWARD)?, lse.storage().read::<T>(BACKWARD)?, grad.storage().read::<T>(BACKWARD)?);
    let (o0, l0, g0) = (out.layout().offset(), lse.layout().offset(), grad.layout().offset());
    with_reads::<T, _>(BACKWARD, a, |reads| {
        let run = |dq: &mut [T], dk: &mut [T], dv: &mut [T]| -> Result<()> {
            let heads = dq
                .par_chunks_mut((l * e).max(1))
                .zip(dk.par_chunks_mut((s * e).max(1)))
                .zip(dv.par_chunks_mut((s * ev).max(1)))
                .enumerate();
            heads.try_for_each_init(Vec::new, |scratch, (b, ((dq, dk), dv))| {
                let head = reads.head(BACKWARD, b)?;
                let matrix = |data, offset| MatRef::new(data, offset, [l, ev], [ev, 1]);
                let inputs = HeadGradInputs {
                    out: matrix(&outs, o0 + b * l * ev).map_err(|e| TensorError::kernel(BACKWARD, e))?,
                    lse: lses
                        .get(l0 + b * l..l0 + (b + 1) * l)
                        .ok_or_else(|| TensorError::internal(BACKWARD, format!("lse has no rows for head {b}")))?,
                    grad: matrix(&grads, g0 + b * l * ev).map_err(|e| TensorError::kernel(BACKWARD, e))?,
                };
                head_backward(&head, &inputs, [dq, dk, dv], scratch).map_err(|e| TensorError::kernel(BACKWARD, e))
            })
        };
        let mut pair = None;
        // SAFETY: the heads tile the three gradients and `head_backward`
        // overwrites every element of its head's (zeros first, then sums).
        let dq = unsafe {
            dq.init_with::<T>(BACKWARD, |dq| {
                pair = Some(UninitTensor::init_pair_with::<T, T>(dk, dv, BACKWARD, |dk, dv| run(dq, dk, dv))?);
                Ok(())
            })?
        };
        let (dk, dv) =
            pair.ok_or_else(|| TensorError::internal(BACKWARD, "the key and value gradients were not made"))?;
        Ok([dq, dk, dv])
    })
}
