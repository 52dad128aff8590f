//! The memory timeline: the peak, what was live there and who allocated it, and
//! an HTML page that carries exactly those numbers.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use brasa_profile::{
    record_function, record_memory_event, DeviceId, ManualClock, MemoryEvent, ProfileResult, Profiler,
};
use common::exclusive;
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// cuda:0 holds 16 MiB from before the profile; during it: A (1 MiB, no range),
/// B (8 MiB, forward > linear), C (4 MiB, forward > gelu), free A,
/// D (2 MiB, backward) — the peak, 30 MiB — then everything is freed.
fn recorded() -> ProfileResult {
    let clock = ManualClock::new(5_000_000);
    let dev = DeviceId::cuda(0);
    let before = 16 * MIB;
    let profiler =
        Profiler::builder().clock(Arc::new(clock.clone())).profile_memory(true).record_steps(false).start().unwrap();
    let ms = |n: u64| clock.set(5_000_000 + n * 1_000_000);
    ms(0);
    record_memory_event(MemoryEvent::alloc(dev, 0xa, MIB, before + MIB, 32 * MIB));
    {
        let _fwd = record_function("forward");
        ms(10);
        {
            let _l = record_function("linear");
            record_memory_event(MemoryEvent::alloc(dev, 0xb, 8 * MIB, before + 9 * MIB, 32 * MIB));
        }
        ms(20);
        {
            let _g = record_function("gelu");
            record_memory_event(MemoryEvent::alloc(dev, 0xc, 4 * MIB, before + 13 * MIB, 32 * MIB));
        }
    }
    ms(30);
    record_memory_event(MemoryEvent::free(dev, 0xa, MIB, before + 12 * MIB, 32 * MIB));
    {
        let _b = record_function("backward");
        ms(40);
        record_memory_event(MemoryEvent::alloc(dev, 0xd, 2 * MIB, before + 14 * MIB, 40 * MIB));
        ms(50);
        record_memory_event(MemoryEvent::free(dev, 0xb, 8 * MIB, before + 6 * MIB, 40 * MIB));
        record_memory_event(MemoryEvent::free(dev, 0xc, 4 * MIB, before + 2 * MIB, 40 * MIB));
        record_memory_event(MemoryEvent::free(dev, 0xd, 2 * MIB, before, 40 * MIB));
        // A second device with one small block.
        record_memory_event(MemoryEvent::alloc(DeviceId::cpu(0), 0x10, 4096, 4096, 2 * MIB));
    }
    ms(60);
    profiler.stop()
}

#[test]
fn peak_lists_live_blocks_and_their_ops() {
    let _lock = exclusive();
    let result = recorded();
    let timeline = result.memory_timeline();
    assert_eq!(timeline.duration_ns, 60_000_000);
    assert_eq!(timeline.devices.len(), 2);
    let cuda = timeline.devices.iter().find(|d| d.device == DeviceId::cuda(0)).unwrap();
    assert_eq!(cuda.points.len(), 8);
    let peak = cuda.peak.as_ref().unwrap();
    assert_eq!(peak.time_ns, 40_000_000);
    assert_eq!(peak.allocated, 30 * MIB);
    assert_eq!(peak.reserved, 40 * MIB);
    assert_eq!(peak.unattributed_bytes, 16 * MIB);
    let blocks: Vec<(u64, &str, &str)> =
        peak.blocks.iter().map(|b| (b.bytes, b.op.as_str(), b.op_path.as_str())).collect();
    assert_eq!(
        blocks,
        [
            (8 * MIB, "linear", "forward > linear"),
            (4 * MIB, "gelu", "forward > gelu"),
            (2 * MIB, "backward", "backward"),
        ],
        "A was freed before the peak"
    );
    assert_eq!(peak.by_op[0].op, "linear");
    assert_eq!(peak.blocks[0].allocated_at_ns, 10_000_000);
}

#[test]
fn html_is_self_contained_and_carries_its_data() {
    let _lock = exclusive();
    let result = recorded();
    let path = std::env::temp_dir().join(format!("brasa-memory-{}.html", std::process::id()));
    result.export_memory_timeline(&path).unwrap();
    let html = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);

    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("<title>Memory timeline"));
    assert!(!html.contains("http://") && !html.contains("https://"), "no network");
    assert!(!html.contains("<script src") && !html.contains("<link"), "no external files");
    // Axes with units, legend, the peak called out.
    for text in [
        "memory (MiB)",
        "time since profile start (ms)",
        ">allocated<",
        ">reserved<",
        "peak allocated",
        "peak 30.00 MiB at 40.000 ms",
        "cuda:0 — peak 30.00 MiB allocated at 40.000 ms (reserved 40.00 MiB)",
        "cpu:0",
    ] {
        assert!(html.contains(text), "missing {text:?}");
    }
    // The table of live blocks names each block's size and op.
    for (size, op) in [("8.00 MiB", "linear"), ("4.00 MiB", "gelu"), ("2.00 MiB", "backward")] {
        let row = format!(r#"<td class="num">{size}</td><td class="cat"><i class="swatch""#);
        assert!(html.contains(&row), "row for {size}");
        assert!(html.contains(&format!(">{op}</td>")), "op {op}");
    }
    assert!(html.contains("before this trace"), "pre-existing bytes are shown");

    // The embedded data is the recorded events, exactly.
    let start = html.find(r#"id="brasa-memory-data">"#).unwrap() + r#"id="brasa-memory-data">"#.len();
    let end = start + html[start..].find("</script>").unwrap();
    let data: Value = serde_json::from_str(&html[start..end]).unwrap();
    let devices = data["devices"].as_array().unwrap();
    let cuda_index = devices.iter().position(|d| d["device"] == "cuda:0").unwrap();
    let cuda = &devices[cuda_index];
    let cuda_records: Vec<_> = result.memory.iter().filter(|m| m.event.device == DeviceId::cuda(0)).collect();
    let points = cuda["points"].as_array().unwrap();
    assert_eq!(points.len(), cuda_records.len());
    for (point, record) in points.iter().zip(cuda_records) {
        let t_ms = (record.time_ns - result.start_ns) as f64 / 1e6;
        assert_eq!(point[0].as_f64().unwrap(), t_ms);
        assert_eq!(point[1].as_u64().unwrap(), record.event.total_allocated);
        assert_eq!(point[2].as_u64().unwrap(), record.event.total_reserved);
    }
    assert_eq!(cuda["peak"]["allocated"].as_u64(), Some(30 * MIB));
    assert_eq!(cuda["peak"]["blocks"][0]["op"], "linear");
    // Nothing was tagged: one "other" band over the 16 MiB from before the trace.
    let names: Vec<&str> = cuda["categories"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, [brasa_profile::UNTRACKED_CATEGORY, "other"]);
    // Every plotted point is drawn: the allocated step path has one vertex per event.
    let svg_start = html.find(&format!("<svg id=\"chart-{cuda_index}\"")).unwrap();
    let svg = &html[svg_start..svg_start + html[svg_start..].find("</svg>").unwrap()];
    let series = svg.split("class=\"series allocated\" d=\"").nth(1).unwrap();
    let path = &series[..series.find('"').unwrap()];
    assert_eq!(path.matches('V').count() + 1, points.len());
}

#[test]
fn empty_profile_explains_how_to_get_memory() {
    let html = ProfileResult::default().memory_timeline_html();
    assert!(html.contains("profile_memory(true)"));
    assert!(html.contains("record_memory_event"));
}
