//! How a device times work on its queues: [`DeviceTimer`], implemented by
//! device backends (a CUDA stream, a host worker queue), and [`HostTimer`]
//! for work that runs on the host.
//!
//! A timer enqueues timestamp markers without waiting, and turns pairs of
//! markers into elapsed time only when asked — which the profiler does once,
//! after the profile ends. Nothing here synchronizes inside the timed region.
//!
//! Device time reaches the host timeline through one reference pair per timer
//! and session ([`DeviceTimer::record_reference`]): a marker and the host time
//! it was reached at. An interval's start is placed at the reference's host time
//! plus the device time from the reference marker to its start marker; its
//! duration is the device time between its own two markers (so long sessions
//! lose no precision on short kernels).

use std::sync::Arc;

use crate::clock::Clock;
use crate::error::ProfileError;
use crate::event::DeviceId;

/// An opaque handle to a timestamp marker recorded by a [`DeviceTimer`]
/// (for CUDA, an index into a pool of timing events).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Marker(pub u64);

/// A device's way of timing work on its queues. Implemented by device crates.
pub trait DeviceTimer: Send + Sync {
    /// The device this timer measures.
    fn device(&self) -> DeviceId;

    /// The queue (stream) the next marker will be recorded on. Default: 0.
    fn current_queue(&self) -> u32 {
        0
    }

    /// Enqueues a timestamp marker on the current queue and returns at once.
    /// Must not wait for the device.
    fn record_marker(&self) -> Result<Marker, ProfileError>;

    /// Nanoseconds from marker `from` to marker `to` (both recorded by this timer,
    /// `from` first). Called only after the profile ended; may wait for the device.
    fn elapsed_ns(&self, from: Marker, to: Marker) -> Result<u64, ProfileError>;

    /// The profiler is done with `marker`; a pool may reuse it. Default: nothing.
    fn release_marker(&self, _marker: Marker) {}

    /// The reference pair that maps this timer's markers onto the host clock:
    /// a marker and the host time (`clock`'s nanoseconds) at which the device
    /// reached it. Every interval is placed at `host + elapsed(reference, marker)`.
    ///
    /// The default records a marker on the current queue and reads the clock
    /// after it, which is exact for timers that run on the host. A device whose
    /// queues may be busy should record the marker where nothing waits ahead of
    /// it (CUDA: an idle stream of its own) and wait for that one marker only,
    /// so the device's time and the host's are read together; this is called
    /// once per timer and session, never per interval.
    fn record_reference(&self, clock: &dyn Clock) -> Result<(Marker, u64), ProfileError> {
        let marker = self.record_marker()?;
        Ok((marker, clock.now_ns()))
    }
}

/// A [`DeviceTimer`] for work that runs on the host (the CPU backend, logical host
/// devices): a marker is the clock's reading, elapsed time is the difference.
pub struct HostTimer {
    device: DeviceId,
    clock: Arc<dyn Clock>,
}

impl HostTimer {
    /// A timer for `device` reading `clock` (use the profiler's clock, normally
    /// [`HostClock`](crate::HostClock)).
    pub fn new(device: DeviceId, clock: Arc<dyn Clock>) -> Self {
        Self { device, clock }
    }
}

impl DeviceTimer for HostTimer {
    fn device(&self) -> DeviceId {
        self.device
    }

    fn record_marker(&self) -> Result<Marker, ProfileError> {
        Ok(Marker(self.clock.now_ns()))
    }

    fn elapsed_ns(&self, from: Marker, to: Marker) -> Result<u64, ProfileError> {
        Ok(to.0.saturating_sub(from.0))
    }
}
