//! Property tests: random alloc / free / record_stream / event / empty_cache
//! sequences, with spells where the device cannot be synchronised (blocks
//! freed then are quarantined), keep the allocator's accounting exact.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_alloc::{
    Allocation, AllocatorConfig, Backend, BlockState, CachingAllocator, FailingBackend, MemoryStats, Snapshot, Stat,
    StatArray, StreamId,
};
use proptest::prelude::*;

const MIB: usize = 1 << 20;

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        size: usize,
        stream: u64,
    },
    Free {
        index: usize,
    },
    RecordStream {
        index: usize,
        stream: u64,
    },
    CompleteEvents,
    EmptyCache,
    /// The device cannot be synchronised (`true`) or can again (`false`).
    SyncFailure(bool),
}

fn op() -> impl Strategy<Value = Op> {
    // Sizes log-uniform from 1 B to 64 MiB so both pools and all three segment classes appear.
    let size = (0u32..=26, 0.0f64..1.0).prop_map(|(exp, frac)| ((1u64 << exp) as f64 * (1.0 + frac)) as usize);
    prop_oneof![
        6 => (size, 0u64..3).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        4 => any::<usize>().prop_map(|index| Op::Free { index }),
        1 => (any::<usize>(), 0u64..3).prop_map(|(index, stream)| Op::RecordStream { index, stream }),
        1 => Just(Op::CompleteEvents),
        1 => Just(Op::EmptyCache),
        1 => any::<bool>().prop_map(Op::SyncFailure),
    ]
}

fn config() -> impl Strategy<Value = AllocatorConfig> {
    prop_oneof![
        1 => Just(AllocatorConfig::default()),
        1 => Just(AllocatorConfig::builder().max_split_size_mb(24).build().unwrap()),
        1 => Just(AllocatorConfig::builder().roundup_power2_divisions(4).build().unwrap()),
        1 => Just(AllocatorConfig::builder().memory_fraction(0.6).garbage_collection_threshold(0.5).build().unwrap()),
        2 => Just(AllocatorConfig::builder().expandable_segments(true).build().unwrap()),
        1 => Just(
            AllocatorConfig::builder()
                .expandable_segments(true)
                .memory_fraction(0.6)
                .garbage_collection_threshold(0.5)
                .build()
                .unwrap()
        ),
    ]
}

fn check_pools_add_up(array: &StatArray, name: &str) {
    let sum = |f: fn(&Stat) -> i64| f(&array.large_pool) + f(&array.small_pool);
    assert_eq!(array.all.current, sum(|s| s.current), "{name}: pools add up");
    assert_eq!(array.all.allocated as i64, sum(|s| s.allocated as i64), "{name}: pools add up");
    assert_eq!(array.all.freed as i64, sum(|s| s.freed as i64), "{name}: pools add up");
    for stat in [&array.all, &array.large_pool, &array.small_pool] {
        assert!(stat.peak >= stat.current, "{name}: peak {} < current {}", stat.peak, stat.current);
        assert!(stat.current >= 0, "{name}: negative");
        assert_eq!(stat.current, stat.allocated as i64 - stat.freed as i64, "{name}: current = allocated - freed");
    }
}

/// Every invariant that the snapshot, the statistics and the backend must agree on.
fn check(snapshot: &Snapshot, stats: &MemoryStats, backend: &FailingBackend, live: &[Allocation<FailingBackend>]) {
    let mut segment_end = 0;
    let (mut allocated, mut active, mut inactive_split, mut reserved, mut allocations) = (0, 0, 0, 0, 0);
    let mut quarantined = 0;
    for segment in &snapshot.segments {
        assert!(segment.address >= segment_end, "segments overlap");
        segment_end = segment.address + segment.total_size;
        reserved += segment.total_size;
        let mut cursor = segment.address;
        for (i, block) in segment.blocks.iter().enumerate() {
            assert_eq!(block.address, cursor, "blocks tile their segment with no gap or overlap");
            assert!(block.size > 0 && block.size % 512 == 0, "block size {}", block.size);
            cursor += block.size;
            match block.state {
                BlockState::ActiveAllocated => {
                    allocated += block.size;
                    active += block.size;
                    allocations += 1;
                }
                BlockState::ActiveAwaitingFree => active += block.size,
                BlockState::Quarantined => quarantined += block.size,
                BlockState::Inactive => {
                    // Free blocks of expandable segments are not "inactive split" (PyTorch).
                    if segment.blocks.len() > 1 && !segment.expandable {
                        inactive_split += block.size;
                    }
                    if let Some(next) = segment.blocks.get(i + 1) {
                        assert_ne!(next.state, BlockState::Inactive, "free neighbours were not merged");
                    }
                }
            }
        }
        assert_eq!(cursor, segment_end, "blocks cover their segment");
    }
    assert_eq!(stats.allocated_bytes.all.current as usize, allocated);
    assert_eq!(live.iter().map(|a| a.block_size()).sum::<usize>(), allocated, "allocated = live blocks");
    assert_eq!(stats.requested_bytes.all.current as usize, live.iter().map(|a| a.size()).sum::<usize>());
    assert_eq!(stats.allocation.all.current as usize, allocations);
    assert_eq!(allocations, live.len());
    assert_eq!(stats.active_bytes.all.current as usize, active);
    assert_eq!(stats.quarantined_bytes as usize, quarantined);
    assert_eq!(stats.inactive_split_bytes.all.current as usize, inactive_split);
    assert_eq!(stats.reserved_bytes.all.current as usize, reserved, "reserved = segments");
    assert_eq!(stats.segment.all.current as usize, snapshot.segments.len());
    assert_eq!(backend.bytes_in_use(), reserved, "reserved = what the backend handed out");
    for (array, name) in [
        (&stats.allocation, "allocation"),
        (&stats.segment, "segment"),
        (&stats.active, "active"),
        (&stats.inactive_split, "inactive_split"),
        (&stats.allocated_bytes, "allocated_bytes"),
        (&stats.reserved_bytes, "reserved_bytes"),
        (&stats.active_bytes, "active_bytes"),
        (&stats.inactive_split_bytes, "inactive_split_bytes"),
        (&stats.requested_bytes, "requested_bytes"),
    ] {
        check_pools_add_up(array, name);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn accounting_stays_exact(config in config(), ops in prop::collection::vec(op(), 1..80)) {
        let backend = FailingBackend::new(400 * MIB);
        let alloc = CachingAllocator::with_config(backend.clone(), config);
        let mut live: Vec<Allocation<FailingBackend>> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc { size, stream } => match alloc.allocate(size, StreamId(stream)) {
                    Ok(block) => {
                        assert!(block.block_size() >= size);
                        live.push(block);
                    }
                    Err(error) => {
                        let oom = error.as_out_of_memory().expect("only out-of-memory can happen here");
                        assert_eq!(oom.requested_bytes, size);
                        assert!(oom.segment_bytes > backend.free_bytes() || oom.allowed_bytes.is_some());
                    }
                },
                Op::Free { index } if !live.is_empty() => {
                    let index = index % live.len();
                    live.swap_remove(index);
                }
                Op::RecordStream { index, stream } if !live.is_empty() => {
                    let index = index % live.len();
                    live[index].record_stream(StreamId(stream));
                }
                Op::CompleteEvents => backend.complete_events(),
                Op::EmptyCache => alloc.empty_cache(),
                Op::SyncFailure(fail) => backend.fail_synchronization(fail),
                _ => {}
            }
            check(&alloc.snapshot(), &alloc.stats(), &backend, &live);
        }
        live.clear();
        backend.fail_synchronization(false);
        backend.complete_events();
        // One allocation processes the completed events; then everything is free.
        drop(alloc.allocate(512, StreamId(0)));
        let stats = alloc.stats();
        prop_assert_eq!(stats.allocated_bytes.all.current, 0);
        prop_assert_eq!(stats.active_bytes.all.current, 0);
        alloc.empty_cache();
        // All that stays reserved is the memory around quarantined blocks.
        let snapshot = alloc.snapshot();
        for segment in &snapshot.segments {
            prop_assert!(
                segment.blocks.iter().any(|b| b.state == BlockState::Quarantined),
                "a segment without a quarantined block survived empty_cache: {:?}", segment
            );
        }
        if stats.quarantined_blocks == 0 {
            prop_assert_eq!(alloc.reserved_bytes(), 0);
            prop_assert_eq!(backend.bytes_in_use(), 0);
        }
        check(&snapshot, &alloc.stats(), &backend, &live);
    }
}
