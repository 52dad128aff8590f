//! A block freed while the device cannot be synchronised with the streams
//! that used it is quarantined: never handed out again, never merged, never
//! released, counted in the statistics, traced and shown in snapshots.
//! (Before, the allocator ignored the failed wait and put the block back in
//! its free list, so the next request got memory a stream might still be
//! writing.)

use brasa_alloc::{BlockState, CachingAllocator, FailingBackend, StreamId, TraceAction};

const MIB: usize = 1 << 20;
const SIDE: StreamId = StreamId(1);
/// Over 10 MiB: a segment of its own, exactly this size.
const BIG: usize = 12 * MIB;

fn allocator() -> (FailingBackend, CachingAllocator<FailingBackend>) {
    let backend = FailingBackend::new(256 * MIB);
    let alloc = CachingAllocator::new(backend.clone());
    alloc.record_history(1000);
    (backend, alloc)
}

#[test]
fn a_block_whose_stream_cannot_be_waited_for_is_never_reused() {
    let (backend, alloc) = allocator();
    let block = alloc.allocate(BIG, StreamId::DEFAULT).unwrap();
    let (addr, size) = (block.addr(), block.block_size());
    block.record_stream(SIDE);
    backend.fail_synchronization(true);
    drop(block);

    let stats = alloc.stats();
    assert_eq!(stats.quarantined_blocks, 1);
    assert_eq!(stats.quarantined_bytes, size as u64);
    assert_eq!(stats.allocated_bytes.all.current, 0);
    assert_eq!(stats.active_bytes.all.current, 0, "a quarantined block is not active");
    assert_eq!(stats.reserved_bytes.all.current, size as i64, "its segment stays reserved");

    // The same request again gets other memory, even once the device works.
    backend.fail_synchronization(false);
    let next = alloc.allocate(BIG, StreamId::DEFAULT).unwrap();
    assert_ne!(next.addr(), addr, "the quarantined block was handed out again");
    drop(next);

    // empty_cache gives back everything but the quarantined segment.
    alloc.empty_cache();
    assert_eq!(alloc.reserved_bytes(), size);
    assert_eq!(backend.bytes_in_use(), size);

    let snapshot = alloc.snapshot();
    let states: Vec<_> = snapshot.segments.iter().flat_map(|s| s.blocks.iter().map(|b| (b.address, b.state))).collect();
    assert_eq!(states, vec![(addr, BlockState::Quarantined)]);
    assert_eq!(snapshot.segments[0].active_size, 0);

    let quarantines: Vec<_> =
        alloc.history().into_iter().filter(|entry| entry.action == TraceAction::Quarantine).collect();
    assert_eq!(quarantines.len(), 1);
    assert_eq!((quarantines[0].addr, quarantines[0].size), (addr, size));
    assert!(alloc.summary().contains("QUARANTINED"), "{}", alloc.summary());
}

#[test]
fn a_failed_wait_for_a_pending_event_quarantines_its_block() {
    let (backend, alloc) = allocator();
    // The event is recorded while the device works, then the waits fail.
    let block = alloc.allocate(4 * MIB, StreamId::DEFAULT).unwrap();
    let addr = block.addr();
    block.record_stream(SIDE);
    drop(block);
    assert_eq!(backend.pending_events(), 1);
    assert_eq!(alloc.snapshot().segments[0].blocks[0].state, BlockState::ActiveAwaitingFree);

    backend.fail_synchronization(true);
    alloc.empty_cache(); // waits for every outstanding event: both waits fail
    assert_eq!(alloc.stats().quarantined_blocks, 1);
    assert_eq!(alloc.snapshot().segments[0].blocks[0].state, BlockState::Quarantined);

    // Completing the event later does not bring the block back.
    backend.fail_synchronization(false);
    backend.complete_events();
    let next = alloc.allocate(4 * MIB, StreamId::DEFAULT).unwrap();
    assert_ne!(next.addr(), addr);
    assert_eq!(alloc.stats().quarantined_blocks, 1);
}

#[test]
fn a_neighbour_of_a_quarantined_block_is_reused_but_never_merged_with_it() {
    let (backend, alloc) = allocator();
    // Two small blocks split from one 2 MiB segment.
    let first = alloc.allocate(4096, StreamId::DEFAULT).unwrap();
    let second = alloc.allocate(4096, StreamId::DEFAULT).unwrap();
    assert_eq!(second.addr(), first.addr() + 4096, "both come from one segment");
    let (first_addr, second_addr) = (first.addr(), second.addr());
    first.record_stream(SIDE);
    backend.fail_synchronization(true);
    drop(first);
    backend.fail_synchronization(false);
    drop(second);

    // The second block and the segment's tail merge; the quarantined block
    // stays apart, so the segment is never released.
    let blocks: Vec<_> = alloc.snapshot().segments[0].blocks.iter().map(|b| (b.address, b.state)).collect();
    assert_eq!(blocks, vec![(first_addr, BlockState::Quarantined), (second_addr, BlockState::Inactive)]);
    let again = alloc.allocate(4096, StreamId::DEFAULT).unwrap();
    assert_eq!(again.addr(), second_addr, "free memory beside the quarantined block is still used");
    drop(again);
    alloc.empty_cache();
    assert_eq!(alloc.stats().segment.all.current, 1);
}

#[test]
fn without_stream_uses_a_free_needs_no_synchronisation() {
    let (backend, alloc) = allocator();
    let block = alloc.allocate(4 * MIB, StreamId::DEFAULT).unwrap();
    let addr = block.addr();
    backend.fail_synchronization(true);
    drop(block);
    assert_eq!(alloc.stats().quarantined_blocks, 0);
    assert_eq!(alloc.allocate(4 * MIB, StreamId::DEFAULT).unwrap().addr(), addr);
}
