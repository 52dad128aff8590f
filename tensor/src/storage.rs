//! Storage: a device buffer from the device's caching allocator, with a dtype,
//! a length in elements, a reader-writer lock and a version counter.
//!
//! Tensors share storage through views, so reads and in-place writes go
//! through the storage's lock: any number of readers, or one writer. The
//! host elements are only reachable through guards that hold that lock for
//! as long as the slice they hand out lives:
//!
//! - [`Storage::read`] / [`Storage::write`] (and their byte forms) lock one
//!   storage and deref to `&[T]` / `&mut [T]`;
//! - [`lock_storages`] locks every storage an operation touches, once each and
//!   in address order (so two threads can never wait on each other), and
//!   hands out `&[T]` for any of them and `&mut [T]` for one written storage
//!   next to `&[U]` for the others ([`StorageLocks::write`]). A storage that
//!   is both read and written (an in-place op on views of one buffer) is
//!   locked once, for writing, and its writer reads it through its `&mut [T]`.
//!
//! Fresh memory is an [`UninitTensor`]: its only owner, which hands out
//! `&mut [MaybeUninit<T>]` and becomes a [`Tensor`] once every element is
//! written — by a safe initializer (`fill`, `copy_from_slice`, `init_from_fn`,
//! `zeros`) or by a kernel that writes its whole output
//! ([`UninitTensor::init_with`], `unsafe`: the caller vouches for the kernel).
//! So no `&[T]` is ever formed over memory nobody wrote, and nothing is filled
//! twice.
//!
//! Slices are formed from the allocator's block address in three small
//! functions at the end of `impl Storage`; nothing else here is `unsafe`.

use crate::device::Device;
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::host_devices::host_allocator;
use crate::layout::Layout;
use crate::shape::Shape;
use crate::tensor::Tensor;
use brasa_alloc::{Allocation, HostBackend, StreamId};
use rayon::prelude::*;
use std::mem::MaybeUninit;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Elements per parallel chunk of [`UninitTensor::fill`].
const FILL_CHUNK: usize = 1 << 16;

pub(crate) enum Buffer {
    Host(Allocation<HostBackend>),
    #[cfg(feature = "cuda")]
    Cuda(Allocation<brasa_alloc::CudaBackend>),
}

/// Memory holding `len` elements of one dtype on one device.
///
/// A `Storage` reachable from a [`Tensor`] always has every element written
/// (fresh storage is an `UninitTensor` until it is).
pub struct Storage {
    buffer: Buffer,
    dtype: DType,
    len: usize,
    device: Device,
    pinned: bool,
    lock: RwLock<()>,
    version: AtomicU64,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage")
            .field("dtype", &self.dtype)
            .field("len", &self.len)
            .field("device", &self.device)
            .finish()
    }
}

impl Storage {
    /// Storage for `len` elements, not written yet (fresh pages are zero;
    /// reused blocks hold old values): only [`UninitTensor`] makes one.
    ///
    /// The byte count is checked here; a count no device can hold is then the
    /// allocator's out-of-memory error. So `len * size_in_bytes` never
    /// overflows for a storage that exists.
    fn uninit(device: Device, dtype: DType, len: usize) -> Result<Storage> {
        let bytes = byte_count("allocate", dtype, len)?;
        let buffer = match device {
            Device::Cpu(index) => Buffer::Host(host_allocator(index)?.allocate(bytes, StreamId::DEFAULT)?),
            Device::Cuda(index) => cuda_buffer(index, bytes)?,
        };
        Ok(Storage { buffer, dtype, len, device, pinned: false, lock: RwLock::new(()), version: AtomicU64::new(0) })
    }

    /// Like [`Storage::uninit`], in page-locked host memory.
    fn uninit_pinned(dtype: DType, len: usize) -> Result<Storage> {
        let bytes = byte_count("pin_memory", dtype, len)?;
        let buffer = Buffer::Host(crate::host_devices::pinned_allocator()?.allocate(bytes, StreamId::DEFAULT)?);
        Ok(Storage {
            buffer,
            dtype,
            len,
            device: Device::CPU,
            pinned: true,
            lock: RwLock::new(()),
            version: AtomicU64::new(0),
        })
    }

    /// Whether the memory is page-locked host memory.
    pub fn is_pinned(&self) -> bool {
        self.pinned
    }

    /// Marks the memory as used by `stream` too, so the allocator reuses it
    /// only after the work queued there so far has finished.
    pub(crate) fn record_stream(&self, stream: StreamId) {
        match &self.buffer {
            Buffer::Host(block) => block.record_stream(stream),
            #[cfg(feature = "cuda")]
            Buffer::Cuda(block) => block.record_stream(stream),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device holding the memory.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Bytes the storage holds.
    pub fn size_in_bytes(&self) -> usize {
        self.len * self.dtype.size_in_bytes()
    }

    /// Times the storage was modified in place (autograd checks saved tensors with it).
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    pub(crate) fn bump_version(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    fn read_lock(&self) -> RwLockReadGuard<'_, ()> {
        self.lock.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_lock(&self) -> RwLockWriteGuard<'_, ()> {
        self.lock.write().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg(feature = "cuda")]
    pub(crate) fn buffer(&self) -> &Buffer {
        &self.buffer
    }

    /// This storage's read lock, for a copy out of its device buffer.
    #[cfg(feature = "cuda")]
    pub(crate) fn device_read_lock(&self) -> RwLockReadGuard<'_, ()> {
        self.read_lock()
    }

    /// The elements, typed, read-locked while the guard lives. A `T` of
    /// another dtype, or a storage off the host, is an error naming `op`.
    pub(crate) fn read<T: WithDType>(&self, op: &'static str) -> Result<ReadGuard<'_, T>> {
        let lock = self.read_lock();
        let count = self.element_count::<T>(op)?;
        // SAFETY: `count` is the element count for `T`; the read lock goes
        // into the guard with the slice, so it is held while the slice lives.
        let data = unsafe { self.shared(op, count)? };
        Ok(ReadGuard { _lock: lock, data })
    }

    /// The elements, typed and writable, write-locked while the guard lives.
    /// Does not count as an in-place change by itself ([`Storage::bump_version`]).
    pub(crate) fn write<T: WithDType>(&self, op: &'static str) -> Result<WriteGuard<'_, T>> {
        let lock = self.write_lock();
        let count = self.element_count::<T>(op)?;
        // SAFETY: `count` is the element count for `T`; the write lock goes
        // into the guard with the slice (held while it lives), and the guard
        // hands out this one slice.
        let data = unsafe { self.exclusive(op, count)? };
        Ok(WriteGuard { _lock: lock, data })
    }

    /// The raw bytes (host only), read-locked while the guard lives.
    pub(crate) fn read_bytes(&self, op: &'static str) -> Result<ReadGuard<'_, u8>> {
        let lock = self.read_lock();
        // SAFETY: a byte count, with `u8`; the lock is held as in `read`.
        let data = unsafe { self.shared(op, self.size_in_bytes())? };
        Ok(ReadGuard { _lock: lock, data })
    }

    /// The raw bytes (host only), write-locked while the guard lives.
    pub(crate) fn write_bytes(&self, op: &'static str) -> Result<WriteGuard<'_, u8>> {
        let lock = self.write_lock();
        // SAFETY: a byte count, with `u8`; the lock is held as in `write`.
        let data = unsafe { self.exclusive(op, self.size_in_bytes())? };
        Ok(WriteGuard { _lock: lock, data })
    }

    /// `len` after checking that `T` is the storage's element type.
    fn element_count<T: WithDType>(&self, op: &'static str) -> Result<usize> {
        if T::DTYPE != self.dtype {
            return Err(TensorError::DTypeMismatch { op, expected: self.dtype, got: T::DTYPE });
        }
        Ok(self.len)
    }

    /// The first of `count` `T`s of the host block: dangling (and aligned)
    /// when there is nothing to point at. Errors for a device buffer.
    fn host_start<T>(&self, op: &'static str, count: usize) -> Result<NonNull<T>> {
        let _ = op; // named in the CUDA arm only
        match &self.buffer {
            Buffer::Host(_) if count == 0 || std::mem::size_of::<T>() == 0 => Ok(NonNull::dangling()),
            Buffer::Host(block) => {
                debug_assert!(count * std::mem::size_of::<T>() <= self.size_in_bytes());
                debug_assert_eq!(block.addr() % std::mem::align_of::<T>(), 0);
                NonNull::new(block.addr() as *mut T)
                    .ok_or_else(|| TensorError::invalid(op, "internal error: a non-empty host storage without memory"))
            }
            #[cfg(feature = "cuda")]
            Buffer::Cuda(_) => Err(crate::cuda::unsupported(op)),
        }
    }

    // ----- the three places a slice is formed from the block's address -----

    /// `count` `T`s of the host block, shared.
    ///
    /// # Safety
    /// `count` is [`Storage::element_count`] for this `T`, or `T` is `u8`
    /// and `count` is [`Storage::size_in_bytes`]; and the caller holds this
    /// storage's read or write lock for as long as the slice lives.
    unsafe fn shared<T>(&self, op: &'static str, count: usize) -> Result<&[T]> {
        let start = self.host_start::<T>(op, count)?;
        // SAFETY: `start` is non-null and aligned for `T` (the host allocator
        // aligns blocks to 64 bytes; dangling pointers are aligned) and the
        // block holds `count` `T`s (the caller's count), every one written (a
        // `Storage` is only made reachable once written: see the type). The
        // caller's lock keeps writers out while the slice lives, and the block
        // lives as long as `self`, which the slice borrows.
        Ok(unsafe { std::slice::from_raw_parts(start.as_ptr(), count) })
    }

    /// `count` `T`s of the host block, exclusive.
    ///
    /// # Safety
    /// As for [`Storage::shared`], with this storage's *write* lock held, and
    /// no other slice of this storage alive or formed while this one lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn exclusive<T>(&self, op: &'static str, count: usize) -> Result<&mut [T]> {
        let start = self.host_start::<T>(op, count)?;
        // SAFETY: as in `shared`; the write lock and the caller's promise
        // make this the only access to the block while the slice lives.
        Ok(unsafe { std::slice::from_raw_parts_mut(start.as_ptr(), count) })
    }

    /// `count` `T`s of the host block, not necessarily written yet. `&mut
    /// self` is exclusive access: the storage is not shared (not yet in a
    /// tensor), so no lock is needed.
    fn uninit_mut<T>(&mut self, op: &'static str, count: usize) -> Result<&mut [MaybeUninit<T>]> {
        if count.checked_mul(std::mem::size_of::<T>()).is_none_or(|bytes| bytes > self.size_in_bytes()) {
            return Err(TensorError::invalid(op, "internal error: a slice beyond its storage"));
        }
        let start = self.host_start::<MaybeUninit<T>>(op, count)?;
        // SAFETY: `start` is non-null and aligned and the block holds `count`
        // `T`s (checked just above); `MaybeUninit` makes no claim about the
        // contents; `&mut self` makes this the only access to the block for
        // the slice's life (a `Storage` owns its block alone).
        Ok(unsafe { std::slice::from_raw_parts_mut(start.as_ptr(), count) })
    }
}

/// The bytes `len` elements of `dtype` take, or an error naming `op` when
/// that is more than a `usize` counts.
fn byte_count(op: &'static str, dtype: DType, len: usize) -> Result<usize> {
    len.checked_mul(dtype.size_in_bytes()).ok_or_else(|| {
        TensorError::invalid(
            op,
            format!(
                "{len} elements of {dtype} take {} bytes, more than usize::MAX",
                len as u128 * dtype.size_in_bytes() as u128
            ),
        )
    })
}

#[cfg(feature = "cuda")]
fn cuda_buffer(index: usize, bytes: usize) -> Result<Buffer> {
    Ok(Buffer::Cuda(crate::cuda::allocator(index)?.allocate(bytes, StreamId::DEFAULT)?))
}

#[cfg(not(feature = "cuda"))]
fn cuda_buffer(index: usize, _bytes: usize) -> Result<Buffer> {
    Err(TensorError::Device(format!("cuda:{index}: brasa-tensor was built without the `cuda` feature")))
}

// ----- one storage: guards ----------------------------------------------------

/// One storage's elements, read-locked while this lives.
pub(crate) struct ReadGuard<'a, T> {
    _lock: RwLockReadGuard<'a, ()>,
    data: &'a [T],
}

/// One storage's elements, write-locked while this lives.
pub(crate) struct WriteGuard<'a, T> {
    _lock: RwLockWriteGuard<'a, ()>,
    data: &'a mut [T],
}

impl<'a, T> ReadGuard<'a, T> {
    /// The guard over `data[range]` only (the lock is kept); out of range is
    /// an error naming `op`, an empty range always fits.
    pub(crate) fn narrow(self, op: &'static str, range: std::ops::Range<usize>) -> Result<Self> {
        let ReadGuard { _lock, data } = self;
        let data = if range.is_empty() { &data[..0] } else { data.get(range).ok_or_else(|| out_of_range(op))? };
        Ok(ReadGuard { _lock, data })
    }
}

impl<'a, T> WriteGuard<'a, T> {
    /// The guard over `data[range]` only (the lock is kept).
    pub(crate) fn narrow(self, op: &'static str, range: std::ops::Range<usize>) -> Result<Self> {
        let WriteGuard { _lock, data } = self;
        let data =
            if range.is_empty() { &mut data[..0] } else { data.get_mut(range).ok_or_else(|| out_of_range(op))? };
        Ok(WriteGuard { _lock, data })
    }
}

fn out_of_range(op: &'static str) -> TensorError {
    TensorError::invalid(op, "internal error: a view outside its storage")
}

impl<T> Deref for ReadGuard<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.data
    }
}

impl<T> Deref for WriteGuard<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.data
    }
}

impl<T> DerefMut for WriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.data
    }
}

// ----- several storages: one lock each, in address order -----------------------

enum Lock<'a> {
    Read(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
    Write(#[allow(dead_code)] RwLockWriteGuard<'a, ()>),
}

struct Held<'a> {
    storage: &'a Storage,
    lock: Lock<'a>,
}

/// The locks one operation holds on the storages it touches, from
/// [`lock_storages`]; the slices it hands out borrow it, so they cannot
/// outlive the locks.
pub(crate) struct StorageLocks<'a> {
    held: Vec<Held<'a>>,
}

/// Locks each distinct storage once, in address order: for writing if it is in
/// `writes`, else for reading. A storage in both is locked once, for writing.
pub(crate) fn lock_storages<'a>(reads: &[&'a Storage], writes: &[&'a Storage]) -> StorageLocks<'a> {
    let mut all: Vec<(&'a Storage, bool)> =
        writes.iter().map(|s| (*s, true)).chain(reads.iter().map(|s| (*s, false))).collect();
    // Writers sort first among equal addresses, so dedup keeps the write.
    all.sort_by_key(|(s, write)| (*s as *const Storage as usize, !*write));
    all.dedup_by_key(|(s, _)| *s as *const Storage as usize);
    let held = all
        .into_iter()
        .map(|(storage, write)| Held {
            storage,
            lock: if write { Lock::Write(storage.write_lock()) } else { Lock::Read(storage.read_lock()) },
        })
        .collect();
    StorageLocks { held }
}

fn not_locked(op: &'static str, what: &str) -> TensorError {
    TensorError::invalid(op, format!("internal error: a storage {what} by this operation's locks"))
}

impl StorageLocks<'_> {
    fn position(&self, storage: &Storage) -> Option<usize> {
        self.held.iter().position(|h| std::ptr::eq(h.storage, storage))
    }

    /// The elements of `storage`, one of the locked ones (read or written),
    /// as `T` (its dtype, else an error naming `op`).
    pub(crate) fn read<T: WithDType>(&self, storage: &Storage, op: &'static str) -> Result<&[T]> {
        let at = self.position(storage).ok_or_else(|| not_locked(op, "not locked"))?;
        let storage = self.held[at].storage;
        let count = storage.element_count::<T>(op)?;
        // SAFETY: `count` is the element count for `T`; the lock taken in
        // `lock_storages` is held while `self` lives, which the slice borrows,
        // and while it is borrowed `write` (`&mut self`) hands out no `&mut`.
        unsafe { storage.shared(op, count) }
    }

    /// The elements of `storage`, locked for writing, as `&mut [T]`, with
    /// read access to the other locked storages. Reading `storage` itself
    /// through the second value is an error: read it through the first.
    pub(crate) fn write<T: WithDType>(
        &mut self,
        storage: &Storage,
        op: &'static str,
    ) -> Result<(&mut [T], LockedReads<'_>)> {
        let at = self.position(storage).ok_or_else(|| not_locked(op, "not locked"))?;
        let held = &self.held[at];
        if !matches!(held.lock, Lock::Write(_)) {
            return Err(not_locked(op, "read but not write-locked"));
        }
        let count = held.storage.element_count::<T>(op)?;
        // SAFETY: `count` is the element count for `T`; the write lock is held
        // while `self` lives, and `&mut self` (borrowed by both returned
        // values) keeps every other slice of this set from living meanwhile;
        // `LockedReads` refuses this storage.
        let data = unsafe { held.storage.exclusive(op, count)? };
        Ok((data, LockedReads { held: &self.held, written: at }))
    }
}

/// Read access to the storages of a [`StorageLocks`] but the one being written.
pub(crate) struct LockedReads<'r> {
    held: &'r [Held<'r>],
    written: usize,
}

impl<'r> LockedReads<'r> {
    /// The elements of `storage`, a locked one other than the written one.
    pub(crate) fn read<T: WithDType>(&self, storage: &Storage, op: &'static str) -> Result<&'r [T]> {
        let at = self
            .held
            .iter()
            .position(|h| std::ptr::eq(h.storage, storage))
            .ok_or_else(|| not_locked(op, "not locked"))?;
        if at == self.written {
            return Err(TensorError::invalid(
                op,
                "internal error: the written storage is read through its `&mut` slice, not as a second slice",
            ));
        }
        let storage = self.held[at].storage;
        let count = storage.element_count::<T>(op)?;
        // SAFETY: `count` is the element count for `T`; the lock is held for
        // `'r` (the borrow of the `StorageLocks`), and this is not the storage
        // whose `&mut` slice lives beside these.
        unsafe { storage.shared(op, count) }
    }
}

// ----- fresh memory -----------------------------------------------------------------

/// A fresh contiguous tensor whose elements are not written yet. It is their
/// only owner: it hands out `&mut [MaybeUninit<T>]`, never `&[T]`, and becomes
/// a [`Tensor`] once every element is written.
pub(crate) struct UninitTensor {
    storage: Storage,
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
        Ok(UninitTensor { storage, layout })
    }

    /// [`UninitTensor::new`] with the shape of `like` (any tensor or view):
    /// that shape was checked when `like` was made, so only the storage is.
    #[inline]
    pub(crate) fn like(like: &Tensor, dtype: DType, device: Device) -> Result<UninitTensor> {
        let storage = Storage::uninit(device, dtype, like.numel())?;
        Ok(UninitTensor { storage, layout: like.layout().dense_like() })
    }

    /// [`UninitTensor::new`] in page-locked host memory.
    pub(crate) fn pinned(shape: impl Into<Shape>, dtype: DType) -> Result<UninitTensor> {
        let layout = Layout::contiguous(shape)?;
        let storage = Storage::uninit_pinned(dtype, layout.numel())?;
        Ok(UninitTensor { storage, layout })
    }

    #[cfg(feature = "cuda")]
    pub(crate) fn buffer(&self) -> &Buffer {
        &self.storage.buffer
    }

    /// The elements to write, as `T` (the dtype, else an error naming `op`).
    pub(crate) fn as_uninit_mut<T: WithDType>(&mut self, op: &'static str) -> Result<&mut [MaybeUninit<T>]> {
        let count = self.storage.element_count::<T>(op)?;
        self.storage.uninit_mut(op, count)
    }

    /// The bytes to write (host only).
    #[cfg(feature = "cuda")]
    pub(crate) fn as_uninit_bytes_mut(&mut self, op: &'static str) -> Result<&mut [MaybeUninit<u8>]> {
        let count = self.storage.size_in_bytes();
        self.storage.uninit_mut(op, count)
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
            return Err(TensorError::invalid(
                op,
                format!("internal error: {} values for {} elements", data.len(), out.len()),
            ));
        }
        for (o, d) in out.iter_mut().zip(data) {
            o.write(*d);
        }
        // SAFETY: every element was just written (the lengths are equal).
        Ok(unsafe { self.assume_init() })
    }

    /// Zeros (all-zero bytes: 0, 0.0 or false in every dtype).
    pub(crate) fn zeros(mut self, op: &'static str) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        if let Buffer::Cuda(_) = self.storage.buffer {
            return Err(crate::cuda::unsupported(op));
        }
        let count = self.storage.size_in_bytes();
        self.storage.uninit_mut::<u8>(op, count)?.fill(MaybeUninit::new(0));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn host(values: &[f32]) -> Result<Tensor> {
        Tensor::from_slice_on(values, [values.len()], Device::CPU)
    }

    #[test]
    fn a_storage_read_and_written_is_locked_once_for_writing() -> Result<()> {
        // An in-place op on two views of one buffer: the storage is in both
        // lists; one write lock serves both (a second lock would deadlock).
        let t = host(&[1.0, 2.0, 3.0, 4.0])?;
        let view = t.narrow(0, 2, 2)?;
        let mut locks = lock_storages(&[view.storage(), t.storage()], &[t.storage()]);
        assert_eq!(locks.held.len(), 1);
        assert_eq!(locks.read::<f32>(view.storage(), "test")?, &[1.0, 2.0, 3.0, 4.0]);
        {
            let (data, reads) = locks.write::<f32>(t.storage(), "test")?;
            // The written storage is read through its `&mut` slice, never as a second slice.
            assert!(reads.read::<f32>(view.storage(), "test").is_err());
            let (front, back) = data.split_at_mut(2);
            front.copy_from_slice(back);
        }
        drop(locks);
        assert_eq!(t.to_vec::<f32>()?, [3.0, 4.0, 3.0, 4.0]);
        Ok(())
    }

    #[test]
    fn reads_beside_a_write_and_lock_order() -> Result<()> {
        let (a, b) = (host(&[1.0, 2.0])?, host(&[10.0, 20.0])?);
        // Same set in either order: address order decides, so two threads
        // locking {a, b} and {b, a} cannot wait on each other.
        let (sa, sb): (&Storage, &Storage) = (a.storage(), b.storage());
        for (read, write) in [(sa, sb), (sb, sa)] {
            let locks = lock_storages(&[read], &[write]);
            let addresses: Vec<usize> = locks.held.iter().map(|h| h.storage as *const Storage as usize).collect();
            assert!(addresses.windows(2).all(|w| w[0] < w[1]));
        }
        let mut locks = lock_storages(&[a.storage()], &[b.storage()]);
        let (out, reads) = locks.write::<f32>(b.storage(), "test")?;
        let src = reads.read::<f32>(a.storage(), "test")?;
        for (o, s) in out.iter_mut().zip(src) {
            *o += s;
        }
        drop(locks);
        assert_eq!(b.to_vec::<f32>()?, [11.0, 22.0]);
        Ok(())
    }

    #[test]
    fn writing_a_read_locked_or_unlocked_storage_is_an_error() -> Result<()> {
        let (a, b) = (host(&[1.0])?, host(&[2.0])?);
        let mut locks = lock_storages(&[a.storage()], &[]);
        assert!(locks.write::<f32>(a.storage(), "test").is_err());
        assert!(locks.read::<f32>(b.storage(), "test").is_err());
        Ok(())
    }

    #[test]
    fn a_dtype_mismatch_is_an_error_not_a_reinterpretation() -> Result<()> {
        let t = host(&[1.0, 2.0])?;
        let err = t.storage().read::<f64>("test").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("test"), "{err}");
        assert!(t.storage().write::<i64>("test").is_err());
        let mut locks = lock_storages(&[], &[t.storage()]);
        assert!(locks.read::<u8>(t.storage(), "test").is_err());
        assert!(locks.write::<f64>(t.storage(), "test").is_err());
        drop(locks);
        let mut fresh = UninitTensor::new([2], DType::F32, Device::CPU)?;
        assert!(fresh.as_uninit_mut::<f64>("test").is_err());
        // Bytes are any dtype's.
        assert_eq!(t.storage().read_bytes("test")?.len(), 8);
        Ok(())
    }

    #[test]
    fn fresh_storage_is_written_before_it_is_read() -> Result<()> {
        // Before: only `MaybeUninit` slots. After a safe initializer: a tensor.
        let mut fresh = UninitTensor::new([3], DType::I64, Device::CPU)?;
        assert_eq!(fresh.as_uninit_mut::<i64>("test")?.len(), 3);
        assert_eq!(fresh.fill("test", 7i64)?.to_vec::<i64>()?, [7, 7, 7]);
        let big = UninitTensor::new([FILL_CHUNK * 2 + 5], DType::F32, Device::CPU)?.fill("test", 1.5f32)?;
        assert!(big.to_vec::<f32>()?.iter().all(|&v| v == 1.5));
        let seq = UninitTensor::new([4], DType::U8, Device::CPU)?.init_from_fn("test", |i| i as u8 * 2)?;
        assert_eq!(seq.to_vec::<u8>()?, [0, 2, 4, 6]);
        let copy = UninitTensor::new([2], DType::F64, Device::CPU)?.copy_from_slice("test", &[0.5, -1.0])?;
        assert_eq!(copy.to_vec::<f64>()?, [0.5, -1.0]);
        assert!(UninitTensor::new([2], DType::F64, Device::CPU)?.copy_from_slice("test", &[0.5]).is_err());
        // Reused blocks hold old bytes (here 2, an invalid bool): zeros writes them all.
        drop(Tensor::full_on([64], 2.0, DType::U8, Device::CPU)?);
        let flags = UninitTensor::new([64], DType::Bool, Device::CPU)?.zeros("test")?;
        assert!(flags.to_vec::<bool>()?.iter().all(|&f| !f));
        Ok(())
    }

    #[test]
    fn a_failed_initialization_hands_out_no_tensor() -> Result<()> {
        let fresh = UninitTensor::new([4], DType::F32, Device::CPU)?;
        // SAFETY: the closure writes nothing and fails, so nothing is read.
        let result = unsafe { fresh.init_with::<f32>("test", |_| Err(TensorError::invalid("test", "kernel failed"))) };
        assert!(result.is_err());
        let fresh = UninitTensor::new([2], DType::F32, Device::CPU)?;
        // SAFETY: the closure writes every element.
        let done = unsafe {
            fresh.init_with::<f32>("test", |out| {
                out.copy_from_slice(&[1.0, 2.0]);
                Ok(())
            })?
        };
        assert_eq!(done.to_vec::<f32>()?, [1.0, 2.0]);
        let empty = UninitTensor::new([0, 3], DType::F32, Device::CPU)?;
        assert!(empty.if_empty().is_ok());
        assert!(UninitTensor::new([1], DType::F32, Device::CPU)?.if_empty().is_err());
        Ok(())
    }

    #[test]
    fn guards_narrow_to_a_view_and_hold_the_lock() -> Result<()> {
        let t = host(&[1.0, 2.0, 3.0])?;
        let bytes = t.storage().read_bytes("test")?.narrow("test", 4..8)?;
        assert_eq!(&*bytes, &2.0f32.to_ne_bytes());
        // A reader is in: a writer cannot get in meanwhile.
        assert!(t.storage().lock.try_write().is_err());
        drop(bytes);
        assert!(t.storage().lock.try_write().is_ok());
        assert!(t.storage().read_bytes("test")?.narrow("test", 8..16).is_err());
        assert!(t.storage().write_bytes("test")?.narrow("test", 40..40).is_ok());
        Ok(())
    }
}
