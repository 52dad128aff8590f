//! Strided matrix views: a slice, an offset, a shape and strides.
//!
//! A view is checked once, when it is made: every element it names lies inside
//! its slice, and an output view names each element at most once. The kernels
//! then read and write through it without further checks. Strides are in
//! elements and non-negative; a stride of 0 in an input repeats (broadcasts)
//! one row or column.

use crate::error::{KernelError, Result};

/// One past the largest index a view touches, or 0 when it touches nothing.
fn span(operand: &'static str, offset: usize, dims: &[usize], strides: &[usize]) -> Result<usize> {
    if dims.contains(&0) {
        return Ok(0);
    }
    let mut last = offset;
    for (&d, &s) in dims.iter().zip(strides) {
        let step = (d - 1).checked_mul(s).ok_or(KernelError::Overflow { operand })?;
        last = last.checked_add(step).ok_or(KernelError::Overflow { operand })?;
    }
    last.checked_add(1).ok_or(KernelError::Overflow { operand })
}

fn check_bounds(operand: &'static str, len: usize, offset: usize, dims: &[usize], strides: &[usize]) -> Result<()> {
    let required = span(operand, offset, dims, strides)?;
    if required > len {
        return Err(KernelError::OutOfBounds { operand, required, len });
    }
    Ok(())
}

/// An output must not name one element twice: sorted by stride, each
/// dimension must step over the whole extent of the ones before it.
fn check_distinct(operand: &'static str, dims: &[usize], strides: &[usize]) -> Result<()> {
    if dims.contains(&0) {
        return Ok(());
    }
    let mut axes: Vec<(usize, usize)> =
        dims.iter().zip(strides).filter(|(&d, _)| d > 1).map(|(&d, &s)| (s, d)).collect();
    axes.sort_unstable();
    let mut extent = 1usize; // elements spanned by the smaller-stride axes
    for &(stride, dim) in &axes {
        if stride < extent {
            return Err(KernelError::OverlappingOutput {
                operand,
                detail: format!("dims {dims:?} with strides {strides:?}"),
            });
        }
        extent =
            stride.checked_mul(dim - 1).and_then(|x| x.checked_add(extent)).ok_or(KernelError::Overflow { operand })?;
    }
    Ok(())
}

/// Where a view's elements are: `(i, j)` is at
/// `offset + i * row_stride + j * col_stride`. Shared by the read-only and the
/// writable views.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    offset: usize,
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl Layout {
    fn new(offset: usize, [rows, cols]: [usize; 2], [row_stride, col_stride]: [usize; 2]) -> Layout {
        Layout { offset, rows, cols, row_stride, col_stride }
    }

    fn is_empty(&self) -> bool {
        self.rows == 0 || self.cols == 0
    }

    fn t(self) -> Layout {
        Layout { rows: self.cols, cols: self.rows, row_stride: self.col_stride, col_stride: self.row_stride, ..self }
    }

    /// Index of element `(i, j)` in the slice, or `None` outside the view.
    fn index(&self, i: usize, j: usize) -> Option<usize> {
        (i < self.rows && j < self.cols).then(|| self.offset + i * self.row_stride + j * self.col_stride)
    }

    /// Rows `i0..i0 + rows`, columns `j0..j0 + cols` (inside the view).
    fn sub(self, i0: usize, j0: usize, rows: usize, cols: usize) -> Layout {
        debug_assert!(i0 + rows <= self.rows && j0 + cols <= self.cols);
        let offset = if rows == 0 || cols == 0 {
            self.offset
        } else {
            self.offset + i0 * self.row_stride + j0 * self.col_stride
        };
        Layout { offset, rows, cols, ..self }
    }

    /// Moved `elements` further on (the next matrix of a batch).
    fn shifted(self, elements: usize) -> Layout {
        Layout { offset: self.offset + elements, ..self }
    }
}

/// The accessors of a view's [`Layout`], for both kinds of view.
macro_rules! layout_accessors {
    () => {
        /// Number of rows.
        pub fn rows(&self) -> usize {
            self.at.rows
        }
        /// Number of columns.
        pub fn cols(&self) -> usize {
            self.at.cols
        }
        /// Elements between consecutive rows.
        pub fn row_stride(&self) -> usize {
            self.at.row_stride
        }
        /// Elements between consecutive columns.
        pub fn col_stride(&self) -> usize {
            self.at.col_stride
        }
        /// Index of element `(0, 0)` in the slice.
        pub fn offset(&self) -> usize {
            self.at.offset
        }
    };
}

/// A read-only matrix view.
///
/// Element `(i, j)` is `data[offset + i * row_stride + j * col_stride]`.
#[derive(Debug)]
pub struct MatRef<'a, T> {
    data: &'a [T],
    at: Layout,
}

impl<T> Clone for MatRef<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for MatRef<'_, T> {}

impl<'a, T> MatRef<'a, T> {
    /// A view of `dims = [rows, cols]` elements starting at `offset`,
    /// stepping `strides = [row_stride, col_stride]` elements per row and per
    /// column.
    ///
    /// Fails when the view reaches past the end of `data`.
    pub fn new(data: &'a [T], offset: usize, dims: [usize; 2], strides: [usize; 2]) -> Result<Self> {
        check_bounds("matrix", data.len(), offset, &dims, &strides)?;
        Ok(MatRef { data, at: Layout::new(offset, dims, strides) })
    }

    /// A dense row-major view of the first `rows * cols` elements.
    pub fn row_major(data: &'a [T], rows: usize, cols: usize) -> Result<Self> {
        Self::new(data, 0, [rows, cols], [cols, 1])
    }

    /// A dense column-major view of the first `rows * cols` elements.
    pub fn col_major(data: &'a [T], rows: usize, cols: usize) -> Result<Self> {
        Self::new(data, 0, [rows, cols], [1, rows])
    }

    /// The transposed view (no copy).
    pub fn t(self) -> Self {
        MatRef { at: self.at.t(), ..self }
    }

    layout_accessors!();

    /// The whole underlying slice.
    pub fn data(&self) -> &'a [T] {
        self.data
    }

    /// The sub-view of rows `i0..i0 + rows`, columns `j0..j0 + cols`.
    /// The caller keeps it inside this view (checked in debug builds).
    pub(crate) fn sub(self, i0: usize, j0: usize, rows: usize, cols: usize) -> Self {
        MatRef { at: self.at.sub(i0, j0, rows, cols), ..self }
    }

    /// Element `(i, j)`, or `None` outside the view.
    pub fn get(&self, i: usize, j: usize) -> Option<&'a T> {
        self.data.get(self.at.index(i, j)?)
    }
}

/// A writable matrix view whose elements are all distinct.
///
/// Element `(i, j)` is `data[offset + i * row_stride + j * col_stride]`.
#[derive(Debug)]
pub struct MatMut<'a, T> {
    data: &'a mut [T],
    at: Layout,
}

impl<'a, T> MatMut<'a, T> {
    /// A writable view; see [`MatRef::new`]. Also fails when two indices
    /// `(i, j)` name the same element (for example a stride of 0).
    pub fn new(data: &'a mut [T], offset: usize, dims: [usize; 2], strides: [usize; 2]) -> Result<Self> {
        check_bounds("matrix", data.len(), offset, &dims, &strides)?;
        check_distinct("matrix", &dims, &strides)?;
        Ok(MatMut { data, at: Layout::new(offset, dims, strides) })
    }

    /// A dense row-major view of the first `rows * cols` elements.
    pub fn row_major(data: &'a mut [T], rows: usize, cols: usize) -> Result<Self> {
        Self::new(data, 0, [rows, cols], [cols, 1])
    }

    /// A dense column-major view of the first `rows * cols` elements.
    pub fn col_major(data: &'a mut [T], rows: usize, cols: usize) -> Result<Self> {
        Self::new(data, 0, [rows, cols], [1, rows])
    }

    /// The transposed view (no copy).
    pub fn t(self) -> Self {
        MatMut { at: self.at.t(), ..self }
    }

    /// A shorter-lived writable view of the same elements.
    pub fn rb_mut(&mut self) -> MatMut<'_, T> {
        MatMut { data: self.data, at: self.at }
    }

    /// A read-only view of the same elements.
    pub fn as_ref(&self) -> MatRef<'_, T> {
        MatRef { data: self.data, at: self.at }
    }

    layout_accessors!();

    /// Element `(i, j)`, or `None` outside the view.
    pub fn get_mut(&mut self, i: usize, j: usize) -> Option<&mut T> {
        self.data.get_mut(self.at.index(i, j)?)
    }

    /// The raw parts, for the kernels: base pointer of element `(0, 0)`.
    /// Only meaningful when the view is non-empty.
    pub(crate) fn raw(&mut self) -> RawMut<T> {
        let Layout { offset, rows, cols, row_stride, col_stride } = self.at;
        let ptr = if self.at.is_empty() {
            self.data.as_mut_ptr()
        } else {
            // In bounds: checked by `check_bounds` when the view was made.
            self.data[offset..].as_mut_ptr()
        };
        RawMut { ptr, rows, cols, row_stride, col_stride }
    }
}

/// A checked output view as a pointer, so that threads can write disjoint
/// tiles of it. Made only from a [`MatMut`], whose checks make every
/// `(i, j)` with `i < rows`, `j < cols` a distinct in-bounds element.
#[derive(Debug)]
pub(crate) struct RawMut<T> {
    pub ptr: *mut T,
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

impl<T> Clone for RawMut<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for RawMut<T> {}

// SAFETY: a `RawMut` is only handed to threads that write disjoint element
// sets of it (the gemm driver splits C into disjoint rectangles), and the
// `MatMut` it came from is mutably borrowed for the duration of the call.
unsafe impl<T: Send> Send for RawMut<T> {}
// SAFETY: as above; shared references to a `RawMut` never write the same
// element from two threads.
unsafe impl<T: Send> Sync for RawMut<T> {}

impl<T> RawMut<T> {
    pub fn t(self) -> Self {
        RawMut {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ptr: self.ptr,
        }
    }

    /// The same shape `elements` further on (the next matrix of a batch).
    ///
    /// # Safety
    /// The moved view must lie inside the checked view it came from.
    pub unsafe fn offset(self, elements: usize) -> Self {
        // SAFETY: in bounds by the caller's contract.
        let ptr = unsafe { self.ptr.add(elements) };
        RawMut { ptr, ..self }
    }

    /// The sub-view of rows `i0..i0 + rows` and columns `j0..j0 + cols`.
    ///
    /// # Safety
    /// The sub-rectangle must lie inside this view.
    pub unsafe fn sub(self, i0: usize, j0: usize, rows: usize, cols: usize) -> Self {
        debug_assert!(i0 + rows <= self.rows && j0 + cols <= self.cols);
        let ptr = if rows == 0 || cols == 0 {
            self.ptr
        } else {
            // SAFETY: (i0, j0) is inside the view (caller's contract), so the
            // offset stays in the allocation.
            unsafe { self.ptr.add(i0 * self.row_stride + j0 * self.col_stride) }
        };
        RawMut { ptr, rows, cols, ..self }
    }
}

/// A read-only batch of matrices: `batch` matrices `batch_stride` elements
/// apart. A batch stride of 0 repeats one matrix for every batch index.
#[derive(Debug)]
pub struct BatchRef<'a, T> {
    mat: MatRef<'a, T>,
    batch: usize,
    batch_stride: usize,
}

impl<T> Clone for BatchRef<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for BatchRef<'_, T> {}

impl<'a, T> BatchRef<'a, T> {
    /// `dims = [batch, rows, cols]` elements with
    /// `strides = [batch_stride, row_stride, col_stride]`, starting at
    /// `offset`.
    pub fn new(data: &'a [T], offset: usize, dims: [usize; 3], strides: [usize; 3]) -> Result<Self> {
        check_bounds("batch", data.len(), offset, &dims, &strides)?;
        let at = Layout::new(offset, [dims[1], dims[2]], [strides[1], strides[2]]);
        Ok(BatchRef { mat: MatRef { data, at }, batch: dims[0], batch_stride: strides[0] })
    }

    /// One matrix repeated `batch` times (batch stride 0).
    pub fn broadcast(mat: MatRef<'a, T>, batch: usize) -> Self {
        BatchRef { mat, batch, batch_stride: 0 }
    }

    /// Number of matrices.
    pub fn batch(&self) -> usize {
        self.batch
    }
    /// Elements between consecutive matrices.
    pub fn batch_stride(&self) -> usize {
        self.batch_stride
    }
    /// Rows of each matrix.
    pub fn rows(&self) -> usize {
        self.mat.rows()
    }
    /// Columns of each matrix.
    pub fn cols(&self) -> usize {
        self.mat.cols()
    }

    /// The transposed batch: every matrix transposed (no copy).
    pub fn t(self) -> Self {
        BatchRef { mat: self.mat.t(), ..self }
    }

    /// Matrix `index`, where a batch of one is broadcast to any index.
    pub(crate) fn item(&self, index: usize) -> MatRef<'a, T> {
        let index = if self.batch == 1 { 0 } else { index };
        debug_assert!(index < self.batch);
        MatRef { at: self.mat.at.shifted(index * self.batch_stride), ..self.mat }
    }

    /// Matrix `index`, or `None` past the end.
    pub fn get(&self, index: usize) -> Option<MatRef<'a, T>> {
        (index < self.batch).then(|| MatRef { at: self.mat.at.shifted(index * self.batch_stride), ..self.mat })
    }
}

impl<'a, T> From<MatRef<'a, T>> for BatchRef<'a, T> {
    /// A batch of one matrix.
    fn from(mat: MatRef<'a, T>) -> Self {
        BatchRef::broadcast(mat, 1)
    }
}

/// A writable batch of matrices; all elements of all matrices are distinct.
#[derive(Debug)]
pub struct BatchMut<'a, T> {
    mat: MatMut<'a, T>,
    batch: usize,
    batch_stride: usize,
}

impl<'a, T> BatchMut<'a, T> {
    /// See [`BatchRef::new`]; also fails when two indices name one element.
    pub fn new(data: &'a mut [T], offset: usize, dims: [usize; 3], strides: [usize; 3]) -> Result<Self> {
        check_bounds("batch", data.len(), offset, &dims, &strides)?;
        check_distinct("batch", &dims, &strides)?;
        let at = Layout::new(offset, [dims[1], dims[2]], [strides[1], strides[2]]);
        Ok(BatchMut { mat: MatMut { data, at }, batch: dims[0], batch_stride: strides[0] })
    }

    /// Number of matrices.
    pub fn batch(&self) -> usize {
        self.batch
    }
    /// Rows of each matrix.
    pub fn rows(&self) -> usize {
        self.mat.rows()
    }
    /// Columns of each matrix.
    pub fn cols(&self) -> usize {
        self.mat.cols()
    }

    /// The raw output plus the batch stride, for the batched driver.
    pub(crate) fn raw(&mut self) -> (RawMut<T>, usize) {
        (self.mat.raw(), self.batch_stride)
    }
}

impl<'a, T> From<MatMut<'a, T>> for BatchMut<'a, T> {
    /// A batch of one matrix.
    fn from(mat: MatMut<'a, T>) -> Self {
        BatchMut { mat, batch: 1, batch_stride: 0 }
    }
}

/// Rows, depth, strides and panel width of one packing, as the SIMD
/// packers take it: element `(i, p)` of the source is at `i * rs + p * cs`
/// from its origin.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PackShape {
    pub rows: usize,
    pub depth: usize,
    pub rs: usize,
    pub cs: usize,
    pub width: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_checked() {
        let v = [0.0f32; 12];
        assert!(MatRef::row_major(&v, 3, 4).is_ok());
        assert!(MatRef::row_major(&v, 4, 4).is_err());
        assert!(MatRef::new(&v, 1, [3, 4], [4, 1]).is_err());
        assert!(MatRef::new(&v, 11, [1, 1], [0, 0]).is_ok());
        assert!(MatRef::new(&v, 12, [1, 1], [0, 0]).is_err());
        // Empty views touch nothing, whatever the offset.
        assert!(MatRef::new(&v, 100, [0, 5], [5, 1]).is_ok());
        let err = MatRef::row_major(&v, 4, 4).unwrap_err();
        assert_eq!(err, KernelError::OutOfBounds { operand: "matrix", required: 16, len: 12 });
    }

    #[test]
    fn overflow_is_an_error() {
        let v = [0.0f32; 4];
        let e = MatRef::new(&v, 0, [usize::MAX, 2], [usize::MAX, 1]).unwrap_err();
        assert_eq!(e, KernelError::Overflow { operand: "matrix" });
    }

    #[test]
    fn overlapping_outputs_are_rejected() {
        let mut v = [0.0f32; 16];
        assert!(MatMut::new(&mut v, 0, [4, 4], [4, 1]).is_ok());
        assert!(MatMut::new(&mut v, 0, [4, 4], [1, 4]).is_ok());
        assert!(MatMut::new(&mut v, 0, [2, 2], [8, 2]).is_ok());
        assert!(matches!(MatMut::new(&mut v, 0, [4, 4], [0, 1]), Err(KernelError::OverlappingOutput { .. })));
        assert!(matches!(MatMut::new(&mut v, 0, [4, 4], [2, 1]), Err(KernelError::OverlappingOutput { .. })));
        // A stride of 0 on a dimension of size 1 names one element: fine.
        assert!(MatMut::new(&mut v, 0, [1, 4], [0, 1]).is_ok());
        let mut w = [0.0f32; 64];
        assert!(BatchMut::new(&mut w, 0, [2, 4, 4], [16, 4, 1]).is_ok());
        assert!(BatchMut::new(&mut w, 0, [2, 4, 4], [8, 4, 1]).is_err());
        assert!(BatchMut::new(&mut w, 0, [2, 4, 4], [0, 4, 1]).is_err());
    }

    #[test]
    fn transpose_and_get() {
        let v: Vec<f32> = (0..6).map(|x| x as f32).collect();
        let a = MatRef::row_major(&v, 2, 3).unwrap();
        assert_eq!(a.get(1, 2), Some(&5.0));
        let t = a.t();
        assert_eq!((t.rows(), t.cols()), (3, 2));
        assert_eq!(t.get(2, 1), Some(&5.0));
        assert_eq!(t.get(3, 0), None);
        let b = BatchRef::new(&v, 0, [2, 1, 3], [3, 3, 1]).unwrap();
        assert_eq!(b.get(1).unwrap().get(0, 0), Some(&3.0));
        assert!(b.get(2).is_none());
    }
}
