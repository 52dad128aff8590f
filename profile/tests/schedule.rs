//! The profiler's schedule transitions, as PyTorch's `torch.profiler.profile`
//! drives them: which steps end up in which saved trace, and when
//! `on_trace_ready` fires.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use brasa_profile::{record_function, schedule, ProfileError, ProfileResult, Profiler, ProfilerAction};
use common::exclusive;
use ProfilerAction::{None as N, Record as R, RecordAndSave as S, Warmup as W};

/// A saved trace: the step it was saved at and the range names it held.
type Trace = (Option<u64>, BTreeSet<String>);
type Saved = Arc<Mutex<Vec<Trace>>>;

fn names(result: &ProfileResult) -> BTreeSet<String> {
    result.ranges.iter().map(|r| r.name.to_string()).collect()
}

/// Runs `steps` steps, each with a `work<step>` range; returns the actions seen
/// at each step, what each saved trace held, and the result of `stop`.
fn drive(
    wait: u64,
    warmup: u64,
    active: u64,
    repeat: u64,
    skip_first: u64,
    steps: u64,
) -> (Vec<ProfilerAction>, Vec<Trace>, ProfileResult) {
    let saved: Saved = Arc::default();
    let sink = Arc::clone(&saved);
    let mut profiler = Profiler::builder()
        .schedule(schedule(wait, warmup, active, repeat, skip_first).unwrap())
        .on_trace_ready(move |r| sink.lock().unwrap().push((r.step, names(r))))
        .start()
        .unwrap();
    let mut actions = Vec::new();
    for step in 0..steps {
        assert_eq!(profiler.step_num(), step);
        actions.push(profiler.current_action());
        {
            let _work = record_function(format!("work{step}"));
        }
        profiler.step();
    }
    let last = profiler.stop();
    let saved = saved.lock().unwrap().clone();
    (actions, saved, last)
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn wait_warmup_active_repeat_skip_first() {
    let _lock = exclusive();
    let (actions, saved, _) = drive(1, 1, 2, 2, 1, 12);
    assert_eq!(actions, [N, N, W, R, S, N, W, R, S, N, N, N]);
    assert_eq!(saved.len(), 2);
    assert_eq!(saved[0].0, Some(5), "saved when step 4 ended");
    assert_eq!(
        saved[0].1,
        set(&["ProfilerStep#3", "ProfilerStep#4", "work3", "work4"]),
        "warm-up (step 2) is discarded, waiting steps are not recorded"
    );
    assert_eq!(saved[1].1, set(&["ProfilerStep#7", "ProfilerStep#8", "work7", "work8"]));
}

#[test]
fn cycles_forever_without_repeat() {
    let _lock = exclusive();
    let (actions, saved, _) = drive(0, 0, 1, 0, 0, 4);
    assert_eq!(actions, [S, S, S, S]);
    // Every step is its own trace; as in PyTorch, the loop's last `step()` entered
    // step 4 (RECORD_AND_SAVE too), which `stop` saves as a fifth trace.
    assert_eq!(saved.len(), 5);
    for (i, (_, names)) in saved.iter().take(4).enumerate() {
        assert_eq!(*names, set(&[&format!("ProfilerStep#{i}"), &format!("work{i}")]));
    }
    assert_eq!(saved[4].1, set(&["ProfilerStep#4"]));
}

#[test]
fn back_to_back_active_cycles_save_each() {
    let _lock = exclusive();
    let (actions, saved, _) = drive(0, 0, 2, 0, 0, 6);
    assert_eq!(actions, [R, S, R, S, R, S]);
    assert_eq!(saved.len(), 4, "three cycles, plus step 6 (RECORD) saved at stop");
    assert_eq!(saved[3].1, set(&["ProfilerStep#6"]));
    assert_eq!(saved[1].1, set(&["ProfilerStep#2", "ProfilerStep#3", "work2", "work3"]));
}

#[test]
fn stop_while_recording_saves_the_partial_cycle() {
    let _lock = exclusive();
    // Steps 0 (wait) and 1 (record) run; stop comes during step 2 (RECORD).
    let (actions, saved, last) = drive(1, 0, 3, 0, 0, 2);
    assert_eq!(actions, [N, R]);
    assert_eq!(saved.len(), 1, "stop in RECORD fires on_trace_ready");
    assert_eq!(saved[0].1, set(&["ProfilerStep#1", "ProfilerStep#2", "work1"]));
    assert_eq!(names(&last), saved[0].1, "stop returns the same trace");
}

#[test]
fn stop_while_warming_up_saves_nothing_and_warns() {
    let _lock = exclusive();
    let (actions, saved, last) = drive(0, 5, 1, 0, 0, 2);
    assert_eq!(actions, [W, W]);
    assert!(saved.is_empty());
    assert!(last.ranges.is_empty());
    assert!(last.warnings.iter().any(|w| w.contains("WARMUP")), "{:?}", last.warnings);
}

#[test]
fn stop_while_waiting_returns_last_saved_trace() {
    let _lock = exclusive();
    let (_, saved, last) = drive(0, 0, 1, 1, 0, 4);
    assert_eq!(saved.len(), 1);
    assert_eq!(names(&last), saved[0].1);
}

#[test]
fn without_a_schedule_everything_is_one_trace() {
    let _lock = exclusive();
    let calls = Arc::new(Mutex::new(0));
    let counter = Arc::clone(&calls);
    let mut profiler = Profiler::builder().on_trace_ready(move |_| *counter.lock().unwrap() += 1).start().unwrap();
    for step in 0..3 {
        assert_eq!(profiler.current_action(), R);
        let _w = record_function(format!("work{step}"));
        drop(_w);
        profiler.step();
    }
    assert_eq!(*calls.lock().unwrap(), 0, "nothing saved before stop");
    let result = profiler.stop();
    assert_eq!(*calls.lock().unwrap(), 1);
    assert_eq!(result.key_averages().rows().len(), 7, "4 steps + 3 works");
}

#[test]
fn schedule_rejects_zero_active() {
    let error = schedule(1, 1, 0, 1, 0).unwrap_err();
    assert!(matches!(&error, ProfileError::InvalidSchedule(message) if message.contains("active")), "{error:?}");
}
