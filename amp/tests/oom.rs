//! An out of memory inside a `GradScaler` call, or in an nn error that
//! becomes an `AmpError` (and back), is found by `AmpError::as_out_of_memory`.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_amp::{AmpError, GradScaler};
use brasa_autograd::Var;
use brasa_nn::{Linear, Module, NnError};
use brasa_tensor::{set_host_device_count, set_host_memory_limit, DType, Device, Tensor};

const MIB: usize = 1 << 20;

fn limited(index: usize, limit: usize) -> Device {
    set_host_device_count(3).unwrap();
    set_host_memory_limit(index, Some(limit)).unwrap();
    Device::cpu(index)
}

#[test]
fn scaling_a_loss_past_the_limit_reports_device_and_bytes() {
    let dev = limited(1, 20 * MIB);
    // A per-sample loss of 12 MiB: its scaled copy does not fit.
    let loss = Var::param(Tensor::ones_on([3 * MIB], DType::F32, dev).unwrap()).unwrap();
    let error: AmpError = GradScaler::new().scale(&loss).unwrap_err();
    let oom = error.as_out_of_memory().unwrap_or_else(|| panic!("not an out of memory: {error}"));
    assert_eq!((oom.device.as_str(), oom.requested_bytes), ("cpu:1", 12 * MIB));
    assert_eq!(brasa_alloc::find_out_of_memory(&error), Some(oom));
}

#[test]
fn a_layer_out_of_memory_keeps_its_report_through_amp_and_back() {
    let dev = limited(2, 20 * MIB);
    let layer = Linear::new(64, 64, dev).unwrap();
    let input = Var::new(Tensor::zeros_on([MIB / 16, 64], DType::F32, dev).unwrap()); // 16 MiB
    let error = AmpError::from(layer.forward(&input).unwrap_err());
    let oom = error.as_out_of_memory().unwrap_or_else(|| panic!("not an out of memory: {error}"));
    assert_eq!((oom.device.as_str(), oom.requested_bytes), ("cpu:2", 16 * MIB));
    let back = NnError::from(error.clone());
    assert_eq!(back.as_out_of_memory(), Some(oom));
    assert!(AmpError::invalid("autocast", "no").as_out_of_memory().is_none());
}
