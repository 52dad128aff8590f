//! [`Shape`]: the extents of a tensor's dimensions, negative dim indexing
//! ([`DimIndex`]), NumPy broadcasting of two shapes ([`broadcast_shapes`]), and
//! [`LayoutError`], why a shape or layout operation failed (re-exported by
//! [`crate::layout`], whose views build on shapes).

use std::fmt;

/// Why a shape or layout operation failed. Each message names the operation
/// and the numbers that make it impossible.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// A dimension index outside `-rank..rank`.
    #[error("{op}: dim {dim} is out of range for a tensor of rank {rank} ({})", dim_range(*rank))]
    DimOutOfRange {
        /// The operation.
        op: &'static str,
        /// The dimension asked for (negative counts from the end).
        dim: isize,
        /// The tensor's rank.
        rank: usize,
    },
    /// A slice with a step that is not positive.
    #[error("slice: step must be positive, got {step} (dim {dim})")]
    SliceStep {
        /// The dimension sliced.
        dim: usize,
        /// The step given.
        step: usize,
    },
    /// `narrow` past the end of a dimension.
    #[error(
        "narrow: dim {dim} has size {size} but start {start} + length {len} = {} exceeds it",
        *start as u128 + *len as u128
    )]
    NarrowOutOfRange {
        /// The dimension narrowed.
        dim: usize,
        /// Its size.
        size: usize,
        /// The first index kept.
        start: usize,
        /// How many indices were asked for.
        len: usize,
    },
    /// An index outside a dimension.
    #[error("{op}: index {index} is out of range for dim {dim} of size {size}")]
    IndexOutOfRange {
        /// The operation.
        op: &'static str,
        /// The dimension indexed.
        dim: usize,
        /// The index given.
        index: usize,
        /// The dimension's size.
        size: usize,
    },
    /// A multi-dimensional index with the wrong number of coordinates.
    #[error("{op}: expected an index of {rank} coordinates, got {got}")]
    IndexRankMismatch {
        /// The operation.
        op: &'static str,
        /// The tensor's rank (coordinates needed).
        rank: usize,
        /// Coordinates given.
        got: usize,
    },
    /// `permute` given something that is not a permutation of the dims.
    #[error("permute: expected a permutation of 0..{rank}, got {got:?}")]
    NotAPermutation {
        /// The tensor's rank.
        rank: usize,
        /// The dims given.
        got: Vec<usize>,
    },
    /// `squeeze` of a dimension whose size is not 1.
    #[error("squeeze: dim {dim} has size {size}, not 1")]
    SqueezeNonUnit {
        /// The dimension.
        dim: usize,
        /// Its size.
        size: usize,
    },
    /// A shape that cannot be broadcast to a target shape.
    #[error("cannot broadcast shape {from} to {to}")]
    BroadcastTo {
        /// The shape broadcast.
        from: Shape,
        /// The target shape.
        to: Shape,
    },
    /// Two shapes that do not broadcast together.
    #[error(
        "cannot broadcast shapes {a} and {b} together: at dim {dim} the sizes are {size_a} and {size_b} (they must match or one must be 1)"
    )]
    IncompatibleShapes {
        /// The first shape.
        a: Shape,
        /// The second shape.
        b: Shape,
        /// The dimension where they disagree, counted from the end (negative).
        dim: isize,
        /// The first shape's size there.
        size_a: usize,
        /// The second shape's size there.
        size_b: usize,
    },
    /// `reshape` to a shape with another number of elements.
    #[error(
        "reshape: cannot reshape {from} ({} elements) to {to} ({} elements)",
        from.numel(),
        to.numel()
    )]
    ReshapeElementCount {
        /// The tensor's shape.
        from: Shape,
        /// The shape asked for.
        to: Shape,
    },
    /// A `reshape` specification that cannot be resolved (two `-1`s, a
    /// `-1` with no size to infer from, a negative size).
    #[error("reshape: cannot reshape {from} to {spec:?}: {reason}")]
    InvalidReshape {
        /// The sizes asked for, `-1` for an inferred one.
        spec: Vec<isize>,
        /// The tensor's shape.
        from: Shape,
        /// Why it cannot be resolved.
        reason: &'static str,
    },
    /// A layout given a number of strides other than the shape's rank.
    #[error("layout: {strides} strides given for shape {shape} of rank {}", shape.rank())]
    StrideCountMismatch {
        /// The shape.
        shape: Shape,
        /// How many strides were given.
        strides: usize,
    },
    /// A layout that addresses storage before its start.
    #[error(
        "layout: shape {shape} with strides {strides:?} and offset {offset} addresses storage element {lowest}, before the start of storage"
    )]
    BeforeStorageStart {
        /// The shape.
        shape: Shape,
        /// The strides.
        strides: Vec<isize>,
        /// The offset of element `[0, 0, ..]`.
        offset: usize,
        /// The lowest storage element addressed (negative).
        lowest: i128,
    },
    /// A layout that addresses storage elements beyond `isize::MAX`.
    #[error("layout: shape {shape} with strides {strides:?} and offset {offset} addresses storage elements beyond isize::MAX")]
    OffsetOverflow {
        /// The shape.
        shape: Shape,
        /// The strides.
        strides: Vec<isize>,
        /// The offset of element `[0, 0, ..]`.
        offset: usize,
    },
    /// A shape with more elements than a tensor can have.
    #[error(
        "shape {shape} is too large: the product of its sizes (size-0 dims counted as 1) exceeds isize::MAX = {}, \
         the most elements a tensor can have",
        isize::MAX
    )]
    TooLarge {
        /// The shape.
        shape: Shape,
    },
}

fn dim_range(rank: usize) -> String {
    if rank == 0 {
        "it has no dims".to_string()
    } else {
        format!("expected -{rank}..={}", rank - 1)
    }
}

/// The size of each dimension, outermost first. A rank-0 shape (`[]`) is a
/// scalar and holds one element.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(Vec<usize>);

impl Shape {
    /// The most elements a tensor may have: `isize::MAX`, so that element
    /// counts, strides and offsets all fit an `isize` (PyTorch's limit too:
    /// its element count is an `i64`). Larger shapes are refused when a
    /// layout is built ([`Shape::try_numel`]).
    pub const MAX_NUMEL: usize = isize::MAX as usize;

    /// A shape with these dimension sizes (any sizes: they are checked when
    /// a layout or tensor is made of the shape).
    pub fn new(dims: impl Into<Vec<usize>>) -> Self {
        Shape(dims.into())
    }

    /// The rank-0 shape of a single value.
    pub fn scalar() -> Self {
        Shape(Vec::new())
    }

    /// The dimension sizes, outermost first.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// The number of elements: the product of the sizes (1 for a scalar).
    ///
    /// Exact for every shape [`Shape::try_numel`] accepts, which includes the
    /// shape of every [`Layout`](crate::Layout) and so of every tensor: sizes
    /// are checked once, when a layout is built, and trusted afterwards. For
    /// other shapes it saturates at `usize::MAX` (it never wraps).
    pub fn numel(&self) -> usize {
        if self.0.contains(&0) {
            return 0;
        }
        self.0.iter().fold(1usize, |acc, &d| acc.saturating_mul(d))
    }

    /// The number of elements, or an error when the shape is too large for a
    /// tensor: when the product of the sizes, with size-0 dims counted as 1,
    /// exceeds [`Shape::MAX_NUMEL`]. Counting empty dims as 1 bounds the
    /// contiguous strides too (`[0, 2^62, 4]` holds nothing, but its first
    /// stride would be 2^64), so for an accepted shape neither the element
    /// count, nor any stride, nor any size converted to `isize` overflows.
    pub fn try_numel(&self) -> Result<usize, LayoutError> {
        let mut extent = 1usize;
        for &size in &self.0 {
            extent = extent
                .checked_mul(size.max(1))
                .filter(|&e| e <= Self::MAX_NUMEL)
                .ok_or_else(|| LayoutError::TooLarge { shape: self.clone() })?;
        }
        Ok(if self.0.contains(&0) { 0 } else { extent })
    }

    /// [`Shape::try_numel`] as an `Option`.
    pub fn checked_numel(&self) -> Option<usize> {
        self.try_numel().ok()
    }

    /// True for the rank-0 shape.
    pub fn is_scalar(&self) -> bool {
        self.0.is_empty()
    }

    /// The size of dimension `dim`; negative values count from the end
    /// (`dim(-1)` is the last dimension's size).
    pub fn dim(&self, dim: impl DimIndex) -> Result<usize, LayoutError> {
        let axis = self.axis(dim, "dim")?;
        Ok(self.0[axis])
    }

    /// Resolves a possibly negative dim to an index in `0..rank`, naming `op`
    /// in the error.
    pub fn axis(&self, dim: impl DimIndex, op: &'static str) -> Result<usize, LayoutError> {
        resolve_dim(dim, self.rank(), op)
    }

    /// Row-major (C-order) strides for this shape, in elements.
    pub fn contiguous_strides(&self) -> Vec<isize> {
        let mut strides = vec![0isize; self.rank()];
        let mut next = 1isize;
        for (stride, &size) in strides.iter_mut().zip(&self.0).rev() {
            *stride = next;
            // Size-0 dims would zero every outer stride; PyTorch keeps them
            // at least 1 so that strides stay distinct.
            next = next.saturating_mul(size.max(1) as isize);
        }
        strides
    }

    /// Resolves a reshape request that may contain one `-1`, which stands for
    /// whatever size makes the element count match this shape's.
    pub fn infer_reshape(&self, spec: &[isize]) -> Result<Shape, LayoutError> {
        let invalid =
            |reason: &'static str| LayoutError::InvalidReshape { spec: spec.to_vec(), from: self.clone(), reason };
        let mut inferred_at = None;
        let mut known_product = 1usize;
        for (i, &size) in spec.iter().enumerate() {
            match size {
                -1 if inferred_at.is_some() => return Err(invalid("only one size may be -1")),
                -1 => inferred_at = Some(i),
                size if size < 0 => return Err(invalid("sizes must be non-negative or -1")),
                size => {
                    known_product = known_product
                        .checked_mul(size as usize)
                        .ok_or_else(|| invalid("the element count overflows usize"))?;
                }
            }
        }
        let numel = self.numel();
        let mut dims: Vec<usize> = spec.iter().map(|&s| s.max(0) as usize).collect();
        if let Some(i) = inferred_at {
            if known_product == 0 || !numel.is_multiple_of(known_product) {
                return Err(invalid("no size for -1 makes the element counts match"));
            }
            dims[i] = numel / known_product;
        } else if known_product != numel {
            return Err(LayoutError::ReshapeElementCount { from: self.clone(), to: Shape(dims) });
        }
        Ok(Shape(dims))
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl From<Vec<usize>> for Shape {
    fn from(dims: Vec<usize>) -> Self {
        Shape(dims)
    }
}

impl From<&[usize]> for Shape {
    fn from(dims: &[usize]) -> Self {
        Shape(dims.to_vec())
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(dims: [usize; N]) -> Self {
        Shape(dims.to_vec())
    }
}

impl<const N: usize> From<&[usize; N]> for Shape {
    fn from(dims: &[usize; N]) -> Self {
        Shape(dims.to_vec())
    }
}

impl From<&Shape> for Shape {
    fn from(shape: &Shape) -> Self {
        shape.clone()
    }
}

impl From<()> for Shape {
    fn from((): ()) -> Self {
        Shape::scalar()
    }
}

impl AsRef<[usize]> for Shape {
    fn as_ref(&self) -> &[usize] {
        &self.0
    }
}

/// A dimension index that may count from the end: `-1` is the last dim.
///
/// Implemented for the integer types a caller is likely to hold, so that
/// `layout.transpose(0, -1)` and `layout.transpose(i, j)` with `usize`s both
/// read naturally.
pub trait DimIndex: Copy {
    /// The index as a signed number, for error messages.
    fn as_signed(self) -> isize;
}

impl DimIndex for usize {
    fn as_signed(self) -> isize {
        isize::try_from(self).unwrap_or(isize::MAX)
    }
}

impl DimIndex for isize {
    fn as_signed(self) -> isize {
        self
    }
}

impl DimIndex for i32 {
    fn as_signed(self) -> isize {
        self as isize
    }
}

impl DimIndex for i64 {
    fn as_signed(self) -> isize {
        isize::try_from(self).unwrap_or(if self < 0 { isize::MIN } else { isize::MAX })
    }
}

/// Resolves `dim` against `rank` (negative counts from the end), naming `op`
/// in the error when it is out of range.
pub fn resolve_dim(dim: impl DimIndex, rank: usize, op: &'static str) -> Result<usize, LayoutError> {
    let signed = dim.as_signed();
    let rank_signed = rank as isize;
    let resolved = if signed < 0 { signed + rank_signed } else { signed };
    if (0..rank_signed).contains(&resolved) {
        Ok(resolved as usize)
    } else {
        Err(LayoutError::DimOutOfRange { op, dim: signed, rank })
    }
}

/// The shape two operands broadcast to, by NumPy's rules: align the shapes at
/// their last dims, pad the shorter with leading 1s, and in each dim the sizes
/// must match or one of them must be 1 (which stretches to the other).
pub fn broadcast_shapes(a: &Shape, b: &Shape) -> Result<Shape, LayoutError> {
    let rank = a.rank().max(b.rank());
    let mut dims = vec![0usize; rank];
    for (from_end, out) in dims.iter_mut().rev().enumerate() {
        let size_a = size_from_end(a, from_end);
        let size_b = size_from_end(b, from_end);
        *out = match (size_a, size_b) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            (x, y) => {
                return Err(LayoutError::IncompatibleShapes {
                    a: a.clone(),
                    b: b.clone(),
                    dim: -(from_end as isize) - 1,
                    size_a: x,
                    size_b: y,
                })
            }
        };
    }
    let shape = Shape(dims);
    // Two shapes that each fit can broadcast to one that does not
    // (`[2^40, 1]` and `[1, 2^40]`).
    shape.try_numel()?;
    Ok(shape)
}

/// The size `from_end` dims before the last, or 1 past the front.
fn size_from_end(shape: &Shape, from_end: usize) -> usize {
    shape.rank().checked_sub(from_end + 1).map_or(1, |i| shape.dims()[i])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn numel_rank_and_strides() {
        let shape = Shape::from([2, 3, 4]);
        assert_eq!(shape.numel(), 24);
        assert_eq!(shape.rank(), 3);
        assert_eq!(shape.contiguous_strides(), vec![12, 4, 1]);
        assert_eq!(Shape::scalar().numel(), 1);
        assert!(Shape::from(()).is_scalar());
        assert_eq!(Shape::from([2, 0, 3]).numel(), 0);
        assert_eq!(Shape::from([2, 0, 3]).contiguous_strides(), vec![3, 3, 1]);
        assert_eq!(Shape::from([usize::MAX, 2]).checked_numel(), None);
        assert_eq!(Shape::from([usize::MAX, 2]).numel(), usize::MAX);
        assert_eq!(Shape::from([usize::MAX, 2, 0]).numel(), 0);
        assert_eq!(Shape::from([0, isize::MAX as usize]).try_numel(), Ok(0));
        assert_eq!(Shape::from([1 << 31, 1 << 31, 1]).try_numel(), Ok(1 << 62));
        assert_eq!(Shape::from([isize::MAX as usize]).try_numel(), Ok(Shape::MAX_NUMEL));
        for too_large in [
            &[usize::MAX, 2][..],
            &[1 << 31, 1 << 31, 2],
            &[isize::MAX as usize + 1],
            &[0, usize::MAX],
            &[2, 0, 1 << 62, 2],
        ] {
            let error = Shape::from(too_large).try_numel().unwrap_err();
            assert_eq!(error, LayoutError::TooLarge { shape: Shape::from(too_large) });
            assert!(error.to_string().contains(&format!("{too_large:?} is too large")), "{error}");
        }
        assert_eq!(shape.to_string(), "[2, 3, 4]");
    }

    #[test]
    fn negative_dims_count_from_the_end() {
        let shape = Shape::from([2, 3, 4]);
        assert_eq!(shape.dim(-1).unwrap(), 4);
        assert_eq!(shape.dim(0).unwrap(), 2);
        assert_eq!(shape.dim(-3).unwrap(), 2);
        assert_eq!(shape.dim(2usize).unwrap(), 4);
        assert_eq!(shape.axis(-2isize, "sum").unwrap(), 1);
        let err = shape.dim(3).unwrap_err();
        assert_eq!(err, LayoutError::DimOutOfRange { op: "dim", dim: 3, rank: 3 });
        assert_eq!(err.to_string(), "dim: dim 3 is out of range for a tensor of rank 3 (expected -3..=2)");
        assert_eq!(shape.dim(-4), Err(LayoutError::DimOutOfRange { op: "dim", dim: -4, rank: 3 }));
        let err = Shape::scalar().dim(0).unwrap_err();
        assert_eq!(err, LayoutError::DimOutOfRange { op: "dim", dim: 0, rank: 0 });
        assert_eq!(err.to_string(), "dim: dim 0 is out of range for a tensor of rank 0 (it has no dims)");
    }

    #[test]
    fn infer_reshape_fills_in_minus_one() {
        let shape = Shape::from([2, 3, 4]);
        assert_eq!(shape.infer_reshape(&[-1, 4]).unwrap(), Shape::from([6, 4]));
        assert_eq!(shape.infer_reshape(&[24]).unwrap(), Shape::from([24]));
        let err = shape.infer_reshape(&[5, -1]).unwrap_err();
        assert!(matches!(&err, LayoutError::InvalidReshape { spec, from, .. } if spec == &[5, -1] && *from == shape));
        assert_eq!(
            err.to_string(),
            "reshape: cannot reshape [2, 3, 4] to [5, -1]: no size for -1 makes the element counts match"
        );
        for spec in [[-1, -1], [-2, 12]] {
            let err = shape.infer_reshape(&spec).unwrap_err();
            assert!(matches!(&err, LayoutError::InvalidReshape { spec: s, .. } if s == &spec), "{err:?}");
        }
        let err = shape.infer_reshape(&[5, 5]).unwrap_err();
        assert_eq!(err, LayoutError::ReshapeElementCount { from: shape.clone(), to: Shape::from([5, 5]) });
        assert_eq!(err.to_string(), "reshape: cannot reshape [2, 3, 4] (24 elements) to [5, 5] (25 elements)");
        assert_eq!(Shape::from([0, 3]).infer_reshape(&[3, 0]).unwrap(), Shape::from([3, 0]));
    }

    #[test]
    fn broadcasting_examples() {
        let b = |x: &[usize], y: &[usize]| broadcast_shapes(&Shape::from(x), &Shape::from(y));
        assert_eq!(b(&[2, 1, 4], &[3, 1]).unwrap(), Shape::from([2, 3, 4]));
        assert_eq!(b(&[], &[3]).unwrap(), Shape::from([3]));
        assert_eq!(b(&[0], &[1]).unwrap(), Shape::from([0]));
        let err = b(&[2, 3], &[4, 2]).unwrap_err();
        assert_eq!(
            err,
            LayoutError::IncompatibleShapes {
                a: Shape::from([2, 3]),
                b: Shape::from([4, 2]),
                dim: -1,
                size_a: 3,
                size_b: 2
            }
        );
        assert_eq!(
            err.to_string(),
            "cannot broadcast shapes [2, 3] and [4, 2] together: at dim -1 the sizes are 3 and 2 (they must match or one must be 1)"
        );
    }

    fn small_shape() -> impl Strategy<Value = Vec<usize>> {
        proptest::collection::vec(0usize..4, 0..5)
    }

    /// Broadcasting written the slow, obvious way.
    fn broadcast_reference(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
        let rank = a.len().max(b.len());
        let pad = |s: &[usize]| {
            let mut padded = vec![1; rank - s.len()];
            padded.extend_from_slice(s);
            padded
        };
        let (a, b) = (pad(a), pad(b));
        (0..rank)
            .map(|i| {
                if a[i] == b[i] || b[i] == 1 {
                    Some(a[i])
                } else if a[i] == 1 {
                    Some(b[i])
                } else {
                    None
                }
            })
            .collect()
    }

    proptest! {
        #[test]
        fn broadcasting_is_commutative_and_matches_reference(a in small_shape(), b in small_shape()) {
            let (sa, sb) = (Shape::from(a.clone()), Shape::from(b.clone()));
            let ab = broadcast_shapes(&sa, &sb).ok();
            let ba = broadcast_shapes(&sb, &sa).ok();
            prop_assert_eq!(&ab, &ba);
            prop_assert_eq!(ab.map(|s| s.dims().to_vec()), broadcast_reference(&a, &b));
        }

        #[test]
        fn broadcasting_with_self_and_scalar_is_identity(a in small_shape()) {
            let shape = Shape::from(a);
            prop_assert_eq!(broadcast_shapes(&shape, &shape).unwrap(), shape.clone());
            prop_assert_eq!(broadcast_shapes(&shape, &Shape::scalar()).unwrap(), shape);
        }
    }
}
