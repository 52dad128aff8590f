//! The segment renumbering changes no decision.

use super::*;
use crate::FailingBackend;

/// Runs a seeded random workload with segment numbers renumbered every
/// `limit` segments (or never) and returns the statistics, each live
/// allocation's (offset in its segment, block size) after every step,
/// and how many sequence numbers are in use at the end.
fn workload(config: &AllocatorConfig, limit: Option<u64>) -> (MemoryStats, Vec<Vec<(usize, usize)>>, u64) {
    let alloc = CachingAllocator::with_config(FailingBackend::new(40 << 20), config.clone());
    if let Some(limit) = limit {
        alloc.shared.lock().sequence_limit = limit;
    }
    let sizes = [512, 1536, 64 << 10, 700 << 10, 1 << 20, 3 << 20, 4 << 20];
    let mut live: Vec<Allocation<FailingBackend>> = Vec::new();
    let mut layouts = Vec::new();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..3000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        match seed % 10 {
            0..=4 => {
                let stream = StreamId(seed >> 60 & 1);
                if let Ok(block) = alloc.allocate(sizes[(seed >> 8) as usize % sizes.len()], stream) {
                    live.push(block);
                }
            }
            5..=8 if !live.is_empty() => drop(live.swap_remove((seed >> 16) as usize % live.len())),
            _ => alloc.empty_cache(),
        }
        let snapshot = alloc.snapshot();
        layouts.push(
            live.iter()
                .map(|block| {
                    let segment = snapshot
                        .segments
                        .iter()
                        .find(|s| s.address <= block.addr() && block.addr() < s.address + s.total_size)
                        .map_or(0, |s| s.address);
                    (block.addr() - segment, block.block_size())
                })
                .collect(),
        );
    }
    let in_use = alloc.shared.lock().next_sequence;
    (alloc.stats(), layouts, in_use)
}

#[test]
fn renumbering_segments_changes_no_decision() {
    // Limits above the most segments alive at once (20 fixed ones of
    // 2 MiB on the 40 MiB device; an address range per stream and pool).
    for (config, limit) in [
        (AllocatorConfig::default(), 32),
        (AllocatorConfig::builder().memory_fraction(0.6).garbage_collection_threshold(0.5).build().unwrap(), 32),
        (AllocatorConfig::builder().expandable_segments(true).build().unwrap(), 8),
    ] {
        let (stats, layouts, created) = workload(&config, None);
        let (renumbered_stats, renumbered_layouts, in_use) = workload(&config, Some(limit));
        assert!(created > 2 * limit, "too few segments to renumber: {created}");
        assert!(in_use < limit, "numbers were reused: {in_use}");
        assert_eq!(renumbered_stats, stats);
        assert_eq!(renumbered_layouts, layouts);
    }
}
