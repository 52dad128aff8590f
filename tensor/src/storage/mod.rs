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
//!   next to `&[U]` for the others ([`locks::StorageLocks::write`]). A storage that
//!   is both read and written (an in-place op on views of one buffer) is
//!   locked once, for writing, and its writer reads it through its `&mut [T]`.
//!
//! Fresh memory is an [`UninitTensor`]: its only owner, which hands out
//! `&mut [MaybeUninit<T>]` and becomes a [`Tensor`](crate::Tensor) once every element is
//! written — by a safe initializer (`fill`, `copy_from_slice`, `init_from_fn`,
//! `zeros`) or by a kernel that writes its whole output
//! ([`UninitTensor::init_with`], `unsafe`: the caller vouches for the kernel).
//! So no `&[T]` is ever formed over memory nobody wrote, and nothing is filled
//! twice.
//!
//! Slices are formed from the allocator's block address in three small
//! functions at the end of `impl Storage`; nothing else here is `unsafe`.

use crate::backend::Buffer;
use crate::device::Device;
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use brasa_alloc::{MemoryCategory, StreamId};
use std::mem::MaybeUninit;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

mod locks;
mod uninit;

pub(crate) use locks::lock_storages;
pub(crate) use uninit::UninitTensor;

/// Memory holding `len` elements of one dtype on one device.
///
/// A `Storage` reachable from a [`Tensor`](crate::Tensor) always has every element written
/// (fresh storage is an `UninitTensor` until it is).
pub struct Storage {
    buffer: Buffer,
    dtype: DType,
    len: usize,
    device: Device,
    pinned: bool,
    lock: RwLock<()>,
    version: AtomicU64,
    /// Tensors kept for backward on this storage (brasa-autograd counts them).
    saved_refs: AtomicUsize,
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
        let category = crate::memory::current_category();
        let buffer = crate::backend::allocate(device, dtype, bytes, category)?;
        Ok(Storage {
            buffer,
            dtype,
            len,
            device,
            pinned: false,
            lock: RwLock::new(()),
            version: AtomicU64::new(0),
            saved_refs: AtomicUsize::new(0),
        })
    }

    /// Like [`Storage::uninit`], in page-locked host memory.
    fn uninit_pinned(dtype: DType, len: usize) -> Result<Storage> {
        let bytes = byte_count("pin_memory", dtype, len)?;
        let buffer = crate::backend::pinned_buffer(bytes)?;
        Ok(Storage {
            buffer,
            dtype,
            len,
            device: Device::CPU,
            pinned: true,
            lock: RwLock::new(()),
            version: AtomicU64::new(0),
            saved_refs: AtomicUsize::new(0),
        })
    }

    /// Whether the memory is page-locked host memory.
    pub fn is_pinned(&self) -> bool {
        self.pinned
    }

    /// Marks the memory as used by `stream` too, so the allocator reuses it
    /// only after the work queued there so far has finished.
    pub(crate) fn record_stream(&self, stream: StreamId) {
        self.buffer.record_stream(stream);
    }

    /// The memory category the allocator counts this storage under.
    pub fn category(&self) -> MemoryCategory {
        self.buffer.category()
    }

    /// Counts this storage under `category` from now on (autograd marks the
    /// tensors it saves for backward as activations).
    pub fn set_category(&self, category: MemoryCategory) {
        self.buffer.set_category(category);
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

    /// Counts one more tensor kept for backward on this storage (autograd
    /// calls it for each tensor a graph saves); `true` when it is the first,
    /// so that a total of saved bytes counts a storage once however many
    /// views of it are saved.
    pub fn add_saved_ref(&self) -> bool {
        self.saved_refs.fetch_add(1, Ordering::AcqRel) == 0
    }

    /// Counts one fewer tensor kept for backward; `true` when it was the
    /// last. A call with none counted changes nothing and returns `false`.
    pub fn remove_saved_ref(&self) -> bool {
        self.saved_refs.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)) == Ok(1)
    }

    /// How many tensors kept for backward hold this storage now.
    pub fn saved_refs(&self) -> usize {
        self.saved_refs.load(Ordering::Acquire)
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
    /// when there is nothing to point at. Errors for memory the process
    /// cannot read (a device's, or none on a meta device).
    fn host_start<T>(&self, op: &'static str, count: usize) -> Result<NonNull<T>> {
        let addr = self.buffer.host_addr(op, self.device)?;
        if count == 0 || std::mem::size_of::<T>() == 0 {
            return Ok(NonNull::dangling());
        }
        debug_assert!(count * std::mem::size_of::<T>() <= self.size_in_bytes());
        debug_assert_eq!(addr % std::mem::align_of::<T>(), 0);
        NonNull::new(addr as *mut T).ok_or_else(|| TensorError::internal(op, "a non-empty host storage without memory"))
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
            return Err(TensorError::internal(op, "a slice beyond its storage"));
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
    TensorError::internal(op, "a view outside its storage")
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

#[cfg(test)]
mod tests {
    use super::uninit::FILL_CHUNK;
    use super::*;
    use crate::tensor::Tensor;

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
        let err = t.storage().read::<f64>("test").err();
        assert!(
            matches!(err, Some(TensorError::DTypeMismatch { op: "test", expected: DType::F32, got: DType::F64 })),
            "{err:?}"
        );
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
