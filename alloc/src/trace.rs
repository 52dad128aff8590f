//! Allocator events: the opt-in bounded history and the observer hook.

use crate::backend::StreamId;
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::Arc;

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceAction {
    /// A block was handed out.
    Alloc,
    /// The caller dropped a block (it may still wait on stream events).
    FreeRequested,
    /// The block went back to its pool.
    FreeCompleted,
    /// A segment was obtained from the backend.
    SegmentAlloc,
    /// A segment was returned to the backend.
    SegmentFree,
    /// Pages were mapped into an expandable segment.
    SegmentMap,
    /// Pages of an expandable segment were unmapped.
    SegmentUnmap,
    /// An allocation failed.
    Oom,
}

/// One allocator event (PyTorch's `TraceEntry`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TraceEntry {
    /// The kind of event.
    pub action: TraceAction,
    /// Block or segment address (0 for `oom`).
    pub addr: usize,
    /// Bytes: the block's or segment's size (the request's rounded size for `oom`).
    pub size: usize,
    /// Bytes the caller asked for (allocations only; else equal to `size`).
    pub requested_size: usize,
    /// The stream the block belongs to.
    pub stream: StreamId,
    /// Microseconds since the allocator was created.
    pub time_us: u64,
    /// For `oom`: bytes the device reported free.
    pub device_free: usize,
    /// Bytes allocated after the event.
    pub total_allocated: usize,
    /// Bytes reserved after the event.
    pub total_reserved: usize,
}

/// Receives allocator events; upper crates (the profiler) register one to
/// forward them. Any `Fn(&TraceEntry) + Send + Sync` closure is an observer
/// that is always on.
pub trait AllocObserver: Send + Sync {
    /// Whether events are wanted now. Checked on every allocation and free
    /// before an event is even built, so it must be cheap (an atomic load):
    /// while it says no, an installed observer costs next to nothing.
    fn enabled(&self) -> bool {
        true
    }

    /// Called with each event after the allocator's lock is released, on the
    /// thread that caused it.
    fn on_event(&self, entry: &TraceEntry);
}

impl<F: Fn(&TraceEntry) + Send + Sync> AllocObserver for F {
    fn on_event(&self, entry: &TraceEntry) {
        self(entry)
    }
}

/// A shared observer, as [`CachingAllocator::set_observer`](crate::CachingAllocator::set_observer) takes it.
pub type Observer = Arc<dyn AllocObserver>;

/// A ring buffer of the most recent events.
#[derive(Debug, Default)]
pub(crate) struct History {
    pub entries: VecDeque<TraceEntry>,
    pub max_entries: usize,
}

impl History {
    pub fn push(&mut self, entry: TraceEntry) {
        if self.max_entries == 0 {
            return;
        }
        if self.entries.len() == self.max_entries {
            self.entries.pop_front();
        }
        self.entries.push_back(entry);
    }
}
