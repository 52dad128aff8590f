//! Device time from markers recorded on a device queue.
//!
//! A device backend (a CUDA stream, a host worker queue) implements
//! [`DeviceTimer`]: it enqueues timestamp markers without waiting, and turns
//! pairs of markers into elapsed time only when asked — which the profiler does
//! once, after the profile ends. Nothing here synchronizes inside the timed region.
//!
//! [`device_span`] times one piece of device work (a kernel) and attaches it to the
//! innermost open host range on the calling thread; the op table shows it as
//! `Self CUDA` / `CUDA total` (`Self Device` / `Device total` when other devices
//! recorded too), the trace draws it on the device's track (one per queue) with a
//! flow arrow from the launching range.
//!
//! Device time reaches the host timeline through one reference pair per timer
//! and session ([`DeviceTimer::record_reference`]): a marker and the host time
//! it was reached at. An interval's start is placed at the reference's host time
//! plus the device time from the reference marker to its start marker; its
//! duration is the device time between its own two markers (so long sessions
//! lose no precision on short kernels).

use std::borrow::Cow;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use crate::clock::Clock;
use crate::error::ProfileError;
use crate::event::DeviceId;
use crate::session::{current, enabled, lock, RawDeviceInterval, ThreadBuffer};

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

/// Times device work between its creation and its drop (or [`DeviceSpan::end`]).
#[must_use = "the device interval ends when this span drops"]
pub struct DeviceSpan {
    active: Option<ActiveSpan>,
    _not_send: PhantomData<*const ()>,
}

struct ActiveSpan {
    buffer: Arc<Mutex<ThreadBuffer>>,
    timer: Arc<dyn DeviceTimer>,
    name: Cow<'static, str>,
    slot: usize,
    queue: u32,
    start: Marker,
    launch_ns: u64,
    range: Option<u32>,
}

impl DeviceSpan {
    /// Whether this span is recording (profiling was on and the marker was recorded).
    pub fn is_recording(&self) -> bool {
        self.active.is_some()
    }

    /// Records the end marker now (same as dropping the span).
    pub fn end(self) {}
}

impl Drop for DeviceSpan {
    #[inline]
    fn drop(&mut self) {
        if let Some(span) = self.active.take() {
            span.finish();
        }
    }
}

impl ActiveSpan {
    #[cold]
    #[inline(never)]
    fn finish(self) {
        // Runs in the span's `drop`: a timer that panics loses this interval
        // instead of panicking out of a drop.
        let marker = crate::user_code::call_user(|| self.timer.record_marker());
        match marker {
            Ok(Ok(end)) => {
                let mut buffer = lock(&self.buffer);
                if !buffer.closed {
                    buffer.device.push(RawDeviceInterval {
                        name: self.name,
                        slot: self.slot,
                        queue: self.queue,
                        start: self.start,
                        end,
                        launch_ns: self.launch_ns,
                        range: self.range,
                    });
                }
            }
            Ok(Err(_)) | Err(_) => {
                let _ = crate::user_code::call_user(|| self.timer.release_marker(self.start));
            }
        }
    }
}

/// Starts timing device work named `name` (e.g. a kernel) on `timer`'s current
/// queue, attached to the innermost open range on this thread. The end marker is
/// recorded when the span drops; times are resolved when the profile ends.
///
/// When profiling is off this is one relaxed atomic load.
#[inline]
pub fn device_span(timer: &Arc<dyn DeviceTimer>, name: impl Into<Cow<'static, str>>) -> DeviceSpan {
    if !enabled() {
        return DeviceSpan { active: None, _not_send: PhantomData };
    }
    begin_span(timer, name.into())
}

#[cold]
#[inline(never)]
fn begin_span(timer: &Arc<dyn DeviceTimer>, name: Cow<'static, str>) -> DeviceSpan {
    DeviceSpan { active: try_begin_span(timer, name), _not_send: PhantomData }
}

fn try_begin_span(timer: &Arc<dyn DeviceTimer>, name: Cow<'static, str>) -> Option<ActiveSpan> {
    let handle = current()?;
    let slot = match handle.session.timer_slot(timer) {
        Ok(slot) => slot,
        Err(err) => {
            handle.session.warn(err.to_string());
            return None;
        }
    };
    let launch_ns = handle.session.clock.now_ns();
    let queue = timer.current_queue();
    let start = match timer.record_marker() {
        Ok(marker) => marker,
        Err(err) => {
            handle.session.warn(err.to_string());
            return None;
        }
    };
    let range = lock(&handle.buffer).innermost();
    Some(ActiveSpan { buffer: handle.buffer, timer: Arc::clone(timer), name, slot, queue, start, launch_ns, range })
}
