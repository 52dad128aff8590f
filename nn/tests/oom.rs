//! An out of memory inside a layer's forward or an optimizer's step is found
//! by `NnError::as_out_of_memory` with its device and requested bytes.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::Var;
use brasa_nn::optim::{Optimizer, Sgd, SgdConfig};
use brasa_nn::{Linear, Module, ModuleExt, NnError};
use brasa_tensor::{set_host_device_count, set_host_memory_limit, DType, Device, Tensor};

const MIB: usize = 1 << 20;

fn limited(index: usize, limit: usize) -> Device {
    set_host_device_count(3).unwrap();
    set_host_memory_limit(index, Some(limit)).unwrap();
    Device::cpu(index)
}

#[test]
fn a_layer_forward_past_the_limit_reports_device_and_bytes() {
    let dev = limited(1, 20 * MIB);
    let layer = Linear::new(64, 64, dev).unwrap();
    // 16 MiB of input fits; the 16 MiB output does not.
    let input = Var::new(Tensor::zeros_on([MIB / 16, 64], DType::F32, dev).unwrap());
    let error: NnError = layer.forward(&input).unwrap_err();
    let oom = error.as_out_of_memory().unwrap_or_else(|| panic!("not an out of memory: {error}"));
    assert_eq!((oom.device.as_str(), oom.requested_bytes), ("cpu:1", 16 * MIB));
    assert_eq!(brasa_alloc::find_out_of_memory(&error), Some(oom));
}

#[test]
fn an_optimizer_step_past_the_limit_reports_device_and_bytes() {
    let dev = limited(2, 40 * MIB);
    let layer = Linear::new(2048, 2048, dev).unwrap(); // a 16 MiB weight
    let input = Var::new(Tensor::ones_on([1, 2048], DType::F32, dev).unwrap());
    let loss = layer.forward(&input).unwrap().sum(&[0, 1], false).unwrap();
    loss.backward().unwrap(); // a 16 MiB gradient: 32 MiB and small blocks
    let mut sgd = Sgd::new(layer.parameters(), SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() }).unwrap();
    // The momentum buffer (16 MiB) does not fit.
    let error = sgd.step().unwrap_err();
    let oom = error.as_out_of_memory().unwrap_or_else(|| panic!("not an out of memory: {error}"));
    assert_eq!((oom.device.as_str(), oom.requested_bytes), ("cpu:2", 16 * MIB));
}

#[test]
fn other_nn_errors_are_not_out_of_memory() {
    assert!(NnError::invalid("Linear", "in_features must be > 0").as_out_of_memory().is_none());
    assert!(NnError::Data("worker 0 panicked".into()).as_out_of_memory().is_none());
}
