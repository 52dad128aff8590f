//! The caching allocator: PyTorch's policy over any [`Backend`].
//!
//! A request is rounded ([`round_size`]), served best-fit from its stream's
//! free list in the small or large pool, and the block split when the rules
//! allow ([`should_split`]). When nothing fits, a segment is obtained from the
//! backend; when the backend is full, the out-of-memory ladder runs:
//!
//! 1. with `max_split_size` set, release cached oversize blocks of the stream;
//! 2. wait for every outstanding stream event and release every unsplit cached
//!    segment (only when that could cover the request: a futile release would
//!    throw the cache away for nothing), then retry;
//! 3. return [`AllocError::OutOfMemory`] with a report a person can act on.
//!
//! Freed blocks merge with free neighbours; nothing goes back to the backend
//! until [`CachingAllocator::empty_cache`], garbage collection or the ladder.
//!
//! With `expandable_segments` on (and a backend that maps address ranges),
//! each stream and pool has one segment that grows page by page instead
//! (see the `expandable` module); the ladder then unmaps whole free pages.

mod allocation;
mod expandable;
mod inspect;
mod release;

pub use allocation::Allocation;

use crate::backend::{Backend, BackendError, StreamId};
use crate::block::{Block, BlockArena, BlockId};
use crate::config::AllocatorConfig;
use crate::error::{AllocError, OutOfMemory};
use crate::policy::{oversize_rule_allows, round_size, segment_size, should_split, PoolKind, MIN_BLOCK_SIZE};
use crate::pool::{FreeList, StreamSlots};
use crate::snapshot::{FragmentationReport, Snapshot};
use crate::stats::MemoryStats;
use crate::trace::{guard_observer, History, Observer, TraceAction, TraceEntry};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

#[derive(Debug, Clone, Copy)]
struct Segment {
    size: usize,
    pool: PoolKind,
    stream: StreamId,
    /// The lowest-address block; merges keep the lower block's id, so it never changes.
    head: BlockId,
    /// The page size of an expandable segment (whose `size` is its address
    /// range); `None` for a fixed segment.
    page: Option<usize>,
}

/// A caching allocator for one device. Clones share the same cache.
pub struct CachingAllocator<B: Backend> {
    shared: Arc<Shared<B>>,
}

impl<B: Backend> Clone for CachingAllocator<B> {
    fn clone(&self) -> Self {
        CachingAllocator { shared: Arc::clone(&self.shared) }
    }
}

struct Shared<B: Backend> {
    backend: B,
    state: Mutex<State<B::Event>>,
}

struct State<E> {
    config: AllocatorConfig,
    blocks: BlockArena,
    free_small: FreeList,
    free_large: FreeList,
    segments: BTreeMap<usize, Segment>,
    stream_slots: StreamSlots,
    stats: MemoryStats,
    /// Events per stream, oldest first, with the block each one holds back.
    pending_events: BTreeMap<StreamId, VecDeque<(E, BlockId)>>,
    pending_event_count: usize,
    /// Free-list lookups per pool (small, large): the clock of block ages.
    lookups: [u64; 2],
    /// Device capacity, read once.
    capacity: usize,
    history: History,
    observer: Option<Observer>,
    /// Events to hand to the observer once the lock is released.
    notifications: Vec<TraceEntry>,
    created: Instant,
}

impl<B: Backend> CachingAllocator<B> {
    /// A caching allocator over `backend` with the default configuration.
    pub fn new(backend: B) -> Self {
        Self::with_config(backend, AllocatorConfig::default())
    }

    /// A caching allocator configured by `BRASA_ALLOC_CONF` (or the defaults).
    pub fn from_env(backend: B) -> Result<Self, AllocError> {
        Ok(Self::with_config(backend, AllocatorConfig::from_env()?))
    }

    /// A caching allocator over `backend` with `config`.
    pub fn with_config(backend: B, config: AllocatorConfig) -> Self {
        let capacity = backend.total_bytes();
        let stats = MemoryStats { max_split_size: config.max_split_size, ..MemoryStats::default() };
        let state = State {
            config,
            blocks: BlockArena::default(),
            free_small: FreeList::default(),
            free_large: FreeList::default(),
            segments: BTreeMap::new(),
            stream_slots: StreamSlots::default(),
            stats,
            pending_events: BTreeMap::new(),
            pending_event_count: 0,
            lookups: [0; 2],
            capacity,
            history: History::default(),
            observer: None,
            notifications: Vec::new(),
            created: Instant::now(),
        };
        CachingAllocator { shared: Arc::new(Shared { backend, state: Mutex::new(state) }) }
    }

    /// The backend under the cache.
    pub fn backend(&self) -> &B {
        &self.shared.backend
    }

    /// The device's name.
    pub fn device_name(&self) -> String {
        self.shared.backend.device_name()
    }

    /// Allocates `size` bytes for use on `stream`.
    pub fn allocate(&self, size: usize, stream: StreamId) -> Result<Allocation<B>, AllocError> {
        if size == 0 {
            return Ok(Allocation::new(None, BlockId(0), 0, 0, 0, stream));
        }
        let (result, notifications, observer) = {
            let mut state = self.shared.lock();
            let result = state.malloc(&self.shared.backend, size, stream);
            let (notifications, observer) = state.take_notifications();
            (result, notifications, observer)
        };
        notify(observer, notifications);
        let (block, addr, block_size) = result?;
        Ok(Allocation::new(Some(Arc::clone(&self.shared)), block, addr, size, block_size, stream))
    }

    /// Returns every cached segment that holds no allocation to the backend,
    /// after waiting for outstanding stream events.
    pub fn empty_cache(&self) {
        self.shared.with_state(|state, backend| state.release_cached_blocks(backend));
    }

    /// A copy of the statistics.
    pub fn stats(&self) -> MemoryStats {
        self.shared.lock().stats.clone()
    }

    /// Bytes held by live allocations (`memory_allocated`).
    pub fn allocated_bytes(&self) -> usize {
        self.shared.lock().stats.allocated_bytes.all.current as usize
    }

    /// Bytes reserved from the backend (`memory_reserved`).
    pub fn reserved_bytes(&self) -> usize {
        self.shared.lock().stats.reserved_bytes.all.current as usize
    }

    /// Sets every peak to its current value.
    pub fn reset_peak(&self) {
        self.shared.lock().stats.reset_peak();
    }

    /// Zeroes cumulative counts and counters.
    pub fn reset_accumulated(&self) {
        self.shared.lock().stats.reset_accumulated();
    }

    /// The configuration in force.
    pub fn config(&self) -> AllocatorConfig {
        self.shared.lock().config.clone()
    }

    /// Limits the bytes this allocator may reserve to `fraction` of the
    /// device's capacity (`set_per_process_memory_fraction`).
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<(), AllocError> {
        let checked = AllocatorConfig::builder().memory_fraction(fraction).build()?;
        self.shared.lock().config.memory_fraction = checked.memory_fraction;
        Ok(())
    }

    /// Records the last `max_entries` events (0 turns recording off and clears it).
    pub fn record_history(&self, max_entries: usize) {
        let mut state = self.shared.lock();
        state.history.max_entries = max_entries;
        if max_entries == 0 {
            state.history.entries.clear();
        }
        while state.history.entries.len() > max_entries {
            state.history.entries.pop_front();
        }
    }

    /// The recorded events, oldest first.
    pub fn history(&self) -> Vec<TraceEntry> {
        self.shared.lock().history.entries.iter().cloned().collect()
    }

    /// Registers a function called with every event (or removes it with `None`).
    /// It runs after the allocator's lock is released, on the thread that caused the event.
    /// A panic in it is caught (the allocation or free completes as if it had
    /// not been observed), disables it and is reported once on stderr.
    pub fn set_observer(&self, observer: Option<Observer>) {
        let previous = std::mem::replace(&mut self.shared.lock().observer, observer.map(guard_observer));
        // Dropped outside the lock: an observer's drop may call back in.
        drop(previous);
    }

    /// Segments with their blocks and states, plus the recorded history.
    pub fn snapshot(&self) -> Snapshot {
        let state = self.shared.lock();
        state.snapshot(self.shared.backend.device_name())
    }

    /// The largest free block, free bytes in the cache and how they are split.
    pub fn fragmentation(&self) -> FragmentationReport {
        self.shared.lock().fragmentation()
    }

    /// The statistics as a table, like `torch.cuda.memory_summary()`.
    pub fn summary(&self) -> String {
        crate::summary::memory_summary(&self.device_name(), &self.stats(), false)
    }
}

impl<B: Backend> Shared<B> {
    fn lock(&self) -> MutexGuard<'_, State<B::Event>> {
        // A panic while the lock was held cannot leave the cache half-updated in a
        // way that matters more than losing the whole allocator, so carry on.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn with_state<R>(&self, f: impl FnOnce(&mut State<B::Event>, &B) -> R) -> R {
        let (result, notifications, observer) = {
            let mut state = self.lock();
            let result = f(&mut state, &self.backend);
            let (notifications, observer) = state.take_notifications();
            (result, notifications, observer)
        };
        notify(observer, notifications);
        result
    }

    fn free(&self, block: BlockId) {
        self.with_state(|state, backend| state.free(backend, block));
    }
}

fn notify(observer: Option<Observer>, notifications: Vec<TraceEntry>) {
    if let Some(observer) = observer {
        for entry in &notifications {
            observer.on_event(entry);
        }
    }
}

impl<E> State<E> {
    fn take_notifications(&mut self) -> (Vec<TraceEntry>, Option<Observer>) {
        if self.notifications.is_empty() {
            (Vec::new(), None)
        } else {
            (std::mem::take(&mut self.notifications), self.observer.clone())
        }
    }

    #[inline]
    fn recording(&self) -> bool {
        self.history.max_entries > 0 || self.observer.as_ref().is_some_and(|o| o.enabled())
    }

    fn record(&mut self, action: TraceAction, addr: usize, size: usize, requested_size: usize, stream: StreamId) {
        if !self.recording() {
            return;
        }
        self.record_with_free(action, addr, size, requested_size, stream, 0);
    }

    fn record_with_free(
        &mut self,
        action: TraceAction,
        addr: usize,
        size: usize,
        requested_size: usize,
        stream: StreamId,
        device_free: usize,
    ) {
        let entry = TraceEntry {
            action,
            addr,
            size,
            requested_size,
            stream,
            time_us: self.created.elapsed().as_micros() as u64,
            device_free,
            total_allocated: self.stats.allocated_bytes.all.current as usize,
            total_reserved: self.stats.reserved_bytes.all.current as usize,
        };
        if self.observer.as_ref().is_some_and(|o| o.enabled()) {
            self.notifications.push(entry.clone());
        }
        self.history.push(entry);
    }

    #[inline]
    fn free_list(&mut self, pool: PoolKind) -> &mut FreeList {
        match pool {
            PoolKind::Small => &mut self.free_small,
            PoolKind::Large => &mut self.free_large,
        }
    }

    #[inline]
    fn is_oversize(&self, size: usize) -> bool {
        size >= self.config.max_split_size
    }

    fn malloc<B: Backend<Event = E>>(
        &mut self,
        backend: &B,
        size: usize,
        stream: StreamId,
    ) -> Result<(BlockId, usize, usize), AllocError> {
        self.process_events(backend);
        let Some(rounded) = round_size(size, &self.config) else {
            return Err(self.too_large(backend, stream, size));
        };
        let pool = PoolKind::for_size(rounded);
        let block = match self.take_free_block(pool, stream, rounded) {
            Some(block) => block,
            None => self.obtain_memory(backend, pool, stream, size, rounded)?,
        };
        Ok(self.hand_out(block, rounded, size))
    }

    /// Best fit on `stream` within the oversize rules, removed from its free list.
    #[inline]
    fn take_free_block(&mut self, pool: PoolKind, stream: StreamId, rounded: usize) -> Option<BlockId> {
        self.lookups[pool as usize] += 1;
        let slot = self.stream_slots.slot(stream);
        let (size, id) = self.free_list(pool).best_fit(slot, rounded)?;
        let block = self.blocks.get(id);
        // Expandable segments split every block, so none is "oversize".
        if !block.expandable && !oversize_rule_allows(size, rounded, &self.config) {
            return None;
        }
        let addr = block.addr;
        self.free_list(pool).remove(slot, size, addr);
        Some(id)
    }

    /// Memory from the backend for the request — a new segment, or more pages
    /// of the stream's expandable segment — running the out-of-memory ladder
    /// if needed.
    fn obtain_memory<B: Backend<Event = E>>(
        &mut self,
        backend: &B,
        pool: PoolKind,
        stream: StreamId,
        requested: usize,
        rounded: usize,
    ) -> Result<BlockId, AllocError> {
        let page = self.expandable_page(backend, pool);
        // What one attempt asks the backend for (for an expandable segment, at most this).
        let bytes = match page {
            Some(page) => rounded.div_ceil(page) * page,
            None => segment_size(rounded),
        };
        let obtain = |state: &mut Self| match page {
            Some(page) => state.grow_expandable_segment(backend, pool, stream, rounded, page),
            None => state.new_segment(backend, pool, stream, bytes),
        };
        if self.config.garbage_collection_threshold > 0.0 && self.config.memory_fraction < 1.0 {
            self.garbage_collect(backend);
        }
        match obtain(self) {
            Ok(block) => return Ok(block),
            Err(BackendError::OutOfMemory { .. }) => {}
            Err(source) => return Err(AllocError::Backend { device: backend.device_name(), source }),
        }
        if self.config.max_split_size != usize::MAX && self.release_available_cached_blocks(backend, stream, rounded) {
            if let Ok(block) = obtain(self) {
                return Ok(block);
            }
        }
        if self.cache_release_could_cover(backend, bytes) {
            self.release_cached_blocks(backend);
            self.stats.num_alloc_retries += 1;
            if let Ok(block) = obtain(self) {
                return Ok(block);
            }
        }
        Err(self.out_of_memory(backend, stream, requested, rounded, bytes))
    }

    /// The error for a request larger than any block ([`round_size`] gave
    /// up on it): no device has that much, and nothing in the cache can
    /// serve it, so it is an out-of-memory error at once (as in PyTorch).
    /// Kept out of line: the hot path only tests for it.
    #[cold]
    #[inline(never)]
    fn too_large<B: Backend<Event = E>>(&mut self, backend: &B, stream: StreamId, size: usize) -> AllocError {
        self.out_of_memory(backend, stream, size, size, size)
    }

    fn out_of_memory<B: Backend<Event = E>>(
        &mut self,
        backend: &B,
        stream: StreamId,
        requested: usize,
        rounded: usize,
        segment_bytes: usize,
    ) -> AllocError {
        let device_free = backend.free_bytes();
        self.stats.num_ooms += 1;
        self.record_with_free(TraceAction::Oom, 0, rounded, requested, stream, device_free);
        let fragmentation = self.fragmentation();
        let report = OutOfMemory {
            device: backend.device_name(),
            stream,
            requested_bytes: requested,
            rounded_bytes: rounded,
            segment_bytes,
            capacity_bytes: self.capacity,
            device_free_bytes: device_free,
            allowed_bytes: (self.config.memory_fraction < 1.0).then(|| self.config.allowed_bytes(self.capacity)),
            allocated_bytes: self.stats.allocated_bytes.all.current as usize,
            reserved_bytes: self.stats.reserved_bytes.all.current as usize,
            largest_free_block: fragmentation.largest_free_block,
            inactive_split_bytes: fragmentation.inactive_split_bytes,
        };
        AllocError::OutOfMemory(Box::new(report))
    }

    /// Whether releasing the cache could make room for a segment of `bytes`.
    fn cache_release_could_cover<B: Backend<Event = E>>(&self, backend: &B, bytes: usize) -> bool {
        if self.pending_event_count > 0 {
            // Blocks waiting on events may merge into whole segments once synchronized.
            return true;
        }
        // Even with nothing releasable, a retry is worth it when the device has
        // room now (an oversize release just before may have made it).
        let releasable = self.releasable_bytes();
        let reserved_after = self.stats.reserved_bytes.all.current as usize - releasable;
        let allowed = self.config.allowed_bytes(self.capacity);
        let fits_fraction = reserved_after + bytes <= allowed;
        let fits_device = backend.free_bytes().saturating_add(releasable) >= bytes;
        fits_fraction && fits_device
    }

    /// Bytes the cache could give back to the backend now.
    fn releasable_bytes(&self) -> usize {
        self.free_small.ids().chain(self.free_large.ids()).map(|id| self.releasable_size(id)).sum()
    }

    fn new_segment<B: Backend<Event = E>>(
        &mut self,
        backend: &B,
        pool: PoolKind,
        stream: StreamId,
        bytes: usize,
    ) -> Result<BlockId, BackendError> {
        if self.config.memory_fraction < 1.0 {
            let allowed = self.config.allowed_bytes(self.capacity);
            if self.stats.reserved_bytes.all.current as usize + bytes > allowed {
                return Err(BackendError::OutOfMemory { requested: bytes });
            }
        }
        let addr = backend.allocate(bytes)?;
        let stream_slot = self.stream_slots.slot(stream);
        let block = self.blocks.insert(Block::whole_segment(
            addr,
            bytes,
            (stream, stream_slot),
            pool,
            self.lookups[pool as usize],
            false,
        ));
        self.segments.insert(addr, Segment { size: bytes, pool, stream, head: block, page: None });
        self.stats.segment.increase(pool, 1);
        self.stats.reserved_bytes.increase(pool, bytes as u64);
        self.stats.num_device_alloc += 1;
        if self.is_oversize(bytes) {
            self.stats.oversize_segments.increase(1);
        }
        self.record(TraceAction::SegmentAlloc, addr, bytes, bytes, stream);
        Ok(block)
    }

    /// Marks a free block allocated, splitting off the remainder when the rules say so.
    fn hand_out(&mut self, id: BlockId, rounded: usize, requested: usize) -> (BlockId, usize, usize) {
        let max_split = self.config.max_split_size;
        let block = self.blocks.get(id);
        let (pool, stream, stream_slot, addr, size, expandable) =
            (block.pool, block.stream, block.stream_slot, block.addr, block.size, block.expandable);
        if block.counts_as_split() {
            self.stats.inactive_split.decrease(pool, 1);
            self.stats.inactive_split_bytes.decrease(pool, size as u64);
        }
        let mut block_size = size;
        // Expandable segments split whenever 512 B remain, in both pools.
        let split =
            if expandable { size - rounded >= MIN_BLOCK_SIZE } else { should_split(pool, size, rounded, max_split) };
        if split {
            let remainder = self.split_off(id, addr + rounded);
            let remainder_size = size - rounded;
            self.blocks.get_mut(remainder).freed_at_lookup = self.lookups[pool as usize];
            self.free_list(pool).insert(stream_slot, remainder_size, addr + rounded, remainder);
            if !expandable {
                self.stats.inactive_split.increase(pool, 1);
                self.stats.inactive_split_bytes.increase(pool, remainder_size as u64);
            }
            block_size = rounded;
        }
        let block = self.blocks.get_mut(id);
        block.allocated = true;
        block.requested = requested;
        let stats = &mut self.stats;
        stats.allocation.increase(pool, 1);
        stats.allocated_bytes.increase(pool, block_size as u64);
        stats.active.increase(pool, 1);
        stats.active_bytes.increase(pool, block_size as u64);
        stats.requested_bytes.increase(pool, requested as u64);
        if block_size >= max_split {
            stats.oversize_allocations.increase(1);
        }
        self.record(TraceAction::Alloc, addr, block_size, requested, stream);
        (id, addr, block_size)
    }

    fn record_stream(&mut self, id: BlockId, stream: StreamId) {
        let block = self.blocks.get_mut(id);
        if stream != block.stream && !block.stream_uses.contains(&stream) {
            block.stream_uses.push(stream);
        }
    }

    /// The caller dropped an allocation.
    fn free<B: Backend<Event = E>>(&mut self, backend: &B, id: BlockId) {
        let max_split = self.config.max_split_size;
        let block = self.blocks.get_mut(id);
        block.allocated = false;
        let (pool, size, requested, addr, stream) = (block.pool, block.size, block.requested, block.addr, block.stream);
        let stream_uses = std::mem::take(&mut block.stream_uses);
        self.stats.allocation.decrease(pool, 1);
        self.stats.allocated_bytes.decrease(pool, size as u64);
        self.stats.requested_bytes.decrease(pool, requested as u64);
        if size >= max_split {
            self.stats.oversize_allocations.decrease(1);
        }
        self.record(TraceAction::FreeRequested, addr, size, requested, stream);
        let mut unsynchronised = false;
        for use_stream in stream_uses {
            match backend.record_event(use_stream) {
                Ok(event) => {
                    self.pending_events.entry(use_stream).or_default().push_back((event, id));
                    self.pending_event_count += 1;
                    self.blocks.get_mut(id).event_count += 1;
                }
                // Without an event, only waiting for the whole device makes
                // reuse safe; if that fails too, the stream may still be
                // using the block.
                Err(_) => unsynchronised |= backend.synchronize_device().is_err(),
            }
        }
        if unsynchronised {
            self.quarantine(id);
        } else if self.blocks.get(id).event_count == 0 {
            self.free_block(id);
        }
    }

    /// Takes a freed block out of circulation for good: a stream that used
    /// it could not be waited for, so its work may still read or write it.
    /// PyTorch raises at this point; a free comes from a `Drop`, which
    /// cannot, so the block leaves the active statistics for the quarantine
    /// counters, is traced (`quarantine`), shows as quarantined in
    /// snapshots, and keeps its segment reserved: it is never merged,
    /// reused, unmapped or given back to the backend.
    fn quarantine(&mut self, id: BlockId) {
        let block = self.blocks.get_mut(id);
        if block.quarantined {
            return;
        }
        block.quarantined = true;
        block.requested = 0;
        let (pool, addr, size, stream) = (block.pool, block.addr, block.size, block.stream);
        self.stats.active.decrease(pool, 1);
        self.stats.active_bytes.decrease(pool, size as u64);
        self.stats.quarantined_blocks += 1;
        self.stats.quarantined_bytes += size as u64;
        self.record(TraceAction::Quarantine, addr, size, size, stream);
    }

    /// Returns a block to its free list, merging it with free neighbours.
    fn free_block(&mut self, id: BlockId) {
        let block = self.blocks.get_mut(id);
        block.requested = 0;
        let (pool, addr, size, stream) = (block.pool, block.addr, block.size, block.stream);
        self.stats.active.decrease(pool, 1);
        self.stats.active_bytes.decrease(pool, size as u64);

        let survivor = self.merge_with_neighbours(id, Block::is_free_and_mapped);
        let lookups = self.lookups[pool as usize];
        let block = self.blocks.get_mut(survivor);
        block.freed_at_lookup = lookups;
        let (slot, merged_addr, split, merged_size) =
            (block.stream_slot, block.addr, block.counts_as_split(), block.size);
        self.free_list(pool).insert(slot, merged_size, merged_addr, survivor);
        if split {
            self.stats.inactive_split.increase(pool, 1);
            self.stats.inactive_split_bytes.increase(pool, merged_size as u64);
        }
        self.record(TraceAction::FreeCompleted, addr, size, size, stream);
    }

    /// A free mapped block with no pending events (so it is in its free list).
    fn is_mergeable(&self, id: BlockId) -> bool {
        self.blocks.get(id).is_free_and_mapped()
    }

    /// Merges a block with its neighbours where `joins` holds for them and
    /// returns the id of the merged block.
    fn merge_with_neighbours(&mut self, id: BlockId, joins: fn(&Block) -> bool) -> BlockId {
        let block = self.blocks.get(id);
        let (prev, next) = (block.prev, block.next);
        let mut survivor = id;
        if let Some(prev) = prev.filter(|p| joins(self.blocks.get(*p))) {
            self.absorb(prev, id);
            survivor = prev;
        }
        if let Some(next) = next.filter(|n| joins(self.blocks.get(*n))) {
            self.absorb(survivor, next);
        }
        survivor
    }

    /// How many of a block's neighbours are mapped (0 to 2).
    fn mapped_neighbours(&self, id: BlockId) -> u64 {
        let block = self.blocks.get(id);
        [block.prev, block.next].into_iter().flatten().filter(|n| self.blocks.get(*n).mapped).count() as u64
    }

    /// Splits a block at `at` (inside it): the block keeps `[addr, at)` and a
    /// new block with the same flags takes the rest, linked after it. Free
    /// lists and statistics are the caller's business.
    fn split_off(&mut self, id: BlockId, at: usize) -> BlockId {
        let block = self.blocks.get(id);
        debug_assert!(at > block.addr && at < block.addr + block.size);
        let upper = Block {
            addr: at,
            size: block.addr + block.size - at,
            requested: 0,
            prev: Some(id),
            stream_uses: Vec::new(),
            event_count: 0,
            allocated: false,
            ..block.clone()
        };
        let next = upper.next;
        let upper = self.blocks.insert(upper);
        if let Some(next) = next {
            self.blocks.get_mut(next).prev = Some(upper);
        }
        let block = self.blocks.get_mut(id);
        block.size = at - block.addr;
        block.next = Some(upper);
        upper
    }

    /// Merges `upper` (the next block) into `lower`. Those of them in a free
    /// list leave it (a free fixed-segment block there was an inactive split).
    fn absorb(&mut self, lower: BlockId, upper: BlockId) {
        for id in [lower, upper] {
            let block = self.blocks.get(id);
            let (pool, slot, size, addr, expandable) =
                (block.pool, block.stream_slot, block.size, block.addr, block.expandable);
            if self.free_list(pool).remove(slot, size, addr) && !expandable {
                self.stats.inactive_split.decrease(pool, 1);
                self.stats.inactive_split_bytes.decrease(pool, size as u64);
            }
        }
        let Some(upper_block) = self.blocks.remove(upper) else {
            return;
        };
        if let Some(next) = upper_block.next {
            self.blocks.get_mut(next).prev = Some(lower);
        }
        let lower_block = self.blocks.get_mut(lower);
        lower_block.size += upper_block.size;
        lower_block.next = upper_block.next;
    }

    /// Frees blocks whose stream events have all completed.
    fn process_events<B: Backend<Event = E>>(&mut self, backend: &B) {
        if self.pending_event_count == 0 {
            return;
        }
        let mut queues = std::mem::take(&mut self.pending_events);
        for queue in queues.values_mut() {
            // Per-stream queues: a slow stream does not hold back the others.
            while let Some((event, _)) = queue.front() {
                if !backend.event_completed(event) {
                    break;
                }
                if let Some((_, id)) = queue.pop_front() {
                    self.event_done(id);
                }
            }
        }
        queues.retain(|_, queue| !queue.is_empty());
        self.pending_events = queues;
    }

    fn event_done(&mut self, id: BlockId) {
        self.pending_event_count -= 1;
        let block = self.blocks.get_mut(id);
        block.event_count -= 1;
        if block.event_count == 0 && !block.quarantined {
            self.free_block(id);
        }
    }
}
