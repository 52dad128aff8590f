//! Autograd errors keep the error below them: an out of memory in backward
//! is reached by walking `std::error::Error::source`, and an error of
//! another crate carried by `AutogradError::External` is itself the source,
//! for `downcast_ref` (not hidden behind the `Arc` that shares it).

use brasa_alloc::OutOfMemory;
use brasa_autograd::{AutogradError, Var};
use brasa_tensor::{set_host_device_count, set_host_memory_limit, DType, Device, Tensor, TensorError};
use std::error::Error;

const MIB: usize = 1 << 20;

/// Every error in `error`'s source chain, `error` first.
fn chain<'a>(error: &'a (dyn Error + 'static)) -> Vec<&'a (dyn Error + 'static)> {
    std::iter::successors(Some(error), |&e| e.source()).collect()
}

fn oom_in_chain<'a>(error: &'a (dyn Error + 'static)) -> Option<&'a OutOfMemory> {
    chain(error).into_iter().find_map(|e| e.downcast_ref::<OutOfMemory>())
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

impl Error for HookFailed {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.0)
    }
}

#[test]
fn an_out_of_memory_in_backward_is_reached_through_source() {
    set_host_device_count(4).unwrap();
    set_host_memory_limit(2, Some(27 * MIB)).unwrap();
    let x = Var::param(Tensor::ones_on([3 * MIB], DType::F32, Device::cpu(2)).unwrap()).unwrap(); // 12 MiB
    let loss = x.mul(&x).unwrap().sum(&[0], false).unwrap();
    let error = loss.backward().unwrap_err();
    let oom = oom_in_chain(&error).unwrap_or_else(|| panic!("no OutOfMemory in the chain of {error}"));
    assert_eq!((oom.device.as_str(), oom.requested_bytes), ("cpu:2", 12 * MIB));
}

#[test]
fn an_external_error_is_the_source_itself() {
    let error = AutogradError::external(std::io::Error::other("disk full"));
    let io = error.source().and_then(|e| e.downcast_ref::<std::io::Error>());
    assert_eq!(io.map(|e| e.to_string()).as_deref(), Some("disk full"));
    assert_eq!(error.to_string(), "disk full");

    set_host_device_count(4).unwrap();
    set_host_memory_limit(3, Some(2 * MIB)).unwrap();
    let tensor_error = Tensor::ones_on([MIB], DType::F32, Device::cpu(3)).unwrap_err();
    let error = AutogradError::external(HookFailed(tensor_error));
    let links = chain(&error);
    assert!(links[1].downcast_ref::<HookFailed>().is_some(), "{:?}", links[1]);
    let oom = oom_in_chain(&error).unwrap_or_else(|| panic!("no OutOfMemory in the chain of {error}"));
    assert_eq!((oom.device.as_str(), oom.requested_bytes), ("cpu:3", 4 * MIB));
}
