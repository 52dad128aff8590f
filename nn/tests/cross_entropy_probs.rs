//! Cross entropy with class-probability targets against PyTorch's formula
//! written out in plain f64 here (values and both gradients), for every
//! reduction, with class weights, label smoothing, extra dims and an
//! unbatched input; f64 gradchecks on the logits and the target; the
//! dispatch on the target's dtype; and the errors.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{gradcheck, AutogradError, Var};
use brasa_nn::functional::{cross_entropy, cross_entropy_probs, cross_entropy_with, CrossEntropyOptions, Reduction};
use brasa_nn::NnError;
use brasa_tensor::{DType, Tensor};

/// An nn result as an autograd one (gradcheck's closures return those).
fn ag<T>(result: brasa_nn::Result<T>) -> brasa_autograd::Result<T> {
    result.map_err(|e| AutogradError::Invalid { op: "loss", message: e.to_string() })
}

fn f64s(values: &[f64], dims: &[usize]) -> Tensor {
    Tensor::from_slice(values, dims).unwrap()
}

/// Deterministic values in roughly [-2, 2].
fn wave(n: usize, seed: f64) -> Vec<f64> {
    (0..n).map(|i| 2.0 * (i as f64 * 0.77 + seed).sin()).collect()
}

/// Non-negative targets (not normalised: the loss does not need it).
fn probs(n: usize, seed: f64) -> Vec<f64> {
    (0..n).map(|i| 0.1 + (i as f64 * 1.3 + seed).cos().abs()).collect()
}

fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= tol * w.abs().max(1.0), "got {got:?}, want {want:?}");
    }
}

/// PyTorch's formula in f64 for `x`, `t` of shape `[n, c, inner]` (row
/// major): the per-position losses `[n·inner]` and, for the loss reduced
/// with `reduction`, the gradients with respect to `x` and `t`.
struct Reference {
    losses: Vec<f64>,
    reduced: f64,
    grad_x: Vec<f64>,
    grad_t: Vec<f64>,
}

fn reference(
    x: &[f64],
    t: &[f64],
    (n, c, inner): (usize, usize, usize),
    weight: Option<&[f64]>,
    epsilon: f64,
    reduction: Reduction,
) -> Reference {
    let w = |k: usize| weight.map_or(1.0, |w| w[k]);
    let at = |i: usize, k: usize, j: usize| (i * c + k) * inner + j;
    let positions = n * inner;
    let scale = if reduction == Reduction::Mean { 1.0 / positions as f64 } else { 1.0 };
    let (mut losses, mut grad_x, mut grad_t) = (vec![0.0; positions], vec![0.0; x.len()], vec![0.0; t.len()]);
    for i in 0..n {
        for j in 0..inner {
            let max = (0..c).map(|k| x[at(i, k, j)]).fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = (0..c).map(|k| (x[at(i, k, j)] - max).exp()).sum();
            let logp = |k: usize| x[at(i, k, j)] - max - total.ln();
            let smoothed = |k: usize| (1.0 - epsilon) * t[at(i, k, j)] + epsilon / c as f64;
            losses[i * inner + j] = -(0..c).map(|k| w(k) * smoothed(k) * logp(k)).sum::<f64>();
            let mass: f64 = (0..c).map(|k| w(k) * smoothed(k)).sum();
            for k in 0..c {
                grad_x[at(i, k, j)] = scale * (logp(k).exp() * mass - w(k) * smoothed(k));
                grad_t[at(i, k, j)] = -scale * (1.0 - epsilon) * w(k) * logp(k);
            }
        }
    }
    let reduced = match reduction {
        Reduction::Mean => losses.iter().sum::<f64>() / positions as f64,
        _ => losses.iter().sum(),
    };
    Reference { losses, reduced, grad_x, grad_t }
}

#[test]
fn values_and_gradients_match_the_formula() {
    let weight = [0.5, 2.0, 1.0, 0.25];
    for (dims, shape) in [((3, 4, 1), vec![3, 4]), ((2, 4, 3), vec![2, 4, 3])] {
        let numel = shape.iter().product();
        let (x, t) = (wave(numel, 0.3), probs(numel, 0.9));
        for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
            for (w, epsilon) in [(None, 0.0), (Some(&weight[..]), 0.0), (None, 0.2), (Some(&weight[..]), 0.1)] {
                let want = reference(&x, &t, dims, w, epsilon, reduction);
                let logits = Var::param(f64s(&x, &shape)).unwrap();
                let target = Var::param(f64s(&t, &shape)).unwrap();
                let options = CrossEntropyOptions {
                    reduction,
                    label_smoothing: epsilon,
                    weight: w.map(|w| f64s(w, &[4])),
                    ..Default::default()
                };
                let loss = cross_entropy_probs(&logits, &target, &options).unwrap();
                let case = format!("{shape:?} {reduction:?} weight {} ε {epsilon}", w.is_some());
                if reduction == Reduction::None {
                    let mut positions = shape.clone();
                    positions.remove(1);
                    assert_eq!(loss.dims(), &positions[..], "{case}");
                    assert_close(&loss.tensor().to_vec::<f64>().unwrap(), &want.losses, 1e-12);
                    // Backward of Σ losses is the Sum reference's gradient.
                    let sum = reference(&x, &t, dims, w, epsilon, Reduction::Sum);
                    loss.sum_all().unwrap().backward().unwrap();
                    assert_close(&logits.grad().unwrap().to_vec::<f64>().unwrap(), &sum.grad_x, 1e-12);
                    assert_close(&target.grad().unwrap().to_vec::<f64>().unwrap(), &sum.grad_t, 1e-12);
                } else {
                    assert_eq!(loss.dims(), &[] as &[usize], "{case}");
                    assert_close(&[loss.item().unwrap()], &[want.reduced], 1e-12);
                    loss.backward().unwrap();
                    assert_close(&logits.grad().unwrap().to_vec::<f64>().unwrap(), &want.grad_x, 1e-12);
                    assert_close(&target.grad().unwrap().to_vec::<f64>().unwrap(), &want.grad_t, 1e-12);
                }
            }
        }
    }
}

#[test]
fn literal_values() {
    // Logits [0, ln 3] give p = [1/4, 3/4]; target [0.5, 0.5]:
    // loss = −(0.5·ln ¼ + 0.5·ln ¾) = ln 4 − 0.5·ln 3.
    let logits = Var::new(f64s(&[0.0, 3f64.ln()], &[1, 2]));
    let target = f64s(&[0.5, 0.5], &[1, 2]);
    let loss = cross_entropy(&logits, &target).unwrap().item().unwrap();
    assert!((loss - (4f64.ln() - 0.5 * 3f64.ln())).abs() < 1e-12, "{loss}");
    // Class weights [2, 0]: only class 0 counts, and the mean does not
    // divide by the weights: −2·0.5·ln ¼ / 1 = ln 4.
    let options = CrossEntropyOptions { weight: Some(f64s(&[2.0, 0.0], &[2])), ..Default::default() };
    let loss = cross_entropy_with(&logits, &target, &options).unwrap().item().unwrap();
    assert!((loss - 4f64.ln()).abs() < 1e-12, "{loss}");
    // Unbatched [C] with a [C] target; None gives a 0-d loss.
    let options = CrossEntropyOptions { reduction: Reduction::None, ..Default::default() };
    let flat = cross_entropy_with(&Var::new(f64s(&[0.0, 3f64.ln()], &[2])), &f64s(&[0.5, 0.5], &[2]), &options);
    let flat = flat.unwrap();
    assert_eq!(flat.dims(), &[] as &[usize]);
    assert!((flat.item().unwrap() - (4f64.ln() - 0.5 * 3f64.ln())).abs() < 1e-12);
}

#[test]
fn one_hot_probabilities_agree_with_class_indices() {
    let x = wave(12, 1.1);
    let logits = Var::new(f64s(&x, &[3, 4]));
    let classes = [2i64, 0, 3];
    let one_hot: Vec<f64> = (0..12).map(|e| if classes[e / 4] == (e % 4) as i64 { 1.0 } else { 0.0 }).collect();
    let index = Tensor::from_slice(&classes, [3]).unwrap();
    for epsilon in [0.0, 0.3] {
        let options = CrossEntropyOptions { label_smoothing: epsilon, ..Default::default() };
        let by_index = cross_entropy_with(&logits, &index, &options).unwrap().item().unwrap();
        let by_probs = cross_entropy_with(&logits, &f64s(&one_hot, &[3, 4]), &options).unwrap().item().unwrap();
        assert!((by_index - by_probs).abs() < 1e-12, "ε {epsilon}: {by_index} vs {by_probs}");
    }
}

#[test]
fn gradchecks_on_logits_and_target() {
    let x = f64s(&wave(24, 0.4), &[2, 4, 3]);
    // A transposed (non-contiguous) logits tensor of the same shape.
    let xt = f64s(&wave(24, 2.0), &[2, 3, 4]).transpose(1, 2).unwrap();
    assert!(!xt.is_contiguous());
    let t = f64s(&probs(24, 0.2), &[2, 4, 3]);
    let options = CrossEntropyOptions {
        label_smoothing: 0.15,
        weight: Some(f64s(&[1.0, 0.5, 2.0, 1.5], &[4])),
        ..Default::default()
    };
    for input in [x, xt] {
        for reduction in [Reduction::Mean, Reduction::Sum, Reduction::None] {
            let options = CrossEntropyOptions { reduction, ..options.clone() };
            gradcheck(
                |v| ag(cross_entropy_probs(&v[0], &v[1], &options)),
                &[input.clone(), t.clone()],
                1e-6,
                1e-8,
                1e-6,
            )
            .unwrap();
        }
    }
}

#[test]
fn errors_name_the_problem() {
    let logits = Var::new(Tensor::zeros([2, 3], DType::F32).unwrap());
    let target = Tensor::full([2, 3], 0.25, DType::F32).unwrap();
    // An Invalid error of cross_entropy; what its message names is the point.
    let message = |options: &CrossEntropyOptions, target: &Tensor| match cross_entropy_with(&logits, target, options) {
        Err(e @ NnError::Invalid { what: "cross_entropy", .. }) => e.to_string(),
        other => panic!("expected an Invalid error of cross_entropy, got {other:?}"),
    };
    let ignore = CrossEntropyOptions { ignore_index: Some(0), ..Default::default() };
    assert_eq!(
        message(&ignore, &target),
        "cross_entropy: ignore_index (0) is not supported with class-probability (floating-point) targets"
    );
    // The default ignore_index and None are fine.
    let none = CrossEntropyOptions { ignore_index: None, ..Default::default() };
    assert!(cross_entropy_with(&logits, &target, &none).is_ok());
    let f64_target = target.to_dtype(DType::F64).unwrap();
    let dtype = message(&CrossEntropyOptions::default(), &f64_target);
    assert!(dtype.contains("must have the input's dtype f32, got f64"), "{dtype}");
    let shape = message(&CrossEntropyOptions::default(), &Tensor::zeros([2, 4], DType::F32).unwrap());
    assert!(shape.contains("must have the input's shape [2, 3], got [2, 4]"), "{shape}");
    let weight = CrossEntropyOptions { weight: Some(Tensor::ones([2], DType::F32).unwrap()), ..Default::default() };
    assert!(message(&weight, &target).contains("weight must be a floating-point tensor of shape [3]"));
    let smoothing = CrossEntropyOptions { label_smoothing: -0.1, ..Default::default() };
    assert!(message(&smoothing, &target).contains("label_smoothing must be in [0, 1], got -0.1"));
    let scalar = Var::new(Tensor::zeros([], DType::F32).unwrap());
    let rank = cross_entropy_probs(&scalar, &scalar, &CrossEntropyOptions::default()).unwrap_err();
    assert!(
        matches!(&rank, NnError::Invalid { message, .. }
            if message == "the input must be [N, C], [N, C, d1, ...] or [C], got shape []"),
        "{rank:?}"
    );
}
