//! A pool's free blocks, ordered by (stream, size, address) so that one range
//! query finds the best fit on a stream (PyTorch's `BlockPool`).
//!
//! The three fields are packed into one `u128` key — stream slot in the top 16
//! bits, size in the next 48, address in the low 64 — which makes the B-tree's
//! comparisons single integer compares and its nodes a third smaller than a
//! tuple key would (this is the allocator's hot path).

use crate::backend::StreamId;
use crate::block::BlockId;
use std::collections::BTreeMap;

/// Small integers standing for the streams seen so far, in first-use order.
#[derive(Debug, Default)]
pub(crate) struct StreamSlots {
    streams: Vec<StreamId>,
}

impl StreamSlots {
    /// The slot of `stream`, giving it one on first use.
    #[inline]
    pub fn slot(&mut self, stream: StreamId) -> u16 {
        match self.streams.iter().position(|s| *s == stream) {
            Some(index) => index as u16,
            None => {
                self.streams.push(stream);
                (self.streams.len() - 1) as u16
            }
        }
    }
}

const SIZE_BITS: u32 = 48;
// Every block fits the key: larger requests are refused before they get here.
const _: () = assert!(crate::policy::MAX_BLOCK_SIZE < 1 << SIZE_BITS);

#[inline]
fn key(slot: u16, size: usize, addr: usize) -> u128 {
    debug_assert!((size as u64) < (1 << SIZE_BITS));
    (u128::from(slot) << (64 + SIZE_BITS)) | ((size as u128) << 64) | addr as u128
}

/// The first key of blocks on stream `slot` of at least `size` bytes. No
/// block reaches `2^SIZE_BITS` bytes, so a larger `size` (a `max_split_size`
/// of "no limit", say) starts past the stream's keys: nothing fits.
#[inline]
fn first_key(slot: u16, size: usize) -> u128 {
    if (size as u64) < (1 << SIZE_BITS) {
        key(slot, size, 0)
    } else {
        key(slot + 1, 0, 0)
    }
}

#[inline]
fn size_of_key(key: u128) -> usize {
    ((key >> 64) as u64 & ((1 << SIZE_BITS) - 1)) as usize
}

/// The free blocks of one pool.
#[derive(Debug, Default)]
pub(crate) struct FreeList {
    blocks: BTreeMap<u128, BlockId>,
}

impl FreeList {
    #[inline]
    pub fn insert(&mut self, slot: u16, size: usize, addr: usize, id: BlockId) {
        self.blocks.insert(key(slot, size, addr), id);
    }

    /// Removes a block; true if it was in the list.
    #[inline]
    pub fn remove(&mut self, slot: u16, size: usize, addr: usize) -> bool {
        self.blocks.remove(&key(slot, size, addr)).is_some()
    }

    /// The smallest block of at least `size` bytes on the stream, with its size.
    #[inline]
    pub fn best_fit(&self, slot: u16, size: usize) -> Option<(usize, BlockId)> {
        let (&found, &id) = self.blocks.range(first_key(slot, size)..key(slot + 1, 0, 0)).next()?;
        Some((size_of_key(found), id))
    }

    /// Blocks on the stream of at least `size` bytes, smallest first.
    pub fn at_least(&self, slot: u16, size: usize) -> impl DoubleEndedIterator<Item = (usize, BlockId)> + '_ {
        self.blocks.range(first_key(slot, size)..key(slot + 1, 0, 0)).map(|(k, id)| (size_of_key(*k), *id))
    }

    /// Every free block.
    pub fn ids(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.blocks.values().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_stays_on_its_stream() {
        let mut list = FreeList::default();
        list.insert(0, 4096, 0x1000, BlockId(1));
        list.insert(0, 1024, 0x9000, BlockId(2));
        list.insert(1, 2048, 0x5000, BlockId(3));
        assert_eq!(list.best_fit(0, 1000), Some((1024, BlockId(2))));
        assert_eq!(list.best_fit(0, 2000), Some((4096, BlockId(1))));
        assert_eq!(list.best_fit(0, 5000), None, "does not spill into the next stream");
        assert_eq!(list.best_fit(1, 512), Some((2048, BlockId(3))));
        assert!(list.remove(0, 4096, 0x1000));
        assert!(!list.remove(0, 4096, 0x1000));
        let sizes: Vec<usize> = list.at_least(0, 0).map(|(s, _)| s).collect();
        assert_eq!(sizes, [1024]);
    }

    #[test]
    fn sizes_no_block_can_have_find_nothing() {
        // A `max_split_size` of "no limit" asks for blocks of at least
        // usize::MAX bytes (found by the alloc_conf fuzz target).
        let mut list = FreeList::default();
        list.insert(0, 4096, 0x1000, BlockId(1));
        list.insert(1, 4096, 0x2000, BlockId(2));
        assert_eq!(list.at_least(0, usize::MAX).count(), 0);
        assert_eq!(list.at_least(0, 1 << 48).count(), 0);
        assert_eq!(list.best_fit(0, usize::MAX), None);
        assert_eq!(list.at_least(0, 4096).count(), 1);
    }

    #[test]
    fn equal_sizes_order_by_address() {
        let mut list = FreeList::default();
        list.insert(2, 512, 0x3000, BlockId(7));
        list.insert(2, 512, 0x2000, BlockId(8));
        assert_eq!(list.best_fit(2, 512), Some((512, BlockId(8))));
    }

    #[test]
    fn stream_slots_are_stable() {
        let mut slots = StreamSlots::default();
        assert_eq!(slots.slot(StreamId(9)), 0);
        assert_eq!(slots.slot(StreamId(0)), 1);
        assert_eq!(slots.slot(StreamId(9)), 0);
    }
}
