use super::*;
use half::{bf16, f16};
use proptest::prelude::*;

fn naive_sum(x: &[f64]) -> f64 {
    x.iter().sum()
}

/// The first index of the max (MAX) or min, NaN first; PyTorch's rule.
fn naive_arg(x: &[f64], max: bool) -> Option<usize> {
    if let Some(p) = x.iter().position(|v| v.is_nan()) {
        return Some(p);
    }
    let mut best: Option<usize> = None;
    for (i, &v) in x.iter().enumerate() {
        match best {
            None => best = Some(i),
            Some(b) if (max && v > x[b]) || (!max && v < x[b]) => best = Some(i),
            _ => {}
        }
    }
    best
}

#[test]
fn pairwise_sum_of_ten_million_tenths_is_accurate() {
    let x = vec![0.1f32; 10_000_000];
    let total = sum(&x);
    // A sequential f32 loop gives 1087937 here (9 % off).
    let sequential = x.iter().fold(0f32, |a, &b| a + b);
    assert!((sequential - 1e6).abs() > 1e4, "the test must be able to tell: sequential gave {sequential}");
    assert!((total as f64 - 1e6).abs() / 1e6 < 1e-6, "pairwise sum gave {total}");
    let one_thread = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap().install(|| sum(&x));
    assert_eq!(total.to_bits(), one_thread.to_bits(), "the result must not depend on the thread count");
}

#[test]
fn column_sums_are_pairwise_too() {
    let rows = 1_000_000;
    let x = vec![0.1f32; rows * 2];
    let offsets: Vec<usize> = (0..rows).map(|r| 2 * r).collect();
    let mut out = [0f32; 2];
    sum_columns(&x, 0, &offsets, &mut out).unwrap();
    for v in out {
        assert!((v as f64 - 1e5).abs() / 1e5 < 1e-6, "column sum gave {v}");
    }
}

#[test]
fn integer_and_bool_sums_widen_to_i64_and_wrap() {
    assert_eq!(sum(&[200u8, 100, 50]), 350i64);
    assert_eq!(sum(&[true, false, true, true]), 3i64);
    assert_eq!(sum(&[i64::MAX, 1]), i64::MIN);
    assert_eq!(sum::<f32>(&[]), 0.0);
}

#[test]
fn extrema_propagate_nan_and_argmax_takes_the_first() {
    let x = [1.0f32, 3.0, 3.0, -2.0, -2.0];
    assert_eq!(max(&x), Some(3.0));
    assert_eq!(min(&x), Some(-2.0));
    assert_eq!(argmax(&x), Some(1));
    assert_eq!(argmin(&x), Some(3));
    let with_nan = [1.0f32, f32::NAN, 5.0, f32::NAN];
    assert!(max(&with_nan).unwrap().is_nan());
    assert!(min(&with_nan).unwrap().is_nan());
    assert_eq!(argmax(&with_nan), Some(1));
    assert_eq!(argmin(&with_nan), Some(1));
    assert_eq!(max::<f32>(&[]), None);
    assert_eq!(argmax::<f32>(&[]), None);
    assert_eq!(max(&[false, true]), Some(true));
    assert_eq!(min(&[false, true]), Some(false));
    assert_eq!(argmax(&[3u8, 9, 9]), Some(1));
    // Long rows go through the parallel path.
    let mut long = vec![0f32; PARALLEL_MIN * 3 + 17];
    long[PARALLEL_MIN * 2 + 5] = 7.0;
    long[PARALLEL_MIN * 2 + 9] = 7.0;
    assert_eq!(argmax(&long), Some(PARALLEL_MIN * 2 + 5));
    assert_eq!(max(&long), Some(7.0));
    long[PARALLEL_MIN * 3] = f32::NAN;
    assert_eq!(argmin(&long), Some(PARALLEL_MIN * 3));
}

#[test]
fn column_kernels_check_bounds() {
    let x = [0f32; 10];
    let mut out = [0f32; 4];
    assert!(matches!(sum_columns(&x, 0, &[0, 7], &mut out), Err(crate::KernelError::OutOfBounds { .. })));
    assert!(max_columns(&x, 0, &[], &mut out).is_err());
    let mut idx = [0i64; 4];
    assert!(argmax_columns(&x, 8, &[0], &mut idx).is_err());
    assert!(sum_columns(&x, 0, &[0, 6], &mut out).is_ok());
    assert!(sq_dev_columns(&x, 0, &[0], &[0.0; 3], &mut out).is_err());
}

#[test]
fn softmax_is_stable_and_rejects_bad_lengths() {
    let x = [1000.0f32, 1000.0, 999.0];
    let mut out = [0f32; 3];
    softmax_row(&x, &mut out).unwrap();
    let e = (-1.0f64).exp();
    let expect = [1.0 / (2.0 + e), 1.0 / (2.0 + e), e / (2.0 + e)];
    for (o, e) in out.iter().zip(expect) {
        assert!((*o as f64 - e).abs() < 1e-6, "{out:?}");
    }
    log_softmax_row(&x, &mut out).unwrap();
    assert!((out[2] as f64 - (e / (2.0 + e)).ln()).abs() < 1e-5, "{out:?}");
    assert!(softmax_row(&x, &mut [0f32; 2]).is_err());
    assert!(softmax_columns(&x, &mut [0f32; 3], 2).is_err());
    let mut empty: [f32; 0] = [];
    softmax_row(&[], &mut empty).unwrap();
}

#[test]
fn a_nan_anywhere_in_a_row_makes_the_softmax_row_nan() {
    // First element, inside the vector lanes, in the remainder past them.
    for len in [1usize, 5, 16, 37, 64] {
        for at in [0, len / 2, len - 1] {
            let mut x: Vec<f32> = (0..len).map(|i| (i % 7) as f32 - 3.0).collect();
            x[at] = f32::NAN;
            let mut out = vec![0f32; len];
            softmax_row(&x, &mut out).unwrap();
            assert!(out.iter().all(|v| v.is_nan()), "softmax, NaN at {at} of {len}: {out:?}");
            log_softmax_row(&x, &mut out).unwrap();
            assert!(out.iter().all(|v| v.is_nan()), "log_softmax, NaN at {at} of {len}: {out:?}");
        }
    }
    // The maximum anywhere in a long row is the shift: no overflow.
    let mut x = vec![0f64; 37];
    x[33] = 1000.0;
    let mut out = vec![0f64; 37];
    softmax_row(&x, &mut out).unwrap();
    assert!((out[33] - 1.0).abs() < 1e-12 && out.iter().all(|v| v.is_finite()), "{out:?}");
}

fn floats(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(prop_oneof![-100.0..100.0f64, (-4i32..4).prop_map(f64::from)], len)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn row_reductions_match_naive(x in floats(0..1200)) {
        let f32s: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        let exact: Vec<f64> = f32s.iter().map(|&v| v as f64).collect();
        let tolerance = 1e-5 * (1.0 + exact.iter().map(|v| v.abs()).sum::<f64>());
        prop_assert!((sum(&f32s) as f64 - naive_sum(&exact)).abs() <= tolerance);
        let halfs: Vec<f16> = x.iter().map(|&v| f16::from_f64(v)).collect();
        let exact_h: Vec<f64> = halfs.iter().map(|v| v.to_f64()).collect();
        prop_assert!((sum(&halfs) as f64 - naive_sum(&exact_h)).abs() <= tolerance);
        let ints: Vec<i64> = x.iter().map(|&v| v as i64).collect();
        prop_assert_eq!(sum(&ints), ints.iter().sum::<i64>());
        let bools: Vec<bool> = x.iter().map(|&v| v > 0.0).collect();
        prop_assert_eq!(sum(&bools), bools.iter().filter(|&&b| b).count() as i64);

        let naive_max = exact.iter().copied().fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
        let naive_min = exact.iter().copied().fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.min(v))));
        prop_assert_eq!(max(&f32s).map(f64::from), naive_max);
        prop_assert_eq!(min(&f32s).map(f64::from), naive_min);
        prop_assert_eq!(argmax(&f32s), naive_arg(&exact, true));
        prop_assert_eq!(argmin(&f32s), naive_arg(&exact, false));
        prop_assert_eq!(argmax(&halfs), naive_arg(&exact_h, true));
        let bf: Vec<bf16> = x.iter().map(|&v| bf16::from_f64(v)).collect();
        let exact_bf: Vec<f64> = bf.iter().map(|v| v.to_f64()).collect();
        prop_assert_eq!(argmin(&bf), naive_arg(&exact_bf, false));
        prop_assert_eq!(argmax(&ints), naive_arg(&ints.iter().map(|&v| v as f64).collect::<Vec<_>>(), true));

        if !exact.is_empty() {
            let mean = naive_sum(&exact) / exact.len() as f64;
            let ssd: f64 = exact.iter().map(|v| (v - mean) * (v - mean)).sum();
            prop_assert!((sum_sq_dev(&exact, mean) - ssd).abs() <= 1e-9 * (1.0 + ssd));
        }
    }

    #[test]
    fn nan_anywhere_is_found_first(x in floats(1..600), at in any::<prop::sample::Index>()) {
        let mut f32s: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        let at = at.index(f32s.len());
        f32s[at] = f32::NAN;
        prop_assert!(max(&f32s).unwrap().is_nan());
        prop_assert!(min(&f32s).unwrap().is_nan());
        prop_assert!(sum(&f32s).is_nan());
        prop_assert_eq!(argmax(&f32s), Some(at));
        prop_assert_eq!(argmin(&f32s), Some(at));
    }

    #[test]
    fn column_reductions_match_naive(
        rows in 0usize..40,
        width in 1usize..600,
        gap in 0usize..3,
        base in 0usize..5,
        seed in any::<u64>(),
    ) {
        let stride = width + gap;
        let len = base + rows * stride + 3;
        let mut state = seed;
        let x: Vec<f64> = (0..len)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 33) % 17) as f64 - 8.0
            })
            .collect();
        let offsets: Vec<usize> = (0..rows).rev().map(|r| r * stride).collect();
        let at = |r: usize, k: usize| x[base + offsets[r] + k];
        let mut sums = vec![0f64; width];
        sum_columns(&x, base, &offsets, &mut sums).unwrap();
        let halves: Vec<f16> = x.iter().map(|&v| f16::from_f64(v)).collect();
        let mut half_sums = vec![0f32; width];
        sum_columns(&halves, base, &offsets, &mut half_sums).unwrap();
        let ints: Vec<u8> = x.iter().map(|&v| (v + 8.0) as u8).collect();
        let mut int_sums = vec![0i64; width];
        sum_columns(&ints, base, &offsets, &mut int_sums).unwrap();
        for k in 0..width {
            let expect: f64 = (0..rows).map(|r| at(r, k)).sum();
            prop_assert_eq!(sums[k], expect);
            prop_assert_eq!(half_sums[k] as f64, expect);
            prop_assert_eq!(int_sums[k], (0..rows).map(|r| at(r, k) as i64 + 8).sum::<i64>());
        }
        if rows > 0 {
            let mean: Vec<f64> = sums.iter().map(|s| s / rows as f64).collect();
            let mut ssd = vec![0f64; width];
            sq_dev_columns(&x, base, &offsets, &mean, &mut ssd).unwrap();
            let mut maxes = vec![0f32; width];
            let mut mins = vec![0f32; width];
            let f32s: Vec<f32> = x.iter().map(|&v| v as f32).collect();
            max_columns(&f32s, base, &offsets, &mut maxes).unwrap();
            min_columns(&f32s, base, &offsets, &mut mins).unwrap();
            let mut argmaxes = vec![0i64; width];
            let mut argmins = vec![0i64; width];
            argmax_columns(&halves, base, &offsets, &mut argmaxes).unwrap();
            argmin_columns(&f32s, base, &offsets, &mut argmins).unwrap();
            for k in 0..width {
                let column: Vec<f64> = (0..rows).map(|r| at(r, k)).collect();
                let expect: f64 = column.iter().map(|v| (v - mean[k]) * (v - mean[k])).sum();
                prop_assert!((ssd[k] - expect).abs() <= 1e-9 * (1.0 + expect));
                prop_assert_eq!(maxes[k] as f64, column.iter().copied().fold(f64::MIN, f64::max));
                prop_assert_eq!(mins[k] as f64, column.iter().copied().fold(f64::MAX, f64::min));
                prop_assert_eq!(argmaxes[k] as usize, naive_arg(&column, true).unwrap());
                prop_assert_eq!(argmins[k] as usize, naive_arg(&column, false).unwrap());
            }
        }
    }

    #[test]
    fn softmax_matches_naive(rows in 1usize..6, width in 1usize..300, seed in any::<u64>(), shift in -1000.0..1000.0f64) {
        let mut state = seed;
        let x: Vec<f64> = (0..rows * width)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 11) as f64 / (1u64 << 53) as f64) * 20.0 - 10.0 + shift
            })
            .collect();
        let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        let exact: Vec<f64> = x32.iter().map(|&v| v as f64).collect();
        let naive = |values: &[f64]| {
            let m = values.iter().copied().fold(f64::MIN, f64::max);
            let s: f64 = values.iter().map(|v| (v - m).exp()).sum();
            values.iter().map(|v| ((v - m).exp() / s, (v - m) - s.ln())).collect::<Vec<_>>()
        };
        let mut out = vec![0f32; rows * width];
        let mut log_out = vec![0f32; rows * width];
        for r in 0..rows {
            let span = r * width..(r + 1) * width;
            softmax_row(&x32[span.clone()], &mut out[span.clone()]).unwrap();
            log_softmax_row(&x32[span.clone()], &mut log_out[span.clone()]).unwrap();
            for (k, (p, lp)) in naive(&exact[span.clone()]).into_iter().enumerate() {
                prop_assert!((out[r * width + k] as f64 - p).abs() <= 1e-6 + 1e-5 * p);
                prop_assert!((log_out[r * width + k] as f64 - lp).abs() <= 1e-4 * (1.0 + lp.abs()));
            }
        }
        softmax_columns(&x32, &mut out, width).unwrap();
        log_softmax_columns(&x32, &mut log_out, width).unwrap();
        for k in 0..width {
            let column: Vec<f64> = (0..rows).map(|r| exact[r * width + k]).collect();
            for (r, (p, lp)) in naive(&column).into_iter().enumerate() {
                prop_assert!((out[r * width + k] as f64 - p).abs() <= 1e-6 + 1e-5 * p);
                prop_assert!((log_out[r * width + k] as f64 - lp).abs() <= 1e-4 * (1.0 + lp.abs()));
            }
        }
    }
}

#[test]
fn exp_f32_is_within_two_ulp() {
    let mut worst = 0.0f64;
    let mut x = -86.5f32;
    while x <= 88.72 {
        let exact = (x as f64).exp();
        let got = exp_f32(x) as f64;
        let ulp = (exact as f32).abs() as f64 * f32::EPSILON as f64;
        worst = worst.max((got - exact).abs() / ulp);
        x += 0.000_37;
    }
    assert!(worst <= 2.0, "worst error {worst} ulp");
    assert_eq!(exp_f32(0.0), 1.0);
    assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
    assert_eq!(exp_f32(-100.0), 0.0);
    assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
    assert_eq!(exp_f32(89.0), f32::INFINITY);
    assert!(exp_f32(f32::NAN).is_nan());
    assert!((exp_f32(88.7) as f64 / (88.7f32 as f64).exp() - 1.0).abs() < 1e-6);
}

#[test]
fn exp_shifted_matches_the_scalar_exp_on_every_path() {
    let x: Vec<f32> = (0..1000).map(|i| i as f32 * 0.37 - 200.0).collect();
    let mut out = vec![0f32; x.len()];
    exp_shifted_f32(&x, 3.0, &mut out);
    for (o, &v) in out.iter().zip(&x) {
        assert_eq!(o.to_bits(), exp_f32(v - 3.0).to_bits(), "at {v}");
    }
}
