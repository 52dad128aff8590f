//! [`Allocation`]: the handle to memory handed out by a [`CachingAllocator`](super::CachingAllocator);
//! it returns its block to the cache when dropped.

use super::Shared;
use crate::backend::{Backend, StreamId};
use crate::block::BlockId;
use crate::category::MemoryCategory;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

/// Memory handed out by a [`CachingAllocator`](super::CachingAllocator); returned to the cache on drop.
///
/// It knows what it holds ([`Allocation::category`]); retagging it
/// ([`Allocation::set_category`]) moves its bytes between the allocator's
/// per-category counters.
pub struct Allocation<B: Backend> {
    owner: Option<Arc<Shared<B>>>,
    block: BlockId,
    /// The block's category, kept in step with the block's own under the
    /// allocator's lock (the only copy for a zero-byte allocation).
    category: AtomicU8,
    addr: usize,
    requested: usize,
    block_size: usize,
    stream: StreamId,
}

impl<B: Backend> Allocation<B> {
    /// The address of the first byte (0 for a zero-byte allocation).
    #[inline]
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Bytes asked for.
    #[inline]
    pub fn size(&self) -> usize {
        self.requested
    }

    /// Bytes of the block actually held (the request rounded, possibly more).
    #[inline]
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The stream the memory was allocated on.
    #[inline]
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// What the memory holds: the category it was allocated as
    /// ([`CachingAllocator::allocate_as`](super::CachingAllocator::allocate_as))
    /// or last retagged to.
    #[inline]
    pub fn category(&self) -> MemoryCategory {
        MemoryCategory::from_index(usize::from(self.category.load(Ordering::Relaxed))).unwrap_or_default()
    }

    /// Retags the memory as `category`: under the allocator's lock, its
    /// block's bytes leave the old category's counter (as freed) for the new
    /// one's (as allocated) in [`MemoryStats::by_category`](crate::MemoryStats::by_category),
    /// and a [`TraceAction::Retag`](crate::TraceAction::Retag) event records
    /// it. Nothing happens when the category is unchanged. A zero-byte
    /// allocation holds no block and is in no counter: it only remembers the
    /// category.
    pub fn set_category(&self, category: MemoryCategory) {
        match &self.owner {
            Some(owner) => {
                if self.category() != category {
                    owner.set_category(self.block, category, &self.category);
                }
            }
            None => self.category.store(category as u8, Ordering::Relaxed),
        }
    }

    /// Marks the memory as used by `stream` too: when dropped, the block is
    /// reused only after the work queued on `stream` so far has finished.
    pub fn record_stream(&self, stream: StreamId) {
        if let Some(owner) = &self.owner {
            if stream != self.stream {
                owner.lock().record_stream(self.block, stream);
            }
        }
    }
}

impl<B: Backend> Drop for Allocation<B> {
    #[inline]
    fn drop(&mut self) {
        if let Some(owner) = self.owner.take() {
            owner.free(self.block);
        }
    }
}

impl<B: Backend> std::fmt::Debug for Allocation<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocation")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("size", &self.requested)
            .field("block_size", &self.block_size)
            .field("stream", &self.stream)
            .field("category", &self.category())
            .finish()
    }
}

impl<B: Backend> Allocation<B> {
    #[inline]
    pub(super) fn new(
        owner: Option<Arc<Shared<B>>>,
        block: BlockId,
        addr: usize,
        requested: usize,
        block_size: usize,
        stream: StreamId,
        category: MemoryCategory,
    ) -> Self {
        Allocation { owner, block, category: AtomicU8::new(category as u8), addr, requested, block_size, stream }
    }
}
