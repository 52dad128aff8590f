//! Values and checks shared by brasa-nn's layer tests (each test binary
//! includes this file with `#[path]` and uses a part of it).
#![allow(dead_code)]

use brasa_autograd::Var;
use brasa_nn::NnError;
use brasa_tensor::{DType, Device, Tensor};

/// The device the layer tests run on.
pub const DEV: Device = Device::CPU;

/// Deterministic, irregular values in about `[-2, 2]`.
pub fn values(n: usize, salt: f64) -> Vec<f64> {
    (0..n)
        .map(|i| 2.0 * ((i as f64 * 0.731 + salt) * 1.37).sin() + 0.3 * ((i * i) as f64 * 0.17 + salt).cos())
        .collect()
}

pub fn tensor_f64(shape: &[usize], salt: f64) -> Tensor {
    Tensor::from_vec(values(shape.iter().product(), salt), shape).unwrap()
}

pub fn to_f64(v: &Var) -> Vec<f64> {
    v.tensor().to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

pub fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "element {i}: got {g}, want {w}");
    }
}

pub fn invalid_message(err: NnError) -> (&'static str, String) {
    match err {
        NnError::Invalid { what, message } => (what, message),
        other => panic!("expected NnError::Invalid, got {other:?}"),
    }
}
