//! User code the profiler calls — the `on_trace_ready` callback, a clock —
//! may panic; the panic never escapes a drop (which would abort the
//! process), never leaves recording on, and a panicking callback is
//! disabled and reported.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use brasa_profile::{enabled, record_function, schedule, Clock, HostClock, Profiler};
use common::exclusive;

#[test]
fn a_panicking_trace_ready_callback_is_caught_disabled_and_reported() {
    let _one = exclusive();
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&calls);
    let mut profiler = Profiler::builder()
        .schedule(schedule(0, 0, 1, 0, 0).unwrap())
        .on_trace_ready(move |_| {
            seen.fetch_add(1, Ordering::SeqCst);
            panic!("exporter failed");
        })
        .start()
        .unwrap();
    for step in 0..3 {
        drop(record_function("work"));
        profiler.step(); // every step saves a trace
        if step == 0 {
            // The trace the callback panicked on says so.
            let warnings = profiler.last_result().map(|r| r.warnings.clone()).unwrap_or_default();
            assert!(warnings.iter().any(|w| w.contains("on_trace_ready panicked (exporter failed)")), "{warnings:?}");
        }
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "disabled after its panic");
    assert_eq!(profiler.traces_saved(), 3);
    assert_eq!(profiler.trace_ready_panic(), Some("exporter failed"));
    drop(profiler.stop());
    assert!(!enabled(), "recording is off after stop");
}

#[test]
fn dropping_a_profiler_while_unwinding_does_not_abort() {
    let _one = exclusive();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let _profiler = Profiler::builder().on_trace_ready(|_| panic!("callback panics in drop")).start().unwrap();
        let _range = record_function("doomed");
        panic!("the training loop failed");
    }));
    let payload = outcome.unwrap_err();
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"the training loop failed"));
    // The process is alive, recording is off and a new profiler can start.
    assert!(!enabled());
    let again = Profiler::start().expect("the first profiler was released");
    drop(again.stop());
}

/// A clock that panics once `armed` is set.
struct TrapClock {
    armed: AtomicBool,
}

impl Clock for TrapClock {
    fn now_ns(&self) -> u64 {
        if self.armed.load(Ordering::SeqCst) {
            panic!("clock failure");
        }
        HostClock.now_ns()
    }
}

#[test]
fn a_panicking_clock_in_drops_neither_aborts_nor_leaves_recording_on() {
    let _one = exclusive();
    let clock = Arc::new(TrapClock { armed: AtomicBool::new(false) });
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let _profiler = Profiler::builder().clock(Arc::clone(&clock) as Arc<dyn Clock>).start().unwrap();
        let _range = record_function("doomed");
        clock.armed.store(true, Ordering::SeqCst);
        panic!("the training loop failed");
    }));
    assert!(outcome.is_err());
    assert!(!enabled());
    drop(Profiler::start().expect("released").stop());
}
