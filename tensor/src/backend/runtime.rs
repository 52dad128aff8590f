//! The memory half of the seam: [`DeviceRuntime`], what a device is besides
//! the ops it computes — its caching allocator and memory statistics, where
//! its values live and how they are copied in and out, its streams and
//! events. [`DeviceAllocator`] is the allocator as the runtime hands it out
//! (one interface over `CachingAllocator<B>` for every memory backend `B`),
//! [`DeviceEvent`] a recorded marker on a device's stream.

use super::target::MemoryTarget;
use super::Buffer;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::shape::Shape;
use crate::storage::UninitTensor;
use crate::tensor::Tensor;
use brasa_alloc::{
    AllocError, CachingAllocator, FragmentationReport, MemoryCategory, MemoryStats, Observer, Snapshot, StreamId,
};
use std::any::Any;
use std::ops::Deref;
use std::sync::Arc;

/// What one kind of device is besides the ops it computes: memory, copies,
/// streams and events. Every method names the device it acts on (one
/// runtime serves every device of its kind: `cpu:0`, `cpu:1`, ...).
///
/// The stream and event methods have the defaults of a device whose work is
/// done when the call that queued it returns (the host, and a meta device,
/// which runs nothing).
pub(crate) trait DeviceRuntime: Sync {
    // ----- memory ------------------------------------------------------------

    /// Fresh memory for `bytes` bytes of `dtype` elements on `device`, counted
    /// under `category`, from the pool of the thread's current stream there
    /// (PyTorch's stream-ordered caching: the block is reused on that stream
    /// in order, on another only after `record_stream`'s events). This is the
    /// hot path of every op's output: one lookup and a cached allocation.
    fn allocate(&self, device: Device, dtype: DType, bytes: usize, category: MemoryCategory) -> Result<Buffer>;

    /// The caching allocator of `device` (created at its first use): what
    /// `crate::memory` reports and controls.
    fn allocator(&self, device: Device) -> Result<AllocatorRef>;

    /// What a meta device imitating `device` as it is configured now
    /// imitates (see [`MemoryTarget::like`]).
    fn memory_target(&self, device: Device) -> Result<MemoryTarget>;

    // ----- values ------------------------------------------------------------

    /// Whether the process reads the device's values in place (host memory):
    /// `to_vec`, host bytes and printing read them directly, and copies
    /// between two such devices are one strided copy.
    fn values_on_host(&self) -> bool;

    /// Whether the device holds values at all (a meta device accounts memory
    /// and holds none: reading is an error, index checks are assumed to pass).
    fn holds_values(&self) -> bool {
        true
    }

    // ----- copies ------------------------------------------------------------

    /// A contiguous copy of `src` (on a device of this runtime) in host
    /// memory (`Device::CPU`), converted to `dtype`. An error names `op`
    /// where the values cannot be read (a meta device).
    fn copy_to_host(&self, op: &'static str, src: &Tensor, dtype: DType) -> Result<Tensor>;

    /// A contiguous copy of `src`, on any other device, on `device` (of this
    /// runtime), converted to `dtype`. A source whose values the process
    /// cannot read in place comes through its own runtime's
    /// [`DeviceRuntime::copy_to_host`] first.
    fn copy_in(&self, src: &Tensor, device: Device, dtype: DType) -> Result<Tensor>;

    /// [`DeviceRuntime::copy_in`] that returns before the copy has run, where
    /// the device queues it (a CUDA device, from pinned host memory); `None`
    /// when it would not, and the caller copies synchronously.
    fn copy_in_non_blocking(&self, src: &Tensor, device: Device) -> Result<Option<Tensor>> {
        let _ = (src, device);
        Ok(None)
    }

    /// A new tensor of `shape` and `dtype` on `device` holding the values
    /// that `write` puts into the fresh host tensor it is given (on this
    /// device when its values are the host's). A device without values
    /// only accounts the storage, for `op`, and never calls `write`.
    fn tensor_from_host(
        &self,
        op: &'static str,
        shape: Shape,
        dtype: DType,
        device: Device,
        write: &mut dyn FnMut(UninitTensor) -> Result<Tensor>,
    ) -> Result<Tensor>;

    /// A copy of `src` (on a device of this runtime) in page-locked host
    /// memory (`Tensor::pin_memory`): an error off the host.
    fn pin_memory(&self, src: &Tensor) -> Result<Tensor> {
        Err(TensorError::Device(format!("pin_memory: the tensor is on {}, not in host memory", src.device())))
    }

    // ----- streams and events ------------------------------------------------

    /// Makes a new stream `id` on `device` (registered with its allocator).
    fn new_stream(&self, device: Device, id: StreamId) -> Result<()> {
        let _ = (device, id);
        Ok(())
    }

    /// Waits for all work queued on `device`.
    fn synchronize(&self, device: Device) -> Result<()> {
        let _ = device;
        Ok(())
    }

    /// Waits for the work queued on stream `stream` of `device`.
    fn synchronize_stream(&self, device: Device, stream: StreamId) -> Result<()> {
        let _ = (device, stream);
        Ok(())
    }

    /// Records an event at the current end of stream `stream`'s work on
    /// `device`: `None` where the work is already done when recorded.
    fn record_event(
        &self,
        device: Device,
        stream: StreamId,
        enable_timing: bool,
    ) -> Result<Option<Arc<dyn DeviceEvent>>> {
        let _ = (device, stream, enable_timing);
        Ok(None)
    }

    /// Makes work queued on stream `stream` of `device` after now wait for
    /// `event` (one this runtime recorded on `device`).
    fn wait_event(&self, device: Device, stream: StreamId, event: &dyn DeviceEvent) -> Result<()> {
        let _ = (device, stream, event);
        Ok(())
    }
}

/// An event a device recorded on one of its streams
/// ([`DeviceRuntime::record_event`]).
pub(crate) trait DeviceEvent: std::fmt::Debug + Send + Sync {
    /// Whether the work queued before it has finished.
    fn is_complete(&self) -> bool;

    /// Waits for the work queued before it.
    fn synchronize(&self) -> Result<()>;

    /// Milliseconds of device time from this event to `end` (recorded by
    /// the same runtime on the same device), waiting for both.
    fn elapsed_ms(&self, end: &dyn DeviceEvent) -> Result<f64>;

    /// For the runtime that recorded it to recover its own type (only CUDA
    /// records events).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn as_any(&self) -> &dyn Any;
}

/// A device's caching allocator, whatever memory backend it allocates from:
/// the statistics and controls of `crate::memory` (PyTorch's
/// `torch.cuda.memory_*`).
pub(crate) trait DeviceAllocator: Send + Sync {
    /// Bytes held by live blocks.
    fn allocated_bytes(&self) -> usize;
    /// Bytes reserved from the device.
    fn reserved_bytes(&self) -> usize;
    /// Every statistic.
    fn stats(&self) -> MemoryStats;
    /// Sets every peak to its current value.
    fn reset_peak(&self);
    /// Returns cached memory that no block uses to the device.
    fn empty_cache(&self);
    /// The statistics as a table.
    fn summary(&self) -> String;
    /// Segments, blocks and recorded history.
    fn snapshot(&self) -> Snapshot;
    /// Records the last `max_entries` events (0 stops and clears).
    fn record_history(&self, max_entries: usize);
    /// How the free cached memory is laid out.
    fn fragmentation(&self) -> FragmentationReport;
    /// Caps the reserved memory to `fraction` of the capacity.
    fn set_memory_fraction(&self, fraction: f64) -> std::result::Result<(), AllocError>;
    /// Forwards every event to `observer`.
    fn set_observer(&self, observer: Option<Observer>);
}

impl<B: brasa_alloc::Backend> DeviceAllocator for CachingAllocator<B> {
    fn allocated_bytes(&self) -> usize {
        CachingAllocator::allocated_bytes(self)
    }
    fn reserved_bytes(&self) -> usize {
        CachingAllocator::reserved_bytes(self)
    }
    fn stats(&self) -> MemoryStats {
        CachingAllocator::stats(self)
    }
    fn reset_peak(&self) {
        CachingAllocator::reset_peak(self)
    }
    fn empty_cache(&self) {
        CachingAllocator::empty_cache(self)
    }
    fn summary(&self) -> String {
        CachingAllocator::summary(self)
    }
    fn snapshot(&self) -> Snapshot {
        CachingAllocator::snapshot(self)
    }
    fn record_history(&self, max_entries: usize) {
        CachingAllocator::record_history(self, max_entries)
    }
    fn fragmentation(&self) -> FragmentationReport {
        CachingAllocator::fragmentation(self)
    }
    fn set_memory_fraction(&self, fraction: f64) -> std::result::Result<(), AllocError> {
        CachingAllocator::set_memory_fraction(self, fraction)
    }
    fn set_observer(&self, observer: Option<Observer>) {
        CachingAllocator::set_observer(self, observer)
    }
}

/// A device's allocator as [`DeviceRuntime::allocator`] hands it out.
pub(crate) enum AllocatorRef {
    /// One that lives as long as the process (host and CUDA devices).
    Process(&'static dyn DeviceAllocator),
    /// One that lives as long as its device (a meta device's).
    Shared(Arc<dyn DeviceAllocator>),
}

impl Deref for AllocatorRef {
    type Target = dyn DeviceAllocator;

    fn deref(&self) -> &(dyn DeviceAllocator + 'static) {
        match self {
            AllocatorRef::Process(allocator) => *allocator,
            AllocatorRef::Shared(allocator) => &**allocator,
        }
    }
}
