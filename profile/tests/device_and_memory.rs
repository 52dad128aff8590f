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
    // All device time is on cuda:0: PyTorch's column names.
    assert!(table.contains("Self CUDA"), "{table}");
    assert!(table.contains("CUDA total"));
    assert!(!table.contains("Self Device"), "{table}");
    assert!(table.contains("Self CUDA time total: 0.600us"), "{table}");
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

/// A GPU-like timer: its markers carry device-clock timestamps set by the test
/// (the device runs later, on its own clock), it switches streams, resolves
/// far from its origin only to the microsecond (as f32 milliseconds do), and
/// maps onto the host clock through its own reference pair.
struct FakeGpu {
    device_ns: Mutex<HashMap<u64, u64>>,
    next: AtomicUsize,
    queue: AtomicUsize,
    /// (device time of the reference marker, host time it maps to)
    reference: (u64, u64),
    references: AtomicUsize,
}

impl FakeGpu {
    fn new(reference: (u64, u64)) -> Self {
        FakeGpu {
            device_ns: Mutex::default(),
            next: AtomicUsize::new(0),
            queue: AtomicUsize::new(0),
            reference,
            references: AtomicUsize::new(0),
        }
    }

    fn runs(&self, marker: u64, device_ns: u64) {
        self.device_ns.lock().unwrap().insert(marker, device_ns);
    }
}

impl DeviceTimer for FakeGpu {
    fn device(&self) -> DeviceId {
        DeviceId::cuda(1)
    }
    fn current_queue(&self) -> u32 {
        self.queue.load(Ordering::SeqCst) as u32
    }
    fn record_marker(&self) -> Result<Marker, ProfileError> {
        Ok(Marker(self.next.fetch_add(1, Ordering::SeqCst) as u64))
    }
    fn elapsed_ns(&self, from: Marker, to: Marker) -> Result<u64, ProfileError> {
        let times = self.device_ns.lock().unwrap();
        let (a, b) = (times[&from.0], times[&to.0]);
        let exact = b.saturating_sub(a);
        // Far apart, only whole microseconds survive.
        Ok(if exact > 1_000_000 { exact / 1_000 * 1_000 } else { exact })
    }
    fn record_reference(&self, _clock: &dyn brasa_profile::Clock) -> Result<(Marker, u64), ProfileError> {
        self.references.fetch_add(1, Ordering::SeqCst);
        let marker = self.record_marker()?;
        self.runs(marker.0, self.reference.0);
        Ok((marker, self.reference.1))
    }
}

#[test]
fn cuda_time_is_placed_by_the_reference_pair_and_rolls_up_through_nested_ranges() {
    let _lock = exclusive();
    let host = ManualClock::new(10_000);
    // The device's clock reads 7_000_000 when the host's reads 12_000.
    let gpu = Arc::new(FakeGpu::new((7_000_000, 12_000)));
    let timer: Arc<dyn DeviceTimer> = gpu.clone();
    let profiler = Profiler::builder().clock(Arc::new(host.clone())).record_steps(false).start().unwrap();
    {
        let _step = record_function("step");
        host.advance(100);
        {
            let _fwd = record_op("forward", &[]);
            host.advance(100);
            {
                let _mm = record_op("matmul", &[]);
                gpu.queue.store(7, Ordering::SeqCst);
                let _k = device_span(&timer, "gemm"); // reference 0, markers 1, 2
                host.advance(100);
            }
            {
                let _relu = record_op("relu", &[]);
                gpu.queue.store(9, Ordering::SeqCst);
                let _k = device_span(&timer, "relu_kernel"); // markers 3, 4
                host.advance(100);
            }
            let _copy = device_span(&timer, "Memcpy HtoD (Pinned -> Device)"); // markers 5, 6, in forward
            host.advance(100);
        }
    }
    // Far from the reference (beyond the timer's exact range) and exactly timed.
    for (marker, t) in [(1, 9_000_000), (2, 9_000_500), (3, 9_000_500), (4, 9_000_600), (5, 9_001_000), (6, 9_001_050)]
    {
        gpu.runs(marker, t);
    }
    let result = profiler.stop();
    assert_eq!(gpu.references.load(Ordering::SeqCst), 1, "one reference pair per timer and session");
    assert!(result.warnings.is_empty(), "{:?}", result.warnings);
    assert_eq!(result.device_intervals.len(), 3);
    let gemm = result.device_intervals.iter().find(|d| d.name == "gemm").unwrap();
    // 12_000 host + (9_000_000 - 7_000_000) device, and 500 ns long although
    // the timer resolves the distance from its origin only to the microsecond.
    assert_eq!((gemm.start_ns, gemm.end_ns), (2_012_000, 2_012_500));
    assert_eq!((gemm.queue, gemm.device), (7, DeviceId::cuda(1)));
    let relu = result.device_intervals.iter().find(|d| d.name == "relu_kernel").unwrap();
    assert_eq!((relu.duration_ns(), relu.queue), (100, 9));

    let k = result.key_averages();
    assert_eq!(k.device_label(), "CUDA");
    let row = |n: &str| k.get(n).unwrap().clone();
    assert_eq!((row("matmul").self_device_ns, row("matmul").device_total_ns), (500, 500));
    assert_eq!((row("relu").self_device_ns, row("relu").device_total_ns), (100, 100));
    assert_eq!((row("forward").self_device_ns, row("forward").device_total_ns), (50, 650));
    assert_eq!((row("step").self_device_ns, row("step").device_total_ns), (0, 650));
    assert_eq!(k.self_device_time_total_ns(), 650, "self times add up to all device time once");

    let table = k.table(&TableOptions::default().sort_by(SortBy::SelfDevice));
    let header = table.lines().nth(1).unwrap();
    for column in ["Self CUDA", "Self CUDA %", "CUDA total", "CUDA time avg"] {
        assert!(header.contains(column), "missing {column}: {header}");
    }
    let first = table.lines().nth(3).unwrap();
    assert!(first.trim_start().starts_with("matmul"), "sorted by self CUDA: {first}");
    assert!(first.contains("76.92%"), "500 of 650 ns: {first}");
    assert!(first.contains("500.000ns") || first.contains("0.500us"), "{first}");
    assert!(table.ends_with("Self CUDA time total: 0.650us\n"), "{table}");

    let events = validate_trace(&result.chrome_trace_json());
    let device_work: Vec<_> =
        phase(&events, "X").into_iter().filter(|e| e["cat"] == "kernel" || e["cat"] == "gpu_memcpy").collect();
    assert_eq!(device_work.len(), 3);
    let pid = device_work[0]["pid"].as_u64().unwrap();
    assert!(device_work.iter().all(|e| e["pid"].as_u64() == Some(pid)), "one process per device");
    let gemm_event = device_work.iter().find(|e| e["name"] == "gemm").unwrap();
    // ts is relative to the profile's start (host 10_000).
    assert_eq!(gemm_event["ts"].as_f64(), Some(2002.0));
    assert_eq!(gemm_event["dur"].as_f64(), Some(0.5));
    assert_eq!(gemm_event["tid"].as_u64(), Some(7));
    let copy = device_work.iter().find(|e| e["name"] == "Memcpy HtoD (Pinned -> Device)").unwrap();
    assert_eq!(copy["cat"], "gpu_memcpy");
    let metadata = phase(&events, "M");
    let named = |what: &str, tid: u64, name: &str| {
        metadata.iter().any(|e| e["name"] == what && e["pid"] == pid && e["tid"] == tid && e["args"]["name"] == name)
    };
    assert!(named("process_name", 0, "cuda:1"));
    assert!(named("thread_name", 7, "stream 7"), "a track per stream");
    assert!(named("thread_name", 9, "stream 9"));
}

#[test]
fn device_columns_say_device_when_not_all_device_time_is_cuda() {
    let _lock = exclusive();
    let clock = ManualClock::new(0);
    let host_timer: Arc<dyn DeviceTimer> = Arc::new(HostTimer::new(DeviceId::cpu(1), Arc::new(clock.clone())));
    let gpu = Arc::new(FakeGpu::new((0, 0)));
    let gpu_timer: Arc<dyn DeviceTimer> = gpu.clone();
    let profiler = Profiler::builder().clock(Arc::new(clock.clone())).record_steps(false).start().unwrap();
    {
        let _op = record_op("add", &[]);
        let _host = device_span(&host_timer, "add_on_host");
        let _gpu = device_span(&gpu_timer, "add_on_gpu"); // reference 0, markers 1, 2
        clock.advance(40);
    }
    gpu.runs(1, 10);
    gpu.runs(2, 30);
    let result = profiler.stop();
    let k = result.key_averages();
    assert_eq!(k.device_label(), "Device");
    assert_eq!(k.get("add").unwrap().self_device_ns, 40 + 20);
    let table = k.table(&TableOptions::default());
    assert!(table.contains("Self Device %") && table.contains("Device total"), "{table}");
    assert!(!table.contains("CUDA"), "{table}");
    let events = validate_trace(&result.chrome_trace_json());
    let tracks: Vec<_> = phase(&events, "M").into_iter().filter(|e| e["name"] == "thread_name").collect();
    assert!(tracks.iter().any(|e| e["args"]["name"] == "queue 0"), "host devices keep `queue N`");
    assert!(tracks.iter().any(|e| e["args"]["name"] == "stream 0"));
}
