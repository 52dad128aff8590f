//! Device time of CUDA ops in `brasa-profile` (feature `cuda`, a GPU present;
//! each test skips with one line otherwise): kernels timed with CUDA events,
//! attributed to their ops (`Self CUDA` / `CUDA total`), placed on the host
//! timeline and drawn on one trace track per stream, with no wait per op.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_profile::{record_function, Profiler, SortBy, TableOptions};
use brasa_tensor::{synchronize, DType, Stream, Tensor};
use serde_json::Value;
use std::sync::{Mutex, MutexGuard};

mod support;
use support::gpu;

/// One profiler at a time in a process.
fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How far the reference pair may misplace device work on the host clock.
const SLACK_NS: u64 = 200_000;

#[test]
fn cuda_ops_get_device_time_in_the_table_and_the_trace() {
    let Some(gpu) = gpu() else { return };
    let _lock = exclusive();
    let a = Tensor::randn_on([512, 512], DType::F32, gpu).unwrap();
    let host = Tensor::ones([1 << 16], DType::F32).unwrap().pin_memory().unwrap();
    synchronize(gpu).unwrap();
    let profiler = Profiler::builder().record_steps(false).start().unwrap();
    {
        let _step = record_function("step");
        for _ in 0..3 {
            let y = a.matmul(&a).unwrap();
            drop(y.relu().unwrap());
        }
        drop(host.to_non_blocking(gpu).unwrap());
    }
    let result = profiler.stop();
    assert!(result.warnings.is_empty(), "{:?}", result.warnings);
    assert!(result.device_intervals.len() >= 7, "3 products, 3 relus, 1 copy: {:?}", result.device_intervals);
    for interval in &result.device_intervals {
        assert_eq!(interval.device, brasa_profile::DeviceId::cuda(0));
        assert_eq!(interval.queue, 0, "the default stream");
        assert!(interval.end_ns >= interval.start_ns);
        assert!(
            interval.start_ns + SLACK_NS >= interval.launch_ns,
            "device work placed before its launch: {interval:?}"
        );
        assert!(interval.start_ns + SLACK_NS >= result.start_ns);
    }
    let names: Vec<&str> = result.device_intervals.iter().map(|d| d.name.as_ref()).collect();
    assert!(names.contains(&"cublasGemmStridedBatchedEx"), "{names:?}");
    assert!(names.iter().any(|n| n.starts_with("unary_relu_f32")), "{names:?}");
    assert!(names.contains(&"Memcpy HtoD (Pinned -> Device)"), "{names:?}");

    let k = result.key_averages();
    assert_eq!(k.device_label(), "CUDA");
    let matmul = k.get("matmul").unwrap();
    assert_eq!(matmul.count, 3);
    assert!(matmul.self_device_ns > 0 && matmul.device_total_ns >= matmul.self_device_ns, "{matmul:?}");
    let relu = k.get("relu").unwrap();
    assert!(relu.self_device_ns > 0, "{relu:?}");
    let step = k.get("step").unwrap();
    let all: u64 = result.device_intervals.iter().map(|d| d.duration_ns()).sum();
    assert_eq!(step.device_total_ns, all, "the step holds all device work");
    assert_eq!(k.self_device_time_total_ns(), all, "each interval counted once as self time");
    let table = k.table(&TableOptions::default().sort_by(SortBy::DeviceTotal));
    for column in ["Self CUDA", "Self CUDA %", "CUDA total", "CUDA time avg", "Self CUDA time total"] {
        assert!(table.contains(column), "missing {column}:\n{table}");
    }

    let trace: Value = serde_json::from_str(&result.chrome_trace_json()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let device_pid = events
        .iter()
        .find(|e| e["ph"] == "M" && e["name"] == "process_name" && e["args"]["name"] == "cuda:0")
        .map(|e| e["pid"].clone())
        .expect("a process for cuda:0");
    assert!(events.iter().any(|e| e["ph"] == "M"
        && e["name"] == "thread_name"
        && e["pid"] == device_pid
        && e["args"]["name"] == "stream 0"));
    let on_device: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X" && e["pid"] == device_pid).collect();
    assert_eq!(on_device.len(), result.device_intervals.len());
    assert!(on_device.iter().any(|e| e["cat"] == "gpu_memcpy"));
    assert!(on_device.iter().all(|e| e["dur"].as_f64().unwrap() >= 0.0 && e["tid"] == 0));
}

#[test]
fn profiling_never_waits_for_the_device() {
    let Some(gpu) = gpu() else { return };
    let _lock = exclusive();
    let a = Tensor::randn_on([4096, 4096], DType::F32, gpu).unwrap();
    synchronize(gpu).unwrap();
    let profiler = Profiler::builder().record_steps(false).start().unwrap();
    for _ in 0..20 {
        drop(a.matmul(&a).unwrap());
    }
    let queued = Stream::current(gpu).record_event(false).unwrap();
    assert!(!queued.query(), "the products finished while being queued: profiling synchronized per op");
    let result = profiler.stop();
    assert_eq!(result.key_averages().get("matmul").unwrap().count, 20);
    assert!(result.device_intervals.iter().all(|d| d.duration_ns() > 0));
}

#[test]
fn kernels_on_a_side_stream_go_to_its_track() {
    let Some(gpu) = gpu() else { return };
    let _lock = exclusive();
    let side = Stream::new(gpu).unwrap();
    let x = Tensor::randn_on([1 << 20], DType::F32, gpu).unwrap();
    synchronize(gpu).unwrap();
    let profiler = Profiler::builder().record_steps(false).start().unwrap();
    {
        let _on_side = side.make_current();
        drop(x.mul_scalar(3.0).unwrap().exp().unwrap());
        side.synchronize().unwrap();
    }
    drop(x.add_scalar(1.0).unwrap());
    let result = profiler.stop();
    let queue = u32::try_from(side.id().0).unwrap();
    let on_side = result.device_intervals.iter().filter(|d| d.queue == queue).count();
    let on_default = result.device_intervals.iter().filter(|d| d.queue == 0).count();
    assert!(on_side >= 2 && on_default >= 1, "{:?}", result.device_intervals);
    let json = result.chrome_trace_json();
    assert!(json.contains(&format!(r#""name":"stream {queue}""#)), "a track for the side stream");
    synchronize(gpu).unwrap();
}

#[test]
fn nothing_is_timed_while_no_profiler_runs() {
    let Some(gpu) = gpu() else { return };
    let _lock = exclusive();
    let x = Tensor::randn_on([1024], DType::F32, gpu).unwrap();
    drop(x.relu().unwrap());
    let profiler = Profiler::builder().record_steps(false).start().unwrap();
    let result = profiler.stop();
    assert!(result.device_intervals.is_empty());
    synchronize(gpu).unwrap();
}
