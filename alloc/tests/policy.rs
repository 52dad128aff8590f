//! One test per rule of the caching policy, observed through the allocator.

use brasa_alloc::{
    AllocError, AllocatorConfig, BlockState, CachingAllocator, FailingBackend, HostBackend, PoolKind, StreamId,
};

const MIB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

fn allocator() -> CachingAllocator<HostBackend> {
    CachingAllocator::new(HostBackend::with_limit(1 << 30))
}

#[test]
fn requests_round_up_to_512_bytes() {
    let alloc = allocator();
    let block = alloc.allocate(513, S0).unwrap();
    assert_eq!(block.block_size(), 1024);
    assert_eq!(alloc.stats().allocated_bytes.all.current, 1024);
    assert_eq!(alloc.stats().requested_bytes.all.current, 513);
}

#[test]
fn small_requests_share_a_2_mib_segment() {
    let alloc = allocator();
    let a = alloc.allocate(1000, S0).unwrap();
    let b = alloc.allocate(MIB, S0).unwrap();
    let stats = alloc.stats();
    assert_eq!(stats.segment.small_pool.current, 1);
    assert_eq!(stats.reserved_bytes.small_pool.current, 2 * MIB as i64);
    assert_eq!(b.addr(), a.addr() + 1024, "carved from the front, in order");
}

#[test]
fn a_3_mib_request_takes_a_20_mib_segment_and_leaves_17_free() {
    let alloc = allocator();
    let _block = alloc.allocate(3 * MIB, S0).unwrap();
    let snapshot = alloc.snapshot();
    assert_eq!(snapshot.segments.len(), 1);
    let segment = &snapshot.segments[0];
    assert_eq!(segment.total_size, 20 * MIB);
    assert_eq!(segment.segment_type, PoolKind::Large);
    let sizes: Vec<(usize, BlockState)> = segment.blocks.iter().map(|b| (b.size, b.state)).collect();
    assert_eq!(sizes, vec![(3 * MIB, BlockState::ActiveAllocated), (17 * MIB, BlockState::Inactive)]);
    assert_eq!(alloc.stats().inactive_split_bytes.large_pool.current, 17 * MIB as i64);
}

#[test]
fn large_requests_from_10_mib_get_their_own_segment_rounded_to_2_mib() {
    let alloc = allocator();
    let _block = alloc.allocate(11 * MIB + 1, S0).unwrap();
    assert_eq!(alloc.reserved_bytes(), 12 * MIB);
}

#[test]
fn a_large_pool_remainder_of_at_most_1_mib_is_not_split() {
    let alloc = allocator();
    let block = alloc.allocate(11 * MIB, S0).unwrap(); // 12 MiB segment, 1 MiB left
    assert_eq!(block.block_size(), 12 * MIB);
    assert_eq!(alloc.stats().allocated_bytes.all.current, 12 * MIB as i64);
    assert_eq!(alloc.snapshot().segments[0].blocks.len(), 1);
}

#[test]
fn a_small_pool_remainder_of_512_bytes_is_split() {
    let alloc = allocator();
    let _a = alloc.allocate(MIB, S0).unwrap();
    let _b = alloc.allocate(MIB - 512, S0).unwrap();
    let snapshot = alloc.snapshot();
    let blocks = &snapshot.segments[0].blocks;
    assert_eq!(blocks.len(), 3);
    assert_eq!(blocks[2].size, 512);
    assert_eq!(blocks[2].state, BlockState::Inactive);
}

#[test]
fn freed_blocks_coalesce_with_free_neighbours() {
    let alloc = allocator();
    let a = alloc.allocate(4 * MIB, S0).unwrap();
    let b = alloc.allocate(4 * MIB, S0).unwrap();
    let c = alloc.allocate(4 * MIB, S0).unwrap();
    assert_eq!(alloc.snapshot().segments[0].blocks.len(), 4);
    drop(a);
    drop(c); // merges with the 8 MiB tail
    assert_eq!(alloc.snapshot().segments[0].blocks.len(), 3);
    drop(b); // merges both ways: one free block again
    let snapshot = alloc.snapshot();
    assert_eq!(snapshot.segments[0].blocks.len(), 1);
    assert_eq!(snapshot.segments[0].blocks[0].size, 20 * MIB);
    let stats = alloc.stats();
    assert_eq!(stats.inactive_split.all.current, 0);
    assert_eq!(stats.inactive_split_bytes.all.current, 0);
}

#[test]
fn best_fit_picks_the_smallest_block_that_fits() {
    let alloc = allocator();
    // Two 20 MiB segments, one with an 8 MiB hole, one with a 12 MiB hole... make holes.
    let a = alloc.allocate(12 * MIB - 2 * MIB, S0).unwrap(); // 10 MiB -> own 10 MiB segment
    let b = alloc.allocate(6 * MIB, S0).unwrap(); // 20 MiB segment, 14 MiB tail
    drop(a);
    // A 5 MiB request fits both the 10 MiB free segment and the 14 MiB tail: best fit is 10 MiB.
    let c = alloc.allocate(5 * MIB, S0).unwrap();
    let segment_of_c = alloc
        .snapshot()
        .segments
        .iter()
        .find(|s| s.address <= c.addr() && c.addr() < s.address + s.total_size)
        .unwrap()
        .total_size;
    assert_eq!(segment_of_c, 10 * MIB);
    drop(b);
}

#[test]
fn blocks_are_reused_only_on_their_stream() {
    let alloc = allocator();
    let addr = alloc.allocate(1000, S0).unwrap().addr();
    let other = alloc.allocate(1000, StreamId(7)).unwrap();
    assert_ne!(other.addr(), addr);
    assert_eq!(alloc.stats().segment.small_pool.current, 2);
    let again = alloc.allocate(1000, S0).unwrap();
    assert_eq!(again.addr(), addr);
}

#[test]
fn oversize_blocks_are_not_split_and_serve_only_close_requests() {
    let config = AllocatorConfig::builder().max_split_size_mb(40).build().unwrap();
    let alloc = CachingAllocator::with_config(HostBackend::with_limit(1 << 30), config);
    let big = alloc.allocate(60 * MIB, S0).unwrap();
    let big_addr = big.addr();
    drop(big);
    // A normal request does not take the oversize block.
    let small = alloc.allocate(30 * MIB, S0).unwrap();
    assert_ne!(small.addr(), big_addr);
    // An oversize request within 20 MiB takes it whole, unsplit.
    let close = alloc.allocate(50 * MIB, S0).unwrap();
    assert_eq!(close.addr(), big_addr);
    assert_eq!(close.block_size(), 60 * MIB);
    let stats = alloc.stats();
    assert_eq!(stats.oversize_allocations.current, 1);
    assert_eq!(stats.oversize_segments.current, 1);
    drop(close);
    // One wasting 20 MiB or more does not.
    let far = alloc.allocate(40 * MIB, S0).unwrap();
    assert_ne!(far.addr(), big_addr);
}

#[test]
fn oversize_ladder_releases_cached_oversize_blocks_first() {
    let backend = FailingBackend::new(150 * MIB);
    let config = AllocatorConfig::builder().max_split_size_mb(40).build().unwrap();
    let alloc = CachingAllocator::with_config(backend.clone(), config);
    let keep = alloc.allocate(4 * MIB, S0).unwrap(); // a split 20 MiB segment stays
    drop(alloc.allocate(100 * MIB, S0).unwrap()); // cached oversize block
                                                  // 120 MiB reserved, 30 MiB free. 75 MiB cannot use the cached block (it
                                                  // would waste 25 MiB ≥ 20 MiB) and does not fit until that block goes.
    let block = alloc.allocate(75 * MIB, S0).unwrap();
    let stats = alloc.stats();
    assert_eq!(stats.num_alloc_retries, 0, "released without the full retry");
    assert_eq!(stats.num_device_free, 1);
    assert_eq!(stats.reserved_bytes.all.current, 96 * MIB as i64, "20 MiB + 75 MiB rounded to 76");
    drop((keep, block));
}

#[test]
fn roundup_power2_divisions_round_between_powers_of_two() {
    let config = AllocatorConfig::from_conf_str("roundup_power2_divisions:4").unwrap();
    let alloc = CachingAllocator::with_config(HostBackend::with_limit(1 << 30), config);
    let block = alloc.allocate(1200 << 10, S0).unwrap();
    assert_eq!(block.block_size(), 1280 << 10);
}

#[test]
fn garbage_collection_frees_old_blocks_past_the_threshold() {
    let backend = FailingBackend::new(200 * MIB);
    let config = AllocatorConfig::builder().memory_fraction(0.5).garbage_collection_threshold(0.5).build().unwrap();
    let alloc = CachingAllocator::with_config(backend, config);
    // Allowed: 100 MiB; threshold 50 MiB. Cache five 12 MiB segments.
    let blocks: Vec<_> = (0..5).map(|_| alloc.allocate(12 * MIB, S0).unwrap()).collect();
    drop(blocks);
    assert_eq!(alloc.reserved_bytes(), 60 * MIB);
    let keep: Vec<_> = (0..2).map(|_| alloc.allocate(12 * MIB, S0).unwrap()).collect();
    assert_eq!(alloc.stats().num_device_free, 0, "served from the cache");
    // A 20 MiB request needs a new segment. Reserved (60 MiB) is over the
    // threshold by 10 MiB, so collection frees one idle 12 MiB segment first.
    let _big = alloc.allocate(20 * MIB, S0).unwrap();
    assert_eq!(alloc.stats().num_device_free, 1);
    assert_eq!(alloc.reserved_bytes(), 68 * MIB);
    drop(keep);
}

#[test]
fn memory_fraction_caps_reserved_memory() {
    let backend = FailingBackend::new(100 * MIB);
    let alloc = CachingAllocator::new(backend);
    alloc.set_memory_fraction(0.3).unwrap();
    let _a = alloc.allocate(20 * MIB, S0).unwrap();
    let error = alloc.allocate(20 * MIB, S0).unwrap_err();
    assert!(matches!(error, AllocError::OutOfMemory(_)), "{error:?}");
    let oom = error.as_out_of_memory().expect("an OOM");
    assert_eq!(oom.allowed_bytes, Some(30 * MIB));
    // The hint names the limit to raise.
    assert!(error.to_string().contains("allowed by the memory fraction"), "{error}");
    assert!(alloc.set_memory_fraction(1.5).is_err());
}

#[test]
fn record_stream_defers_reuse_until_the_event_completes() {
    let backend = FailingBackend::new(100 * MIB);
    let alloc = CachingAllocator::new(backend.clone());
    let block = alloc.allocate(1000, S0).unwrap();
    let addr = block.addr();
    block.record_stream(StreamId(3));
    drop(block);
    assert_eq!(backend.pending_events(), 1);
    let stats = alloc.stats();
    assert_eq!(stats.allocated_bytes.all.current, 0);
    assert_eq!(stats.active_bytes.all.current, 1024, "still active until the other stream is done");
    assert_eq!(alloc.snapshot().segments[0].blocks[0].state, BlockState::ActiveAwaitingFree);
    let while_pending = alloc.allocate(1000, S0).unwrap();
    assert_ne!(while_pending.addr(), addr);
    backend.complete_events();
    drop(while_pending);
    let after = alloc.allocate(1000, S0).unwrap();
    assert_eq!(after.addr(), addr, "reused once the event completed");
    assert_eq!(alloc.stats().active_bytes.all.current, 1024);
}

#[test]
fn empty_cache_waits_for_events_and_releases_whole_segments_only() {
    let backend = FailingBackend::new(100 * MIB);
    let alloc = CachingAllocator::new(backend.clone());
    let held = alloc.allocate(1000, S0).unwrap();
    let pending = alloc.allocate(3 * MIB, S0).unwrap();
    pending.record_stream(StreamId(1));
    drop(pending);
    drop(alloc.allocate(12 * MIB, S0).unwrap());
    alloc.empty_cache();
    let stats = alloc.stats();
    assert_eq!(stats.num_sync_all_streams, 1);
    assert_eq!(stats.reserved_bytes.all.current, 2 * MIB as i64, "only the segment with a live block stays");
    drop(held);
    alloc.empty_cache();
    assert_eq!(alloc.reserved_bytes(), 0);
    assert_eq!(backend.bytes_in_use(), 0);
}

#[test]
fn zero_byte_allocations_touch_nothing() {
    let alloc = allocator();
    let block = alloc.allocate(0, S0).unwrap();
    assert_eq!(block.size(), 0);
    assert_eq!(alloc.stats().allocation.all.allocated, 0);
}
