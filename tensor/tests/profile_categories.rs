//! Under a profiler with `profile_memory(true)`, the memory timeline stacks a
//! device's allocated bytes by category: what the allocator held when the
//! recording started (the monitor's baseline), what was allocated under
//! `category_scope`, and bytes re-tagged while live.

use brasa_profile::{DeviceId, Profiler, UNTRACKED_CATEGORY};
use brasa_tensor::memory::{self, category_scope, MemoryCategory};
use brasa_tensor::{set_host_device_count, DType, Device, Tensor};

#[test]
fn the_timeline_stacks_a_devices_memory_by_category() {
    set_host_device_count(2).unwrap();
    // cpu:1 is this test's alone: nothing else in the process allocates there.
    let dev = Device::cpu(1);
    let weights = {
        let _parameters = category_scope(MemoryCategory::Parameter);
        Tensor::ones_on([64, 64], DType::F32, dev).unwrap()
    };
    let profiler = Profiler::builder().profile_memory(true).record_shapes(true).start().unwrap();
    let batch = {
        let _input = category_scope(MemoryCategory::Input);
        Tensor::ones_on([32, 64], DType::F32, dev).unwrap()
    };
    let out = batch.matmul(&weights).unwrap().relu().unwrap();
    // What autograd does to a tensor it saves for backward.
    out.storage().set_category(MemoryCategory::Activation);
    drop(batch);
    let result = profiler.stop();

    let timeline = result.memory_timeline();
    let cpu1 = timeline.devices.iter().find(|d| d.device == DeviceId::cpu(1)).expect("cpu:1 has a timeline");
    for (i, point) in cpu1.points.iter().enumerate() {
        let bands: u64 = cpu1.categories.iter().map(|series| series.bytes[i]).sum();
        assert_eq!(bands, point.allocated, "the bands add up to allocated at point {i}");
    }
    let (weight_bytes, batch_bytes, out_bytes) = (64 * 64 * 4, 32 * 64 * 4, 32 * 64 * 4);
    // The first point is the baseline: the weights, from before the recording.
    assert_eq!(cpu1.points[0].time_ns, 0);
    assert_eq!(cpu1.categories_at(0), [("parameter", weight_bytes)]);
    let names: Vec<&str> = cpu1.categories.iter().map(|series| series.category).collect();
    assert!(!names.contains(&UNTRACKED_CATEGORY), "the baseline placed every byte: {names:?}");
    let peak_of = |name: &str| cpu1.categories.iter().find(|s| s.category == name).map(|s| s.peak);
    assert_eq!(peak_of("input"), Some(batch_bytes));
    assert_eq!(peak_of("activation"), Some(out_bytes), "the retag moved the output's bytes");
    // At the end: the weights and the re-tagged output, the batch freed.
    let last = cpu1.points.len() - 1;
    assert_eq!(cpu1.categories_at(last), [("parameter", weight_bytes), ("activation", out_bytes)]);
    assert_eq!(cpu1.points[last].allocated, memory::allocated(dev).unwrap() as u64);
    assert!(result.memory.iter().any(|m| m.event.retag.is_some_and(|r| r.from == "other")));

    // The page carries the bands too.
    let html = result.memory_timeline_html();
    for band in ["parameter", "input", "activation"] {
        assert!(html.contains(&format!(r#"data-category="{band}""#)), "a {band} band");
        assert!(html.contains(&format!(r#""name":"{band}""#)), "{band} in the page's data");
    }
    drop((weights, out));
}
