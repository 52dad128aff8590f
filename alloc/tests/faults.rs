//! Fault injection with the failing backend, the out-of-memory report, and
//! several threads at once.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_alloc::{AllocError, AllocatorConfig, CachingAllocator, FailingBackend, MemoryStats, StreamId, TraceAction};
use std::sync::{Arc, Mutex};

const MIB: usize = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

fn without_oom_counter(mut stats: MemoryStats) -> MemoryStats {
    stats.num_ooms = 0;
    stats
}

#[test]
fn a_failed_allocation_changes_nothing_but_the_oom_counter() {
    let backend = FailingBackend::new(64 * MIB);
    let alloc = CachingAllocator::new(backend.clone());
    let _held = alloc.allocate(30 * MIB, S0).unwrap();
    let _small = alloc.allocate(1000, S0).unwrap();
    let before = alloc.stats();
    let error = alloc.allocate(40 * MIB, S0).unwrap_err();
    let after = alloc.stats();
    assert_eq!(after.num_ooms, before.num_ooms + 1);
    assert_eq!(without_oom_counter(after), without_oom_counter(before));
    let oom = error.as_out_of_memory().unwrap();
    assert_eq!(oom.requested_bytes, 40 * MIB);
    assert_eq!(oom.segment_bytes, 40 * MIB);
    assert_eq!(oom.capacity_bytes, 64 * MIB);
    assert_eq!(oom.device_free_bytes, 64 * MIB - 32 * MIB);
    assert_eq!(oom.allocated_bytes, 30 * MIB + 1024);
    assert_eq!(oom.reserved_bytes, 32 * MIB);
    assert_eq!(oom.largest_free_block, 2 * MIB - 1024);
    assert_eq!(backend.bytes_in_use(), 32 * MIB, "nothing leaked");
}

#[test]
fn the_retry_releases_the_cache_and_succeeds_when_it_can() {
    let backend = FailingBackend::new(64 * MIB);
    let alloc = CachingAllocator::new(backend.clone());
    drop(alloc.allocate(12 * MIB, S0).unwrap());
    drop(alloc.allocate(30 * MIB, S0).unwrap());
    assert_eq!(alloc.reserved_bytes(), 42 * MIB);
    // 40 MiB fits neither cached block nor the 22 MiB left on the device.
    let block = alloc.allocate(40 * MIB, S0).unwrap();
    let stats = alloc.stats();
    assert_eq!(stats.num_alloc_retries, 1);
    assert_eq!(stats.num_ooms, 0);
    assert_eq!(stats.num_device_free, 2);
    assert_eq!(alloc.reserved_bytes(), 40 * MIB);
    drop(block);
}

#[test]
fn an_injected_failure_is_retried_after_releasing_the_cache() {
    let backend = FailingBackend::new(64 * MIB);
    let alloc = CachingAllocator::new(backend.clone());
    drop(alloc.allocate(12 * MIB, S0).unwrap());
    backend.fail_next_allocations(1);
    let block = alloc.allocate(14 * MIB, S0).unwrap();
    assert_eq!(alloc.stats().num_alloc_retries, 1);
    assert_eq!(alloc.reserved_bytes(), 14 * MIB);
    drop(block);
}

#[test]
fn when_every_allocation_fails_the_error_carries_the_figures() {
    let backend = FailingBackend::new(64 * MIB);
    let alloc = CachingAllocator::new(backend.clone());
    let held = alloc.allocate(5 * MIB, S0).unwrap();
    backend.fail_all_allocations(true);
    let error = alloc.allocate(16 * MIB, S0).unwrap_err();
    let AllocError::OutOfMemory(oom) = &error else { panic!("expected an out-of-memory error, got {error:?}") };
    assert_eq!((oom.device.as_str(), oom.requested_bytes), ("test:0", 16 * MIB));
    assert_eq!(oom.capacity_bytes, 64 * MIB);
    assert_eq!(oom.allocated_bytes, 5 * MIB);
    assert_eq!(oom.reserved_unallocated_bytes(), 15 * MIB);
    backend.fail_all_allocations(false);
    drop(held);
    alloc.empty_cache();
    assert_eq!(backend.bytes_in_use(), 0, "nothing leaked");
}

#[test]
fn fragmentation_is_named_in_the_message() {
    let backend = FailingBackend::new(100 * MIB);
    let alloc = CachingAllocator::new(backend.clone());
    // Five 20 MiB segments (one per stream, so none is reused for another),
    // each with one live 4 MiB block in the middle and free pieces around it:
    // lots of cached memory, no piece larger than 12 MiB.
    let mut keep = Vec::new();
    for stream in 0..5 {
        let a = alloc.allocate(4 * MIB, StreamId(stream)).unwrap();
        let b = alloc.allocate(4 * MIB, StreamId(stream)).unwrap();
        keep.push(b);
        drop(a);
    }
    let error = alloc.allocate(30 * MIB, S0).unwrap_err();
    assert!(matches!(error, AllocError::OutOfMemory(_)), "{error:?}");
    let oom = error.as_out_of_memory().unwrap();
    assert!(oom.is_fragmentation(), "{error}");
    assert_eq!(oom.largest_free_block, 12 * MIB);
    assert_eq!(oom.inactive_split_bytes, 80 * MIB);
    assert!(error.to_string().contains("max_split_size_mb"), "{error}");
    let report = alloc.fragmentation();
    assert_eq!(report.free_cached_bytes, 80 * MIB);
    assert_eq!(report.releasable_bytes, 0);
    assert!((report.fragmentation() - (1.0 - 12.0 / 80.0)).abs() < 1e-9);
    assert_eq!(report.inactive_split_ratio(), 1.0);
}

#[test]
fn the_oom_is_recorded_in_the_history() {
    let backend = FailingBackend::new(8 * MIB);
    let alloc = CachingAllocator::new(backend);
    alloc.record_history(100);
    assert!(alloc.allocate(20 * MIB, S0).is_err());
    let history = alloc.history();
    let last = history.last().unwrap();
    assert_eq!(last.action, TraceAction::Oom);
    assert_eq!(last.device_free, 8 * MIB);
}

#[test]
fn threads_allocating_at_once_end_with_exact_accounting() {
    threads_end_with_exact_accounting(AllocatorConfig::default());
}

#[test]
fn threads_growing_expandable_segments_end_with_exact_accounting() {
    threads_end_with_exact_accounting(AllocatorConfig::builder().expandable_segments(true).build().unwrap());
}

fn threads_end_with_exact_accounting(config: AllocatorConfig) {
    let backend = FailingBackend::new(4096 * MIB);
    let alloc = CachingAllocator::with_config(backend.clone(), config);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let alloc = alloc.clone();
            std::thread::spawn(move || {
                let mut held = Vec::new();
                let mut state = 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(t + 1);
                for i in 0..4000 {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let size = 512 << (state % 14); // 512 B .. 4 MiB
                    held.push(alloc.allocate(size as usize, StreamId(t % 2)).unwrap());
                    if i % 3 != 0 {
                        let victim = (state >> 20) as usize % held.len();
                        held.swap_remove(victim);
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let stats = alloc.stats();
    assert_eq!(stats.allocation.all.current, 0);
    assert_eq!(stats.allocated_bytes.all.current, 0);
    assert_eq!(stats.allocation.all.allocated, 16_000);
    assert_eq!(stats.allocation.all.freed, 16_000);
    assert_eq!(stats.reserved_bytes.all.current as usize, backend.bytes_in_use());
    alloc.empty_cache();
    assert_eq!(backend.bytes_in_use(), 0);
}

#[test]
fn the_observer_sees_every_event_outside_the_lock() {
    let alloc = CachingAllocator::new(FailingBackend::new(64 * MIB));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let inner = alloc.clone();
    alloc.set_observer(Some(Arc::new(move |entry: &brasa_alloc::TraceEntry| {
        // Calling back into the allocator would deadlock if the lock were held.
        let _ = inner.allocated_bytes();
        sink.lock().unwrap().push(entry.action);
    })));
    drop(alloc.allocate(1000, S0).unwrap());
    alloc.empty_cache();
    let actions = seen.lock().unwrap().clone();
    assert_eq!(
        actions,
        vec![
            TraceAction::SegmentAlloc,
            TraceAction::Alloc,
            TraceAction::FreeRequested,
            TraceAction::FreeCompleted,
            TraceAction::SegmentFree
        ]
    );
}

#[test]
fn handles_and_allocators_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<brasa_alloc::Allocation<FailingBackend>>();
    send_sync::<brasa_alloc::Allocation<brasa_alloc::HostBackend>>();
    send_sync::<CachingAllocator<brasa_alloc::HostBackend>>();
    // A block allocated on one thread may be dropped on another.
    let alloc = CachingAllocator::new(FailingBackend::new(16 * MIB));
    let block = alloc.allocate(1000, S0).unwrap();
    std::thread::spawn(move || drop(block)).join().unwrap();
    assert_eq!(alloc.allocated_bytes(), 0);
}

#[test]
fn a_disabled_observer_receives_nothing() {
    struct Switch {
        on: std::sync::atomic::AtomicBool,
        seen: std::sync::atomic::AtomicUsize,
    }
    impl brasa_alloc::AllocObserver for Switch {
        fn enabled(&self) -> bool {
            self.on.load(std::sync::atomic::Ordering::Relaxed)
        }
        fn on_event(&self, _entry: &brasa_alloc::TraceEntry) {
            self.seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let switch = Arc::new(Switch { on: false.into(), seen: 0.into() });
    let alloc = CachingAllocator::new(FailingBackend::new(16 * MIB));
    alloc.set_observer(Some(switch.clone()));
    drop(alloc.allocate(1000, S0).unwrap());
    assert_eq!(switch.seen.load(std::sync::atomic::Ordering::Relaxed), 0);
    switch.on.store(true, std::sync::atomic::Ordering::Relaxed);
    drop(alloc.allocate(1000, S0).unwrap());
    assert_eq!(switch.seen.load(std::sync::atomic::Ordering::Relaxed), 3, "alloc, free requested, free completed");
}

/// Requests no memory can hold (beyond `isize::MAX` bytes, where rounding to
/// the allocator's size classes would wrap) fail as out of memory: never a
/// panic, never a small block handed out as if it were the request.
#[test]
fn impossible_sizes_are_out_of_memory() {
    let configs = [
        AllocatorConfig::default(),
        AllocatorConfig::builder().roundup_power2_divisions(4).build().unwrap(),
        AllocatorConfig::builder().expandable_segments(true).build().unwrap(),
        AllocatorConfig::builder().memory_fraction(0.5).build().unwrap(),
    ];
    let sizes =
        [usize::MAX, usize::MAX - 511, isize::MAX as usize + 1, isize::MAX as usize, (1 << 62) + 1, 1 << 48, 1 << 45];
    for config in configs {
        let backend = FailingBackend::new(64 * MIB);
        let alloc = CachingAllocator::with_config(backend.clone(), config.clone());
        let _held = alloc.allocate(1000, S0).unwrap();
        for size in sizes {
            let before = alloc.stats();
            let error = alloc.allocate(size, S0).map(|block| block.size()).unwrap_err();
            let oom = error.as_out_of_memory().unwrap_or_else(|| panic!("{size}: {error}"));
            assert_eq!(oom.requested_bytes, size, "{config:?}");
            assert!(oom.rounded_bytes >= size, "{config:?}: rounded {} < {size}", oom.rounded_bytes);
            assert!(error.to_string().starts_with("out of memory on"), "{error}");
            let after = alloc.stats();
            assert_eq!(after.num_ooms, before.num_ooms + 1);
            assert_eq!(without_oom_counter(after), without_oom_counter(before));
        }
        assert_eq!(alloc.allocated_bytes(), 1024, "nothing handed out");
    }
}
