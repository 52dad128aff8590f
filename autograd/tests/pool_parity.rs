//! Gradients of `ceil_mode` pooling (`Var::max_pool2d_with`,
//! `Var::avg_pool2d_with`) and adaptive pooling (`Var::adaptive_avg_pool2d`,
//! `Var::adaptive_max_pool2d`): f64 gradcheck on contiguous and
//! non-contiguous inputs, including clipped ceil-mode windows and adaptive
//! windows that are unequal (7 → 3, 5 → 3) or repeat (3 → 5); and gradients
//! worked by hand.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{gradcheck, AutogradError, Result, Var};
use brasa_tensor::{manual_seed, DType, Pool2dParams, Tensor, TensorError};

const EPS: f64 = 1e-6;
const ATOL: f64 = 1e-6;
const RTOL: f64 = 1e-5;

fn check(f: impl Fn(&[Var]) -> Result<Var>, input: &Tensor) {
    if let Err(e) = gradcheck(f, std::slice::from_ref(input), EPS, ATOL, RTOL) {
        panic!("{e}");
    }
}

/// A permutation of `0..n` scaled by 0.1 and shuffled: no ties, and
/// neighbours 0.1 apart, far more than the gradcheck step.
fn distinct(shape: &[usize], seed: usize) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|i| ((i * 7919 + seed) % n) as f64 * 0.1 - 1.0).collect();
    Tensor::from_vec(v, shape.to_vec()).unwrap()
}

#[test]
fn ceil_mode_pooling_gradchecks() {
    manual_seed(21);
    let x = Tensor::randn([2, 2, 6, 5], DType::F64).unwrap();
    // Stored [.., W, H] and transposed back: a non-contiguous input.
    let xt = Tensor::randn([2, 2, 5, 6], DType::F64).unwrap().transpose(-1, -2).unwrap();
    assert!(!xt.is_contiguous());
    let params = [
        // No padding: a last window clipped at H (6 = 2·2 + 2, W 5 = 2·2 + 1).
        Pool2dParams::new((2, 2)).with_ceil_mode(true),
        // Padding: last windows end in or past the right padding.
        Pool2dParams::new((3, 3)).with_stride((2, 2)).with_padding((1, 1)).with_ceil_mode(true),
        Pool2dParams::new((3, 2)).with_stride((2, 3)).with_padding((1, 0)).with_ceil_mode(true),
        // Kernel beyond the input by less than the stride.
        Pool2dParams::new((4, 3)).with_stride((4, 3)).with_padding((0, 1)).with_ceil_mode(true),
    ];
    for input in [&x, &xt] {
        let dx = distinct(input.dims(), 5);
        for p in params {
            check(|v| v[0].avg_pool2d_with(p, true), input);
            check(|v| v[0].avg_pool2d_with(p, false), input);
            check(|v| v[0].max_pool2d_with(p), &dx);
        }
    }
    check(|v| v[0].max_pool2d_with(params[1]), &distinct(&[2, 2, 5, 6], 3).transpose(-1, -2).unwrap());
}

#[test]
fn adaptive_pooling_gradchecks() {
    manual_seed(22);
    for (shape, out) in
        [(vec![2, 2, 7, 5], (3, 3)), (vec![2, 5, 7], (3, 2)), (vec![1, 2, 3, 4], (5, 6)), (vec![2, 6, 6], (4, 1))]
    {
        let x = Tensor::randn(shape.clone(), DType::F64).unwrap();
        check(|v| v[0].adaptive_avg_pool2d(out), &x);
        check(|v| Ok(v[0].adaptive_max_pool2d(out)?.0), &distinct(&shape, 1));
        // Non-contiguous: the plane stored transposed.
        let mut stored = shape.clone();
        let r = stored.len();
        stored.swap(r - 1, r - 2);
        let xt = Tensor::randn(stored.clone(), DType::F64).unwrap().transpose(-1, -2).unwrap();
        assert!(!xt.is_contiguous());
        check(|v| v[0].adaptive_avg_pool2d(out), &xt);
        check(|v| Ok(v[0].adaptive_max_pool2d(out)?.0), &distinct(&stored, 4).transpose(-1, -2).unwrap());
    }
}

#[test]
fn gradients_by_hand() {
    // 1 x 5 → 1 x 3 adaptive windows [0, 2) [1, 4) [3, 5).
    let x = Var::param(Tensor::from_vec(vec![1.0f64, 5.0, 2.0, 4.0, 3.0], [1, 1, 5]).unwrap()).unwrap();
    let y = x.adaptive_avg_pool2d((1, 3)).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    let third = 1.0 / 3.0;
    let want = [0.5, 0.5 + third, third, third + 0.5, 0.5];
    let got = x.grad().unwrap().to_vec::<f64>().unwrap();
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-12, "{got:?} vs {want:?}");
    }
    // Max: 5 wins windows 0 and 1, 4 wins window 2.
    let x = Var::param(Tensor::from_vec(vec![1.0f64, 5.0, 2.0, 4.0, 3.0], [1, 1, 5]).unwrap()).unwrap();
    let (y, indices) = x.adaptive_max_pool2d((1, 3)).unwrap();
    assert_eq!(indices.to_vec::<i64>().unwrap(), [1, 1, 3]);
    assert_eq!(y.tensor().to_vec::<f64>().unwrap(), [5.0, 5.0, 4.0]);
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f64>().unwrap(), [0.0, 2.0, 0.0, 1.0, 0.0]);
    // ceil_mode max: the clipped last window [4, 6) holds x[4] alone.
    let x = Var::param(Tensor::from_vec(vec![1.0f64, 5.0, 2.0, 4.0, 3.0], [1, 1, 5]).unwrap()).unwrap();
    let y = x.max_pool2d_with(Pool2dParams::new((1, 2)).with_ceil_mode(true)).unwrap();
    assert_eq!(y.tensor().to_vec::<f64>().unwrap(), [5.0, 4.0, 3.0]);
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f64>().unwrap(), [0.0, 1.0, 0.0, 1.0, 1.0]);
}

#[test]
fn errors_pass_through() {
    let x = Var::new(Tensor::zeros([1, 4, 4], DType::F64).unwrap());
    let err = x.adaptive_avg_pool2d((0, 2)).unwrap_err();
    assert!(matches!(err, AutogradError::Tensor(TensorError::Invalid { op: "adaptive_avg_pool2d", .. })), "{err:?}");
    // The variant says no more: the message names the size.
    assert!(err.to_string().contains("output_size (0, 2) must be positive"), "{err}");
    let err = x.max_pool2d_with(Pool2dParams::new((2, 2)).with_stride((0, 1))).unwrap_err();
    assert!(matches!(err, AutogradError::Tensor(TensorError::Invalid { op: "max_pool2d", .. })), "{err:?}");
    assert!(err.to_string().contains("stride 0 must be positive"), "{err}");
}

#[test]
fn a_channels_last_input_gets_a_channels_last_gradient_from_global_pooling() {
    // PyTorch's rule (the input's memory format), which keeps a
    // channels-last network's backward channels-last from its head on.
    let x = Tensor::arange(0.0, 2.0 * 3.0 * 4.0 * 4.0, 1.0, DType::F32).unwrap().reshape(&[2, 3, 4, 4]).unwrap();
    for (input, channels_last) in [(x.clone(), false), (x.to_channels_last().unwrap(), true)] {
        let v = Var::param(input).unwrap();
        v.adaptive_avg_pool2d((1, 1)).unwrap().sum_all().unwrap().backward().unwrap();
        let g = v.grad().unwrap();
        assert_eq!(!g.is_contiguous() && g.is_channels_last(), channels_last, "strides {:?}", g.strides());
        assert!(g.to_vec::<f32>().unwrap().iter().all(|&v| v == 1.0 / 16.0));
    }
}
