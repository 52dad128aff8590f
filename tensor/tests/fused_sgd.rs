//! `fused_sgd_` against the composed in-place ops it replaces (the update
//! of `brasa-nn`'s `Sgd`, written out here with `Tensor` ops), bit for bit
//! in f32, f64 and bf16 over every option; and every malformed list refused
//! with an error before anything is written.
//!
//! Every test sets two logical host devices first (the count is fixed at
//! first use and tests run in parallel, so all agree on it).

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_tensor::{fused_sgd_, set_host_device_count, DType, Device, SgdOptions, SgdParam, Tensor, TensorError};

#[path = "support/sgd_reference.rs"]
mod sgd_reference;
use sgd_reference::{composed, configs};

fn devices() {
    set_host_device_count(2).expect("every test of this file asks for 2 host devices");
}

fn copy_of(t: &Tensor) -> Tensor {
    let copy = Tensor::zeros_on(t.dims(), t.dtype(), t.device()).unwrap();
    copy.copy_(t).unwrap();
    copy
}

fn bits(t: &Tensor) -> Vec<f64> {
    t.to(Device::CPU).unwrap().to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

/// A random tensor of `dims` in `dtype`; two-dim ones arrive transposed (not
/// contiguous), as gradients of a matrix product's operand do.
fn random(dims: &[usize], dtype: DType, transposed: bool) -> Tensor {
    if transposed && dims.len() == 2 {
        let t = Tensor::randn([dims[1], dims[0]], DType::F32).unwrap().to_dtype(dtype).unwrap();
        t.t().unwrap()
    } else {
        Tensor::randn(dims, DType::F32).unwrap().to_dtype(dtype).unwrap()
    }
}

#[test]
fn equals_the_composed_update_for_every_option_and_dtype() {
    devices();
    // One parameter large enough for the host's parallel chunks (not a
    // multiple of them), two tiny ones, and thirty small ones that together
    // go to the threads a parameter at a time; transposed gradients.
    let mut shapes: Vec<&[usize]> = vec![&[400, 330], &[7], &[3, 4]];
    shapes.extend(std::iter::repeat_n(&[70usize, 70][..], 30));
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        for options in configs() {
            let params: Vec<Tensor> = shapes.iter().map(|s| random(s, dtype, false)).collect();
            let copies: Vec<Tensor> = params.iter().map(copy_of).collect();
            let momentum = options.momentum != 0.0;
            // Fused buffers start as NaN: the first step must write them unread.
            let buffers: Vec<Tensor> =
                params.iter().map(|p| p.zeros_like().unwrap().affine(0.0, f64::NAN).unwrap()).collect();
            let mut composed_buffers: Vec<Option<Tensor>> = vec![None; shapes.len()];
            for step in 1..=3 {
                let grads: Vec<Tensor> = shapes.iter().map(|s| random(s, dtype, true)).collect();
                let list: Vec<SgdParam<'_>> = (0..shapes.len())
                    .map(|i| SgdParam::new(&params[i], &grads[i], momentum.then_some(&buffers[i]), step == 1))
                    .collect();
                fused_sgd_(&list, options).unwrap();
                for i in 0..shapes.len() {
                    composed(&copies[i], &grads[i], &mut composed_buffers[i], options);
                }
            }
            for i in 0..shapes.len() {
                let what = format!("{dtype} {options:?} parameter {i}");
                let (fused, reference) = (bits(&params[i]), bits(&copies[i]));
                assert!(fused.iter().zip(&reference).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}");
                match &composed_buffers[i] {
                    Some(buffer) => assert_eq!(bits(&buffers[i]), bits(buffer), "{what}: momentum buffer"),
                    None => assert!(bits(&buffers[i]).iter().all(|v| v.is_nan()), "{what}: buffer untouched"),
                }
            }
        }
    }
}

#[test]
fn parameters_on_several_devices_and_dtypes_in_one_call() {
    devices();
    let options = SgdOptions { lr: 0.1, momentum: 0.9, weight_decay: 0.01, ..SgdOptions::default() };
    let on = |values: &[f32], dtype: DType, device: Device| {
        Tensor::from_slice(values, [values.len()]).unwrap().to_dtype(dtype).unwrap().to(device).unwrap()
    };
    let specs = [(DType::F32, Device::CPU), (DType::F64, Device::Cpu(1)), (DType::BF16, Device::Cpu(1))];
    let params: Vec<Tensor> = specs.iter().map(|&(d, dev)| on(&[1.0, -2.0, 0.5], d, dev)).collect();
    let copies: Vec<Tensor> = params.iter().map(copy_of).collect();
    let grads: Vec<Tensor> = specs.iter().map(|&(d, dev)| on(&[0.25, 1.0, -3.0], d, dev)).collect();
    let buffers: Vec<Tensor> = params.iter().map(|p| p.zeros_like().unwrap()).collect();
    let list: Vec<SgdParam<'_>> =
        (0..3).map(|i| SgdParam::new(&params[i], &grads[i], Some(&buffers[i]), true)).collect();
    fused_sgd_(&list, options).unwrap();
    for i in 0..3 {
        let mut buffer = None;
        composed(&copies[i], &grads[i], &mut buffer, options);
        assert_eq!(bits(&params[i]), bits(&copies[i]), "parameter {i}");
        assert_eq!(params[i].device(), specs[i].1);
    }
}

#[test]
fn the_update_bumps_the_versions_of_what_it_writes() {
    devices();
    // Autograd compares versions to catch a saved tensor changed in place;
    // the fused update must count as a write, as the composed ops do.
    let p = Tensor::ones([4], DType::F32).unwrap();
    let g = Tensor::ones([4], DType::F32).unwrap();
    let buffer = p.zeros_like().unwrap();
    let (vp, vg, vb) = (p.version(), g.version(), buffer.version());
    fused_sgd_(&[SgdParam::new(&p, &g, Some(&buffer), true)], SgdOptions { momentum: 0.5, ..SgdOptions::default() })
        .unwrap();
    assert!(p.version() > vp && buffer.version() > vb);
    assert_eq!(g.version(), vg, "the gradient is only read");
}

#[test]
fn bad_lists_are_refused_before_anything_is_written() {
    devices();
    let momentum = SgdOptions { lr: 0.1, momentum: 0.9, ..SgdOptions::default() };
    let p = Tensor::ones([4], DType::F32).unwrap();
    let (g, buf) = (p.zeros_like().unwrap().add_scalar(1.0).unwrap(), p.zeros_like().unwrap());
    let q = Tensor::ones([4], DType::F32).unwrap();
    // Each refusal is an `Invalid` naming the op; the message names the
    // parameter and what is wrong with it (the variant carries no more).
    let refused = |list: &[SgdParam<'_>], options: SgdOptions| {
        let error = fused_sgd_(list, options).unwrap_err();
        assert!(matches!(error, TensorError::Invalid { op: "fused_sgd_", .. }), "{error:?}");
        error.to_string()
    };
    let untouched = || {
        assert_eq!(p.to_vec::<f32>().unwrap(), [1.0; 4], "the first parameter was not written");
        assert_eq!(buf.to_vec::<f32>().unwrap(), [0.0; 4], "nor its buffer");
    };
    // Each problem in the second parameter; the first one is good.
    let good = SgdParam::new(&p, &g, Some(&buf), false);
    let short = Tensor::zeros([3], DType::F32).unwrap();
    let error = refused(&[good, SgdParam::new(&q, &short, Some(&buf), false)], momentum);
    assert!(error.contains("parameter 1: grad has shape [3], the parameter [4]"), "{error}");
    untouched();
    let half = Tensor::zeros([4], DType::BF16).unwrap();
    let error = refused(&[good, SgdParam::new(&q, &half, Some(&buf), false)], momentum);
    assert!(error.contains("parameter 1: grad has dtype bf16, the parameter f32"), "{error}");
    let elsewhere = Tensor::zeros_on([4], DType::F32, Device::Cpu(1)).unwrap();
    let error = refused(&[good, SgdParam::new(&q, &g, Some(&elsewhere), false)], momentum);
    assert!(error.contains("parameter 1: momentum_buffer has device cpu:1, the parameter cpu"), "{error}");
    let error = refused(&[good, SgdParam::new(&q, &g, Some(&half), false)], momentum);
    assert!(error.contains("parameter 1: momentum_buffer has dtype bf16"), "{error}");
    let error = refused(&[good, SgdParam::new(&q, &g, None, true)], momentum);
    assert!(error.contains("parameter 1: momentum needs momentum_buffer"), "{error}");
    untouched();
    // A parameter that is not contiguous cannot be updated in one pass.
    let wide = Tensor::ones([4, 2], DType::F32).unwrap();
    let strided = wide.narrow(1, 0, 1).unwrap().squeeze(1).unwrap();
    assert!(!strided.is_contiguous());
    let error = refused(&[good, SgdParam::new(&strided, &g, Some(&buf), false)], momentum);
    assert!(error.contains("parameter 1: the parameter and its momentum buffer must be contiguous"), "{error}");
    let column = Tensor::zeros([4, 2], DType::F32).unwrap().narrow(1, 1, 1).unwrap().squeeze(1).unwrap();
    let error = refused(&[SgdParam::new(&q, &g, Some(&column), false)], momentum);
    assert!(error.contains("must be contiguous"), "{error}");
    // Memory shared between what is written, or with the gradient.
    let error = refused(&[good, SgdParam::new(&q, &g, Some(&q), false)], momentum);
    assert!(error.contains("parameter 1: the momentum buffer shares the parameter's storage"), "{error}");
    let error = refused(&[good, SgdParam::new(&q, &q, Some(&buf), false)], momentum);
    assert!(error.contains("parameter 1: the gradient shares the storage"), "{error}");
    // Integer parameters have no gradient step.
    let ints = Tensor::from_slice(&[1i64, 2, 3, 4], [4]).unwrap();
    let error = fused_sgd_(&[SgdParam::new(&ints, &ints, None, false)], SgdOptions::default()).unwrap_err();
    assert!(matches!(error, TensorError::UnsupportedDType { op: "fused_sgd_", dtype: DType::I64, .. }), "{error:?}");
    untouched();
    assert_eq!(q.to_vec::<f32>().unwrap(), [1.0; 4]);
}

#[test]
fn plain_sgd_needs_no_buffer_and_ignores_one() {
    devices();
    let p = Tensor::from_slice(&[1.0f64, 2.0], [2]).unwrap();
    let g = Tensor::from_slice(&[0.5f64, -0.5], [2]).unwrap();
    let options = SgdOptions { lr: 0.5, weight_decay: 0.5, ..SgdOptions::default() };
    fused_sgd_(&[SgdParam::new(&p, &g, None, true)], options).unwrap();
    // (1 − lr·wd)·p − lr·g
    assert_eq!(p.to_vec::<f64>().unwrap(), [0.5, 1.75]);
    let stale = Tensor::full([2], 7.0, DType::F64).unwrap();
    fused_sgd_(&[SgdParam::new(&p, &g, Some(&stale), false)], options).unwrap();
    assert_eq!(p.to_vec::<f64>().unwrap(), [0.125, 1.5625]);
    assert_eq!(stale.to_vec::<f64>().unwrap(), [7.0; 2], "without momentum the buffer is not touched");
    // An empty list and an empty parameter are no-ops.
    fused_sgd_(&[], options).unwrap();
    let empty = Tensor::zeros([0], DType::F32).unwrap();
    fused_sgd_(&[SgdParam::new(&empty, &empty.zeros_like().unwrap(), None, true)], options).unwrap();
}
