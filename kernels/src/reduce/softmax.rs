//! Softmax and log-softmax of rows and of columns, computed stably: the max
//! is subtracted before exponentiating, so inputs like 1000.0 do not
//! overflow. The loops run in `f32` or `f64`; callers widen half types first.
//!
//! `f32` uses [`exp_f32`](crate::reduce::exp_f32), a branch-free exponential that the compiler
//! vectorises (libm's `expf` is a call per element, ~10x slower here).

use super::{extreme_seq, replaces, sum};
use crate::error::{KernelError, Result};
use crate::scalar::{Float, ReduceElement};

/// Columns processed together by the column kernels: the running max and
/// sum of this many columns stay in L1.
const COLUMN_BLOCK: usize = 512;

fn check_lengths(op: &str, x: usize, out: usize) -> Result<()> {
    if x == out {
        Ok(())
    } else {
        Err(KernelError::ShapeMismatch { detail: format!("{op}: input has {x} elements but out has {out}") })
    }
}

/// `out[i] = exp(x[i] - max) / Σ_j exp(x[j] - max)`. A NaN in the row makes
/// the whole row NaN. Errors when the lengths differ.
pub fn softmax_row<F: Float + ReduceElement<Acc = F>>(x: &[F], out: &mut [F]) -> Result<()> {
    check_lengths("softmax_row", x.len(), out.len())?;
    let Some(&first) = x.first() else { return Ok(()) };
    let max = extreme_seq::<F, true>(x, first);
    F::exp_shifted(x, max, out);
    let scale = F::ONE / sum(out);
    for o in out.iter_mut() {
        *o = *o * scale;
    }
    Ok(())
}

/// `out[i] = x[i] - max - ln Σ_j exp(x[j] - max)`. Errors when the lengths
/// differ.
pub fn log_softmax_row<F: Float + ReduceElement<Acc = F>>(x: &[F], out: &mut [F]) -> Result<()> {
    check_lengths("log_softmax_row", x.len(), out.len())?;
    let Some(&first) = x.first() else { return Ok(()) };
    let max = extreme_seq::<F, true>(x, first);
    F::exp_shifted(x, max, out);
    let log_sum = sum(out).ln();
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (v - max) - log_sum;
    }
    Ok(())
}

/// Softmax down the columns of a row-major `rows × width` matrix (`x.len()`
/// must be a multiple of `width`): each column is normalised on its own.
/// Errors when the lengths differ or do not divide into rows.
pub fn softmax_columns<F: Float>(x: &[F], out: &mut [F], width: usize) -> Result<()> {
    columns(x, out, width, false)
}

/// Log-softmax down the columns of a row-major `rows × width` matrix.
/// Errors when the lengths differ or do not divide into rows.
pub fn log_softmax_columns<F: Float>(x: &[F], out: &mut [F], width: usize) -> Result<()> {
    columns(x, out, width, true)
}

fn columns<F: Float>(x: &[F], out: &mut [F], width: usize, log: bool) -> Result<()> {
    check_lengths("softmax_columns", x.len(), out.len())?;
    if x.is_empty() {
        return Ok(());
    }
    if width == 0 || !x.len().is_multiple_of(width) {
        return Err(KernelError::ShapeMismatch {
            detail: format!("softmax_columns: {} elements do not make rows of width {width}", x.len()),
        });
    }
    let rows = x.len() / width;
    let mut max = vec![F::ZERO; COLUMN_BLOCK.min(width)];
    let mut total = vec![F::ZERO; COLUMN_BLOCK.min(width)];
    for start in (0..width).step_by(COLUMN_BLOCK) {
        let cols = COLUMN_BLOCK.min(width - start);
        let (max, total) = (&mut max[..cols], &mut total[..cols]);
        let at = |r: usize| r * width + start..r * width + start + cols;
        max.copy_from_slice(&x[at(0)]);
        for r in 1..rows {
            for (m, &v) in max.iter_mut().zip(&x[at(r)]) {
                *m = if replaces::<_, true>(v, *m) { v } else { *m };
            }
        }
        total.fill(F::ZERO);
        for r in 0..rows {
            let (xs, os) = (&x[at(r)], &mut out[at(r)]);
            for (((o, &v), &m), t) in os.iter_mut().zip(xs).zip(max.iter()).zip(total.iter_mut()) {
                let e = (v - m).fast_exp();
                *t = *t + e;
                *o = e;
            }
        }
        if log {
            for t in total.iter_mut() {
                *t = t.ln();
            }
            for r in 0..rows {
                let (xs, os) = (&x[at(r)], &mut out[at(r)]);
                for (((o, &v), &m), &t) in os.iter_mut().zip(xs).zip(max.iter()).zip(total.iter()) {
                    *o = (v - m) - t;
                }
            }
        } else {
            for t in total.iter_mut() {
                *t = F::ONE / *t;
            }
            for r in 0..rows {
                for (o, &t) in out[at(r)].iter_mut().zip(total.iter()) {
                    *o = *o * t;
                }
            }
        }
    }
    Ok(())
}
