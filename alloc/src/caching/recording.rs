//! The allocator's events: built only when someone wants them (the history
//! ring or an observer that is enabled), and handed to the observer once the
//! lock is released.

use super::State;
use crate::backend::StreamId;
use crate::category::MemoryCategory;
use crate::trace::{Observer, TraceAction, TraceEntry};

#[cold]
#[inline(never)]
pub(super) fn notify(observer: &Observer, entries: Vec<TraceEntry>) {
    for entry in &entries {
        observer.on_event(entry);
    }
}

impl<E> State<E> {
    /// Starts an operation under the lock: asks the observer, once, whether
    /// it wants this operation's events.
    #[inline]
    pub(super) fn begin(&mut self) {
        self.observing = match &self.observer {
            Some(observer) => observer.enabled(),
            None => false,
        };
    }

    /// The events for the observer, with it, when there are any.
    #[inline]
    pub(super) fn take_notifications(&mut self) -> Option<(Observer, Vec<TraceEntry>)> {
        if self.notifications.is_empty() {
            return None;
        }
        let entries = std::mem::take(&mut self.notifications);
        self.observer.clone().map(|observer| (observer, entries))
    }

    /// Whether events are built at all: history is on or the observer wants them.
    #[inline]
    pub(super) fn recording(&self) -> bool {
        self.observing || self.history.max_entries > 0
    }

    /// Records an event of a block or segment, if anyone wants it.
    #[inline]
    pub(super) fn record(
        &mut self,
        action: TraceAction,
        block: (usize, usize, usize),
        stream: StreamId,
        category: MemoryCategory,
    ) {
        if self.recording() {
            self.push_event(action, block, stream, category, 0);
        }
    }

    /// Builds an event and gives it to the history and the observer. `block`
    /// is (address, size, requested size).
    #[cold]
    #[inline(never)]
    pub(super) fn push_event(
        &mut self,
        action: TraceAction,
        (addr, size, requested_size): (usize, usize, usize),
        stream: StreamId,
        category: MemoryCategory,
        device_free: usize,
    ) {
        let entry = TraceEntry {
            action,
            addr,
            size,
            requested_size,
            stream,
            category,
            time_us: self.created.elapsed().as_micros() as u64,
            device_free,
            total_allocated: self.stats.allocated_bytes.all.current as usize,
            total_reserved: self.stats.reserved_bytes.all.current as usize,
        };
        if self.observing {
            self.notifications.push(entry.clone());
        }
        self.history.push(entry);
    }
}
