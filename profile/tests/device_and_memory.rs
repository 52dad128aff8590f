//! Device intervals from markers resolved after the profile, memory events
//! attributed to ranges, and how both show in the table and the trace.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use brasa_profile::{
    device_span, enabled, record_function, record_memory_event, record_op, DeviceId, DeviceTimer, HostTimer,
    ManualClock, Marker, MemoryEvent, ProfileError, Profiler, SortBy, TableOptions,
};
use common::{exclusive, phase, validate_trace};

/// An asynchronous device queue: markers are enqueued with no time; the test
/// "runs" the queue later by completing them. Resolving an incomplete marker is
/// an error, like `cudaErrorNotReady`.
#[derive(Default)]
struct FakeQueue {
    completed: Mutex<HashMap<u64, u64>>,
    next: AtomicUsize,
    resolved: AtomicUsize,
    resolved_while_recording: AtomicBool,
    released: AtomicUsize,
}

impl FakeQueue {
    fn complete(&self, marker: u64, device_ns: u64) {
        self.completed.lock().unwrap().insert(marker, device_ns);
    }
}

impl DeviceTimer for FakeQueue {
    fn device(&self) -> DeviceId {
        DeviceId::cuda(0)
    }
    fn current_queue(&self) -> u32 {
        7
    }
    fn record_marker(&self) -> Result<Marker, ProfileError> {
        Ok(Marker(self.next.fetch_add(1, Ordering::SeqCst) as u64))
    }
    fn elapsed_ns(&self, from: Marker, to: Marker) -> Result<u64, ProfileError> {
        self.resolved.fetch_add(1, Ordering::SeqCst);
        if enabled() {
            self.resolved_while_recording.store(true, Ordering::SeqCst);
        }
        let done = self.completed.lock().unwrap();
        match (done.get(&from.0), done.get(&to.0)) {
            (Some(a), Some(b)) => Ok(b.saturating_sub(*a)),
            _ => Err(ProfileError::Device { device: "cuda:0".into(), message: "marker not ready".into() }),
        }
    }
    fn release_marker(&self, _marker: Marker) {
        self.released.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn device_time_is_resolved_after_the_profile_and_attributed_to_ops() {
    let _lock = exclusive();
    let host = ManualClock::new(1_000);
    let queue = Arc::new(FakeQueue::default());
    let timer: Arc<dyn DeviceTimer> = queue.clone();
    let profiler = Profiler::builder()
        .clock(Arc::new(host.clone()))
        .device_timer(Arc::clone(&timer)) // origin marker 0, at host 1000
        .record_steps(false)
        .start()
        .unwrap();
    {
        let _step = record_function("step");
        {
            let _mm = record_op("matmul", &[]);
            host.advance(5);
            let gemm = device_span(&timer, "gemm_kernel"); // markers 1, 2; launched at 1005
            host.advance(5);
            drop(gemm);
            host.advance(10);
        }
        {
            let _relu = record_op("relu", &[]);
            host.advance(2);
            let _k = device_span(&timer, "relu_kernel"); // markers 3, 4
            host.advance(2);
        }
        {
            let _lost = record_op("lost", &[]);
            let _k = device_span(&timer, "never_finishes"); // markers 5, 6
        }
    }
    host.advance(1);
    assert_eq!(queue.resolved.load(Ordering::SeqCst), 0, "nothing resolved while timing");
    // The device runs the work later than the host launched it.
    for (marker, t) in [(0, 50_000), (1, 50_300), (2, 50_800), (3, 50_800), (4, 50_900)] {
        queue.complete(marker, t);
    }
    let result = profiler.stop();
    assert!(queue.resolved.load(Ordering::SeqCst) > 0);
    assert!(!queue.resolved_while_recording.load(Ordering::SeqCst));
    assert_eq!(queue.released.load(Ordering::SeqCst), 7, "every marker handed back");

    assert_eq!(result.device_intervals.len(), 2, "the unfinished one is dropped");
    assert!(result.warnings.iter().any(|w| w.contains("never_finishes")));
    let gemm = &result.device_intervals[0];
    assert_eq!((gemm.start_ns, gemm.end_ns, gemm.launch_ns), (1_300, 1_800, 1_005));
    assert_eq!(gemm.queue, 7);

    let k = result.key_averages();
    let row = |n: &str| k.get(n).unwrap().clone();
    assert_eq!((row("matmul").self_device_ns, row("matmul").device_total_ns), (500, 500));
    assert_eq!((row("relu").self_device_ns, row("relu").device_total_ns), (100, 100));
    assert_eq!((row("step").self_device_ns, row("step").device_total_ns), (0, 600));
    let table = k.table(&TableOptions::default().sort_by(SortBy::DeviceTotal));
    assert!(table.contains("Self Device"), "{table}");
    assert!(table.contains("Device total"));
    assert!(table.contains("Self Device time total: 0.600us"), "{table}");
    let first_row = table.lines().nth(3).unwrap();
    assert!(first_row.trim_start().starts_with("step"), "sorted by device total: {first_row}");

    let events = validate_trace(&result.chrome_trace_json());
    let kernels: Vec<_> = phase(&events, "X").into_iter().filter(|e| e["cat"] == "kernel").collect();
    assert_eq!(kernels.len(), 2);
    let gemm_event = kernels.iter().find(|e| e["name"] == "gemm_kernel").unwrap();
    assert_eq!(gemm_event["ts"].as_f64(), Some(0.3));
    assert_eq!(gemm_event["dur"].as_f64(), Some(0.5));
    assert_eq!(gemm_event["tid"].as_u64(), Some(7));
    let device_pid = gemm_event["pid"].as_u64().unwrap();
    assert_ne!(device_pid, u64::from(result.process_id));
    let named = phase(&events, "M")
        .into_iter()
        .any(|e| e["name"] == "process_name" && e["pid"] == device_pid && e["args"]["name"] == "cuda:0");
    assert!(named, "the device process is named");
    let starts = phase(&events, "s");
    let ends = phase(&events, "f");
    assert_eq!((starts.len(), ends.len()), (2, 2), "one arrow per launched kernel");
    let start = starts.iter().find(|e| e["id"] == gemm_event["args"]["correlation"]).unwrap();
    assert_eq!(start["ts"].as_f64(), Some(0.005), "the arrow starts at the launch");
    assert_eq!(start["pid"].as_u64(), Some(u64::from(result.process_id)));
}

#[test]
fn host_timer_times_host_work() {
    let _lock = exclusive();
    let clock = ManualClock::new(0);
    let timer: Arc<dyn DeviceTimer> = Arc::new(HostTimer::new(DeviceId::cpu(1), Arc::new(clock.clone())));
    let profiler = Profiler::builder().clock(Arc::new(clock.clone())).record_steps(false).start().unwrap();
    {
        let _op = record_op("add", &[]);
        let _k = device_span(&timer, "add_kernel"); // timer registered on first use
        clock.advance(250);
    }
    let result = profiler.stop();
    assert_eq!(result.device_intervals.len(), 1);
    assert_eq!(result.device_intervals[0].device, DeviceId::cpu(1));
    assert_eq!(result.device_intervals[0].duration_ns(), 250);
    assert_eq!(result.key_averages().get("add").unwrap().self_device_ns, 250);
}

#[test]
fn memory_events_go_to_the_innermost_range() {
    let _lock = exclusive();
    let clock = ManualClock::new(0);
    let dev = DeviceId::cuda(0);
    let profiler =
        Profiler::builder().clock(Arc::new(clock.clone())).profile_memory(true).record_steps(false).start().unwrap();
    record_memory_event(MemoryEvent::alloc(dev, 0x100, 1024, 1024, 2 << 20)); // outside any range
    clock.advance(10);
    {
        let _fwd = record_function("forward");
        clock.advance(10);
        {
            let _mm = record_op("matmul", &[]);
            record_memory_event(MemoryEvent::alloc(dev, 0x200, 4096, 5120, 2 << 20));
            clock.advance(10);
        }
        record_memory_event(MemoryEvent::free(dev, 0x100, 1024, 4096, 2 << 20));
        clock.advance(10);
        record_memory_event(MemoryEvent::alloc(DeviceId::cpu(0), 0x300, 64, 64, 64));
    }
    let result = profiler.stop();
    assert_eq!(result.memory.len(), 4);
    let name_of = |i: Option<usize>| i.map(|i| result.ranges[i].name.to_string());
    assert_eq!(name_of(result.memory[0].range), None);
    assert_eq!(name_of(result.memory[1].range).as_deref(), Some("matmul"));
    assert_eq!(name_of(result.memory[2].range).as_deref(), Some("forward"));

    let k = result.key_averages();
    let mm = k.get("matmul").unwrap();
    assert_eq!((mm.self_mem_bytes, mm.mem_bytes), (4096, 4096));
    let fwd = k.get("forward").unwrap();
    assert_eq!((fwd.self_mem_bytes, fwd.mem_bytes), (-1024 + 64, 4096 - 1024 + 64));
    let table = k.table(&TableOptions::default().sort_by(SortBy::Mem));
    assert!(table.contains("Self Mem") && table.contains("4.00 Kb"), "{table}");

    let events = validate_trace(&result.chrome_trace_json());
    let instants = phase(&events, "i");
    assert_eq!(instants.len(), 4);
    assert_eq!(instants[1]["args"]["Bytes"], 4096);
    assert_eq!(instants[1]["args"]["Op"], "matmul");
    assert_eq!(instants[2]["args"]["Bytes"], -1024);
    let counters = phase(&events, "C");
    let cuda: Vec<_> = counters.iter().filter(|e| e["name"] == "Memory cuda:0").collect();
    assert_eq!(cuda.len(), 3);
    let allocated: Vec<u64> = cuda.iter().map(|e| e["args"]["allocated"].as_u64().unwrap()).collect();
    assert_eq!(allocated, [1024, 5120, 4096]);
    assert!(cuda.iter().all(|e| e["args"]["reserved"] == 2 << 20));
    assert_eq!(counters.iter().filter(|e| e["name"] == "Memory cpu:0").count(), 1);
}

#[test]
fn memory_events_are_ignored_unless_asked_for() {
    let _lock = exclusive();
    let profiler = Profiler::builder().record_steps(false).start().unwrap();
    record_memory_event(MemoryEvent::alloc(DeviceId::cpu(0), 1, 8, 8, 8));
    assert!(profiler.stop().memory.is_empty());
    record_memory_event(MemoryEvent::alloc(DeviceId::cpu(0), 1, 8, 8, 8)); // off: no-op
}

#[test]
fn host_timer_on_the_real_clock_never_places_work_before_its_launch() {
    let _lock = exclusive();
    let timer: Arc<dyn DeviceTimer> = Arc::new(HostTimer::new(DeviceId::cpu(2), Arc::new(brasa_profile::HostClock)));
    let profiler = Profiler::builder().record_steps(false).start().unwrap();
    for _ in 0..50 {
        let _op = record_op("op", &[]);
        let _k = device_span(&timer, "work");
        std::hint::black_box((0..1_000u64).sum::<u64>());
    }
    let result = profiler.stop();
    assert_eq!(result.device_intervals.len(), 50);
    for interval in &result.device_intervals {
        assert!(interval.start_ns >= interval.launch_ns, "{interval:?}");
        let range = &result.ranges[interval.range.unwrap()];
        assert!(range.start_ns <= interval.launch_ns && interval.launch_ns <= range.end_ns);
    }
    validate_trace(&result.chrome_trace_json()); // includes: every flow ends after it starts
}
