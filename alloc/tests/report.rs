//! Statistics resets, the summary table, snapshots and history as JSON.

use brasa_alloc::{AllocError, CachingAllocator, HostBackend, StreamId, TraceAction};

const MIB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

#[test]
fn reset_peak_sets_peak_to_current() {
    let alloc = CachingAllocator::new(HostBackend::new());
    let a = alloc.allocate(5 * MIB, S0).unwrap();
    drop(alloc.allocate(9 * MIB, S0).unwrap());
    assert_eq!(alloc.stats().allocated_bytes.all.peak, 14 * MIB as i64);
    alloc.reset_peak();
    let stats = alloc.stats();
    assert_eq!(stats.allocated_bytes.all.peak, 5 * MIB as i64);
    assert_eq!(stats.reserved_bytes.all.peak, stats.reserved_bytes.all.current);
    alloc.reset_accumulated();
    let stats = alloc.stats();
    assert_eq!(stats.allocation.all.allocated, 0);
    assert_eq!(stats.allocation.all.current, 1);
    assert_eq!(stats.num_device_alloc, 0);
    drop(a);
}

#[test]
fn summary_shows_the_current_figures() {
    let alloc = CachingAllocator::new(HostBackend::new());
    let _a = alloc.allocate(3 * MIB, S0).unwrap();
    let text = alloc.summary();
    assert!(text.contains("brasa memory summary, device cpu:0"), "{text}");
    let allocated_row = text.lines().find(|l| l.contains("Allocated memory")).unwrap();
    assert!(allocated_row.contains("3072 KiB"), "{allocated_row}");
    let reserved_row = text.lines().find(|l| l.contains("Device reserved memory")).unwrap();
    assert!(reserved_row.contains("20480 KiB"), "{reserved_row}");
}

#[test]
fn snapshot_and_history_serialize_to_documented_json() {
    let alloc = CachingAllocator::new(HostBackend::new());
    alloc.record_history(3);
    let a = alloc.allocate(1000, S0).unwrap();
    let b = alloc.allocate(2000, S0).unwrap();
    drop(a);
    let snapshot = alloc.snapshot();
    let json: serde_json::Value = serde_json::from_str(&snapshot.to_json()).unwrap();
    let segment = &json["segments"][0];
    assert_eq!(segment["total_size"], 2 * MIB);
    assert_eq!(segment["segment_type"], "small");
    assert_eq!(segment["allocated_size"], 2048);
    assert_eq!(segment["requested_size"], 2000);
    let states: Vec<&str> =
        segment["blocks"].as_array().unwrap().iter().map(|b| b["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["inactive", "active_allocated", "inactive"]);
    // The ring buffer keeps the last three events.
    let actions: Vec<&str> =
        json["device_traces"].as_array().unwrap().iter().map(|e| e["action"].as_str().unwrap()).collect();
    assert_eq!(actions, ["alloc", "free_requested", "free_completed"]);
    let history = alloc.history();
    assert_eq!(history[0].action, TraceAction::Alloc);
    assert_eq!(history[0].requested_size, 2000);
    assert!(history.windows(2).all(|w| w[0].time_us <= w[1].time_us));
    alloc.record_history(0);
    assert!(alloc.history().is_empty());
    drop(b);
}

#[test]
fn stats_serialize_with_pytorch_names() {
    let alloc = CachingAllocator::new(HostBackend::new());
    let _a = alloc.allocate(1000, S0).unwrap();
    let json: serde_json::Value = serde_json::from_str(&alloc.stats().to_json()).unwrap();
    assert_eq!(json["allocated_bytes"]["all"]["current"], 1024);
    assert_eq!(json["reserved_bytes"]["small_pool"]["peak"], 2 * MIB);
    assert_eq!(json["num_ooms"], 0);
}

#[test]
fn config_comes_from_the_environment_variable() {
    // The only test in this binary that touches the variable.
    std::env::set_var("BRASA_ALLOC_CONF", "max_split_size_mb:64");
    let alloc = CachingAllocator::from_env(HostBackend::new()).unwrap();
    assert_eq!(alloc.config().max_split_size, 64 * MIB);
    std::env::set_var("BRASA_ALLOC_CONF", "max_split:64");
    let error = CachingAllocator::from_env(HostBackend::new()).err().unwrap();
    assert!(matches!(error, AllocError::Config(_)), "{error:?}");
    // A `ConfigError` is words only: they name the variable and the valid keys.
    let error = error.to_string();
    assert!(error.contains("BRASA_ALLOC_CONF") && error.contains("valid keys"), "{error}");
    std::env::remove_var("BRASA_ALLOC_CONF");
}
