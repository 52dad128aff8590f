//! A pool's free blocks, ordered by (stream, size, placement) so that one
//! range query finds the best fit on a stream (PyTorch's `BlockPool`, which
//! breaks ties between equal sizes by address).
//!
//! ## Placement order, not addresses
//! Ties between free blocks of equal size are broken by [`Placement`]: the
//! creation sequence number of the block's segment (a counter the allocator
//! increments for every segment it creates, fixed or expandable), then the
//! block's offset inside the segment. Never by address: where the backend
//! happens to put a segment (the OS's `mmap`, the CUDA driver, a virtual
//! backend making addresses up) must not change which block serves a
//! request, or a memory plan computed on a virtual device (the meta device)
//! would split, cache and release different blocks than the real run and
//! could miss its peak reserved bytes. With this order, the same sequence
//! of requests gives the same blocks, segments and statistics to the byte
//! on any backend that succeeds and fails at the same points.
//!
//! ## The key
//! The four fields are packed into one `u128`, which makes every comparison
//! of the lookups (a binary search in a short list, a B-tree's node scans
//! in a long one: see [`FreeList`]) a single integer compare, and the keys
//! half the size of a tuple's (this is the allocator's hot path). Sizes
//! and offsets are multiples of 512 B ([`MIN_BLOCK_SIZE`]) and are stored
//! in those units:
//!
//! | bits     | field                                  | range                         |
//! |----------|----------------------------------------|-------------------------------|
//! | 112..128 | stream slot                            | 65,536 streams                |
//! | 73..112  | size / 512                             | every block (< 2^48 B)        |
//! | 39..73   | segment sequence number                | [`SEQUENCE_LIMIT`] = 2^34     |
//! | 0..39    | offset in the segment / 512            | any segment (< 2^48 B)        |
//!
//! When the sequence counter reaches [`SEQUENCE_LIMIT`] (2^34 segments
//! created in one allocator's life), the allocator renumbers its live
//! segments 0, 1, 2, … in their order and rebuilds the free lists: the order
//! of every pair of live segments, and so every later decision, is unchanged.

use crate::backend::StreamId;
use crate::block::{BlockId, Placement};
use crate::policy::MIN_BLOCK_SIZE;
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

/// Segments created before the allocator renumbers them (see the module docs).
pub(crate) const SEQUENCE_LIMIT: u64 = 1 << SEQUENCE_BITS;

const UNIT_SHIFT: u32 = MIN_BLOCK_SIZE.trailing_zeros();
const UNIT_BITS: u32 = 39;
const SEQUENCE_BITS: u32 = 34;
const SEQUENCE_SHIFT: u32 = UNIT_BITS;
const SIZE_SHIFT: u32 = SEQUENCE_SHIFT + SEQUENCE_BITS;
const SLOT_SHIFT: u32 = SIZE_SHIFT + UNIT_BITS;
const UNIT_MASK: u128 = (1 << UNIT_BITS) - 1;
const _: () = assert!(SLOT_SHIFT + 16 == 128);
const _: () = assert!(MIN_BLOCK_SIZE == 1 << UNIT_SHIFT);
// Every block and every segment (hence every offset) fits the key: larger
// requests are refused before they get here, and an expandable segment's
// address range is at most 1.125 TiB.
const _: () = assert!(crate::policy::MAX_BLOCK_SIZE >> UNIT_SHIFT < 1 << UNIT_BITS);

#[inline]
fn key(slot: u16, size: usize, at: Placement) -> u128 {
    debug_assert!(size.is_multiple_of(MIN_BLOCK_SIZE) && at.offset.is_multiple_of(MIN_BLOCK_SIZE), "{size} {at:?}");
    debug_assert!(((size >> UNIT_SHIFT) as u128) <= UNIT_MASK && ((at.offset >> UNIT_SHIFT) as u128) <= UNIT_MASK);
    debug_assert!(at.sequence < SEQUENCE_LIMIT);
    (u128::from(slot) << SLOT_SHIFT)
        | (((size >> UNIT_SHIFT) as u128) << SIZE_SHIFT)
        | (u128::from(at.sequence) << SEQUENCE_SHIFT)
        | (at.offset >> UNIT_SHIFT) as u128
}

/// The first key of stream `slot`.
#[inline]
fn stream_start(slot: u16) -> u128 {
    u128::from(slot) << SLOT_SHIFT
}

/// The first key past stream `slot`'s keys (no key is `u128::MAX`: its
/// size field would exceed every block).
#[inline]
fn stream_end(slot: u16) -> u128 {
    match slot.checked_add(1) {
        Some(next) => stream_start(next),
        None => u128::MAX,
    }
}

/// The first key of blocks on stream `slot` of at least `size` bytes. Block
/// sizes are multiples of 512, so the size rounds up to whole units; no
/// block reaches `2^48` bytes, so a larger `size` (a `max_split_size` of
/// "no limit", say) starts past the stream's keys: nothing fits.
#[inline]
fn first_key(slot: u16, size: usize) -> u128 {
    let units = size.div_ceil(MIN_BLOCK_SIZE) as u128;
    if units <= UNIT_MASK {
        stream_start(slot) | (units << SIZE_SHIFT)
    } else {
        stream_end(slot)
    }
}

#[inline]
fn size_of_key(key: u128) -> usize {
    (((key >> SIZE_SHIFT) & UNIT_MASK) as usize) << UNIT_SHIFT
}

/// A free list this short is a sorted array; a longer one a B-tree.
const SORTED_MAX: usize = 64;
/// A B-tree that shrinks to this many blocks goes back to a sorted array
/// (well below [`SORTED_MAX`], so that a list near the limit does not
/// convert back and forth).
const SORTED_AGAIN: usize = 16;

/// The free blocks of one pool, in key order.
///
/// Most pools hold a handful of free blocks (a steady training step frees
/// what it allocates, and neighbours merge), where a sorted array beats a
/// B-tree: a binary search over contiguous keys and a short move instead of
/// node walks, splits and merges. Past [`SORTED_MAX`] blocks the list
/// becomes a B-tree, so a fragmented cache with thousands of free blocks
/// keeps logarithmic updates. Both give the same order and answers.
#[derive(Debug)]
pub(crate) enum FreeList {
    /// Keys in increasing order, with the block of each.
    Sorted { keys: Vec<u128>, ids: Vec<BlockId> },
    /// Many free blocks.
    Tree(BTreeMap<u128, BlockId>),
}

impl Default for FreeList {
    fn default() -> Self {
        FreeList::Sorted { keys: Vec::new(), ids: Vec::new() }
    }
}

impl FreeList {
    #[inline]
    pub fn insert(&mut self, slot: u16, size: usize, at: Placement, id: BlockId) {
        let key = key(slot, size, at);
        match self {
            FreeList::Sorted { keys, ids } => {
                let index = keys.partition_point(|k| *k < key);
                debug_assert!(keys.get(index) != Some(&key), "block listed twice");
                if keys.len() >= SORTED_MAX {
                    self.grow_into_tree(key, id);
                } else if index == keys.len() {
                    // Often the only block, or the largest: nothing moves.
                    keys.push(key);
                    ids.push(id);
                } else {
                    keys.insert(index, key);
                    ids.insert(index, id);
                }
            }
            FreeList::Tree(tree) => {
                tree.insert(key, id);
            }
        }
    }

    /// Removes a block; true if it was in the list.
    #[inline]
    pub fn remove(&mut self, slot: u16, size: usize, at: Placement) -> bool {
        let key = key(slot, size, at);
        match self {
            FreeList::Sorted { keys, ids } => match keys.binary_search(&key) {
                Ok(index) if index + 1 == keys.len() => {
                    keys.pop();
                    ids.pop();
                    true
                }
                Ok(index) => {
                    keys.remove(index);
                    ids.remove(index);
                    true
                }
                Err(_) => false,
            },
            FreeList::Tree(tree) => {
                let removed = tree.remove(&key).is_some();
                if tree.len() <= SORTED_AGAIN {
                    self.shrink_into_array();
                }
                removed
            }
        }
    }

    /// Turns a full sorted array into a B-tree, with one more block.
    #[cold]
    fn grow_into_tree(&mut self, key: u128, id: BlockId) {
        let mut tree = match std::mem::take(self) {
            FreeList::Sorted { keys, ids } => keys.into_iter().zip(ids).collect(),
            FreeList::Tree(tree) => tree,
        };
        tree.insert(key, id);
        *self = FreeList::Tree(tree);
    }

    #[cold]
    fn shrink_into_array(&mut self) {
        if let FreeList::Tree(tree) = std::mem::take(self) {
            let (keys, ids) = tree.into_iter().unzip();
            *self = FreeList::Sorted { keys, ids };
        }
    }

    /// The blocks with keys in `start..end`, in key order.
    #[inline]
    fn range(&self, start: u128, end: u128) -> Blocks<'_> {
        match self {
            FreeList::Sorted { keys, ids } => {
                let first = keys.partition_point(|k| *k < start);
                let last = first + keys[first..].partition_point(|k| *k < end);
                Blocks::Sorted(keys[first..last].iter().zip(&ids[first..last]))
            }
            FreeList::Tree(tree) => Blocks::Tree(tree.range(start..end)),
        }
    }

    /// The smallest block of at least `size` bytes on the stream, with its
    /// size; the first in placement order among equal sizes.
    #[inline]
    pub fn best_fit(&self, slot: u16, size: usize) -> Option<(usize, BlockId)> {
        let (start, end) = (first_key(slot, size), stream_end(slot));
        let (found, id) = match self {
            FreeList::Sorted { keys, ids } => {
                let index = keys.partition_point(|k| *k < start);
                (*keys.get(index)?, ids[index])
            }
            FreeList::Tree(tree) => tree.range(start..).next().map(|(k, id)| (*k, *id))?,
        };
        (found < end).then(|| (size_of_key(found), id))
    }

    /// Blocks on the stream of at least `size` bytes, smallest first (in
    /// placement order among equal sizes).
    pub fn at_least(&self, slot: u16, size: usize) -> impl DoubleEndedIterator<Item = (usize, BlockId)> + '_ {
        self.range(first_key(slot, size), stream_end(slot)).map(|(k, id)| (size_of_key(k), id))
    }

    /// Every free block, in key order.
    pub fn ids(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.range(0, u128::MAX).map(|(_, id)| id)
    }

    /// Empties the list (to rebuild it with new keys).
    pub fn clear(&mut self) {
        *self = FreeList::default();
    }

    /// How many blocks the list holds.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        match self {
            FreeList::Sorted { keys, .. } => keys.len(),
            FreeList::Tree(tree) => tree.len(),
        }
    }
}

/// The blocks of a key range of either form of [`FreeList`].
enum Blocks<'a> {
    Sorted(std::iter::Zip<std::slice::Iter<'a, u128>, std::slice::Iter<'a, BlockId>>),
    Tree(std::collections::btree_map::Range<'a, u128, BlockId>),
}

impl Iterator for Blocks<'_> {
    type Item = (u128, BlockId);

    #[inline]
    fn next(&mut self) -> Option<(u128, BlockId)> {
        match self {
            Blocks::Sorted(blocks) => blocks.next().map(|(k, id)| (*k, *id)),
            Blocks::Tree(blocks) => blocks.next().map(|(k, id)| (*k, *id)),
        }
    }
}

impl DoubleEndedIterator for Blocks<'_> {
    #[inline]
    fn next_back(&mut self) -> Option<(u128, BlockId)> {
        match self {
            Blocks::Sorted(blocks) => blocks.next_back().map(|(k, id)| (*k, *id)),
            Blocks::Tree(blocks) => blocks.next_back().map(|(k, id)| (*k, *id)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(sequence: u64, offset: usize) -> Placement {
        Placement { sequence, offset }
    }

    #[test]
    fn best_fit_stays_on_its_stream() {
        let mut list = FreeList::default();
        list.insert(0, 4096, at(0, 0x1000), BlockId(1));
        list.insert(0, 1024, at(1, 0x9000), BlockId(2));
        list.insert(1, 2048, at(2, 0x5000), BlockId(3));
        assert_eq!(list.best_fit(0, 1000), Some((1024, BlockId(2))));
        assert_eq!(list.best_fit(0, 2000), Some((4096, BlockId(1))));
        assert_eq!(list.best_fit(0, 5000), None, "does not spill into the next stream");
        assert_eq!(list.best_fit(1, 512), Some((2048, BlockId(3))));
        assert!(list.remove(0, 4096, at(0, 0x1000)));
        assert!(!list.remove(0, 4096, at(0, 0x1000)));
        let sizes: Vec<usize> = list.at_least(0, 0).map(|(s, _)| s).collect();
        assert_eq!(sizes, [1024]);
        assert_eq!(list.len(), 2);
    }

    #[test]
    fn sizes_no_block_can_have_find_nothing() {
        // A `max_split_size` of "no limit" asks for blocks of at least
        // usize::MAX bytes (found by the alloc_conf fuzz target).
        let mut list = FreeList::default();
        list.insert(0, 4096, at(0, 0), BlockId(1));
        list.insert(1, 4096, at(1, 0), BlockId(2));
        assert_eq!(list.at_least(0, usize::MAX).count(), 0);
        assert_eq!(list.at_least(0, 1 << 48).count(), 0);
        assert_eq!(list.best_fit(0, usize::MAX), None);
        assert_eq!(list.best_fit(u16::MAX, usize::MAX), None);
        assert_eq!(list.at_least(u16::MAX, usize::MAX).count(), 0);
        assert_eq!(list.at_least(0, 4096).count(), 1);
        assert_eq!(list.at_least(0, 4095).count(), 1, "sizes round up to whole units");
        assert_eq!(list.at_least(0, 4097).count(), 0);
    }

    #[test]
    fn equal_sizes_order_by_segment_sequence_then_offset() {
        let mut list = FreeList::default();
        // Addresses play no part: a later segment at a lower address comes after.
        list.insert(2, 512, at(5, 0), BlockId(7));
        list.insert(2, 512, at(3, 4096), BlockId(8));
        list.insert(2, 512, at(3, 1024), BlockId(9));
        assert_eq!(list.best_fit(2, 512), Some((512, BlockId(9))));
        let order: Vec<BlockId> = list.at_least(2, 512).map(|(_, id)| id).collect();
        assert_eq!(order, [BlockId(9), BlockId(8), BlockId(7)]);
    }

    #[test]
    fn the_largest_fields_fit() {
        let mut list = FreeList::default();
        let largest = crate::policy::MAX_BLOCK_SIZE;
        let far = at(SEQUENCE_LIMIT - 1, largest - MIN_BLOCK_SIZE);
        list.insert(u16::MAX, largest, far, BlockId(1));
        list.insert(u16::MAX, MIN_BLOCK_SIZE, at(0, 0), BlockId(2));
        list.insert(u16::MAX - 1, largest, far, BlockId(3));
        assert_eq!(list.best_fit(u16::MAX, largest), Some((largest, BlockId(1))));
        assert_eq!(list.best_fit(u16::MAX, 1), Some((MIN_BLOCK_SIZE, BlockId(2))));
        assert_eq!(list.best_fit(u16::MAX - 1, 1), Some((largest, BlockId(3))));
        assert!(list.remove(u16::MAX, largest, far));
        assert_eq!(list.best_fit(u16::MAX, MIN_BLOCK_SIZE + 1), None);
    }

    proptest::proptest! {
        /// Both forms of the list, and the changes between them, answer as
        /// a plain ordered map would.
        #[test]
        fn the_list_answers_as_an_ordered_map(
            ops in proptest::collection::vec((0u16..3, 1usize..40, 0u64..6, 0usize..8, proptest::bool::weighted(0.6)), 1..600),
        ) {
            let mut list = FreeList::default();
            let mut model: BTreeMap<(u16, usize, u64, usize), BlockId> = BTreeMap::new();
            for (step, (slot, units, sequence, offset, insert)) in ops.into_iter().enumerate() {
                let (size, placement) = (units * MIN_BLOCK_SIZE, at(sequence, offset * MIN_BLOCK_SIZE));
                let entry = (slot, size, sequence, offset);
                if insert && !model.contains_key(&entry) {
                    list.insert(slot, size, placement, BlockId(step as u32));
                    model.insert(entry, BlockId(step as u32));
                } else {
                    proptest::prop_assert_eq!(list.remove(slot, size, placement), model.remove(&entry).is_some());
                }
                proptest::prop_assert_eq!(list.len(), model.len());
                let want = |s: u16, min: usize| -> Vec<(usize, BlockId)> {
                    model.iter().filter(|(k, _)| k.0 == s && k.1 >= min).map(|(k, id)| (k.1, *id)).collect()
                };
                for s in 0..3 {
                    let min = (step % 50) * MIN_BLOCK_SIZE / 2;
                    let all: Vec<_> = list.at_least(s, min).collect();
                    proptest::prop_assert_eq!(&all, &want(s, min));
                    let backwards: Vec<_> = list.at_least(s, min).rev().collect();
                    proptest::prop_assert_eq!(backwards, want(s, min).into_iter().rev().collect::<Vec<_>>());
                    proptest::prop_assert_eq!(list.best_fit(s, min), want(s, min).first().copied());
                }
                proptest::prop_assert_eq!(list.ids().collect::<Vec<_>>(), model.values().copied().collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn lists_turn_into_trees_and_back() {
        let mut list = FreeList::default();
        for i in 0..=SORTED_MAX {
            list.insert(0, MIN_BLOCK_SIZE, at(i as u64, 0), BlockId(i as u32));
        }
        assert!(matches!(list, FreeList::Tree(_)));
        for i in 0..SORTED_MAX - SORTED_AGAIN {
            assert!(list.remove(0, MIN_BLOCK_SIZE, at(i as u64, 0)));
            assert!(matches!(list, FreeList::Tree(_)), "{i}");
        }
        assert!(list.remove(0, MIN_BLOCK_SIZE, at((SORTED_MAX - SORTED_AGAIN) as u64, 0)));
        assert!(matches!(list, FreeList::Sorted { .. }));
        assert_eq!(list.len(), SORTED_AGAIN);
        assert_eq!(list.best_fit(0, 1), Some((MIN_BLOCK_SIZE, BlockId((SORTED_MAX - SORTED_AGAIN + 1) as u32))));
    }

    #[test]
    fn stream_slots_are_stable() {
        let mut slots = StreamSlots::default();
        assert_eq!(slots.slot(StreamId(9)), 0);
        assert_eq!(slots.slot(StreamId(0)), 1);
        assert_eq!(slots.slot(StreamId(9)), 0);
    }
}
