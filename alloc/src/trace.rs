//! Allocator events: the opt-in bounded history and the observer hook.
//!
//! Every event of a block carries the block's [`MemoryCategory`], so a
//! consumer can keep allocated bytes per category from the events alone:
//! add `size` to `category` on [`TraceAction::Alloc`], subtract it on
//! [`TraceAction::FreeRequested`], and on [`TraceAction::Retag`] move it
//! from `from` to `category`. Those totals equal the allocator's
//! [`MemoryStats::by_category`](crate::MemoryStats::by_category) `current`
//! values after the same events.
//!
//! ```
//! use brasa_alloc::{CachingAllocator, HostBackend, MemoryCategory, StreamId, TraceAction};
//! use std::collections::HashMap;
//!
//! let alloc = CachingAllocator::new(HostBackend::new());
//! alloc.record_history(100);
//! let a = alloc.allocate_as(4096, StreamId::DEFAULT, MemoryCategory::Activation)?;
//! let b = alloc.allocate_as(512, StreamId::DEFAULT, MemoryCategory::Parameter)?;
//! a.set_category(MemoryCategory::Temporary);
//! drop(b);
//! let mut totals: HashMap<MemoryCategory, i64> = HashMap::new();
//! for entry in alloc.history() {
//!     let size = entry.size as i64;
//!     match entry.action {
//!         TraceAction::Alloc => *totals.entry(entry.category).or_default() += size,
//!         TraceAction::FreeRequested => *totals.entry(entry.category).or_default() -= size,
//!         TraceAction::Retag { from } => {
//!             *totals.entry(from).or_default() -= size;
//!             *totals.entry(entry.category).or_default() += size;
//!         }
//!         _ => {}
//!     }
//! }
//! let stats = alloc.stats();
//! for category in MemoryCategory::ALL {
//!     let replayed = totals.get(&category).copied().unwrap_or(0);
//!     assert_eq!(replayed, stats.by_category.get(category).current);
//! }
//! assert_eq!(totals[&MemoryCategory::Temporary], 4096);
//! # Ok::<(), brasa_alloc::AllocError>(())
//! ```

use crate::backend::StreamId;
use crate::category::MemoryCategory;
use serde::Serialize;
use std::any::Any;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What happened. Serialized in snake_case (`"free_requested"`); a retag as
/// `{"retag": {"from": "activation"}}`. More kinds may come: match with a
/// wildcard arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
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
    /// A freed block was quarantined: the device could not be synchronised
    /// with the streams that used it, so it is never reused.
    Quarantine,
    /// A live block changed category ([`Allocation::set_category`](crate::Allocation::set_category)):
    /// its `size` bytes moved from `from` to the entry's `category`.
    Retag {
        /// The category the block had before.
        from: MemoryCategory,
    },
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
    /// What the block holds: for `alloc`, `free_requested`, `free_completed`
    /// and `quarantine`, the block's category; for `retag`, the new one. For
    /// `segment_alloc`, `segment_map` and `oom`, the category of the request
    /// that caused them; [`MemoryCategory::Other`] for `segment_free` and
    /// `segment_unmap`.
    pub category: MemoryCategory,
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

/// The observer as the allocator holds it: a panic in the user's `enabled`,
/// `on_event` or `Drop` is caught at this boundary, so it can neither take
/// an allocation's result with it (the block would stay allocated and
/// reserved for good) nor escape a free running in a `Drop` (a second panic
/// during unwinding aborts the process). An observer that panicked is
/// disabled for good, and the panic is reported once on stderr.
pub(crate) struct GuardedObserver {
    /// `None` only while it is dropped.
    inner: Option<Observer>,
    failed: AtomicBool,
}

/// Wraps `observer` for the allocator (see [`GuardedObserver`]).
pub(crate) fn guard_observer(observer: Observer) -> Observer {
    Arc::new(GuardedObserver { inner: Some(observer), failed: AtomicBool::new(false) })
}

impl GuardedObserver {
    fn fail(&self, during: &str, payload: Box<dyn Any + Send>) {
        let message = panic_message(&*payload);
        // A payload whose own drop panics must not escape either.
        let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
        if !self.failed.swap(true, Ordering::Relaxed) {
            eprintln!("brasa-alloc: the allocator observer panicked in {during} ({message}); it is disabled");
        }
    }
}

impl AllocObserver for GuardedObserver {
    fn enabled(&self) -> bool {
        if self.failed.load(Ordering::Relaxed) {
            return false;
        }
        match catch_unwind(AssertUnwindSafe(|| self.inner.as_ref().is_some_and(|o| o.enabled()))) {
            Ok(enabled) => enabled,
            Err(payload) => {
                self.fail("enabled", payload);
                false
            }
        }
    }

    fn on_event(&self, entry: &TraceEntry) {
        if self.failed.load(Ordering::Relaxed) {
            return;
        }
        let Some(inner) = &self.inner else { return };
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| inner.on_event(entry))) {
            self.fail("on_event", payload);
        }
    }
}

impl Drop for GuardedObserver {
    fn drop(&mut self) {
        let inner = self.inner.take();
        if let Err(payload) = catch_unwind(AssertUnwindSafe(move || drop(inner))) {
            self.fail("drop", payload);
        }
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "no message".to_string()
    }
}

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
