//! Fused scaled dot-product attention of one (batch, head) on the host:
//! `out = softmax(scale · q·kᵀ + mask) · v`, forward and backward, in f32
//! or f64.
//!
//! Why fused: composed from tensor ops, the attention of a small
//! transformer makes about ten passes over every head's `[L, S]` scores at
//! once (products, scaling, masking, two maxima, softmax, logarithm), each
//! a fork-join over the threads and each larger than the caches; a head at
//! a time, here, keeps a block of scores in cache from its product to its
//! use, and the caller shares whole heads out to the threads.
//!
//! # Method
//! Query rows go in blocks of [`QUERY_BLOCK`] (half as many with the
//! causal mask). A block's scores against
//! every key it may see (with the causal mask, keys up to its last row) are
//! one product; each row gets its additive mask, the causal `-∞`, its
//! maximum `m`, `p = e^(s - m)`, `l = Σ p`, and is normalised; the block's
//! output is `p · v`. Only the output and each row's log-sum-exp
//! `m + ln l` are kept (O(L) memory besides the scratch of one block). The
//! backward recomputes `p = e^(s - lse)` block by block and runs
//! FlashAttention's gradient: `dv += pᵀ·do`, `dp = do·vᵀ`,
//! `ds = p ∘ (dp - rowsum(do ∘ out)) · scale`, `dq = ds·k`, `dk += dsᵀ·q`.
//!
//! A row that sees no key (every score `-∞`) gives 0, with log-sum-exp
//! `+∞`, and no gradient; a NaN score makes its row NaN, as the softmax
//! does.
//!
//! ```
//! use brasa_kernels::attention::{head_forward, HeadOperands};
//! use brasa_kernels::gemm::MatRef;
//! // One query against two keys with equal scores: the mean of the values.
//! let (q, k, v) = ([1.0f64, 0.0], [1.0, 0.0, 1.0, 0.0], [2.0, 4.0]);
//! let head = HeadOperands {
//!     q: MatRef::row_major(&q, 1, 2)?,
//!     k: MatRef::row_major(&k, 2, 2)?,
//!     v: MatRef::row_major(&v, 2, 1)?,
//!     mask: None,
//!     scale: 1.0,
//!     causal: false,
//! };
//! let (mut out, mut lse) = ([0.0; 1], [0.0; 1]);
//! head_forward(&head, &mut out, &mut lse, &mut Vec::new())?;
//! assert_eq!(out, [3.0]);
//! assert!((lse[0] - (1.0 + 2f64.ln())).abs() < 1e-15);
//! # Ok::<(), brasa_kernels::KernelError>(())
//! ```

use crate::gemm::{gemm_with, GemmElement, GemmOptions, MatMut, MatRef, Parallelism};
use crate::reduce::{max, sum, ReduceElement};
use crate::scalar::Float;
use crate::{KernelError, Result};

/// Query rows per block: a block's scores are at most `[QUERY_BLOCK, S]`,
/// so the scratch of a head is two such blocks whatever `L` is. With the
/// causal mask blocks have half as many rows, so that fewer of the scores
/// computed lie past the diagonal: on the GPT's `[12, 4, 64, 32]` (2-core
/// Zen 3 EPYC, f32, forward + backward, alternating runs) 32-row blocks
/// took 0.45–0.47 + 0.85–0.91 ms against 0.51–0.58 + 0.95–1.15 ms for 64
/// rows, and 16 rows lost again; without the mask 64 rows beat 32.
pub const QUERY_BLOCK: usize = 64;

/// The element types the fused attention runs in: f32 and f64.
pub trait AttentionFloat: Float + ReduceElement<Acc = Self> + GemmElement<Scalar = Self> {}
impl AttentionFloat for f32 {}
impl AttentionFloat for f64 {}

/// An additive mask `[L, S]`: element `(i, j)` is
/// `data[offset + i · strides[0] + j · strides[1]]` (a stride of 0
/// broadcasts).
#[derive(Clone, Copy, Debug)]
pub struct AdditiveMask<'a, T> {
    /// The underlying elements.
    pub data: &'a [T],
    /// Where element `(0, 0)` is.
    pub offset: usize,
    /// Row and column strides, in elements.
    pub strides: [usize; 2],
}

/// One head's operands: `q` `[L, E]`, `k` `[S, E]`, `v` `[S, Ev]`.
#[derive(Clone, Copy, Debug)]
pub struct HeadOperands<'a, T> {
    /// The queries.
    pub q: MatRef<'a, T>,
    /// The keys.
    pub k: MatRef<'a, T>,
    /// The values.
    pub v: MatRef<'a, T>,
    /// Added to the scaled scores.
    pub mask: Option<AdditiveMask<'a, T>>,
    /// The factor on `q·kᵀ`.
    pub scale: T,
    /// PyTorch's top-left causal mask: query `i` sees keys `j ≤ i`.
    pub causal: bool,
}

impl<T: AttentionFloat> HeadOperands<'_, T> {
    /// `(L, S, E, Ev)`, checked against each other.
    fn dims(&self) -> Result<(usize, usize, usize, usize)> {
        let (l, e, s, ev) = (self.q.rows(), self.q.cols(), self.k.rows(), self.v.cols());
        if self.k.cols() != e || self.v.rows() != s {
            return Err(KernelError::ShapeMismatch {
                detail: format!(
                    "attention: q is {l}x{e}, k {s}x{}, v {}x{ev}: need k Sx{e} and v {s}xEv",
                    self.k.cols(),
                    self.v.rows()
                ),
            });
        }
        if let Some(m) = &self.mask {
            let last = (l.max(1) - 1) * m.strides[0] + (s.max(1) - 1) * m.strides[1];
            if l > 0 && s > 0 && m.offset + last >= m.data.len() {
                return Err(KernelError::ShapeMismatch {
                    detail: format!("attention: the mask does not cover {l}x{s} scores"),
                });
            }
        }
        Ok((l, s, e, ev))
    }

    /// Query rows per block (see [`QUERY_BLOCK`]).
    fn rows_per_block(&self) -> usize {
        if self.causal {
            QUERY_BLOCK / 2
        } else {
            QUERY_BLOCK
        }
    }

    /// The keys query rows `i0..i0 + rows` may see.
    fn keys(&self, s: usize, i0: usize, rows: usize) -> usize {
        if self.causal {
            s.min(i0 + rows)
        } else {
            s
        }
    }

    /// `scores[r, j] = scale · q[i0 + r]·k[j] + mask[i0 + r, j]`, `-∞` past
    /// the causal diagonal, as a row-major `[rows, keys]` block.
    fn scores(&self, i0: usize, rows: usize, keys: usize, scores: &mut [T]) -> Result<()> {
        let e = self.q.cols();
        let c = MatMut::row_major(scores, rows, keys)?;
        gemm_with(&sequential(), self.scale, self.q.sub(i0, 0, rows, e), self.k.sub(0, 0, keys, e).t(), T::ZERO, c)?;
        for (r, row) in scores.chunks_exact_mut(keys.max(1)).take(rows).enumerate() {
            let i = i0 + r;
            if let Some(m) = &self.mask {
                let base = m.offset + i * m.strides[0];
                for (j, x) in row.iter_mut().enumerate() {
                    *x = *x + m.data[base + j * m.strides[1]];
                }
            }
            if self.causal && i + 1 < keys {
                row[i + 1..].fill(T::NEG_INFINITY);
            }
        }
        Ok(())
    }
}

/// One thread per product: the caller shares heads out to the threads.
fn sequential() -> GemmOptions {
    GemmOptions { parallelism: Parallelism::Sequential, ..GemmOptions::default() }
}

/// `scratch` grown to at least `len` elements (never shrunk: the caller
/// keeps it per thread across heads).
fn scratch_of<T: AttentionFloat>(scratch: &mut Vec<T>, len: usize) -> &mut [T] {
    if scratch.len() < len {
        scratch.resize(len, T::ZERO);
    }
    &mut scratch[..len]
}

/// One block of query rows: its first row, its row count, the keys it
/// sees, its scores (row-major `[rows, keys]`, computed) and a second
/// buffer of the same size for the caller.
struct Block<'s, T> {
    i0: usize,
    rows: usize,
    keys: usize,
    scores: &'s mut [T],
    spare: &'s mut [T],
}

/// Runs `each` on every block of query rows ([`QUERY_BLOCK`]) of a head with
/// `l` queries and `s > 0` keys, its scores computed into `scratch`.
fn for_each_block<T: AttentionFloat>(
    head: &HeadOperands<'_, T>,
    (l, s): (usize, usize),
    scratch: &mut Vec<T>,
    mut each: impl FnMut(Block<'_, T>) -> Result<()>,
) -> Result<()> {
    let per_block = head.rows_per_block();
    let block = per_block.min(l.max(1)) * s;
    let (scores, spare) = scratch_of(scratch, 2 * block).split_at_mut(block);
    for i0 in (0..l).step_by(per_block) {
        let rows = per_block.min(l - i0);
        let keys = head.keys(s, i0, rows);
        let (scores, spare) = (&mut scores[..rows * keys], &mut spare[..rows * keys]);
        head.scores(i0, rows, keys, scores)?;
        each(Block { i0, rows, keys, scores, spare })?;
    }
    Ok(())
}

/// The forward of one head: `out` (`[L, Ev]`, row-major) and each row's
/// log-sum-exp `lse` (`[L]`; `+∞` for a row that sees no key). `scratch`
/// is working memory the caller may reuse across calls.
pub fn head_forward<T: AttentionFloat>(
    head: &HeadOperands<'_, T>,
    out: &mut [T],
    lse: &mut [T],
    scratch: &mut Vec<T>,
) -> Result<()> {
    let (l, s, _, ev) = head.dims()?;
    if out.len() != l * ev || lse.len() != l {
        return Err(KernelError::ShapeMismatch {
            detail: format!("attention: out has {} elements and lse {}, need {l}x{ev} and {l}", out.len(), lse.len()),
        });
    }
    if s == 0 {
        out.fill(T::ZERO);
        lse.fill(T::from_f64(f64::INFINITY));
        return Ok(());
    }
    for_each_block(head, (l, s), scratch, |Block { i0, rows, keys, scores, spare: probs }| {
        for (r, (row, p)) in scores.chunks_exact(keys).zip(probs.chunks_exact_mut(keys)).enumerate() {
            let max = max(row).unwrap_or(T::NEG_INFINITY);
            if max == T::NEG_INFINITY {
                // No key: a row of zeros, and no gradient in backward.
                p.fill(T::ZERO);
                lse[i0 + r] = T::from_f64(f64::INFINITY);
                continue;
            }
            T::exp_shifted(row, max, p);
            let total = sum(p);
            lse[i0 + r] = max + total.ln();
            let inverse = T::ONE / total;
            for x in p.iter_mut() {
                *x = *x * inverse;
            }
        }
        let o = MatMut::new(out, i0 * ev, [rows, ev], [ev, 1])?;
        gemm_with(&sequential(), T::ONE, MatRef::row_major(probs, rows, keys)?, head.v.sub(0, 0, keys, ev), T::ZERO, o)
    })
}

/// What one head's backward reads besides its operands: the forward's
/// `out` (`[L, Ev]`) and `lse` (`[L]`), and the gradient of `out`.
#[derive(Clone, Copy, Debug)]
pub struct HeadGradInputs<'a, T> {
    /// The forward's output.
    pub out: MatRef<'a, T>,
    /// The forward's log-sum-exp per query row.
    pub lse: &'a [T],
    /// The gradient of the output.
    pub grad: MatRef<'a, T>,
}

/// The backward of one head: `dq` (`[L, E]`), `dk` (`[S, E]`) and `dv`
/// (`[S, Ev]`), row-major, each overwritten.
pub fn head_backward<T: AttentionFloat>(
    head: &HeadOperands<'_, T>,
    inputs: &HeadGradInputs<'_, T>,
    [dq, dk, dv]: [&mut [T]; 3],
    scratch: &mut Vec<T>,
) -> Result<()> {
    let (l, s, e, ev) = head.dims()?;
    let HeadGradInputs { out, lse, grad } = *inputs;
    let fits = |m: &MatRef<'_, T>| m.rows() == l && m.cols() == ev;
    if !fits(&out) || !fits(&grad) || lse.len() != l || dq.len() != l * e || dk.len() != s * e || dv.len() != s * ev {
        return Err(KernelError::ShapeMismatch {
            detail: format!(
                "attention backward: out {}x{}, grad {}x{}, lse {}, dq {}, dk {}, dv {} for L {l}, S {s}, E {e}, Ev {ev}",
                out.rows(),
                out.cols(),
                grad.rows(),
                grad.cols(),
                lse.len(),
                dq.len(),
                dk.len(),
                dv.len()
            ),
        });
    }
    dq.fill(T::ZERO);
    dk.fill(T::ZERO);
    dv.fill(T::ZERO);
    if s == 0 || l == 0 {
        return Ok(());
    }
    let seq = sequential();
    for_each_block(head, (l, s), scratch, |Block { i0, rows, keys, scores, spare: probs }| {
        // p = e^(s - lse): 0 on rows that saw no key (lse = +∞).
        for (r, (row, p)) in scores.chunks_exact(keys).zip(probs.chunks_exact_mut(keys)).enumerate() {
            T::exp_shifted(row, lse[i0 + r], p);
        }
        let g = grad.sub(i0, 0, rows, ev);
        let p = MatRef::row_major(&*probs, rows, keys)?;
        // dv[..keys] += pᵀ · do
        gemm_with(&seq, T::ONE, p.t(), g, T::ONE, MatMut::new(dv, 0, [keys, ev], [ev, 1])?)?;
        // dp = do · vᵀ, into the scores' buffer.
        let dp = MatMut::row_major(scores, rows, keys)?;
        gemm_with(&seq, T::ONE, g, head.v.sub(0, 0, keys, ev).t(), T::ZERO, dp)?;
        // ds = p ∘ (dp - rowsum(do ∘ out)) · scale
        for (r, (d, p)) in scores.chunks_exact_mut(keys).zip(probs.chunks_exact(keys)).enumerate() {
            let i = i0 + r;
            // rowsum(do ∘ out); both are L x Ev (checked above).
            let delta = (0..ev).filter_map(|c| Some(*grad.get(i, c)? * *out.get(i, c)?)).fold(T::ZERO, |a, x| a + x);
            for (x, &pv) in d.iter_mut().zip(p) {
                *x = pv * (*x - delta) * head.scale;
            }
        }
        let ds = MatRef::row_major(&*scores, rows, keys)?;
        // dq[block] = ds · k[..keys]; dk[..keys] += dsᵀ · q[block]
        gemm_with(&seq, T::ONE, ds, head.k.sub(0, 0, keys, e), T::ZERO, MatMut::new(dq, i0 * e, [rows, e], [e, 1])?)?;
        gemm_with(&seq, T::ONE, ds.t(), head.q.sub(i0, 0, rows, e), T::ONE, MatMut::new(dk, 0, [keys, e], [e, 1])?)
    })
}

#[cfg(test)]
mod tests;
