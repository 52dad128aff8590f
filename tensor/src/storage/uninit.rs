//! Fresh memory: an [`UninitTensor`] owns a new storage alone and hands out
//! `&mut [MaybeUninit<T>]` until every element is written, so no `&[T]` is
//! ever formed over memory nobody wrote, and nothing is filled twice.

use super::Storage;
#[cfg(feature = "cuda")]
use crate::backend::Buffer;
use crate::device::Device;
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::shape::Shape;
use crate::tensor::Tensor;
use rayon::prelude::*;
use std::mem::MaybeUninit;
use std::sync::Arc;

/// Elements per parallel chunk of [`UninitTensor::fill`].
pub(super) const FILL_CHUNK: usize = 1 << 16;

/// A fresh contiguous tensor whose elements are not written yet. It is their
/// only owner: it hands out `&mut [MaybeUninit<T>]`, never `&[T]`, and becomes
/// a [`Tensor`] once every element is written.
pub(crate) struct UninitTensor {
    /// Behind an `Arc` from the start (its only reference until
    /// [`UninitTensor::assume_init`]), so that becoming a tensor moves a
    /// pointer rather than the storage: element-wise ops on small tensors
    /// are dominated by such costs.
    storage: Arc<Storage>,
    layout: Layout,
}

impl UninitTensor {
    /// A contiguous tensor of `shape` over fresh storage. This is the door new
    /// tensors come through, and where their sizes are checked, once: the
    /// shape by [`Layout::contiguous`] (element count and strides fit an
    /// `isize`), the byte count by the storage, the rounded block by the
    /// allocator. Code that works on the tensor afterwards trusts them.
    pub(crate) fn new(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<UninitTensor> {
        let layout = Layout::contiguous(shape)?;
        let storage = Storage::uninit(device, dtype, layout.numel())?;
        Ok(UninitTensor { storage: Arc::new(storage), layout })
    }

    /// [`UninitTensor::new`] with the shape of `like` (any tensor or view):
    /// that shape was checked when `like` was made, so only the storage is.
    #[inline]
    pub(crate) fn like(like: &Tensor, dtype: DType, device: Device) -> Result<UninitTensor> {
        let storage = Storage::uninit(device, dtype, like.numel())?;
        Ok(UninitTensor { storage: Arc::new(storage), layout: like.layout().dense_like() })
    }

    /// [`UninitTensor::new`] in page-locked host memory.
    pub(crate) fn pinned(shape: impl Into<Shape>, dtype: DType) -> Result<UninitTensor> {
        let layout = Layout::contiguous(shape)?;
        let storage = Storage::uninit_pinned(dtype, layout.numel())?;
        Ok(UninitTensor { storage: Arc::new(storage), layout })
    }

    /// The tensor's dims.
    pub(crate) fn dims(&self) -> &[usize] {
        self.layout.dims()
    }

    /// Its element count.
    pub(crate) fn numel(&self) -> usize {
        self.layout.numel()
    }

    /// Its element type.
    pub(crate) fn dtype(&self) -> DType {
        self.storage.dtype()
    }

    #[cfg(feature = "cuda")]
    pub(crate) fn buffer(&self) -> &Buffer {
        &self.storage.buffer
    }

    /// The storage, exclusively: it is never shared before `assume_init`.
    fn storage_mut(&mut self, op: &'static str) -> Result<&mut Storage> {
        Arc::get_mut(&mut self.storage)
            .ok_or_else(|| TensorError::internal(op, "fresh storage shared before it was written"))
    }

    /// The elements to write, as `T` (the dtype, else an error naming `op`).
    pub(crate) fn as_uninit_mut<T: WithDType>(&mut self, op: &'static str) -> Result<&mut [MaybeUninit<T>]> {
        let count = self.storage.element_count::<T>(op)?;
        self.storage_mut(op)?.uninit_mut(op, count)
    }

    /// The bytes to write (host only).
    #[cfg(feature = "cuda")]
    pub(crate) fn as_uninit_bytes_mut(&mut self, op: &'static str) -> Result<&mut [MaybeUninit<u8>]> {
        let count = self.storage.size_in_bytes();
        self.storage_mut(op)?.uninit_mut(op, count)
    }

    /// The tensor, its elements written.
    ///
    /// # Safety
    /// Every element was written (through [`UninitTensor::as_uninit_mut`],
    /// or on a device, by a copy into its buffer) with a valid value of the
    /// dtype.
    pub(crate) unsafe fn assume_init(self) -> Tensor {
        Tensor::from_storage(self.storage, self.layout)
    }

    /// The tensor on a meta device, whose storage holds no values to write:
    /// the meta backend's outputs. An error for memory that exists.
    pub(crate) fn planned(self, op: &'static str) -> Result<Tensor> {
        if self.storage.buffer.has_memory() {
            return Err(TensorError::internal(op, "only a meta tensor may skip writing its elements"));
        }
        // SAFETY: a meta storage has no elements in memory: nothing can read them.
        Ok(unsafe { self.assume_init() })
    }

    /// The tensor when it has no element (nothing to write), else `self`
    /// (an either, not an error: hence the large `Err`).
    #[allow(clippy::result_large_err)]
    pub(crate) fn if_empty(self) -> std::result::Result<Tensor, UninitTensor> {
        if self.storage.len == 0 {
            // SAFETY: there is no element to write.
            Ok(unsafe { self.assume_init() })
        } else {
            Err(self)
        }
    }

    /// Every element `value`, in parallel chunks when there are many.
    pub(crate) fn fill<T: WithDType>(mut self, op: &'static str, value: T) -> Result<Tensor> {
        let value = MaybeUninit::new(value);
        let data = self.as_uninit_mut::<T>(op)?;
        if data.len() <= FILL_CHUNK {
            data.fill(value);
        } else {
            data.par_chunks_mut(FILL_CHUNK).for_each(|chunk| chunk.fill(value));
        }
        // SAFETY: every element was just written.
        Ok(unsafe { self.assume_init() })
    }

    /// Element `i` is `value(i)`.
    pub(crate) fn init_from_fn<T: WithDType>(
        mut self,
        op: &'static str,
        mut value: impl FnMut(usize) -> T,
    ) -> Result<Tensor> {
        for (i, element) in self.as_uninit_mut::<T>(op)?.iter_mut().enumerate() {
            element.write(value(i));
        }
        // SAFETY: every element was just written.
        Ok(unsafe { self.assume_init() })
    }

    /// A copy of `data`, which has exactly as many elements (else an error).
    pub(crate) fn copy_from_slice<T: WithDType>(mut self, op: &'static str, data: &[T]) -> Result<Tensor> {
        let out = self.as_uninit_mut::<T>(op)?;
        if out.len() != data.len() {
            return Err(TensorError::internal(op, format!("{} values for {} elements", data.len(), out.len())));
        }
        for (o, d) in out.iter_mut().zip(data) {
            o.write(*d);
        }
        // SAFETY: every element was just written (the lengths are equal).
        Ok(unsafe { self.assume_init() })
    }

    /// Zeros (all-zero bytes: 0, 0.0 or false in every dtype).
    pub(crate) fn zeros(mut self, op: &'static str) -> Result<Tensor> {
        // Host memory only: the slice below is an error elsewhere.
        let count = self.storage.size_in_bytes();
        self.storage_mut(op)?.uninit_mut::<u8>(op, count)?.fill(MaybeUninit::new(0));
        // SAFETY: every byte was just written, and all-zero bytes are a valid
        // value of every dtype.
        Ok(unsafe { self.assume_init() })
    }

    /// The tensor after `write` has written its elements, given as `&mut [T]`
    /// (for kernels that write their whole output). An error from `write` is
    /// returned and the storage freed unread.
    ///
    /// # Safety
    /// When `write` returns `Ok`, it has written every element of the slice,
    /// and it reads no element before writing it.
    pub(crate) unsafe fn init_with<T: WithDType>(
        mut self,
        op: &'static str,
        write: impl FnOnce(&mut [T]) -> Result<()>,
    ) -> Result<Tensor> {
        // SAFETY: the slice goes only to `write`, which writes every element
        // before reading it (the caller's promise).
        write(unsafe { assume_written(self.as_uninit_mut::<T>(op)?) })?;
        // SAFETY: `write` wrote every element (the caller's promise).
        Ok(unsafe { self.assume_init() })
    }

    /// [`UninitTensor::init_with`] for two fresh tensors written together.
    ///
    /// # Safety
    /// When `write` returns `Ok`, it has written every element of both
    /// slices, and it reads no element before writing it.
    pub(crate) unsafe fn init_pair_with<A: WithDType, B: WithDType>(
        mut a: UninitTensor,
        mut b: UninitTensor,
        op: &'static str,
        write: impl FnOnce(&mut [A], &mut [B]) -> Result<()>,
    ) -> Result<(Tensor, Tensor)> {
        let (da, db) = (a.as_uninit_mut::<A>(op)?, b.as_uninit_mut::<B>(op)?);
        // SAFETY: the slices go only to `write`, which writes every element
        // before reading it (the caller's promise).
        write(unsafe { assume_written(da) }, unsafe { assume_written(db) })?;
        // SAFETY: `write` wrote every element of both (the caller's promise).
        Ok(unsafe { (a.assume_init(), b.assume_init()) })
    }
}

/// The slice as `&mut [T]`, for a kernel that writes every element before it
/// reads any.
///
/// # Safety
/// No element of the result is read before it is written.
unsafe fn assume_written<T>(data: &mut [MaybeUninit<T>]) -> &mut [T] {
    // SAFETY: `MaybeUninit<T>` has `T`'s layout, so the cast is a slice of the
    // same memory; the elements are not all written yet, and the caller
    // promises none is read before it is.
    unsafe { &mut *(data as *mut [MaybeUninit<T>] as *mut [T]) }
}
