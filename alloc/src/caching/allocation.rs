//! [`Allocation`]: the handle to memory handed out by a [`CachingAllocator`](super::CachingAllocator);
//! it returns its block to the cache when dropped.

use super::Shared;
use crate::backend::{Backend, StreamId};
use crate::block::BlockId;
use std::sync::Arc;

/// Memory handed out by a [`CachingAllocator`](super::CachingAllocator); returned to the cache on drop.
pub struct Allocation<B: Backend> {
    owner: Option<Arc<Shared<B>>>,
    block: BlockId,
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
            .finish()
    }
}

impl<B: Backend> Allocation<B> {
    pub(super) fn new(
        owner: Option<Arc<Shared<B>>>,
        block: BlockId,
        addr: usize,
        requested: usize,
        block_size: usize,
        stream: StreamId,
    ) -> Self {
        Allocation { owner, block, addr, requested, block_size, stream }
    }
}
