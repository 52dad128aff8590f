//! Op tests that run on every device: each body runs on the host always and
//! on `cuda:0` when a GPU is present (with the `cuda` feature), skipping with
//! one line otherwise (candle's per-device test pattern). Expected values are
//! computed here in plain f64 arithmetic, not by brasa, so the host run is a
//! real test too; tolerances are per dtype.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_tensor::{DType, Device, IndexError, Tensor, TensorError};

mod support;
/// `cuda:0` when there is one, else one skip line.
use support::gpu as cuda;

#[path = "support/sgd_reference.rs"]
mod sgd_reference;

/// `per_device!(name, |device| body)`: a module `name` with a `cpu` and a
/// `cuda` test running `body`.
macro_rules! per_device {
    ($name:ident, $body:expr) => {
        mod $name {
            use super::*;
            #[test]
            fn cpu() {
                let body: fn(Device) = $body;
                body(Device::CPU);
            }
            #[test]
            fn cuda() {
                let body: fn(Device) = $body;
                if let Some(device) = super::cuda() {
                    body(device);
                }
            }
        }
    };
}

fn tensor(values: &[f32], shape: &[usize], device: Device) -> Tensor {
    Tensor::from_slice_on(values, shape, Device::CPU).unwrap().to(device).unwrap()
}

/// The tensor's values on the host, as f64.
fn values(t: &Tensor) -> Vec<f64> {
    let host = t.to(Device::CPU).unwrap().to_dtype(DType::F64).unwrap();
    host.to_vec::<f64>().unwrap()
}

fn assert_close(got: &[f64], want: &[f64], rel: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || (g - w).abs() <= rel * w.abs().max(1.0);
        assert!(ok, "{what}[{i}]: got {g}, want {w} (rel {rel})");
    }
}

fn erf(x: f64) -> f64 {
    // Abramowitz–Stegun 7.1.26 is too coarse; use a series/continued form
    // accurate to ~1e-15 via the complementary function's Taylor series.
    let mut sum = 0.0f64;
    let mut term = x;
    let mut n = 0.0;
    while term.abs() > 1e-17 * sum.abs().max(1e-300) && n < 200.0 {
        sum += term / (2.0 * n + 1.0);
        n += 1.0;
        term *= -x * x / n;
    }
    2.0 / std::f64::consts::PI.sqrt() * sum
}

const X: [f32; 8] = [-3.0, -1.5, -0.25, 0.0, 0.5, 1.0, 2.5, 4.0];

per_device!(unary_float_ops_match_f64_math, |device| {
    let x = tensor(&X, &[2, 4], device);
    let xs: Vec<f64> = X.iter().map(|&v| v as f64).collect();
    let map = |f: fn(f64) -> f64| xs.iter().map(|&v| f(v)).collect::<Vec<_>>();
    assert_close(&values(&x.exp().unwrap()), &map(f64::exp), 1e-6, "exp");
    assert_close(&values(&x.tanh().unwrap()), &map(f64::tanh), 1e-6, "tanh");
    assert_close(&values(&x.sigmoid().unwrap()), &map(|v| 1.0 / (1.0 + (-v).exp())), 1e-6, "sigmoid");
    assert_close(&values(&x.gelu().unwrap()), &map(|v| 0.5 * v * (1.0 + erf(v / 2f64.sqrt()))), 1e-6, "gelu");
    assert_close(&values(&x.relu().unwrap()), &map(|v| v.max(0.0)), 0.0, "relu");
    assert_close(&values(&x.powf(2.0).unwrap()), &map(|v| v * v), 0.0, "powf 2");
    assert_close(&values(&x.clamp(Some(-1.0), Some(2.0)).unwrap()), &map(|v| v.clamp(-1.0, 2.0)), 0.0, "clamp");
    assert_close(&values(&x.affine(2.0, 0.5).unwrap()), &map(|v| 2.0 * v + 0.5), 0.0, "affine");
    // A transposed (strided) operand.
    let t = x.t().unwrap().neg().unwrap();
    let want: Vec<f64> = (0..4).flat_map(|c| (0..2).map(move |r| -(X[r * 4 + c] as f64))).collect();
    assert_close(&values(&t), &want, 0.0, "neg of a transpose");
    // Half precision: computed in f32, rounded once.
    for (dtype, rel) in [(DType::F16, 1e-3), (DType::BF16, 8e-3)] {
        let h = x.to_dtype(dtype).unwrap().exp().unwrap();
        assert_eq!(h.dtype(), dtype);
        assert_close(&values(&h), &map(f64::exp), rel, "exp in half precision");
    }
});

/// GELU's derivative `Φ(v) + v φ(v)` and the tanh approximation's, in plain f64.
fn gelu_derivative(v: f64) -> f64 {
    0.5 * (1.0 + erf(v / 2f64.sqrt())) + v * (-0.5 * v * v).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

fn gelu_tanh_derivative(v: f64) -> f64 {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let t = (k * (v + 0.044715 * v * v * v)).tanh();
    0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * v * v)
}

per_device!(gelu_backwards_are_one_fused_op, |device| {
    let x = tensor(&X, &[2, 4], device);
    let grad = tensor(&[1.0, -2.0, 0.5, 3.0, 1.5, -1.0, 2.0, 0.25], &[2, 4], device);
    let g: Vec<f64> = values(&grad);
    let want = |d: fn(f64) -> f64| X.iter().zip(&g).map(|(&v, &g)| g * d(v as f64)).collect::<Vec<_>>();
    assert_close(&values(&grad.gelu_backward(&x).unwrap()), &want(gelu_derivative), 1e-6, "gelu_backward");
    assert_close(&values(&grad.gelu_tanh_backward(&x).unwrap()), &want(gelu_tanh_derivative), 1e-6, "gelu_tanh");
    // A broadcast gradient and a transposed (strided) input.
    let xt = tensor(&X, &[4, 2], device).t().unwrap();
    let ones = tensor(&[1.0], &[1], device);
    let want_t: Vec<f64> = (0..2).flat_map(|r| (0..4).map(move |c| gelu_derivative(X[c * 2 + r] as f64))).collect();
    assert_close(&values(&ones.gelu_backward(&xt).unwrap()), &want_t, 1e-6, "gelu_backward of a transpose");
    // f64 and the half types (computed in f32, rounded once).
    let x64 = x.to_dtype(DType::F64).unwrap();
    let g64 = grad.to_dtype(DType::F64).unwrap();
    assert_close(&values(&g64.gelu_backward(&x64).unwrap()), &want(gelu_derivative), 1e-12, "gelu_backward f64");
    let tanh64 = g64.gelu_tanh_backward(&x64).unwrap();
    assert_close(&values(&tanh64), &want(gelu_tanh_derivative), 1e-12, "gelu_tanh_backward f64");
    for (dtype, rel) in [(DType::F16, 1e-3), (DType::BF16, 4e-3)] {
        let (xh, gh) = (x.to_dtype(dtype).unwrap(), grad.to_dtype(dtype).unwrap());
        let out = gh.gelu_backward(&xh).unwrap();
        assert_eq!(out.dtype(), dtype);
        assert_close(&values(&out), &want(gelu_derivative), rel, "gelu_backward in half precision");
        assert_close(&values(&gh.gelu_tanh_backward(&xh).unwrap()), &want(gelu_tanh_derivative), rel, "tanh half");
    }
    // ±inf gives NaN, as PyTorch's formula does; integers are refused.
    let inf = tensor(&[f32::INFINITY, f32::NEG_INFINITY, 0.0], &[3], device);
    let d = values(&tensor(&[1.0; 3], &[3], device).gelu_backward(&inf).unwrap());
    assert!(d[0].is_nan() && d[1].is_nan() && d[2] == 0.5, "{d:?}");
    let i = Tensor::from_vec_on(vec![1i64, 2], [2], Device::CPU).unwrap().to(device).unwrap();
    assert!(i.gelu_backward(&i).is_err());
});

per_device!(integer_unary_ops_wrap_like_pytorch, |device| {
    let i = Tensor::from_vec_on(vec![-3i64, 0, 4, i64::MIN], [4], Device::CPU).unwrap().to(device).unwrap();
    assert_eq!(i.neg().unwrap().to(Device::CPU).unwrap().to_vec::<i64>().unwrap(), [3, 0, -4, i64::MIN]);
    assert_eq!(i.relu().unwrap().to(Device::CPU).unwrap().to_vec::<i64>().unwrap(), [0, 0, 4, 0]);
    assert_eq!(i.mul_scalar(3.0).unwrap().to(Device::CPU).unwrap().to_vec::<i64>().unwrap(), [-9, 0, 12, i64::MIN]);
    let u = Tensor::from_vec_on(vec![1u8, 200], [2], Device::CPU).unwrap().to(device).unwrap();
    assert_eq!(u.neg().unwrap().to(Device::CPU).unwrap().to_vec::<u8>().unwrap(), [255, 56]);
    assert_eq!(u.add_scalar(100.0).unwrap().to(Device::CPU).unwrap().to_vec::<u8>().unwrap(), [101, 44]);
});

per_device!(binary_ops_broadcast_promote_and_wrap, |device| {
    let a = tensor(&[1.0, 2.0, 3.0], &[3, 1], device);
    let b = tensor(&[10.0, 20.0, 30.0, 40.0], &[4], device);
    let sum = (&a + &b).unwrap();
    assert_eq!(sum.dims(), &[3, 4]);
    let want: Vec<f64> = (1..=3).flat_map(|r| (1..=4).map(move |c| (r + 10 * c) as f64)).collect();
    assert_close(&values(&sum), &want, 0.0, "broadcast add");
    let q = (&b / &a.t().unwrap().narrow(1, 0, 1).unwrap()).unwrap();
    assert_close(&values(&q), &[10.0, 20.0, 30.0, 40.0], 0.0, "div by a broadcast scalar");
    let m = a.maximum(&tensor(&[2.0], &[1], device)).unwrap();
    assert_close(&values(&m), &[2.0, 2.0, 3.0], 0.0, "maximum");
    // i64 + f32 promotes to f32.
    let i = Tensor::from_vec_on(vec![1i64, 2, 3], [3, 1], Device::CPU).unwrap().to(device).unwrap();
    let p = (&i + &a).unwrap();
    assert_eq!(p.dtype(), DType::F32);
    assert_close(&values(&p), &[2.0, 4.0, 6.0], 0.0, "promoted add");
    let big = Tensor::from_vec_on(vec![i64::MAX], [1], Device::CPU).unwrap().to(device).unwrap();
    let wrapped = (&big + &Tensor::from_vec_on(vec![1i64], [1], Device::CPU).unwrap().to(device).unwrap()).unwrap();
    assert_eq!(wrapped.to(Device::CPU).unwrap().to_vec::<i64>().unwrap(), [i64::MIN]);
});

per_device!(comparisons_and_where_follow_ieee, |device| {
    let x = tensor(&[f32::NAN, -1.0, 0.0, 2.0], &[4], device);
    let zero = tensor(&[-0.0], &[1], device);
    let gt = x.gt(&zero).unwrap();
    assert_eq!(gt.dtype(), DType::Bool);
    assert_eq!(gt.to(Device::CPU).unwrap().to_vec::<bool>().unwrap(), [false, false, false, true]);
    assert_eq!(x.eq(&zero).unwrap().to(Device::CPU).unwrap().to_vec::<bool>().unwrap(), [false, false, true, false]);
    assert_eq!(x.ne_scalar(2.0).unwrap().to(Device::CPU).unwrap().to_vec::<bool>().unwrap(), [true, true, true, false]);
    let i = Tensor::from_vec_on(vec![1i64, 2, 3], [3], Device::CPU).unwrap().to(device).unwrap();
    assert_eq!(i.lt_scalar(2.5).unwrap().to(Device::CPU).unwrap().to_vec::<bool>().unwrap(), [true, true, false]);
    let relu = x.gt_scalar(0.0).unwrap().where_cond(&x, &zero).unwrap();
    assert_close(&values(&relu), &[0.0, 0.0, 0.0, 2.0], 0.0, "where_cond");
});

per_device!(casts_copies_and_fills, |device| {
    let x = tensor(&[1.0, -2.5, 3.75, 1e-3, 65504.0, 7.9], &[2, 3], device);
    let bf = x.to_dtype(DType::BF16).unwrap();
    let want: Vec<f64> =
        [1.0f32, -2.5, 3.75, 1e-3, 65504.0, 7.9].iter().map(|&v| half::bf16::from_f32(v).to_f64()).collect();
    assert_close(&values(&bf), &want, 0.0, "f32 → bf16");
    let ints = x.to_dtype(DType::I64).unwrap().to(Device::CPU).unwrap().to_vec::<i64>().unwrap();
    assert_eq!(ints, [1, -2, 3, 0, 65504, 7]);
    // A contiguous copy of a transpose, a fill of a narrowed view, a copy into a view.
    let t = x.t().unwrap().contiguous().unwrap();
    assert_close(&values(&t), &[1.0, f64::from(1e-3_f32), -2.5, 65504.0, 3.75, f64::from(7.9_f32)], 0.0, "contiguous");
    let z = Tensor::zeros_on([2, 3], DType::F32, device).unwrap();
    z.narrow(1, 1, 2).unwrap().fill_(5.0).unwrap();
    assert_close(&values(&z), &[0.0, 5.0, 5.0, 0.0, 5.0, 5.0], 0.0, "fill_ of a view");
    z.t().unwrap().copy_(&tensor(&[1.0, 2.0], &[2], device)).unwrap();
    assert_close(&values(&z), &[1.0, 1.0, 1.0, 2.0, 2.0, 2.0], 0.0, "copy_ into a transpose");
    let full = Tensor::full_on([3], -1.0, DType::U8, device).unwrap();
    assert_eq!(full.to(Device::CPU).unwrap().to_vec::<u8>().unwrap(), [255, 255, 255]);
});

/// `[m, k] · [k, n]` in f64, row-major.
fn naive(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    (0..m).flat_map(|i| (0..n).map(move |j| (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum())).collect()
}

per_device!(matmul_batched_transposed_and_half, |device| {
    let (bs, m, k, n) = (2usize, 3, 4, 5);
    let av: Vec<f32> = (0..bs * m * k).map(|i| ((i * 7 % 11) as f32 - 5.0) / 4.0).collect();
    let bv: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 13) as f32 - 6.0) / 8.0).collect();
    let a = tensor(&av, &[bs, m, k], device);
    let b = tensor(&bv, &[k, n], device);
    let c = a.matmul(&b).unwrap();
    assert_eq!(c.dims(), &[bs, m, n]);
    let b64: Vec<f64> = bv.iter().map(|&v| v as f64).collect();
    let want: Vec<f64> = (0..bs)
        .flat_map(|i| {
            let a64: Vec<f64> = av[i * m * k..(i + 1) * m * k].iter().map(|&v| v as f64).collect();
            naive(&a64, &b64, m, k, n)
        })
        .collect();
    assert_close(&values(&c), &want, 1e-6, "batched · shared");
    // A transposed right operand: b = (bᵀ)ᵀ read in place.
    let bt = tensor(&bv, &[k, n], device).t().unwrap().contiguous().unwrap().t().unwrap();
    assert_close(&values(&a.matmul(&bt).unwrap()), &want, 1e-6, "transposed operand");
    // bf16 with f32 accumulation.
    let c16 = a.to_dtype(DType::BF16).unwrap().matmul(&b.to_dtype(DType::BF16).unwrap()).unwrap();
    assert_eq!(c16.dtype(), DType::BF16);
    assert_close(&values(&c16), &want, 2e-2, "bf16");
    // Vector rules: [k] · [k, n] → [n].
    let v = tensor(&av[..k], &[k], device);
    let want_v = naive(&av[..k].iter().map(|&x| x as f64).collect::<Vec<_>>(), &b64, 1, k, n);
    assert_close(&values(&v.matmul(&b).unwrap()), &want_v, 1e-6, "vector · matrix");
});

per_device!(reductions_along_any_dims, |device| {
    // [2, 3, 4] with values 0..24.
    let v: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let x = tensor(&v, &[2, 3, 4], device);
    let at = |i: usize, j: usize, k: usize| (i * 12 + j * 4 + k) as f64;
    let sum_last: Vec<f64> = (0..2).flat_map(|i| (0..3).map(move |j| (0..4).map(|k| at(i, j, k)).sum())).collect();
    assert_close(&values(&x.sum(&[-1], false).unwrap()), &sum_last, 0.0, "sum over the last dim");
    let sum_first: Vec<f64> = (0..3).flat_map(|j| (0..4).map(move |k| at(0, j, k) + at(1, j, k))).collect();
    assert_close(&values(&x.sum(&[0], false).unwrap()), &sum_first, 0.0, "sum over the first dim");
    let sum_outer: Vec<f64> = (0..3).map(|j| (0..2).flat_map(|i| (0..4).map(move |k| at(i, j, k))).sum()).collect();
    let s = x.sum(&[0, 2], true).unwrap();
    assert_eq!(s.dims(), &[1, 3, 1]);
    assert_close(&values(&s), &sum_outer, 0.0, "sum over dims 0 and 2 (moved)");
    assert_close(
        &values(&x.permute(&[1, 0, 2]).unwrap().sum(&[1], false).unwrap()),
        &sum_first,
        0.0,
        "sum of a transposed view",
    );
    assert_close(&values(&x.sum_all().unwrap()), &[276.0], 0.0, "sum_all");
    assert_close(
        &values(&x.mean(&[1], false).unwrap()),
        &(0..2).flat_map(|i| (0..4).map(move |k| at(i, 1, k))).collect::<Vec<_>>(),
        1e-7,
        "mean",
    );
    let var = x.var(&[2], false).unwrap();
    assert_close(&values(&var), &[5.0 / 3.0; 6], 1e-6, "unbiased var of 4 consecutive numbers");
    // Max, argmax with a NaN, and the dtypes.
    let y = tensor(&[1.0, 7.0, 7.0, f32::NAN, 2.0, 3.0], &[2, 3], device);
    let max = values(&y.max(&[1], false).unwrap());
    assert!(max[0] == 7.0 && max[1].is_nan(), "{max:?}");
    assert_eq!(y.argmax(&[1], false).unwrap().to(Device::CPU).unwrap().to_vec::<i64>().unwrap(), [1, 0]);
    assert_eq!(y.argmin(&[0], false).unwrap().to(Device::CPU).unwrap().to_vec::<i64>().unwrap(), [1, 1, 1]);
    let b = x.gt_scalar(10.0).unwrap().sum_all().unwrap();
    assert_eq!(b.dtype(), DType::I64);
    assert_eq!(b.to(Device::CPU).unwrap().item::<i64>().unwrap(), 13);
    let h = x.to_dtype(DType::BF16).unwrap().sum(&[2], false).unwrap();
    assert_eq!(h.dtype(), DType::BF16);
    assert_close(&values(&h), &sum_last, 1e-2, "bf16 sum accumulates in f32");
    let empty = Tensor::zeros_on([0, 3], DType::F32, device).unwrap();
    assert_close(&values(&empty.sum(&[0], false).unwrap()), &[0.0; 3], 0.0, "sum of nothing");
    assert!(values(&empty.mean(&[0], false).unwrap()).iter().all(|m| m.is_nan()), "mean of nothing");
});

per_device!(softmax_and_log_softmax_along_any_dim, |device| {
    let v = [1.0f32, 2.0, 3.0, 1000.0, 1000.0, 1000.0];
    let x = tensor(&v, &[2, 3], device);
    let soft = |row: &[f64]| {
        let m = row.iter().cloned().fold(f64::MIN, f64::max);
        let z: f64 = row.iter().map(|r| (r - m).exp()).sum();
        row.iter().map(|r| (r - m).exp() / z).collect::<Vec<_>>()
    };
    let rows: Vec<f64> = v.iter().map(|&x| x as f64).collect();
    let want: Vec<f64> = rows.chunks(3).flat_map(soft).collect();
    assert_close(&values(&x.softmax(1).unwrap()), &want, 1e-6, "softmax over the last dim");
    let want_log: Vec<f64> = want.iter().map(|p| p.ln()).collect();
    assert_close(&values(&x.log_softmax(-1).unwrap()), &want_log, 1e-6, "log_softmax");
    // Over dim 0 (columns): each column of two.
    let cols: Vec<Vec<f64>> = (0..3).map(|c| soft(&[rows[c], rows[3 + c]])).collect();
    let want0: Vec<f64> = (0..2).flat_map(|r| cols.iter().map(move |c| c[r])).collect();
    assert_close(&values(&x.softmax(0).unwrap()), &want0, 1e-6, "softmax over dim 0");
    let h = x.to_dtype(DType::BF16).unwrap().softmax(1).unwrap();
    assert_eq!(h.dtype(), DType::BF16);
    assert_close(&values(&h), &want, 1e-2, "bf16 softmax");
});

per_device!(layer_norm_forward_and_backward, |device| {
    // Rows of 300 (longer than a CUDA block of 256 threads), offset by 100
    // so the variance is a small difference of large numbers.
    let (rows, width) = (3usize, 300usize);
    let v: Vec<f32> = (0..rows * width).map(|i| 100.0 + ((i * 37) % 101) as f32 / 10.0).collect();
    let w: Vec<f32> = (0..width).map(|i| 0.5 + (i % 7) as f32 / 4.0).collect();
    let b: Vec<f32> = (0..width).map(|i| (i % 5) as f32 - 2.0).collect();
    let g: Vec<f32> = (0..rows * width).map(|i| ((i * 13) % 17) as f32 / 8.0 - 1.0).collect();
    let eps = 1e-5;
    let (x, wt, bt, gt) = (
        tensor(&v, &[rows, width], device),
        tensor(&w, &[width], device),
        tensor(&b, &[width], device),
        tensor(&g, &[rows, width], device),
    );
    let (y, mean, rstd) = x.native_layer_norm(&[width], Some(&wt), Some(&bt), eps).unwrap();
    let (dx, dw, db) = gt.native_layer_norm_backward(&x, &[width], &mean, &rstd, Some(&wt), [true; 3]).unwrap();
    // The same in f64, term by term.
    let f = |s: &[f32]| s.iter().map(|&x| x as f64).collect::<Vec<_>>();
    let (v, w, b, g) = (f(&v), f(&w), f(&b), f(&g));
    let (mut want_y, mut want_dx, mut want_dw, mut want_db) = (vec![], vec![], vec![0.0; width], vec![0.0; width]);
    let (mut want_mean, mut want_rstd) = (vec![], vec![]);
    for r in 0..rows {
        let (x, gr) = (&v[r * width..(r + 1) * width], &g[r * width..(r + 1) * width]);
        let m = x.iter().sum::<f64>() / width as f64;
        let s = 1.0 / (x.iter().map(|x| (x - m).powi(2)).sum::<f64>() / width as f64 + eps).sqrt();
        let xh: Vec<f64> = x.iter().map(|x| (x - m) * s).collect();
        let gh: Vec<f64> = gr.iter().zip(&w).map(|(g, w)| g * w).collect();
        let mean_g = gh.iter().sum::<f64>() / width as f64;
        let mean_gx = gh.iter().zip(&xh).map(|(g, x)| g * x).sum::<f64>() / width as f64;
        for k in 0..width {
            want_y.push(xh[k] * w[k] + b[k]);
            want_dx.push(s * (gh[k] - mean_g - xh[k] * mean_gx));
            want_dw[k] += gr[k] * xh[k];
            want_db[k] += gr[k];
        }
        want_mean.push(m);
        want_rstd.push(s);
    }
    assert_eq!(mean.dims(), [rows, 1]);
    assert_close(&values(&mean), &want_mean, 1e-6, "layer_norm mean");
    assert_close(&values(&rstd), &want_rstd, 1e-4, "layer_norm rstd");
    assert_close(&values(&y), &want_y, 1e-4, "layer_norm output");
    assert_close(&values(&dx.unwrap()), &want_dx, 1e-3, "layer_norm input gradient");
    assert_close(&values(&dw.unwrap()), &want_dw, 1e-4, "layer_norm weight gradient");
    assert_close(&values(&db.unwrap()), &want_db, 1e-5, "layer_norm bias gradient");
    // bf16 input: computed in f32 and returned in bf16, so it matches the f32
    // result of the same (rounded) input to bf16's precision.
    let rounded = x.to_dtype(DType::BF16).unwrap();
    let (h, _, _) = rounded.native_layer_norm(&[width], Some(&wt), Some(&bt), eps).unwrap();
    assert_eq!(h.dtype(), DType::BF16);
    let (want_h, _, _) =
        rounded.to_dtype(DType::F32).unwrap().native_layer_norm(&[width], Some(&wt), Some(&bt), eps).unwrap();
    assert_close(&values(&h), &values(&want_h), 1e-2, "bf16 layer_norm");
});

per_device!(batch_norm_passes, |device| {
    // [N, C, S] = [3, 2, 150]: 450 elements per channel (more than a CUDA
    // block of 256 threads), offset by 50 so the variance is a small
    // difference of large numbers.
    let (n, c, s) = (3usize, 2usize, 150usize);
    let len = n * c * s;
    let v: Vec<f32> = (0..len).map(|i| 50.0 + ((i * 37) % 101) as f32 / 10.0).collect();
    let g: Vec<f32> = (0..len).map(|i| ((i * 13) % 17) as f32 / 8.0 - 1.0).collect();
    let (w, b) = ([0.5f32, 2.0], [1.0f32, -3.0]);
    let (x, gt) = (tensor(&v, &[n, c, 10, 15], device), tensor(&g, &[n, c, 10, 15], device));
    let (wt, bt) = (tensor(&w, &[c], device), tensor(&b, &[c], device));
    let (mean, var) = x.batch_norm_stats().unwrap();
    let invstd = var.add_scalar(1e-5).unwrap().rsqrt().unwrap();
    let y = x.batch_norm_elemt(&mean, &invstd, Some(&wt), Some(&bt)).unwrap();
    let (sum_dy, sum_dy_xmu) = gt.batch_norm_backward_reduce(&x, &mean).unwrap();
    let dx = gt.batch_norm_backward_elemt(&x, &mean, &invstd, Some(&wt), &sum_dy, &sum_dy_xmu).unwrap();
    // The same in f64, channel by channel.
    let at = |i: usize, ch: usize, j: usize| (i * c + ch) * s + j;
    let m = (n * s) as f64;
    let (mut want_y, mut want_dx) = (vec![0.0; len], vec![0.0; len]);
    let (mut want_mean, mut want_var, mut want_sd, mut want_sdx) = (vec![], vec![], vec![], vec![]);
    for ch in 0..c {
        let idx: Vec<usize> = (0..n).flat_map(|i| (0..s).map(move |j| at(i, ch, j))).collect();
        let mu = idx.iter().map(|&k| v[k] as f64).sum::<f64>() / m;
        let var = idx.iter().map(|&k| (v[k] as f64 - mu).powi(2)).sum::<f64>() / m;
        let inv = 1.0 / (var + 1e-5).sqrt();
        let sd = idx.iter().map(|&k| g[k] as f64).sum::<f64>();
        let sdx = idx.iter().map(|&k| g[k] as f64 * (v[k] as f64 - mu)).sum::<f64>();
        for &k in &idx {
            let xh = (v[k] as f64 - mu) * inv;
            want_y[k] = xh * w[ch] as f64 + b[ch] as f64;
            want_dx[k] = w[ch] as f64 * inv * (g[k] as f64 - sd / m - xh * inv * sdx / m);
        }
        want_mean.push(mu);
        want_var.push(var);
        want_sd.push(sd);
        want_sdx.push(sdx);
    }
    assert_close(&values(&mean), &want_mean, 1e-6, "batch_norm mean");
    assert_close(&values(&var), &want_var, 1e-4, "batch_norm variance");
    assert_close(&values(&y), &want_y, 1e-4, "batch_norm output");
    assert_close(&values(&sum_dy), &want_sd, 1e-5, "batch_norm Σdy");
    assert_close(&values(&sum_dy_xmu), &want_sdx, 1e-4, "batch_norm Σdy(x - mean)");
    assert_close(&values(&dx), &want_dx, 1e-3, "batch_norm input gradient");
    // Channels-last input and gradient: the same values, channels-last
    // results (the passes read them as [N·H·W, C, 1]).
    let (xc, gc) = (x.to_channels_last().unwrap(), gt.to_channels_last().unwrap());
    let (mean_c, var_c) = xc.batch_norm_stats().unwrap();
    let y_c = xc.batch_norm_elemt(&mean_c, &invstd, Some(&wt), Some(&bt)).unwrap();
    let (sum_dy_c, sum_dy_xmu_c) = gc.batch_norm_backward_reduce(&xc, &mean_c).unwrap();
    let dx_c = gc.batch_norm_backward_elemt(&xc, &mean_c, &invstd, Some(&wt), &sum_dy_c, &sum_dy_xmu_c).unwrap();
    assert!(y_c.is_channels_last() && !y_c.is_contiguous(), "channels-last batch_norm output: {:?}", y_c.strides());
    assert!(dx_c.is_channels_last() && !dx_c.is_contiguous(), "channels-last input gradient: {:?}", dx_c.strides());
    assert_close(&values(&mean_c), &want_mean, 1e-6, "channels-last batch_norm mean");
    assert_close(&values(&var_c), &want_var, 1e-4, "channels-last batch_norm variance");
    assert_close(&values(&y_c), &want_y, 1e-4, "channels-last batch_norm output");
    assert_close(&values(&sum_dy_c), &want_sd, 1e-5, "channels-last batch_norm Σdy");
    assert_close(&values(&sum_dy_xmu_c), &want_sdx, 1e-4, "channels-last batch_norm Σdy(x - mean)");
    assert_close(&values(&dx_c), &want_dx, 1e-3, "channels-last batch_norm input gradient");
    // bf16 input: read as bf16, computed in f32, returned in bf16: the f32
    // result of the same rounded input, to bf16's precision.
    let rounded = x.to_dtype(DType::BF16).unwrap();
    let (mean_h, var_h) = rounded.batch_norm_stats().unwrap();
    let (mean_f, var_f) = rounded.to_dtype(DType::F32).unwrap().batch_norm_stats().unwrap();
    assert_close(&values(&mean_h), &values(&mean_f), 1e-6, "bf16 batch_norm mean");
    assert_close(&values(&var_h), &values(&var_f), 1e-5, "bf16 batch_norm variance");
    let h = rounded.batch_norm_elemt(&mean_h, &invstd, Some(&wt), Some(&bt)).unwrap();
    assert_eq!(h.dtype(), DType::BF16);
    let want_h =
        rounded.to_dtype(DType::F32).unwrap().batch_norm_elemt(&mean_h, &invstd, Some(&wt), Some(&bt)).unwrap();
    assert_close(&values(&h), &values(&want_h), 1e-2, "bf16 batch_norm output");
    let gh = gt.to_dtype(DType::BF16).unwrap();
    let (sd_h, sdx_h) = gh.batch_norm_backward_reduce(&rounded, &mean_h).unwrap();
    let dx_h = gh.batch_norm_backward_elemt(&rounded, &mean_h, &invstd, Some(&wt), &sd_h, &sdx_h).unwrap();
    assert_eq!(dx_h.dtype(), DType::BF16);
    let (gf, xf) = (gh.to_dtype(DType::F32).unwrap(), rounded.to_dtype(DType::F32).unwrap());
    let (sd_f, sdx_f) = gf.batch_norm_backward_reduce(&xf, &mean_h).unwrap();
    let dx_f = gf.batch_norm_backward_elemt(&xf, &mean_h, &invstd, Some(&wt), &sd_f, &sdx_f).unwrap();
    assert_close(&values(&dx_h), &values(&dx_f), 2e-2, "bf16 batch_norm input gradient");
});

per_device!(batch_norm_reductions_of_rows, |device| {
    // Inputs seen as [rows, C, 1] (CUDA folds them across channels in
    // pieces of rows, `batch_norm_row_pieces`): a 2-d [300, 40] (two tiles
    // of 32 channels, the second partial; pieces of uneven length) and a
    // channels-last [4, 40, 9, 11], in f32 and bf16, against f64 sums of
    // the same (rounded) values. Offset by 50: the variance is a small
    // difference of large numbers.
    let c = 40usize;
    let reference = |x: &[f64], g: &[f64], rows: usize, at: &dyn Fn(usize, usize) -> usize| {
        let (mut mean, mut var, mut sd, mut sdx) = (vec![], vec![], vec![], vec![]);
        for ch in 0..c {
            let idx: Vec<usize> = (0..rows).map(|r| at(r, ch)).collect();
            let mu = idx.iter().map(|&k| x[k]).sum::<f64>() / rows as f64;
            var.push(idx.iter().map(|&k| (x[k] - mu).powi(2)).sum::<f64>() / rows as f64);
            sd.push(idx.iter().map(|&k| g[k]).sum::<f64>());
            sdx.push(idx.iter().map(|&k| g[k] * (x[k] - mu)).sum::<f64>());
            mean.push(mu);
        }
        (mean, var, sd, sdx)
    };
    for dtype in [DType::F32, DType::BF16] {
        let (mean_tol, var_tol) = if dtype == DType::F32 { (1e-6, 1e-4) } else { (1e-5, 1e-3) };
        for shape in [vec![300usize, c], vec![4, c, 9, 11]] {
            let len: usize = shape.iter().product();
            let v: Vec<f32> = (0..len).map(|i| 50.0 + ((i * 37) % 101) as f32 / 10.0).collect();
            let g: Vec<f32> = (0..len).map(|i| ((i * 13) % 17) as f32 / 8.0 - 1.0).collect();
            let (mut x, mut gt) = (tensor(&v, &shape, device), tensor(&g, &shape, device));
            if shape.len() == 4 {
                x = x.to_channels_last().unwrap();
                gt = gt.to_channels_last().unwrap();
            }
            let (x, gt) = (x.to_dtype(dtype).unwrap(), gt.to_dtype(dtype).unwrap());
            // The rounded values, row-major, and where (row, channel) is.
            let (xv, gv) = (values(&x.contiguous().unwrap()), values(&gt.contiguous().unwrap()));
            let spatial: usize = shape[2..].iter().product();
            let rows = len / c;
            let at = |r: usize, ch: usize| ((r / spatial) * c + ch) * spatial + r % spatial;
            let (want_mean, want_var, want_sd, want_sdx) = reference(&xv, &gv, rows, &at);
            let what = format!("{dtype:?} {shape:?}");
            let (mean, var) = x.batch_norm_stats().unwrap();
            assert_close(&values(&mean), &want_mean, mean_tol, &format!("{what} mean"));
            assert_close(&values(&var), &want_var, var_tol, &format!("{what} variance"));
            let (sum_dy, sum_dy_xmu) = gt.batch_norm_backward_reduce(&x, &mean).unwrap();
            assert_close(&values(&sum_dy), &want_sd, 1e-5, &format!("{what} Σdy"));
            assert_close(&values(&sum_dy_xmu), &want_sdx, 1e-4, &format!("{what} Σdy(x - mean)"));
        }
    }
});

per_device!(channels_last_stays_channels_last_through_element_wise_ops, |device| {
    // [2, 3, 4, 5] with values whose sums and products are exact in f32.
    let v: Vec<f32> = (0..120).map(|i| (i as f32 - 60.0) / 4.0).collect();
    let x = tensor(&v, &[2, 3, 4, 5], device);
    let xc = x.to_channels_last().unwrap();
    let bias = tensor(&[1.0, -2.0, 0.5], &[1, 3, 1, 1], device);
    let results = [
        ("relu", xc.relu().unwrap(), v.iter().map(|&a| f64::from(a.max(0.0))).collect::<Vec<_>>()),
        ("add", xc.add(&xc).unwrap(), v.iter().map(|&a| 2.0 * f64::from(a)).collect()),
        (
            "bias",
            xc.add(&bias).unwrap(),
            v.iter().enumerate().map(|(i, &a)| f64::from(a) + [1.0, -2.0, 0.5][(i / 20) % 3]).collect(),
        ),
        ("mul_scalar", xc.mul_scalar(4.0).unwrap(), v.iter().map(|&a| 4.0 * f64::from(a)).collect()),
        ("to_dtype", xc.to_dtype(DType::BF16).unwrap(), v.iter().map(|&a| f64::from(a)).collect()),
    ];
    for (what, got, want) in results {
        assert!(got.is_channels_last() && !got.is_contiguous(), "{what}: strides {:?}", got.strides());
        assert_close(&values(&got), &want, 0.0, what);
    }
});

per_device!(in_place_updates_write_through_views, |device| {
    let p = tensor(&[1.0, 2.0, 3.0, 4.0], &[2, 2], device);
    let g = tensor(&[0.5, 0.5, 1.0, 1.0], &[2, 2], device);
    p.add_scaled_(-0.1, &g).unwrap();
    assert_close(&values(&p), &[0.95, 1.95, 2.9, 3.9], 1e-6, "add_scaled_");
    assert_eq!(p.version(), 1);
    let m = tensor(&[0.0; 4], &[2, 2], device);
    m.lerp_(&g, 0.1).unwrap();
    assert_close(&values(&m), &[0.05, 0.05, 0.1, 0.1], 1e-6, "lerp_");
    let v = tensor(&[1.0; 4], &[2, 2], device);
    v.addcmul_(0.5, &g, &g).unwrap();
    assert_close(&values(&v), &[1.125, 1.125, 1.5, 1.5], 1e-6, "addcmul_");
    v.sqrt_().unwrap();
    v.addcdiv_(2.0, &g, &tensor(&[2.0], &[1], device)).unwrap();
    let want: Vec<f64> =
        [1.125f64, 1.125, 1.5, 1.5].iter().zip([0.5, 0.5, 1.0, 1.0]).map(|(a, g)| a.sqrt() + g).collect();
    assert_close(&values(&v), &want, 1e-6, "sqrt_ then addcdiv_ with a broadcast divisor");
    // A transposed view, a broadcast operand, the same view twice.
    let t = tensor(&[1.0, 2.0, 3.0, 4.0], &[2, 2], device);
    t.t().unwrap().narrow(0, 1, 1).unwrap().mul_(&tensor(&[10.0], &[1], device)).unwrap();
    assert_close(&values(&t), &[1.0, 20.0, 3.0, 40.0], 0.0, "mul_ through a transposed column");
    t.add_(&t).unwrap();
    assert_close(&values(&t), &[2.0, 40.0, 6.0, 80.0], 0.0, "add_ of itself");
    t.clamp_(Some(5.0), Some(50.0)).unwrap();
    t.maximum_(&tensor(&[10.0, 0.0], &[2], device)).unwrap();
    assert_close(&values(&t), &[10.0, 40.0, 10.0, 50.0], 0.0, "clamp_ then maximum_");
    t.log1p_().unwrap();
    assert_close(&values(&t), &[11f64.ln(), 41f64.ln(), 11f64.ln(), 51f64.ln()], 1e-6, "log1p_");
    let i = Tensor::from_vec_on(vec![5i64, -7], [2], Device::CPU).unwrap().to(device).unwrap();
    i.mul_scalar_(3.0).unwrap();
    i.neg_().unwrap();
    assert_eq!(i.to(Device::CPU).unwrap().to_vec::<i64>().unwrap(), [-15, 21]);
    let expanded = tensor(&[1.0], &[1], device).expand([3]).unwrap();
    let error = expanded.exp_().unwrap_err();
    assert!(matches!(error, TensorError::Invalid { op: "exp_", .. }), "{error:?}");
});

fn ids(values: &[i64], shape: &[usize], device: Device) -> Tensor {
    Tensor::from_slice_on(values, shape, Device::CPU).unwrap().to(device).unwrap()
}

per_device!(fused_sgd_equals_the_composed_update_and_the_host, |device| {
    // `fused_sgd_` on `device` against the composed in-place ops on
    // `device` and against `fused_sgd_` on the host: the kernels replay the
    // host's op sequence with its roundings (no FMA), so all three agree bit
    // for bit, for every option, over three steps (the first starts the
    // momentum buffers), with a transposed gradient.
    use brasa_tensor::{fused_sgd_, SgdParam};
    // A copy with its own storage (`to` may share it on the same device).
    let fresh = |t: &Tensor, on: Device| {
        let copy = Tensor::zeros_on(t.dims(), t.dtype(), on).unwrap();
        copy.copy_(&t.to(on).unwrap()).unwrap();
        copy
    };
    // Values without the process-wide generator, which another test here seeds.
    let wavy = |dims: &[usize], dtype: DType, salt: usize| {
        let n: usize = dims.iter().product();
        let v: Vec<f64> = (0..n).map(|i| ((i * 37 + salt * 101) as f64 * 0.173).sin() * 2.0).collect();
        Tensor::from_vec(v, dims).unwrap().to_dtype(dtype).unwrap()
    };
    let shapes: [&[usize]; 2] = [&[300, 7], &[5]];
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        for options in sgd_reference::configs() {
            let momentum = options.momentum != 0.0;
            let starts: Vec<Tensor> = shapes.iter().map(|s| wavy(s, dtype, 0)).collect();
            let fused: Vec<Tensor> = starts.iter().map(|t| fresh(t, device)).collect();
            let composed: Vec<Tensor> = starts.iter().map(|t| fresh(t, device)).collect();
            let host: Vec<Tensor> = starts.iter().map(|t| fresh(t, Device::CPU)).collect();
            let fused_buffers: Vec<Tensor> = fused.iter().map(|p| p.zeros_like().unwrap()).collect();
            let host_buffers: Vec<Tensor> = host.iter().map(|p| p.zeros_like().unwrap()).collect();
            let mut composed_buffers: Vec<Option<Tensor>> = vec![None; shapes.len()];
            for step in 1..=3 {
                // Made on the host, transposed where two-dim.
                let drawn: Vec<Tensor> = shapes
                    .iter()
                    .map(|s| {
                        let r: Vec<usize> = s.iter().rev().copied().collect();
                        wavy(&r, dtype, step)
                    })
                    .collect();
                let grads_on = |on: Device| -> Vec<Tensor> {
                    drawn.iter().map(|g| if g.rank() == 2 { fresh(g, on).t().unwrap() } else { fresh(g, on) }).collect()
                };
                let (grads, host_grads) = (grads_on(device), grads_on(Device::CPU));
                let first = step == 1;
                let list: Vec<SgdParam<'_>> = (0..shapes.len())
                    .map(|i| SgdParam::new(&fused[i], &grads[i], momentum.then_some(&fused_buffers[i]), first))
                    .collect();
                fused_sgd_(&list, options).unwrap();
                let list: Vec<SgdParam<'_>> = (0..shapes.len())
                    .map(|i| SgdParam::new(&host[i], &host_grads[i], momentum.then_some(&host_buffers[i]), first))
                    .collect();
                fused_sgd_(&list, options).unwrap();
                for i in 0..shapes.len() {
                    sgd_reference::composed(&composed[i], &grads[i], &mut composed_buffers[i], options);
                }
            }
            for i in 0..shapes.len() {
                let what = format!("{device} {dtype} {options:?} parameter {i}");
                let want = values(&fused[i]);
                assert_ne!(want, values(&starts[i]), "{what}: the step moved it");
                assert_eq!(want, values(&composed[i]), "{what}: fused vs composed on the device");
                assert_eq!(want, values(&host[i]), "{what}: fused on the device vs on the host");
                if let Some(buffer) = &composed_buffers[i] {
                    assert_eq!(values(&fused_buffers[i]), values(buffer), "{what}: momentum buffer");
                    assert_eq!(values(&fused_buffers[i]), values(&host_buffers[i]), "{what}: momentum buffer vs host");
                }
            }
        }
    }
});

per_device!(index_select_gather_scatter_embedding_one_hot, |device| {
    let x = tensor(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3], device);
    let picked = x.index_select(1, &ids(&[2, 0, 2], &[3], device)).unwrap();
    assert_close(&values(&picked), &[2.0, 0.0, 2.0, 5.0, 3.0, 5.0], 0.0, "index_select");
    let error = x.index_select(0, &ids(&[0, 2], &[2], device)).unwrap_err();
    assert!(
        matches!(
            error,
            TensorError::Index {
                op: "index_select",
                source: IndexError::OutOfRange { position: 1, index: 2, size: 2 },
                ..
            }
        ),
        "{error:?}"
    );
    let gathered = x.gather(1, &ids(&[2, 1, 0, 0], &[2, 2], device)).unwrap();
    assert_close(&values(&gathered), &[2.0, 1.0, 3.0, 3.0], 0.0, "gather");
    let through_transpose = x.t().unwrap().gather(0, &ids(&[2, 1], &[1, 2], device)).unwrap();
    assert_close(&values(&through_transpose), &[2.0, 4.0], 0.0, "gather from a transposed view");
    let total = x.zeros_like().unwrap().scatter_add(1, &ids(&[0, 0, 1, 2], &[2, 2], device), &x).unwrap();
    assert_close(&values(&total), &[1.0, 0.0, 0.0, 0.0, 3.0, 4.0], 0.0, "scatter_add with a repeated index");
    let table = tensor(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], &[4, 2], device);
    let rows = Tensor::embedding(&table, &ids(&[3, 0, 1, 3], &[2, 2], device)).unwrap();
    assert_eq!(rows.dims(), [2, 2, 2]);
    assert_close(&values(&rows), &[6.0, 7.0, 0.0, 1.0, 2.0, 3.0, 6.0, 7.0], 0.0, "embedding");
    let hot = ids(&[1, 0], &[2], device).one_hot(3).unwrap();
    assert_eq!(hot.to(Device::CPU).unwrap().to_vec::<i64>().unwrap(), [0, 1, 0, 1, 0, 0]);
    let error = ids(&[1, 5], &[2], device).one_hot(3).unwrap_err();
    assert!(
        matches!(
            error,
            TensorError::Index { op: "one_hot", source: IndexError::OutOfRange { position: 1, index: 5, size: 3 }, .. }
        ),
        "{error:?}"
    );
});

per_device!(convolution_pooling_and_concatenation, |device| {
    use brasa_tensor::Conv2dParams;
    // A 2-channel 4x4 image, a 3x2x3x3 weight, padding 1, against a direct sum.
    let (c_in, c_out, h, w, k) = (2usize, 3usize, 4usize, 4usize, 3usize);
    let xv: Vec<f32> = (0..c_in * h * w).map(|i| ((i * 5 % 7) as f32 - 3.0) / 3.0).collect();
    let wv: Vec<f32> = (0..c_out * c_in * k * k).map(|i| ((i * 3 % 11) as f32 - 5.0) / 5.0).collect();
    let x = tensor(&xv, &[1, c_in, h, w], device);
    let weight = tensor(&wv, &[c_out, c_in, k, k], device);
    let bias = tensor(&[0.5, -0.5, 1.0], &[c_out], device);
    let params = Conv2dParams::default().with_padding((1, 1));
    let y = x.conv2d(&weight, Some(&bias), params).unwrap();
    assert_eq!(y.dims(), &[1, c_out, h, w]);
    let at = |v: &[f32], i: usize| f64::from(v[i]);
    let mut want = Vec::new();
    for o in 0..c_out {
        for i in 0..h {
            for j in 0..w {
                let mut sum = [0.5, -0.5, 1.0][o];
                for c in 0..c_in {
                    for (di, dj) in (0..k).flat_map(|di| (0..k).map(move |dj| (di, dj))) {
                        let (ii, jj) = ((i + di) as isize - 1, (j + dj) as isize - 1);
                        if (0..h as isize).contains(&ii) && (0..w as isize).contains(&jj) {
                            let xi = (c * h + ii as usize) * w + jj as usize;
                            sum += at(&xv, xi) * at(&wv, ((o * c_in + c) * k + di) * k + dj);
                        }
                    }
                }
                want.push(sum);
            }
        }
    }
    assert_close(&values(&y), &want, 1e-5, "conv2d");
    // Gradients: checked against their definitions through sums of products.
    let g = Tensor::ones_on([1, c_out, h, w], DType::F32, device).unwrap();
    let db = g.conv2d_backward_bias().unwrap();
    assert_close(&values(&db), &[(h * w) as f64; 3], 0.0, "bias gradient");
    let dx = g.conv2d_backward_input(&weight, [1, c_in, h, w], params).unwrap();
    let dw = x.conv2d_backward_weight(&g, [c_out, c_in, k, k], params).unwrap();
    // <dy, conv(x)> = <dx, x> + (bias term) and = <dw, w> (+ bias): both sides linear.
    let y_nb = x.conv2d(&weight, None, params).unwrap();
    let lhs = values(&y_nb).iter().sum::<f64>();
    let via_dx: f64 = values(&dx).iter().zip(&xv).map(|(d, &v)| d * f64::from(v)).sum();
    let via_dw: f64 = values(&dw).iter().zip(&wv).map(|(d, &v)| d * f64::from(v)).sum();
    assert!((lhs - via_dx).abs() < 1e-4 && (lhs - via_dw).abs() < 1e-4, "{lhs} {via_dx} {via_dw}");
    // Grouped: 2 groups of one channel each, against the two halves alone.
    let wg = tensor(&wv[..2 * k * k], &[2, 1, k, k], device);
    let yg = x.conv2d(&wg, None, params.with_groups(2)).unwrap();
    let first = x.narrow(1, 0, 1).unwrap().conv2d(&wg.narrow(0, 0, 1).unwrap(), None, params).unwrap();
    assert_close(&values(&yg.narrow(1, 0, 1).unwrap()), &values(&first), 1e-6, "grouped conv2d");
    // Pooling.
    let p = tensor(&[1.0, 5.0, 2.0, 0.0, 3.0, 4.0, 9.0, 8.0], &[1, 2, 4], device);
    let (maxima, idx) = p.max_pool2d((2, 2), (2, 2), (0, 0)).unwrap();
    assert_close(&values(&maxima), &[5.0, 9.0], 0.0, "max_pool2d");
    assert_eq!(idx.to(Device::CPU).unwrap().to_vec::<i64>().unwrap(), [1, 6]);
    let back = tensor(&[1.0, 2.0], &[1, 1, 2], device).max_pool2d_backward(&idx, [1, 2, 4]).unwrap();
    assert_close(&values(&back), &[0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0], 0.0, "max_pool2d_backward");
    let avg = p.avg_pool2d((2, 2), (2, 2), (0, 0), true).unwrap();
    assert_close(&values(&avg), &[3.25, 4.75], 0.0, "avg_pool2d");
    let avg_back =
        tensor(&[4.0, 8.0], &[1, 1, 2], device).avg_pool2d_backward([1, 2, 4], (2, 2), (2, 2), (0, 0), true).unwrap();
    assert_close(&values(&avg_back), &[1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0], 0.0, "avg_pool2d_backward");
    // Concatenation along a middle dim.
    let a = tensor(&[1.0, 2.0, 3.0, 4.0], &[2, 2], device);
    let b = tensor(&[5.0, 6.0], &[2, 1], device);
    assert_close(&values(&Tensor::cat(&[&a, &b], 1).unwrap()), &[1.0, 2.0, 5.0, 3.0, 4.0, 6.0], 0.0, "cat");
});

per_device!(random_fills_repeat_the_host_stream, |device| {
    // Each device draws the process-wide stream at the same positions: a
    // fill on `device` after `manual_seed(7)` equals the host's.
    let _serial = SEED_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let draw = |on: Device| {
        brasa_tensor::manual_seed(7);
        let u = Tensor::rand_on([1000], DType::F32, on).unwrap();
        let n = Tensor::randn_on([1000], DType::F64, on).unwrap();
        let b = Tensor::bernoulli_on([1000], 0.3, DType::U8, on).unwrap();
        (values(&u), values(&n), b.to(Device::CPU).unwrap().to_vec::<u8>().unwrap())
    };
    let (hu, hn, hb) = draw(Device::CPU);
    let (du, dn, db) = draw(device);
    assert_eq!(hu, du, "uniform draws are bit-identical");
    assert_eq!(hb, db, "Bernoulli draws are bit-identical");
    assert_close(&dn, &hn, 1e-12, "normal draws agree to the last bits of log and cos");
    let ones = hb.iter().filter(|&&v| v == 1).count();
    assert!((250..350).contains(&ones), "{ones} ones in 1000 draws at p = 0.3");
    assert!(hu.iter().all(|&v| (0.0..1.0).contains(&v)));
});

/// Tests that seed the process-wide generator run one at a time.
static SEED_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
