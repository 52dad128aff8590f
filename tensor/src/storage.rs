//! Storage: a device buffer from the device's caching allocator, with a dtype,
//! a length in elements, a reader-writer lock and a version counter.
//!
//! Tensors share storage through views, so reads and in-place writes go
//! through the storage's lock: any number of readers, or one writer. An
//! operation that touches several storages locks them with [`lock_storages`],
//! in address order, so two threads can never wait on each other.

use crate::device::Device;
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::host_devices::host_allocator;
use brasa_alloc::{Allocation, HostBackend, StreamId};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

pub(crate) enum Buffer {
    Host(Allocation<HostBackend>),
    #[cfg(feature = "cuda")]
    Cuda(Allocation<brasa_alloc::CudaBackend>),
}

/// Memory holding `len` elements of one dtype on one device.
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
    /// Storage for `len` elements whose contents the caller must write before
    /// anything reads them (fresh pages are zero; reused blocks hold old values).
    ///
    /// The byte count is checked here; a count no device can hold is then the
    /// allocator's out-of-memory error. So `len * size_in_bytes` never
    /// overflows for a storage that exists.
    pub(crate) fn uninit(device: Device, dtype: DType, len: usize) -> Result<Storage> {
        let bytes = byte_count("allocate", dtype, len)?;
        let buffer = match device {
            Device::Cpu(index) => Buffer::Host(host_allocator(index)?.allocate(bytes, StreamId::DEFAULT)?),
            Device::Cuda(index) => cuda_buffer(index, bytes)?,
        };
        Ok(Storage { buffer, dtype, len, device, pinned: false, lock: RwLock::new(()), version: AtomicU64::new(0) })
    }

    /// Like [`Storage::uninit`], in page-locked host memory.
    pub(crate) fn uninit_pinned(dtype: DType, len: usize) -> Result<Storage> {
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

    /// Storage of `len` zeros.
    pub(crate) fn zeros(device: Device, dtype: DType, len: usize) -> Result<Storage> {
        let storage = Storage::uninit(device, dtype, len)?;
        match &storage.buffer {
            Buffer::Host(block) if len > 0 => {
                // SAFETY: the block holds `len * size` writable bytes and nothing else can see it yet.
                unsafe { std::ptr::write_bytes(block.addr() as *mut u8, 0, len * dtype.size_in_bytes()) }
            }
            #[cfg(feature = "cuda")]
            Buffer::Cuda(_) => return Err(crate::cuda::unsupported("zeros")),
            _ => {}
        }
        Ok(storage)
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

    pub(crate) fn read_lock(&self) -> RwLockReadGuard<'_, ()> {
        self.lock.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn write_lock(&self) -> RwLockWriteGuard<'_, ()> {
        self.lock.write().unwrap_or_else(|e| e.into_inner())
    }

    fn check_host<T: WithDType>(&self, op: &'static str) -> Result<*mut T> {
        if T::DTYPE != self.dtype {
            return Err(TensorError::DTypeMismatch { op, expected: self.dtype, got: T::DTYPE });
        }
        match &self.buffer {
            Buffer::Host(block) if self.len == 0 || block.addr() == 0 => Ok(std::ptr::NonNull::dangling().as_ptr()),
            Buffer::Host(block) => Ok(block.addr() as *mut T),
            #[cfg(feature = "cuda")]
            Buffer::Cuda(_) => Err(crate::cuda::unsupported(op)),
        }
    }

    /// The elements, typed.
    ///
    /// # Safety
    /// The caller holds this storage's read (or write) lock, or is its only
    /// owner, for as long as the slice lives; every element was written.
    pub(crate) unsafe fn host_slice<T: WithDType>(&self, op: &'static str) -> Result<&[T]> {
        let ptr = self.check_host::<T>(op)?;
        // SAFETY: host memory of `len` elements of T (dtype checked), aligned to
        // 64 bytes; the caller guarantees no concurrent writer.
        Ok(unsafe { std::slice::from_raw_parts(ptr, self.len) })
    }

    /// The elements, typed and writable.
    ///
    /// # Safety
    /// The caller holds this storage's write lock, or is its only owner, and no
    /// other slice of this storage is alive while this one is.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn host_slice_mut<T: WithDType>(&self, op: &'static str) -> Result<&mut [T]> {
        let ptr = self.check_host::<T>(op)?;
        // SAFETY: as above, and the caller guarantees exclusive access.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr, self.len) })
    }

    /// The first byte of a host buffer (dangling but aligned when empty).
    ///
    /// # Safety
    /// The caller holds this storage's lock (read to read, write to write)
    /// for as long as it uses the pointer, within `size_in_bytes`.
    pub(crate) unsafe fn host_bytes_raw(&self, op: &'static str) -> Result<*mut u8> {
        let _ = op; // named in the CUDA arm only
        match &self.buffer {
            Buffer::Host(block) if self.len == 0 || block.addr() == 0 => Ok(std::ptr::NonNull::dangling().as_ptr()),
            Buffer::Host(block) => Ok(block.addr() as *mut u8),
            #[cfg(feature = "cuda")]
            Buffer::Cuda(_) => Err(crate::cuda::unsupported(op)),
        }
    }

    /// The raw bytes (host only).
    ///
    /// # Safety
    /// As for [`Storage::host_slice`].
    #[cfg(feature = "cuda")]
    pub(crate) unsafe fn host_bytes(&self, op: &'static str) -> Result<&[u8]> {
        match &self.buffer {
            Buffer::Host(block) if self.len > 0 => {
                // SAFETY: the block holds `size_in_bytes` initialized bytes; the caller holds the lock.
                Ok(unsafe { std::slice::from_raw_parts(block.addr() as *const u8, self.size_in_bytes()) })
            }
            Buffer::Host(_) => Ok(&[]),
            Buffer::Cuda(_) => Err(crate::cuda::unsupported(op)),
        }
    }

    /// The raw bytes, writable (host only).
    ///
    /// # Safety
    /// As for [`Storage::host_slice_mut`].
    #[allow(clippy::mut_from_ref)]
    #[cfg(feature = "cuda")]
    pub(crate) unsafe fn host_bytes_mut(&self, op: &'static str) -> Result<&mut [u8]> {
        match &self.buffer {
            Buffer::Host(block) if self.len > 0 => {
                // SAFETY: as above, with exclusive access guaranteed by the caller.
                Ok(unsafe { std::slice::from_raw_parts_mut(block.addr() as *mut u8, self.size_in_bytes()) })
            }
            Buffer::Host(_) => Ok(&mut []),
            Buffer::Cuda(_) => Err(crate::cuda::unsupported(op)),
        }
    }

    #[cfg(feature = "cuda")]
    pub(crate) fn buffer(&self) -> &Buffer {
        &self.buffer
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

/// Locks held by one operation on the storages it touches.
pub(crate) enum StorageGuard<'a> {
    Read(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
    Write(#[allow(dead_code)] RwLockWriteGuard<'a, ()>),
}

/// Locks each distinct storage once, in address order: for writing if it is in
/// `writes`, else for reading. Holding the guards makes the slices of
/// [`Storage::host_slice`] and [`Storage::host_slice_mut`] safe to use.
pub(crate) fn lock_storages<'a>(reads: &[&'a Storage], writes: &[&'a Storage]) -> Vec<StorageGuard<'a>> {
    let mut all: Vec<(&'a Storage, bool)> =
        writes.iter().map(|s| (*s, true)).chain(reads.iter().map(|s| (*s, false))).collect();
    // Writers sort first among equal addresses, so dedup keeps the write.
    all.sort_by_key(|(s, write)| (*s as *const Storage as usize, !*write));
    all.dedup_by_key(|(s, _)| *s as *const Storage as usize);
    all.into_iter()
        .map(
            |(storage, write)| {
                if write {
                    StorageGuard::Write(storage.write_lock())
                } else {
                    StorageGuard::Read(storage.read_lock())
                }
            },
        )
        .collect()
}
