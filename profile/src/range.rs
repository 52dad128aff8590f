//! Named host ranges: `record_function` and friends.
//!
//! A range is opened by a call and closed when its guard drops, on the same thread
//! (guards are `!Send`). Ranges nest: the range open on a thread when another one
//! opens becomes its parent, and a range's self time is its duration minus the
//! durations of its children.

use std::borrow::Cow;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use crate::clock::Clock;
use crate::event::RangeKind;
use crate::session::{current, enabled, lock, RawRange, ThreadBuffer};

/// Closes its range when dropped. Does nothing if profiling was off when it was made.
#[must_use = "the range closes when this guard drops; bind it with `let _guard = ...`"]
pub struct RangeGuard {
    open: Option<OpenRange>,
    // Ranges belong to the thread that opened them: keep the guard on that thread.
    _not_send: PhantomData<*const ()>,
}

/// A range open in a thread buffer, closable from anywhere.
pub(crate) struct OpenRange {
    buffer: Arc<Mutex<ThreadBuffer>>,
    clock: Arc<dyn Clock>,
    index: u32,
}

impl OpenRange {
    #[cold]
    #[inline(never)]
    pub(crate) fn close(self) {
        // Read the clock outside the buffer lock: a user clock may itself record.
        // This runs in guards' `drop`: a clock that panics closes the range
        // where it began (end = start) instead of panicking out of a drop.
        let now = crate::user_code::call_user(|| self.clock.now_ns()).unwrap_or(0);
        lock(&self.buffer).close(self.index, now);
    }
}

impl RangeGuard {
    #[inline]
    const fn inactive() -> Self {
        Self { open: None, _not_send: PhantomData }
    }

    /// Whether this guard is recording (profiling was on when it was opened).
    pub fn is_recording(&self) -> bool {
        self.open.is_some()
    }

    /// Closes the range now (same as dropping the guard).
    pub fn end(self) {}
}

impl Drop for RangeGuard {
    #[inline]
    fn drop(&mut self) {
        if let Some(open) = self.open.take() {
            open.close();
        }
    }
}

/// Opens a range named `name` on the calling thread, like PyTorch's
/// `record_function`: it shows in the op table and as a slice on this thread's
/// track in the trace. It closes when the returned guard drops.
///
/// When profiling is off this is one relaxed atomic load; a `&'static str` name
/// is never copied.
#[inline]
pub fn record_function(name: impl Into<Cow<'static, str>>) -> RangeGuard {
    if !enabled() {
        return RangeGuard::inactive();
    }
    open_guard(name.into(), RangeKind::UserAnnotation, None)
}

/// [`record_function`] with the shapes of the inputs, shown in the table's
/// `Input Shapes` column and used by `key_averages` grouping by shape (recorded only
/// when the profiler was built with `record_shapes(true)`).
#[inline]
pub fn record_function_with_shapes(name: impl Into<Cow<'static, str>>, input_shapes: &[&[usize]]) -> RangeGuard {
    if !enabled() {
        return RangeGuard::inactive();
    }
    open_guard(name.into(), RangeKind::UserAnnotation, Some(input_shapes))
}

/// An operator range, for tensor libraries: like [`record_function_with_shapes`]
/// but categorized `cpu_op` in the trace.
#[inline]
pub fn record_op(name: impl Into<Cow<'static, str>>, input_shapes: &[&[usize]]) -> RangeGuard {
    if !enabled() {
        return RangeGuard::inactive();
    }
    open_guard(name.into(), RangeKind::Op, Some(input_shapes))
}

#[cold]
#[inline(never)]
fn open_guard(name: Cow<'static, str>, kind: RangeKind, input_shapes: Option<&[&[usize]]>) -> RangeGuard {
    RangeGuard { open: open_range(name, kind, input_shapes), _not_send: PhantomData }
}

/// Opens a range in the calling thread's buffer of the running session.
pub(crate) fn open_range(
    name: Cow<'static, str>,
    kind: RangeKind,
    input_shapes: Option<&[&[usize]]>,
) -> Option<OpenRange> {
    let handle = current()?;
    let input_shapes = if handle.session.record_shapes {
        input_shapes.map(|shapes| shapes.iter().map(|s| s.to_vec()).collect())
    } else {
        None
    };
    // Read the clock before taking the buffer lock: a user clock may itself record.
    let start_ns = handle.session.clock.now_ns();
    let mut buffer = lock(&handle.buffer);
    if buffer.closed {
        return None;
    }
    let index = u32::try_from(buffer.ranges.len()).ok()?;
    let parent = buffer.innermost();
    buffer.ranges.push(RawRange { name, kind, start_ns, end_ns: None, parent, input_shapes });
    buffer.stack.push(index);
    drop(buffer);
    Some(OpenRange { buffer: handle.buffer, clock: Arc::clone(&handle.session.clock), index })
}
