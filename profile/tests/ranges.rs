//! Ranges through the public API: nesting arithmetic on a manual clock, threads,
//! shapes, guards that outlive the profile, the one-profiler rule.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Barrier};

use brasa_profile::{
    enabled, record_function, record_function_with_shapes, record_op, ManualClock, ProfileError, Profiler, RangeKind,
};
use common::{exclusive, phase, validate_trace};

fn manual_profiler(clock: &ManualClock) -> Profiler {
    Profiler::builder().clock(Arc::new(clock.clone())).record_steps(false).start().expect("no other profiler running")
}

#[test]
fn nested_self_and_total_on_a_manual_clock() {
    let _lock = exclusive();
    let clock = ManualClock::new(1_000);
    let profiler = manual_profiler(&clock);
    {
        let _outer = record_function("outer"); // 1000
        clock.advance(100);
        {
            let _a = record_function("a"); // 1100
            clock.advance(50);
            {
                let _x = record_function("x"); // 1150..1170
                clock.advance(20);
            }
            clock.advance(30);
        } // a: 1100..1200
        clock.advance(10);
        {
            let _b = record_function(String::from("b")); // 1210..1250
            clock.advance(40);
        }
        clock.advance(5);
    } // outer: 1000..1255
    let result = profiler.stop();
    assert_eq!(result.start_ns, 1_000);
    let k = result.key_averages();
    let row = |name: &str| k.get(name).unwrap_or_else(|| panic!("row {name}"));
    assert_eq!((row("outer").cpu_total_ns, row("outer").self_cpu_ns), (255, 115));
    assert_eq!((row("a").cpu_total_ns, row("a").self_cpu_ns), (100, 80));
    assert_eq!((row("x").cpu_total_ns, row("x").self_cpu_ns), (20, 20));
    assert_eq!((row("b").cpu_total_ns, row("b").self_cpu_ns), (40, 40));
    assert_eq!(k.self_cpu_time_total_ns(), 255);

    let by_name: HashMap<&str, usize> = result.ranges.iter().enumerate().map(|(i, r)| (r.name.as_ref(), i)).collect();
    assert_eq!(result.ranges[by_name["x"]].parent, Some(by_name["a"]));
    assert_eq!(result.ranges[by_name["a"]].parent, Some(by_name["outer"]));
    assert_eq!(result.ranges[by_name["b"]].parent, Some(by_name["outer"]));
    assert_eq!(result.ranges[by_name["outer"]].parent, None);
    assert!(result.ranges.iter().all(|r| !r.truncated));
}

#[test]
fn nothing_is_recorded_when_off() {
    let _lock = exclusive();
    assert!(!enabled());
    let guard = record_function("ignored");
    assert!(!guard.is_recording());
    drop(guard);
    let clock = ManualClock::new(0);
    let profiler = manual_profiler(&clock);
    assert!(enabled());
    let result = profiler.stop();
    assert!(!enabled());
    assert!(result.ranges.is_empty(), "the range from before start is not in the profile");
}

#[test]
fn ranges_on_several_threads_land_on_their_own_tracks() {
    let _lock = exclusive();
    let profiler = Profiler::builder().record_steps(false).start().unwrap();
    let threads = 4;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let barrier = Arc::clone(&barrier);
            std::thread::Builder::new()
                .name(format!("worker-{i}"))
                .spawn(move || {
                    let _outer = record_function("worker");
                    barrier.wait(); // all four are open at once
                    for _ in 0..3 {
                        let _inner = record_function("inner");
                        std::hint::black_box((0..100u64).sum::<u64>());
                    }
                })
                .unwrap()
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let result = profiler.stop();
    let workers: Vec<_> = result.ranges.iter().filter(|r| r.name == "worker").collect();
    assert_eq!(workers.len(), threads);
    let tids: HashSet<u64> = workers.iter().map(|r| r.tid).collect();
    assert_eq!(tids.len(), threads, "one track per thread");
    // Every inner range's parent is its own thread's worker range.
    for r in result.ranges.iter().filter(|r| r.name == "inner") {
        let parent = &result.ranges[r.parent.expect("inner has a parent")];
        assert_eq!(parent.name, "worker");
        assert_eq!(parent.tid, r.tid);
    }
    // The four worker ranges overlap in time (they were open together).
    let latest_start = workers.iter().map(|r| r.start_ns).max().unwrap();
    let earliest_end = workers.iter().map(|r| r.end_ns).min().unwrap();
    assert!(latest_start <= earliest_end);
    let names: HashSet<String> = tids.iter().map(|&t| result.thread_name(t)).collect();
    for i in 0..threads {
        assert!(names.contains(&format!("worker-{i}")), "{names:?}");
    }
    assert_eq!(result.key_averages().get("inner").unwrap().count, 12);

    // In the trace, each thread is its own named track.
    let events = validate_trace(&result.chrome_trace_json());
    let thread_names: HashMap<u64, String> = phase(&events, "M")
        .into_iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| (e["tid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap().to_owned()))
        .collect();
    for e in phase(&events, "X").into_iter().filter(|e| e["name"] == "worker") {
        let tid = e["tid"].as_u64().unwrap();
        assert!(thread_names[&tid].starts_with("worker-"));
    }
}

#[test]
fn shapes_are_kept_only_when_asked() {
    let _lock = exclusive();
    let profiler = Profiler::builder().record_shapes(true).record_steps(false).start().unwrap();
    {
        let _m = record_op("matmul", &[&[2, 3], &[3, 4]]);
    }
    {
        let _m = record_function_with_shapes("matmul", &[&[8, 8], &[8, 8]]);
    }
    let result = profiler.stop();
    assert_eq!(result.ranges[0].kind, RangeKind::Op);
    assert_eq!(result.ranges[0].input_shapes, Some(vec![vec![2, 3], vec![3, 4]]));
    assert_eq!(result.key_averages().rows().len(), 1);
    assert_eq!(result.key_averages_by_input_shape().rows().len(), 2);
    let events = validate_trace(&result.chrome_trace_json());
    let op = phase(&events, "X").into_iter().find(|e| e["cat"] == "cpu_op").unwrap();
    assert_eq!(op["args"]["Input Shapes"], serde_json::json!([[2, 3], [3, 4]]));

    let profiler = Profiler::builder().record_steps(false).start().unwrap();
    {
        let _m = record_op("matmul", &[&[2, 3]]);
    }
    assert_eq!(profiler.stop().ranges[0].input_shapes, None);
}

#[test]
fn ranges_open_at_stop_are_cut_there_and_late_drops_are_harmless() {
    let _lock = exclusive();
    let clock = ManualClock::new(0);
    let profiler = manual_profiler(&clock);
    let outer = record_function("spans_the_stop");
    clock.advance(70);
    let result = profiler.stop();
    clock.advance(30);
    drop(outer); // after the profile ended: ignored, no panic
    assert_eq!(result.ranges.len(), 1);
    assert!(result.ranges[0].truncated);
    assert_eq!(result.ranges[0].duration_ns(), 70);
}

#[test]
fn guards_dropped_out_of_order_still_close() {
    let _lock = exclusive();
    let clock = ManualClock::new(0);
    let profiler = manual_profiler(&clock);
    let a = record_function("a");
    clock.advance(10);
    let b = record_function("b");
    clock.advance(10);
    drop(a); // a closes first (at 20)
    clock.advance(10);
    let c = record_function("c"); // parent is b, still open
    clock.advance(10);
    drop(c);
    drop(b);
    let result = profiler.stop();
    let get = |n: &str| result.ranges.iter().position(|r| r.name == n).unwrap();
    assert_eq!(result.ranges[get("a")].end_ns, 20);
    assert_eq!(result.ranges[get("c")].parent, Some(get("b")));
    assert!(result.ranges.iter().all(|r| !r.truncated));
}

#[test]
fn only_one_profiler_at_a_time_and_drop_releases() {
    let _lock = exclusive();
    let first = Profiler::start().unwrap();
    assert!(matches!(Profiler::start(), Err(ProfileError::AlreadyActive)));
    drop(first);
    assert!(!enabled(), "dropping a profiler turns recording off");
    let second = Profiler::start().unwrap();
    let _ = second.stop();
}

#[test]
fn step_ranges_are_named_by_step() {
    let _lock = exclusive();
    let clock = ManualClock::new(0);
    let mut profiler = Profiler::builder().clock(Arc::new(clock.clone())).start().unwrap();
    for _ in 0..3 {
        let _work = record_function("work");
        clock.advance(10);
        drop(_work);
        profiler.step();
    }
    let result = profiler.stop();
    let steps: Vec<&str> =
        result.ranges.iter().filter(|r| r.kind == RangeKind::ProfilerStep).map(|r| r.name.as_ref()).collect();
    assert_eq!(steps, ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]);
    for r in result.ranges.iter().filter(|r| r.name == "work") {
        let parent = &result.ranges[r.parent.unwrap()];
        assert!(parent.name.starts_with("ProfilerStep#"));
    }
}
