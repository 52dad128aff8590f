//! The flat-shard layout every sharded engine uses ([`DataParallel`]'s
//! replicas, ZeRO-1/2's buckets, FSDP's units): where every parameter
//! lives in a flat buffer, and which rank owns which elements.
//!
//! Parameters are grouped by dtype; each group is one flat buffer, its
//! parameters packed back to back in the order given and zero-padded to a
//! multiple of the number of ranks so that it splits into equal shards.
//! Rank `r` owns shard `r` of every group: it receives the reduced
//! gradients of those elements and runs the optimizer on them. Shards are
//! by element, not by whole parameter, so the optimizer state is spread
//! evenly even when one weight matrix is most of the model.
//!
//! [`DataParallel`]: crate::DataParallel

use crate::error::Result;
use brasa_tensor::{DType, Tensor};
use std::ops::Range;

/// One trainable parameter's place in its group's flat buffer.
#[derive(Clone, Debug)]
pub(crate) struct Slot {
    /// Its dotted name in the model.
    pub(crate) name: String,
    /// Its dtype group.
    pub(crate) group: usize,
    /// Its first element in the group's flat buffer.
    pub(crate) offset: usize,
    /// Its shape.
    pub(crate) dims: Vec<usize>,
}

impl Slot {
    pub(crate) fn numel(&self) -> usize {
        self.dims.iter().product()
    }

    pub(crate) fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.numel()
    }
}

/// The parameters of one dtype, packed into one flat buffer.
#[derive(Clone, Debug)]
pub(crate) struct Group {
    pub(crate) dtype: DType,
    /// Elements used by parameters (the rest of the buffer is padding).
    pub(crate) used: usize,
    /// Elements per device shard: `ceil(used / world)`.
    pub(crate) shard_len: usize,
}

/// The part of one parameter that falls in one device's shard: what that
/// device's optimizer updates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    /// The parameter (index into [`FlatLayout::slots`]).
    pub(crate) slot: usize,
    pub(crate) group: usize,
    /// Elements of the group's flat buffer.
    pub(crate) flat: Range<usize>,
}

/// The flat buffers' layout and the ownership of their shards.
#[derive(Clone, Debug)]
pub(crate) struct FlatLayout {
    pub(crate) slots: Vec<Slot>,
    pub(crate) groups: Vec<Group>,
    pub(crate) world: usize,
}

impl FlatLayout {
    /// The layout of `params` (name, dtype, shape), in that order, for
    /// `world` devices (at least 1).
    pub(crate) fn new(params: &[(String, DType, Vec<usize>)], world: usize) -> FlatLayout {
        let world = world.max(1);
        let mut groups: Vec<Group> = Vec::new();
        let mut slots = Vec::with_capacity(params.len());
        for (name, dtype, dims) in params {
            let group = match groups.iter().position(|g| g.dtype == *dtype) {
                Some(index) => index,
                None => {
                    groups.push(Group { dtype: *dtype, used: 0, shard_len: 0 });
                    groups.len() - 1
                }
            };
            let slot = Slot { name: name.clone(), group, offset: groups[group].used, dims: dims.clone() };
            groups[group].used += slot.numel();
            slots.push(slot);
        }
        for group in &mut groups {
            group.shard_len = group.used.div_ceil(world);
        }
        FlatLayout { slots, groups, world }
    }

    /// Elements of group `group`'s flat buffer, padding included.
    pub(crate) fn padded_len(&self, group: usize) -> usize {
        self.groups[group].shard_len * self.world
    }

    /// The elements of group `group` that device `rank` owns.
    pub(crate) fn shard(&self, group: usize, rank: usize) -> Range<usize> {
        let len = self.groups[group].shard_len;
        rank * len..(rank + 1) * len
    }

    /// What device `rank` owns, parameter by parameter, in group order and
    /// then buffer order; padding belongs to no piece.
    pub(crate) fn pieces(&self, rank: usize) -> Vec<Piece> {
        let mut pieces = Vec::new();
        for group in 0..self.groups.len() {
            let shard = self.shard(group, rank);
            for (index, slot) in self.slots.iter().enumerate().filter(|(_, s)| s.group == group) {
                let range = slot.range();
                let (start, end) = (range.start.max(shard.start), range.end.min(shard.end));
                if start < end {
                    pieces.push(Piece { slot: index, group, flat: start..end });
                }
            }
        }
        pieces
    }

    /// Copies the parts of `tensors` (one per slot, in slot order, all of
    /// group `group`'s dtype) that fall in `rank`'s shard of group `group`
    /// into `shard`.
    pub(crate) fn copy_to_shard(&self, group: usize, rank: usize, shard: &Tensor, tensors: &[Tensor]) -> Result<()> {
        let range = self.shard(group, rank);
        for piece in self.pieces(rank).into_iter().filter(|p| p.group == group) {
            let slot = &self.slots[piece.slot];
            let flat = tensors[piece.slot].reshape(&[-1])?;
            let part = flat.narrow(0, piece.flat.start - slot.offset, piece.flat.len())?;
            shard.narrow(0, piece.flat.start - range.start, piece.flat.len())?.copy_(&part)?;
        }
        Ok(())
    }

    /// Parameter elements (padding excluded) that device `rank` owns.
    pub(crate) fn owned_elements(&self, rank: usize) -> usize {
        self.pieces(rank).iter().map(|p| p.flat.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(shapes: &[(DType, &[usize])]) -> Vec<(String, DType, Vec<usize>)> {
        shapes.iter().enumerate().map(|(i, (dtype, dims))| (format!("p{i}"), *dtype, dims.to_vec())).collect()
    }

    #[test]
    fn pieces_cover_every_element_once_and_shards_are_equal() {
        let layout = FlatLayout::new(
            &params(&[
                (DType::F32, &[5, 3]),
                (DType::F32, &[3]),
                (DType::F64, &[2]),
                (DType::F32, &[]),
                (DType::F32, &[4]),
            ]),
            4,
        );
        assert_eq!(layout.groups.len(), 2);
        assert_eq!(layout.groups[0].used, 15 + 3 + 1 + 4);
        assert_eq!(layout.groups[0].shard_len, 6);
        assert_eq!(layout.padded_len(0), 24);
        assert_eq!(layout.slots[3].offset, 18);
        assert_eq!(layout.slots[2].offset, 0);
        let mut covered = [vec![0u32; layout.padded_len(0)], vec![0u32; layout.padded_len(1)]];
        for rank in 0..4 {
            for piece in layout.pieces(rank) {
                let shard = layout.shard(piece.group, rank);
                assert!(shard.start <= piece.flat.start && piece.flat.end <= shard.end);
                let slot = &layout.slots[piece.slot];
                assert!(slot.range().start <= piece.flat.start && piece.flat.end <= slot.range().end);
                for i in piece.flat.clone() {
                    covered[piece.group][i] += 1;
                }
            }
        }
        for (group, counts) in covered.iter().enumerate() {
            let used = layout.groups[group].used;
            assert!(counts[..used].iter().all(|&c| c == 1), "group {group}: {counts:?}");
            assert!(counts[used..].iter().all(|&c| c == 0), "padding is owned by nobody");
        }
        let owned: usize = (0..4).map(|r| layout.owned_elements(r)).sum();
        assert_eq!(owned, 23 + 2);
    }

    #[test]
    fn one_large_matrix_is_split_evenly() {
        let layout = FlatLayout::new(&params(&[(DType::F32, &[1000, 100]), (DType::F32, &[10])]), 4);
        let owned: Vec<usize> = (0..4).map(|r| layout.owned_elements(r)).collect();
        assert_eq!(owned, [25_003, 25_003, 25_003, 25_001]);
    }
}
