//! The pooling layers' PyTorch parity additions: `ceil_mode` on
//! `MaxPool2d` / `AvgPool2d` and the adaptive layers `AdaptiveAvgPool2d` /
//! `AdaptiveMaxPool2d`: values and gradients worked by hand (PyTorch's
//! window and divisor rules), a gradcheck through each layer, and errors
//! that name the layer.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{gradcheck, AutogradError, Var};
use brasa_nn::{AdaptiveAvgPool2d, AdaptiveMaxPool2d, AvgPool2d, MaxPool2d, Module, ModuleExt, Result};
use brasa_tensor::{DType, Pool2dParams, Tensor};

#[path = "support/fixtures.rs"]
mod fixtures;
use fixtures::{assert_close, invalid_message, tensor_f64, to_f64};

fn grad_f64(v: &Var) -> Vec<f64> {
    v.grad().unwrap().to_vec::<f64>().unwrap()
}

#[test]
fn ceil_mode_layers() -> Result<()> {
    // One row of 1..=6, kernel 3, stride 2, padding 1: floor mode has 3
    // windows, ceil mode a 4th over column 5 and one padded zero.
    let x = Var::param(Tensor::from_vec((1..=6).map(|v| v as f64).collect(), [1, 1, 6])?)?;
    let avg = AvgPool2d::new((1, 3))?.stride((1, 2))?.padding((0, 1))?;
    assert_eq!(avg.forward(&x)?.dims(), &[1, 1, 3]);
    let avg = avg.ceil_mode(true);
    assert_eq!(avg.params(), Pool2dParams { kernel: (1, 3), stride: (1, 2), padding: (0, 1), ceil_mode: true });
    let y = avg.forward(&x)?;
    assert_close(&to_f64(&y), &[1.0, 3.0, 5.0, 3.0], 1e-12);
    y.sum_all()?.backward()?;
    assert_close(&grad_f64(&x), &[1.0 / 3.0, 2.0 / 3.0, 1.0 / 3.0, 2.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0 + 0.5], 1e-12);
    assert_close(&to_f64(&avg.count_include_pad(false).forward(&x)?), &[1.5, 3.0, 5.0, 6.0], 1e-12);

    let max = MaxPool2d::new((1, 3))?.stride((1, 2))?.padding((0, 1))?.ceil_mode(true);
    assert!(max.params().ceil_mode);
    let x = Var::param(Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], [1, 1, 6])?)?;
    let y = max.forward(&x)?;
    assert_eq!(to_f64(&y), [2.0, 4.0, 6.0, 6.0]);
    y.sum_all()?.backward()?;
    assert_eq!(grad_f64(&x), [0.0, 1.0, 0.0, 1.0, 0.0, 2.0]);
    // The builder keeps ceil_mode across the other builders, and it can be
    // switched off again.
    let again = MaxPool2d::new(2)?.ceil_mode(true).stride(2)?.padding(1)?;
    assert!(again.params().ceil_mode);
    assert!(!again.ceil_mode(false).params().ceil_mode);
    Ok(())
}

#[test]
fn adaptive_layers() -> Result<()> {
    // [1, 3, 5]: rows → 2 (windows [0, 2) [1, 3)), columns → 3 ([0, 2) [1, 4) [3, 5)).
    let v: Vec<f64> = vec![1.0, 9.0, 2.0, 8.0, 3.0, 4.0, 0.0, 7.0, 5.0, 6.0, -1.0, 10.0, -2.0, 11.0, -3.0];
    let x = Var::param(Tensor::from_vec(v.clone(), [1, 3, 5])?)?;
    let pool = AdaptiveAvgPool2d::new((2, 3))?;
    assert_eq!(pool.output_size(), (2, 3));
    assert_eq!(pool.parameters().len(), 0);
    let y = pool.forward(&x)?;
    assert_eq!(y.dims(), &[1, 2, 3]);
    let mean = |cells: &[usize]| cells.iter().map(|&i| v[i]).sum::<f64>() / cells.len() as f64;
    let want = [
        mean(&[0, 1, 5, 6]),
        mean(&[1, 2, 3, 6, 7, 8]),
        mean(&[3, 4, 8, 9]),
        mean(&[5, 6, 10, 11]),
        mean(&[6, 7, 8, 11, 12, 13]),
        mean(&[8, 9, 13, 14]),
    ];
    assert_close(&to_f64(&y), &want, 1e-12);

    let pool = AdaptiveMaxPool2d::new((2, 3))?;
    let (y, indices) = pool.forward_with_indices(&x)?;
    assert_eq!(indices.to_vec::<i64>()?, [1, 1, 3, 11, 13, 13]);
    assert_eq!(to_f64(&y), [9.0, 9.0, 8.0, 10.0, 11.0, 11.0]);
    assert_eq!(to_f64(&pool.forward(&x)?), to_f64(&y));
    y.sum_all()?.backward()?;
    let mut want = vec![0.0; 15];
    for i in [1, 1, 3, 11, 13, 13] {
        want[i] += 1.0;
    }
    assert_eq!(grad_f64(&x), want);

    // Through gradcheck, batched and with an output larger than the input.
    let x = tensor_f64(&[2, 2, 3, 5], 0.3);
    for layer in [&AdaptiveAvgPool2d::new((5, 2))? as &dyn Module, &AdaptiveMaxPool2d::new((2, 4))?] {
        let forward = |v: &[Var]| {
            layer.forward(&v[0]).map_err(|e| AutogradError::Invalid { op: "layer", message: e.to_string() })
        };
        gradcheck(forward, std::slice::from_ref(&x), 1e-6, 1e-6, 1e-5)?;
    }
    assert_eq!(AdaptiveAvgPool2d::new(1)?.forward(&Var::new(x))?.dims(), &[2, 2, 1, 1]);
    Ok(())
}

#[test]
fn adaptive_layer_errors_name_the_layer() {
    let (what, message) = invalid_message(AdaptiveAvgPool2d::new((0, 2)).unwrap_err());
    assert_eq!((what, message.as_str()), ("AdaptiveAvgPool2d", "output_size must be positive, got (0, 2)"));
    assert_eq!(invalid_message(AdaptiveMaxPool2d::new(0).unwrap_err()).0, "AdaptiveMaxPool2d");
    let flat = Var::new(Tensor::zeros([4, 4], DType::F32).unwrap());
    let (what, message) = invalid_message(AdaptiveMaxPool2d::new(2).unwrap().forward(&flat).unwrap_err());
    assert_eq!(what, "AdaptiveMaxPool2d");
    assert!(message.contains("[4, 4]"), "{message}");
    let (what, _) = invalid_message(AdaptiveAvgPool2d::new(2).unwrap().forward(&flat).unwrap_err());
    assert_eq!(what, "AdaptiveAvgPool2d");
}
