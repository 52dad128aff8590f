//! Expandable segments: one growing segment per stream and pool, mapped page
//! by page, with whole free pages unmapped by `empty_cache` and the
//! out-of-memory ladder.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_alloc::{
    AllocatorConfig, Backend, BackendError, BlockState, CachingAllocator, FailingBackend, HostBackend, HostEvent,
    StreamId, TraceAction,
};

const MIB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

fn expandable() -> AllocatorConfig {
    AllocatorConfig::builder().expandable_segments(true).build().unwrap()
}

fn allocator(capacity: usize) -> (FailingBackend, CachingAllocator<FailingBackend>) {
    let backend = FailingBackend::new(capacity);
    (backend.clone(), CachingAllocator::with_config(backend, expandable()))
}

#[test]
fn a_large_request_maps_whole_20_mib_pages() {
    let (backend, alloc) = allocator(1 << 30);
    let a = alloc.allocate(12 * MIB, S0).unwrap();
    assert_eq!(alloc.reserved_bytes(), 20 * MIB);
    assert_eq!(backend.bytes_in_use(), 20 * MIB);
    // The next request uses the 8 MiB left at the end and maps only what is missing.
    let b = alloc.allocate(30 * MIB, S0).unwrap();
    assert_eq!(b.addr(), a.addr() + 12 * MIB, "the segment grows in place");
    assert_eq!(alloc.reserved_bytes(), 60 * MIB);
    let snapshot = alloc.snapshot();
    assert_eq!(snapshot.segments.len(), 1, "one mapped range");
    let segment = &snapshot.segments[0];
    assert!(segment.expandable);
    assert_eq!(segment.total_size, 60 * MIB);
    assert_eq!(segment.allocated_size, 42 * MIB);
    assert_eq!(alloc.stats().segment.all.current, 1);
}

#[test]
fn a_small_request_maps_a_2_mib_page_and_splits_at_512_bytes() {
    let (_, alloc) = allocator(1 << 30);
    let a = alloc.allocate(1000, S0).unwrap();
    assert_eq!(a.block_size(), 1024);
    assert_eq!(alloc.reserved_bytes(), 2 * MIB);
    // Large blocks of expandable segments split down to 512 B remainders too.
    let big = alloc.allocate(3 * MIB, S0).unwrap();
    assert_eq!(big.block_size(), 3 * MIB, "fixed segments would hand out 3 MiB of a 4 MiB block whole");
    assert_eq!(alloc.stats().inactive_split_bytes.all.current, 0, "expandable blocks are not inactive splits");
}

#[test]
fn freed_neighbours_serve_a_request_larger_than_either() {
    // Fixed segments: two 96 MiB segments cannot hold 192 MiB, so a third is made.
    // Expandable: the two freed blocks are neighbours and merge.
    let mut reserved_after = Vec::new();
    for config in [AllocatorConfig::default(), expandable()] {
        let alloc = CachingAllocator::with_config(FailingBackend::new(1 << 30), config);
        let a = alloc.allocate(96 * MIB, S0).unwrap();
        let b = alloc.allocate(96 * MIB, S0).unwrap();
        let keep = alloc.allocate(4 * MIB, S0).unwrap();
        drop((a, b));
        let before = alloc.reserved_bytes();
        let c = alloc.allocate(192 * MIB, S0).unwrap();
        reserved_after.push(alloc.reserved_bytes() - before);
        drop((c, keep));
    }
    assert_eq!(reserved_after, [192 * MIB, 0]);
}

#[test]
fn empty_cache_unmaps_whole_free_pages_and_keeps_the_rest() {
    let (backend, alloc) = allocator(1 << 30);
    let x = alloc.allocate(30 * MIB, S0).unwrap();
    let y = alloc.allocate(50 * MIB, S0).unwrap();
    let z = alloc.allocate(30 * MIB, S0).unwrap();
    assert_eq!(alloc.reserved_bytes(), 120 * MIB);
    // SAFETY: x and z are live allocations of these sizes.
    unsafe {
        std::ptr::write_bytes(x.addr() as *mut u8, 0x11, x.size());
        std::ptr::write_bytes(z.addr() as *mut u8, 0x22, z.size());
    }
    drop(y);
    alloc.empty_cache();
    // y spans [30, 80) MiB: the pages [40, 80) are wholly free; [30, 40) shares a page with x.
    assert_eq!(alloc.reserved_bytes(), 80 * MIB);
    assert_eq!(backend.bytes_in_use(), 80 * MIB);
    let snapshot = alloc.snapshot();
    let ranges: Vec<(usize, usize)> = snapshot
        .segments
        .iter()
        .map(|s| (s.address - x.addr(), s.total_size))
        .map(|(a, s)| (a / MIB, s / MIB))
        .collect();
    assert_eq!(ranges, [(0, 40), (80, 40)], "two mapped ranges around the hole");
    assert_eq!(alloc.stats().segment.all.current, 2);
    let report = alloc.fragmentation();
    assert_eq!(report.releasable_bytes, 0, "what is left free shares pages with live blocks");
    // SAFETY: x and z are still live; their pages were not touched.
    unsafe {
        assert!(std::slice::from_raw_parts(x.addr() as *const u8, x.size()).iter().all(|&b| b == 0x11));
        assert!(std::slice::from_raw_parts(z.addr() as *const u8, z.size()).iter().all(|&b| b == 0x22));
    }
    // The hole is mapped again for the next request that fits it.
    let w = alloc.allocate(45 * MIB, S0).unwrap();
    assert_eq!(w.addr(), x.addr() + 30 * MIB);
    assert_eq!(alloc.reserved_bytes(), 120 * MIB);
    assert_eq!(alloc.snapshot().segments.len(), 1);
    drop((x, z, w));
    alloc.empty_cache();
    assert_eq!(alloc.reserved_bytes(), 0);
    assert_eq!(backend.bytes_in_use(), 0);
    assert!(alloc.snapshot().segments.is_empty());
    assert_eq!(alloc.stats().segment.all.current, 0);
}

#[test]
fn the_ladder_unmaps_cached_pages_to_grow() {
    let (backend, alloc) = allocator(100 * MIB);
    // Another stream's cached pages are given back only by the ladder.
    let a = alloc.allocate(40 * MIB, StreamId(1)).unwrap();
    let b = alloc.allocate(20 * MIB, S0).unwrap();
    drop(a);
    // 60 MiB must be mapped after b; only 40 MiB are left unless a's pages go back.
    let c = alloc.allocate(50 * MIB, S0).unwrap();
    assert_eq!(c.addr(), b.addr() + 20 * MIB);
    let stats = alloc.stats();
    assert_eq!(stats.num_alloc_retries, 1);
    assert_eq!(stats.num_ooms, 0);
    assert_eq!(alloc.reserved_bytes(), 80 * MIB);
    assert_eq!(backend.bytes_in_use(), 80 * MIB);
    assert_eq!(alloc.snapshot().segments.len(), 1, "a's pages went back; nothing else was reserved");
    // Full for real: the error says so and nothing changes.
    let before = alloc.stats();
    let error = alloc.allocate(40 * MIB, S0).unwrap_err();
    let oom = error.as_out_of_memory().expect("out of memory");
    assert_eq!(oom.requested_bytes, 40 * MIB);
    let after = alloc.stats();
    assert_eq!(after.num_ooms, 1);
    assert_eq!(after.reserved_bytes, before.reserved_bytes);
    assert_eq!(after.allocated_bytes, before.allocated_bytes);
    drop((b, c));
}

#[test]
fn growing_first_gives_back_free_pages_that_could_not_serve() {
    let (backend, alloc) = allocator(1 << 30);
    let a = alloc.allocate(40 * MIB, S0).unwrap();
    let b = alloc.allocate(20 * MIB, S0).unwrap();
    drop(a);
    // The 40 MiB free block cannot hold 50 MiB: its pages go back before 60 MiB are mapped after b.
    let c = alloc.allocate(50 * MIB, S0).unwrap();
    assert_eq!(c.addr(), b.addr() + 20 * MIB);
    assert_eq!(alloc.reserved_bytes(), 80 * MIB, "not 140 MiB");
    assert_eq!(backend.bytes_in_use(), 80 * MIB);
    let stats = alloc.stats();
    assert_eq!((stats.num_alloc_retries, stats.num_ooms), (0, 0), "no out-of-memory ladder involved");
    assert_eq!(stats.reserved_bytes.all.peak, 80 * MIB as i64);
    // The unmapped range is mapped again for a request that fits it.
    let d = alloc.allocate(30 * MIB, S0).unwrap();
    assert!(d.addr() < b.addr(), "the lowest gap that fits");
    drop((b, c, d));
}

#[test]
fn injected_map_failures_are_out_of_memory_errors_that_leave_no_trace() {
    let (backend, alloc) = allocator(1 << 30);
    backend.fail_all_allocations(true);
    let error = alloc.allocate(5 * MIB, S0).unwrap_err();
    assert!(error.as_out_of_memory().is_some(), "{error}");
    assert_eq!(alloc.reserved_bytes(), 0);
    assert_eq!(backend.bytes_in_use(), 0);
    backend.fail_all_allocations(false);
    let a = alloc.allocate(5 * MIB, S0).unwrap();
    assert_eq!(alloc.reserved_bytes(), 20 * MIB);
    drop(a);
}

#[test]
fn each_stream_and_pool_grows_its_own_segment() {
    let (_, alloc) = allocator(1 << 30);
    let blocks = [
        alloc.allocate(4 * MIB, StreamId(0)).unwrap(),
        alloc.allocate(4 * MIB, StreamId(1)).unwrap(),
        alloc.allocate(4096, StreamId(0)).unwrap(),
    ];
    let snapshot = alloc.snapshot();
    assert_eq!(snapshot.segments.len(), 3);
    assert_eq!(alloc.reserved_bytes(), 20 * MIB + 20 * MIB + 2 * MIB);
    drop(blocks);
}

#[test]
fn history_records_maps_and_unmaps() {
    let (_, alloc) = allocator(1 << 30);
    alloc.record_history(100);
    drop(alloc.allocate(25 * MIB, S0).unwrap());
    alloc.empty_cache();
    let actions: Vec<TraceAction> = alloc.history().iter().map(|e| e.action).collect();
    assert_eq!(
        actions,
        [
            TraceAction::SegmentMap,
            TraceAction::Alloc,
            TraceAction::FreeRequested,
            TraceAction::FreeCompleted,
            TraceAction::SegmentUnmap
        ]
    );
    let json = alloc.snapshot().to_json();
    assert!(json.contains("\"segment_map\"") && json.contains("\"segment_unmap\""), "{json}");
}

#[test]
fn blocks_awaiting_other_streams_are_not_unmapped() {
    let (backend, alloc) = allocator(1 << 30);
    let a = alloc.allocate(40 * MIB, S0).unwrap();
    a.record_stream(StreamId(7));
    drop(a);
    // The event on stream 7 is pending: empty_cache waits for it first, as PyTorch does.
    assert_eq!(backend.pending_events(), 1);
    let snapshot = alloc.snapshot();
    assert_eq!(snapshot.segments[0].blocks[0].state, BlockState::ActiveAwaitingFree);
    alloc.empty_cache();
    assert_eq!(alloc.reserved_bytes(), 0);
}

/// Host memory without address-range mapping.
struct PlainHost(HostBackend);

impl Backend for PlainHost {
    type Event = HostEvent;
    fn device_name(&self) -> String {
        self.0.device_name()
    }
    fn allocate(&self, bytes: usize) -> Result<usize, BackendError> {
        self.0.allocate(bytes)
    }
    unsafe fn free(&self, addr: usize, bytes: usize) {
        // SAFETY: forwarded under the caller's guarantee.
        unsafe { self.0.free(addr, bytes) }
    }
    fn total_bytes(&self) -> usize {
        self.0.total_bytes()
    }
    fn free_bytes(&self) -> usize {
        self.0.free_bytes()
    }
    fn record_event(&self, stream: StreamId) -> Result<HostEvent, BackendError> {
        self.0.record_event(stream)
    }
    fn event_completed(&self, event: &HostEvent) -> bool {
        self.0.event_completed(event)
    }
    fn synchronize_event(&self, event: &HostEvent) -> Result<(), BackendError> {
        self.0.synchronize_event(event)
    }
    fn synchronize_device(&self) -> Result<(), BackendError> {
        self.0.synchronize_device()
    }
}

#[test]
fn backends_that_cannot_map_keep_fixed_segments() {
    let alloc = CachingAllocator::with_config(PlainHost(HostBackend::with_limit(1 << 30)), expandable());
    let a = alloc.allocate(3 * MIB, S0).unwrap();
    assert_eq!(alloc.reserved_bytes(), 20 * MIB, "a fixed 20 MiB segment");
    assert!(!alloc.snapshot().segments[0].expandable);
    drop(a);
}
