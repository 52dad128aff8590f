//! Layer normalisation of rows, forward and backward, each one pass over a
//! row held in cache (PyTorch's `layer_norm` kernels on the CPU).
//!
//! Forward, per row of width `W`: the mean, the biased variance (two-pass:
//! `Σ(x − mean)²` after the mean, accurate when the mean is large compared
//! with the spread), `rstd = 1/√(var + eps)`, and `y = (x − mean)·rstd·w + b`.
//! Backward, with `x̂ = (x − mean)·rstd` recomputed and `ĝ = g·w`:
//! `dx = rstd·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂))`, and the parameter gradients
//! `dw += g·x̂`, `db += g` summed over rows (the caller gives each thread its
//! own accumulators and adds them up). The loops run in `f32` or `f64`;
//! callers widen half types first.
//!
//! ```
//! use brasa_kernels::norm::{layer_norm_backward_row, layer_norm_row, RowGrads};
//! let x = [1.0f64, 2.0, 3.0, 4.0];
//! let mut y = [0.0; 4];
//! let (mean, rstd) = layer_norm_row(&x, None, None, 0.0, &mut y)?;
//! assert_eq!(mean, 2.5);
//! assert!((y[0] + 1.3416407864998738).abs() < 1e-12);
//! // The gradient of Σ y is 0: y always sums to 0.
//! let (mut dx, mut dw, mut db) = ([9.0; 4], [0.0; 4], [0.0; 4]);
//! let grads = RowGrads { dx: Some(&mut dx), dw: Some(&mut dw), db: Some(&mut db) };
//! layer_norm_backward_row(&[1.0; 4], &x, mean, rstd, None, grads)?;
//! assert!(dx.iter().all(|d| d.abs() < 1e-12));
//! assert_eq!(db, [1.0; 4]);
//! # Ok::<(), brasa_kernels::KernelError>(())
//! ```

use crate::error::{KernelError, Result};
use crate::reduce::{lane_sum_by, sum, sum_sq_dev};
use crate::scalar::{Float, ReduceElement};

/// The float types the normalisation loops run in: `f32` and `f64`.
pub trait NormFloat: Float + ReduceElement<Acc = Self> {}
impl NormFloat for f32 {}
impl NormFloat for f64 {}

fn check(what: &str, len: usize, width: usize) -> Result<()> {
    if len == width {
        Ok(())
    } else {
        Err(KernelError::ShapeMismatch {
            detail: format!("layer_norm: {what} has {len} elements but a row has {width}"),
        })
    }
}

/// Normalises one row `x` into `out` with the optional per-element affine
/// `weight` and `bias`; returns the row's `(mean, rstd)`. An empty row gives
/// `(0, 1/√eps)` and writes nothing.
pub fn layer_norm_row<F: NormFloat>(
    x: &[F],
    weight: Option<&[F]>,
    bias: Option<&[F]>,
    eps: F,
    out: &mut [F],
) -> Result<(F, F)> {
    let width = x.len();
    check("out", out.len(), width)?;
    for (what, param) in [("weight", weight), ("bias", bias)] {
        if let Some(p) = param {
            check(what, p.len(), width)?;
        }
    }
    let count = F::from_f64(width.max(1) as f64);
    let mean = sum(x) / count;
    let var = sum_sq_dev(x, mean) / count;
    let rstd = F::ONE / (var + eps).sqrt();
    // One loop per affine form, so each vectorises without branches.
    match (weight, bias) {
        (Some(w), Some(b)) => {
            for (((o, &v), &w), &b) in out.iter_mut().zip(x).zip(w).zip(b) {
                *o = (v - mean) * rstd * w + b;
            }
        }
        (Some(w), None) => {
            for ((o, &v), &w) in out.iter_mut().zip(x).zip(w) {
                *o = (v - mean) * rstd * w;
            }
        }
        (None, Some(b)) => {
            for ((o, &v), &b) in out.iter_mut().zip(x).zip(b) {
                *o = (v - mean) * rstd + b;
            }
        }
        (None, None) => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = (v - mean) * rstd;
            }
        }
    }
    Ok((mean, rstd))
}

/// Where one row's gradients go; `None` skips that gradient's work.
pub struct RowGrads<'a, F> {
    /// The input's gradient for this row (overwritten).
    pub dx: Option<&'a mut [F]>,
    /// The weight's gradient, accumulated into (`+= g·x̂`).
    pub dw: Option<&'a mut [F]>,
    /// The bias's gradient, accumulated into (`+= g`).
    pub db: Option<&'a mut [F]>,
}

/// The backward of [`layer_norm_row`] for one row: `g` is the output's
/// gradient, `x` the row, `mean`/`rstd` what forward returned, `weight` the
/// affine weight if there was one.
pub fn layer_norm_backward_row<F: NormFloat>(
    g: &[F],
    x: &[F],
    mean: F,
    rstd: F,
    weight: Option<&[F]>,
    grads: RowGrads<'_, F>,
) -> Result<()> {
    let width = x.len();
    check("the gradient", g.len(), width)?;
    if let Some(w) = weight {
        check("weight", w.len(), width)?;
    }
    let RowGrads { dx, dw, db } = grads;
    if let Some(dw) = dw {
        check("the weight's gradient", dw.len(), width)?;
        for ((acc, &g), &v) in dw.iter_mut().zip(g).zip(x) {
            *acc = *acc + g * ((v - mean) * rstd);
        }
    }
    if let Some(db) = db {
        check("the bias's gradient", db.len(), width)?;
        for (acc, &g) in db.iter_mut().zip(g) {
            *acc = *acc + g;
        }
    }
    let Some(dx) = dx else {
        return Ok(());
    };
    check("the input's gradient", dx.len(), width)?;
    let count = F::from_f64(width.max(1) as f64);
    // dx holds ĝ first (g·w), so the sums and the final pass read it once more.
    match weight {
        Some(w) => {
            for ((d, &g), &w) in dx.iter_mut().zip(g).zip(w) {
                *d = g * w;
            }
        }
        None => dx.copy_from_slice(g),
    }
    let mean_g = lane_sum_by(dx, |v| v) / count;
    let mut mean_g_xhat = F::ZERO;
    {
        // Σ ĝ·x̂ in lanes: pair each ĝ with its x̂.
        let mut lanes = [F::ZERO; 8];
        let mut pairs = dx.chunks_exact(8).zip(x.chunks_exact(8));
        for (gc, xc) in &mut pairs {
            for ((lane, &gh), &v) in lanes.iter_mut().zip(gc).zip(xc) {
                *lane = *lane + gh * ((v - mean) * rstd);
            }
        }
        let tail = width - width % 8;
        for (&gh, &v) in dx[tail..].iter().zip(&x[tail..]) {
            mean_g_xhat = mean_g_xhat + gh * ((v - mean) * rstd);
        }
        let folded = lanes.iter().fold(F::ZERO, |acc, &l| acc + l);
        mean_g_xhat = (mean_g_xhat + folded) / count;
    }
    for (d, &v) in dx.iter_mut().zip(x) {
        let x_hat = (v - mean) * rstd;
        *d = rstd * (*d - mean_g - x_hat * mean_g_xhat);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The forward and its row statistics in f64, term by term.
    fn reference(x: &[f64], w: Option<&[f64]>, b: Option<&[f64]>, eps: f64) -> (Vec<f64>, f64, f64) {
        let n = x.len() as f64;
        let mean = x.iter().sum::<f64>() / n;
        let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        let rstd = 1.0 / (var + eps).sqrt();
        let y =
            (0..x.len()).map(|i| (x[i] - mean) * rstd * w.map_or(1.0, |w| w[i]) + b.map_or(0.0, |b| b[i])).collect();
        (y, mean, rstd)
    }

    fn row(width: usize, seed: u64) -> Vec<f64> {
        // A deterministic spread with a large offset (the two-pass variance case).
        (0..width).map(|i| 1000.0 + (((i as u64 * 2654435761 + seed) % 1000) as f64) / 100.0).collect()
    }

    #[test]
    fn forward_matches_the_definition_for_every_affine_form() {
        for width in [1usize, 7, 8, 33, 256] {
            let x = row(width, 3);
            let w: Vec<f64> = (0..width).map(|i| 0.5 + i as f64 / 10.0).collect();
            let b: Vec<f64> = (0..width).map(|i| i as f64 - 3.0).collect();
            for (wo, bo) in [(None, None), (Some(&w[..]), None), (None, Some(&b[..])), (Some(&w[..]), Some(&b[..]))] {
                let mut out = vec![0.0; width];
                let (mean, rstd) = layer_norm_row(&x, wo, bo, 1e-5, &mut out).unwrap();
                let (want, want_mean, want_rstd) = reference(&x, wo, bo, 1e-5);
                assert!((mean - want_mean).abs() < 1e-9 && (rstd - want_rstd).abs() < 1e-6 * want_rstd);
                for (o, e) in out.iter().zip(&want) {
                    assert!((o - e).abs() < 1e-9, "width {width}: {o} vs {e}");
                }
                // f32 agrees within its precision.
                let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
                let w32: Vec<f32> = w.iter().map(|&v| v as f32).collect();
                let b32: Vec<f32> = b.iter().map(|&v| v as f32).collect();
                let mut out32 = vec![0.0f32; width];
                layer_norm_row(&x32, wo.map(|_| &w32[..]), bo.map(|_| &b32[..]), 1e-5, &mut out32).unwrap();
                for (o, e) in out32.iter().zip(&want) {
                    assert!((f64::from(*o) - e).abs() < 2e-3 * (1.0 + e.abs()), "f32 width {width}: {o} vs {e}");
                }
            }
        }
    }

    #[test]
    fn backward_matches_finite_differences() {
        let width = 19;
        let x = row(width, 11);
        let w: Vec<f64> = (0..width).map(|i| 0.25 + i as f64 / 7.0).collect();
        let g: Vec<f64> = (0..width).map(|i| ((i * 7) % 5) as f64 - 2.0).collect();
        let eps = 1e-3;
        // loss = Σ g·y(x, w, b).
        let loss = |x: &[f64], w: &[f64], b: &[f64]| -> f64 {
            let (y, _, _) = reference(x, Some(w), Some(b), eps);
            y.iter().zip(&g).map(|(y, g)| y * g).sum()
        };
        let b = vec![0.5; width];
        let mut out = vec![0.0; width];
        let (mean, rstd) = layer_norm_row(&x, Some(&w), Some(&b), eps, &mut out).unwrap();
        let (mut dx, mut dw, mut db) = (vec![0.0; width], vec![1.0; width], vec![2.0; width]);
        let grads = RowGrads { dx: Some(&mut dx), dw: Some(&mut dw), db: Some(&mut db) };
        layer_norm_backward_row(&g, &x, mean, rstd, Some(&w), grads).unwrap();
        let h = 1e-6;
        for i in 0..width {
            let bump = |v: &[f64], by: f64| {
                let mut v = v.to_vec();
                v[i] += by;
                v
            };
            let num_dx = (loss(&bump(&x, h), &w, &b) - loss(&bump(&x, -h), &w, &b)) / (2.0 * h);
            let num_dw = (loss(&x, &bump(&w, h), &b) - loss(&x, &bump(&w, -h), &b)) / (2.0 * h);
            assert!((dx[i] - num_dx).abs() < 1e-5 * (1.0 + num_dx.abs()), "dx[{i}] {} vs {num_dx}", dx[i]);
            // The parameter gradients were accumulated onto 1 and 2.
            assert!((dw[i] - 1.0 - num_dw).abs() < 1e-5 * (1.0 + num_dw.abs()), "dw[{i}]");
            assert!((db[i] - 2.0 - g[i]).abs() < 1e-12, "db[{i}]");
        }
    }

    #[test]
    fn only_the_asked_gradients_are_written_and_lengths_are_checked() {
        let x = [1.0f32, 2.0, 4.0];
        let mut dw = [0.0f32; 3];
        let grads = RowGrads { dx: None, dw: Some(&mut dw), db: None };
        layer_norm_backward_row(&[1.0, 1.0, 1.0], &x, 2.0, 0.5, None, grads).unwrap();
        assert_eq!(dw, [-0.5, 0.0, 1.0]);
        let mut out = [0.0f32; 2];
        let error = layer_norm_row(&x, None, None, 0.0, &mut out).unwrap_err().to_string();
        assert!(error.contains("out has 2 elements but a row has 3"), "{error}");
        let mut dx = [0.0f32; 3];
        let grads = RowGrads { dx: Some(&mut dx), dw: None, db: None };
        assert!(layer_norm_backward_row(&[1.0], &x, 0.0, 1.0, None, grads).is_err());
    }
}
