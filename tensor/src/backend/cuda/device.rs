//! CUDA devices' state (feature `cuda`): one caching allocator per device,
//! created on first use (it owns the device's context), and the driver
//! streams made on each device.

use crate::device::Device;
use crate::error::{Result, TensorError};
use brasa_alloc::StreamId;
use brasa_alloc::{AllocError, AllocatorConfig, BackendError, CachingAllocator, CudaBackend};
use cudarc::driver::CudaStream;
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

/// Makes CUDA device `index`'s context current on this thread.
pub(crate) fn bind(index: usize) -> Result<()> {
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
