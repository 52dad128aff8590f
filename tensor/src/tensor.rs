//! [`Tensor`]: storage from a device's caching allocator plus a layout (shape,
//! strides, offset). Views share the storage; the memory goes back to the
//! cache when the last tensor using it is dropped.

use crate::backend::{ops_for, runtime_for};
use crate::device::Device;
use crate::dispatch::dispatch_dtype;
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::shape::{DimIndex, Shape};
use crate::storage::{Storage, UninitTensor};
use std::sync::Arc;

/// An n-dimensional array on a device.
#[derive(Clone)]
pub struct Tensor {
    storage: Arc<Storage>,
    layout: Layout,
}

impl Tensor {
    /// A contiguous tensor of `shape` over fresh storage, to be written
    /// before it becomes a tensor ([`UninitTensor::new`], where sizes are
    /// checked).
    pub(crate) fn uninit(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<UninitTensor> {
        UninitTensor::new(shape, dtype, device)
    }

    /// [`Tensor::uninit`] with the shape of `like` (any tensor or view):
    /// that shape was checked when `like` was made, so only the storage is.
    /// The output of most ops is made this way.
    #[inline]
    pub(crate) fn uninit_like(like: &Tensor, dtype: DType, device: Device) -> Result<UninitTensor> {
        UninitTensor::like(like, dtype, device)
    }

    /// A tensor over `storage`, every element written, seen through `layout`
    /// (checked when it was built); the storage must hold what the layout
    /// addresses.
    pub(crate) fn from_storage(storage: Arc<Storage>, layout: Layout) -> Tensor {
        debug_assert!(layout.required_storage_len() <= storage.len());
        Tensor { storage, layout }
    }

    /// The same storage seen through another layout.
    pub(crate) fn with_layout(&self, layout: Layout) -> Tensor {
        Tensor { storage: Arc::clone(&self.storage), layout }
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        self.layout.shape()
    }

    /// The sizes of the dimensions.
    pub fn dims(&self) -> &[usize] {
        self.layout.dims()
    }

    /// The size of one dimension (negative indices count from the end).
    pub fn dim(&self, dim: impl DimIndex) -> Result<usize> {
        Ok(self.layout.shape().dim(dim)?)
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.layout.rank()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.storage.dtype()
    }

    /// The device holding the data.
    pub fn device(&self) -> Device {
        self.storage.device()
    }

    /// Shape, strides and offset into the storage.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Strides in elements.
    pub fn strides(&self) -> &[isize] {
        self.layout.strides()
    }

    /// Whether the elements are laid out densely in row-major order.
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// The storage (shared with every view of it).
    pub fn storage(&self) -> &Arc<Storage> {
        &self.storage
    }

    /// Whether the two tensors share storage (one is a view of the other's memory).
    pub fn shares_storage_with(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// How many times the storage was modified in place.
    pub fn version(&self) -> u64 {
        self.storage.version()
    }

    /// Errors unless in-place writes through this view are sound: several of
    /// its elements must not share one memory location
    /// ([`Layout::has_internal_overlap`], e.g. an expanded view), or one
    /// write would land on another. Every in-place writer that stores
    /// per-element values calls this (PyTorch's `assert_no_internal_overlap`).
    pub(crate) fn check_writable(&self, op: &'static str) -> Result<()> {
        if self.layout.has_internal_overlap() {
            return Err(TensorError::invalid(
                op,
                format!(
                    "unsupported operation: more than one element of the written-to tensor refers to a single \
                     memory location (shape {:?}, strides {:?}, e.g. an expanded view); write into a contiguous \
                     copy (.contiguous()) instead",
                    self.dims(),
                    self.strides()
                ),
            ));
        }
        Ok(())
    }

    // ----- views -----------------------------------------------------------

    /// Swaps two dimensions (a view).
    pub fn transpose(&self, dim0: impl DimIndex, dim1: impl DimIndex) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.transpose(dim0, dim1)?))
    }

    /// The transpose of a matrix (a view). As in PyTorch, a 0-d or 1-d
    /// tensor is its own transpose; more than 2 dims is an error.
    pub fn t(&self) -> Result<Tensor> {
        match self.rank() {
            0 | 1 => Ok(self.clone()),
            2 => self.transpose(0, 1),
            _ => Err(TensorError::shape(
                "t",
                format!("expected a tensor with at most 2 dims, got shape {:?}; use transpose", self.dims()),
            )),
        }
    }

    /// Reorders the dimensions (a view).
    pub fn permute(&self, order: &[usize]) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.permute(order)?))
    }

    /// `len` elements of `dim` from `start` (a view).
    pub fn narrow(&self, dim: impl DimIndex, start: usize, len: usize) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.narrow(dim, start, len)?))
    }

    /// Every `step`-th element of `dim` from `start` up to (not including)
    /// `end`: Python's `x[start:end:step]` as a view (PyTorch's slicing;
    /// `step` must be positive, bounds past the size are clamped).
    ///
    /// ```
    /// use brasa_tensor::{DType, Tensor};
    /// let x = Tensor::arange(0.0, 10.0, 1.0, DType::F32)?;
    /// let odd = x.slice(0, 1, 10, 2)?;             // x[1:10:2]
    /// assert_eq!(odd.to_vec::<f32>()?, [1.0, 3.0, 5.0, 7.0, 9.0]);
    /// assert!(odd.shares_storage_with(&x));
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn slice(&self, dim: impl DimIndex, start: usize, end: usize, step: usize) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.slice(dim, start, end, step)?))
    }

    /// Index `index` of `dim`, removing that dimension (a view).
    pub fn select(&self, dim: impl DimIndex, index: usize) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.select(dim, index)?))
    }

    /// Removes a dimension of size 1 (a view).
    pub fn squeeze(&self, dim: impl DimIndex) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.squeeze(dim)?))
    }

    /// Inserts a dimension of size 1 (a view).
    pub fn unsqueeze(&self, dim: impl DimIndex) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.unsqueeze(dim)?))
    }

    /// Broadcasts to `shape` with NumPy rules (a view with stride-0 dimensions).
    pub fn broadcast_as(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        Ok(self.with_layout(self.layout.broadcast_as(shape)?))
    }

    /// Alias of [`Tensor::broadcast_as`], PyTorch's name.
    pub fn expand(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        self.broadcast_as(shape)
    }

    /// The same elements in another shape; one dimension may be `-1`. A view
    /// when the strides allow, otherwise a contiguous copy (PyTorch's rule).
    pub fn reshape(&self, shape: &[isize]) -> Result<Tensor> {
        let target = self.shape().infer_reshape(shape)?;
        match self.layout.reshape(target.clone())? {
            Some(layout) => Ok(self.with_layout(layout)),
            None => Ok(self.contiguous()?.with_layout(Layout::contiguous(target)?)),
        }
    }

    /// A view of this tensor's storage with `dims`, `strides` (in elements)
    /// and `offset` (elements from the storage's start), as PyTorch's
    /// `as_strided`: no copy, writes go through. An error naming the sizes
    /// when the view would address elements beyond the storage.
    ///
    /// ```
    /// use brasa_tensor::Tensor;
    ///
    /// let flat = Tensor::from_vec(vec![0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], [6])?;
    /// let view = flat.as_strided(&[2, 2], &[1, 2], 1)?; // columns of [[1, 3], [2, 4]]
    /// assert_eq!(view.to_vec::<f32>()?, [1.0, 3.0, 2.0, 4.0]);
    /// assert!(flat.as_strided(&[4], &[2], 0).is_err()); // element 6 is past the end
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn as_strided(&self, dims: &[usize], strides: &[isize], offset: usize) -> Result<Tensor> {
        if dims.len() != strides.len() {
            return Err(TensorError::shape(
                "as_strided",
                format!("{} sizes but {} strides ({dims:?}, {strides:?})", dims.len(), strides.len()),
            ));
        }
        let layout = Layout::new(dims.to_vec(), strides.to_vec(), offset)?;
        let needed = layout.required_storage_len();
        if needed > self.storage.len() {
            return Err(TensorError::shape(
                "as_strided",
                format!(
                    "sizes {dims:?}, strides {strides:?} and offset {offset} address {needed} elements but the \
                     storage holds {}",
                    self.storage.len()
                ),
            ));
        }
        Ok(self.with_layout(layout))
    }

    /// Like [`Tensor::reshape`], but an error when a view is impossible.
    pub fn view(&self, shape: &[isize]) -> Result<Tensor> {
        let target = self.shape().infer_reshape(shape)?;
        match self.layout.reshape(target)? {
            Some(layout) => Ok(self.with_layout(layout)),
            None => Err(TensorError::shape(
                "view",
                format!(
                    "a tensor of shape {:?} and strides {:?} cannot be viewed as {shape:?}; use reshape (which copies)",
                    self.dims(),
                    self.strides()
                ),
            )),
        }
    }

    /// Flattens dimensions `start..=end` into one. A 0-d tensor (dims 0 or
    /// -1) becomes shape `[1]`, as in PyTorch.
    pub fn flatten(&self, start: impl DimIndex, end: impl DimIndex) -> Result<Tensor> {
        let rank = self.rank().max(1);
        let start = crate::shape::resolve_dim(start, rank, "flatten")?;
        let end = crate::shape::resolve_dim(end, rank, "flatten")?;
        if start > end {
            return Err(TensorError::invalid("flatten", format!("start dim {start} is after end dim {end}")));
        }
        if self.rank() == 0 {
            return self.reshape(&[1]);
        }
        // Sizes of a tensor's shape fit an isize, and so does their product.
        let dims: Vec<isize> = self.dims().iter().map(|&d| d as isize).collect();
        let mut shape = dims[..start].to_vec();
        shape.push(dims[start..=end].iter().product());
        shape.extend_from_slice(&dims[end + 1..]);
        self.reshape(&shape)
    }

    /// This tensor if it is contiguous, else a contiguous copy.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        self.copy_to(self.device(), self.dtype())
    }

    // ----- data out ----------------------------------------------------------

    /// The elements in row-major order; `T` must be the tensor's dtype.
    pub fn to_vec<T: WithDType>(&self) -> Result<Vec<T>> {
        self.values("to_vec")
    }

    /// The elements in row-major order, read for `op` (named in errors):
    /// in place where the process can read them, else from a host copy.
    fn values<T: WithDType>(&self, op: &'static str) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return Err(TensorError::DTypeMismatch { op, expected: self.dtype(), got: T::DTYPE });
        }
        let runtime = runtime_for(self.device())?;
        if !runtime.values_on_host() {
            let host = {
                let _range = brasa_profile::record_op("copy", &[self.dims()]);
                runtime.copy_to_host(op, self, self.dtype())?
            };
            return host.values(op);
        }
        // An expanded view can have far more elements than memory holds:
        // that is an error, not an abort.
        let mut out = Vec::new();
        out.try_reserve_exact(self.numel()).map_err(|_| {
            TensorError::invalid(
                op,
                format!(
                    "cannot allocate {} elements of {} on the host (shape {:?})",
                    self.numel(),
                    T::DTYPE,
                    self.dims()
                ),
            )
        })?;
        let data = self.storage.read::<T>(op)?;
        for run in self.layout.contiguous_runs() {
            out.extend_from_slice(&data[run]);
        }
        Ok(out)
    }

    /// The only element of a one-element tensor, converted to `T`.
    pub fn item<T: WithDType>(&self) -> Result<T> {
        const OP: &str = "item";
        if self.numel() != 1 {
            return Err(TensorError::shape(
                OP,
                format!("expected a tensor with one element, got shape {:?} ({} elements)", self.dims(), self.numel()),
            ));
        }
        let value = dispatch_dtype!(self.dtype(), E => self.values::<E>(OP)?[0].cast::<T>());
        Ok(value)
    }

    // ----- copies ------------------------------------------------------------

    /// A copy with another dtype (this tensor when the dtype is the same):
    /// row-major, or channels-last when this tensor is (PyTorch's `.to(dtype)`
    /// keeps the memory format).
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        crate::ops::memory_format::keeping_channels_last(&[self], |v| v[0].copy_to(v[0].device(), dtype))
    }

    /// A copy on another device (this tensor when it is already there).
    pub fn to(&self, device: Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        self.copy_to(device, self.dtype())
    }

    /// A contiguous copy on `device` with `dtype`: on one device the device's
    /// own strided cast, between two the destination's runtime.
    pub(crate) fn copy_to(&self, device: Device, dtype: DType) -> Result<Tensor> {
        let _range = brasa_profile::record_op("copy", &[self.dims()]);
        if device == self.device() {
            return ops_for(device)?.cast(self, dtype);
        }
        runtime_for(device)?.copy_in(self, device, dtype)
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor[dims {:?}, {}, {}]", self.dims(), self.dtype(), self.device())
    }
}
