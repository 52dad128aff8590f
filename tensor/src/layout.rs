//! [`Layout`]: how a tensor's logical elements map onto its storage (shape,
//! strides and offset, all in elements), and the views that only change that
//! mapping: transpose, permute, narrow, select, squeeze/unsqueeze,
//! broadcasting and reshape-as-view.
//!
//! Nothing here knows about devices or memory; a layout only computes element
//! offsets. [`Layout::offsets`] and [`Layout::contiguous_runs`] walk them in
//! row-major logical order for kernels.

use std::iter::FusedIterator;
use std::ops::Range;

use crate::shape::{resolve_dim, DimIndex, Shape};

pub use crate::shape::LayoutError;

/// A strided view of storage: logical element `[i0, i1, ..]` lives at storage
/// element `offset + i0 * strides[0] + i1 * strides[1] + ..`.
///
/// Invariants: the shape passes [`Shape::try_numel`] (so its element count,
/// its contiguous strides and each size fit an `isize`), there is one stride
/// per dim, and every element the layout addresses lies in
/// `0..=isize::MAX`. Every constructor checks them ([`Layout::contiguous`],
/// [`Layout::new`], [`Layout::broadcast_as`], [`Layout::reshape`]) and every
/// view keeps them, so code walking a layout trusts its sizes without
/// checking again. Strides may be zero (broadcast dims) or negative (only
/// through [`Layout::new`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Shape,
    strides: Vec<isize>,
    offset: usize,
}

impl Layout {
    /// A row-major layout of `shape` starting at storage element 0; an error
    /// when the shape is too large for a tensor ([`Shape::try_numel`]).
    pub fn contiguous(shape: impl Into<Shape>) -> Result<Self, LayoutError> {
        Self::contiguous_with_offset(shape, 0)
    }

    /// A row-major layout of `shape` starting at storage element `offset`;
    /// an error when the shape is too large or its last element would lie
    /// beyond `isize::MAX`.
    pub fn contiguous_with_offset(shape: impl Into<Shape>, offset: usize) -> Result<Self, LayoutError> {
        let shape = shape.into();
        let numel = shape.try_numel()?;
        // An empty layout addresses nothing, so any offset will do (as in `new`).
        if numel > 0 && offset.checked_add(numel - 1).is_none_or(|last| last > Shape::MAX_NUMEL) {
            let strides = shape.contiguous_strides();
            return Err(LayoutError::OffsetOverflow { shape, strides, offset });
        }
        let strides = shape.contiguous_strides();
        Ok(Layout { shape, strides, offset })
    }

    /// A row-major layout of this layout's shape at offset 0: what an op's
    /// output of the same shape gets. Infallible, and cheaper than
    /// [`Layout::contiguous`]: the shape was checked when `self` was built.
    pub fn dense_like(&self) -> Self {
        let shape = self.shape.clone();
        let strides = shape.contiguous_strides();
        Layout { shape, strides, offset: 0 }
    }

    /// A layout with explicit strides, checked against the invariants.
    pub fn new(shape: impl Into<Shape>, strides: Vec<isize>, offset: usize) -> Result<Self, LayoutError> {
        let shape = shape.into();
        shape.try_numel()?;
        if strides.len() != shape.rank() {
            return Err(LayoutError::StrideCountMismatch { shape, strides: strides.len() });
        }
        let layout = Layout { shape, strides, offset };
        if let Some((lowest, highest)) = layout.offset_bounds() {
            if lowest < 0 {
                return Err(LayoutError::BeforeStorageStart {
                    shape: layout.shape,
                    strides: layout.strides,
                    offset,
                    lowest,
                });
            }
            if highest > isize::MAX as i128 {
                return Err(LayoutError::OffsetOverflow { shape: layout.shape, strides: layout.strides, offset });
            }
        }
        Ok(layout)
    }

    /// The logical shape: one size per dim.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The shape's sizes as a slice, outermost dim first.
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    /// Strides in elements, one per dim.
    pub fn strides(&self) -> &[isize] {
        &self.strides
    }

    /// The storage element of logical element `[0, 0, ..]`.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The number of dims (0 for a scalar).
    pub fn rank(&self) -> usize {
        self.shape.rank()
    }

    /// The number of logical elements: the product of the sizes (1 for a scalar).
    pub fn numel(&self) -> usize {
        self.shape.numel()
    }

    /// Lowest and highest storage element addressed, or `None` when the
    /// layout has no elements. Computed in i128 so that it cannot overflow.
    fn offset_bounds(&self) -> Option<(i128, i128)> {
        if self.numel() == 0 {
            return None;
        }
        let mut lowest = self.offset as i128;
        let mut highest = lowest;
        for (&size, &stride) in self.dims().iter().zip(&self.strides) {
            // |reach| < 2^127; only the sum can overflow, and saturating keeps
            // it on the side that fails the bounds check.
            let reach = (size as i128 - 1) * stride as i128;
            if reach < 0 {
                lowest = lowest.saturating_add(reach);
            } else {
                highest = highest.saturating_add(reach);
            }
        }
        Some((lowest, highest))
    }

    /// How many storage elements a buffer needs for this layout to stay in
    /// bounds: one past the highest element addressed (0 when empty).
    pub fn required_storage_len(&self) -> usize {
        self.offset_bounds().map_or(0, |(_, highest)| highest as usize + 1)
    }

    /// True when the elements lie in row-major order one after another
    /// (PyTorch's `is_contiguous`): size-1 dims may have any stride, and an
    /// empty layout is contiguous. The offset does not matter.
    pub fn is_contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true;
        }
        let mut expected = 1isize;
        for (&size, &stride) in self.dims().iter().zip(&self.strides).rev() {
            if size != 1 {
                if stride != expected {
                    return false;
                }
                expected = expected.saturating_mul(size as isize);
            }
        }
        true
    }

    /// The storage element of logical element `index`.
    pub fn offset_of(&self, index: &[usize]) -> Result<usize, LayoutError> {
        if index.len() != self.rank() {
            return Err(LayoutError::IndexRankMismatch { op: "offset_of", rank: self.rank(), got: index.len() });
        }
        let mut position = self.offset as isize;
        for (dim, ((&i, &size), &stride)) in index.iter().zip(self.dims()).zip(&self.strides).enumerate() {
            if i >= size {
                return Err(LayoutError::IndexOutOfRange { op: "offset_of", dim, index: i, size });
            }
            // In range, so within the invariant's bounds: no overflow.
            position += i as isize * stride;
        }
        Ok(position as usize)
    }

    /// Swaps two dims. A 0-d layout accepts dims 0 and -1 and stays as it
    /// is (as in PyTorch).
    pub fn transpose(&self, dim0: impl DimIndex, dim1: impl DimIndex) -> Result<Self, LayoutError> {
        let a = resolve_dim(dim0, self.rank().max(1), "transpose")?;
        let b = resolve_dim(dim1, self.rank().max(1), "transpose")?;
        if self.rank() == 0 {
            return Ok(self.clone());
        }
        let mut dims = self.dims().to_vec();
        let mut strides = self.strides.clone();
        dims.swap(a, b);
        strides.swap(a, b);
        Ok(self.with(dims, strides, self.offset))
    }

    /// Reorders the dims: dim `i` of the result is dim `order[i]` of `self`.
    pub fn permute(&self, order: &[usize]) -> Result<Self, LayoutError> {
        let rank = self.rank();
        let mut seen = vec![false; rank];
        let is_permutation =
            order.len() == rank && order.iter().all(|&d| d < rank && !std::mem::replace(&mut seen[d], true));
        if !is_permutation {
            return Err(LayoutError::NotAPermutation { rank, got: order.to_vec() });
        }
        let dims = order.iter().map(|&d| self.dims()[d]).collect::<Vec<_>>();
        let strides = order.iter().map(|&d| self.strides[d]).collect();
        Ok(self.with(dims, strides, self.offset))
    }

    /// Keeps elements `start..start + len` of dim `dim`.
    pub fn narrow(&self, dim: impl DimIndex, start: usize, len: usize) -> Result<Self, LayoutError> {
        let d = resolve_dim(dim, self.rank(), "narrow")?;
        let size = self.dims()[d];
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(LayoutError::NarrowOutOfRange { dim: d, size, start, len });
        }
        let mut dims = self.dims().to_vec();
        dims[d] = len;
        // An empty view addresses nothing; keeping the offset avoids moving it
        // out of storage when start == size.
        let offset =
            if len == 0 { self.offset } else { (self.offset as isize + start as isize * self.strides[d]) as usize };
        Ok(self.with(dims, self.strides.clone(), offset))
    }

    /// Elements `start, start + step, ...` below `end` of dim `dim`: Python's
    /// `x[start:end:step]` (PyTorch's, so `step` must be positive). As in
    /// Python, `start` and `end` past the dim's size are clamped to it, and
    /// `start >= end` gives an empty view.
    pub fn slice(&self, dim: impl DimIndex, start: usize, end: usize, step: usize) -> Result<Self, LayoutError> {
        let d = resolve_dim(dim, self.rank(), "slice")?;
        if step == 0 {
            return Err(LayoutError::SliceStep { dim: d, step });
        }
        let size = self.dims()[d];
        let end = end.min(size);
        let start = start.min(end);
        let len = (end - start).div_ceil(step);
        let mut dims = self.dims().to_vec();
        dims[d] = len;
        let mut strides = self.strides.clone();
        // `step` <= size here (or the view is empty), so the product fits:
        // it is at most the span of the dim.
        let offset =
            if len == 0 { self.offset } else { (self.offset as isize + start as isize * self.strides[d]) as usize };
        if len > 1 {
            strides[d] = self.strides[d] * step as isize;
        }
        Ok(self.with(dims, strides, offset))
    }

    /// Picks element `index` of dim `dim`, removing that dim.
    pub fn select(&self, dim: impl DimIndex, index: usize) -> Result<Self, LayoutError> {
        let d = resolve_dim(dim, self.rank(), "select")?;
        let size = self.dims()[d];
        if index >= size {
            return Err(LayoutError::IndexOutOfRange { op: "select", dim: d, index, size });
        }
        let offset = (self.offset as isize + index as isize * self.strides[d]) as usize;
        let mut dims = self.dims().to_vec();
        let mut strides = self.strides.clone();
        dims.remove(d);
        strides.remove(d);
        Ok(self.with(dims, strides, offset))
    }

    /// Removes dim `dim`, which must have size 1. (PyTorch silently returns
    /// the input when the size is not 1; here that is an error, because it is
    /// almost always a bug in the caller's idea of the shape.) A 0-d layout
    /// accepts dims 0 and -1 and stays as it is, as in PyTorch.
    pub fn squeeze(&self, dim: impl DimIndex) -> Result<Self, LayoutError> {
        let d = resolve_dim(dim, self.rank().max(1), "squeeze")?;
        if self.rank() == 0 {
            return Ok(self.clone());
        }
        let size = self.dims()[d];
        if size != 1 {
            return Err(LayoutError::SqueezeNonUnit { dim: d, size });
        }
        let mut dims = self.dims().to_vec();
        let mut strides = self.strides.clone();
        dims.remove(d);
        strides.remove(d);
        Ok(self.with(dims, strides, self.offset))
    }

    /// Removes every dim of size 1.
    pub fn squeeze_all(&self) -> Self {
        let (dims, strides) = self
            .dims()
            .iter()
            .zip(&self.strides)
            .filter(|(&size, _)| size != 1)
            .map(|(&size, &stride)| (size, stride))
            .unzip::<_, _, Vec<_>, Vec<_>>();
        self.with(dims, strides, self.offset)
    }

    /// Inserts a dim of size 1 at position `dim` of the result (so `dim` may
    /// be `rank`, or `-1` for a new last dim).
    pub fn unsqueeze(&self, dim: impl DimIndex) -> Result<Self, LayoutError> {
        let d = resolve_dim(dim, self.rank() + 1, "unsqueeze")?;
        // Any stride works for a size-1 dim; PyTorch's choice keeps a
        // contiguous layout's strides row-major.
        let stride = if d < self.rank() { (self.dims()[d] as isize).saturating_mul(self.strides[d]) } else { 1 };
        let mut dims = self.dims().to_vec();
        let mut strides = self.strides.clone();
        dims.insert(d, 1);
        strides.insert(d, stride);
        Ok(self.with(dims, strides, self.offset))
    }

    /// Views this layout as `target` by NumPy broadcasting (PyTorch's
    /// `expand`): dims are aligned at the end, new leading dims and dims of
    /// size 1 stretched to the target size get stride 0, and every other dim
    /// must already have the target size.
    /// The target must not be too large for a tensor ([`Shape::try_numel`]),
    /// even though the view addresses no more storage than `self`: its
    /// element count is what every op on it computes with.
    #[doc(alias = "expand")]
    pub fn broadcast_as(&self, target: impl Into<Shape>) -> Result<Self, LayoutError> {
        let target = target.into();
        target.try_numel()?;
        let fail = || LayoutError::BroadcastTo { from: self.shape.clone(), to: target.clone() };
        let lead = target.rank().checked_sub(self.rank()).ok_or_else(fail)?;
        let mut strides = vec![0isize; target.rank()];
        for (i, (&size, &stride)) in self.dims().iter().zip(&self.strides).enumerate() {
            let wanted = target.dims()[lead + i];
            strides[lead + i] = if size == wanted {
                stride
            } else if size == 1 {
                0
            } else {
                return Err(fail());
            };
        }
        Ok(Layout { shape: target, strides, offset: self.offset })
    }

    /// The same elements in the same row-major order, seen as `shape`, without
    /// copying — or `Ok(None)` when the strides make that impossible and the
    /// caller must copy (PyTorch's `view` vs `reshape`). Fails when the
    /// element counts differ or `shape` is too large ([`Shape::try_numel`];
    /// an empty layout has as many elements as `[0, 2^62, 4]`, but that
    /// shape's strides would overflow).
    ///
    /// Follows PyTorch's `computeStride`: the old dims are cut into chunks that
    /// are each contiguous in memory, and every new dim must fall inside one
    /// chunk.
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Option<Self>, LayoutError> {
        let shape = shape.into();
        if shape.try_numel()? != self.numel() {
            return Err(LayoutError::ReshapeElementCount { from: self.shape.clone(), to: shape });
        }
        Ok(view_strides(self.dims(), &self.strides, shape.dims()).map(|strides| Layout {
            shape,
            strides,
            offset: self.offset,
        }))
    }

    /// An equivalent layout with as few dims as possible: size-1 dims dropped,
    /// and neighbouring dims merged where the outer one steps exactly over the
    /// inner one. It addresses the same elements in the same order, so loops
    /// over it are shallower. An empty layout becomes shape `[0]`.
    pub fn coalesced(&self) -> Self {
        if self.numel() == 0 {
            return Layout { shape: Shape::from([0]), strides: vec![1], offset: self.offset };
        }
        let mut dims: Vec<usize> = Vec::with_capacity(self.rank());
        let mut strides: Vec<isize> = Vec::with_capacity(self.rank());
        for (&size, &stride) in self.dims().iter().zip(&self.strides) {
            if size == 1 {
                continue;
            }
            match (dims.last_mut(), strides.last_mut()) {
                // Broadcast dims (stride 0) can be huge, so the merged size
                // must be checked too.
                (Some(outer_size), Some(outer_stride))
                    if Some(*outer_stride) == stride.checked_mul(size as isize)
                        && outer_size.checked_mul(size).is_some() =>
                {
                    *outer_size *= size;
                    *outer_stride = stride;
                }
                _ => {
                    dims.push(size);
                    strides.push(stride);
                }
            }
        }
        self.with(dims, strides, self.offset)
    }

    /// Length of the runs of consecutive storage elements that the row-major
    /// walk is made of: the kernel's inner loop can take slices of this length.
    /// 1 when the innermost (coalesced) dim is not unit-stride, 0 when empty.
    pub fn inner_contiguous_run(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        let coalesced = self.coalesced();
        match (coalesced.dims().last(), coalesced.strides.last()) {
            (Some(&size), Some(&1)) => size,
            _ => 1,
        }
    }

    /// Storage offsets of every element in row-major logical order.
    pub fn offsets(&self) -> StridedOffsets {
        StridedOffsets::new(&self.coalesced())
    }

    /// The row-major walk as ranges of consecutive storage elements, each
    /// [`Layout::inner_contiguous_run`] long, so a kernel can work on slices
    /// `&data[range]`.
    pub fn contiguous_runs(&self) -> ContiguousRuns {
        let coalesced = self.coalesced();
        let run_len = self.inner_contiguous_run();
        let outer = if run_len > 1 {
            let rank = coalesced.rank();
            coalesced.with(
                coalesced.dims()[..rank - 1].to_vec(),
                coalesced.strides[..rank - 1].to_vec(),
                coalesced.offset,
            )
        } else {
            coalesced
        };
        ContiguousRuns { starts: StridedOffsets::new(&outer), run_len }
    }

    /// Whether several elements of this layout are one storage element:
    /// a broadcast dim (stride 0) of size above 1, as `expand` makes. Writing
    /// through such a layout would store several values in one place, so
    /// in-place ops refuse it, as PyTorch does (which, like this, only rules
    /// on the certain case; `Layout::new` could make other overlaps, which no
    /// tensor op does).
    pub fn has_internal_overlap(&self) -> bool {
        self.dims().iter().zip(&self.strides).any(|(&size, &stride)| size > 1 && stride == 0)
    }

    /// This layout with every broadcast dim (stride 0) cut to size 1: the
    /// same storage elements, each addressed once per remaining position.
    /// A walk over it costs what the layout before `expand` did.
    pub fn without_broadcast_dims(&self) -> Self {
        let dims =
            self.dims().iter().zip(&self.strides).map(|(&size, &stride)| if stride == 0 { size.min(1) } else { size });
        self.with(dims.collect(), self.strides.clone(), self.offset)
    }

    /// A layout over the same storage with new dims and strides. Callers
    /// derive them from `self` so the invariants still hold.
    fn with(&self, dims: Vec<usize>, strides: Vec<isize>, offset: usize) -> Self {
        Layout { shape: Shape::from(dims), strides, offset }
    }
}

/// PyTorch's `computeStride`: strides that make `new_dims` address the same
/// elements as (`old_dims`, `old_strides`) in the same row-major order, if any.
fn view_strides(old_dims: &[usize], old_strides: &[isize], new_dims: &[usize]) -> Option<Vec<isize>> {
    if old_dims.is_empty() {
        return Some(vec![1; new_dims.len()]);
    }
    let numel: usize = old_dims.iter().product();
    if numel == 0 {
        // Nothing is addressed, so any strides do; keep them as a contiguous
        // tensor would have them.
        if old_dims == new_dims {
            return Some(old_strides.to_vec());
        }
        return Some(Shape::from(new_dims).contiguous_strides());
    }
    let mut new_strides = vec![0isize; new_dims.len()];
    // Walk both shapes from the innermost dim, one contiguous chunk of old
    // dims at a time.
    let mut view_d = new_dims.len();
    let mut chunk_base_stride = *old_strides.last()?;
    let mut tensor_numel = 1usize;
    let mut view_numel = 1usize;
    for tensor_d in (0..old_dims.len()).rev() {
        tensor_numel *= old_dims[tensor_d];
        let chunk_ends = tensor_d == 0
            || (old_dims[tensor_d - 1] != 1
                && Some(old_strides[tensor_d - 1]) != (tensor_numel as isize).checked_mul(chunk_base_stride));
        if chunk_ends {
            while view_d > 0 && (view_numel < tensor_numel || new_dims[view_d - 1] == 1) {
                new_strides[view_d - 1] = (view_numel as isize).saturating_mul(chunk_base_stride);
                view_numel *= new_dims[view_d - 1];
                view_d -= 1;
            }
            if view_numel != tensor_numel {
                return None;
            }
            if tensor_d > 0 {
                chunk_base_stride = old_strides[tensor_d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    if view_d != 0 {
        return None;
    }
    Some(new_strides)
}

/// Iterator over a layout's storage offsets in row-major logical order
/// (from [`Layout::offsets`]). It walks the coalesced dims like an odometer,
/// so for most layouts a step is one add and one compare.
#[derive(Clone, Debug)]
pub struct StridedOffsets {
    dims: Vec<usize>,
    strides: Vec<isize>,
    index: Vec<usize>,
    next_offset: isize,
    remaining: usize,
}

impl StridedOffsets {
    fn new(layout: &Layout) -> Self {
        StridedOffsets {
            dims: layout.dims().to_vec(),
            strides: layout.strides.clone(),
            index: vec![0; layout.rank()],
            next_offset: layout.offset as isize,
            remaining: layout.numel(),
        }
    }
}

impl Iterator for StridedOffsets {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        if self.remaining == 0 {
            return None;
        }
        let current = self.next_offset;
        self.remaining -= 1;
        // Step only when another element follows, so the odometer never
        // rolls past the last one.
        if self.remaining > 0 {
            for d in (0..self.dims.len()).rev() {
                if self.index[d] + 1 < self.dims[d] {
                    self.index[d] += 1;
                    self.next_offset += self.strides[d];
                    break;
                }
                // Roll this digit back to 0; (size - 1) * stride stays within
                // the layout's bounds, so this cannot overflow.
                self.next_offset -= self.strides[d] * (self.dims[d] - 1) as isize;
                self.index[d] = 0;
            }
        }
        Some(current as usize)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for StridedOffsets {}
impl FusedIterator for StridedOffsets {}

/// Iterator over the ranges of consecutive storage elements that make up a
/// layout's row-major walk (from [`Layout::contiguous_runs`]).
#[derive(Clone, Debug)]
pub struct ContiguousRuns {
    starts: StridedOffsets,
    run_len: usize,
}

impl ContiguousRuns {
    /// The length of every range this iterator yields.
    pub fn run_len(&self) -> usize {
        self.run_len
    }
}

impl Iterator for ContiguousRuns {
    type Item = Range<usize>;

    #[inline]
    fn next(&mut self) -> Option<Range<usize>> {
        let start = self.starts.next()?;
        Some(start..start + self.run_len)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.starts.size_hint()
    }
}

impl ExactSizeIterator for ContiguousRuns {}
impl FusedIterator for ContiguousRuns {}

#[cfg(test)]
mod tests;
