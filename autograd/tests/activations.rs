//! The PyTorch activations on `Var` (`softplus`, `mish`, `elu`, `celu`,
//! `selu`, `leaky_relu`, `hardswish`, `hardsigmoid`, `log_sigmoid`): values
//! and gradients against PyTorch's documented formulas written out here in
//! plain f64, its conventions at the kinks, f64 gradcheck on contiguous and
//! non-contiguous inputs, and the parameters it refuses.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{gradcheck, AutogradError, Result, Var};
use brasa_tensor::{manual_seed, DType, Tensor};

/// Inputs across every region: far negative, the ±3 bounds of the hard
/// functions, around 0, and past softplus' default threshold.
const XS: [f64; 14] = [-40.0, -25.0, -3.5, -3.0, -1.0, -1e-9, 0.0, 1e-9, 0.5, 1.0, 3.0, 3.5, 10.0, 25.0];

const SELU_ALPHA: f64 = 1.673_263_242_354_377_2;
const SELU_SCALE: f64 = 1.050_700_987_355_480_5;

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// PyTorch's softplus: linear past the threshold.
fn softplus_ref(x: f64, beta: f64, threshold: f64) -> f64 {
    if beta * x > threshold {
        x
    } else {
        (beta * x).exp().ln_1p() / beta
    }
}

fn softplus_grad_ref(x: f64, beta: f64, threshold: f64) -> f64 {
    if beta * x > threshold {
        1.0
    } else {
        sigmoid(beta * x)
    }
}

fn elu_ref(x: f64, alpha: f64) -> f64 {
    if x > 0.0 {
        x
    } else {
        alpha * x.exp_m1()
    }
}

fn elu_grad_ref(x: f64, alpha: f64) -> f64 {
    if x > 0.0 {
        1.0
    } else {
        alpha * x.exp()
    }
}

fn hardswish_grad_ref(x: f64) -> f64 {
    if x < -3.0 {
        0.0
    } else if x <= 3.0 {
        x / 3.0 + 0.5
    } else {
        1.0
    }
}

/// `f` applied to `XS` and the gradient of `sum(f(x))`.
fn value_and_grad(f: impl Fn(&Var) -> Result<Var>) -> (Vec<f64>, Vec<f64>) {
    let x = Var::param(Tensor::from_vec(XS.to_vec(), [XS.len()]).unwrap()).unwrap();
    let y = f(&x).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    (y.tensor().to_vec::<f64>().unwrap(), x.grad().unwrap().to_vec::<f64>().unwrap())
}

/// Compares with a relative tolerance (absolute near 0).
fn assert_close(what: &str, got: &[f64], expected: impl Fn(f64) -> f64) {
    for (&x, &g) in XS.iter().zip(got) {
        let e = expected(x);
        assert!(
            (g - e).abs() <= 1e-12 * e.abs().max(1e-300) + 1e-300 || g == e,
            "{what}({x}): got {g:e}, expected {e:e}"
        );
    }
}

fn check_values(what: &str, f: impl Fn(&Var) -> Result<Var>, value: impl Fn(f64) -> f64, grad: impl Fn(f64) -> f64) {
    let (y, g) = value_and_grad(f);
    assert_close(what, &y, value);
    assert_close(&format!("d{what}"), &g, grad);
}

#[test]
fn softplus_matches_pytorch_with_its_threshold() {
    check_values(
        "softplus",
        |x| x.softplus(1.0, 20.0),
        |x| softplus_ref(x, 1.0, 20.0),
        |x| softplus_grad_ref(x, 1.0, 20.0),
    );
    check_values(
        "softplus_b2",
        |x| x.softplus(2.0, 5.0),
        |x| softplus_ref(x, 2.0, 5.0),
        |x| softplus_grad_ref(x, 2.0, 5.0),
    );
    check_values(
        "softplus_neg_beta",
        |x| x.softplus(-0.5, 20.0),
        |x| softplus_ref(x, -0.5, 20.0),
        |x| softplus_grad_ref(x, -0.5, 20.0),
    );
    // On the boundary (beta·x == threshold) PyTorch is still on the soft side.
    let x = Var::param(Tensor::from_vec(vec![20.0f64, 20.0 + 1e-9], [2]).unwrap()).unwrap();
    let y = x.softplus(1.0, 20.0).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    let v = y.tensor().to_vec::<f64>().unwrap();
    assert_eq!(v[0], 20f64.exp().ln_1p());
    assert_eq!(v[1], 20.0 + 1e-9);
    assert_eq!(x.grad().unwrap().to_vec::<f64>().unwrap(), [sigmoid(20.0), 1.0]);
    // Very negative inputs keep their tiny values (log1p, not log(1 + ·)).
    let tiny = Var::new(Tensor::from_vec(vec![-700.0f64], [1]).unwrap()).softplus(1.0, 20.0).unwrap();
    assert_eq!(tiny.tensor().to_vec::<f64>().unwrap(), [(-700f64).exp()]);
}

#[test]
fn mish_matches_its_formula() {
    let mish = |x: f64| x * x.exp().ln_1p().tanh();
    let dmish = |x: f64| {
        let t = x.exp().ln_1p().tanh();
        t + x * sigmoid(x) * (1.0 - t * t)
    };
    check_values("mish", |x| x.mish(), mish, dmish);
}

#[test]
fn elu_celu_selu_match_pytorch_and_take_the_negative_side_at_zero() {
    check_values("elu", |x| x.elu(1.0), |x| elu_ref(x, 1.0), |x| elu_grad_ref(x, 1.0));
    check_values("elu_a0.3", |x| x.elu(0.3), |x| elu_ref(x, 0.3), |x| elu_grad_ref(x, 0.3));
    // Negative alpha: PyTorch's out-of-place elu accepts it.
    check_values("elu_neg", |x| x.elu(-0.5), |x| elu_ref(x, -0.5), |x| elu_grad_ref(x, -0.5));
    let celu = |x: f64, a: f64| x.max(0.0) + (a * (x / a).exp_m1()).min(0.0);
    let dcelu = |x: f64, a: f64| if x > 0.0 { 1.0 } else { (x / a).exp() };
    check_values("celu", |x| x.celu(2.0), |x| celu(x, 2.0), |x| dcelu(x, 2.0));
    check_values("celu_1", |x| x.celu(1.0), |x| celu(x, 1.0), |x| dcelu(x, 1.0));
    check_values(
        "selu",
        |x| x.selu(),
        |x| SELU_SCALE * elu_ref(x, SELU_ALPHA),
        |x| SELU_SCALE * elu_grad_ref(x, SELU_ALPHA),
    );
    // The gradients at exactly 0, written out: alpha, 1, scale·alpha.
    let at_zero = |f: &dyn Fn(&Var) -> Result<Var>| {
        let x = Var::param(Tensor::from_vec(vec![0.0f64], [1]).unwrap()).unwrap();
        f(&x).unwrap().sum_all().unwrap().backward().unwrap();
        x.grad().unwrap().to_vec::<f64>().unwrap()[0]
    };
    assert_eq!(at_zero(&|x| x.elu(0.3)), 0.3);
    assert_eq!(at_zero(&|x| x.celu(2.0)), 1.0);
    assert_eq!(at_zero(&|x| x.selu()), SELU_SCALE * SELU_ALPHA);
    assert_eq!(at_zero(&|x| x.leaky_relu(0.2)), 0.2);
}

#[test]
fn leaky_relu_hardswish_hardsigmoid_log_sigmoid_match_pytorch() {
    check_values(
        "leaky_relu",
        |x| x.leaky_relu(0.01),
        |x| if x > 0.0 { x } else { 0.01 * x },
        |x| if x > 0.0 { 1.0 } else { 0.01 },
    );
    check_values(
        "hardsigmoid",
        |x| x.hardsigmoid(),
        |x| (x + 3.0).clamp(0.0, 6.0) / 6.0,
        // 0 on the bounds themselves; PyTorch's slope is 1/6 as an f32
        // even for f64 (its backward prints 0x1.555556p-3).
        |x| if x > -3.0 && x < 3.0 { f64::from(1.0f32 / 6.0) } else { 0.0 },
    );
    check_values("hardswish", |x| x.hardswish(), |x| x * (x + 3.0).clamp(0.0, 6.0) / 6.0, hardswish_grad_ref);
    check_values("log_sigmoid", |x| x.log_sigmoid(), |x| x.min(0.0) - (-x.abs()).exp().ln_1p(), |x| sigmoid(-x));
    // PyTorch's hardswish gradient at the bounds: -1/2 at -3, 3/2 at 3.
    let (_, g) = value_and_grad(|x| x.hardswish());
    assert_eq!((g[3], g[10]), (-0.5, 1.5));
}

#[test]
fn gradcheck_every_activation_contiguous_and_not() {
    manual_seed(17);
    // Scaled by 3 to reach the ±3 regions of the hard functions.
    let x = Tensor::randn([3, 4], DType::F64).unwrap().mul_scalar(3.0).unwrap();
    let xt = Tensor::randn([5, 3], DType::F64).unwrap().mul_scalar(3.0).unwrap().t().unwrap();
    let xn = Tensor::randn([4, 6], DType::F64).unwrap().mul_scalar(3.0).unwrap().narrow(1, 1, 3).unwrap();
    assert!(!xt.is_contiguous() && !xn.is_contiguous());
    type Act = fn(&Var) -> Result<Var>;
    let acts: [(&str, Act); 13] = [
        ("softplus", |v| v.softplus(1.0, 20.0)),
        ("softplus_threshold", |v| v.softplus(2.0, 1.0)),
        ("mish", |v| v.mish()),
        ("elu", |v| v.elu(1.0)),
        ("elu_alpha", |v| v.elu(0.7)),
        ("celu", |v| v.celu(1.5)),
        ("selu", |v| v.selu()),
        ("leaky_relu", |v| v.leaky_relu(0.1)),
        ("hardswish", |v| v.hardswish()),
        ("hardsigmoid", |v| v.hardsigmoid()),
        ("log_sigmoid", |v| v.log_sigmoid()),
        ("composed", |v| v.mish()?.softplus(1.0, 20.0)?.log_sigmoid()),
        ("second_use", |v| v.elu(1.0)?.mul(&v.hardswish()?)),
    ];
    for input in [x, xt, xn] {
        for (name, f) in acts {
            if let Err(e) = gradcheck(|v| f(&v[0]), std::slice::from_ref(&input), 1e-6, 1e-6, 1e-5) {
                panic!("{name} on shape {:?}: {e}", input.dims());
            }
        }
    }
}

#[test]
fn f32_inputs_give_f32_close_to_f64() {
    let x32 = Tensor::from_vec(XS.iter().map(|&v| v as f32).collect::<Vec<_>>(), [XS.len()]).unwrap();
    let x64 = Tensor::from_vec(XS.to_vec(), [XS.len()]).unwrap();
    type Act = fn(&Var) -> Result<Var>;
    let acts: [Act; 9] = [
        |v| v.softplus(1.0, 20.0),
        |v| v.mish(),
        |v| v.elu(1.0),
        |v| v.celu(2.0),
        |v| v.selu(),
        |v| v.leaky_relu(0.01),
        |v| v.hardswish(),
        |v| v.hardsigmoid(),
        |v| v.log_sigmoid(),
    ];
    for f in acts {
        let y32 = f(&Var::new(x32.clone())).unwrap();
        assert_eq!(y32.dtype(), DType::F32);
        let y64 = f(&Var::new(x64.clone())).unwrap().tensor().to_vec::<f64>().unwrap();
        for (a, b) in y32.tensor().to_vec::<f32>().unwrap().iter().zip(y64) {
            assert!(((*a as f64) - b).abs() <= 1e-6 * b.abs().max(1.0), "{a} vs {b}");
        }
    }
}

#[test]
fn invalid_parameters_are_errors_naming_them() {
    let x = Var::new(Tensor::from_vec(vec![1.0f64, -1.0], [2]).unwrap());
    let cases: [(Result<Var>, &str, &str); 7] = [
        (x.softplus(0.0, 20.0), "softplus", "beta"),
        (x.softplus(f64::NAN, 20.0), "softplus", "beta"),
        (x.softplus(1.0, f64::NAN), "softplus", "threshold"),
        (x.celu(0.0), "celu", "alpha"),
        (x.elu(f64::INFINITY), "elu", "alpha"),
        (x.celu(f64::NAN), "celu", "alpha"),
        (x.leaky_relu(f64::NAN), "leaky_relu", "negative_slope"),
    ];
    for (result, op, param) in cases {
        match result {
            Err(e @ AutogradError::Invalid { .. }) => {
                let text = e.to_string();
                assert!(text.starts_with(op) && text.contains(param), "{text}");
            }
            Err(other) => panic!("{op}: expected Invalid naming {param}, got {other:?}"),
            Ok(_) => panic!("{op}: expected an error for {param}"),
        }
    }
    // An infinite threshold is allowed: the function is never linear.
    let y = x.softplus(1.0, f64::INFINITY).unwrap().tensor().to_vec::<f64>().unwrap();
    assert_eq!(y, [1f64.exp().ln_1p(), (-1f64).exp().ln_1p()]);
}

/// Inputs from far below to far above every kink and region edge.
const WIDE_XS: [f64; 19] = [
    -1e300, -800.0, -100.0, -40.0, -20.0, -3.0, -1.0, -0.1, -1e-6, -1e-300, 0.0, 1e-300, 1e-6, 0.1, 1.0, 3.0, 40.0,
    800.0, 1e300,
];

/// Parameters of every sign and size a finite f64 can take.
const PARAMS: [f64; 16] =
    [-1e10, -100.0, -7.0, -1.0, -0.3, -1e-3, -1e-8, 1e-8, 1e-3, 0.3, 1.0, 7.0, 100.0, 1e10, -1e300, 1e300];

/// `f(x)` and `d sum(f(x)) / dx` on `WIDE_XS`.
fn wide_value_and_grad(f: &dyn Fn(&Var) -> Result<Var>) -> (Vec<f64>, Vec<f64>) {
    let x = Var::param(Tensor::from_vec(WIDE_XS.to_vec(), [WIDE_XS.len()]).unwrap()).unwrap();
    let y = f(&x).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    (y.tensor().to_vec::<f64>().unwrap(), x.grad().unwrap().to_vec::<f64>().unwrap())
}

/// Within a few ulps of an f64 reference (equal when either is infinite).
fn wide_close(what: &str, x: f64, got: f64, want: f64) {
    let ok = if want.is_nan() {
        got.is_nan()
    } else if !want.is_finite() || !got.is_finite() {
        got == want
    } else {
        (got - want).abs() <= 1e-13 * want.abs() + 1e-300
    };
    assert!(ok, "{what} at x = {x:e}: got {got:e}, want {want:e}");
}

fn sweep_activation(
    what: &str,
    f: &dyn Fn(&Var) -> Result<Var>,
    value: &dyn Fn(f64) -> f64,
    grad: &dyn Fn(f64) -> f64,
) {
    let (ys, gs) = wide_value_and_grad(f);
    for ((&x, &y), &g) in WIDE_XS.iter().zip(&ys).zip(&gs) {
        wide_close(what, x, y, value(x));
        wide_close(&format!("d {what}"), x, g, grad(x));
    }
}

/// `alpha · (e^(x/alpha) - 1)`, the negative side of CELU, in f64 with
/// `expm1`: for a negative `alpha`, `x/alpha` is positive.
fn celu_ref(x: f64, alpha: f64) -> f64 {
    if x > 0.0 {
        x
    } else {
        alpha * (x / alpha).exp_m1()
    }
}

/// `1 / f32(alpha)`: the reciprocal PyTorch's CELU derivative formula uses
/// (`1.0 / alpha.toFloat()`) for every dtype; the f64 one where the f32
/// rounding is 0 or infinite (PyTorch's backward fails there).
fn celu_grad_scale(alpha: f64) -> f64 {
    let rounded = f64::from(alpha as f32);
    if rounded.is_finite() && rounded != 0.0 {
        1.0 / rounded
    } else {
        1.0 / alpha
    }
}

/// PyTorch's `elu_backward` with CELU's constants: `(s · alpha) · e^(x · s)`.
fn celu_grad_ref(x: f64, alpha: f64) -> f64 {
    if x > 0.0 {
        1.0
    } else {
        let s = celu_grad_scale(alpha);
        (s * alpha) * (x * s).exp()
    }
}

#[test]
fn celu_gradients_use_pytorchs_f32_reciprocal_of_alpha() {
    // d sum(celu(x, alpha)) / dx for f64 x, printed by PyTorch 2.15 on the
    // CPU (`x.grad.tolist()`, as bits). The f32 rounding of alpha moves them
    // by 1e-8 relative from e^(x/alpha); the tolerance is a few ulps, for
    // the exponential (PyTorch's vectorised one is not libm's).
    const XS: [f64; 6] = [-2.5, -1.0, -0.3, -1e-3, 0.0, 0.5];
    let pytorch: [(f64, [u64; 6]); 4] = [
        (
            0.3,
            [
                0x3F2F8176AE996B2B,
                0x3FA243DCB1E693F2,
                0x3FD78B56362CEF33,
                0x3FEFE4BD0C68233D,
                0x3FEFFFFFEAAAAAB9,
                0x3FF0000000000000,
            ],
        ),
        (
            1.7,
            [
                0x3FCD69C48FD7E735,
                0x3FE1C511DB783D50,
                0x3FEAD2B9E83AC57C,
                0x3FEFFB2EAF67F5B1,
                0x3FEFFFFFF0F0F0F8,
                0x3FF0000000000000,
            ],
        ),
        (
            -0.7,
            [
                0x4041C89F95F154D0,
                0x4010B0E13248B700,
                0x3FF88F9E44E72EAE,
                0x3FF005DB0DDA00B6,
                0x3FF0000004924926,
                0x3FF0000000000000,
            ],
        ),
        // An alpha that is an f32 subnormal: its rounding is coarse.
        (1e-40, [0, 0, 0, 0, 0x3FF00005A6D850BF, 0x3FF0000000000000]),
    ];
    for (alpha, bits) in pytorch {
        let x = Var::param(Tensor::from_vec(XS.to_vec(), [XS.len()]).unwrap()).unwrap();
        x.celu(alpha).unwrap().sum_all().unwrap().backward().unwrap();
        let got = x.grad().unwrap().to_vec::<f64>().unwrap();
        for ((&x, &g), want) in XS.iter().zip(&got).zip(bits.map(f64::from_bits)) {
            assert!(
                (g - want).abs() <= 4.0 * f64::EPSILON * want.abs(),
                "celu({x}, {alpha}): got {g:e}, PyTorch {want:e}"
            );
        }
        // At 0 the exponential is exactly 1: the constant itself, bit for bit.
        assert_eq!(got[4], bits.map(f64::from_bits)[4], "celu'(0) with alpha {alpha}");
    }
}

#[test]
fn celu_with_a_negative_alpha_matches_expm1() {
    // The case the issue reported: a negative alpha made x / alpha positive,
    // where the helper for non-positive arguments gives -inf or is off by 0.1 %.
    for alpha in [-0.5, -1.0, -2.0] {
        for x in [-1.0f64, -10.0, -20.0, -30.0] {
            let y = Var::new(Tensor::from_vec(vec![x], [1]).unwrap()).celu(alpha).unwrap();
            wide_close(&format!("celu alpha {alpha}"), x, y.tensor().to_vec::<f64>().unwrap()[0], celu_ref(x, alpha));
        }
    }
}

#[test]
fn every_activation_over_extreme_parameters_matches_f64_references() {
    for alpha in PARAMS {
        sweep_activation(&format!("celu(alpha = {alpha:e})"), &|x| x.celu(alpha), &|x| celu_ref(x, alpha), &|x| {
            celu_grad_ref(x, alpha)
        });
        sweep_activation(&format!("elu(alpha = {alpha:e})"), &|x| x.elu(alpha), &|x| elu_ref(x, alpha), &|x| {
            elu_grad_ref(x, alpha)
        });
        sweep_activation(
            &format!("leaky_relu({alpha:e})"),
            &|x| x.leaky_relu(alpha),
            &|x| if x > 0.0 { x } else { alpha * x },
            &|x| if x > 0.0 { 1.0 } else { alpha },
        );
        for threshold in [-1e300, -20.0, 0.0, 20.0, 1e300] {
            sweep_activation(
                &format!("softplus(beta = {alpha:e}, threshold = {threshold:e})"),
                &|x| x.softplus(alpha, threshold),
                &|x| softplus_wide_ref(x, alpha, threshold),
                &|x| softplus_grad_wide_ref(x, alpha, threshold),
            );
        }
    }
    sweep_activation("selu", &|x| x.selu(), &|x| SELU_SCALE * elu_ref(x, SELU_ALPHA), &|x| {
        SELU_SCALE * elu_grad_ref(x, SELU_ALPHA)
    });
    sweep_activation("log_sigmoid", &|x| x.log_sigmoid(), &log_sigmoid_ref, &|x| sigmoid(-x));
    sweep_activation("hardsigmoid", &|x| x.hardsigmoid(), &|x| (x + 3.0).clamp(0.0, 6.0) / 6.0, &|x| {
        if x > -3.0 && x < 3.0 {
            f64::from(1.0f32 / 6.0)
        } else {
            0.0
        }
    });
    sweep_activation("hardswish", &|x| x.hardswish(), &|x| x * (x + 3.0).clamp(0.0, 6.0) / 6.0, &hardswish_grad_ref);
    sweep_activation("mish", &|x| x.mish(), &|x| x * softplus_wide_ref(x, 1.0, f64::INFINITY).tanh(), &|x| {
        let t = softplus_wide_ref(x, 1.0, f64::INFINITY).tanh();
        let s = softplus_grad_wide_ref(x, 1.0, f64::INFINITY);
        t + x * s * (1.0 - t * t)
    });
}

/// `log(sigmoid(x))` without overflow: `min(x, 0) - log1p(e^-|x|)`.
fn log_sigmoid_ref(x: f64) -> f64 {
    x.min(0.0) - (-x.abs()).exp().ln_1p()
}

/// PyTorch's softplus, `log1p(e^(beta x)) / beta` written so that it does
/// not overflow (`max(t, 0) + log1p(e^-|t|)`), linear past the threshold.
fn softplus_wide_ref(x: f64, beta: f64, threshold: f64) -> f64 {
    let t = beta * x;
    if t > threshold {
        x
    } else {
        (t.max(0.0) + (-t.abs()).exp().ln_1p()) / beta
    }
}

fn softplus_grad_wide_ref(x: f64, beta: f64, threshold: f64) -> f64 {
    let t = beta * x;
    if t > threshold {
        1.0
    } else if t >= 0.0 {
        1.0 / (1.0 + (-t).exp())
    } else {
        let e = t.exp();
        e / (1.0 + e)
    }
}
