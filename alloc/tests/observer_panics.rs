//! An observer is user code: when it panics, the allocation it observed
//! still reaches its caller (nothing stays allocated or reserved), a free in
//! a `Drop` does not abort the process, and the observer is disabled.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_alloc::{AllocObserver, CachingAllocator, FailingBackend, StreamId, TraceEntry};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const MIB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

/// Panics on its `n`-th event (counting from 1), then would count the rest.
struct Tripwire {
    n: usize,
    seen: AtomicUsize,
}

impl AllocObserver for Tripwire {
    fn on_event(&self, _entry: &TraceEntry) {
        if self.seen.fetch_add(1, Ordering::SeqCst) + 1 == self.n {
            panic!("observer bug");
        }
    }
}

#[test]
fn a_panicking_observer_loses_no_memory_and_is_disabled() {
    let backend = FailingBackend::new(64 * MIB);
    let alloc = CachingAllocator::new(backend.clone());
    let observer = Arc::new(Tripwire { n: 1, seen: AtomicUsize::new(0) });
    alloc.set_observer(Some(observer.clone()));
    // The first event (the segment) panics in the observer: the block is
    // still handed out.
    let block = alloc.allocate(1000, S0).expect("the allocation survives the observer's panic");
    assert!(alloc.allocated_bytes() >= 1000);
    drop(block);
    assert_eq!(alloc.allocated_bytes(), 0);
    alloc.empty_cache();
    assert_eq!(alloc.reserved_bytes(), 0);
    assert_eq!(backend.bytes_in_use(), 0, "nothing stays reserved");
    // Disabled after its panic: it saw the one event it panicked on.
    assert_eq!(observer.seen.load(Ordering::SeqCst), 1);
}

#[test]
fn a_free_observed_while_unwinding_does_not_abort() {
    let alloc = CachingAllocator::new(FailingBackend::new(64 * MIB));
    let block = alloc.allocate(1000, S0).unwrap();
    // Its next event is the free: it panics there, inside the block's drop.
    alloc.set_observer(Some(Arc::new(Tripwire { n: 1, seen: AtomicUsize::new(0) })));
    let outcome = catch_unwind(AssertUnwindSafe(move || {
        let _block = block;
        panic!("the training step failed");
    }));
    assert!(outcome.is_err());
    assert_eq!(alloc.allocated_bytes(), 0);
}

#[test]
fn an_observer_whose_drop_panics_is_replaced_quietly() {
    struct Grenade;
    impl AllocObserver for Grenade {
        fn on_event(&self, _entry: &TraceEntry) {}
    }
    impl Drop for Grenade {
        fn drop(&mut self) {
            panic!("observer drop");
        }
    }
    let alloc = CachingAllocator::new(FailingBackend::new(64 * MIB));
    alloc.set_observer(Some(Arc::new(Grenade)));
    alloc.set_observer(None);
    drop(alloc.allocate(10, S0).unwrap());
    assert_eq!(alloc.allocated_bytes(), 0);
}

#[test]
fn a_panicking_enabled_counts_as_disabled() {
    struct Moody;
    impl AllocObserver for Moody {
        fn enabled(&self) -> bool {
            panic!("enabled bug");
        }
        fn on_event(&self, _entry: &TraceEntry) {}
    }
    let alloc = CachingAllocator::new(FailingBackend::new(64 * MIB));
    alloc.set_observer(Some(Arc::new(Moody)));
    let block = alloc.allocate(1000, S0).unwrap();
    drop(block);
    assert_eq!(alloc.allocated_bytes(), 0);
}
