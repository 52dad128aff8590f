//! The CUDA runtime: memory from each device's caching allocator, from the
//! pool of the thread's current stream; values in device memory, copied
//! through the host (`copy.rs`), or queued from pinned memory
//! (`pinned.rs`); driver streams and events.

use super::device::{allocator, driver_error, new_stream, stream, synchronize};
use super::{copy, pinned};
use crate::backend::current_stream::current_stream_id;
use crate::backend::target::{MemoryTarget, TargetKind, CUDA_GRANULARITY};
use crate::backend::{ops_for, runtime_for, AllocatorRef, Buffer, DeviceEvent, DeviceRuntime};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::shape::Shape;
use crate::storage::UninitTensor;
use crate::tensor::Tensor;
use brasa_alloc::{Backend as _, MemoryCategory, StreamId};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::CudaEvent;
use std::any::Any;
use std::sync::Arc;

/// The runtime of CUDA devices.
pub(crate) struct CudaRuntime;

/// A CUDA event recorded on a stream of `device`.
#[derive(Debug)]
struct RecordedEvent {
    device: Device,
    event: CudaEvent,
}

impl DeviceEvent for RecordedEvent {
    fn is_complete(&self) -> bool {
        self.event.is_complete()
    }

    fn synchronize(&self) -> Result<()> {
        self.event.synchronize().map_err(|e| driver_error(self.device, "waiting for an event", e))
    }

    fn elapsed_ms(&self, end: &dyn DeviceEvent) -> Result<f64> {
        let end = recorded(end)?;
        self.event.elapsed_ms(&end.event).map(f64::from).map_err(|e| driver_error(self.device, "timing two events", e))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `event` as one this runtime recorded.
fn recorded(event: &dyn DeviceEvent) -> Result<&RecordedEvent> {
    event
        .as_any()
        .downcast_ref::<RecordedEvent>()
        .ok_or_else(|| TensorError::internal("Event", "an event of another device on a CUDA stream"))
}

impl DeviceRuntime for CudaRuntime {
    #[inline]
    fn allocate(&self, device: Device, _dtype: DType, bytes: usize, category: MemoryCategory) -> Result<Buffer> {
        // From the pool of the thread's current stream, as PyTorch's allocator:
        // the block is reused on that stream in order, on another only after
        // `record_stream`'s events.
        let stream = current_stream_id(device);
        Ok(Buffer::Cuda(allocator(device.index())?.allocate_as(bytes, stream, category)?))
    }

    fn allocator(&self, device: Device) -> Result<AllocatorRef> {
        Ok(AllocatorRef::Process(allocator(device.index())?))
    }

    fn memory_target(&self, device: Device) -> Result<MemoryTarget> {
        let allocator = allocator(device.index())?;
        Ok(MemoryTarget::of(
            device.to_string(),
            TargetKind::Cuda,
            allocator.backend().total_bytes(),
            allocator.backend().virtual_memory_granularity().or(Some(CUDA_GRANULARITY)),
            allocator.config(),
        ))
    }

    fn values_on_host(&self) -> bool {
        false
    }

    fn copy_to_host(&self, _op: &'static str, src: &Tensor, dtype: DType) -> Result<Tensor> {
        copy::to_host(src, dtype)
    }

    fn copy_in(&self, src: &Tensor, device: Device, dtype: DType) -> Result<Tensor> {
        // Through host memory, contiguous and converted.
        let source = runtime_for(src.device())?;
        let host = if source.values_on_host() {
            ops_for(src.device())?.cast(src, dtype)?
        } else {
            source.copy_to_host("to", src, dtype)?
        };
        copy::from_host(&host, device)
    }

    fn copy_in_non_blocking(&self, src: &Tensor, device: Device) -> Result<Option<Tensor>> {
        pinned::copy_to_device_async(src, device.index())
    }

    fn tensor_from_host(
        &self,
        _op: &'static str,
        shape: Shape,
        dtype: DType,
        device: Device,
        write: &mut dyn FnMut(UninitTensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let host = write(UninitTensor::new(shape, dtype, Device::CPU)?)?;
        copy::from_host(&host, device)
    }

    fn new_stream(&self, device: Device, id: StreamId) -> Result<()> {
        new_stream(device.index(), id)
    }

    fn synchronize(&self, device: Device) -> Result<()> {
        synchronize(device.index())
    }

    fn synchronize_stream(&self, device: Device, id: StreamId) -> Result<()> {
        stream(device.index(), id)?.synchronize().map_err(|e| driver_error(device, "synchronizing a stream", e))
    }

    fn record_event(&self, device: Device, id: StreamId, enable_timing: bool) -> Result<Option<Arc<dyn DeviceEvent>>> {
        let flags =
            if enable_timing { CUevent_flags::CU_EVENT_DEFAULT } else { CUevent_flags::CU_EVENT_DISABLE_TIMING };
        let event = stream(device.index(), id)?
            .record_event(Some(flags))
            .map_err(|e| driver_error(device, "recording an event", e))?;
        Ok(Some(Arc::new(RecordedEvent { device, event })))
    }

    fn wait_event(&self, device: Device, id: StreamId, event: &dyn DeviceEvent) -> Result<()> {
        let event = recorded(event)?;
        stream(device.index(), id)?.wait(&event.event).map_err(|e| driver_error(device, "waiting for an event", e))
    }
}
