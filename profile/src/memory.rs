//! Allocator events: the public entry point for an allocator observer.

use crate::event::MemoryEvent;
use crate::session::{current, enabled, lock, RawMemory};

/// Records one allocator event (an allocation when `bytes > 0`, a free when
/// `bytes < 0`, a retag of a live block's bytes to another memory category —
/// see [`MemoryEvent`]), attributed to the innermost open range on the
/// calling thread.
///
/// Recorded only while a profiler built with `profile_memory(true)` is recording;
/// otherwise it costs one relaxed atomic load. An allocator observer calls this
/// for every alloc, free and retag; the op table then shows `Self Mem` / `Mem` per
/// range, and the memory timeline knows which op allocated each block and what
/// category its bytes were in at every moment.
#[inline]
pub fn record_memory_event(event: MemoryEvent) {
    if enabled() {
        record_slow(event);
    }
}

#[cold]
#[inline(never)]
fn record_slow(event: MemoryEvent) {
    let Some(handle) = current() else {
        return;
    };
    if !handle.session.profile_memory {
        return;
    }
    let time_ns = handle.session.clock.now_ns();
    let mut buffer = lock(&handle.buffer);
    if buffer.closed {
        return;
    }
    let range = buffer.innermost();
    buffer.memory.push(RawMemory { event, time_ns, range });
}
