//! The seam between the caching allocator and a device: raw memory, capacity,
//! and events for deferred reuse across streams.

use std::fmt;

/// A device queue. Blocks are cached per stream: a block freed on one stream is
/// reused only on that stream, unless it has been handed to others with
/// `record_stream`, in which case it waits for an event on each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct StreamId(pub u64);

impl StreamId {
    /// The device's default stream.
    pub const DEFAULT: StreamId = StreamId(0);
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream {}", self.0)
    }
}

/// Why a backend could not do what it was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The device has no room for `requested` more bytes. The caching
    /// allocator answers this by releasing cached memory and retrying.
    #[error("device out of memory allocating {requested} bytes")]
    OutOfMemory {
        /// Bytes asked for.
        requested: usize,
    },
    /// Anything else the device reported, in words.
    #[error("{0}")]
    Device(String),
    /// The CUDA driver failed a call (feature `cuda`); the driver's error
    /// is the [`std::error::Error::source`].
    #[cfg(feature = "cuda")]
    #[error("{what}: {source}")]
    Cuda {
        /// The call or what it was for (`cuMemAlloc`, `no CUDA device 3`).
        what: String,
        /// The driver's error code.
        #[source]
        source: cudarc::driver::DriverError,
    },
}

/// Raw device memory, as the caching allocator sees it.
///
/// Addresses are plain integers: a host pointer on the host, a `CUdeviceptr`
/// on CUDA. The allocator never dereferences them.
pub trait Backend: Send + Sync + 'static {
    /// A marker recorded on a stream; complete once the stream's work before it is done.
    type Event: Send;

    /// The device's name in messages, e.g. `cpu:0` or `cuda:1`.
    fn device_name(&self) -> String;

    /// Allocates `bytes` (> 0) of device memory and returns its address.
    fn allocate(&self, bytes: usize) -> Result<usize, BackendError>;

    /// Returns memory to the device.
    ///
    /// # Safety
    /// `addr` must come from [`Backend::allocate`] on this backend with the same
    /// `bytes`, must not have been freed already, and nothing may use it after.
    unsafe fn free(&self, addr: usize, bytes: usize);

    /// The device's capacity in bytes (or this backend's limit, when it has one).
    fn total_bytes(&self) -> usize;

    /// Bytes the device could still hand out.
    fn free_bytes(&self) -> usize;

    /// Records an event on `stream`.
    fn record_event(&self, stream: StreamId) -> Result<Self::Event, BackendError>;

    /// Whether the work before `event` has finished (never blocks).
    fn event_completed(&self, event: &Self::Event) -> bool;

    /// Blocks until the work before `event` has finished.
    fn synchronize_event(&self, event: &Self::Event) -> Result<(), BackendError>;

    /// Blocks until all work on the device has finished.
    fn synchronize_device(&self) -> Result<(), BackendError>;

    /// The granularity of [`Backend::map`] in bytes, when the backend can
    /// reserve address ranges and back them with memory on demand (what
    /// expandable segments need); `None` when it cannot. The default is `None`.
    fn virtual_memory_granularity(&self) -> Option<usize> {
        None
    }

    /// Reserves `bytes` of address space with no memory behind it.
    fn reserve_address_range(&self, bytes: usize) -> Result<usize, BackendError> {
        let _ = bytes;
        Err(BackendError::Device(format!("{} cannot reserve address ranges", self.device_name())))
    }

    /// Gives a reserved address range back.
    ///
    /// # Safety
    /// `addr`/`bytes` must be exactly a range from [`Backend::reserve_address_range`]
    /// with nothing mapped in it any more.
    unsafe fn release_address_range(&self, addr: usize, bytes: usize) {
        let _ = (addr, bytes);
    }

    /// Backs `addr..addr + bytes` of a reserved range with device memory
    /// (both multiples of the granularity). Counts against the device's capacity.
    fn map(&self, addr: usize, bytes: usize) -> Result<(), BackendError> {
        let _ = (addr, bytes);
        Err(BackendError::Device(format!("{} cannot map memory into reserved ranges", self.device_name())))
    }

    /// Returns the memory behind `addr..addr + bytes` to the device; the
    /// addresses stay reserved. A device that runs asynchronously waits for
    /// queued work first (unmapping, unlike freeing, is not ordered with it).
    ///
    /// # Safety
    /// The range must be mapped (by one or more [`Backend::map`] calls, at
    /// granularity boundaries) and nothing may use it after.
    unsafe fn unmap(&self, addr: usize, bytes: usize) {
        let _ = (addr, bytes);
    }
}
