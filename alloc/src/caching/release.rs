//! The paths that give memory back to the backend: `empty_cache`, the
//! out-of-memory ladder's releases, and garbage collection under a memory
//! fraction.
//!
//! Each walks free blocks in free-list order — size, then segment sequence
//! number and offset, never address — so which segments go back, and so
//! which remain to serve later requests, is the same on every backend.

use super::State;
use crate::backend::{Backend, StreamId};
use crate::block::BlockId;
use crate::category::MemoryCategory;
use crate::policy::PoolKind;
use crate::trace::TraceAction;

impl<E> State<E> {
    /// Waits for every outstanding event and frees the blocks they held.
    pub(super) fn synchronize_and_free_events<B: Backend<Event = E>>(&mut self, backend: &B) {
        if self.pending_event_count == 0 {
            return;
        }
        self.stats.num_sync_all_streams += 1;
        let queues = std::mem::take(&mut self.pending_events);
        for (event, id) in queues.into_values().flatten() {
            // Reuse is safe once the event's work is done: waited for on the
            // event, or, failing that, on the whole device. If both waits
            // fail, the stream may still use the block: quarantine it.
            if backend.synchronize_event(&event).is_err() && backend.synchronize_device().is_err() {
                self.quarantine(id);
            }
            self.event_done(id);
        }
    }

    /// `empty_cache`: wait for events, then release every unsplit free
    /// segment and unmap every whole free page of expandable segments.
    pub(super) fn release_cached_blocks<B: Backend<Event = E>>(&mut self, backend: &B) {
        self.synchronize_and_free_events(backend);
        let releasable: Vec<BlockId> =
            self.free_small.ids().chain(self.free_large.ids()).filter(|id| self.releasable_size(*id) > 0).collect();
        // Releasing one block never merges it with another free mapped block,
        // so the ids collected stay valid.
        for id in releasable {
            self.release_block(backend, id);
        }
    }

    /// Bytes [`State::release_block`] would give back for a free block.
    pub(super) fn releasable_size(&self, id: BlockId) -> usize {
        let block = self.blocks.get(id);
        if block.expandable {
            let (start, end) = self.whole_free_pages(block);
            end - start
        } else if block.is_split() {
            0
        } else {
            block.size
        }
    }

    /// Gives a free block's memory back to the backend where it can: a whole
    /// fixed segment, or the whole pages of an expandable one. Returns the bytes.
    pub(super) fn release_block<B: Backend<Event = E>>(&mut self, backend: &B, id: BlockId) -> usize {
        let block = self.blocks.get(id);
        if block.expandable {
            self.unmap_free_pages(backend, id)
        } else if block.is_split() {
            0
        } else {
            let size = block.size;
            self.release_segment(backend, id);
            size
        }
    }

    /// Returns the segment of an unsplit free block to the backend.
    pub(super) fn release_segment<B: Backend<Event = E>>(&mut self, backend: &B, id: BlockId) {
        let Some(block) = self.blocks.remove(id) else {
            return;
        };
        debug_assert!(!block.is_split() && !block.allocated && !block.expandable);
        self.free_list(block.pool).remove(block.stream_slot, block.size, block.placement());
        self.segments.remove(&block.sequence);
        // SAFETY: an unsplit block spans exactly one segment that `new_segment`
        // obtained from this backend with this size; it is free and now forgotten.
        unsafe { backend.free(block.addr, block.size) };
        self.stats.segment.decrease(block.pool, 1);
        self.stats.reserved_bytes.decrease(block.pool, block.size as u64);
        self.stats.num_device_free += 1;
        if self.is_oversize(block.size) {
            self.stats.oversize_segments.decrease(1);
        }
        self.record(
            TraceAction::SegmentFree,
            (block.addr, block.size, block.size),
            block.stream,
            MemoryCategory::Other,
        );
    }

    /// With `max_split_size` set: release one unsplit oversize block of the
    /// stream large enough for the request, or else the largest ones until
    /// their sizes add up to it.
    pub(super) fn release_available_cached_blocks<B: Backend<Event = E>>(
        &mut self,
        backend: &B,
        stream: StreamId,
        rounded: usize,
    ) -> bool {
        let max_split = self.config.max_split_size;
        let target = rounded.max(max_split);
        let slot = self.stream_slots.slot(stream);
        let whole_segment = |block: &crate::block::Block| !block.is_split() && !block.expandable;
        let fitting =
            self.free_large.at_least(slot, target).map(|(_, id)| id).find(|id| whole_segment(self.blocks.get(*id)));
        if let Some(id) = fitting {
            self.release_segment(backend, id);
            return true;
        }
        let oversize: Vec<(usize, BlockId)> = self
            .free_large
            .at_least(slot, max_split)
            .rev()
            .filter(|(_, id)| whole_segment(self.blocks.get(*id)))
            .collect();
        let mut released = 0;
        for (size, id) in oversize {
            if released >= target {
                break;
            }
            self.release_segment(backend, id);
            released += size;
        }
        released >= target
    }

    /// Frees old unsplit large blocks (and whole free pages of expandable
    /// segments) once reserved memory passes the threshold share of the
    /// allowed memory (PyTorch's garbage collection, with ages kept as lookup
    /// timestamps so pooling costs nothing extra).
    pub(super) fn garbage_collect<B: Backend<Event = E>>(&mut self, backend: &B) {
        let allowed = self.config.allowed_bytes(self.capacity);
        let threshold = (self.config.garbage_collection_threshold * allowed as f64) as usize;
        let reserved = self.stats.reserved_bytes.all.current as usize;
        if reserved <= threshold {
            return;
        }
        let target = reserved - threshold;
        let now = self.lookups[PoolKind::Large as usize];
        let mut candidates: Vec<(u64, BlockId)> = self
            .free_large
            .ids()
            .filter(|id| self.releasable_size(*id) > 0)
            .map(|id| (now - self.blocks.get(id).freed_at_lookup, id))
            .collect();
        let mut reclaimed = 0;
        while reclaimed < target && !candidates.is_empty() {
            let average_age = candidates.iter().map(|c| c.0).sum::<u64>() / candidates.len() as u64;
            let (old, young): (Vec<_>, Vec<_>) = candidates.into_iter().partition(|c| c.0 >= average_age);
            for (_, id) in old {
                if reclaimed >= target {
                    break;
                }
                reclaimed += self.release_block(backend, id);
            }
            candidates = young;
        }
    }
}
