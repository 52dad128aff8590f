//! Raw CUDA handles for libraries that queue their own work on brasa's
//! memory and streams (NCCL in `brasa-parallel`, a custom kernel): the
//! device address of a tensor's first element (PyTorch's
//! `tensor.data_ptr()`), a stream's driver handle (`stream.cuda_stream`),
//! and the device's context made current on the calling thread.
//!
//! What is done through these handles is outside brasa's checks: the
//! caller keeps the tensor alive while the device uses its memory, and
//! orders its work against brasa's with [`crate::Event`]s.
//!
//! ```no_run
//! use brasa_tensor::{cuda_interop, DType, Device, Stream, Tensor};
//! let device = Device::cuda(0);
//! let x = Tensor::zeros_on([1024], DType::F32, device)?;
//! let address = cuda_interop::data_ptr(&x)?;            // CUdeviceptr
//! let stream = cuda_interop::cuda_stream(&Stream::current(device))?; // CUstream
//! cuda_interop::bind_context(device)?;                  // before a library call
//! # let _ = (address, stream);
//! # Ok::<(), brasa_tensor::TensorError>(())
//! ```

use crate::backend::cuda::device;
use crate::backend::Buffer;
use crate::device::Device;
use crate::error::{Result, TensorError};
use crate::stream::Stream;
use crate::tensor::Tensor;

/// The device address of `tensor`'s first element (its view's offset
/// applied). An error for a tensor that is not on a CUDA device.
pub fn data_ptr(tensor: &Tensor) -> Result<u64> {
    match tensor.storage().buffer() {
        Buffer::Cuda(block) => {
            let offset = tensor.layout().offset() * tensor.dtype().size_in_bytes();
            Ok(block.addr() as u64 + offset as u64)
        }
        Buffer::Host(_) | Buffer::Meta(_) => Err(TensorError::Invalid {
            op: "cuda_interop::data_ptr",
            message: format!("the tensor is on {}, not on a CUDA device", tensor.device()),
        }),
    }
}

/// The driver handle (`CUstream`) of `stream`: null for a device's
/// default stream (the legacy default stream), else a stream brasa created.
pub fn cuda_stream(stream: &Stream) -> Result<cudarc::driver::sys::CUstream> {
    match stream.device() {
        Device::Cuda(index) => Ok(device::stream(index, stream.id())?.cu_stream()),
        other => Err(TensorError::Invalid {
            op: "cuda_interop::cuda_stream",
            message: format!("the stream belongs to {other}, not to a CUDA device"),
        }),
    }
}

/// Makes `device`'s context (its primary context, the one the CUDA runtime
/// API uses too) current on the calling thread.
pub fn bind_context(device: Device) -> Result<()> {
    match device {
        Device::Cuda(index) => device::bind(index),
        other => Err(TensorError::Invalid {
            op: "cuda_interop::bind_context",
            message: format!("{other} is not a CUDA device"),
        }),
    }
}
