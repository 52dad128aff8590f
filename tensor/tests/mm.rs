//! `mm`, `bmm`, `addmm` and `baddbmm` on tensors: values against a naive
//! f64 product written here (transposed operands included), PyTorch's
//! shape rules and their errors, and `beta == 0` ignoring the input.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_tensor::{DType, Device, Tensor, TensorError};

fn f64s(values: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_slice_on(values, shape, Device::CPU).unwrap()
}

fn seq(n: usize, scale: f64, shift: f64) -> Vec<f64> {
    (0..n).map(|i| (i as f64 * scale + shift).sin()).collect()
}

/// `[b, n, m] · [b, m, p]`, row-major, in f64.
fn naive_bmm(a: &[f64], b: &[f64], batch: usize, n: usize, m: usize, p: usize) -> Vec<f64> {
    let mut out = vec![0.0; batch * n * p];
    for z in 0..batch {
        for i in 0..n {
            for j in 0..p {
                out[(z * n + i) * p + j] = (0..m).map(|k| a[(z * n + i) * m + k] * b[(z * m + k) * p + j]).sum();
            }
        }
    }
    out
}

fn close(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= 1e-12 * (1.0 + w.abs()), "{got:?} vs {want:?}");
    }
}

#[test]
fn products_match_naive() {
    let (a, b) = (seq(6, 0.7, 0.1), seq(12, 0.3, 1.0));
    // mm with a transposed (non-contiguous) second operand.
    let bt = f64s(&b, &[3, 4]).t().unwrap().contiguous().unwrap().t().unwrap();
    let out = f64s(&a, &[2, 3]).mm(&bt).unwrap();
    assert_eq!(out.dims(), [2, 4]);
    close(&out.to_vec::<f64>().unwrap(), &naive_bmm(&a, &b, 1, 2, 3, 4));
    // bmm.
    let (x, y) = (seq(24, 0.5, 0.2), seq(24, 0.4, 0.3));
    let out = f64s(&x, &[2, 3, 4]).bmm(&f64s(&y, &[2, 4, 3])).unwrap();
    assert_eq!(out.dims(), [2, 3, 3]);
    let product = naive_bmm(&x, &y, 2, 3, 4, 3);
    close(&out.to_vec::<f64>().unwrap(), &product);
    // addmm: a [4] bias broadcast over rows, beta and alpha.
    let bias = [1.0, -2.0, 3.0, 0.5];
    let out = f64s(&bias, &[4]).addmm(&f64s(&a, &[2, 3]), &bt, 0.5, -2.0).unwrap();
    let mm = naive_bmm(&a, &b, 1, 2, 3, 4);
    let want: Vec<f64> = (0..8).map(|e| 0.5 * bias[e % 4] - 2.0 * mm[e]).collect();
    close(&out.to_vec::<f64>().unwrap(), &want);
    // baddbmm: a [3, 1] input broadcast over the batch and columns.
    let input = [1.0, 2.0, 3.0];
    let out = f64s(&input, &[3, 1]).baddbmm(&f64s(&x, &[2, 3, 4]), &f64s(&y, &[2, 4, 3]), 2.0, 0.25).unwrap();
    assert_eq!(out.dims(), [2, 3, 3]);
    let want: Vec<f64> = (0..18).map(|e| 2.0 * input[(e / 3) % 3] + 0.25 * product[e]).collect();
    close(&out.to_vec::<f64>().unwrap(), &want);
}

#[test]
fn beta_zero_ignores_the_input() {
    let input = f64s(&[f64::NAN, f64::INFINITY], &[2]);
    let m = f64s(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let out = input.addmm(&m, &m, 0.0, 1.0).unwrap();
    assert_eq!(out.to_vec::<f64>().unwrap(), [7.0, 10.0, 15.0, 22.0]);
    let batch = f64s(&[1.0, 2.0, 3.0, 4.0], &[1, 2, 2]);
    let out = input.baddbmm(&batch, &batch, 0.0, 2.0).unwrap();
    assert_eq!(out.to_vec::<f64>().unwrap(), [14.0, 20.0, 30.0, 44.0]);
}

#[test]
fn shape_rules_and_errors() {
    let m = f64s(&[0.0; 6], &[2, 3]);
    let v = f64s(&[0.0; 3], &[3]);
    assert_eq!(
        m.mm(&v).unwrap_err().to_string(),
        "mm: expected two matrices (2-d), got shapes [2, 3] and [3]; use matmul for other ranks"
    );
    assert_eq!(
        m.mm(&m).unwrap_err().to_string(),
        "mm: shapes [2, 3] and [2, 3] cannot be multiplied (3 columns vs 2 rows)"
    );
    let (a, b) = (f64s(&[0.0; 12], &[2, 2, 3]), f64s(&[0.0; 6], &[1, 3, 2]));
    assert_eq!(
        a.bmm(&b).unwrap_err().to_string(),
        "bmm: batch sizes differ: shapes [2, 2, 3] and [1, 3, 2] (2 vs 1); bmm does not broadcast"
    );
    for error in [m.bmm(&m).unwrap_err(), a.bmm(&a).unwrap_err()] {
        assert!(matches!(error, TensorError::Shape { op: "bmm", .. }), "{error:?}");
    }
    let square = f64s(&[0.0; 4], &[2, 2]);
    assert_eq!(
        f64s(&[0.0; 3], &[3]).addmm(&square, &square, 1.0, 1.0).unwrap_err().to_string(),
        "addmm: input of shape [3] cannot be broadcast to the product's shape [2, 2]"
    );
    // The input may not grow the product (PyTorch expands the input only).
    assert!(f64s(&[0.0; 8], &[2, 2, 2]).addmm(&square, &square, 1.0, 1.0).is_err());
    let input32 = Tensor::zeros_on([2, 2], DType::F32, Device::CPU).unwrap();
    let error = input32.addmm(&square, &square, 1.0, 1.0).unwrap_err();
    assert!(
        matches!(error, TensorError::DTypeMismatch { op: "addmm", expected: DType::F64, got: DType::F32 }),
        "{error:?}"
    );
    let error = f64s(&[0.0; 4], &[2, 2]).baddbmm(&square, &square, 1.0, 1.0).unwrap_err();
    assert!(matches!(error, TensorError::Shape { op: "baddbmm", .. }), "{error:?}");
    let ints = Tensor::zeros_on([2, 2], DType::I64, Device::CPU).unwrap();
    // (The refusal names `matmul`, which `mm` calls, rather than `mm`.)
    let error = ints.mm(&ints).unwrap_err();
    assert!(matches!(error, TensorError::UnsupportedDType { dtype: DType::I64, .. }), "{error:?}");
}
