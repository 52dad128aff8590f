//! Streams and events: the device's work queues, and markers on them for
//! ordering and timing (`torch.cuda.Stream` / `torch.cuda.Event`).
//!
//! On the host, work runs synchronously on the calling thread: a stream's work
//! is finished when the call that queued it returns, an event completes when
//! it is recorded, and `elapsed_time` between two events is the host time
//! between their recordings. The same code gets asynchronous semantics on a
//! CUDA device (where streams are not implemented yet and say so).
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

use crate::device::Device;
use crate::error::{Result, TensorError};
use crate::tensor::Tensor;
use brasa_alloc::StreamId;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

static NEXT_STREAM: AtomicU64 = AtomicU64::new(1);

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

    /// A new stream on `device`.
    pub fn new(device: Device) -> Result<Stream> {
        match device {
            Device::Cpu(_) => Ok(Stream { device, id: StreamId(NEXT_STREAM.fetch_add(1, Ordering::Relaxed)) }),
            Device::Cuda(index) => Err(TensorError::Device(format!(
                "cuda:{index}: streams other than the default are not implemented yet"
            ))),
        }
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
        Ok(())
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
        match event.device {
            Some(device) if device != self.device => {
                Err(TensorError::DeviceMismatch { op: "wait_event", lhs: self.device, rhs: device })
            }
            _ => Ok(()),
        }
    }
}

/// A marker in a stream's work: for waiting, ordering and timing.
#[derive(Clone, Debug)]
pub struct Event {
    enable_timing: bool,
    recorded_at: Option<Instant>,
    device: Option<Device>,
}

impl Event {
    /// An unrecorded event; `elapsed_time` needs `enable_timing` on both ends.
    pub fn new(enable_timing: bool) -> Event {
        Event { enable_timing, recorded_at: None, device: None }
    }

    /// Records the event at the current end of `stream`'s work.
    pub fn record(&mut self, stream: &Stream) -> Result<()> {
        self.recorded_at = Some(Instant::now());
        self.device = Some(stream.device());
        Ok(())
    }

    /// Whether the work before the event has finished (true on the host once recorded).
    pub fn query(&self) -> bool {
        self.recorded_at.is_some()
    }

    /// Waits for the work before the event.
    pub fn synchronize(&self) -> Result<()> {
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
        Ok(stop.saturating_duration_since(start).as_secs_f64() * 1e3)
    }
}

impl Tensor {
    /// A copy in page-locked host memory, from which a device can copy
    /// asynchronously (`Tensor.pin_memory()`). Host tensors only.
    pub fn pin_memory(&self) -> Result<Tensor> {
        if !self.device().is_cpu() {
            return Err(TensorError::Device(format!(
                "pin_memory: the tensor is on {}, not in host memory",
                self.device()
            )));
        }
        if self.is_pinned() {
            return Ok(self.clone());
        }
        crate::dispatch::dispatch_dtype!(self.dtype(), T => {
            let pinned = crate::storage::UninitTensor::pinned(self.shape().clone(), self.dtype())?;
            let src = self.storage().read::<T>("pin_memory")?;
            // SAFETY: `copy_strided` writes every element of the output (one
            // per element of this tensor's layout, which has its shape), reading none.
            unsafe {
                pinned.init_with::<T>("pin_memory", |dst| {
                    crate::tensor::copy_strided(&src, self.layout(), dst);
                    Ok(())
                })
            }
        })
    }

    /// Whether the tensor lives in page-locked host memory.
    pub fn is_pinned(&self) -> bool {
        self.storage().is_pinned()
    }

    /// A copy on `device` that may overlap with the caller's work where the
    /// device allows (`.to(device, non_blocking=True)`): synchronize a stream or
    /// an event before reading it. Host copies finish before this returns.
    pub fn to_non_blocking(&self, device: Device) -> Result<Tensor> {
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
        assert!(start.elapsed_time(&untimed).unwrap_err().to_string().contains("enable_timing"));
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
