//! An out of memory inside a `Var` op, inside backward, or inside an error of
//! another crate carried by `AutogradError::External` is found by
//! `AutogradError::as_out_of_memory` with its device and requested bytes.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{AutogradError, Var};
use brasa_tensor::{set_host_device_count, set_host_memory_limit, DType, Device, Tensor, TensorError};

const MIB: usize = 1 << 20;

fn limited(index: usize, limit: usize) -> Device {
    set_host_device_count(4).unwrap();
    set_host_memory_limit(index, Some(limit)).unwrap();
    Device::cpu(index)
}

#[test]
fn a_var_op_past_the_limit_reports_device_and_bytes() {
    let dev = limited(1, 20 * MIB);
    let x = Var::param(Tensor::ones_on([3 * MIB], DType::F32, dev).unwrap()).unwrap(); // 12 MiB
    let error = x.mul(&x).unwrap_err();
    assert!(matches!(error, AutogradError::Tensor(_)), "{error:?}");
    let oom = error.as_out_of_memory().unwrap_or_else(|| panic!("not an out of memory: {error}"));
    assert_eq!((oom.device.as_str(), oom.requested_bytes), ("cpu:1", 12 * MIB));
    assert_eq!(brasa_alloc::find_out_of_memory(&error), Some(oom));
}

#[test]
fn backward_past_the_limit_reports_device_and_bytes() {
    let dev = limited(2, 27 * MIB);
    let x = Var::param(Tensor::ones_on([3 * MIB], DType::F32, dev).unwrap()).unwrap(); // 12 MiB
    let loss = x.mul(&x).unwrap().sum(&[0], false).unwrap(); // forward fits: 24 MiB + a small segment
    let error = loss.backward().unwrap_err();
    let oom = error.as_out_of_memory().unwrap_or_else(|| panic!("not an out of memory: {error}"));
    assert_eq!((oom.device.as_str(), oom.requested_bytes), ("cpu:2", 12 * MIB));
}

/// An error of another crate (a hook's, say) that keeps the tensor error as
/// its source.
#[derive(Debug)]
struct HookFailed(TensorError);

impl std::fmt::Display for HookFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "hook failed")
    }
}

impl std::error::Error for HookFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

#[test]
fn an_external_error_whose_source_is_an_out_of_memory_is_found() {
    let dev = limited(3, 2 * MIB);
    let tensor_error = Tensor::ones_on([MIB], DType::F32, dev).unwrap_err();
    let error = AutogradError::external(HookFailed(tensor_error));
    let oom = error.as_out_of_memory().unwrap_or_else(|| panic!("not found in {error}"));
    assert_eq!((oom.device.as_str(), oom.requested_bytes), ("cpu:3", 4 * MIB));
    let unrelated = AutogradError::external(std::io::Error::other("disk full"));
    assert!(unrelated.as_out_of_memory().is_none());
    assert!(AutogradError::invalid("op", "no").as_out_of_memory().is_none());
}
