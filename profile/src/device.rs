//! Device time from markers recorded on a device queue.
//!
//! [`device_span`] times one piece of device work (a kernel) between two
//! markers of a [`DeviceTimer`] (resolved once, after the profile ends) and
//! attaches it to the innermost open host range on the calling thread; the op table shows it as
//! `Self CUDA` / `CUDA total` (`Self Device` / `Device total` when other devices
//! recorded too), the trace draws it on the device's track (one per queue) with a
//! flow arrow from the launching range.

use std::borrow::Cow;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use crate::session::{current, enabled, lock, RawDeviceInterval, ThreadBuffer};
use crate::timer::{DeviceTimer, Marker};

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
