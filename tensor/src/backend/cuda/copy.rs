//! Copies between host and CUDA device memory, synchronous (the
//! asynchronous copy from pinned memory is `pinned.rs`'s).

use super::device::{bind, driver_error};
use crate::backend::{ops_for, Buffer};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::storage::UninitTensor;
use crate::tensor::Tensor;
use cudarc::driver::{result, sys};

/// A contiguous host copy (on `Device::CPU`) of the CUDA tensor `tensor`,
/// converted to `dtype`: converted and made contiguous on its device first,
/// then copied out (waiting for the work queued before it).
pub(super) fn to_host(tensor: &Tensor, dtype: DType) -> Result<Tensor> {
    let index = tensor.device().index();
    let whole = tensor.is_contiguous() && tensor.layout().offset() == 0;
    let dense = if whole && tensor.dtype() == dtype {
        tensor.clone()
    } else {
        ops_for(tensor.device())?.cast(tensor, dtype)?
    };
    let mut out = UninitTensor::new(dense.shape().clone(), dtype, Device::CPU)?;
    {
        let _guard = dense.storage().device_read_lock();
        let Buffer::Cuda(block) = dense.storage().buffer() else {
            return Err(TensorError::internal("copy", "a CUDA tensor without device memory"));
        };
        let dst = out.as_uninit_bytes_mut("copy")?;
        if !dst.is_empty() {
            bind(index)?;
            // SAFETY: the device block holds at least `dst.len()` bytes (a
            // dense tensor of the same shape and dtype); the copy waits for
            // the work queued before it.
            unsafe { result::memcpy_dtoh_sync(dst, block.addr() as sys::CUdeviceptr) }
                .map_err(|e| driver_error(tensor.device(), "copy to host", e))?;
        }
    }
    // SAFETY: the copy wrote every byte (of a tensor of the same shape and dtype).
    Ok(unsafe { out.assume_init() })
}

/// A copy of the contiguous host tensor `host` (whole storage, `dtype`
/// already) on CUDA device `device`.
pub(super) fn from_host(host: &Tensor, device: Device) -> Result<Tensor> {
    let out = UninitTensor::new(host.shape().clone(), host.dtype(), device)?;
    {
        let src = host.storage().read_bytes("copy")?;
        if !src.is_empty() {
            let Buffer::Cuda(block) = out.buffer() else {
                return Err(TensorError::internal("copy", "a CUDA tensor without device memory"));
            };
            bind(device.index())?;
            // SAFETY: the new device block holds `src.len()` bytes; the copy is synchronous.
            unsafe { result::memcpy_htod_sync(block.addr() as sys::CUdeviceptr, &src) }
                .map_err(|e| driver_error(device, "copy from host", e))?;
        }
    }
    // SAFETY: the copy wrote every byte (from a contiguous host tensor of the
    // same shape and dtype).
    Ok(unsafe { out.assume_init() })
}
