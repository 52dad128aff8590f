//! PyTorch parity of `clamp`'s gradient, `cat`/`stack` of mixed dtypes and
//! `mm`/`bmm`/`addmm`/`baddbmm`: values and gradients against PyTorch's
//! documented rules written out here, f64 gradcheck on contiguous and
//! non-contiguous inputs, and the arguments PyTorch refuses.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{gradcheck, AutogradError, Var};
use brasa_tensor::{manual_seed, set_host_device_count, DType, Device, Tensor, TensorError};

/// Two logical host devices for the device-mismatch errors: every test asks
/// for them before its first tensor, whichever test runs first.
fn init() {
    set_host_device_count(2).expect("every test asks for the same count");
}

fn f64s(values: &[f64], shape: &[usize]) -> Tensor {
    init();
    Tensor::from_vec(values.to_vec(), shape).unwrap()
}

/// The gradient of `sum(clamp(x, min, max))` with respect to `x`.
fn clamp_grad(xs: &[f64], min: Option<f64>, max: Option<f64>) -> Vec<f64> {
    let x = Var::param(f64s(xs, &[xs.len()])).unwrap();
    x.clamp(min, max).unwrap().sum_all().unwrap().backward().unwrap();
    x.grad().unwrap().to_vec::<f64>().unwrap()
}

#[test]
fn clamp_gradient_is_pytorchs_clamp_backward() {
    // PyTorch 2.15 with scalar bounds (each value below printed by it):
    // where(min < x < max, grad, 0), the bounds themselves get none.
    let xs = [-2.0, -1.0, -0.5, 0.0, 1.0, 1.5, f64::NAN];
    assert_eq!(clamp_grad(&xs, Some(-1.0), Some(1.0)), [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0]);
    // Only a min, only a max: one side open.
    assert_eq!(clamp_grad(&xs, Some(-1.0), None), [0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0]);
    assert_eq!(clamp_grad(&xs, None, Some(0.0)), [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
    // min > max: every output is max, no element gets a gradient, not even
    // those equal to a bound.
    let y = Var::param(f64s(&xs, &[7])).unwrap();
    let out = y.clamp(Some(1.0), Some(-1.0)).unwrap();
    let v = out.tensor().to_vec::<f64>().unwrap();
    assert_eq!(v[..6], [-1.0; 6]);
    assert!(v[6].is_nan(), "NaN stays NaN: {v:?}");
    out.sum_all().unwrap().backward().unwrap();
    assert_eq!(y.grad().unwrap().to_vec::<f64>().unwrap(), [0.0; 7]);
    // min == max: nothing passes.
    assert_eq!(clamp_grad(&xs, Some(1.0), Some(1.0)), [0.0; 7]);
    // Infinite bounds pass every finite input; infinite inputs sit on them.
    let inf = [f64::NEG_INFINITY, 0.0, f64::INFINITY];
    assert_eq!(clamp_grad(&inf, Some(f64::NEG_INFINITY), Some(f64::INFINITY)), [0.0, 1.0, 0.0]);
    assert_eq!(clamp_grad(&inf, Some(0.0), None), [0.0, 0.0, 1.0]);
}

#[test]
fn clamp_gradient_selects_rather_than_multiplies() {
    // An infinite upstream gradient on a clamped element: PyTorch's where
    // gives 0 there, a 0/1 mask multiply would give NaN.
    let x = Var::param(f64s(&[-3.0, 0.5, 3.0], &[3])).unwrap();
    let g = f64s(&[f64::INFINITY, 2.0, f64::NAN], &[3]);
    x.clamp(Some(-1.0), Some(1.0)).unwrap().backward_with(&g).unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f64>().unwrap(), [0.0, 2.0, 0.0]);
}

#[test]
fn clamp_bounds_compare_in_the_inputs_dtype() {
    // PyTorch casts the scalar bounds to x's dtype: 0.1f32 sits on the bound
    // 0.1 (f64 0.1 rounds to the same f32), so it gets no gradient, while
    // compared in f64 it would be above it (0.1f32 > 0.1).
    init();
    let x = Var::param(Tensor::from_vec(vec![0.1f32, 0.2, 0.05], [3]).unwrap()).unwrap();
    x.clamp(Some(0.1), None).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), [0.0, 1.0, 0.0]);
    // A bound beyond f16's range is +inf there: nothing is clamped.
    let h = Var::param(Tensor::from_vec(vec![60000.0f32, -1.0], [2]).unwrap().to_dtype(DType::F16).unwrap()).unwrap();
    h.clamp(None, Some(1e6)).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(h.grad().unwrap().to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(), [1.0, 1.0]);
}

#[test]
fn clamp_gradcheck_and_refusals() {
    init();
    manual_seed(5);
    // Away from the bounds (the derivative does not exist on them).
    let x = Tensor::randn([4, 5], DType::F64).unwrap().mul_scalar(2.0).unwrap();
    let xt = Tensor::randn([5, 4], DType::F64).unwrap().mul_scalar(2.0).unwrap().t().unwrap();
    assert!(!xt.is_contiguous());
    for input in [x, xt] {
        let safe =
            input.to_vec::<f64>().unwrap().iter().all(|v| (v.abs() - 1.0).abs() > 1e-3 && (v - 0.3).abs() > 1e-3);
        assert!(safe, "an input too close to a bound for central differences");
        gradcheck(|v| v[0].clamp(Some(-1.0), Some(1.0))?.sum_all(), std::slice::from_ref(&input), 1e-6, 1e-7, 1e-5)
            .unwrap();
        gradcheck(
            |v| v[0].clamp(Some(0.3), None)?.mul(&v[0])?.sum_all(),
            std::slice::from_ref(&input),
            1e-6,
            1e-7,
            1e-5,
        )
        .unwrap();
        gradcheck(|v| v[0].clamp(None, Some(0.3))?.exp()?.sum_all(), &[input], 1e-6, 1e-7, 1e-5).unwrap();
    }
    let x = Var::param(f64s(&[1.0], &[1])).unwrap();
    let error = x.clamp(None, None).unwrap_err();
    assert!(matches!(error, AutogradError::Tensor(TensorError::Invalid { op: "clamp", .. })), "{error:?}");
    // The variant says no more: the message says which rule.
    assert!(error.to_string().contains("at least one of min and max"), "{error}");
    let error = x.clamp(Some(f64::NAN), None).unwrap_err();
    assert!(matches!(error, AutogradError::Tensor(TensorError::Invalid { op: "clamp", .. })), "{error:?}");
    assert!(error.to_string().contains("NaN"), "{error}");
}

#[test]
fn cat_and_stack_promote_and_send_gradients_back_in_each_dtype() {
    init();
    let a = Var::param(Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]).unwrap()).unwrap();
    let b = Var::param(Tensor::from_vec(vec![5.0f32, 6.0], [2, 1]).unwrap().to_dtype(DType::BF16).unwrap()).unwrap();
    let c = Var::param(Tensor::from_vec(vec![7.0f64, 8.0], [2, 1]).unwrap()).unwrap();
    let joined = Var::cat(&[&a, &b, &c], 1).unwrap();
    assert_eq!(joined.dtype(), DType::F64);
    assert_eq!(joined.tensor().to_vec::<f64>().unwrap(), [1.0, 2.0, 5.0, 7.0, 3.0, 4.0, 6.0, 8.0]);
    // Weights 1..8 so each input's gradient is its own slice of them.
    let w = f64s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], &[2, 4]);
    joined.backward_with(&w).unwrap();
    let (ga, gb, gc) = (a.grad().unwrap(), b.grad().unwrap(), c.grad().unwrap());
    assert_eq!((ga.dtype(), gb.dtype(), gc.dtype()), (DType::F32, DType::BF16, DType::F64));
    assert_eq!(ga.to_vec::<f32>().unwrap(), [1.0, 2.0, 5.0, 6.0]);
    assert_eq!(gb.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(), [3.0, 7.0]);
    assert_eq!(gc.to_vec::<f64>().unwrap(), [4.0, 8.0]);

    let h = Var::param(Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap().to_dtype(DType::F16).unwrap()).unwrap();
    let k = Var::param(Tensor::from_vec(vec![3.0f32, 4.0], [2]).unwrap().to_dtype(DType::BF16).unwrap()).unwrap();
    let s = Var::stack(&[&h, &k], 1).unwrap();
    // f16 with bf16 is f32, as in PyTorch.
    assert_eq!(s.dtype(), DType::F32);
    assert_eq!(s.tensor().to_vec::<f32>().unwrap(), [1.0, 3.0, 2.0, 4.0]);
    s.backward_with(&f64s(&[1.0, 2.0, 3.0, 4.0], &[2, 2]).to_dtype(DType::F32).unwrap()).unwrap();
    let (gh, gk) = (h.grad().unwrap(), k.grad().unwrap());
    assert_eq!((gh.dtype(), gk.dtype()), (DType::F16, DType::BF16));
    assert_eq!(gh.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(), [1.0, 3.0]);
    assert_eq!(gk.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(), [2.0, 4.0]);
}

#[test]
fn cat_stack_gradcheck_non_contiguous_and_device_errors() {
    init();
    manual_seed(3);
    let a = Tensor::randn([3, 2], DType::F64).unwrap();
    let bt = Tensor::randn([4, 3], DType::F64).unwrap().t().unwrap();
    assert!(!bt.is_contiguous());
    gradcheck(|v| Var::cat(&[&v[0], &v[1]], 1)?.powf(2.0)?.sum_all(), &[a.clone(), bt.clone()], 1e-6, 1e-7, 1e-5)
        .unwrap();
    let c = Tensor::randn([3, 2], DType::F64).unwrap();
    gradcheck(|v| Var::stack(&[&v[0], &v[1]], 0)?.powf(3.0)?.sum_all(), &[a, c], 1e-6, 1e-7, 1e-5).unwrap();
    // An f32 input next to an f64 one, strided: values promote exactly.
    let f = Tensor::from_vec(vec![0.5f32, 1.5, 2.5, 3.5, 4.5, 5.5], [2, 3]).unwrap().t().unwrap();
    let joined = Tensor::cat(&[&f, &bt], 1).unwrap();
    assert_eq!(joined.dtype(), DType::F64);
    let (jv, bv) = (joined.to_vec::<f64>().unwrap(), bt.to_vec::<f64>().unwrap());
    for r in 0..3 {
        assert_eq!(jv[r * 6..r * 6 + 2], [0.5 + r as f64, 3.5 + r as f64]);
        assert_eq!(jv[r * 6 + 2..r * 6 + 6], bv[r * 4..r * 4 + 4]);
    }
    // Devices must still match, and the error names both.
    let here = Var::new(f64s(&[1.0, 2.0], &[2]));
    let there = Var::new(Tensor::from_vec(vec![1.0f32], [1]).unwrap().to(Device::Cpu(1)).unwrap());
    for error in [Var::cat(&[&here, &there], 0).unwrap_err(), Var::stack(&[&here, &here, &there], 0).unwrap_err()] {
        let error = error.to_string();
        assert!(error.contains(&Device::Cpu(1).to_string()) && error.contains(&Device::CPU.to_string()), "{error}");
    }
}

/// `[n, m] · [m, p]` row-major in plain f64.
fn mm_ref(a: &[f64], b: &[f64], n: usize, m: usize, p: usize) -> Vec<f64> {
    let mut out = vec![0.0; n * p];
    for i in 0..n {
        for j in 0..p {
            out[i * p + j] = (0..m).map(|k| a[i * m + k] * b[k * p + j]).sum();
        }
    }
    out
}

fn close(got: &[f64], expected: &[f64]) {
    assert_eq!(got.len(), expected.len());
    for (g, e) in got.iter().zip(expected) {
        assert!((g - e).abs() <= 1e-12 * e.abs().max(1.0), "got {got:?}, expected {expected:?}");
    }
}

#[test]
fn mm_bmm_addmm_baddbmm_values_match_their_formulas() {
    init();
    let a: Vec<f64> = (0..6).map(|i| i as f64 * 0.5 - 1.0).collect();
    let b: Vec<f64> = (0..12).map(|i| (i as f64).sin()).collect();
    let (av, bv) = (Var::new(f64s(&a, &[2, 3])), Var::new(f64s(&b, &[3, 4])));
    let prod = mm_ref(&a, &b, 2, 3, 4);
    close(&av.mm(&bv).unwrap().tensor().to_vec::<f64>().unwrap(), &prod);
    // addmm with a row-vector input broadcast over the rows.
    let bias = [1.0, -2.0, 3.0, 0.25];
    let out = Var::new(f64s(&bias, &[4])).addmm(&av, &bv, 0.5, -1.5).unwrap();
    let expected: Vec<f64> = (0..8).map(|i| 0.5 * bias[i % 4] - 1.5 * prod[i]).collect();
    close(&out.tensor().to_vec::<f64>().unwrap(), &expected);
    // beta = 0 ignores the input's values, NaN included.
    let nan = Var::new(f64s(&[f64::NAN], &[1, 1]));
    let out = nan.addmm(&av, &bv, 0.0, 2.0).unwrap();
    close(&out.tensor().to_vec::<f64>().unwrap(), &prod.iter().map(|v| 2.0 * v).collect::<Vec<_>>());
    // bmm and baddbmm: batch 2, each batch its own product.
    let b1: Vec<f64> = (0..12).map(|i| (i as f64 * 0.3).cos()).collect();
    let b2: Vec<f64> = (0..24).map(|i| i as f64 - 11.5).collect();
    let (x1, x2) = (Var::new(f64s(&b1, &[2, 2, 3])), Var::new(f64s(&b2, &[2, 3, 4])));
    let mut bprod = mm_ref(&b1[..6], &b2[..12], 2, 3, 4);
    bprod.extend(mm_ref(&b1[6..], &b2[12..], 2, 3, 4));
    close(&x1.bmm(&x2).unwrap().tensor().to_vec::<f64>().unwrap(), &bprod);
    let col = [0.5, -1.0];
    let out = Var::new(f64s(&col, &[2, 1])).baddbmm(&x1, &x2, 2.0, 0.25).unwrap();
    assert_eq!(out.dims(), &[2, 2, 4]);
    let expected: Vec<f64> = (0..16).map(|i| 2.0 * col[(i / 4) % 2] + 0.25 * bprod[i]).collect();
    close(&out.tensor().to_vec::<f64>().unwrap(), &expected);
}

#[test]
fn addmm_gradients_match_pytorchs() {
    init();
    // d/dinput = beta · Σ over broadcast dims of g; d/dm1 = alpha · g · m2ᵀ;
    // d/dm2 = alpha · m1ᵀ · g. With g all ones: m1 [2, 3], m2 [3, 2].
    let input = Var::param(f64s(&[1.0, 2.0], &[2])).unwrap();
    let m1 = Var::param(f64s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])).unwrap();
    let m2 = Var::param(f64s(&[1.0, -1.0, 0.5, 2.0, 0.0, 3.0], &[3, 2])).unwrap();
    input.addmm(&m1, &m2, 3.0, 2.0).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(input.grad().unwrap().to_vec::<f64>().unwrap(), [6.0, 6.0]);
    // Row sums of m2 (0, 2.5, 3) times alpha, for each row of m1.
    assert_eq!(m1.grad().unwrap().to_vec::<f64>().unwrap(), [0.0, 5.0, 6.0, 0.0, 5.0, 6.0]);
    // Column sums of m1 (5, 7, 9) times alpha, for each column of m2.
    assert_eq!(m2.grad().unwrap().to_vec::<f64>().unwrap(), [10.0, 10.0, 14.0, 14.0, 18.0, 18.0]);
    // beta = 0: the input gets a zero gradient of its own shape, not NaN.
    let nan = Var::param(f64s(&[f64::NAN, 1.0], &[2])).unwrap();
    nan.addmm(&m1, &m2, 0.0, 1.0).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(nan.grad().unwrap().to_vec::<f64>().unwrap(), [0.0, 0.0]);
}

#[test]
fn matrix_product_wrappers_gradcheck_non_contiguous() {
    init();
    manual_seed(11);
    let r = |dims: &[usize]| Tensor::randn(dims, DType::F64).unwrap();
    // Transposed operands: non-contiguous.
    let (a, b) = (r(&[3, 2]).t().unwrap(), r(&[4, 3]).t().unwrap());
    assert!(!a.is_contiguous() && !b.is_contiguous());
    let tol = (1e-6, 1e-7, 1e-5);
    gradcheck(|v| v[0].mm(&v[1])?.sum_all(), &[a.clone(), b.clone()], tol.0, tol.1, tol.2).unwrap();
    let bias = r(&[2, 1]);
    gradcheck(|v| v[0].addmm(&v[1], &v[2], 0.7, -1.3)?.powf(2.0)?.sum_all(), &[bias, a, b], tol.0, tol.1, tol.2)
        .unwrap();
    let (x, y) = (r(&[2, 4, 3]).transpose(1, 2).unwrap(), r(&[2, 4, 5]));
    assert!(!x.is_contiguous());
    gradcheck(|v| v[0].bmm(&v[1])?.powf(2.0)?.sum_all(), &[x.clone(), y.clone()], tol.0, tol.1, tol.2).unwrap();
    let input = r(&[5]);
    gradcheck(|v| v[0].baddbmm(&v[1], &v[2], 2.0, 0.5)?.powf(2.0)?.sum_all(), &[input, x, y], tol.0, tol.1, tol.2)
        .unwrap();
}

#[test]
fn matrix_product_wrappers_refuse_wrong_shapes_naming_them() {
    init();
    let v = |dims: &[usize]| Var::new(Tensor::ones(dims, DType::F64).unwrap());
    let cases = [
        (v(&[2, 3]).mm(&v(&[3])).unwrap_err(), "[2, 3] and [3]"),
        (v(&[2, 3]).mm(&v(&[4, 2])).unwrap_err(), "3 columns vs 4 rows"),
        (v(&[2, 2, 3]).mm(&v(&[2, 3, 2])).unwrap_err(), "2-d"),
        (v(&[2, 3]).bmm(&v(&[3, 2])).unwrap_err(), "3-d"),
        (v(&[2, 2, 3]).bmm(&v(&[1, 3, 2])).unwrap_err(), "batch sizes differ"),
        (v(&[2, 2, 3]).bmm(&v(&[2, 2, 2])).unwrap_err(), "[2, 2, 3] and [2, 2, 2]"),
        (
            v(&[3]).addmm(&v(&[2, 3]), &v(&[3, 2]), 1.0, 1.0).unwrap_err(),
            "[3] cannot be broadcast to the product's shape [2, 2]",
        ),
        (v(&[2, 2]).addmm(&v(&[2, 3]), &v(&[2, 2]), 1.0, 1.0).unwrap_err(), "cannot be multiplied"),
        (v(&[3, 2, 2]).baddbmm(&v(&[2, 2, 3]), &v(&[2, 3, 2]), 1.0, 1.0).unwrap_err(), "cannot be broadcast"),
        (v(&[2, 2]).baddbmm(&v(&[2, 3]), &v(&[3, 2]), 1.0, 1.0).unwrap_err(), "3-d"),
    ];
    for (error, expected) in cases {
        let error = error.to_string();
        assert!(error.contains(expected), "{error} should contain {expected}");
    }
}
