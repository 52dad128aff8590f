//! Times and schedules at the ends of their ranges: a manual clock near
//! `u64::MAX`, steps and schedule fields up to `u64::MAX`. Nothing wraps
//! (time never runs backwards), nothing panics.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use brasa_profile::{record_function, schedule, Clock, ManualClock, Profiler, ProfilerAction, Schedule, TableOptions};
use common::exclusive;

#[test]
fn a_manual_clock_saturates_instead_of_wrapping() {
    let clock = ManualClock::new(u64::MAX - 5);
    assert_eq!(clock.advance(10), u64::MAX);
    assert_eq!(clock.now_ns(), u64::MAX, "the clock ran backwards");
    assert_eq!(clock.advance(u64::MAX), u64::MAX);
    assert_eq!(clock.now_ns(), u64::MAX);
    let clock = ManualClock::new(0);
    assert_eq!(clock.advance(u64::MAX), u64::MAX);
    assert_eq!(clock.now_ns(), u64::MAX);
}

#[test]
fn a_profile_at_the_end_of_time_reports_without_panicking() {
    let _exclusive = exclusive();
    for start in [0, u64::MAX / 2, u64::MAX - 1_000, u64::MAX] {
        let clock = ManualClock::new(start);
        let profiler = Profiler::builder().clock(Arc::new(clock.clone()) as Arc<dyn Clock>).start().unwrap();
        {
            let _outer = record_function("outer");
            clock.advance(u64::MAX / 3);
            {
                let _inner = record_function("inner");
                clock.advance(u64::MAX / 3);
            }
            clock.advance(u64::MAX);
        }
        let result = profiler.stop();
        let times: Vec<u64> = result.ranges.iter().flat_map(|r| [r.start_ns, r.end_ns]).collect();
        assert!(times.iter().all(|&t| t >= start), "time ran backwards: {times:?}");
        let table = result.key_averages().table(&TableOptions::default());
        assert!(table.contains("outer"), "{table}");
        common::validate_trace(&result.chrome_trace_json());
    }
}

#[test]
fn schedules_at_the_extremes_never_panic() {
    let values = [0, 1, 2, u64::MAX / 2, u64::MAX - 1, u64::MAX];
    let steps = [0, 1, 2, 3, u64::MAX / 2, u64::MAX - 2, u64::MAX - 1, u64::MAX];
    for &wait in &values {
        for &warmup in &values {
            for &active in &values {
                for &repeat in &values {
                    for &skip_first in &values {
                        let built = schedule(wait, warmup, active, repeat, skip_first);
                        let hand = Schedule { wait, warmup, active, repeat, skip_first };
                        for s in built.iter().chain([&hand]) {
                            for &step in &steps {
                                let action = s.action(step);
                                if step < skip_first {
                                    assert_eq!(action, ProfilerAction::None);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
