//! Memory categories in the timeline: the bands add up to the allocated line
//! at every point, a retag moves bytes between bands without changing the
//! total, bytes from before the recording come from the device's baseline,
//! and the page shows a legend entry for each category present.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use brasa_profile::{
    record_function, record_memory_event, register_device_monitor, unregister_device_monitor, DeviceId, DeviceMonitor,
    DeviceTimeline, ManualClock, MemoryBaseline, MemoryEvent, MemoryRecord, ProfileResult, Profiler,
    UNTRACKED_CATEGORY,
};
use common::{exclusive, phase, validate_trace};
use proptest::prelude::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;
const CATEGORIES: [&str; 8] =
    ["parameter", "gradient", "optimizer_state", "activation", "temporary", "input", "other", "kv_cache"];

fn record(time_ns: u64, event: MemoryEvent) -> MemoryRecord {
    MemoryRecord { event, time_ns, tid: 1, range: None }
}

/// Every point's bands add up to its allocated bytes, every band is as long
/// as the points, and the peak's categories add up to the peak.
fn assert_bands_add_up(device: &DeviceTimeline) {
    for series in &device.categories {
        assert_eq!(series.bytes.len(), device.points.len(), "{}", series.category);
        assert_eq!(series.peak, series.bytes.iter().copied().max().unwrap_or(0));
        assert!(series.peak > 0, "only categories that held bytes are listed: {}", series.category);
    }
    for (i, point) in device.points.iter().enumerate() {
        let bands: u64 = device.categories.iter().map(|series| series.bytes[i]).sum();
        assert_eq!(bands, point.allocated, "point {i} of {}", device.device);
    }
    if let Some(peak) = &device.peak {
        assert_eq!(peak.by_category.iter().map(|c| c.1).sum::<u64>(), peak.allocated);
    }
}

/// A live block of the model allocator.
#[derive(Clone, Copy, Debug)]
struct Block {
    addr: u64,
    bytes: u64,
    category: &'static str,
    /// Allocated or retagged during the profile: the timeline knows its category
    /// even without a baseline.
    seen: bool,
}

#[derive(Clone, Debug)]
enum Op {
    Alloc { device: usize, slot: usize, kib: u64, category: usize },
    Free { device: usize, slot: usize },
    Retag { device: usize, slot: usize, category: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..2usize, 0..12usize, 1..512u64, 0..CATEGORIES.len())
            .prop_map(|(device, slot, kib, category)| Op::Alloc { device, slot, kib, category }),
        2 => (0..2usize, 0..12usize).prop_map(|(device, slot)| Op::Free { device, slot }),
        2 => (0..2usize, 0..12usize, 0..CATEGORIES.len())
            .prop_map(|(device, slot, category)| Op::Retag { device, slot, category }),
    ]
}

/// Bytes per category the timeline should show for `blocks`: with a
/// baseline every block's category is known; without, blocks from before
/// the recording that no event touched are untracked.
fn expected(blocks: &[Option<Block>], baseline: bool) -> BTreeMap<&'static str, u64> {
    let mut bytes = BTreeMap::new();
    for block in blocks.iter().flatten() {
        let category = if block.seen || baseline { block.category } else { UNTRACKED_CATEGORY };
        *bytes.entry(category).or_insert(0) += block.bytes;
    }
    bytes.retain(|_, b| *b > 0);
    bytes
}

fn devices() -> [DeviceId; 2] {
    [DeviceId::cuda(0), DeviceId::cpu(1)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Random allocations, frees and retags on two devices, some blocks from
    /// before the recording, with or without a baseline: at every point the
    /// bands are exactly the model's bytes per category, and add up to the
    /// allocated line.
    #[test]
    fn bands_follow_the_allocator_and_add_up(
        before in prop::collection::vec((0..2usize, 1..256u64, 0..CATEGORIES.len()), 0..6),
        ops in prop::collection::vec(op(), 1..80),
        baseline in any::<bool>(),
    ) {
        let mut slots: Vec<Vec<Option<Block>>> = vec![vec![None; 12]; 2];
        let mut next_addr = 0x1000u64;
        for (i, &(device, kib, category)) in before.iter().enumerate() {
            let slot = 11 - i % 6;
            slots[device][slot] = Some(Block { addr: next_addr, bytes: kib << 10, category: CATEGORIES[category], seen: false });
            next_addr += 0x1000;
        }
        let total = |blocks: &[Option<Block>]| blocks.iter().flatten().map(|b| b.bytes).sum::<u64>();
        let mut result = ProfileResult { end_ns: 1_000_000, ..ProfileResult::default() };
        if baseline {
            for (device, blocks) in devices().into_iter().zip(&slots) {
                let mut by_category: BTreeMap<&'static str, u64> = BTreeMap::new();
                for block in blocks.iter().flatten() {
                    *by_category.entry(block.category).or_insert(0) += block.bytes;
                }
                result.memory_baseline.push(MemoryBaseline {
                    device,
                    total_allocated: total(blocks),
                    total_reserved: total(blocks) + MIB,
                    by_category: by_category.into_iter().collect(),
                });
            }
        }
        let mut expectations: Vec<Vec<BTreeMap<&'static str, u64>>> = vec![Vec::new(); 2];
        if baseline {
            // Each device has a first point: its baseline (reserved is never zero here).
            for (expectation, blocks) in expectations.iter_mut().zip(&slots) {
                expectation.push(expected(blocks, true));
            }
        }
        let mut time = 0;
        for op in ops {
            time += 1;
            let (d, event) = match op {
                Op::Alloc { device, slot, kib, category } => {
                    if slots[device][slot].is_some() {
                        continue;
                    }
                    let block = Block { addr: next_addr, bytes: kib << 10, category: CATEGORIES[category], seen: true };
                    next_addr += 0x1000;
                    slots[device][slot] = Some(block);
                    let now = total(&slots[device]);
                    (device, MemoryEvent::alloc(devices()[device], block.addr, block.bytes, now, now + MIB).with_category(block.category))
                }
                Op::Free { device, slot } => {
                    let Some(block) = slots[device][slot].take() else { continue };
                    let now = total(&slots[device]);
                    (device, MemoryEvent::free(devices()[device], block.addr, block.bytes, now, now + MIB).with_category(block.category))
                }
                Op::Retag { device, slot, category } => {
                    let Some(block) = slots[device][slot].as_mut() else { continue };
                    let from = block.category;
                    block.category = CATEGORIES[category];
                    block.seen = true;
                    let (addr, bytes, to) = (block.addr, block.bytes, block.category);
                    let now = total(&slots[device]);
                    (device, MemoryEvent::retag(devices()[device], addr, bytes, from, to, now, now + MIB))
                }
            };
            result.memory.push(record(time, event));
            expectations[d].push(expected(&slots[d], baseline));
        }

        let timeline = result.memory_timeline();
        for device in &timeline.devices {
            assert_bands_add_up(device);
            let d = devices().iter().position(|&id| id == device.device).unwrap();
            prop_assert_eq!(device.points.len(), expectations[d].len());
            for (i, want) in expectations[d].iter().enumerate() {
                let got: BTreeMap<&str, u64> = device.categories_at(i).into_iter().collect();
                prop_assert_eq!(&got, want, "point {} of {}", i, device.device);
            }
        }
    }

    /// Whatever arrives — frees of blocks never seen, totals that disagree
    /// with the blocks, retags of unknown addresses, a baseline that does not
    /// add up — the bands still add up to the allocated line.
    #[test]
    fn bands_add_up_even_for_inconsistent_events(
        events in prop::collection::vec(
            (0..4u8, 0..8u64, 0..4096u64, 0..CATEGORIES.len(), 0..CATEGORIES.len(), 0..16_384u64),
            1..60,
        ),
        baseline in prop::option::of((0..8192u64, prop::collection::vec((0..CATEGORIES.len(), 0..8192u64), 0..4))),
    ) {
        let dev = DeviceId::cuda(3);
        let mut result = ProfileResult { end_ns: 100, ..ProfileResult::default() };
        if let Some((allocated, by_category)) = baseline {
            result.memory_baseline.push(MemoryBaseline {
                device: dev,
                total_allocated: allocated,
                total_reserved: allocated,
                by_category: by_category.into_iter().map(|(c, b)| (CATEGORIES[c], b)).collect(),
            });
        }
        for (i, (kind, addr, bytes, from, to, allocated)) in events.into_iter().enumerate() {
            let event = match kind {
                0 => MemoryEvent::alloc(dev, addr, bytes, allocated, allocated),
                1 => MemoryEvent::free(dev, addr, bytes, allocated, allocated),
                2 => MemoryEvent::retag(dev, addr, bytes, CATEGORIES[from], CATEGORIES[to], allocated, allocated),
                _ => MemoryEvent::alloc(dev, addr, 0, allocated, allocated),
            };
            result.memory.push(record(i as u64, event.with_category(CATEGORIES[to])));
        }
        for device in &result.memory_timeline().devices {
            assert_bands_add_up(device);
        }
    }
}

#[test]
fn a_retag_moves_bytes_between_bands_and_keeps_the_total() {
    let dev = DeviceId::cuda(0);
    let result = ProfileResult {
        memory: vec![
            record(10, MemoryEvent::alloc(dev, 0xa, 4 * MIB, 4 * MIB, 8 * MIB).with_category("parameter")),
            record(20, MemoryEvent::alloc(dev, 0xb, 2 * MIB, 6 * MIB, 8 * MIB).with_category("temporary")),
            record(30, MemoryEvent::retag(dev, 0xb, 2 * MIB, "temporary", "activation", 6 * MIB, 8 * MIB)),
            record(40, MemoryEvent::free(dev, 0xb, 2 * MIB, 4 * MIB, 8 * MIB).with_category("activation")),
        ],
        end_ns: 50,
        ..ProfileResult::default()
    };
    let timeline = result.memory_timeline();
    let cuda = &timeline.devices[0];
    assert_bands_add_up(cuda);
    assert_eq!(cuda.points[1].allocated, cuda.points[2].allocated, "a retag allocates nothing");
    assert_eq!(cuda.categories_at(1), [("parameter", 4 * MIB), ("temporary", 2 * MIB)]);
    assert_eq!(cuda.categories_at(2), [("parameter", 4 * MIB), ("activation", 2 * MIB)]);
    assert_eq!(cuda.categories_at(3), [("parameter", 4 * MIB)]);
    // Bands in brasa-alloc's order, whatever order they appeared in.
    let names: Vec<&str> = cuda.categories.iter().map(|s| s.category).collect();
    assert_eq!(names, ["parameter", "activation", "temporary"]);
    let peak = cuda.peak.as_ref().unwrap();
    assert_eq!(peak.time_ns, 20);
    assert_eq!(peak.by_category, [("parameter", 4 * MIB), ("temporary", 2 * MIB)]);
    assert_eq!(result.memory[2].event.bytes, 0, "a retag changes no range's memory");
}

#[test]
fn a_retag_of_a_block_from_before_the_recording_takes_it_from_the_baseline() {
    let dev = DeviceId::cuda(0);
    let result = ProfileResult {
        memory_baseline: vec![MemoryBaseline {
            device: dev,
            total_allocated: 7 * MIB,
            total_reserved: 8 * MIB,
            by_category: vec![("parameter", 4 * MIB), ("other", 2 * MIB)],
        }],
        memory: vec![
            // An "other" block from before becomes a gradient, then is freed.
            record(10, MemoryEvent::retag(dev, 0x99, MIB, "other", "gradient", 7 * MIB, 8 * MIB)),
            record(20, MemoryEvent::free(dev, 0x99, MIB, 6 * MIB, 8 * MIB).with_category("gradient")),
            // A parameter from before is freed.
            record(30, MemoryEvent::free(dev, 0x98, MIB, 5 * MIB, 8 * MIB).with_category("parameter")),
        ],
        end_ns: 40,
        ..ProfileResult::default()
    };
    let timeline = result.memory_timeline();
    let cuda = &timeline.devices[0];
    assert_bands_add_up(cuda);
    assert_eq!(cuda.points[0].time_ns, 0, "the baseline is the first point");
    assert_eq!(cuda.categories_at(0), [(UNTRACKED_CATEGORY, MIB), ("parameter", 4 * MIB), ("other", 2 * MIB)]);
    assert_eq!(
        cuda.categories_at(1),
        [(UNTRACKED_CATEGORY, MIB), ("parameter", 4 * MIB), ("gradient", MIB), ("other", MIB)]
    );
    assert_eq!(cuda.categories_at(2), [(UNTRACKED_CATEGORY, MIB), ("parameter", 4 * MIB), ("other", MIB)]);
    assert_eq!(cuda.categories_at(3), [(UNTRACKED_CATEGORY, MIB), ("parameter", 3 * MIB), ("other", MIB)]);
    let peak = cuda.peak.as_ref().unwrap();
    assert_eq!((peak.time_ns, peak.allocated), (0, 7 * MIB));
    assert!(peak.blocks.is_empty(), "no block was allocated during the profile");
}

fn html_data(html: &str) -> Value {
    let start = html.find(r#"id="brasa-memory-data">"#).unwrap() + r#"id="brasa-memory-data">"#.len();
    let end = start + html[start..].find("</script>").unwrap();
    serde_json::from_str(&html[start..end]).unwrap()
}

#[test]
fn the_page_has_a_band_and_a_legend_entry_per_category_present() {
    let dev = DeviceId::cuda(0);
    let result = ProfileResult {
        memory: vec![
            record(1_000_000, MemoryEvent::alloc(dev, 0xa, 4 * MIB, 5 * MIB, 8 * MIB).with_category("parameter")),
            record(2_000_000, MemoryEvent::alloc(dev, 0xb, 2 * MIB, 7 * MIB, 8 * MIB).with_category("optimizer_state")),
            record(3_000_000, MemoryEvent::alloc(dev, 0xc, MIB, 8 * MIB, 8 * MIB).with_category("kv<cache>")),
            record(4_000_000, MemoryEvent::retag(dev, 0xc, MIB, "kv<cache>", "activation", 8 * MIB, 8 * MIB)),
        ],
        end_ns: 5_000_000,
        ..ProfileResult::default()
    };
    let html = result.memory_timeline_html();
    let present = ["parameter", "optimizer_state", "activation", "kv&lt;cache&gt;", UNTRACKED_CATEGORY];
    for name in present {
        assert!(html.contains(&format!(r#"data-category="{name}""#)), "band {name}");
        assert!(html.contains(&format!("</i>{name}<b")), "legend entry {name}");
    }
    for absent in ["gradient", "temporary", "input", "other"] {
        assert!(!html.contains(&format!(r#"data-category="{absent}""#)), "no band {absent}");
        assert!(!html.contains(&format!("</i>{absent}<b")), "no legend entry {absent}");
    }
    // The legend reads the values at the peak until the mouse says otherwise.
    assert!(html.contains(r#"</i>parameter<b class="value" data-series="1">4.00 MiB</b>"#), "{html}");
    assert!(html.contains("values at the peak (3.000 ms)"));
    let markup = &html[..html.find("brasa-memory-data").unwrap()];
    assert!(!markup.contains("kv<cache>"), "names are escaped in the markup");

    // The data carries each drawn category's bytes, parallel to the points.
    let data = html_data(&html);
    let device = &data["devices"][0];
    let points = device["points"].as_array().unwrap();
    let categories = device["categories"].as_array().unwrap();
    let names: Vec<&str> = categories.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, [UNTRACKED_CATEGORY, "parameter", "optimizer_state", "activation", "kv<cache>"]);
    for (i, point) in points.iter().enumerate() {
        let bands: u64 = categories.iter().map(|c| c["bytes"][i].as_u64().unwrap()).sum();
        assert_eq!(bands, point[1].as_u64().unwrap(), "point {i}");
    }
    assert!(categories.iter().all(|c| c["color"].as_str().unwrap().starts_with('#')));
    assert_eq!(device["peak"]["blocks"][0]["category"], "parameter");
    assert_eq!(device["peak"]["blocks"][2]["category"], "kv<cache>", "the category at the peak, before the retag");
    // The hover script comes inline with the page.
    assert!(html.contains("dev.categories.forEach"));
    assert!(!html.contains("<script src"));
}

/// A device that reports what its allocator holds: 3 MiB of parameters,
/// 1 MiB of optimizer state, 1 MiB it cannot place.
struct Monitor(DeviceId);

impl DeviceMonitor for Monitor {
    fn device(&self) -> DeviceId {
        self.0
    }
    fn memory_used(&self) -> Option<u64> {
        Some(8 * MIB)
    }
    fn memory_total(&self) -> Option<u64> {
        None
    }
    fn memory_baseline(&self) -> Option<MemoryBaseline> {
        Some(MemoryBaseline {
            device: self.0,
            total_allocated: 5 * MIB,
            total_reserved: 8 * MIB,
            by_category: vec![("parameter", 3 * MIB), ("optimizer_state", MIB)],
        })
    }
}

struct PanickingMonitor(DeviceId);

impl DeviceMonitor for PanickingMonitor {
    fn device(&self) -> DeviceId {
        self.0
    }
    fn memory_used(&self) -> Option<u64> {
        None
    }
    fn memory_total(&self) -> Option<u64> {
        None
    }
    fn memory_baseline(&self) -> Option<MemoryBaseline> {
        panic!("no baseline today")
    }
}

#[test]
fn a_recording_starts_from_the_monitors_baselines() {
    let _lock = exclusive();
    let dev = DeviceId::new("test", 7);
    let broken = DeviceId::new("test", 8);
    register_device_monitor(Arc::new(Monitor(dev)));
    register_device_monitor(Arc::new(PanickingMonitor(broken)));
    let clock = ManualClock::new(1_000);
    let profiler =
        Profiler::builder().clock(Arc::new(clock.clone())).profile_memory(true).record_steps(false).start().unwrap();
    clock.advance(1_000);
    {
        let _forward = record_function("forward");
        record_memory_event(MemoryEvent::alloc(dev, 0x1, 2 * MIB, 7 * MIB, 8 * MIB).with_category("activation"));
    }
    clock.advance(1_000);
    record_memory_event(MemoryEvent::free(dev, 0x77, MIB, 6 * MIB, 8 * MIB).with_category("parameter"));
    clock.advance(1_000);
    let result = profiler.stop();
    // Without profile_memory, no baseline is asked for.
    let plain = Profiler::builder().record_steps(false).start().unwrap().stop();
    unregister_device_monitor(dev);
    unregister_device_monitor(broken);

    assert!(plain.memory_baseline.is_empty());
    assert_eq!(result.memory_baseline.len(), 1, "the panicking monitor is left out");
    assert!(result.warnings.iter().any(|w| w.contains("no baseline today")), "{:?}", result.warnings);
    let timeline = result.memory_timeline();
    let device = timeline.devices.iter().find(|d| d.device == dev).unwrap();
    assert_bands_add_up(device);
    assert_eq!(device.points.len(), 3);
    assert_eq!((device.points[0].time_ns, device.points[0].allocated), (0, 5 * MIB));
    assert_eq!(device.categories_at(0), [(UNTRACKED_CATEGORY, MIB), ("parameter", 3 * MIB), ("optimizer_state", MIB)]);
    assert_eq!(
        device.categories_at(1),
        [(UNTRACKED_CATEGORY, MIB), ("parameter", 3 * MIB), ("optimizer_state", MIB), ("activation", 2 * MIB)]
    );
    assert_eq!(
        device.categories_at(2),
        [(UNTRACKED_CATEGORY, MIB), ("parameter", 2 * MIB), ("optimizer_state", MIB), ("activation", 2 * MIB)]
    );
    let peak = device.peak.as_ref().unwrap();
    assert_eq!((peak.time_ns, peak.allocated), (1_000, 7 * MIB));
    assert_eq!(peak.blocks.len(), 1);
    assert_eq!((peak.blocks[0].category, peak.blocks[0].op.as_str()), ("activation", "forward"));
}

#[test]
fn the_chrome_trace_names_categories_and_retags() {
    let _lock = exclusive();
    let clock = ManualClock::new(0);
    let dev = DeviceId::cuda(0);
    let profiler =
        Profiler::builder().clock(Arc::new(clock.clone())).profile_memory(true).record_steps(false).start().unwrap();
    record_memory_event(MemoryEvent::alloc(dev, 0x10, 1024, 1024, 4096).with_category("input"));
    clock.advance(10);
    record_memory_event(MemoryEvent::retag(dev, 0x10, 1024, "input", "activation", 1024, 4096));
    clock.advance(10);
    let result = profiler.stop();
    let events = validate_trace(&result.chrome_trace_json());
    let instants = phase(&events, "i");
    assert_eq!(instants.len(), 2);
    assert_eq!(instants[0]["name"], "[memory]");
    assert_eq!(instants[0]["args"]["Category"], "input");
    assert_eq!(instants[1]["name"], "[memory retag]");
    assert_eq!(
        (instants[1]["args"]["From"].as_str(), instants[1]["args"]["To"].as_str()),
        (Some("input"), Some("activation"))
    );
    assert_eq!(instants[1]["args"]["Bytes"], 1024);
    let counters: Vec<_> = phase(&events, "C").into_iter().filter(|e| e["name"] == "Memory cuda:0").collect();
    assert_eq!(counters.len(), 1, "a retag changes no counter");
}
