//! What the CUDA-aware test files share.

use brasa_tensor::Device;

/// `cuda:0` when this build and machine have one; else prints the one line
/// that says why the CUDA half of a test is skipped.
pub fn gpu() -> Option<Device> {
    if brasa_tensor::cuda_device_count() == 0 {
        eprintln!(
            "skipped on CUDA: no CUDA device{}",
            if cfg!(feature = "cuda") { "" } else { " (built without the `cuda` feature)" }
        );
        return None;
    }
    Some(Device::cuda(0))
}
