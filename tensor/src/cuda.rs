//! CUDA devices (feature `cuda`): one caching allocator per device, created on
//! first use, and copies between host and device memory. Ops run through the
//! CUDA backend (`crate::backend::cuda`); op families not behind the seam yet
//! return an error that says so.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::storage::{Buffer, UninitTensor};
use crate::tensor::Tensor;
use brasa_alloc::StreamId;
use brasa_alloc::{AllocError, AllocatorConfig, BackendError, CachingAllocator, CudaBackend};
use cudarc::driver::{result, sys, CudaStream};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

static ALLOCATORS: Mutex<BTreeMap<usize, &'static CachingAllocator<CudaBackend>>> = Mutex::new(BTreeMap::new());

/// The caching allocator of CUDA device `index`, or why there is none.
pub(crate) fn allocator(index: usize) -> Result<&'static CachingAllocator<CudaBackend>> {
    let mut allocators = ALLOCATORS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(allocator) = allocators.get(&index) {
        return Ok(allocator);
    }
    let backend = CudaBackend::new(index)
        .map_err(|source| brasa_alloc::AllocError::Backend { device: format!("cuda:{index}"), source })?;
    let config = AllocatorConfig::from_env().map_err(brasa_alloc::AllocError::from)?;
    // Allocators live as long as the process, as CUDA contexts do.
    let allocator: &'static CachingAllocator<CudaBackend> =
        Box::leak(Box::new(CachingAllocator::with_config(backend, config)));
    allocator.set_observer(Some(crate::profiling::allocator_observer(Device::Cuda(index))));
    allocators.insert(index, allocator);
    drop(allocators);
    // Outside the lock: the monitor reaches the allocator through it.
    crate::profiling::register_cuda_monitor(index);
    Ok(allocator)
}

/// The CUDA streams made by [`new_stream`], by device and id (the default
/// stream is the context's own and is not listed).
static STREAMS: Mutex<BTreeMap<(usize, u64), Arc<CudaStream>>> = Mutex::new(BTreeMap::new());

/// A new stream on CUDA device `index`, registered under `id` with the
/// device's allocator (so memory used on it is reused only after its work).
pub(crate) fn new_stream(index: usize, id: StreamId) -> Result<()> {
    let allocator = allocator(index)?;
    let stream = allocator
        .backend()
        .context()
        .new_stream()
        .map_err(|e| driver_error(Device::Cuda(index), "creating a stream", e))?;
    allocator.backend().register_stream(id, stream.clone());
    STREAMS.lock().unwrap_or_else(|e| e.into_inner()).insert((index, id.0), stream);
    Ok(())
}

/// The stream `id` of CUDA device `index` (the context's default stream for
/// [`StreamId::DEFAULT`]).
pub(crate) fn stream(index: usize, id: StreamId) -> Result<Arc<CudaStream>> {
    if id == StreamId::DEFAULT {
        return Ok(allocator(index)?.backend().context().default_stream());
    }
    STREAMS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&(index, id.0))
        .cloned()
        .ok_or_else(|| TensorError::Device(format!("cuda:{index}: no stream with id {}", id.0)))
}

/// The stream made by [`new_stream`] with id `id`, on whichever device
/// (ids of made streams are unique across devices).
pub(crate) fn stream_by_id(id: StreamId) -> Option<Arc<CudaStream>> {
    let streams = STREAMS.lock().unwrap_or_else(|e| e.into_inner());
    streams.iter().find(|((_, stream_id), _)| *stream_id == id.0).map(|(_, stream)| stream.clone())
}

/// The CUDA devices used so far (those with an allocator).
pub(crate) fn devices_in_use() -> Vec<usize> {
    ALLOCATORS.lock().unwrap_or_else(|e| e.into_inner()).keys().copied().collect()
}

/// Waits for all work queued on CUDA device `index`.
pub(crate) fn synchronize(index: usize) -> Result<()> {
    allocator(index)?
        .backend()
        .context()
        .synchronize()
        .map_err(|e| driver_error(Device::Cuda(index), "synchronizing the device", e))
}

/// The error for an operation that has no CUDA implementation yet (the op
/// families not behind the device seam, `crate::backend`).
pub(crate) fn unsupported(op: &'static str) -> TensorError {
    TensorError::Invalid { op, message: "not implemented for CUDA tensors yet; move the tensor to the host".into() }
}

/// A contiguous copy of `tensor` on `device` with `dtype`, through host memory.
pub(crate) fn copy_between(tensor: &Tensor, device: Device, dtype: DType) -> Result<Tensor> {
    // Bring the data to the host, contiguous and converted (a CUDA tensor
    // is converted and made contiguous on its device first).
    let host = match tensor.device() {
        Device::Cpu(_) => tensor.copy_to(tensor.device(), dtype)?,
        Device::Cuda(index) => {
            let whole = tensor.is_contiguous() && tensor.layout().offset() == 0;
            let dense = if whole && tensor.dtype() == dtype {
                tensor.clone()
            } else {
                crate::backend::for_device(tensor.device())?.cast(tensor, dtype)?
            };
            let mut out = UninitTensor::new(dense.shape().clone(), dtype, Device::CPU)?;
            {
                let _guard = dense.storage().device_read_lock();
                let Buffer::Cuda(block) = dense.storage().buffer() else {
                    return Err(TensorError::invalid("copy", "internal error: a CUDA tensor without device memory"));
                };
                let dst = out.as_uninit_bytes_mut("copy")?;
                if !dst.is_empty() {
                    bind(index)?;
                    // SAFETY: the device block holds at least `dst.len()`
                    // bytes (a dense tensor of the same shape and dtype); the
                    // copy waits for the work queued before it.
                    unsafe { result::memcpy_dtoh_sync(dst, block.addr() as sys::CUdeviceptr) }
                        .map_err(|e| driver_error(tensor.device(), "copy to host", e))?;
                }
            }
            // SAFETY: the copy wrote every byte (of a tensor of the same shape and dtype).
            unsafe { out.assume_init() }
        }
        Device::Meta(_) => return Err(crate::backend::meta::no_values("copy", tensor.device())),
    };
    match device {
        Device::Cpu(_) => host.to(device),
        Device::Cuda(index) => {
            let out = UninitTensor::new(host.shape().clone(), dtype, device)?;
            {
                let src = host.storage().read_bytes("copy")?;
                if !src.is_empty() {
                    let Buffer::Cuda(block) = out.buffer() else {
                        return Err(TensorError::invalid(
                            "copy",
                            "internal error: a CUDA tensor without device memory",
                        ));
                    };
                    bind(index)?;
                    // SAFETY: the new device block holds `src.len()` bytes; the copy is synchronous.
                    unsafe { result::memcpy_htod_sync(block.addr() as sys::CUdeviceptr, &src) }
                        .map_err(|e| driver_error(device, "copy from host", e))?;
                }
            }
            // SAFETY: the copy wrote every byte (from a contiguous host tensor
            // of the same shape and dtype).
            Ok(unsafe { out.assume_init() })
        }
        Device::Meta(_) => Tensor::uninit_like(&host, dtype, device)?.planned("copy"),
    }
}

fn bind(index: usize) -> Result<()> {
    allocator(index)?
        .backend()
        .context()
        .bind_to_thread()
        .map_err(|e| driver_error(Device::Cuda(index), "binding the CUDA context", e))
}

/// A CUDA driver failure on `device`, kept whole as the error's source
/// (an [`AllocError::Backend`] with a [`BackendError::Cuda`]).
pub(crate) fn driver_error(device: Device, what: &str, source: cudarc::driver::DriverError) -> TensorError {
    TensorError::Alloc(AllocError::Backend {
        device: device.to_string(),
        source: BackendError::Cuda { what: what.to_string(), source },
    })
}
