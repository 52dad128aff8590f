//! Device time for `brasa-profile`: while a profiler records, each kernel an
//! op launches on a CUDA device (and each asynchronous copy) is bracketed by a
//! pair of timing events on the op's stream ([`CudaOps::launch_span`]),
//! and the pair becomes a device interval of the op's range, named after the
//! kernel (the table's `Self CUDA` / `CUDA total`, a slice on the device's
//! stream track in the trace).
//!
//! Nothing waits while recording: events are enqueued and kept; the profiler
//! asks for their elapsed times only when it stops ([`DeviceTimer::elapsed_ns`]
//! may wait then). Device time reaches the host clock through one reference
//! event per session, recorded on a private idle stream and waited for alone
//! ([`DeviceTimer::record_reference`]).
//!
//! When no profiler runs a launch span costs one relaxed atomic load.

use super::CudaOps;
use crate::device::Device;
use brasa_profile::{Clock, DeviceId, DeviceSpan, DeviceTimer, Marker, ProfileError};
use cudarc::driver::{result, sys, CudaContext, DriverError};
use std::sync::{Arc, Mutex, MutexGuard};

/// Timing events kept for reuse across sessions; beyond this they are destroyed.
const SPARE_EVENTS: usize = 4096;

struct TimingEvent(sys::CUevent);

// SAFETY: a CUevent handle may be used from any thread of the process.
unsafe impl Send for TimingEvent {}

impl Drop for TimingEvent {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `event::create` and is dropped once.
        let _ = unsafe { result::event::destroy(self.0) };
    }
}

struct ReferenceStream(sys::CUstream);

// SAFETY: a CUstream handle may be used from any thread of the process.
unsafe impl Send for ReferenceStream {}

impl Drop for ReferenceStream {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `stream::create` and is dropped once.
        let _ = unsafe { result::stream::destroy(self.0) };
    }
}

/// Markers handed to the profiler: slots of recorded events, and spare events.
#[derive(Default)]
struct Markers {
    slots: Vec<Option<TimingEvent>>,
    vacant: Vec<usize>,
    spare: Vec<TimingEvent>,
}

impl Markers {
    fn insert(&mut self, event: TimingEvent) -> Marker {
        let slot = match self.vacant.pop() {
            Some(slot) => {
                self.slots[slot] = Some(event);
                slot
            }
            None => {
                self.slots.push(Some(event));
                self.slots.len() - 1
            }
        };
        Marker(slot as u64)
    }

    fn handle(&self, marker: Marker) -> Option<sys::CUevent> {
        self.slots.get(usize::try_from(marker.0).ok()?)?.as_ref().map(|e| e.0)
    }
}

/// CUDA events as the profiler's markers, on one device.
pub(crate) struct CudaTimer {
    index: usize,
    context: Arc<CudaContext>,
    markers: Mutex<Markers>,
    reference: Mutex<Option<ReferenceStream>>,
}

impl CudaTimer {
    pub(crate) fn new(index: usize, context: Arc<CudaContext>) -> Self {
        CudaTimer { index, context, markers: Mutex::default(), reference: Mutex::new(None) }
    }

    fn device(&self) -> Device {
        Device::Cuda(self.index)
    }

    fn error(&self, what: &str, source: impl std::fmt::Display) -> ProfileError {
        ProfileError::Device { device: self.device().to_string(), message: format!("{what}: {source}") }
    }

    fn markers(&self) -> MutexGuard<'_, Markers> {
        self.markers.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bind(&self) -> Result<(), ProfileError> {
        self.context.bind_to_thread().map_err(|e| self.error("binding the CUDA context", e))
    }

    /// A timing event, spare or new (the context is current).
    fn take_event(&self) -> Result<TimingEvent, ProfileError> {
        if let Some(event) = self.markers().spare.pop() {
            return Ok(event);
        }
        result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map(TimingEvent)
            .map_err(|e| self.error("cuEventCreate", e))
    }

    fn give_back(&self, event: TimingEvent) {
        let mut markers = self.markers();
        if markers.spare.len() < SPARE_EVENTS {
            markers.spare.push(event);
        }
    }

    /// Records a fresh event on `stream` and hands it out as a marker.
    fn record_on(&self, stream: sys::CUstream) -> Result<Marker, ProfileError> {
        self.bind()?;
        let event = self.take_event()?;
        // SAFETY: both handles are live and the context is current.
        match unsafe { result::event::record(event.0, stream) } {
            Ok(()) => Ok(self.markers().insert(event)),
            Err(e) => {
                self.give_back(event);
                Err(self.error("cuEventRecord", e))
            }
        }
    }

    /// The private, otherwise idle stream the reference event is recorded on
    /// (non-blocking: it waits for no other stream's work).
    fn reference_stream(&self) -> Result<sys::CUstream, ProfileError> {
        let mut reference = self.reference.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(stream) = reference.as_ref() {
            return Ok(stream.0);
        }
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| self.error("creating the profiler's reference stream", e))?;
        *reference = Some(ReferenceStream(stream));
        Ok(stream)
    }
}

fn nanoseconds(milliseconds: f32) -> u64 {
    // cuEventElapsedTime resolves about half a microsecond; a negative value
    // (an end marker reached before a start marker on another stream) is 0.
    (f64::from(milliseconds) * 1e6).round().max(0.0) as u64
}

impl DeviceTimer for CudaTimer {
    fn device(&self) -> DeviceId {
        DeviceId::cuda(self.index as u32)
    }

    fn current_queue(&self) -> u32 {
        let id = crate::backend::current_stream::current_stream_id(self.device());
        u32::try_from(id.0).unwrap_or(u32::MAX)
    }

    fn record_marker(&self) -> Result<Marker, ProfileError> {
        let id = crate::backend::current_stream::current_stream_id(self.device());
        let stream = super::device::stream(self.index, id).map_err(|e| self.error("finding the current stream", e))?;
        self.record_on(stream.cu_stream())
    }

    fn elapsed_ns(&self, from: Marker, to: Marker) -> Result<u64, ProfileError> {
        let handles = {
            let markers = self.markers();
            (markers.handle(from), markers.handle(to))
        };
        let (Some(start), Some(end)) = handles else {
            return Err(self.error("resolving a marker", "no such marker (released already?)"));
        };
        self.bind()?;
        let wait = |event| {
            // SAFETY: the handle stays live until the profiler releases its marker.
            unsafe { result::event::synchronize(event) }.map_err(|e: DriverError| self.error("cuEventSynchronize", e))
        };
        wait(start)?;
        wait(end)?;
        // SAFETY: both events are live, of this context, recorded and complete.
        let ms = unsafe { result::event::elapsed(start, end) }.map_err(|e| self.error("cuEventElapsedTime", e))?;
        Ok(nanoseconds(ms))
    }

    fn release_marker(&self, marker: Marker) {
        let event = {
            let mut markers = self.markers();
            let Ok(slot) = usize::try_from(marker.0) else { return };
            let event = markers.slots.get_mut(slot).and_then(Option::take);
            if event.is_some() {
                markers.vacant.push(slot);
            }
            event
        };
        if let Some(event) = event {
            self.give_back(event);
        }
    }

    fn record_reference(&self, clock: &dyn Clock) -> Result<(Marker, u64), ProfileError> {
        let stream = self.reference_stream()?;
        let before = clock.now_ns();
        let marker = self.record_on(stream)?;
        let Some(event) = self.markers().handle(marker) else {
            return Err(self.error("recording the reference event", "the marker vanished"));
        };
        // Only this event is waited for: nothing is queued ahead of it on its
        // stream, so the device reached it between `before` and `after`.
        // SAFETY: the handle is live (the marker is not released).
        unsafe { result::event::synchronize(event) }.map_err(|e| self.error("cuEventSynchronize", e))?;
        let after = clock.now_ns();
        Ok((marker, before + (after.saturating_sub(before)) / 2))
    }
}

/// Times the launches queued while it lives (see [`CudaOps::launch_span`]).
pub(crate) struct LaunchSpan {
    _span: Option<DeviceSpan>,
}

impl CudaOps {
    /// While a profiler records: a device interval named `kernel` around the
    /// launches queued until the returned guard drops (one kernel, by the
    /// callers), on the thread's current stream, attached to the innermost
    /// open range on this thread (the op). Otherwise nothing: one relaxed
    /// atomic load.
    #[inline]
    pub(crate) fn launch_span(&self, kernel: &str) -> LaunchSpan {
        if !brasa_profile::enabled() {
            return LaunchSpan { _span: None };
        }
        self.open_launch_span(kernel)
    }

    #[cold]
    #[inline(never)]
    fn open_launch_span(&self, kernel: &str) -> LaunchSpan {
        LaunchSpan { _span: Some(brasa_profile::device_span(&self.timer, kernel.to_owned())) }
    }
}

#[cfg(test)]
mod tests {
    use super::nanoseconds;

    #[test]
    fn milliseconds_become_whole_nanoseconds_and_never_negative() {
        assert_eq!(nanoseconds(0.0), 0);
        assert_eq!(nanoseconds(0.0005), 500);
        assert_eq!(nanoseconds(1.25), 1_250_000);
        assert_eq!(nanoseconds(-0.002), 0);
    }
}
