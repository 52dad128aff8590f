//! Softmax and log-softmax of rows and of columns, computed stably: the max
//! is subtracted before exponentiating, so inputs like 1000.0 do not
//! overflow. The loops run in `f32` or `f64`; callers widen half types first.
//!
//! `f32` uses [`exp_f32`], a branch-free exponential that the compiler
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

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in two so that `n * LN2_HI` is exact for the `n` that occur.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 * 2^23: adding it rounds an f32 of magnitude < 2^22 to an integer,
/// which then sits in the low mantissa bits.
const ROUNDER: f32 = 12_582_912.0;
/// Below this (e^x < 2^-124.8) the result is flushed to 0, which keeps the
/// exponent arithmetic in the normal range.
const EXP_MIN: f32 = -86.5;
/// Above this `e^x` overflows f32.
const EXP_MAX: f32 = 88.722_84;

/// `e^x` for `f32`, within 2 ulp of the exact value, written without
/// branches or calls so that loops over it vectorise (Cephes' `expf`
/// polynomial after the usual `x = n ln 2 + r` reduction). Results below
/// `2.6e-38` (x < -86.5) are flushed to 0; x > 88.72 gives infinity; NaN stays NaN.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    // `clamp` keeps a NaN.
    let clamped = x.clamp(EXP_MIN, EXP_MAX);
    let shifted = clamped * LOG2E + ROUNDER;
    let n = shifted - ROUNDER;
    let r = clamped - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    // 2^(n-1) from the integer in `shifted`'s low bits (n - 1 + 127 = n + 126),
    // times 2: n can be 128, whose 2^n is not an f32 but 2^127 * 2 * y is.
    let biased = shifted.to_bits().wrapping_sub(ROUNDER.to_bits()).wrapping_add(126);
    let result = y * f32::from_bits(biased << 23) * 2.0;
    if x > EXP_MAX {
        f32::INFINITY
    } else if x < EXP_MIN {
        0.0
    } else {
        result
    }
}

/// The body of [`exp_shifted_f32`], inlined into each instruction-set variant.
#[inline(always)]
fn exp_shifted_body(x: &[f32], shift: f32, out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = exp_f32(v - shift);
    }
}

/// [`exp_shifted_body`] compiled for AVX-512 (16 lanes).
///
/// # Safety
/// The CPU supports AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn exp_shifted_avx512(x: &[f32], shift: f32, out: &mut [f32]) {
    exp_shifted_body(x, shift, out)
}

/// [`exp_shifted_body`] compiled for AVX2 + FMA (8 lanes).
///
/// # Safety
/// The CPU supports AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_shifted_avx2(x: &[f32], shift: f32, out: &mut [f32]) {
    exp_shifted_body(x, shift, out)
}

/// `out[i] = exp_f32(x[i] - shift)` over the common length, on the widest
/// vectors this CPU has (picked at run time).
pub fn exp_shifted_f32(x: &[f32], shift: f32, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        let features = crate::cpu_features::cpu_features();
        if features.avx512f {
            // SAFETY: AVX-512F was detected on this CPU.
            return unsafe { exp_shifted_avx512(x, shift, out) };
        }
        if features.has_avx2_fma() {
            // SAFETY: AVX2 and FMA were detected on this CPU.
            return unsafe { exp_shifted_avx2(x, shift, out) };
        }
    }
    exp_shifted_body(x, shift, out)
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
