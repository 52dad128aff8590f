//! Pinned host memory for CUDA devices (feature `cuda`), and the
//! non-blocking host → device copy that needs it.
//!
//! When a CUDA driver and device are present, `Tensor::pin_memory` takes its
//! memory from a caching allocator whose pages are registered with the driver
//! (`cuMemHostRegister`, portable to every device's context; what PyTorch
//! does with `pinned_use_cuda_host_register`). A copy from such memory,
//! `Tensor::to_non_blocking(Device::Cuda(_))`, is queued on the device's
//! current stream with `cuMemcpyHtoDAsync` and returns at once. The source
//! block is then marked as used by that stream, so when its last tensor is
//! dropped the allocator records an event on the stream and reuses the block
//! only once the event has completed (PyTorch's `CachingHostAllocator`):
//! dropping the source right after the call is safe. Writing to the source
//! before the stream has run the copy is a data race, as in PyTorch.

use super::device::{allocator, devices_in_use, driver_error, stream, stream_by_id, synchronize};
use super::CudaOps;
use crate::backend::current_stream::current_stream_id;
use crate::backend::Buffer;
use crate::device::Device;
use crate::error::{Result, TensorError};
use crate::storage::UninitTensor;
use crate::tensor::Tensor;
use brasa_alloc::{BackendError, HostPinning, StreamEvent, StreamId};
use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Set once a [`CudaPinning`] exists: the host's pinned pool (created once,
/// by the first pinning) asks for one, and gets it only when a CUDA device is
/// present, so from then on `pin_memory`'s memory is registered with CUDA.
static PINNING_MADE: AtomicBool = AtomicBool::new(false);

/// The pinned allocator's id for stream `id` of CUDA device `index`. Streams
/// made by [`crate::Stream::new`] have process-wide unique ids (never near
/// the top of the range); each device's default stream, id 0 everywhere,
/// gets one counted down from `u64::MAX`.
pub(crate) fn stream_key(index: usize, id: StreamId) -> StreamId {
    if id == StreamId::DEFAULT {
        StreamId(u64::MAX - index as u64)
    } else {
        id
    }
}

/// The device stream behind a [`stream_key`], if it is one.
fn stream_of_key(key: StreamId) -> Option<Arc<CudaStream>> {
    // Keys of default streams: the top 2^16 ids (far above any count of streams made).
    let from_top = u64::MAX - key.0;
    if from_top < 1 << 16 {
        return stream(from_top as usize, StreamId::DEFAULT).ok();
    }
    stream_by_id(key)
}

/// CUDA's pinning of host memory, for `brasa_alloc::HostBackend::pinned_by`.
pub(crate) struct CudaPinning {
    /// The context current while registering (device 0's primary context;
    /// the registration is portable to every context).
    context: Arc<CudaContext>,
}

impl CudaPinning {
    /// The pinning of the machine's CUDA driver, or why there is none.
    pub(crate) fn new() -> Result<Self> {
        if crate::device::cuda_device_count() == 0 {
            return Err(TensorError::Device("no CUDA device: host memory cannot be pinned for one".into()));
        }
        let pinning = CudaPinning { context: allocator(0)?.backend().context().clone() };
        PINNING_MADE.store(true, Ordering::Release);
        Ok(pinning)
    }

    fn bind(&self) -> std::result::Result<(), BackendError> {
        self.context
            .bind_to_thread()
            .map_err(|source| BackendError::Cuda { what: "binding the CUDA context".into(), source })
    }
}

/// A CUDA event recorded on a stream that copies from pinned memory.
struct CopyEvent(CudaEvent);

impl StreamEvent for CopyEvent {
    fn is_complete(&self) -> bool {
        self.0.is_complete()
    }

    fn synchronize(&self) -> std::result::Result<(), BackendError> {
        self.0.synchronize().map_err(|source| BackendError::Cuda { what: "cuEventSynchronize".into(), source })
    }
}

impl HostPinning for CudaPinning {
    fn name(&self) -> String {
        "CUDA (cuMemHostRegister)".into()
    }

    fn register(&self, addr: usize, bytes: usize) -> std::result::Result<(), BackendError> {
        self.bind()?;
        // SAFETY: `addr..addr + bytes` is a fresh, page-aligned mapping of this
        // process that stays mapped until `unregister`; the context is current.
        unsafe { sys::cuMemHostRegister_v2(addr as *mut c_void, bytes, sys::CU_MEMHOSTREGISTER_PORTABLE) }
            .result()
            .map_err(|source| BackendError::Cuda { what: "cuMemHostRegister".into(), source })
    }

    unsafe fn unregister(&self, addr: usize, _bytes: usize) {
        if self.bind().is_ok() {
            // SAFETY: the caller passes a range `register` registered, unused now.
            let _ = unsafe { sys::cuMemHostUnregister(addr as *mut c_void) }.result();
        }
    }

    fn record_event(&self, stream: StreamId) -> std::result::Result<Option<Box<dyn StreamEvent>>, BackendError> {
        // Not a CUDA stream's key: a host stream, whose work is done.
        let Some(stream) = stream_of_key(stream) else {
            return Ok(None);
        };
        let event = stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|source| BackendError::Cuda { what: "cuEventRecord".into(), source })?;
        Ok(Some(Box::new(CopyEvent(event))))
    }

    fn synchronize(&self) -> std::result::Result<(), BackendError> {
        for index in devices_in_use() {
            synchronize(index).map_err(|e| BackendError::Device(e.to_string()))?;
        }
        Ok(())
    }
}

/// Whether `pin_memory`'s memory is registered with CUDA (else it is only
/// `mlock`ed, and copies from it are synchronous). Only the host's pinned
/// pool makes a [`CudaPinning`], once, for the life of the process.
fn pinned_for_cuda() -> bool {
    PINNING_MADE.load(Ordering::Acquire)
}

/// `src` (a contiguous host tensor in CUDA-registered pinned memory) copied to
/// CUDA device `index` on its current stream, queued and not waited for.
/// `Ok(None)` when the pinned memory is not CUDA's.
pub(super) fn copy_to_device_async(src: &Tensor, index: usize) -> Result<Option<Tensor>> {
    const OP: &str = "to_non_blocking";
    if !src.is_pinned() || !src.is_contiguous() || !pinned_for_cuda() {
        return Ok(None);
    }
    let device = Device::Cuda(index);
    let stream_id = current_stream_id(device);
    let stream = stream(index, stream_id)?;
    // From the pool of the current stream: later ops there run after the copy.
    let out = UninitTensor::new(src.shape().clone(), src.dtype(), device)?;
    let size = src.dtype().size_in_bytes();
    let bytes = src.numel() * size;
    if bytes > 0 {
        let Buffer::Host(block) = src.storage().buffer() else {
            return Err(TensorError::internal(OP, "pinned memory that is not host memory"));
        };
        let Buffer::Cuda(dst) = out.buffer() else {
            return Err(TensorError::internal(OP, "a CUDA tensor without device memory"));
        };
        let from = block.addr() + src.layout().offset() * size;
        // Before the copy is queued: from now on the block waits for the stream.
        src.storage().record_stream(stream_key(index, stream_id));
        let span = if brasa_profile::enabled() {
            Some(CudaOps::get(index)?.launch_span("Memcpy HtoD (Pinned -> Device)"))
        } else {
            None
        };
        stream.context().bind_to_thread().map_err(|e| driver_error(device, "binding the CUDA context", e))?;
        // SAFETY: `from..from + bytes` lies in the source's live pinned block
        // (a contiguous view of its storage), which is not reused before the
        // stream passes this copy (`record_stream` above); `dst` is a fresh
        // device block of `bytes` bytes; the stream is live.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst.addr() as sys::CUdeviceptr, from as *const c_void, bytes, stream.cu_stream())
        }
        .result()
        .map_err(|e| driver_error(device, "cuMemcpyHtoDAsync", e))?;
        drop(span);
    }
    // SAFETY: the copy queued above writes every byte before later work on
    // this stream reads the tensor.
    Ok(Some(unsafe { out.assume_init() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_streams_get_keys_of_their_own() {
        assert_eq!(stream_key(0, StreamId(5)), StreamId(5));
        assert_ne!(stream_key(0, StreamId::DEFAULT), stream_key(1, StreamId::DEFAULT));
        assert_ne!(stream_key(0, StreamId::DEFAULT), StreamId::DEFAULT);
        assert_eq!(u64::MAX - stream_key(3, StreamId::DEFAULT).0, 3);
    }
}
