//! Expandable segments (`expandable_segments:True`, PyTorch's Note
//! [Expandable Segments]): instead of fixed segments, each stream and pool
//! owns one address range of 1⅛ × the device's capacity, reserved without
//! memory behind it, and maps pages into it (2 MiB for the small pool, 20 MiB
//! for the large one) at the lowest address where the request fits. Should
//! blocks in use cut the range up so that no gap fits a request, another
//! range is reserved, so a request fails only when the device is full.
//!
//! Why: with fixed segments, a request larger than every free block needs a
//! new segment even when the cache holds enough free memory in pieces — the
//! fragmentation behind "reserved but unallocated" memory. Here a free block
//! at the end of the mapped range simply grows, and `empty_cache` or the
//! out-of-memory ladder unmap any whole free page, wherever it is.
//!
//! Beyond PyTorch, which unmaps only on `empty_cache` and out-of-memory: when
//! a segment must grow, whole free pages of the same stream and pool that
//! could not serve the request are unmapped first (largest free blocks
//! first, as many bytes as are about to be mapped). Growth is already the
//! slow path, and steady-state training steps that the cache serves never
//! reach it; in exchange reserved memory stays close to allocated memory
//! (`alloc.trace_fragmentation_expandable`: 1.05 against 1.20 with fixed
//! segments on the GPT-2 block trace).
//!
//! The blocks of an expandable segment tile its whole address range; unmapped
//! blocks are free but sit in no free list, and neighbouring unmapped blocks
//! merge. Mapped/unmapped boundaries always fall on page boundaries. For the
//! statistics, each contiguous mapped range counts as one segment, and
//! `reserved_bytes` counts mapped bytes only.

use super::{Segment, State};
use crate::backend::{Backend, BackendError, StreamId};
use crate::block::{Block, BlockId};
use crate::category::MemoryCategory;
use crate::policy::{expandable_page_size, PoolKind};
use crate::trace::TraceAction;

/// Address space reserved per expandable segment, as a multiple of the
/// device's capacity (PyTorch: 1⅛).
fn address_range_bytes(capacity: usize, page: usize) -> usize {
    // Unknown capacities (usize::MAX) are clamped to 1 TiB of address space.
    let bytes = capacity.min(1 << 40);
    (bytes + bytes / 8).div_ceil(page) * page
}

impl<E> State<E> {
    /// The page size for `pool` when expandable segments are on and the
    /// backend can map address ranges; `None` for fixed segments.
    pub(super) fn expandable_page<B: Backend<Event = E>>(&self, backend: &B, pool: PoolKind) -> Option<usize> {
        if !self.config.expandable_segments {
            return None;
        }
        backend.virtual_memory_granularity().map(|granularity| expandable_page_size(pool, granularity))
    }

    /// Maps enough pages into the stream's expandable segment for a request
    /// of `rounded` bytes and returns the free block (out of every free list)
    /// that holds them, merged with the free blocks around them.
    pub(super) fn grow_expandable_segment<B: Backend<Event = E>>(
        &mut self,
        backend: &B,
        pool: PoolKind,
        (stream, category): (StreamId, MemoryCategory),
        rounded: usize,
        page: usize,
    ) -> Result<BlockId, BackendError> {
        // Grow only by what the cache cannot give back: free pages that could
        // not serve this request are unmapped first, so reserved memory
        // follows allocated memory instead of keeping every hole mapped.
        if let Some((gap, bytes)) = self.find_gap(pool, stream, rounded, page) {
            let keep = self.blocks.get(gap).prev;
            self.unmap_free_pages_elsewhere(backend, pool, stream, bytes, keep);
        }
        let found = self.find_gap(pool, stream, rounded, page);
        let (unmapped, bytes) = match found {
            Some(fit) => fit,
            // Nothing yet, or the address ranges are too cut up by blocks in
            // use: address space is cheap, so take another range.
            None => {
                let sequence = self.reserve_expandable_segment(backend, pool, stream, page)?;
                self.lowest_fit(sequence, rounded, page).ok_or(BackendError::OutOfMemory { requested: rounded })?
            }
        };
        if self.config.memory_fraction < 1.0 {
            let allowed = self.config.allowed_bytes(self.capacity);
            if self.stats.reserved_bytes.all.current as usize + bytes > allowed {
                let segment = self.blocks.get(unmapped).sequence;
                self.release_unmapped_segment(backend, segment);
                return Err(BackendError::OutOfMemory { requested: bytes });
            }
        }
        let block = self.blocks.get(unmapped);
        let (addr, segment) = (block.addr, block.sequence);
        if let Err(error) = backend.map(addr, bytes) {
            // A range reserved just now for this request holds nothing.
            self.release_unmapped_segment(backend, segment);
            return Err(error);
        }
        if bytes < self.blocks.get(unmapped).size {
            self.split_off(unmapped, addr + bytes);
        }
        self.blocks.get_mut(unmapped).mapped = true;
        // One mapped range more, less one for each mapped neighbour it joins.
        self.stats.segment.increase(pool, 1);
        self.stats.segment.decrease(pool, self.mapped_neighbours(unmapped));
        self.stats.reserved_bytes.increase(pool, bytes as u64);
        self.stats.num_device_alloc += 1;
        self.record(TraceAction::SegmentMap, (addr, bytes, bytes), stream, category);
        Ok(self.merge_with_neighbours(unmapped, Block::is_free_and_mapped))
    }

    /// The lowest gap that holds the request in the stream's oldest
    /// expandable segment that has one, with the bytes to map there.
    fn find_gap(&self, pool: PoolKind, stream: StreamId, rounded: usize, page: usize) -> Option<(BlockId, usize)> {
        self.expandable_segments(pool, stream).into_iter().find_map(|segment| self.lowest_fit(segment, rounded, page))
    }

    /// Before mapping `bytes` more: unmaps whole free pages of the stream's
    /// other free blocks in this pool, largest first, until `bytes` are given back.
    fn unmap_free_pages_elsewhere<B: Backend<Event = E>>(
        &mut self,
        backend: &B,
        pool: PoolKind,
        stream: StreamId,
        bytes: usize,
        keep: Option<BlockId>,
    ) -> usize {
        let slot = self.stream_slots.slot(stream);
        let list = match pool {
            PoolKind::Small => &self.free_small,
            PoolKind::Large => &self.free_large,
        };
        let mut candidates: Vec<(usize, BlockId)> = list
            .at_least(slot, 0)
            .map(|(_, id)| id)
            .filter(|id| Some(*id) != keep && self.blocks.get(*id).expandable)
            .map(|id| (self.releasable_size(id), id))
            .filter(|(size, _)| *size > 0)
            .collect();
        candidates.sort_by_key(|c| std::cmp::Reverse(c.0));
        let mut released = 0;
        for (_, id) in candidates {
            if released >= bytes {
                break;
            }
            released += self.unmap_free_pages(backend, id);
        }
        released
    }

    /// The sequence numbers of the expandable segments of `pool` on
    /// `stream` (one, unless requests outgrew its address range), oldest
    /// first — not lowest address first: where the backend put a range
    /// must not decide which one grows.
    fn expandable_segments(&self, pool: PoolKind, stream: StreamId) -> Vec<u64> {
        self.segments
            .iter()
            .filter(|(_, segment)| segment.page.is_some() && segment.pool == pool && segment.stream == stream)
            .map(|(&sequence, _)| sequence)
            .collect()
    }

    /// Reserves the address range of a new expandable segment (one unmapped
    /// block) and returns the segment's sequence number.
    fn reserve_expandable_segment<B: Backend<Event = E>>(
        &mut self,
        backend: &B,
        pool: PoolKind,
        stream: StreamId,
        page: usize,
    ) -> Result<u64, BackendError> {
        let size = address_range_bytes(self.capacity, page);
        let base = backend.reserve_address_range(size)?;
        let sequence = self.next_segment_sequence();
        let stream_slot = self.stream_slots.slot(stream);
        let head = self.blocks.insert(Block::whole_segment(
            (base, sequence),
            size,
            (stream, stream_slot),
            pool,
            self.lookups[pool as usize],
            true,
        ));
        self.segments.insert(sequence, Segment { base, size, pool, stream, head, page: Some(page) });
        Ok(sequence)
    }

    /// The lowest unmapped block of segment `sequence` that, with the free
    /// block just before it, holds `rounded` bytes, and how many bytes of it
    /// to map.
    fn lowest_fit(&self, sequence: u64, rounded: usize, page: usize) -> Option<(BlockId, usize)> {
        let mut cursor = Some(self.segments.get(&sequence)?.head);
        while let Some(id) = cursor {
            let block = self.blocks.get(id);
            if !block.mapped {
                let free_before = block.prev.filter(|p| self.is_mergeable(*p)).map_or(0, |p| self.blocks.get(p).size);
                let bytes = rounded.saturating_sub(free_before).div_ceil(page) * page;
                if bytes > 0 && bytes <= block.size {
                    return Some((id, bytes));
                }
            }
            cursor = block.next;
        }
        None
    }

    /// The whole pages inside a free block of an expandable segment, as an
    /// address range (empty when there are none).
    pub(super) fn whole_free_pages(&self, block: &Block) -> (usize, usize) {
        let Some(page) = self.segments.get(&block.sequence).and_then(|s| s.page) else {
            return (0, 0);
        };
        let base = block.segment;
        let start = base + (block.addr - base).div_ceil(page) * page;
        let end = base + (block.addr + block.size - base) / page * page;
        if end > start {
            (start, end)
        } else {
            (0, 0)
        }
    }

    /// Unmaps the whole pages of a free block of an expandable segment (which
    /// must be in its free list) and returns how many bytes went back. The
    /// partial pages at either end stay mapped as free blocks. A segment left
    /// with nothing mapped gives its address range back too.
    pub(super) fn unmap_free_pages<B: Backend<Event = E>>(&mut self, backend: &B, id: BlockId) -> usize {
        let block = self.blocks.get(id);
        let (start, end) = self.whole_free_pages(block);
        if end == start {
            return 0;
        }
        let (pool, slot, addr, size, stream, segment, at) =
            (block.pool, block.stream_slot, block.addr, block.size, block.stream, block.sequence, block.placement());
        self.free_list(pool).remove(slot, size, at);
        let mut hole = id;
        if start > addr {
            hole = self.split_off(id, start);
            self.free_list(pool).insert(slot, start - addr, at, id);
        }
        if end < addr + size {
            let tail = self.split_off(hole, end);
            let tail_at = self.blocks.get(tail).placement();
            self.free_list(pool).insert(slot, addr + size - end, tail_at, tail);
        }
        // SAFETY: `start..end` are whole mapped pages of a free block: nothing uses them.
        unsafe { backend.unmap(start, end - start) };
        self.blocks.get_mut(hole).mapped = false;
        // One mapped range fewer, unless the hole cuts one in two (or leaves a side).
        self.stats.segment.decrease(pool, 1);
        self.stats.segment.increase(pool, self.mapped_neighbours(hole));
        self.stats.reserved_bytes.decrease(pool, (end - start) as u64);
        self.stats.num_device_free += 1;
        self.record(TraceAction::SegmentUnmap, (start, end - start, end - start), stream, MemoryCategory::Other);
        self.merge_with_neighbours(hole, Block::is_unmapped);
        self.release_unmapped_segment(backend, segment);
        end - start
    }

    /// Gives back the address range of expandable segment `sequence` if it
    /// has nothing mapped.
    fn release_unmapped_segment<B: Backend<Event = E>>(&mut self, backend: &B, sequence: u64) {
        let Some(segment) = self.segments.get(&sequence).copied() else {
            return;
        };
        let head = self.blocks.get(segment.head);
        if head.mapped || head.next.is_some() {
            return;
        }
        self.blocks.remove(segment.head);
        self.segments.remove(&sequence);
        // SAFETY: the range came from `reserve_address_range` with this size and has nothing mapped.
        unsafe { backend.release_address_range(segment.base, segment.size) };
    }
}
