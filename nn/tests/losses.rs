//! The losses against hand-computed references (PyTorch's formulas written
//! out in plain f64) and against finite differences (`gradcheck` in f64),
//! for every option: reductions, class weights, label smoothing,
//! `ignore_index`, extra dims, unbatched inputs, `pos_weight`.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{gradcheck, AutogradError, Var};
use brasa_nn::functional::{
    binary_cross_entropy_with_logits, binary_cross_entropy_with_logits_with, cross_entropy, cross_entropy_with,
    l1_loss, mse_loss, nll_loss, nll_loss_with, BceWithLogitsOptions, CrossEntropyOptions, NllLossOptions, Reduction,
};
use brasa_nn::NnError;
use brasa_tensor::{DType, Tensor};

type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

/// An nn result as an autograd one (gradcheck's closures return those).
fn ag<T>(result: brasa_nn::Result<T>) -> brasa_autograd::Result<T> {
    result.map_err(|e| AutogradError::Invalid { op: "loss", message: e.to_string() })
}

fn f64s(values: &[f64], dims: &[usize]) -> Tensor {
    Tensor::from_slice(values, dims).unwrap()
}

fn i64s(values: &[i64], dims: &[usize]) -> Tensor {
    Tensor::from_slice(values, dims).unwrap()
}

fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        let ok = (g.is_nan() && w.is_nan()) || (g - w).abs() <= tol * w.abs().max(1.0);
        assert!(ok, "got {got:?}, want {want:?}");
    }
}

/// Deterministic values in roughly [-2, 2].
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0
        })
        .collect()
}

/// PyTorch's cross entropy written out: logits `[N, C, inner]` flattened
/// row-major, targets `[N, inner]`.
fn reference_cross_entropy(
    logits: &[f64],
    dims: (usize, usize, usize),
    target: &[i64],
    weight: Option<&[f64]>,
    smoothing: f64,
    ignore: Option<i64>,
    reduction: Reduction,
) -> Vec<f64> {
    let (n, c, inner) = dims;
    let w = |k: usize| weight.map_or(1.0, |w| w[k]);
    let mut losses = Vec::new();
    let mut total_weight = 0.0;
    for i in 0..n {
        for j in 0..inner {
            let t = target[i * inner + j];
            if Some(t) == ignore {
                losses.push(0.0);
                continue;
            }
            let x: Vec<f64> = (0..c).map(|k| logits[(i * c + k) * inner + j]).collect();
            let max = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + x.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
            let logp: Vec<f64> = x.iter().map(|v| v - lse).collect();
            let nll = -w(t as usize) * logp[t as usize];
            let smooth: f64 = -(0..c).map(|k| w(k) * logp[k]).sum::<f64>();
            losses.push((1.0 - smoothing) * nll + smoothing / c as f64 * smooth);
            total_weight += w(t as usize);
        }
    }
    match reduction {
        Reduction::None => losses,
        Reduction::Sum => vec![losses.iter().sum()],
        Reduction::Mean => vec![losses.iter().sum::<f64>() / total_weight],
    }
}

#[test]
fn cross_entropy_of_uniform_logits_is_log_c() -> TestResult {
    let logits = Var::new(Tensor::zeros([4, 10], DType::F64)?);
    let target = i64s(&[0, 3, 9, 5], &[4]);
    let loss = cross_entropy(&logits, &target)?;
    assert_eq!(loss.dims(), &[] as &[usize]);
    assert!((loss.item()? - 10f64.ln()).abs() < 1e-15);
    Ok(())
}

#[test]
fn cross_entropy_matches_the_reference_for_every_option() -> TestResult {
    let (n, c) = (5, 4);
    let x = values(n * c, 1);
    let target = [2i64, -100, 0, 3, 1];
    let weight = [0.5, 2.0, 1.0, 1.5];
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        for smoothing in [0.0, 0.2] {
            for with_weight in [false, true] {
                for ignore in [Some(-100), Some(3)] {
                    let targets: Vec<i64> =
                        target.iter().map(|&t| if ignore == Some(3) && t == -100 { 1 } else { t }).collect();
                    let options = CrossEntropyOptions {
                        reduction,
                        label_smoothing: smoothing,
                        ignore_index: ignore,
                        weight: with_weight.then(|| f64s(&weight, &[c])),
                    };
                    let got = cross_entropy_with(&Var::new(f64s(&x, &[n, c])), &i64s(&targets, &[n]), &options)?;
                    let want = reference_cross_entropy(
                        &x,
                        (n, c, 1),
                        &targets,
                        with_weight.then_some(&weight[..]),
                        smoothing,
                        ignore,
                        reduction,
                    );
                    assert_close(&got.tensor().to_vec::<f64>()?, &want, 1e-13);
                }
            }
        }
    }
    Ok(())
}

#[test]
fn cross_entropy_with_extra_dims_matches_the_reference() -> TestResult {
    // [N, C, d] = [2, 3, 4]: a segmentation-style loss.
    let (n, c, d) = (2, 3, 4);
    let x = values(n * c * d, 2);
    let targets = [0i64, 1, 2, 1, 2, -100, 0, 0];
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        let options = CrossEntropyOptions { reduction, label_smoothing: 0.1, ..Default::default() };
        let got = cross_entropy_with(&Var::new(f64s(&x, &[n, c, d])), &i64s(&targets, &[n, d]), &options)?;
        let want = reference_cross_entropy(&x, (n, c, d), &targets, None, 0.1, Some(-100), reduction);
        if reduction == Reduction::None {
            assert_eq!(got.dims(), &[n, d]);
        }
        assert_close(&got.tensor().to_vec::<f64>()?, &want, 1e-13);
    }
    Ok(())
}

#[test]
fn cross_entropy_takes_an_unbatched_input() -> TestResult {
    let x = values(5, 3);
    let got = cross_entropy(&Var::new(f64s(&x, &[5])), &Tensor::from_vec(vec![2i64], [])?)?;
    let want = reference_cross_entropy(&x, (1, 5, 1), &[2], None, 0.0, None, Reduction::Mean);
    assert_close(&got.tensor().to_vec::<f64>()?, &want, 1e-14);
    let none = CrossEntropyOptions { reduction: Reduction::None, ..Default::default() };
    let per = cross_entropy_with(&Var::new(f64s(&x, &[5])), &Tensor::from_vec(vec![2i64], [])?, &none)?;
    assert_eq!(per.dims(), &[] as &[usize]);
    gradcheck(|v| ag(cross_entropy(&v[0], &Tensor::from_vec(vec![4i64], [])?)), &[f64s(&x, &[5])], 1e-6, 1e-9, 1e-6)?;
    Ok(())
}

#[test]
fn cross_entropy_gradcheck_every_option() -> TestResult {
    let (n, c) = (4, 3);
    let x = f64s(&values(n * c, 4), &[n, c]);
    let target = i64s(&[2, -100, 0, 1], &[n]);
    let weight = f64s(&[0.3, 1.7, 1.1], &[c]);
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        for smoothing in [0.0, 0.3] {
            for w in [None, Some(weight.clone())] {
                let options =
                    CrossEntropyOptions { reduction, label_smoothing: smoothing, weight: w, ..Default::default() };
                gradcheck(
                    |v| ag(cross_entropy_with(&v[0], &target, &options)),
                    std::slice::from_ref(&x),
                    1e-6,
                    1e-9,
                    1e-6,
                )?;
            }
        }
    }
    // Extra dims, weights and smoothing together.
    let x3 = f64s(&values(2 * 3 * 2, 5), &[2, 3, 2]);
    let t3 = i64s(&[0, 2, -100, 1], &[2, 2]);
    let options = CrossEntropyOptions { label_smoothing: 0.25, weight: Some(weight), ..Default::default() };
    gradcheck(|v| ag(cross_entropy_with(&v[0], &t3, &options)), &[x3], 1e-6, 1e-9, 1e-6)?;
    Ok(())
}

#[test]
fn cross_entropy_gradient_is_softmax_minus_one_hot_over_n() -> TestResult {
    let x = values(6, 6);
    let logits = Var::param(f64s(&x, &[2, 3]))?;
    cross_entropy(&logits, &i64s(&[1, 2], &[2]))?.backward()?;
    let grad = logits.grad().unwrap().to_vec::<f64>()?;
    for row in 0..2 {
        let r = &x[row * 3..row * 3 + 3];
        let sum: f64 = r.iter().map(|v| v.exp()).sum();
        for k in 0..3 {
            let one_hot = if k == row + 1 { 1.0 } else { 0.0 };
            let want = (r[k].exp() / sum - one_hot) / 2.0;
            assert!((grad[row * 3 + k] - want).abs() < 1e-15);
        }
    }
    Ok(())
}

#[test]
fn ignored_positions_contribute_nothing_even_with_infinite_logits() -> TestResult {
    let logits = Var::param(f64s(&[1.0, 2.0, 0.5, f64::NEG_INFINITY, f64::NEG_INFINITY, 0.0], &[2, 3]))?;
    let target = i64s(&[1, -100], &[2]);
    let options = CrossEntropyOptions { label_smoothing: 0.1, ..Default::default() };
    let loss = cross_entropy_with(&logits, &target, &options)?;
    let want = reference_cross_entropy(&[1.0, 2.0, 0.5], (1, 3, 1), &[1], None, 0.1, None, Reduction::Mean);
    assert_close(&[loss.item()?], &want, 1e-14);
    loss.backward()?;
    let grad = logits.grad().unwrap().to_vec::<f64>()?;
    assert_eq!(&grad[3..], &[0.0, 0.0, 0.0]);
    Ok(())
}

#[test]
fn all_ignored_mean_is_nan_and_sum_is_zero_as_in_pytorch() -> TestResult {
    let logits = Var::param(f64s(&values(6, 7), &[2, 3]))?;
    let target = i64s(&[-100, -100], &[2]);
    let mean = cross_entropy(&logits, &target)?;
    assert!(mean.item()?.is_nan());
    let sum = CrossEntropyOptions { reduction: Reduction::Sum, ..Default::default() };
    let total = cross_entropy_with(&logits, &target, &sum)?;
    assert_eq!(total.item()?, 0.0);
    total.backward()?;
    assert_eq!(logits.grad().unwrap().to_vec::<f64>()?, [0.0; 6]);
    Ok(())
}

#[test]
fn cross_entropy_in_f32_agrees_with_f64() -> TestResult {
    let x = values(8 * 5, 8);
    let target = i64s(&[0, 1, 2, 3, 4, 0, 1, 2], &[8]);
    let options = CrossEntropyOptions { label_smoothing: 0.1, ..Default::default() };
    let l64 = cross_entropy_with(&Var::new(f64s(&x, &[8, 5])), &target, &options)?.item()?;
    let x32 = Var::param(f64s(&x, &[8, 5]).to_dtype(DType::F32)?)?;
    let l32 = cross_entropy_with(&x32, &target, &options)?;
    assert!((l32.item()? - l64).abs() < 1e-6);
    l32.backward()?;
    assert_eq!(x32.grad().unwrap().dtype(), DType::F32);
    Ok(())
}

#[test]
fn cross_entropy_equals_nll_of_log_softmax() -> TestResult {
    let x = f64s(&values(12, 9), &[4, 3]);
    let target = i64s(&[0, 2, 1, -100], &[4]);
    let weight = f64s(&[1.0, 0.5, 2.0], &[3]);
    let ce = CrossEntropyOptions { weight: Some(weight.clone()), ..Default::default() };
    let nll = NllLossOptions { weight: Some(weight), ..Default::default() };
    let a = Var::param(x.clone())?;
    let b = Var::param(x.affine(1.0, 0.0)?)?;
    let la = cross_entropy_with(&a, &target, &ce)?;
    let lb = nll_loss_with(&b.log_softmax(1)?, &target, &nll)?;
    assert!((la.item()? - lb.item()?).abs() < 1e-15);
    la.backward()?;
    lb.backward()?;
    assert_close(&a.grad().unwrap().to_vec::<f64>()?, &b.grad().unwrap().to_vec::<f64>()?, 1e-14);
    Ok(())
}

#[test]
fn nll_loss_values_and_gradcheck() -> TestResult {
    let x = values(12, 10);
    let target = [1i64, 0, -100, 2];
    let weight = [2.0, 1.0, 0.5];
    // Mean with weights: Σ −w[y]·x[n, y] / Σ w[y] over the counted targets.
    let want = -(weight[1] * x[1] + weight[0] * x[3] + weight[2] * x[11]) / (weight[1] + weight[0] + weight[2]);
    let options = NllLossOptions { weight: Some(f64s(&weight, &[3])), ..Default::default() };
    let got = nll_loss_with(&Var::new(f64s(&x, &[4, 3])), &i64s(&target, &[4]), &options)?;
    assert!((got.item()? - want).abs() < 1e-15);
    let plain = nll_loss(&Var::new(f64s(&x, &[4, 3])), &i64s(&target, &[4]))?;
    assert!((plain.item()? + (x[1] + x[3] + x[11]) / 3.0).abs() < 1e-15);
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        let options = NllLossOptions { reduction, weight: Some(f64s(&weight, &[3])), ..Default::default() };
        let t = i64s(&target, &[4]);
        gradcheck(|v| ag(nll_loss_with(&v[0], &t, &options)), &[f64s(&x, &[4, 3])], 1e-6, 1e-9, 1e-6)?;
    }
    Ok(())
}

#[test]
fn class_index_losses_name_what_is_wrong() -> TestResult {
    let logits = Var::new(Tensor::zeros([2, 3], DType::F32)?);
    // An Invalid error of the loss (nll_loss, or cross_entropy around it);
    // what its message names is the point of this test.
    let message = |r: brasa_nn::Result<Var>| match r {
        Err(e @ NnError::Invalid { what: "cross_entropy" | "nll_loss", .. }) => e.to_string(),
        Err(other) => panic!("unexpected error kind: {other:?}"),
        Ok(_) => panic!("expected an error"),
    };
    let out_of_range = message(cross_entropy(&logits, &i64s(&[0, 3], &[2])));
    assert_eq!(
        out_of_range,
        "cross_entropy: target 3 at [1] is out of range for 3 classes (and is not the ignore_index -100)"
    );
    let shape = message(cross_entropy(&logits, &i64s(&[0, 1, 2], &[3])));
    assert!(shape.contains("a target of shape [3] does not fit an input of shape [2, 3]"), "{shape}");
    let dtype = message(cross_entropy(&logits, &Tensor::zeros([2], DType::U8)?));
    assert!(dtype.contains("i64, got u8"), "{dtype}");
    // A floating-point target holds probabilities, of the logits' shape.
    let probabilities = message(cross_entropy(&logits, &Tensor::zeros([2], DType::F32)?));
    assert!(probabilities.contains("must have the input's shape [2, 3], got [2]"), "{probabilities}");
    let smoothing = CrossEntropyOptions { label_smoothing: 1.5, ..Default::default() };
    assert!(message(cross_entropy_with(&logits, &i64s(&[0, 1], &[2]), &smoothing)).contains("label_smoothing"));
    let weight = CrossEntropyOptions { weight: Some(Tensor::ones([2], DType::F32)?), ..Default::default() };
    assert!(message(cross_entropy_with(&logits, &i64s(&[0, 1], &[2]), &weight)).contains("shape [3]"));
    let ints = Var::new(Tensor::zeros([2, 3], DType::I64)?);
    assert!(message(nll_loss(&ints, &i64s(&[0, 1], &[2]))).starts_with("nll_loss: the input must be floating-point"));
    let no_ignore = CrossEntropyOptions { ignore_index: None, ..Default::default() };
    assert!(message(cross_entropy_with(&logits, &i64s(&[-100, 1], &[2]), &no_ignore)).contains("target -100 at [0]"));
    Ok(())
}

#[test]
fn mse_and_l1_values_and_gradients() -> TestResult {
    let a = [1.0, -2.0, 3.5, 0.0];
    let b = [0.5, -2.0, 1.5, 1.0];
    let (x, y) = (Var::new(f64s(&a, &[2, 2])), Var::new(f64s(&b, &[2, 2])));
    let squares: Vec<f64> = a.iter().zip(&b).map(|(p, q)| (p - q) * (p - q)).collect();
    let absolute: Vec<f64> = a.iter().zip(&b).map(|(p, q)| (p - q).abs()).collect();
    assert_eq!(mse_loss(&x, &y, Reduction::Mean)?.item()?, squares.iter().sum::<f64>() / 4.0);
    assert_eq!(mse_loss(&x, &y, Reduction::Sum)?.item()?, squares.iter().sum::<f64>());
    assert_eq!(mse_loss(&x, &y, Reduction::None)?.tensor().to_vec::<f64>()?, squares);
    assert_eq!(l1_loss(&x, &y, Reduction::Mean)?.item()?, absolute.iter().sum::<f64>() / 4.0);
    assert_eq!(l1_loss(&x, &y, Reduction::None)?.tensor().to_vec::<f64>()?, absolute);
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        let inputs = [f64s(&values(6, 11), &[2, 3]), f64s(&values(6, 12), &[2, 3])];
        gradcheck(|v| ag(mse_loss(&v[0], &v[1], reduction)), &inputs, 1e-6, 1e-9, 1e-6)?;
        gradcheck(|v| ag(l1_loss(&v[0], &v[1], reduction)), &inputs, 1e-6, 1e-9, 1e-6)?;
    }
    // The gradient of |x − y| at 0 is 0, as in PyTorch.
    let p = Var::param(f64s(&[1.0], &[1]))?;
    l1_loss(&p, &Var::new(f64s(&[1.0], &[1])), Reduction::Sum)?.backward()?;
    assert_eq!(p.grad().unwrap().to_vec::<f64>()?, [0.0]);
    let err = mse_loss(&x, &Var::new(f64s(&[1.0, 2.0], &[2])), Reduction::Mean).err().unwrap().to_string();
    assert_eq!(err, "mse_loss: the input has shape [2, 2] but the target [2]; they must match");
    Ok(())
}

/// PyTorch's BCE-with-logits, elementwise, in plain f64.
fn reference_bce(x: f64, t: f64, pos_weight: f64) -> f64 {
    let log_sigmoid = x.min(0.0) - (-x.abs()).exp().ln_1p();
    (1.0 - t) * x - (1.0 + (pos_weight - 1.0) * t) * log_sigmoid
}

#[test]
fn bce_with_logits_values_are_stable() -> TestResult {
    let x = [-800.0, -3.0, 0.0, 2.5, 800.0, 1e-3];
    let t = [0.0, 1.0, 0.5, 0.0, 1.0, 0.3];
    let (xv, tv) = (Var::new(f64s(&x, &[2, 3])), Var::new(f64s(&t, &[2, 3])));
    let none = binary_cross_entropy_with_logits(&xv, &tv, Reduction::None, None)?.tensor().to_vec::<f64>()?;
    let want: Vec<f64> = x.iter().zip(&t).map(|(&x, &t)| reference_bce(x, t, 1.0)).collect();
    assert_close(&none, &want, 1e-15);
    assert!(none.iter().all(|v| v.is_finite()));
    assert_eq!(none[0], 0.0);
    let pos_weight = [2.0, 0.5, 3.0];
    let weighted =
        binary_cross_entropy_with_logits(&xv, &tv, Reduction::Mean, Some(&f64s(&pos_weight, &[3])))?.item()?;
    let want: f64 = x.iter().zip(&t).enumerate().map(|(i, (&x, &t))| reference_bce(x, t, pos_weight[i % 3])).sum();
    assert!((weighted - want / 6.0).abs() < 1e-13);
    let sum = binary_cross_entropy_with_logits(&xv, &tv, Reduction::Sum, None)?.item()?;
    assert!((sum - none.iter().sum::<f64>()).abs() < 1e-12);
    Ok(())
}

#[test]
fn bce_with_logits_gradients() -> TestResult {
    // At x = 0 the gradient is σ(0) − t exactly (composing min and |x| would get this wrong).
    let x = Var::param(f64s(&[0.0, 0.0], &[2]))?;
    let t = Var::new(f64s(&[1.0, 0.25], &[2]));
    binary_cross_entropy_with_logits(&x, &t, Reduction::Sum, None)?.backward()?;
    assert_eq!(x.grad().unwrap().to_vec::<f64>()?, [-0.5, 0.25]);
    let inputs = [
        f64s(&values(6, 13), &[2, 3]),
        f64s(&values(6, 14).iter().map(|v| (v + 2.0) / 4.0).collect::<Vec<_>>(), &[2, 3]),
    ];
    let pos_weight = f64s(&[2.0, 0.5, 3.0], &[3]);
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        for pw in [None, Some(&pos_weight)] {
            // Gradients with respect to both the logits and the targets.
            gradcheck(
                |v| ag(binary_cross_entropy_with_logits(&v[0], &v[1], reduction, pw)),
                &inputs,
                1e-6,
                1e-9,
                1e-6,
            )?;
        }
    }
    let bad = binary_cross_entropy_with_logits(
        &Var::new(f64s(&[0.0; 6], &[2, 3])),
        &Var::new(f64s(&[0.0; 6], &[2, 3])),
        Reduction::Mean,
        Some(&f64s(&[1.0, 2.0], &[2])),
    );
    let error = bad.err().unwrap();
    assert!(
        matches!(&error, NnError::Invalid { what: "binary_cross_entropy_with_logits", message }
            if message.starts_with("pos_weight of shape [2] does not broadcast")),
        "{error:?}"
    );
    Ok(())
}

/// PyTorch's documented BCE-with-logits with `weight` and `pos_weight`,
/// written naively (fine for moderate `x`):
/// `−w·[pw·t·log σ(x) + (1 − t)·log(1 − σ(x))]`, and its derivatives in
/// `x` and `t`.
fn documented_bce(x: f64, t: f64, w: f64, pw: f64) -> (f64, f64, f64) {
    let s = 1.0 / (1.0 + (-x).exp());
    let loss = -w * (pw * t * s.ln() + (1.0 - t) * (1.0 - s).ln());
    let dx = w * ((1.0 - t) * s - pw * t * (1.0 - s));
    let dt = -w * (pw * s.ln() - (1.0 - s).ln());
    (loss, dx, dt)
}

#[test]
fn bce_with_logits_weight_matches_pytorchs_formula() -> TestResult {
    // Logits [2, 3] read through a transpose (non-contiguous), weight [2, 1]
    // broadcast over the columns, pos_weight [3] over the rows.
    let xs = [0.3, -1.2, 2.0, 0.0, -0.7, 1.5];
    let ts = [1.0, 0.0, 0.25, 0.5, 1.0, 0.0];
    let (w, pw) = ([2.0, 0.5], [1.5, 0.25, 3.0]);
    let x_t = f64s(&[xs[0], xs[3], xs[1], xs[4], xs[2], xs[5]], &[3, 2]).t()?;
    assert!(!x_t.is_contiguous());
    let options = |reduction, pos: bool| BceWithLogitsOptions {
        reduction,
        weight: Some(f64s(&w, &[2, 1])),
        pos_weight: pos.then(|| f64s(&pw, &[3])),
    };
    for pos in [false, true] {
        let want: Vec<(f64, f64, f64)> =
            (0..6).map(|i| documented_bce(xs[i], ts[i], w[i / 3], if pos { pw[i % 3] } else { 1.0 })).collect();
        let x = Var::param(x_t.clone())?;
        let t = Var::param(f64s(&ts, &[2, 3]))?;
        let none = binary_cross_entropy_with_logits_with(&x, &t, &options(Reduction::None, pos))?;
        assert_close(&none.tensor().to_vec::<f64>()?, &want.iter().map(|v| v.0).collect::<Vec<_>>(), 1e-14);
        none.sum_all()?.backward()?;
        assert_close(&x.grad().unwrap().to_vec::<f64>()?, &want.iter().map(|v| v.1).collect::<Vec<_>>(), 1e-14);
        assert_close(&t.grad().unwrap().to_vec::<f64>()?, &want.iter().map(|v| v.2).collect::<Vec<_>>(), 1e-14);
        // The mean divides by the number of elements, not the weights' sum.
        let x = Var::param(x_t.clone())?;
        let mean = binary_cross_entropy_with_logits_with(&x, &t, &options(Reduction::Mean, pos))?;
        assert!((mean.item()? - want.iter().map(|v| v.0).sum::<f64>() / 6.0).abs() < 1e-14);
        mean.backward()?;
        assert_close(&x.grad().unwrap().to_vec::<f64>()?, &want.iter().map(|v| v.1 / 6.0).collect::<Vec<_>>(), 1e-14);
        let sum = binary_cross_entropy_with_logits_with(&x, &t, &options(Reduction::Sum, pos))?.item()?;
        assert!((sum - want.iter().map(|v| v.0).sum::<f64>()).abs() < 1e-13);
    }
    // Large logits stay finite with a weight (the stable form).
    let big = Var::new(f64s(&[-800.0, 800.0], &[2]));
    let t = Var::new(f64s(&[1.0, 0.0], &[2]));
    let weighted =
        BceWithLogitsOptions { reduction: Reduction::None, weight: Some(f64s(&[0.5], &[1])), pos_weight: None };
    assert_eq!(binary_cross_entropy_with_logits_with(&big, &t, &weighted)?.tensor().to_vec::<f64>()?, [400.0, 400.0]);
    // No options is the old function.
    let x = Var::new(f64s(&xs, &[2, 3]));
    let t = Var::new(f64s(&ts, &[2, 3]));
    let plain = binary_cross_entropy_with_logits_with(&x, &t, &BceWithLogitsOptions::default())?.item()?;
    assert_eq!(plain, binary_cross_entropy_with_logits(&x, &t, Reduction::Mean, None)?.item()?);
    Ok(())
}

#[test]
fn bce_with_logits_weight_gradcheck_and_refusals() -> TestResult {
    let inputs = [
        f64s(&values(6, 21), &[3, 2]).t()?,
        f64s(&values(6, 22).iter().map(|v| (v + 2.0) / 4.0).collect::<Vec<_>>(), &[2, 3]),
    ];
    let weight = f64s(&[0.5, 2.0, 1.5], &[3]);
    let pos_weight = f64s(&[2.0, 0.5, 3.0], &[3]);
    for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
        for pw in [None, Some(pos_weight.clone())] {
            let options = BceWithLogitsOptions { reduction, weight: Some(weight.clone()), pos_weight: pw };
            gradcheck(
                |v| ag(binary_cross_entropy_with_logits_with(&v[0], &v[1], &options)),
                &inputs,
                1e-6,
                1e-9,
                1e-6,
            )?;
        }
    }
    let (x, t) = (Var::new(f64s(&[0.0; 6], &[2, 3])), Var::new(f64s(&[0.0; 6], &[2, 3])));
    let with_weight = |w: Tensor| BceWithLogitsOptions { weight: Some(w), ..Default::default() };
    // Each refusal is an Invalid error of the loss; the message names the weight's problem.
    let refusal = |result: brasa_nn::Result<Var>| match result {
        Err(NnError::Invalid { what: "binary_cross_entropy_with_logits", message }) => message,
        other => panic!("expected an Invalid error of binary_cross_entropy_with_logits, got {other:?}"),
    };
    let err = refusal(binary_cross_entropy_with_logits_with(&x, &t, &with_weight(f64s(&[1.0, 2.0], &[2]))));
    assert_eq!(err, "weight of shape [2] does not broadcast to the logits' shape [2, 3]");
    // A weight larger than the logits would grow the loss: refused too.
    let err = refusal(binary_cross_entropy_with_logits_with(&x, &t, &with_weight(f64s(&[1.0; 12], &[2, 2, 3]))));
    assert!(err.starts_with("weight of shape [2, 2, 3]"), "{err}");
    let err = refusal(binary_cross_entropy_with_logits_with(&x, &t, &with_weight(i64s(&[1, 2, 3], &[3]))));
    assert_eq!(err, "weight must be floating-point, got i64");
    Ok(())
}
