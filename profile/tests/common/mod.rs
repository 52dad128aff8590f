//! Helpers shared by the integration tests.

// Test helpers: a failed unwrap or a panic here fails the calling test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use serde_json::Value;

/// Recording is process-wide: tests that start a profiler take this lock first.
pub fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Checks `json` against the Trace Event Format as Chrome and Perfetto read it;
/// returns the parsed events.
pub fn validate_trace(json: &str) -> Vec<Value> {
    let root: Value = serde_json::from_str(json).expect("trace is valid JSON");
    assert!(root.is_object(), "object form");
    assert_eq!(root["displayTimeUnit"], "ms");
    assert!(root["baseTimeNanoseconds"].is_u64());
    let events = root["traceEvents"].as_array().expect("traceEvents array").clone();
    let mut counter_last: HashMap<(u64, String), f64> = HashMap::new();
    let mut flow_starts: HashMap<u64, f64> = HashMap::new();
    let mut flow_ends: HashMap<u64, f64> = HashMap::new();
    for e in &events {
        let name = e["name"].as_str().unwrap_or_else(|| panic!("name: {e}"));
        let ph = e["ph"].as_str().unwrap_or_else(|| panic!("ph: {e}"));
        let ts = e["ts"].as_f64().unwrap_or_else(|| panic!("ts: {e}"));
        assert!(ts >= 0.0, "ts >= 0: {e}");
        let scaled = ts * 1000.0;
        assert!((scaled - scaled.round()).abs() < 1e-3, "µs with at most 3 decimals: {e}");
        let pid = e["pid"].as_u64().unwrap_or_else(|| panic!("pid: {e}"));
        assert!(e["tid"].is_u64(), "tid: {e}");
        match ph {
            "X" => {
                let dur = e["dur"].as_f64().unwrap_or_else(|| panic!("dur: {e}"));
                assert!(dur >= 0.0, "dur >= 0: {e}");
                assert!(e["cat"].is_string());
            }
            "M" => {
                assert!(
                    ["process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"]
                        .contains(&name),
                    "metadata name {name}"
                );
                assert!(e["args"].is_object());
            }
            "C" => {
                let args = e["args"].as_object().expect("counter args");
                assert!(args.values().all(Value::is_number), "counter values: {e}");
                let last = counter_last.entry((pid, name.to_owned())).or_insert(f64::MIN);
                assert!(ts >= *last, "counter track {name} goes back in time: {e}");
                *last = ts;
            }
            "i" => assert!(["t", "p", "g"].contains(&e["s"].as_str().unwrap_or("t"))),
            "s" => {
                flow_starts.insert(e["id"].as_u64().expect("flow id"), ts);
            }
            "f" => {
                flow_ends.insert(e["id"].as_u64().expect("flow id"), ts);
            }
            other => panic!("unexpected phase {other}: {e}"),
        }
    }
    assert_eq!(
        flow_starts.keys().collect::<std::collections::BTreeSet<_>>(),
        flow_ends.keys().collect::<std::collections::BTreeSet<_>>(),
        "every flow start has an end"
    );
    for (id, start) in &flow_starts {
        assert!(flow_ends[id] >= *start, "flow {id} ends before it starts");
    }
    events
}

/// The events with phase `ph`.
pub fn phase<'a>(events: &'a [Value], ph: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["ph"] == ph).collect()
}
