//! Streams and events: the device's work queues, and markers on them for
//! ordering and timing (`torch.cuda.Stream` / `torch.cuda.Event`).
//!
//! On the host, work runs synchronously on the calling thread: a stream's work
//! is finished when the call that queued it returns, an event completes when
//! it is recorded, and `elapsed_time` between two events is the host time
//! between their recordings. The same code gets asynchronous semantics on a
//! CUDA device: ops queue their kernels on the thread's current stream of
//! the device ([`Stream::current`], set for a scope with
//! [`Stream::make_current`], PyTorch's `with torch.cuda.stream(s)`), memory
//! allocated there comes from that stream's pool, and events are CUDA events
//! (`elapsed_time` is device time).
//!
//! ```
//! use brasa_tensor::{DType, Device, Event, Stream, Tensor};
//! let stream = Stream::default_for(Device::CPU);
//! let (mut start, mut end) = (Event::new(true), Event::new(true));
//! start.record(&stream)?;
//! let x = Tensor::ones([256, 256], DType::F32)?.matmul(&Tensor::ones([256, 256], DType::F32)?)?;
//! end.record(&stream)?;
//! end.synchronize()?;                         // wait for the work, not the host clock
//! assert!(start.elapsed_time(&end)? >= 0.0);  // milliseconds
//! # Ok::<(), brasa_tensor::TensorError>(())
//! ```

use crate::backend::current_stream::{current_stream_id, next_stream_id, set_current_stream};
use crate::backend::{runtime_for, DeviceEvent};
use crate::device::Device;
use crate::error::{Result, TensorError};
use crate::tensor::Tensor;
use brasa_alloc::StreamId;
use std::sync::Arc;
use std::time::Instant;

/// Waits for all work queued on `device` (`torch.cuda.synchronize`):
/// immediate on the host, whose work is done when its call returns.
pub fn synchronize(device: Device) -> Result<()> {
    runtime_for(device)?.synchronize(device)
}

/// Restores the previous current stream of a device when dropped (see
/// [`Stream::make_current`]).
#[must_use = "the stream is current only while the guard lives"]
pub struct StreamGuard {
    device: Device,
    previous: StreamId,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        set_current_stream(self.device, self.previous);
    }
}

/// A queue of work on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stream {
    device: Device,
    id: StreamId,
}

impl Stream {
    /// The device's default stream.
    pub fn default_for(device: Device) -> Stream {
        Stream { device, id: StreamId::DEFAULT }
    }

    /// A new stream on `device` (on CUDA, a new driver stream registered with
    /// the device's allocator).
    pub fn new(device: Device) -> Result<Stream> {
        let id = next_stream_id();
        runtime_for(device)?.new_stream(device, id)?;
        Ok(Stream { device, id })
    }

    /// This thread's current stream on `device`: the one ops queue their
    /// work on (the default stream unless [`Stream::make_current`] says
    /// otherwise).
    pub fn current(device: Device) -> Stream {
        Stream { device, id: current_stream_id(device) }
    }

    /// Makes this stream the thread's current stream of its device until the
    /// guard is dropped (PyTorch's `with torch.cuda.stream(s):`).
    ///
    /// ```
    /// use brasa_tensor::{Device, Stream};
    /// let side = Stream::new(Device::CPU)?;
    /// {
    ///     let _on_side = side.make_current();
    ///     assert_eq!(Stream::current(Device::CPU), side);
    /// }
    /// assert_eq!(Stream::current(Device::CPU), Stream::default_for(Device::CPU));
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn make_current(&self) -> StreamGuard {
        let previous = set_current_stream(self.device, self.id);
        StreamGuard { device: self.device, previous }
    }

    /// The device the stream belongs to.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The allocator's id of this stream.
    pub fn id(&self) -> StreamId {
        self.id
    }

    /// Waits until the work queued on the stream has finished (immediate on the host).
    pub fn synchronize(&self) -> Result<()> {
        runtime_for(self.device)?.synchronize_stream(self.device, self.id)
    }

    /// Records a new event on the stream.
    pub fn record_event(&self, enable_timing: bool) -> Result<Event> {
        let mut event = Event::new(enable_timing);
        event.record(self)?;
        Ok(event)
    }

    /// Makes work queued on this stream after now wait for `event` (on the
    /// host the event has already completed).
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        if let Some(device) = event.device {
            if device != self.device {
                return Err(TensorError::DeviceMismatch { op: "wait_event", lhs: self.device, rhs: device });
            }
        }
        match &event.recorded {
            Some(recorded) => runtime_for(self.device)?.wait_event(self.device, self.id, &**recorded),
            // Not recorded, or recorded where work is done when queued.
            None => Ok(()),
        }
    }
}

/// A marker in a stream's work: for waiting, ordering and timing.
#[derive(Clone, Debug)]
pub struct Event {
    enable_timing: bool,
    recorded_at: Option<Instant>,
    device: Option<Device>,
    /// The device's own event, once recorded on a stream of a device that
    /// queues work (CUDA).
    recorded: Option<Arc<dyn DeviceEvent>>,
}

impl Event {
    /// An unrecorded event; `elapsed_time` needs `enable_timing` on both ends.
    pub fn new(enable_timing: bool) -> Event {
        Event { enable_timing, recorded_at: None, device: None, recorded: None }
    }

    /// Records the event at the current end of `stream`'s work.
    pub fn record(&mut self, stream: &Stream) -> Result<()> {
        self.recorded = runtime_for(stream.device())?.record_event(stream.device(), stream.id(), self.enable_timing)?;
        self.recorded_at = Some(Instant::now());
        self.device = Some(stream.device());
        Ok(())
    }

    /// Whether the work before the event has finished (true on the host once recorded).
    pub fn query(&self) -> bool {
        if let Some(recorded) = &self.recorded {
            return recorded.is_complete();
        }
        self.recorded_at.is_some()
    }

    /// Waits for the work before the event.
    pub fn synchronize(&self) -> Result<()> {
        if let Some(recorded) = &self.recorded {
            return recorded.synchronize();
        }
        match self.recorded_at {
            Some(_) => Ok(()),
            None => Err(TensorError::invalid("Event::synchronize", "the event was never recorded")),
        }
    }

    /// Milliseconds between this event and `end`, both recorded with timing on.
    pub fn elapsed_time(&self, end: &Event) -> Result<f64> {
        const OP: &str = "Event::elapsed_time";
        if !self.enable_timing || !end.enable_timing {
            return Err(TensorError::invalid(OP, "both events need enable_timing = true"));
        }
        let (Some(start), Some(stop)) = (self.recorded_at, end.recorded_at) else {
            return Err(TensorError::invalid(OP, "both events must be recorded first"));
        };
        if let (Some(a), Some(b)) = (self.device, end.device) {
            if a != b {
                return Err(TensorError::DeviceMismatch { op: OP, lhs: a, rhs: b });
            }
        }
        // Device events: device time between them (waits for both).
        if let (Some(first), Some(last)) = (&self.recorded, &end.recorded) {
            return first.elapsed_ms(&**last);
        }
        Ok(stop.saturating_duration_since(start).as_secs_f64() * 1e3)
    }
}

impl Tensor {
    /// A copy in page-locked host memory, from which a device can copy
    /// asynchronously (`Tensor.pin_memory()`). Host tensors only.
    ///
    /// With the `cuda` feature and a CUDA device present, the memory is
    /// registered with the CUDA driver and [`Tensor::to_non_blocking`] to a
    /// CUDA device queues the copy and returns at once. Without CUDA (no
    /// feature, no driver or no device) the memory is `mlock`ed instead — a
    /// documented fallback where PyTorch raises: pinning still works (a data
    /// loader that pins runs unchanged), but a device copy from it would be
    /// synchronous. [`crate::memory::pinned_memory_driver`] says which.
    /// Pinning fails with an error naming `RLIMIT_MEMLOCK` (mlock) or the
    /// driver's error when the memory cannot be locked.
    pub fn pin_memory(&self) -> Result<Tensor> {
        if self.is_pinned() {
            return Ok(self.clone());
        }
        runtime_for(self.device())?.pin_memory(self)
    }

    /// Whether the tensor lives in page-locked host memory.
    pub fn is_pinned(&self) -> bool {
        self.storage().is_pinned()
    }

    /// A copy on `device` that may overlap with the caller's work where the
    /// device allows (`.to(device, non_blocking=True)`).
    ///
    /// From a contiguous tensor in CUDA-registered pinned memory
    /// ([`Tensor::pin_memory`]) to a CUDA device, the copy is queued on the
    /// device's current stream (`cuMemcpyHtoDAsync`) and this returns before it
    /// runs: ops queued on that stream afterwards see the data; another stream
    /// must wait for an event first, and the host must not write to the source
    /// until the stream has passed the copy. Dropping the source is safe: its
    /// pinned block is reused only after an event on the stream says the copy
    /// ran (PyTorch's caching host allocator). Any other copy (a source that is
    /// not pinned or not contiguous, device to host, host to host) is the
    /// synchronous [`Tensor::to`], as PyTorch falls back for pageable memory.
    pub fn to_non_blocking(&self, device: Device) -> Result<Tensor> {
        if device != self.device() {
            if let Some(copy) = runtime_for(device)?.copy_in_non_blocking(self, device)? {
                return Ok(copy);
            }
        }
        self.to(device)
    }

    /// Marks this tensor's memory as used by `stream`, so it is not reused
    /// before the stream's queued work finishes (`Tensor.record_stream`).
    pub fn record_stream(&self, stream: &Stream) -> Result<()> {
        if stream.device() != self.device() {
            return Err(TensorError::DeviceMismatch { op: "record_stream", lhs: self.device(), rhs: stream.device() });
        }
        self.storage().record_stream(stream.id());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    #[test]
    fn events_time_work_and_check_their_use() {
        let stream = Stream::new(Device::CPU).unwrap();
        assert_ne!(stream.id(), StreamId::DEFAULT);
        let start = stream.record_event(true).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let end = stream.record_event(true).unwrap();
        assert!(end.query());
        let ms = start.elapsed_time(&end).unwrap();
        assert!((4.0..1000.0).contains(&ms), "{ms}");
        let untimed = stream.record_event(false).unwrap();
        let err = start.elapsed_time(&untimed).unwrap_err();
        assert!(matches!(err, TensorError::Invalid { op: "Event::elapsed_time", .. }), "{err:?}");
        assert!(Event::new(true).synchronize().is_err());
        assert!(start.elapsed_time(&Event::new(true)).is_err());
    }

    #[test]
    fn pinned_copies_keep_values() {
        let x = Tensor::arange(0.0, 10.0, 1.0, DType::F32).unwrap().narrow(0, 2, 5).unwrap();
        match x.pin_memory() {
            Ok(pinned) => {
                assert!(pinned.is_pinned() && !x.is_pinned());
                assert_eq!(pinned.to_vec::<f32>().unwrap(), [2.0, 3.0, 4.0, 5.0, 6.0]);
                let back = pinned.to_non_blocking(Device::CPU).unwrap();
                assert_eq!(back.to_vec::<f32>().unwrap(), [2.0, 3.0, 4.0, 5.0, 6.0]);
                pinned.record_stream(&Stream::new(Device::CPU).unwrap()).unwrap();
                assert!(crate::memory::pinned_stats().unwrap().allocated_bytes.all.current >= 20);
            }
            // Locked memory may be capped on the machine; the error must say so.
            Err(error) => assert!(error.to_string().contains("RLIMIT_MEMLOCK"), "{error}"),
        }
    }
}
