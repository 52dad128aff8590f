//! Where the backend puts memory never changes what the allocator does: the
//! same requests over backends that hand out addresses in opposite (or
//! scrambled) orders give the same statistics, segments, block offsets,
//! out-of-memory errors and events (addresses and times aside). This is what
//! lets a memory plan run over a virtual device match the real run to the byte.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_alloc::{
    Allocation, AllocatorConfig, Backend, BackendError, CachingAllocator, MemoryCategory, MemoryStats, StreamId,
    TraceEntry,
};
use proptest::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};

const MIB: usize = 1 << 20;
const CAPACITY: usize = 256 * MIB;
/// Address space per backend allocation: more than any segment or reserved
/// range of a device of [`CAPACITY`].
const REGION: usize = 1 << 32;

/// How a [`LayoutBackend`] places what it hands out.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// Each allocation above the previous one.
    Rising,
    /// Each allocation below the previous one.
    Falling,
    /// Regions in a scrambled order.
    Scrambled,
}

/// A device of [`CAPACITY`] bytes that hands out made-up addresses (never
/// dereferenced), one region per allocation or reserved range, placed as
/// its [`Layout`] says; it maps pages of 2 MiB for expandable segments.
struct LayoutBackend {
    layout: Layout,
    handed_out: AtomicUsize,
    in_use: AtomicUsize,
}

impl LayoutBackend {
    fn new(layout: Layout) -> Self {
        LayoutBackend { layout, handed_out: AtomicUsize::new(0), in_use: AtomicUsize::new(0) }
    }

    fn next_address(&self) -> usize {
        let n = self.handed_out.fetch_add(1, Ordering::Relaxed);
        let region = match self.layout {
            Layout::Rising => n,
            Layout::Falling => (1 << 16) - 1 - n,
            // An odd multiplier permutes 0..2^16.
            Layout::Scrambled => n.wrapping_mul(40_503) & ((1 << 16) - 1),
        };
        (region + 1) * REGION
    }

    fn hold(&self, bytes: usize) -> Result<(), BackendError> {
        self.in_use
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|total| *total <= CAPACITY)
            })
            .map(drop)
            .map_err(|_| BackendError::OutOfMemory { requested: bytes })
    }
}

impl Backend for LayoutBackend {
    type Event = ();

    fn device_name(&self) -> String {
        "layout:0".into()
    }

    fn allocate(&self, bytes: usize) -> Result<usize, BackendError> {
        self.hold(bytes)?;
        Ok(self.next_address())
    }

    unsafe fn free(&self, _addr: usize, bytes: usize) {
        self.in_use.fetch_sub(bytes, Ordering::Relaxed);
    }

    fn total_bytes(&self) -> usize {
        CAPACITY
    }

    fn free_bytes(&self) -> usize {
        CAPACITY - self.in_use.load(Ordering::Relaxed)
    }

    fn record_event(&self, _stream: StreamId) -> Result<(), BackendError> {
        Ok(())
    }

    fn event_completed(&self, _event: &()) -> bool {
        true
    }

    fn synchronize_event(&self, _event: &()) -> Result<(), BackendError> {
        Ok(())
    }

    fn synchronize_device(&self) -> Result<(), BackendError> {
        Ok(())
    }

    fn virtual_memory_granularity(&self) -> Option<usize> {
        Some(2 * MIB)
    }

    fn reserve_address_range(&self, _bytes: usize) -> Result<usize, BackendError> {
        Ok(self.next_address())
    }

    fn map(&self, _addr: usize, bytes: usize) -> Result<(), BackendError> {
        self.hold(bytes)
    }

    unsafe fn unmap(&self, _addr: usize, bytes: usize) {
        self.in_use.fetch_sub(bytes, Ordering::Relaxed);
    }
}

#[derive(Debug, Clone)]
enum Op {
    Alloc { size: usize, stream: u64, category: usize },
    Free { index: usize },
    SetCategory { index: usize, category: usize },
    RecordStream { index: usize, stream: u64 },
    EmptyCache,
}

/// A few sizes that recur, so that free blocks of equal size in different
/// segments (the ties an address would break) are common.
const MENU: [usize; 10] = [0, 512, 1536, 64 << 10, 700 << 10, MIB, 3 * MIB, 6 * MIB, 12 * MIB, 25 * MIB];

fn op() -> impl Strategy<Value = Op> {
    // Sizes from the menu, or log-uniform from 1 B to 64 MiB: both pools,
    // every segment class, and out-of-memory errors on the 256 MiB device.
    let size = prop_oneof![
        1 => prop::sample::select(&MENU[..]),
        1 => (0u32..=26, 0.0f64..1.0).prop_map(|(exp, frac)| ((1u64 << exp) as f64 * (1.0 + frac)) as usize),
    ];
    prop_oneof![
        8 => (size, 0u64..2, 0..MemoryCategory::COUNT).prop_map(|(size, stream, category)| Op::Alloc { size, stream, category }),
        6 => any::<usize>().prop_map(|index| Op::Free { index }),
        1 => (any::<usize>(), 0..MemoryCategory::COUNT).prop_map(|(index, category)| Op::SetCategory { index, category }),
        1 => (any::<usize>(), 0u64..2).prop_map(|(index, stream)| Op::RecordStream { index, stream }),
        1 => Just(Op::EmptyCache),
    ]
}

fn config() -> impl Strategy<Value = AllocatorConfig> {
    prop_oneof![
        2 => Just(AllocatorConfig::default()),
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

/// An event without what depends on where memory is or when it happened.
fn placement_free(entry: &TraceEntry) -> TraceEntry {
    TraceEntry { addr: 0, time_us: 0, ..entry.clone() }
}

/// One allocator and what its caller holds.
struct Run {
    alloc: CachingAllocator<LayoutBackend>,
    live: Vec<Allocation<LayoutBackend>>,
}

/// A block of a snapshot without its address: (offset in its segment,
/// size, state, category).
type BlockView = (usize, usize, String, Option<MemoryCategory>);

/// What must not depend on the layout, observed after each step.
#[derive(Debug, PartialEq)]
struct Observed {
    /// Every statistic (reserved and allocated current and peak, segments,
    /// splits, per category, out-of-memory counts, …).
    stats: MemoryStats,
    /// Each live allocation, in the order the caller holds them: its
    /// offset in its segment, its block size and its segment's size.
    live: Vec<(usize, usize, usize)>,
    /// The segments, each as its blocks' (offset, size, state, category),
    /// sorted (snapshots list segments by address).
    segments: Vec<Vec<BlockView>>,
    /// The events since the previous step, addresses and times aside.
    events: Vec<TraceEntry>,
}

impl Run {
    fn new(layout: Layout, config: AllocatorConfig) -> Self {
        let alloc = CachingAllocator::with_config(LayoutBackend::new(layout), config);
        alloc.record_history(1 << 16);
        Run { alloc, live: Vec::new() }
    }

    /// Applies `op`; returns whether an allocation failed, and how.
    fn apply(&mut self, op: &Op) -> Option<String> {
        match *op {
            Op::Alloc { size, stream, category } => {
                let category = MemoryCategory::ALL[category];
                match self.alloc.allocate_as(size, StreamId(stream), category) {
                    Ok(block) => self.live.push(block),
                    // The message names sizes, never addresses.
                    Err(error) => return Some(error.to_string()),
                }
            }
            Op::Free { index } if !self.live.is_empty() => {
                let index = index % self.live.len();
                self.live.swap_remove(index);
            }
            Op::SetCategory { index, category } if !self.live.is_empty() => {
                let index = index % self.live.len();
                self.live[index].set_category(MemoryCategory::ALL[category]);
            }
            Op::RecordStream { index, stream } if !self.live.is_empty() => {
                let index = index % self.live.len();
                self.live[index].record_stream(StreamId(stream));
            }
            Op::EmptyCache => self.alloc.empty_cache(),
            _ => {}
        }
        None
    }

    fn observe(&self) -> Observed {
        let snapshot = self.alloc.snapshot();
        let segment_of = |addr: usize| {
            snapshot
                .segments
                .iter()
                .find(|s| s.address <= addr && addr < s.address + s.total_size)
                .expect("a live allocation lies in a segment")
        };
        let live = self
            .live
            .iter()
            .map(|block| {
                if block.size() == 0 {
                    return (0, 0, 0);
                }
                let segment = segment_of(block.addr());
                (block.addr() - segment.address, block.block_size(), segment.total_size)
            })
            .collect();
        let mut segments: Vec<_> = snapshot
            .segments
            .iter()
            .map(|s| {
                s.blocks.iter().map(|b| (b.address - s.address, b.size, format!("{:?}", b.state), b.category)).collect()
            })
            .collect();
        segments.sort();
        let events = self.alloc.history().iter().map(placement_free).collect();
        self.alloc.record_history(0);
        self.alloc.record_history(1 << 16);
        Observed { stats: self.alloc.stats(), live, segments, events }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn the_layout_of_addresses_changes_nothing(config in config(), ops in prop::collection::vec(op(), 1..120)) {
        let mut runs: Vec<Run> =
            [Layout::Rising, Layout::Falling, Layout::Scrambled].into_iter().map(|l| Run::new(l, config.clone())).collect();
        for (step, op) in ops.iter().enumerate() {
            let failures: Vec<Option<String>> = runs.iter_mut().map(|run| run.apply(op)).collect();
            prop_assert!(failures.iter().all(|f| *f == failures[0]), "step {step} {op:?}: {failures:?}");
            let observed: Vec<Observed> = runs.iter().map(Run::observe).collect();
            for (other, layout) in observed[1..].iter().zip(["falling", "scrambled"]) {
                prop_assert_eq!(&observed[0], other, "step {} {:?}: rising and {} addresses differ", step, op, layout);
            }
        }
        for run in &mut runs {
            run.live.clear();
            run.alloc.empty_cache();
        }
        let observed: Vec<Observed> = runs.iter().map(Run::observe).collect();
        prop_assert_eq!(&observed[0], &observed[1]);
        prop_assert_eq!(&observed[0], &observed[2]);
        prop_assert_eq!(observed[0].stats.reserved_bytes.all.current, 0);
    }
}

/// A case the free lists used to decide by address: two equal free blocks
/// in different segments, the request takes the one of the older segment
/// whatever the addresses.
#[test]
fn equal_free_blocks_go_by_segment_age() {
    for layout in [Layout::Rising, Layout::Falling, Layout::Scrambled] {
        let alloc = CachingAllocator::new(LayoutBackend::new(layout));
        let s = StreamId::DEFAULT;
        // Two 20 MiB segments (the second made while the first is taken).
        let first = alloc.allocate(12 * MIB, s).unwrap();
        let second = alloc.allocate(12 * MIB, s).unwrap();
        let (first_addr, second_addr) = (first.addr(), second.addr());
        drop(second);
        drop(first);
        // Both are free and unsplit; the next request of that size takes the older.
        let again = alloc.allocate(12 * MIB, s).unwrap();
        assert_eq!(again.addr(), first_addr, "{layout:?}: the older segment serves first");
        assert_ne!(again.addr(), second_addr);
    }
}
