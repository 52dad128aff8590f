//! Soak test: long random (seeded, reproducible) sequences of allocations,
//! frees, `record_stream` and per-stream allocation, event completion,
//! `empty_cache`, snapshots, peak resets and injected backend failures, on
//! every allocator configuration (default, `max_split_size`, power-of-two
//! rounding, garbage collection under a memory fraction, a memory fraction
//! alone, expandable segments with and without a fraction, and a backend so
//! small that most large requests fail), single-threaded and with several
//! threads at once.
//!
//! After every step of the single-threaded soak the allocator is compared
//! with a model the test keeps: the live blocks (address, size, stream),
//! the blocks freed while other streams still use them, and every event
//! the allocator reported to its observer during the step. Checked exactly:
//! allocated bytes = the live blocks, active = live + awaiting their
//! streams, requested bytes, counts; reserved = the snapshot's segments =
//! what the backend handed out (and within the memory fraction); the
//! snapshot's allocated and awaiting blocks are exactly the model's; blocks
//! tile their segments, free neighbours are merged, no two blocks (live or
//! across segments) overlap, each live block lies in a segment of its own
//! stream; every statistic's pools add up, `current = allocated - freed`,
//! the cumulative counters never go back, peaks are at least the current
//! values; the observer's events replay to the same allocated and reserved
//! bytes; a failure is an out-of-memory error that changes nothing but the
//! OOM counter.
//!
//! The threaded soak runs the same kinds of steps from four threads and
//! checks what can be checked while others run (no address handed out
//! twice, each snapshot and each copy of the statistics consistent in
//! itself) and the exact totals once they are done.
//!
//! Light form (the default, a few seconds in CI): 20,000 steps per
//! configuration single-threaded and 4 × 20,000 threaded. Heavy form:
//!
//! ```text
//! BRASA_SOAK_OPS=2000000 cargo test --release -p brasa-alloc --test soak
//! cargo test --release -p brasa-alloc --test soak -- --ignored   # 2,000,000 steps
//! ```
//!
//! `BRASA_SOAK_SEED=<n>` changes the seed (the default is fixed); a failure
//! names the configuration, seed and step, which replays it exactly.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_alloc::{
    Allocation, AllocatorConfig, BlockState, CachingAllocator, FailingBackend, MemoryStats, Snapshot, Stat, StatArray,
    StreamId, TraceAction, TraceEntry,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

const MIB: usize = 1 << 20;
const LIGHT_OPS: usize = 20_000;
const HEAVY_OPS: usize = 2_000_000;
const DEFAULT_SEED: u64 = 0x5EED_B4A5_A11C_0001;
const STREAMS: u64 = 4;

/// SplitMix64: small, fast, and the same on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Log-uniform from 1 B to 64 MiB (both pools, all segment classes),
    /// sometimes 0, an exact 512 B multiple, or a size no device holds.
    fn size(&mut self) -> usize {
        match self.below(100) {
            0 => 0,
            1 => usize::MAX - self.below(1024),
            2..=9 => 512 * (1 + self.below(4096)),
            _ => {
                let exp = self.below(27) as u32;
                let base = 1usize << exp;
                base + self.below(base)
            }
        }
    }
}

fn ops_from_env(default: usize) -> usize {
    std::env::var("BRASA_SOAK_OPS").ok().and_then(|v| v.trim().replace('_', "").parse().ok()).unwrap_or(default)
}

fn seed_from_env() -> u64 {
    std::env::var("BRASA_SOAK_SEED").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(DEFAULT_SEED)
}

/// A configuration under test, with the capacity of its backend.
struct Setup {
    name: &'static str,
    config: AllocatorConfig,
    capacity: usize,
}

fn setups() -> Vec<Setup> {
    let build = |b: brasa_alloc::AllocatorConfigBuilder| b.build().expect("valid configuration");
    vec![
        Setup { name: "default", config: AllocatorConfig::default(), capacity: 512 * MIB },
        Setup {
            name: "max_split_size_mb:24",
            config: build(AllocatorConfig::builder().max_split_size_mb(24)),
            capacity: 512 * MIB,
        },
        Setup {
            name: "roundup_power2_divisions:4,max_non_split_rounding_mb:8",
            config: build(AllocatorConfig::builder().roundup_power2_divisions(4).max_non_split_rounding_mb(8)),
            capacity: 512 * MIB,
        },
        Setup {
            name: "garbage_collection_threshold:0.5,per_process_memory_fraction:0.6",
            config: build(AllocatorConfig::builder().garbage_collection_threshold(0.5).memory_fraction(0.6)),
            capacity: 512 * MIB,
        },
        Setup {
            name: "per_process_memory_fraction:0.3",
            config: build(AllocatorConfig::builder().memory_fraction(0.3)),
            capacity: 512 * MIB,
        },
        Setup {
            name: "expandable_segments:True",
            config: build(AllocatorConfig::builder().expandable_segments(true)),
            capacity: 512 * MIB,
        },
        Setup {
            name: "expandable_segments:True,per_process_memory_fraction:0.5,garbage_collection_threshold:0.7",
            config: build(
                AllocatorConfig::builder()
                    .expandable_segments(true)
                    .memory_fraction(0.5)
                    .garbage_collection_threshold(0.7),
            ),
            capacity: 512 * MIB,
        },
        Setup {
            name: "max_split_size_mb:20 on a 96 MiB device",
            config: build(AllocatorConfig::builder().max_split_size_mb(20)),
            capacity: 96 * MIB,
        },
    ]
}

/// Where a failure happened, for the message.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    setup: &'a str,
    seed: u64,
    step: usize,
}

impl std::fmt::Display for Ctx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{}, BRASA_SOAK_SEED={}, step {}]", self.setup, self.seed, self.step)
    }
}

/// `assert!` with the context, formatted only on failure.
macro_rules! ensure {
    ($ctx:expr, $cond:expr, $($msg:tt)+) => {
        if !$cond {
            panic!("{} {}", $ctx, format!($($msg)+));
        }
    };
}

/// A block the test holds.
struct Live {
    block: Allocation<FailingBackend>,
    /// Other streams it was recorded on.
    uses: Vec<StreamId>,
}

/// A block dropped while other streams used it: awaiting their events.
struct Pending {
    addr: usize,
    size: usize,
    /// Its events were completed (the allocator notices at its next allocation).
    done: bool,
}

/// Every event the observer saw, in order.
type Events = Arc<Mutex<Vec<TraceEntry>>>;

fn observe(alloc: &CachingAllocator<FailingBackend>) -> Events {
    let events: Events = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&events);
    // No assertion in here: the allocator catches an observer's panic.
    alloc.set_observer(Some(Arc::new(move |entry: &TraceEntry| {
        sink.lock().unwrap_or_else(|e| e.into_inner()).push(entry.clone())
    })));
    events
}

fn take_events(events: &Events) -> Vec<TraceEntry> {
    std::mem::take(&mut *events.lock().unwrap_or_else(|e| e.into_inner()))
}

fn stat_arrays(stats: &MemoryStats) -> [(&'static str, &StatArray); 9] {
    [
        ("allocation", &stats.allocation),
        ("segment", &stats.segment),
        ("active", &stats.active),
        ("inactive_split", &stats.inactive_split),
        ("allocated_bytes", &stats.allocated_bytes),
        ("reserved_bytes", &stats.reserved_bytes),
        ("active_bytes", &stats.active_bytes),
        ("inactive_split_bytes", &stats.inactive_split_bytes),
        ("requested_bytes", &stats.requested_bytes),
    ]
}

/// Every stat with its name, pools included.
fn all_stats(stats: &MemoryStats) -> Vec<(String, Stat)> {
    let mut out = Vec::new();
    for (name, array) in stat_arrays(stats) {
        out.push((format!("{name}.all"), array.all));
        out.push((format!("{name}.large_pool"), array.large_pool));
        out.push((format!("{name}.small_pool"), array.small_pool));
    }
    out.push(("oversize_allocations".into(), stats.oversize_allocations));
    out.push(("oversize_segments".into(), stats.oversize_segments));
    out
}

fn counters(stats: &MemoryStats) -> [(&'static str, u64); 5] {
    [
        ("num_alloc_retries", stats.num_alloc_retries),
        ("num_ooms", stats.num_ooms),
        ("num_sync_all_streams", stats.num_sync_all_streams),
        ("num_device_alloc", stats.num_device_alloc),
        ("num_device_free", stats.num_device_free),
    ]
}

/// What holds of any copy of the statistics, whatever else is going on.
fn check_stats_alone(ctx: impl std::fmt::Display + Copy, stats: &MemoryStats) {
    for (name, array) in stat_arrays(stats) {
        let (all, large, small) = (array.all, array.large_pool, array.small_pool);
        ensure!(ctx, all.current == large.current + small.current, "{name}: pools do not add up: {array:?}");
        ensure!(ctx, all.allocated == large.allocated + small.allocated, "{name}: pools do not add up: {array:?}");
        ensure!(ctx, all.freed == large.freed + small.freed, "{name}: pools do not add up: {array:?}");
    }
    for (name, stat) in all_stats(stats) {
        ensure!(ctx, stat.current >= 0, "{name} is negative: {stat:?}");
        ensure!(ctx, stat.peak >= stat.current, "{name}: peak below current: {stat:?}");
        ensure!(
            ctx,
            stat.current == stat.allocated as i64 - stat.freed as i64,
            "{name}: current != allocated - freed: {stat:?}"
        );
    }
    ensure!(ctx, stats.reserved_bytes.all.current >= stats.allocated_bytes.all.current, "reserved < allocated");
    ensure!(ctx, stats.active_bytes.all.current >= stats.allocated_bytes.all.current, "active < allocated");
    ensure!(ctx, stats.requested_bytes.all.current <= stats.allocated_bytes.all.current, "requested > allocated");
}

/// What holds of any snapshot in itself; returns the reserved bytes it shows.
fn check_snapshot_alone(ctx: impl std::fmt::Display + Copy, snapshot: &Snapshot) -> usize {
    let mut end = 0;
    let mut reserved = 0;
    for segment in &snapshot.segments {
        ensure!(
            ctx,
            segment.address >= end,
            "segment at {:#x} overlaps the one before (ends {end:#x})",
            segment.address
        );
        ensure!(ctx, segment.total_size > 0 && !segment.blocks.is_empty(), "empty segment {segment:?}");
        end = segment.address + segment.total_size;
        reserved += segment.total_size;
        let mut cursor = segment.address;
        for (i, block) in segment.blocks.iter().enumerate() {
            ensure!(ctx, block.address == cursor, "blocks do not tile segment {:#x}", segment.address);
            ensure!(ctx, block.size > 0 && block.size % 512 == 0, "block size {}", block.size);
            cursor += block.size;
            if block.state == BlockState::Inactive {
                ensure!(ctx, block.requested_size == 0, "a free block has a requested size");
                if let Some(next) = segment.blocks.get(i + 1) {
                    ensure!(
                        ctx,
                        next.state != BlockState::Inactive,
                        "free neighbours at {:#x} not merged",
                        block.address
                    );
                }
            }
        }
        ensure!(ctx, cursor == end, "blocks do not cover segment {:#x}", segment.address);
        let allocated: usize =
            segment.blocks.iter().filter(|b| b.state == BlockState::ActiveAllocated).map(|b| b.size).sum();
        ensure!(ctx, segment.allocated_size == allocated, "segment allocated_size");
    }
    reserved
}

/// The single-threaded soak of one configuration.
struct Soak<'a> {
    setup: &'a Setup,
    seed: u64,
    rng: Rng,
    backend: FailingBackend,
    alloc: CachingAllocator<FailingBackend>,
    events: Events,
    live: Vec<Live>,
    zero_sized: Vec<Allocation<FailingBackend>>,
    pending: Vec<Pending>,
    /// The previous step's statistics (for monotone counters).
    previous: MemoryStats,
    /// Allocated and reserved bytes replayed from the observer's events.
    replay_allocated: usize,
    replay_reserved: usize,
    /// Backend failures left to inject with `fail_all` on.
    fail_all_steps: usize,
    step: usize,
}

impl<'a> Soak<'a> {
    fn new(setup: &'a Setup, seed: u64) -> Self {
        let backend = FailingBackend::new(setup.capacity);
        let alloc = CachingAllocator::with_config(backend.clone(), setup.config.clone());
        let events = observe(&alloc);
        Soak {
            setup,
            seed,
            rng: Rng(seed ^ setup.name.bytes().fold(0u64, |h, b| h.rotate_left(5) ^ u64::from(b))),
            previous: alloc.stats(),
            backend,
            alloc,
            events,
            live: Vec::new(),
            zero_sized: Vec::new(),
            pending: Vec::new(),
            replay_allocated: 0,
            replay_reserved: 0,
            fail_all_steps: 0,
            step: 0,
        }
    }

    fn ctx(&self) -> Ctx<'a> {
        Ctx { setup: self.setup.name, seed: self.seed, step: self.step }
    }

    fn run(&mut self, ops: usize) {
        for step in 0..ops {
            self.step = step;
            self.one_step();
            self.check();
        }
        self.finish();
    }

    fn one_step(&mut self) {
        if self.fail_all_steps > 0 {
            self.fail_all_steps -= 1;
            if self.fail_all_steps == 0 {
                self.backend.fail_all_allocations(false);
            }
        }
        match self.rng.below(1000) {
            0..=429 => {
                let size = self.rng.size();
                let stream = StreamId(self.rng.below(STREAMS as usize) as u64);
                self.allocate(size, stream);
            }
            430..=759 => self.free_one(),
            760..=819 => {
                if !self.live.is_empty() {
                    let i = self.rng.below(self.live.len());
                    let stream = StreamId(self.rng.below(STREAMS as usize) as u64);
                    let live = &mut self.live[i];
                    live.block.record_stream(stream);
                    if stream != live.block.stream() && !live.uses.contains(&stream) {
                        live.uses.push(stream);
                    }
                }
            }
            820..=859 => {
                self.backend.complete_events();
                for pending in &mut self.pending {
                    pending.done = true;
                }
            }
            860..=869 => self.empty_cache(),
            870..=899 => self.backend.fail_next_allocations(1 + self.rng.below(3)),
            900..=904 => {
                self.backend.fail_all_allocations(true);
                self.fail_all_steps = 1 + self.rng.below(20);
            }
            905..=914 => {
                self.alloc.reset_peak();
                let stats = self.alloc.stats();
                for (name, stat) in all_stats(&stats) {
                    ensure!(self.ctx(), stat.peak == stat.current, "reset_peak left {name} at {stat:?}");
                }
                self.previous = stats;
            }
            915..=924 => {
                // Drop about half of everything at once (coalescing, whole segments freed).
                let mut i = 0;
                while i < self.live.len() {
                    if self.rng.below(2) == 0 {
                        self.free_at(i);
                    } else {
                        i += 1;
                    }
                }
                self.zero_sized.clear();
            }
            925..=929 => {
                let json = self.alloc.snapshot().to_json();
                ensure!(self.ctx(), json.starts_with('{') && json.contains("\"segments\""), "snapshot JSON {json}");
                let _ = self.alloc.summary();
                let _ = self.alloc.stats().to_json();
                let report = self.alloc.fragmentation();
                ensure!(
                    self.ctx(),
                    report.releasable_bytes + report.inactive_split_bytes == report.free_cached_bytes
                        && report.largest_free_block <= report.free_cached_bytes,
                    "fragmentation report {report:?}"
                );
            }
            _ => self.free_one(),
        }
    }

    fn allocate(&mut self, size: usize, stream: StreamId) {
        let before = self.alloc.stats();
        let result = self.alloc.allocate(size, stream);
        if size > 0 {
            // The allocation processed every completed event first.
            self.pending.retain(|p| !p.done);
        }
        match result {
            Ok(block) if size == 0 => {
                ensure!(self.ctx(), block.block_size() == 0 && block.addr() == 0, "zero-byte allocation {block:?}");
                self.zero_sized.push(block);
            }
            Ok(block) => {
                let rounded = brasa_alloc::policy::round_size(size, &self.setup.config);
                ensure!(self.ctx(), rounded.is_some_and(|r| block.block_size() >= r), "{size} B served by {block:?}");
                ensure!(
                    self.ctx(),
                    block.size() == size && block.stream() == stream,
                    "{block:?} for {size} B on {stream}"
                );
                self.live.push(Live { block, uses: Vec::new() });
            }
            Err(error) => {
                let oom = error.as_out_of_memory();
                ensure!(self.ctx(), oom.is_some(), "allocation failed with something else: {error}");
                let oom = oom.expect("checked");
                ensure!(self.ctx(), oom.requested_bytes == size && oom.stream == stream, "OOM report {oom:?}");
                let after = self.alloc.stats();
                ensure!(self.ctx(), after.num_ooms == before.num_ooms + 1, "OOM not counted");
                ensure!(
                    self.ctx(),
                    after.allocated_bytes == before.allocated_bytes && after.allocation == before.allocation,
                    "a failed allocation changed what is allocated"
                );
            }
        }
    }

    fn free_one(&mut self) {
        if !self.live.is_empty() {
            let i = self.rng.below(self.live.len());
            self.free_at(i);
        } else {
            self.zero_sized.pop();
        }
    }

    fn free_at(&mut self, i: usize) {
        let live = self.live.swap_remove(i);
        let (addr, size) = (live.block.addr(), live.block.block_size());
        drop(live.block);
        if !live.uses.is_empty() {
            self.pending.push(Pending { addr, size, done: false });
        }
    }

    fn empty_cache(&mut self) {
        self.alloc.empty_cache();
        self.pending.clear();
        let stats = self.alloc.stats();
        let fragmentation = self.alloc.fragmentation();
        ensure!(
            self.ctx(),
            fragmentation.releasable_bytes == 0,
            "empty_cache left releasable bytes: {fragmentation:?}"
        );
        ensure!(
            self.ctx(),
            stats.active_bytes.all.current == stats.allocated_bytes.all.current,
            "awaiting blocks after empty_cache"
        );
    }

    /// Every invariant, against the model.
    fn check(&mut self) {
        let ctx = self.ctx();
        let stats = self.alloc.stats();
        let snapshot = self.alloc.snapshot();
        if stats.num_sync_all_streams > self.previous.num_sync_all_streams {
            // The out-of-memory ladder (or empty_cache) waited for every stream.
            self.pending.clear();
        }
        check_stats_alone(ctx, &stats);

        // Counters only go up; peaks only go up (reset_peak updates `previous`).
        for ((name, now), (_, before)) in all_stats(&stats).into_iter().zip(all_stats(&self.previous)) {
            ensure!(
                ctx,
                now.allocated >= before.allocated && now.freed >= before.freed,
                "{name} went back: {before:?} -> {now:?}"
            );
            ensure!(ctx, now.peak >= before.peak, "{name} peak went back: {before:?} -> {now:?}");
        }
        for ((name, now), (_, before)) in counters(&stats).into_iter().zip(counters(&self.previous)) {
            ensure!(ctx, now >= before, "{name} went back: {before} -> {now}");
        }

        // Allocated and active against the model.
        let allocated: usize = self.live.iter().map(|l| l.block.block_size()).sum();
        let requested: usize = self.live.iter().map(|l| l.block.size()).sum();
        let awaiting: usize = self.pending.iter().map(|p| p.size).sum();
        ensure!(
            ctx,
            stats.allocated_bytes.all.current as usize == allocated,
            "allocated {} != live blocks {allocated}",
            stats.allocated_bytes.all.current
        );
        ensure!(
            ctx,
            stats.requested_bytes.all.current as usize == requested,
            "requested {} != {requested}",
            stats.requested_bytes.all.current
        );
        ensure!(
            ctx,
            stats.allocation.all.current as usize == self.live.len(),
            "allocation count {} != {}",
            stats.allocation.all.current,
            self.live.len()
        );
        ensure!(
            ctx,
            stats.active_bytes.all.current as usize == allocated + awaiting,
            "active {} != live {allocated} + awaiting {awaiting}",
            stats.active_bytes.all.current
        );
        ensure!(ctx, stats.active.all.current as usize == self.live.len() + self.pending.len(), "active count");

        // Reserved against the snapshot, the backend and the fraction.
        let reserved = check_snapshot_alone(ctx, &snapshot);
        ensure!(
            ctx,
            stats.reserved_bytes.all.current as usize == reserved,
            "reserved {} != segments {reserved}",
            stats.reserved_bytes.all.current
        );
        ensure!(ctx, stats.segment.all.current as usize == snapshot.segments.len(), "segment count");
        ensure!(
            ctx,
            self.backend.bytes_in_use() == reserved,
            "backend holds {} != reserved {reserved}",
            self.backend.bytes_in_use()
        );
        ensure!(ctx, reserved <= self.setup.capacity, "reserved beyond the device");
        if self.setup.config.memory_fraction < 1.0 {
            let allowed = self.setup.config.allowed_bytes(self.setup.capacity);
            ensure!(ctx, reserved <= allowed, "reserved {reserved} beyond the fraction's {allowed}");
        }
        let mut inactive_split = 0;
        for segment in snapshot.segments.iter().filter(|s| !s.expandable && s.blocks.len() > 1) {
            inactive_split +=
                segment.blocks.iter().filter(|b| b.state == BlockState::Inactive).map(|b| b.size).sum::<usize>();
        }
        ensure!(ctx, stats.inactive_split_bytes.all.current as usize == inactive_split, "inactive_split_bytes");

        // The snapshot's blocks in use are exactly the model's, each in a
        // segment of its stream, none overlapping another.
        let mut in_use: BTreeMap<usize, (usize, BlockState, StreamId)> = BTreeMap::new();
        for segment in &snapshot.segments {
            for block in segment.blocks.iter().filter(|b| b.state != BlockState::Inactive) {
                in_use.insert(block.address, (block.size, block.state, segment.stream));
            }
        }
        let mut expected: BTreeMap<usize, (usize, BlockState, StreamId)> = BTreeMap::new();
        for live in &self.live {
            let entry = (live.block.block_size(), BlockState::ActiveAllocated, live.block.stream());
            ensure!(
                ctx,
                expected.insert(live.block.addr(), entry).is_none(),
                "address {:#x} handed out twice",
                live.block.addr()
            );
        }
        for pending in &self.pending {
            let stream = in_use.get(&pending.addr).map_or(StreamId(u64::MAX), |b| b.2);
            let entry = (pending.size, BlockState::ActiveAwaitingFree, stream);
            ensure!(ctx, expected.insert(pending.addr, entry).is_none(), "address {:#x} awaiting twice", pending.addr);
        }
        let mut end = 0;
        for (&addr, &(size, ..)) in &expected {
            ensure!(ctx, addr >= end, "blocks overlap at {addr:#x} (the one before ends at {end:#x})");
            end = addr + size;
        }
        if in_use != expected {
            let missing: Vec<_> = expected.iter().filter(|(a, v)| in_use.get(a) != Some(v)).take(4).collect();
            let extra: Vec<_> = in_use.iter().filter(|(a, v)| expected.get(a) != Some(v)).take(4).collect();
            panic!("{ctx} snapshot blocks in use differ from the model: expected but not shown {missing:x?}; shown but not expected {extra:x?}");
        }

        // The observer's events replay to the same figures, and each one
        // carries the totals after it.
        for event in take_events(&self.events) {
            match event.action {
                TraceAction::Alloc => self.replay_allocated += event.size,
                TraceAction::FreeRequested => self.replay_allocated -= event.size,
                TraceAction::SegmentAlloc | TraceAction::SegmentMap => self.replay_reserved += event.size,
                TraceAction::SegmentFree | TraceAction::SegmentUnmap => self.replay_reserved -= event.size,
                // free_completed, oom, quarantine, retag: no bytes change hands.
                _ => {}
            }
            ensure!(
                ctx,
                event.total_allocated == self.replay_allocated && event.total_reserved == self.replay_reserved,
                "event {event:?} says allocated/reserved {}/{}, the replay {}/{}",
                event.total_allocated,
                event.total_reserved,
                self.replay_allocated,
                self.replay_reserved
            );
        }
        ensure!(
            ctx,
            self.replay_allocated == allocated && self.replay_reserved == reserved,
            "replayed events disagree"
        );
        self.previous = stats;
    }

    /// Everything dropped and the cache emptied: nothing is left anywhere.
    fn finish(&mut self) {
        self.backend.fail_all_allocations(false);
        self.backend.fail_next_allocations(0);
        self.live.clear();
        self.zero_sized.clear();
        self.alloc.empty_cache();
        self.pending.clear();
        self.check();
        let stats = self.alloc.stats();
        let ctx = self.ctx();
        ensure!(
            ctx,
            stats.allocated_bytes.all.current == 0 && stats.active_bytes.all.current == 0,
            "left active: {stats:?}"
        );
        ensure!(ctx, stats.reserved_bytes.all.current == 0 && self.backend.bytes_in_use() == 0, "left reserved");
        ensure!(ctx, stats.allocation.all.allocated == stats.allocation.all.freed, "allocations != frees");
        ensure!(ctx, stats.num_device_alloc >= stats.num_device_free, "more device frees than allocations");
        ensure!(ctx, self.backend.pending_events() == 0, "events left pending");
    }
}

fn soak_every_configuration(ops: usize) {
    let seed = seed_from_env();
    for setup in setups() {
        let started = std::time::Instant::now();
        Soak::new(&setup, seed).run(ops);
        eprintln!("soak {}: {ops} steps in {:.2?}", setup.name, started.elapsed());
    }
}

#[test]
fn soak_every_configuration_light() {
    soak_every_configuration(ops_from_env(LIGHT_OPS));
}

#[test]
#[ignore = "heavy: 2,000,000 steps per configuration (run with --release -- --ignored)"]
fn soak_every_configuration_heavy() {
    soak_every_configuration(ops_from_env(HEAVY_OPS));
}

/// Addresses handed out and not yet returned, across threads.
type Registry = Mutex<BTreeMap<usize, (usize, usize)>>;

fn claim(ctx: impl std::fmt::Display + Copy, registry: &Registry, addr: usize, size: usize, thread: usize) {
    let mut held = registry.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((&before, &(before_size, owner))) = held.range(..=addr).next_back() {
        ensure!(
            ctx,
            before + before_size <= addr,
            "{addr:#x}+{size} overlaps {before:#x}+{before_size} held by thread {owner}"
        );
    }
    if let Some((&after, &(_, owner))) = held.range(addr..).next() {
        ensure!(ctx, addr + size <= after, "{addr:#x}+{size} overlaps {after:#x} held by thread {owner}");
    }
    held.insert(addr, (size, thread));
}

fn soak_threads(setup: &Setup, seed: u64, threads: usize, ops: usize) {
    let backend = FailingBackend::new(setup.capacity);
    let alloc = CachingAllocator::with_config(backend.clone(), setup.config.clone());
    let registry: Arc<Registry> = Arc::new(Mutex::new(BTreeMap::new()));
    let name = setup.name;
    let successes: usize = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (alloc, backend, registry) = (alloc.clone(), backend.clone(), Arc::clone(&registry));
                scope.spawn(move || {
                    let mut rng = Rng(seed ^ (t as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407));
                    let mut held: Vec<Allocation<FailingBackend>> = Vec::new();
                    let mut successes = 0;
                    for step in 0..ops {
                        let ctx = Ctx { setup: name, seed, step };
                        match rng.below(100) {
                            0..=44 => {
                                let size = rng.size();
                                let stream = StreamId(rng.below(STREAMS as usize) as u64);
                                match alloc.allocate(size, stream) {
                                    Ok(block) => {
                                        if size > 0 {
                                            successes += 1;
                                            claim(ctx, &registry, block.addr(), block.block_size(), t);
                                        }
                                        held.push(block);
                                    }
                                    Err(error) => {
                                        ensure!(ctx, error.as_out_of_memory().is_some(), "thread {t}: {error}")
                                    }
                                }
                            }
                            45..=84 if !held.is_empty() => {
                                let block = held.swap_remove(rng.below(held.len()));
                                if block.size() > 0 {
                                    let removed =
                                        registry.lock().unwrap_or_else(|e| e.into_inner()).remove(&block.addr());
                                    ensure!(
                                        ctx,
                                        removed == Some((block.block_size(), t)),
                                        "thread {t}: {block:?} was not ours"
                                    );
                                }
                                drop(block);
                            }
                            85..=89 if !held.is_empty() => {
                                held[rng.below(held.len())].record_stream(StreamId(rng.below(STREAMS as usize) as u64))
                            }
                            90..=92 => backend.complete_events(),
                            93 => alloc.empty_cache(),
                            94..=95 => backend.fail_next_allocations(1),
                            96..=97 => check_stats_alone(ctx, &alloc.stats()),
                            98 => {
                                check_snapshot_alone(ctx, &alloc.snapshot());
                            }
                            _ => {}
                        }
                    }
                    for block in held.drain(..) {
                        if block.size() > 0 {
                            registry.lock().unwrap_or_else(|e| e.into_inner()).remove(&block.addr());
                        }
                    }
                    successes
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a soak thread panicked")).sum()
    });
    let ctx = Ctx { setup: name, seed, step: ops };
    backend.fail_next_allocations(0);
    alloc.empty_cache();
    let stats = alloc.stats();
    check_stats_alone(ctx, &stats);
    ensure!(
        ctx,
        stats.allocation.all.allocated as usize == successes,
        "{} allocations counted, {successes} made",
        stats.allocation.all.allocated
    );
    ensure!(
        ctx,
        stats.allocation.all.freed as usize == successes,
        "{} frees counted, {successes} made",
        stats.allocation.all.freed
    );
    ensure!(
        ctx,
        stats.allocated_bytes.all.current == 0 && stats.active_bytes.all.current == 0,
        "left active: {stats:?}"
    );
    ensure!(ctx, stats.reserved_bytes.all.current == 0, "left reserved: {stats:?}");
    ensure!(ctx, backend.bytes_in_use() == 0, "the backend still holds {} bytes", backend.bytes_in_use());
    ensure!(ctx, registry.lock().unwrap_or_else(|e| e.into_inner()).is_empty(), "registry not empty");
    check_snapshot_alone(ctx, &alloc.snapshot());
    ensure!(ctx, alloc.snapshot().segments.is_empty(), "segments left after empty_cache");
}

fn soak_threads_every_configuration(ops_per_thread: usize) {
    let seed = seed_from_env();
    for setup in setups() {
        let started = std::time::Instant::now();
        soak_threads(&setup, seed, 4, ops_per_thread);
        eprintln!("threaded soak {}: 4 x {ops_per_thread} steps in {:.2?}", setup.name, started.elapsed());
    }
}

#[test]
fn soak_threads_every_configuration_light() {
    soak_threads_every_configuration(ops_from_env(LIGHT_OPS));
}

#[test]
#[ignore = "heavy: 4 threads x 500,000 steps per configuration (run with --release -- --ignored)"]
fn soak_threads_every_configuration_heavy() {
    soak_threads_every_configuration(ops_from_env(HEAVY_OPS) / 4);
}
