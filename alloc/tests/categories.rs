//! Per-category accounting: over random allocations, frees, retags, stream
//! uses and cache releases, the categories' current bytes always add up to
//! the allocated bytes and equal a model's sums, and a consumer replaying
//! the observer's events (or the history) arrives at the same totals.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_alloc::{
    Allocation, AllocatorConfig, CachingAllocator, FailingBackend, MemoryCategory, MemoryStats, Observer, StreamId,
    TraceAction, TraceEntry,
};
use proptest::prelude::*;
use std::sync::{Arc, Mutex};

const MIB: usize = 1 << 20;

#[derive(Debug, Clone)]
enum Op {
    Alloc { size: usize, stream: u64, category: usize },
    Free { index: usize },
    SetCategory { index: usize, category: usize },
    RecordStream { index: usize, stream: u64 },
    CompleteEvents,
    EmptyCache,
    ResetPeak,
}

fn op() -> impl Strategy<Value = Op> {
    // Zero bytes sometimes; else log-uniform up to 64 MiB (some fail on the 256 MiB device).
    let size = prop_oneof![
        1 => Just(0usize),
        12 => (0u32..=26, 0.0f64..1.0).prop_map(|(exp, frac)| ((1u64 << exp) as f64 * (1.0 + frac)) as usize),
    ];
    prop_oneof![
        8 => (size, 0u64..3, 0..MemoryCategory::COUNT).prop_map(|(size, stream, category)| Op::Alloc { size, stream, category }),
        5 => any::<usize>().prop_map(|index| Op::Free { index }),
        4 => (any::<usize>(), 0..MemoryCategory::COUNT).prop_map(|(index, category)| Op::SetCategory { index, category }),
        1 => (any::<usize>(), 0u64..3).prop_map(|(index, stream)| Op::RecordStream { index, stream }),
        1 => Just(Op::CompleteEvents),
        1 => Just(Op::EmptyCache),
        1 => Just(Op::ResetPeak),
    ]
}

fn config() -> impl Strategy<Value = AllocatorConfig> {
    prop_oneof![
        2 => Just(AllocatorConfig::default()),
        1 => Just(AllocatorConfig::builder().max_split_size_mb(24).build().unwrap()),
        1 => Just(AllocatorConfig::builder().expandable_segments(true).build().unwrap()),
        1 => Just(AllocatorConfig::builder().memory_fraction(0.6).garbage_collection_threshold(0.5).build().unwrap()),
    ]
}

/// Per-category totals kept from events alone, as a timeline consumer would.
#[derive(Default, Debug)]
struct Replay {
    bytes: [i64; MemoryCategory::COUNT],
    allocated: i64,
}

impl Replay {
    fn apply(&mut self, entry: &TraceEntry) {
        let size = entry.size as i64;
        match entry.action {
            TraceAction::Alloc => {
                self.bytes[entry.category.index()] += size;
                self.allocated += size;
            }
            TraceAction::FreeRequested => {
                self.bytes[entry.category.index()] -= size;
                self.allocated -= size;
            }
            TraceAction::Retag { from } => {
                assert_ne!(from, entry.category, "a retag changes the category");
                self.bytes[from.index()] -= size;
                self.bytes[entry.category.index()] += size;
            }
            _ => {}
        }
        // Each event carries the allocated total after it.
        assert_eq!(self.allocated, entry.total_allocated as i64, "{entry:?}");
    }
}

/// What the caller holds, with the category the model expects of each.
struct Held {
    block: Allocation<FailingBackend>,
    category: MemoryCategory,
}

fn check(stats: &MemoryStats, held: &[Held], replay: &Replay) {
    let mut expected = [0i64; MemoryCategory::COUNT];
    for held in held {
        assert_eq!(held.block.category(), held.category);
        expected[held.category.index()] += held.block.block_size() as i64;
    }
    let categories = &stats.by_category;
    assert_eq!(
        categories.total_current(),
        stats.allocated_bytes.all.current,
        "categories add up to the allocated bytes"
    );
    for category in MemoryCategory::ALL {
        let stat = categories.get(category);
        assert_eq!(stat.current, expected[category.index()], "{category}: current = the model's sum");
        assert_eq!(stat.current, replay.bytes[category.index()], "{category}: current = the events' replay");
        assert!(stat.peak >= stat.current, "{category}: peak {} < current {}", stat.peak, stat.current);
        assert_eq!(stat.current, stat.allocated as i64 - stat.freed as i64, "{category}: current = allocated - freed");
        assert_eq!(stats.allocated_in(category), stat);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn category_totals_stay_exact(config in config(), ops in prop::collection::vec(op(), 1..100)) {
        let backend = FailingBackend::new(256 * MIB);
        let alloc = CachingAllocator::with_config(backend.clone(), config);
        let events: Arc<Mutex<Vec<TraceEntry>>> = Arc::default();
        let sink = Arc::clone(&events);
        let observer: Observer = Arc::new(move |entry: &TraceEntry| sink.lock().unwrap().push(entry.clone()));
        alloc.set_observer(Some(observer));
        alloc.record_history(1 << 20);
        let mut held: Vec<Held> = Vec::new();
        let mut replay = Replay::default();
        for op in ops {
            match op {
                Op::Alloc { size, stream, category } => {
                    let category = MemoryCategory::ALL[category];
                    match alloc.allocate_as(size, StreamId(stream), category) {
                        Ok(block) => held.push(Held { block, category }),
                        Err(error) => prop_assert!(error.as_out_of_memory().is_some(), "{error}"),
                    }
                }
                Op::Free { index } if !held.is_empty() => {
                    let index = index % held.len();
                    held.swap_remove(index);
                }
                Op::SetCategory { index, category } if !held.is_empty() => {
                    let index = index % held.len();
                    let category = MemoryCategory::ALL[category];
                    held[index].block.set_category(category);
                    held[index].category = category;
                }
                Op::RecordStream { index, stream } if !held.is_empty() => {
                    let index = index % held.len();
                    held[index].block.record_stream(StreamId(stream));
                }
                Op::CompleteEvents => backend.complete_events(),
                Op::EmptyCache => alloc.empty_cache(),
                Op::ResetPeak => {
                    alloc.reset_peak();
                    let stats = alloc.stats();
                    for (category, stat) in stats.by_category.iter() {
                        prop_assert_eq!(stat.peak, stat.current, "{} after reset_peak", category);
                    }
                }
                _ => {}
            }
            for entry in events.lock().unwrap().drain(..) {
                replay.apply(&entry);
            }
            check(&alloc.stats(), &held, &replay);
        }

        // The history tells the same story as the observer.
        let mut from_history = Replay::default();
        for entry in alloc.history() {
            from_history.apply(&entry);
        }
        prop_assert_eq!(from_history.bytes, replay.bytes);

        held.clear();
        backend.complete_events();
        alloc.empty_cache();
        for entry in events.lock().unwrap().drain(..) {
            replay.apply(&entry);
        }
        let stats = alloc.stats();
        check(&stats, &held, &replay);
        prop_assert_eq!(stats.by_category.total_current(), 0);
        alloc.reset_accumulated();
        for (_, stat) in alloc.stats().by_category.iter() {
            prop_assert_eq!((stat.allocated, stat.freed), (0, 0));
        }
    }
}

#[test]
fn retagging_moves_bytes_and_is_traced_once() {
    let alloc = CachingAllocator::new(FailingBackend::new(64 * MIB));
    alloc.record_history(64);
    let block = alloc.allocate_as(3000, StreamId::DEFAULT, MemoryCategory::Activation).unwrap();
    assert_eq!(block.block_size(), 3072);
    block.set_category(MemoryCategory::Activation);
    block.set_category(MemoryCategory::Gradient);
    let stats = alloc.stats();
    let (activation, gradient) =
        (stats.by_category.get(MemoryCategory::Activation), stats.by_category.get(MemoryCategory::Gradient));
    assert_eq!((activation.current, activation.peak, activation.allocated, activation.freed), (0, 3072, 3072, 3072));
    assert_eq!((gradient.current, gradient.peak, gradient.allocated, gradient.freed), (3072, 3072, 3072, 0));
    let history = alloc.history();
    let retags: Vec<&TraceEntry> = history.iter().filter(|e| matches!(e.action, TraceAction::Retag { .. })).collect();
    assert_eq!(retags.len(), 1, "retagging to the same category is a no-op");
    assert_eq!(retags[0].action, TraceAction::Retag { from: MemoryCategory::Activation });
    assert_eq!((retags[0].category, retags[0].size, retags[0].requested_size), (MemoryCategory::Gradient, 3072, 3000));
    assert!(alloc.summary().contains("gradient"));
    let snapshot = alloc.snapshot();
    let blocks: Vec<_> = snapshot.segments.iter().flat_map(|s| &s.blocks).collect();
    assert_eq!(blocks[0].category, Some(MemoryCategory::Gradient));
    assert_eq!(blocks[1].category, None, "free blocks hold nothing");
    let json = snapshot.to_json();
    assert!(json.contains(r#""category":"gradient""#), "{json}");
    assert!(json.contains(r#""action":{"retag":{"from":"activation"}}"#), "{json}");
    drop(block);
    let free = alloc.history().into_iter().find(|e| e.action == TraceAction::FreeRequested).unwrap();
    assert_eq!(free.category, MemoryCategory::Gradient);
    assert_eq!(alloc.stats().by_category.total_current(), 0);
}

#[test]
fn zero_byte_allocations_remember_their_category_and_count_nowhere() {
    let alloc = CachingAllocator::new(FailingBackend::new(64 * MIB));
    let empty = alloc.allocate_as(0, StreamId::DEFAULT, MemoryCategory::Input).unwrap();
    assert_eq!(empty.category(), MemoryCategory::Input);
    empty.set_category(MemoryCategory::Parameter);
    assert_eq!(empty.category(), MemoryCategory::Parameter);
    assert_eq!(alloc.stats().by_category, Default::default());
    assert_eq!(alloc.allocate(0, StreamId::DEFAULT).unwrap().category(), MemoryCategory::Other);
}

#[test]
fn out_of_memory_and_new_segments_carry_the_request_category() {
    let backend = FailingBackend::new(64 * MIB);
    let alloc = CachingAllocator::new(backend);
    alloc.record_history(64);
    let block = alloc.allocate_as(4 * MIB, StreamId::DEFAULT, MemoryCategory::OptimizerState).unwrap();
    assert!(alloc.allocate_as(128 * MIB, StreamId::DEFAULT, MemoryCategory::Temporary).is_err());
    let history = alloc.history();
    let segment = history.iter().find(|e| e.action == TraceAction::SegmentAlloc).unwrap();
    assert_eq!(segment.category, MemoryCategory::OptimizerState);
    let oom = history.iter().find(|e| e.action == TraceAction::Oom).unwrap();
    assert_eq!(oom.category, MemoryCategory::Temporary);
    drop(block);
    alloc.empty_cache();
    let released = alloc.history().into_iter().find(|e| e.action == TraceAction::SegmentFree).unwrap();
    assert_eq!(released.category, MemoryCategory::Other);
}
