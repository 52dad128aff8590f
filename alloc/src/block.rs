//! Blocks and the arena that holds them.
//!
//! A segment (one backend allocation) is tiled by blocks that form a doubly
//! linked list in address order; a free block sits in its pool's free list.

use crate::backend::StreamId;
use crate::category::MemoryCategory;
use crate::policy::PoolKind;

/// Index of a block in the [`BlockArena`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct BlockId(pub(crate) u32);

/// Where a block sits, in an order that does not depend on addresses: its
/// segment's creation sequence number, then its offset in the segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Placement {
    /// The segment's creation sequence number (below the free lists' `SEQUENCE_LIMIT`, `pool.rs`).
    pub sequence: u64,
    /// Bytes from the segment's start (a multiple of 512).
    pub offset: usize,
}

/// A piece of a segment.
#[derive(Debug, Clone)]
pub(crate) struct Block {
    pub addr: usize,
    /// Bytes of the block (a multiple of 512).
    pub size: usize,
    /// Bytes the caller asked for (0 while free).
    pub requested: usize,
    pub stream: StreamId,
    /// The stream's slot in the free lists' keys.
    pub stream_slot: u16,
    pub pool: PoolKind,
    /// Address of the segment this block belongs to.
    pub segment: usize,
    /// The creation sequence number of that segment: its key in the
    /// segment map and its rank in the free lists' placement order.
    pub sequence: u64,
    pub prev: Option<BlockId>,
    pub next: Option<BlockId>,
    pub allocated: bool,
    /// Other streams that used this block (`record_stream`).
    pub stream_uses: Vec<StreamId>,
    /// Events still to complete before the block can be reused.
    pub event_count: u32,
    /// The pool's lookup counter when the block was last freed: its age for
    /// garbage collection is the number of lookups since.
    pub freed_at_lookup: u64,
    /// Whether memory backs the block. Only blocks of expandable segments are
    /// ever unmapped; an unmapped block is free but in no free list.
    pub mapped: bool,
    /// Whether the block belongs to an expandable segment.
    pub expandable: bool,
    /// Set when the block was freed but the device could not be synchronised
    /// with the streams that used it: work may still read or write it, so it
    /// is never reused, merged or given back (see `State::quarantine`).
    pub quarantined: bool,
    /// What the block's bytes are for while allocated (and, once freed, what
    /// they were for, until it is handed out again).
    pub category: MemoryCategory,
}

impl Block {
    /// The one free block spanning a new segment (`mapped` false for the
    /// address range of an expandable segment).
    pub fn whole_segment(
        (addr, sequence): (usize, u64),
        size: usize,
        (stream, stream_slot): (StreamId, u16),
        pool: PoolKind,
        freed_at_lookup: u64,
        expandable: bool,
    ) -> Block {
        Block {
            addr,
            size,
            requested: 0,
            stream,
            stream_slot,
            pool,
            segment: addr,
            sequence,
            prev: None,
            next: None,
            allocated: false,
            stream_uses: Vec::new(),
            event_count: 0,
            freed_at_lookup,
            mapped: !expandable,
            expandable,
            quarantined: false,
            category: MemoryCategory::Other,
        }
    }

    /// The block's rank in the free lists' placement order (see `pool.rs`):
    /// its segment's sequence number and its offset in the segment.
    #[inline]
    pub fn placement(&self) -> Placement {
        Placement { sequence: self.sequence, offset: self.addr - self.segment }
    }

    /// The part of a block that another block split off from it at `at`
    /// takes: the same segment, stream, pool and flags; free, unused.
    #[inline]
    pub fn upper_part(&self, at: usize, prev: BlockId) -> Block {
        Block {
            addr: at,
            size: self.addr + self.size - at,
            requested: 0,
            stream: self.stream,
            stream_slot: self.stream_slot,
            pool: self.pool,
            segment: self.segment,
            sequence: self.sequence,
            prev: Some(prev),
            next: self.next,
            allocated: false,
            stream_uses: Vec::new(),
            event_count: 0,
            freed_at_lookup: self.freed_at_lookup,
            mapped: self.mapped,
            expandable: self.expandable,
            quarantined: self.quarantined,
            category: self.category,
        }
    }

    /// Whether the block shares its segment with other blocks.
    #[inline]
    pub fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }

    /// Free, mapped and waiting on no event: what sits in a free list.
    #[inline]
    pub fn is_free_and_mapped(&self) -> bool {
        !self.allocated && self.event_count == 0 && self.mapped && !self.quarantined
    }

    /// Whether the block is unmapped (only in expandable segments).
    #[inline]
    pub fn is_unmapped(&self) -> bool {
        !self.mapped
    }

    /// Whether the block counts in the `inactive_split` statistics when free:
    /// a split block of a fixed segment (expandable segments are left out, as
    /// in PyTorch — their free pages can be unmapped).
    #[inline]
    pub fn counts_as_split(&self) -> bool {
        !self.expandable && self.is_split()
    }
}

/// Slots for blocks, reused after a block is merged away or its segment released.
#[derive(Debug, Default)]
pub(crate) struct BlockArena {
    slots: Vec<Option<Block>>,
    vacant: Vec<u32>,
}

impl BlockArena {
    pub fn insert(&mut self, block: Block) -> BlockId {
        match self.vacant.pop() {
            Some(index) => {
                self.slots[index as usize] = Some(block);
                BlockId(index)
            }
            None => {
                self.slots.push(Some(block));
                BlockId((self.slots.len() - 1) as u32)
            }
        }
    }

    /// Drops a block in place (cheaper than [`BlockArena::remove`] when
    /// nothing of it is needed any more).
    #[inline]
    pub fn discard(&mut self, id: BlockId) {
        if let Some(slot @ Some(_)) = self.slots.get_mut(id.0 as usize) {
            *slot = None;
            self.vacant.push(id.0);
        }
    }

    pub fn remove(&mut self, id: BlockId) -> Option<Block> {
        let block = self.slots.get_mut(id.0 as usize)?.take();
        if block.is_some() {
            self.vacant.push(id.0);
        }
        block
    }

    /// The block behind a live id. Ids come only from `insert` and are removed
    /// exactly once, so a missing block is an allocator bug.
    #[inline]
    pub fn get(&self, id: BlockId) -> &Block {
        match self.slots.get(id.0 as usize) {
            Some(Some(block)) => block,
            _ => unreachable!("block {id:?} is not live"),
        }
    }

    #[inline]
    pub fn get_mut(&mut self, id: BlockId) -> &mut Block {
        match self.slots.get_mut(id.0 as usize) {
            Some(Some(block)) => block,
            _ => unreachable!("block {id:?} is not live"),
        }
    }
}
