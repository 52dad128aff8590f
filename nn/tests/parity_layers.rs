//! The PyTorch-parity layers of issue 17 against PyTorch's documented
//! formulas, written out here in plain f64: the activation layers
//! (`Softplus`, `Mish`, `Elu`, `Celu`, `Selu`, `LeakyRelu`, `Hardswish`,
//! `Hardsigmoid`, `LogSigmoid`), `GroupNorm` / `group_norm` (affine and
//! not), and `Embedding` with `padding_idx`; gradients by f64 gradcheck on
//! contiguous and non-contiguous inputs; the arguments they refuse.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{gradcheck, AutogradError, Var};
use brasa_nn::functional::group_norm;
use brasa_nn::{
    Celu, Elu, Embedding, GroupNorm, GroupNormConfig, Hardsigmoid, Hardswish, LeakyRelu, LogSigmoid, Mish, Module,
    ModuleExt, NnError, Result, Selu, Softplus,
};
use brasa_tensor::{DType, Tensor};

#[path = "support/fixtures.rs"]
mod fixtures;
use fixtures::{assert_close, invalid_message, tensor_f64, to_f64, values, DEV};

fn into_autograd(err: NnError) -> AutogradError {
    match err {
        NnError::Autograd(e) => e,
        NnError::Tensor(e) => e.into(),
        other => AutogradError::Invalid { op: "test", message: other.to_string() },
    }
}

fn elu(v: f64, alpha: f64) -> f64 {
    if v > 0.0 {
        v
    } else {
        alpha * v.exp_m1()
    }
}

// ----- activations ----------------------------------------------------------------------

#[test]
fn activation_layers_compute_pytorch_formulas() -> Result<()> {
    let xs = [-30.0f64, -3.0, -2.0, -0.5, 0.0, 0.7, 3.0, 5.0, 30.0];
    let x = Var::new(Tensor::from_vec(xs.to_vec(), [xs.len()])?);
    let softplus = |v: f64, beta: f64, threshold: f64| {
        if beta * v > threshold {
            v
        } else {
            (beta * v).exp().ln_1p() / beta
        }
    };
    let (selu_alpha, selu_scale) = (1.673_263_242_354_377_2, 1.050_700_987_355_480_5);
    let default_softplus = Softplus::default();
    let softplus_b2 = Softplus::new(2.0, 4.0)?;
    let celu = Celu::new(0.5)?;
    let leaky = LeakyRelu::default();
    let elu_default = Elu::default();
    type Case<'a> = (&'a str, &'a dyn Module, &'a dyn Fn(f64) -> f64);
    let cases: [Case; 10] = [
        ("Softplus()", &default_softplus, &|v| softplus(v, 1.0, 20.0)),
        ("Softplus(2, 4)", &softplus_b2, &|v| softplus(v, 2.0, 4.0)),
        ("Mish", &Mish, &|v| v * v.exp().ln_1p().tanh()),
        ("Elu()", &elu_default, &|v| elu(v, 1.0)),
        ("Celu(0.5)", &celu, &|v| v.max(0.0) + (0.5 * (v / 0.5).exp_m1()).min(0.0)),
        ("Selu", &Selu, &|v| selu_scale * elu(v, selu_alpha)),
        ("LeakyRelu()", &leaky, &|v| if v > 0.0 { v } else { 0.01 * v }),
        ("Hardswish", &Hardswish, &|v| v * (v + 3.0).clamp(0.0, 6.0) / 6.0),
        ("Hardsigmoid", &Hardsigmoid, &|v| (v + 3.0).clamp(0.0, 6.0) / 6.0),
        // -softplus(-x): `sigmoid(x).ln()` itself loses the small values for large x.
        ("LogSigmoid", &LogSigmoid, &|v| -(-v).exp().ln_1p()),
    ];
    for (name, layer, f) in cases {
        let want: Vec<f64> = xs.iter().map(|&v| f(v)).collect();
        let got = to_f64(&layer.forward(&x)?);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-12 * (1e-300 + w.abs()) || g == w, "{name} at {}: got {g}, want {w}", xs[i]);
        }
        assert_eq!(layer.num_parameters(), 0, "{name} has no parameters");
    }
    // PyTorch's defaults.
    assert_eq!((default_softplus.beta(), default_softplus.threshold()), (1.0, 20.0));
    assert_eq!((elu_default.alpha(), Celu::default().alpha(), leaky.negative_slope()), (1.0, 1.0, 0.01));
    Ok(())
}

#[test]
fn activation_layers_pass_gradients_through() -> Result<()> {
    // Non-contiguous input, values across the ±3 bounds.
    let x = tensor_f64(&[4, 3], 0.4).mul_scalar(2.0)?.t()?;
    let layers: Vec<Box<dyn Module>> = vec![
        Box::new(Softplus::new(1.5, 2.0)?),
        Box::new(Mish),
        Box::new(Elu::new(0.5)?),
        Box::new(Celu::new(2.0)?),
        Box::new(Selu),
        Box::new(LeakyRelu::new(0.2)?),
        Box::new(Hardswish),
        Box::new(Hardsigmoid),
        Box::new(LogSigmoid),
    ];
    for layer in &layers {
        gradcheck(|v| layer.forward(&v[0]).map_err(into_autograd), std::slice::from_ref(&x), 1e-6, 1e-7, 1e-5)?;
    }
    Ok(())
}

#[test]
fn activation_layers_refuse_bad_parameters() {
    let cases = [
        (Softplus::new(0.0, 20.0).map(|_| ()), "Softplus", "beta"),
        (Softplus::new(1.0, f64::NAN).map(|_| ()), "Softplus", "threshold"),
        (Elu::new(f64::NAN).map(|_| ()), "Elu", "alpha"),
        (Celu::new(0.0).map(|_| ()), "Celu", "alpha"),
        (LeakyRelu::new(f64::INFINITY).map(|_| ()), "LeakyRelu", "negative_slope"),
    ];
    for (result, layer, param) in cases {
        let (what, message) = invalid_message(result.unwrap_err());
        assert_eq!(what, layer);
        assert!(message.contains(param), "{message}");
    }
}

// ----- group norm -----------------------------------------------------------------------

/// Group norm of `[n, c, s]` data by hand.
fn group_norm_ref(
    x: &[f64],
    n: usize,
    c: usize,
    s: usize,
    groups: usize,
    w: Option<&[f64]>,
    b: Option<&[f64]>,
) -> Vec<f64> {
    let per = c / groups * s;
    let mut out = vec![0.0; x.len()];
    for sample in 0..n {
        for g in 0..groups {
            let start = sample * c * s + g * per;
            let slice = &x[start..start + per];
            let mean = slice.iter().sum::<f64>() / per as f64;
            let var = slice.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / per as f64;
            for (k, v) in slice.iter().enumerate() {
                let ch = g * (c / groups) + k / s;
                let y = (v - mean) / (var + 1e-5).sqrt();
                out[start + k] = y * w.map_or(1.0, |w| w[ch]) + b.map_or(0.0, |b| b[ch]);
            }
        }
    }
    out
}

#[test]
fn group_norm_matches_a_naive_reference() -> Result<()> {
    for (shape, groups) in [(vec![2usize, 6, 2, 3], 3usize), (vec![3, 4, 5], 2), (vec![2, 4], 4), (vec![2, 4, 3], 1)] {
        let (n, c) = (shape[0], shape[1]);
        let s: usize = shape[2..].iter().product();
        let data = values(shape.iter().product(), 0.3);
        let x = Var::new(Tensor::from_vec(data.clone(), shape.as_slice())?);
        let (wv, bv) = (values(c, 5.0), values(c, 9.0));
        let w = Var::new(Tensor::from_vec(wv.clone(), [c])?);
        let b = Var::new(Tensor::from_vec(bv.clone(), [c])?);
        let y = to_f64(&group_norm(&x, groups, Some(&w), Some(&b), 1e-5)?);
        assert_close(&y, &group_norm_ref(&data, n, c, s, groups, Some(&wv), Some(&bv)), 1e-12);
        let y = to_f64(&group_norm(&x, groups, None, None, 1e-5)?);
        assert_close(&y, &group_norm_ref(&data, n, c, s, groups, None, None), 1e-12);
    }
    // A literal case: groups (1, 3) and (5, 9) of one sample, weight 2, bias 1.
    let x = Var::new(Tensor::from_vec(vec![1.0f64, 3.0, 5.0, 9.0], [1, 4])?);
    let w = Var::new(Tensor::full([4], 2.0, DType::F64)?);
    let b = Var::new(Tensor::ones([4], DType::F64)?);
    assert_eq!(to_f64(&group_norm(&x, 2, Some(&w), Some(&b), 0.0)?), [-1.0, 3.0, -1.0, 3.0]);
    Ok(())
}

#[test]
fn gradcheck_group_norm() -> Result<()> {
    let x = tensor_f64(&[2, 6, 3], 0.8);
    let w = tensor_f64(&[6], 2.5);
    let b = tensor_f64(&[6], 4.5);
    let check = |f: &dyn Fn(&[Var]) -> Result<Var>, inputs: &[Tensor]| {
        gradcheck(|v| f(v).map_err(into_autograd), inputs, 1e-6, 1e-7, 1e-5)
    };
    check(&|v| group_norm(&v[0], 3, Some(&v[1]), Some(&v[2]), 1e-5), &[x.clone(), w.clone(), b.clone()])?;
    check(&|v| group_norm(&v[0], 2, None, None, 1e-5), std::slice::from_ref(&x))?;
    check(&|v| group_norm(&v[0], 6, Some(&v[1]), None, 1e-5), &[x.clone(), w.clone()])?;
    check(&|v| group_norm(&v[0], 1, None, Some(&v[1]), 1e-5), &[x.clone(), b.clone()])?;
    // Non-contiguous: [2, 3, 6] transposed to [2, 6, 3], and a strided weight.
    let xt = tensor_f64(&[2, 3, 6], 1.7).transpose(1, 2)?;
    let ws = tensor_f64(&[12], 3.1).reshape(&[6, 2])?.select(1, 0)?;
    assert!(!xt.is_contiguous() && !ws.is_contiguous());
    check(&|v| group_norm(&v[0], 3, Some(&v[1]), Some(&v[2]), 1e-5), &[xt, ws, b])?;
    // 4-d.
    check(
        &|v| group_norm(&v[0], 2, Some(&v[1]), None, 1e-5),
        &[tensor_f64(&[1, 4, 2, 2], 0.2), tensor_f64(&[4], 6.0)],
    )?;
    Ok(())
}

#[test]
fn group_norm_layer_follows_pytorch() -> Result<()> {
    let norm = GroupNorm::new(2, 4, DEV)?;
    let names: Vec<String> = norm.named_parameters().into_iter().map(|(name, _)| name).collect();
    assert_eq!(names, ["weight", "bias"]);
    assert_eq!(norm.weight.as_ref().unwrap().tensor().to_vec::<f32>()?, [1.0; 4]);
    assert_eq!(norm.bias.as_ref().unwrap().tensor().to_vec::<f32>()?, [0.0; 4]);
    assert_eq!((norm.num_groups(), norm.num_channels(), norm.eps()), (2, 4, 1e-5));
    let plain = GroupNorm::with_config(2, 4, GroupNormConfig::new().affine(false).dtype(DType::F64), DEV)?;
    assert_eq!(plain.num_parameters(), 0);

    // Forward and backward through the layer reach its parameters.
    let data = values(2 * 4 * 3, 2.2);
    let x = Var::param(Tensor::from_vec(data.iter().map(|&v| v as f32).collect::<Vec<_>>(), [2, 4, 3])?)?;
    let y = norm.forward(&x)?;
    assert_close(&to_f64(&y), &group_norm_ref(&data, 2, 4, 3, 2, None, None), 1e-5);
    y.mul(&y)?.sum_all()?.backward()?;
    assert!(norm.weight.as_ref().unwrap().grad().is_some() && norm.bias.as_ref().unwrap().grad().is_some());
    assert!(x.grad().is_some());

    // bf16 inputs are normalised in f32 and come back in bf16.
    let half = Var::new(x.tensor().to_dtype(DType::BF16)?);
    let y = norm.forward(&half)?;
    assert_eq!(y.dtype(), DType::BF16);
    assert_close(&to_f64(&y), &group_norm_ref(&data, 2, 4, 3, 2, None, None), 2e-2);
    Ok(())
}

#[test]
fn group_norm_refuses_bad_arguments_naming_them() -> Result<()> {
    let (what, message) = invalid_message(GroupNorm::new(3, 32, DEV).unwrap_err());
    assert_eq!(what, "GroupNorm");
    assert!(message.contains("32") && message.contains('3'), "{message}");
    assert_eq!(invalid_message(GroupNorm::new(0, 4, DEV).unwrap_err()).0, "GroupNorm");
    assert_eq!(
        invalid_message(GroupNorm::with_config(2, 4, GroupNormConfig::new().eps(-1.0), DEV).unwrap_err()).0,
        "GroupNorm"
    );

    let x = Var::new(Tensor::zeros([2, 6, 5], DType::F64)?);
    let (what, message) = invalid_message(group_norm(&x, 4, None, None, 1e-5).unwrap_err());
    assert_eq!(what, "group_norm");
    assert!(message.contains("(6") && message.contains("(4)"), "names channels and groups: {message}");
    let w = Var::new(Tensor::ones([5], DType::F64)?);
    let (_, message) = invalid_message(group_norm(&x, 3, Some(&w), None, 1e-5).unwrap_err());
    assert!(message.contains("weight") && message.contains("[6]"), "{message}");
    let (_, message) =
        invalid_message(group_norm(&Var::new(Tensor::zeros([6], DType::F64)?), 3, None, None, 1e-5).unwrap_err());
    assert!(message.contains("[N, C"), "{message}");
    assert!(group_norm(&x, 3, None, None, f64::NAN).is_err());
    let ints = Var::new(Tensor::zeros([2, 6], DType::I64)?);
    assert!(invalid_message(group_norm(&ints, 3, None, None, 1e-5).unwrap_err()).1.contains("floating-point"));
    // The layer checks the channel count.
    let (what, message) =
        invalid_message(GroupNorm::new(2, 4, DEV)?.forward(&Var::new(Tensor::zeros([2, 6], DType::F32)?)).unwrap_err());
    assert_eq!(what, "GroupNorm");
    assert!(message.contains("[2, 6]"), "{message}");
    Ok(())
}

// ----- embedding with padding_idx -------------------------------------------------------------

#[test]
fn embedding_padding_row_starts_at_zero_and_gets_no_gradient() -> Result<()> {
    let table = Embedding::with_padding_idx(5, 3, 2, DEV)?;
    assert_eq!(table.padding_idx(), Some(2));
    let weight = table.weight.tensor().to_vec::<f32>()?;
    assert_eq!(&weight[6..9], [0.0; 3], "PyTorch initialises the padding row to zeros");
    assert!(weight[..6].iter().chain(&weight[9..]).any(|&v| v != 0.0), "the other rows are random");

    let ids = Var::new(Tensor::from_vec(vec![2i64, 1, 2, 4, 1], [5])?);
    let rows = table.forward(&ids)?;
    assert_eq!(&to_f64(&rows)[..3], [0.0; 3]);
    rows.sum_all()?.backward()?;
    let grad = table.weight.grad().unwrap().to_vec::<f32>()?;
    assert_eq!(grad, [0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]);

    // Negative padding_idx counts from the end.
    assert_eq!(Embedding::with_padding_idx(5, 3, -1, DEV)?.padding_idx(), Some(4));
    assert_eq!(Embedding::with_padding_idx(5, 3, -5, DEV)?.padding_idx(), Some(0));
    Ok(())
}

#[test]
fn pretrained_embedding_keeps_its_padding_row_values() -> Result<()> {
    let weight = tensor_f64(&[4, 2], 0.6);
    let values = weight.to_vec::<f64>()?;
    let table = Embedding::from_pretrained_padded(weight, false, 0)?;
    let ids = Tensor::from_vec(vec![0i64, 3, 0], [3])?;
    let rows = table.lookup(&ids)?;
    assert_eq!(to_f64(&rows), [&values[0..2], &values[6..8], &values[0..2]].concat());
    rows.mul(&rows)?.sum_all()?.backward()?;
    let grad = table.weight.grad().unwrap().to_vec::<f64>()?;
    assert_eq!(&grad[0..2], [0.0, 0.0], "padding row: no gradient");
    assert_eq!(&grad[6..8], [2.0 * values[6], 2.0 * values[7]]);
    assert_eq!(&grad[2..6], [0.0; 4]);
    Ok(())
}

#[test]
fn gradcheck_padded_embedding() -> Result<()> {
    // The other rows' gradients by finite differences (the padding row is
    // used by the forward, so only a literal check can say its gradient is 0).
    let ids = Tensor::from_vec(vec![1i64, 3, 1, 0], [2, 2])?;
    let contiguous = tensor_f64(&[4, 3], 0.9);
    let transposed = tensor_f64(&[3, 4], 1.9).t()?;
    for weight in [contiguous, transposed] {
        gradcheck(|v| Var::embedding_padded(&v[0], &ids, Some(2)), std::slice::from_ref(&weight), 1e-6, 1e-7, 1e-5)?;
    }
    let w = Var::param(tensor_f64(&[4, 3], 0.9))?;
    let with_pad = Tensor::from_vec(vec![2i64, 0, 2], [3])?;
    Var::embedding_padded(&w, &with_pad, Some(2))?.mul_scalar(3.0)?.sum_all()?.backward()?;
    assert_eq!(w.grad().unwrap().to_vec::<f64>()?, [3.0, 3.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    Ok(())
}

#[test]
fn padding_idx_out_of_range_is_an_error() {
    for bad in [5i64, 6, -6] {
        let (what, message) = invalid_message(Embedding::with_padding_idx(5, 3, bad, DEV).unwrap_err());
        assert_eq!(what, "Embedding");
        assert!(message.contains(&format!("padding_idx {bad}")) && message.contains("5 embeddings"), "{message}");
    }
    let (what, _) = invalid_message(Embedding::from_pretrained_padded(tensor_f64(&[3, 2], 0.1), true, 3).unwrap_err());
    assert_eq!(what, "Embedding");
    let w = Var::new(tensor_f64(&[3, 2], 0.1));
    match Var::embedding_padded(&w, &Tensor::from_vec(vec![0i64], [1]).unwrap(), Some(3)) {
        Err(AutogradError::Invalid { op, message }) => {
            assert_eq!(op, "embedding");
            assert!(message.contains("padding_idx 3") && message.contains("[3, 2]"), "{message}");
        }
        other => panic!("expected an Invalid error, got {:?}", other.map(|_| ())),
    }
}
