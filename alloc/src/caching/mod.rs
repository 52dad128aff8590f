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
//!
//! ## No decision depends on an address
//! Segments are numbered in creation order, and everything that picks one
//! block or segment over another uses that number, never where the backend
//! put the memory: free lists break ties between equal sizes by (segment
//! number, offset in the segment) (`pool.rs`), the segment map is keyed by
//! the number (so expandable segments are searched oldest first), and the
//! releases (`empty_cache`, the out-of-memory ladder, garbage collection)
//! walk free blocks in free-list order. Within a segment, splitting,
//! merging and page boundaries are relative to its start. So a run over a
//! backend that makes addresses up (a virtual device for memory plans)
//! creates, splits, reuses and releases exactly the segments the real run
//! would, and its peak reserved bytes match to the byte. Addresses remain
//! only in what is reported (snapshots list segments in address order, as
//! PyTorch does).
//!
//! ## The hot path
//! A cached allocation and its free take the lock twice, one best-fit
//! lookup, and a few free-list updates when the block is split and merged
//! back (a binary search and a short move in a sorted array while a pool
//! has few free blocks, a B-tree beyond; see `pool.rs`). Everything else is
//! kept off it: events are built only while history is recorded or an
//! observer wants them (whether it does is asked once per operation, not
//! per event), the request-too-large and out-of-memory paths are out of
//! line, a merge takes only the neighbour out of its free list (the freed
//! block is in none), and a free that no other stream used skips the event
//! bookkeeping. `alloc.cached_pair_ns` measures it.

mod allocation;
mod expandable;
mod inspect;
mod recording;
mod release;

pub use allocation::Allocation;
use recording::notify;

use crate::backend::{Backend, BackendError, StreamId};
use crate::block::{Block, BlockArena, BlockId};
use crate::category::MemoryCategory;
use crate::config::AllocatorConfig;
use crate::error::{AllocError, OutOfMemory};
use crate::policy::{oversize_rule_allows, round_size, segment_size, should_split, PoolKind, MIN_BLOCK_SIZE};
use crate::pool::{FreeList, StreamSlots, SEQUENCE_LIMIT};
use crate::snapshot::{FragmentationReport, Snapshot};
use crate::stats::MemoryStats;
use crate::trace::{guard_observer, History, Observer, TraceAction, TraceEntry};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::AtomicU8;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

#[derive(Debug, Clone, Copy)]
struct Segment {
    /// The first address (for an expandable segment, of its address range).
    base: usize,
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
    /// Segments by creation sequence number (see "No decision depends on an
    /// address" above).
    segments: BTreeMap<u64, Segment>,
    /// The sequence number of the next segment.
    next_sequence: u64,
    /// When `next_sequence` reaches this, live segments are renumbered
    /// ([`SEQUENCE_LIMIT`]; lower in tests).
    sequence_limit: u64,
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
    /// Whether the observer wants events during the current operation: asked
    /// once when the operation takes the lock ([`State::begin`]), not per event.
    observing: bool,
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
            next_sequence: 0,
            sequence_limit: SEQUENCE_LIMIT,
            stream_slots: StreamSlots::default(),
            stats,
            pending_events: BTreeMap::new(),
            pending_event_count: 0,
            lookups: [0; 2],
            capacity,
            history: History::default(),
            observer: None,
            observing: false,
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

    /// Allocates `size` bytes for use on `stream`, counted as
    /// [`MemoryCategory::Other`] (see [`CachingAllocator::allocate_as`]).
    #[inline]
    pub fn allocate(&self, size: usize, stream: StreamId) -> Result<Allocation<B>, AllocError> {
        self.allocate_as(size, stream, MemoryCategory::Other)
    }

    /// Allocates `size` bytes for use on `stream`, holding memory of
    /// `category`: its block size counts in
    /// [`MemoryStats::by_category`] until it is dropped or retagged
    /// ([`Allocation::set_category`]), and its events carry the category.
    ///
    /// ```
    /// use brasa_alloc::{CachingAllocator, HostBackend, MemoryCategory, StreamId};
    /// let alloc = CachingAllocator::new(HostBackend::new());
    /// let grad = alloc.allocate_as(1000, StreamId::DEFAULT, MemoryCategory::Gradient)?;
    /// assert_eq!(grad.category(), MemoryCategory::Gradient);
    /// assert_eq!(alloc.stats().by_category.get(MemoryCategory::Gradient).current, 1024);
    /// # Ok::<(), brasa_alloc::AllocError>(())
    /// ```
    pub fn allocate_as(
        &self,
        size: usize,
        stream: StreamId,
        category: MemoryCategory,
    ) -> Result<Allocation<B>, AllocError> {
        if size == 0 {
            return Ok(Allocation::new(None, BlockId(0), 0, 0, 0, stream, category));
        }
        let (block, addr, block_size) =
            self.shared.with_state(|state, backend| state.malloc(backend, size, stream, category))?;
        Ok(Allocation::new(Some(Arc::clone(&self.shared)), block, addr, size, block_size, stream, category))
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

    /// Runs one operation under the lock, then hands its events (if an
    /// observer wanted any) to the observer after the lock is released.
    #[inline]
    fn with_state<R>(&self, f: impl FnOnce(&mut State<B::Event>, &B) -> R) -> R {
        let (result, notifications) = {
            let mut state = self.lock();
            state.begin();
            let result = f(&mut state, &self.backend);
            (result, state.take_notifications())
        };
        if let Some((observer, entries)) = notifications {
            notify(&observer, entries);
        }
        result
    }

    #[inline]
    fn free(&self, block: BlockId) {
        self.with_state(|state, backend| state.free(backend, block));
    }

    /// Retags an allocated block; `tag` (the allocation's copy of the
    /// category) is updated under the lock, so the two always agree.
    fn set_category(&self, block: BlockId, category: MemoryCategory, tag: &AtomicU8) {
        self.with_state(|state, _| {
            state.retag(block, category);
            tag.store(category as u8, std::sync::atomic::Ordering::Relaxed);
        });
    }
}

impl<E> State<E> {
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

    #[inline]
    fn malloc<B: Backend<Event = E>>(
        &mut self,
        backend: &B,
        size: usize,
        stream: StreamId,
        category: MemoryCategory,
    ) -> Result<(BlockId, usize, usize), AllocError> {
        self.process_events(backend);
        let Some(rounded) = round_size(size, &self.config) else {
            return Err(self.too_large(backend, stream, size, category));
        };
        let pool = PoolKind::for_size(rounded);
        let block = match self.take_free_block(pool, stream, rounded) {
            Some(block) => block,
            None => self.obtain_memory(backend, pool, (stream, category), size, rounded)?,
        };
        Ok(self.hand_out(block, rounded, size, category))
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
        let at = block.placement();
        self.free_list(pool).remove(slot, size, at);
        Some(id)
    }

    /// Memory from the backend for the request — a new segment, or more pages
    /// of the stream's expandable segment — running the out-of-memory ladder
    /// if needed. `category` is the request's, for the events.
    #[inline(never)]
    fn obtain_memory<B: Backend<Event = E>>(
        &mut self,
        backend: &B,
        pool: PoolKind,
        (stream, category): (StreamId, MemoryCategory),
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
            Some(page) => state.grow_expandable_segment(backend, pool, (stream, category), rounded, page),
            None => state.new_segment(backend, pool, (stream, category), bytes),
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
        Err(self.out_of_memory(backend, (stream, category), requested, rounded, bytes))
    }

    /// The error for a request larger than any block ([`round_size`] gave
    /// up on it): no device has that much, and nothing in the cache can
    /// serve it, so it is an out-of-memory error at once (as in PyTorch).
    /// Kept out of line: the hot path only tests for it.
    #[cold]
    #[inline(never)]
    fn too_large<B: Backend<Event = E>>(
        &mut self,
        backend: &B,
        stream: StreamId,
        size: usize,
        category: MemoryCategory,
    ) -> AllocError {
        self.out_of_memory(backend, (stream, category), size, size, size)
    }

    fn out_of_memory<B: Backend<Event = E>>(
        &mut self,
        backend: &B,
        (stream, category): (StreamId, MemoryCategory),
        requested: usize,
        rounded: usize,
        segment_bytes: usize,
    ) -> AllocError {
        let device_free = backend.free_bytes();
        self.stats.num_ooms += 1;
        if self.recording() {
            self.push_event(TraceAction::Oom, (0, rounded, requested), stream, category, device_free);
        }
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

    /// A fixed segment of `bytes` from the backend, as one free block (in no
    /// free list). `category` is the request's, for the event.
    fn new_segment<B: Backend<Event = E>>(
        &mut self,
        backend: &B,
        pool: PoolKind,
        (stream, category): (StreamId, MemoryCategory),
        bytes: usize,
    ) -> Result<BlockId, BackendError> {
        if self.config.memory_fraction < 1.0 {
            let allowed = self.config.allowed_bytes(self.capacity);
            if self.stats.reserved_bytes.all.current as usize + bytes > allowed {
                return Err(BackendError::OutOfMemory { requested: bytes });
            }
        }
        let addr = backend.allocate(bytes)?;
        let sequence = self.next_segment_sequence();
        let stream_slot = self.stream_slots.slot(stream);
        let block = self.blocks.insert(Block::whole_segment(
            (addr, sequence),
            bytes,
            (stream, stream_slot),
            pool,
            self.lookups[pool as usize],
            false,
        ));
        self.segments.insert(sequence, Segment { base: addr, size: bytes, pool, stream, head: block, page: None });
        self.stats.segment.increase(pool, 1);
        self.stats.reserved_bytes.increase(pool, bytes as u64);
        self.stats.num_device_alloc += 1;
        if self.is_oversize(bytes) {
            self.stats.oversize_segments.increase(1);
        }
        self.record(TraceAction::SegmentAlloc, (addr, bytes, bytes), stream, category);
        Ok(block)
    }

    /// The creation sequence number of a new segment. Should the counter
    /// reach its limit (2^34 segments in the allocator's life), live
    /// segments are renumbered first, keeping their order.
    fn next_segment_sequence(&mut self) -> u64 {
        if self.next_sequence >= self.sequence_limit {
            self.renumber_segments();
        }
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        sequence
    }

    /// Numbers the live segments 0, 1, 2, … in their current order and
    /// rebuilds the free lists' keys: every comparison between live blocks
    /// comes out as before, so no later decision changes.
    #[cold]
    fn renumber_segments(&mut self) {
        let segments = std::mem::take(&mut self.segments);
        for (sequence, segment) in (0u64..).zip(segments.into_values()) {
            let mut cursor = Some(segment.head);
            while let Some(id) = cursor {
                let block = self.blocks.get_mut(id);
                block.sequence = sequence;
                cursor = block.next;
            }
            self.segments.insert(sequence, segment);
        }
        self.next_sequence = self.segments.len() as u64;
        debug_assert!(self.next_sequence < self.sequence_limit, "more live segments than sequence numbers");
        for pool in [PoolKind::Small, PoolKind::Large] {
            let listed: Vec<BlockId> = self.free_list(pool).ids().collect();
            self.free_list(pool).clear();
            for id in listed {
                let block = self.blocks.get(id);
                let (slot, size, at) = (block.stream_slot, block.size, block.placement());
                self.free_list(pool).insert(slot, size, at, id);
            }
        }
    }

    /// Marks a free block allocated for `category`, splitting off the
    /// remainder when the rules say so.
    #[inline]
    fn hand_out(
        &mut self,
        id: BlockId,
        rounded: usize,
        requested: usize,
        category: MemoryCategory,
    ) -> (BlockId, usize, usize) {
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
            let lookups = self.lookups[pool as usize];
            let remainder_block = self.blocks.get_mut(remainder);
            remainder_block.freed_at_lookup = lookups;
            let at = remainder_block.placement();
            self.free_list(pool).insert(stream_slot, remainder_size, at, remainder);
            if !expandable {
                self.stats.inactive_split.increase(pool, 1);
                self.stats.inactive_split_bytes.increase(pool, remainder_size as u64);
            }
            block_size = rounded;
        }
        let block = self.blocks.get_mut(id);
        block.allocated = true;
        block.requested = requested;
        block.category = category;
        let stats = &mut self.stats;
        stats.allocation.increase(pool, 1);
        stats.allocated_bytes.increase(pool, block_size as u64);
        stats.by_category.increase(category, block_size as u64);
        stats.active.increase(pool, 1);
        stats.active_bytes.increase(pool, block_size as u64);
        stats.requested_bytes.increase(pool, requested as u64);
        if block_size >= max_split {
            stats.oversize_allocations.increase(1);
        }
        self.record(TraceAction::Alloc, (addr, block_size, requested), stream, category);
        (id, addr, block_size)
    }

    /// Moves an allocated block's bytes to another category.
    fn retag(&mut self, id: BlockId, category: MemoryCategory) {
        let block = self.blocks.get_mut(id);
        let from = block.category;
        if from == category || !block.allocated {
            return;
        }
        block.category = category;
        let (addr, size, requested, stream) = (block.addr, block.size, block.requested, block.stream);
        self.stats.by_category.decrease(from, size as u64);
        self.stats.by_category.increase(category, size as u64);
        self.record(TraceAction::Retag { from }, (addr, size, requested), stream, category);
    }

    fn record_stream(&mut self, id: BlockId, stream: StreamId) {
        let block = self.blocks.get_mut(id);
        if stream != block.stream && !block.stream_uses.contains(&stream) {
            block.stream_uses.push(stream);
        }
    }

    /// The caller dropped an allocation.
    #[inline]
    fn free<B: Backend<Event = E>>(&mut self, backend: &B, id: BlockId) {
        let max_split = self.config.max_split_size;
        let block = self.blocks.get_mut(id);
        block.allocated = false;
        let (pool, size, requested, addr, stream, category) =
            (block.pool, block.size, block.requested, block.addr, block.stream, block.category);
        let other_streams = !block.stream_uses.is_empty();
        self.stats.allocation.decrease(pool, 1);
        self.stats.allocated_bytes.decrease(pool, size as u64);
        self.stats.by_category.decrease(category, size as u64);
        self.stats.requested_bytes.decrease(pool, requested as u64);
        if size >= max_split {
            self.stats.oversize_allocations.decrease(1);
        }
        self.record(TraceAction::FreeRequested, (addr, size, requested), stream, category);
        if other_streams {
            self.free_used_elsewhere(backend, id);
        } else {
            self.free_block(id);
        }
    }

    /// The rest of [`State::free`] for a block that other streams used
    /// (`record_stream`): it is reused once their work queued so far is done.
    #[inline(never)]
    fn free_used_elsewhere<B: Backend<Event = E>>(&mut self, backend: &B, id: BlockId) {
        let stream_uses = std::mem::take(&mut self.blocks.get_mut(id).stream_uses);
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
        let (pool, addr, size, stream, category) = (block.pool, block.addr, block.size, block.stream, block.category);
        self.stats.active.decrease(pool, 1);
        self.stats.active_bytes.decrease(pool, size as u64);
        self.stats.quarantined_blocks += 1;
        self.stats.quarantined_bytes += size as u64;
        self.record(TraceAction::Quarantine, (addr, size, size), stream, category);
    }

    /// Returns a block to its free list, merging it with free neighbours.
    #[inline]
    fn free_block(&mut self, id: BlockId) {
        let block = self.blocks.get_mut(id);
        block.requested = 0;
        let (pool, addr, size, stream, category) = (block.pool, block.addr, block.size, block.stream, block.category);
        self.stats.active.decrease(pool, 1);
        self.stats.active_bytes.decrease(pool, size as u64);

        let survivor = self.merge_with_neighbours(id, Block::is_free_and_mapped);
        let lookups = self.lookups[pool as usize];
        let block = self.blocks.get_mut(survivor);
        block.freed_at_lookup = lookups;
        let (slot, at, split, merged_size) =
            (block.stream_slot, block.placement(), block.counts_as_split(), block.size);
        self.free_list(pool).insert(slot, merged_size, at, survivor);
        if split {
            self.stats.inactive_split.increase(pool, 1);
            self.stats.inactive_split_bytes.increase(pool, merged_size as u64);
        }
        self.record(TraceAction::FreeCompleted, (addr, size, size), stream, category);
    }

    /// A free mapped block with no pending events (so it is in its free list).
    fn is_mergeable(&self, id: BlockId) -> bool {
        self.blocks.get(id).is_free_and_mapped()
    }

    /// Merges a block that is in no free list with its neighbours where
    /// `joins` holds for them and returns the id of the merged block (in no
    /// free list either). Neighbours leave their free lists.
    #[inline]
    fn merge_with_neighbours(&mut self, id: BlockId, joins: fn(&Block) -> bool) -> BlockId {
        let block = self.blocks.get(id);
        let (prev, next) = (block.prev, block.next);
        let mut survivor = id;
        if let Some(prev) = prev.filter(|p| joins(self.blocks.get(*p))) {
            self.unlist(prev);
            self.absorb(prev, id);
            survivor = prev;
        }
        if let Some(next) = next.filter(|n| joins(self.blocks.get(*n))) {
            self.unlist(next);
            self.absorb(survivor, next);
        }
        survivor
    }

    /// Takes a block out of its free list if it is in one (a free fixed-segment
    /// block there was an inactive split).
    #[inline]
    fn unlist(&mut self, id: BlockId) {
        let block = self.blocks.get(id);
        if !block.is_free_and_mapped() {
            return;
        }
        let (pool, slot, size, at, expandable) =
            (block.pool, block.stream_slot, block.size, block.placement(), block.expandable);
        if self.free_list(pool).remove(slot, size, at) && !expandable {
            self.stats.inactive_split.decrease(pool, 1);
            self.stats.inactive_split_bytes.decrease(pool, size as u64);
        }
    }

    /// How many of a block's neighbours are mapped (0 to 2).
    fn mapped_neighbours(&self, id: BlockId) -> u64 {
        let block = self.blocks.get(id);
        [block.prev, block.next].into_iter().flatten().filter(|n| self.blocks.get(*n).mapped).count() as u64
    }

    /// Splits a block at `at` (inside it): the block keeps `[addr, at)` and a
    /// new block with the same flags takes the rest, linked after it. Free
    /// lists and statistics are the caller's business.
    #[inline]
    fn split_off(&mut self, id: BlockId, at: usize) -> BlockId {
        let block = self.blocks.get(id);
        debug_assert!(at > block.addr && at < block.addr + block.size);
        let upper = block.upper_part(at, id);
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

    /// Merges `upper` (the next block) into `lower`; neither may be in a
    /// free list (see [`State::unlist`]).
    #[inline]
    fn absorb(&mut self, lower: BlockId, upper: BlockId) {
        let upper_block = self.blocks.get(upper);
        let (size, next) = (upper_block.size, upper_block.next);
        self.blocks.discard(upper);
        if let Some(next) = next {
            self.blocks.get_mut(next).prev = Some(lower);
        }
        let lower_block = self.blocks.get_mut(lower);
        lower_block.size += size;
        lower_block.next = next;
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

#[cfg(test)]
mod tests;
