use super::*;

/// Deterministic values in about [-1, 1].
fn values(n: usize, salt: f64) -> Vec<f64> {
    (0..n).map(|i| ((i as f64 + 1.0) * 0.754_877_666 + salt).sin()).collect()
}

/// The attention of one head written out in f64, row by row: output,
/// log-sum-exp and the three gradients for `grad`. The gradient uses
/// `rowsum(dp ∘ p)` where the kernel uses `rowsum(do ∘ out)` (equal in
/// exact arithmetic).
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
fn naive(
    (l, s, e, ev): (usize, usize, usize, usize),
    q: &[f64],
    k: &[f64],
    v: &[f64],
    mask: Option<&dyn Fn(usize, usize) -> f64>,
    scale: f64,
    causal: bool,
    grad: &[f64],
) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut p = vec![0.0; l * s];
    let mut lse = vec![f64::INFINITY; l];
    for i in 0..l {
        let row: Vec<f64> = (0..s)
            .map(|j| {
                let dot: f64 = (0..e).map(|c| q[i * e + c] * k[j * e + c]).sum();
                let masked = if causal && j > i { f64::NEG_INFINITY } else { 0.0 };
                scale * dot + mask.map_or(0.0, |m| m(i, j)) + masked
            })
            .collect();
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            continue;
        }
        let total: f64 = row.iter().map(|x| (x - m).exp()).sum();
        lse[i] = m + total.ln();
        for j in 0..s {
            p[i * s + j] = (row[j] - lse[i]).exp();
        }
    }
    let mut out = vec![0.0; l * ev];
    let (mut dq, mut dk, mut dv) = (vec![0.0; l * e], vec![0.0; s * e], vec![0.0; s * ev]);
    for i in 0..l {
        for c in 0..ev {
            out[i * ev + c] = (0..s).map(|j| p[i * s + j] * v[j * ev + c]).sum();
        }
        let dp: Vec<f64> = (0..s).map(|j| (0..ev).map(|c| grad[i * ev + c] * v[j * ev + c]).sum()).collect();
        let delta: f64 = (0..s).map(|j| dp[j] * p[i * s + j]).sum();
        for j in 0..s {
            let ds = p[i * s + j] * (dp[j] - delta) * scale;
            for c in 0..e {
                dq[i * e + c] += ds * k[j * e + c];
                dk[j * e + c] += ds * q[i * e + c];
            }
            for c in 0..ev {
                dv[j * ev + c] += p[i * s + j] * grad[i * ev + c];
            }
        }
    }
    (out, lse, dq, dk, dv)
}

/// Row-major `q` `[l, e]`, `k` `[s, e]` and `v` `[s, e]` as one unmasked head.
fn dense_head<'a, T: Copy>(
    [q, k, v]: [&'a [T]; 3],
    (l, s, e): (usize, usize, usize),
    scale: T,
    causal: bool,
) -> HeadOperands<'a, T> {
    HeadOperands {
        q: MatRef::row_major(q, l, e).unwrap(),
        k: MatRef::row_major(k, s, e).unwrap(),
        v: MatRef::row_major(v, s, e).unwrap(),
        mask: None,
        scale,
        causal,
    }
}

fn close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g == w) || (g - w).abs() <= tol * (1.0 + w.abs());
        assert!(ok, "{what}[{i}]: got {g}, want {w}");
    }
}

/// Runs the kernel in f64 on `(L, S, E, Ev)` against [`naive`], with `q`
/// read through a row stride wider than `E` (a view of a wider tensor).
fn check(dims: (usize, usize, usize, usize), causal: bool, mask: Option<(&[f64], [usize; 2])>) {
    let (l, s, e, ev) = dims;
    let pitch = e + 3;
    let q_wide = values(l * pitch, 0.1);
    let q: Vec<f64> = (0..l).flat_map(|i| q_wide[i * pitch..i * pitch + e].to_vec()).collect();
    let (k, v, grad) = (values(s * e, 0.2), values(s * ev, 0.3), values(l * ev, 0.4));
    let scale = 1.0 / (e as f64).sqrt();
    let mask_view = mask.map(|(data, strides)| AdditiveMask { data, offset: 0, strides });
    let mask_at = mask.map(|(data, [rs, cs])| move |i: usize, j: usize| data[i * rs + j * cs]);
    let head = HeadOperands {
        q: MatRef::new(&q_wide, 0, [l, e], [pitch, 1]).unwrap(),
        k: MatRef::row_major(&k, s, e).unwrap(),
        v: MatRef::row_major(&v, s, ev).unwrap(),
        mask: mask_view,
        scale,
        causal,
    };
    let (mut out, mut lse, mut scratch) = (vec![0.0; l * ev], vec![0.0; l], Vec::new());
    head_forward(&head, &mut out, &mut lse, &mut scratch).unwrap();
    let at = mask_at.as_ref().map(|f| f as &dyn Fn(usize, usize) -> f64);
    let (w_out, w_lse, w_dq, w_dk, w_dv) = naive(dims, &q, &k, &v, at, scale, causal, &grad);
    let label = format!("{dims:?} causal {causal} mask {}", mask.is_some());
    close(&format!("out {label}"), &out, &w_out, 1e-12);
    close(&format!("lse {label}"), &lse, &w_lse, 1e-12);
    let (mut dq, mut dk, mut dv) = (vec![0.0; l * e], vec![0.0; s * e], vec![0.0; s * ev]);
    let inputs = HeadGradInputs {
        out: MatRef::row_major(&out, l, ev).unwrap(),
        lse: &lse,
        grad: MatRef::row_major(&grad, l, ev).unwrap(),
    };
    head_backward(&head, &inputs, [&mut dq, &mut dk, &mut dv], &mut scratch).unwrap();
    close(&format!("dq {label}"), &dq, &w_dq, 1e-11);
    close(&format!("dk {label}"), &dk, &w_dk, 1e-11);
    close(&format!("dv {label}"), &dv, &w_dv, 1e-11);
}

#[test]
fn matches_the_attention_written_out_over_shapes_and_the_causal_mask() {
    // One query; L ≠ S both ways; more rows than a block (two blocks, the
    // second partial); Ev ≠ E.
    for dims in [(1, 1, 4, 4), (1, 9, 8, 8), (5, 12, 8, 3), (12, 5, 4, 6), (130, 70, 16, 16), (64, 64, 32, 32)] {
        for causal in [false, true] {
            check(dims, causal, None);
        }
    }
}

#[test]
fn additive_masks_broadcast_rows_and_empty_rows_give_zero() {
    let (l, s) = (70, 9);
    // A full mask with a row that sees nothing (row 3) and one -∞ key.
    let mut full = values(l * s, 0.7);
    full[3 * s..4 * s].fill(f64::NEG_INFINITY);
    full[5 * s + 2] = f64::NEG_INFINITY;
    check((l, s, 8, 4), false, Some((&full, [s, 1])));
    // One row of mask broadcast over every query (stride 0).
    let row = values(s, 0.9);
    check((l, s, 8, 4), false, Some((&row, [0, 1])));
    check((l, s, 8, 4), true, Some((&row, [0, 1])));
}

#[test]
fn empty_rows_have_zero_output_infinite_lse_and_no_gradient() {
    let (l, s, e) = (3, 4, 2);
    let mut mask = vec![0.0; l * s];
    mask[s..2 * s].fill(f64::NEG_INFINITY);
    let (q, k, v) = (values(l * e, 0.0), values(s * e, 1.0), values(s * e, 2.0));
    let head = HeadOperands {
        mask: Some(AdditiveMask { data: &mask, offset: 0, strides: [s, 1] }),
        ..dense_head([&q, &k, &v], (l, s, e), 1.0, false)
    };
    let (mut out, mut lse, mut scratch) = (vec![9.0; l * e], vec![9.0; l], Vec::new());
    head_forward(&head, &mut out, &mut lse, &mut scratch).unwrap();
    assert_eq!(&out[e..2 * e], [0.0, 0.0]);
    assert_eq!(lse[1], f64::INFINITY);
    let grad = vec![1.0; l * e];
    let inputs = HeadGradInputs {
        out: MatRef::row_major(&out, l, e).unwrap(),
        lse: &lse,
        grad: MatRef::row_major(&grad, l, e).unwrap(),
    };
    let (mut dq, mut dk, mut dv) = (vec![9.0; l * e], vec![9.0; s * e], vec![9.0; s * e]);
    head_backward(&head, &inputs, [&mut dq, &mut dk, &mut dv], &mut scratch).unwrap();
    assert_eq!(&dq[e..2 * e], [0.0, 0.0], "the empty row's query has no gradient");
    assert!(dq.iter().chain(&dk).chain(&dv).all(|x| x.is_finite()));
}

#[test]
fn a_nan_score_makes_its_row_nan_and_f32_agrees_with_f64() {
    let (l, s, e) = (2, 3, 2);
    let mut q = values(l * e, 0.0);
    q[0] = f64::NAN;
    let (k, v) = (values(s * e, 1.0), values(s * e, 2.0));
    let head = dense_head([&q, &k, &v], (l, s, e), 0.5, false);
    let (mut out, mut lse) = (vec![0.0; l * e], vec![0.0; l]);
    head_forward(&head, &mut out, &mut lse, &mut Vec::new()).unwrap();
    assert!(out[..e].iter().all(|x| x.is_nan()) && out[e..].iter().all(|x| x.is_finite()));
    // f32 on the same finite operands, against f64.
    let (l, s, e) = (70, 33, 16);
    let (q, k, v) = (values(l * e, 0.0), values(s * e, 1.0), values(s * e, 2.0));
    let f = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<f32>>();
    let (q32, k32, v32) = (f(&q), f(&k), f(&v));
    let head32 = dense_head([&q32, &k32, &v32], (l, s, e), 0.25f32, true);
    let (mut out32, mut lse32) = (vec![0.0f32; l * e], vec![0.0f32; l]);
    head_forward(&head32, &mut out32, &mut lse32, &mut Vec::new()).unwrap();
    let (w_out, w_lse, ..) = naive((l, s, e, e), &q, &k, &v, None, 0.25, true, &vec![0.0; l * e]);
    let widen = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect::<Vec<f64>>();
    close("f32 out", &widen(&out32), &w_out, 1e-5);
    close("f32 lse", &widen(&lse32), &w_lse, 1e-5);
}

#[test]
fn mismatched_operands_are_errors() {
    let x = values(12, 0.0);
    let head = HeadOperands {
        q: MatRef::row_major(&x, 3, 4).unwrap(),
        k: MatRef::row_major(&x, 4, 3).unwrap(),
        v: MatRef::row_major(&x, 4, 3).unwrap(),
        mask: None,
        scale: 1.0,
        causal: false,
    };
    let err = head_forward(&head, &mut [0.0; 9], &mut [0.0; 3], &mut Vec::new()).unwrap_err();
    assert!(matches!(err, KernelError::ShapeMismatch { .. }), "{err}");
}
