//! Host memory as a device: aligned allocations with an optional byte limit.
//!
//! Segments of 1 MiB and more are mapped straight from the operating system
//! (`mmap` on Unix), so releasing a segment really returns its pages; smaller
//! requests go through the global allocator.
//!
//! Pinned (page-locked) host memory is always mapped; it is locked with
//! `mlock`, or — when a device driver is given ([`HostBackend::pinned_by`]) —
//! registered with the driver, whose streams' events then decide when a block
//! that a device copied from may be reused (see [`crate::HostPinning`]).

use crate::backend::{Backend, BackendError, StreamId};
use crate::pinning::{HostEvent, HostPinning};
use std::alloc::{self, Layout};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Alignment of every host allocation: a cache line, and enough for any SIMD load.
pub const HOST_ALIGNMENT: usize = 64;

/// Requests at least this large are mapped from the OS directly.
const MAP_THRESHOLD: usize = 1 << 20;

/// Host memory, optionally limited to a number of bytes.
pub struct HostBackend {
    name: String,
    limit: Option<usize>,
    in_use: AtomicUsize,
    /// Page-locked ("pinned") memory: every allocation is mapped and locked
    /// (`mlock`, or registered with `pinning`).
    pinned: bool,
    /// The device driver that pins the memory and records the events of its
    /// streams; `None`: `mlock`, and host events.
    pinning: Option<Arc<dyn HostPinning>>,
}

impl fmt::Debug for HostBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBackend")
            .field("name", &self.name)
            .field("limit", &self.limit)
            .field("in_use", &self.in_use)
            .field("pinned", &self.pinned)
            .field("pinned_by", &self.pinning_name())
            .finish()
    }
}

impl HostBackend {
    /// Unlimited host memory named `cpu:0`.
    pub fn new() -> Self {
        Self::named("cpu:0", None)
    }

    /// Host memory that refuses to hand out more than `limit` bytes in all.
    pub fn with_limit(limit: usize) -> Self {
        Self::named("cpu:0", Some(limit))
    }

    /// A host backend with its own name (e.g. a logical device `cpu:3`) and limit.
    pub fn named(name: impl Into<String>, limit: Option<usize>) -> Self {
        HostBackend { name: name.into(), limit, in_use: AtomicUsize::new(0), pinned: false, pinning: None }
    }

    /// Page-locked host memory (what CUDA calls pinned memory): every
    /// allocation is mapped from the OS and locked in RAM with `mlock`, so the
    /// OS never pages it out and a device can copy from it asynchronously.
    /// Allocation fails with a message naming `RLIMIT_MEMLOCK` when the lock
    /// limit is reached.
    ///
    /// No device knows this memory: a device copy from it is synchronous.
    /// Use [`HostBackend::pinned_by`] for memory a device copies from asynchronously.
    pub fn pinned(name: impl Into<String>, limit: Option<usize>) -> Self {
        HostBackend { pinned: true, ..Self::named(name, limit) }
    }

    /// Page-locked host memory registered with a device driver: every
    /// allocation is mapped from the OS and handed to `pinning` (for CUDA,
    /// `cuMemHostRegister`), so the device can copy from it asynchronously.
    /// The backend's events are the driver's: a block that a device stream
    /// used ([`Allocation::record_stream`](crate::Allocation::record_stream))
    /// is reused only after that stream's work queued before its free has run.
    pub fn pinned_by(name: impl Into<String>, limit: Option<usize>, pinning: Arc<dyn HostPinning>) -> Self {
        HostBackend { pinned: true, pinning: Some(pinning), ..Self::named(name, limit) }
    }

    /// Whether this backend hands out page-locked memory.
    pub fn is_pinned(&self) -> bool {
        self.pinned
    }

    /// The driver that pins this backend's memory ([`HostPinning::name`]),
    /// `None` for plain or `mlock`ed memory.
    pub fn pinning_name(&self) -> Option<String> {
        self.pinning.as_ref().map(|p| p.name())
    }

    /// Locks a fresh mapping: registered with the driver, else `mlock`ed. On
    /// failure the mapping is left as it was (the caller undoes it).
    fn lock(&self, addr: usize, bytes: usize) -> Result<(), BackendError> {
        match &self.pinning {
            Some(pinning) => pinning.register(addr, bytes).map_err(|error| {
                BackendError::Device(format!(
                    "cannot pin {bytes} bytes of host memory with {}: {error}",
                    pinning.name()
                ))
            }),
            None => lock_pages(addr, bytes),
        }
    }

    /// Undoes [`HostBackend::lock`] before the pages go (`munmap` unlocks `mlock`ed ones).
    ///
    /// # Safety
    /// The range must be a locked range that nothing uses any more.
    unsafe fn unlock(&self, addr: usize, bytes: usize) {
        if let Some(pinning) = &self.pinning {
            // SAFETY: the caller's guarantee.
            unsafe { pinning.unregister(addr, bytes) };
        }
    }

    /// The byte limit, if any.
    pub fn limit(&self) -> Option<usize> {
        self.limit
    }

    /// Bytes currently handed out by this backend.
    pub fn bytes_in_use(&self) -> usize {
        self.in_use.load(Ordering::Relaxed)
    }

    fn reserve(&self, bytes: usize) -> Result<(), BackendError> {
        match self.limit {
            None => {
                self.in_use.fetch_add(bytes, Ordering::Relaxed);
                Ok(())
            }
            Some(limit) => self
                .in_use
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                    used.checked_add(bytes).filter(|total| *total <= limit)
                })
                .map(|_| ())
                .map_err(|_| BackendError::OutOfMemory { requested: bytes }),
        }
    }
}

impl Default for HostBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl Backend for HostBackend {
    type Event = HostEvent;

    fn device_name(&self) -> String {
        self.name.clone()
    }

    fn allocate(&self, bytes: usize) -> Result<usize, BackendError> {
        if bytes == 0 {
            return Err(BackendError::Device("host backend asked for 0 bytes".into()));
        }
        self.reserve(bytes)?;
        let result = if self.pinned {
            map_pages(bytes).and_then(|addr| match self.lock(addr, bytes) {
                Ok(()) => Ok(addr),
                Err(error) => {
                    // SAFETY: the mapping was made just above and nobody has seen it.
                    unsafe { unmap_pages(addr, bytes) };
                    Err(error)
                }
            })
        } else if bytes >= MAP_THRESHOLD {
            map_pages(bytes)
        } else {
            heap_alloc(bytes)
        };
        if result.is_err() {
            self.in_use.fetch_sub(bytes, Ordering::Relaxed);
        }
        result
    }

    unsafe fn free(&self, addr: usize, bytes: usize) {
        if self.pinned {
            // SAFETY: the caller guarantees `addr`/`bytes` came from `allocate`, so
            // were locked, and are unused.
            unsafe { self.unlock(addr, bytes) };
        }
        // Unmapping also unlocks `mlock`ed pages.
        if self.pinned || bytes >= MAP_THRESHOLD {
            // SAFETY: the caller guarantees `addr`/`bytes` came from `map_pages`.
            unsafe { unmap_pages(addr, bytes) };
        } else {
            // SAFETY: the caller guarantees `addr`/`bytes` came from `heap_alloc`.
            unsafe { alloc::dealloc(addr as *mut u8, heap_layout(bytes)) };
        }
        self.in_use.fetch_sub(bytes, Ordering::Relaxed);
    }

    fn total_bytes(&self) -> usize {
        self.limit.unwrap_or_else(|| system_memory().map(|m| m.total).unwrap_or(usize::MAX))
    }

    fn free_bytes(&self) -> usize {
        let system_free = system_memory().map(|m| m.available).unwrap_or(usize::MAX);
        match self.limit {
            Some(limit) => limit.saturating_sub(self.bytes_in_use()).min(system_free),
            None => system_free,
        }
    }

    // The host runs synchronously: an event is complete when recorded. A
    // device stream that copies from pinned memory has the driver's events.
    fn record_event(&self, stream: StreamId) -> Result<HostEvent, BackendError> {
        match &self.pinning {
            Some(pinning) => Ok(pinning.record_event(stream)?.map_or_else(HostEvent::complete, HostEvent::on_device)),
            None => Ok(HostEvent::complete()),
        }
    }

    fn event_completed(&self, event: &HostEvent) -> bool {
        event.is_complete()
    }

    fn synchronize_event(&self, event: &HostEvent) -> Result<(), BackendError> {
        event.synchronize()
    }

    fn synchronize_device(&self) -> Result<(), BackendError> {
        self.pinning.as_ref().map_or(Ok(()), |pinning| pinning.synchronize())
    }

    fn virtual_memory_granularity(&self) -> Option<usize> {
        page_size()
    }

    fn reserve_address_range(&self, bytes: usize) -> Result<usize, BackendError> {
        reserve_pages(bytes)
    }

    unsafe fn release_address_range(&self, addr: usize, bytes: usize) {
        // SAFETY: the caller passes a range from `reserve_address_range`, now unmapped.
        unsafe { unmap_pages(addr, bytes) };
    }

    fn map(&self, addr: usize, bytes: usize) -> Result<(), BackendError> {
        self.reserve(bytes)?;
        let result = commit_pages(addr, bytes).and_then(|()| {
            if self.pinned {
                self.lock(addr, bytes).inspect_err(|_| {
                    // SAFETY: the pages were committed just above and nobody has seen them.
                    unsafe { decommit_pages(addr, bytes) }
                })
            } else {
                Ok(())
            }
        });
        if result.is_err() {
            self.in_use.fetch_sub(bytes, Ordering::Relaxed);
        }
        result
    }

    unsafe fn unmap(&self, addr: usize, bytes: usize) {
        if self.pinned {
            // SAFETY: the caller passes a mapped (so locked) range that nothing uses any more.
            unsafe { self.unlock(addr, bytes) };
        }
        // SAFETY: the caller passes a committed range that nothing uses any more.
        unsafe { decommit_pages(addr, bytes) };
        self.in_use.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// The operating system's page size, the granularity of address-range mapping.
#[cfg(unix)]
fn page_size() -> Option<usize> {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).ok().filter(|s| s.is_power_of_two())
}

#[cfg(not(unix))]
fn page_size() -> Option<usize> {
    None
}

/// Reserves address space only: no access, no memory, not counted against
/// overcommit (`MAP_NORESERVE`).
#[cfg(unix)]
fn reserve_pages(bytes: usize) -> Result<usize, BackendError> {
    // SAFETY: an anonymous private mapping with no address hint has no preconditions.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        let error = std::io::Error::last_os_error();
        Err(BackendError::Device(format!("cannot reserve {bytes} bytes of address space: {error}")))
    } else {
        Ok(ptr as usize)
    }
}

#[cfg(not(unix))]
fn reserve_pages(bytes: usize) -> Result<usize, BackendError> {
    Err(BackendError::Device(format!("cannot reserve {bytes} bytes of address space on this platform")))
}

/// Makes reserved pages readable and writable; the kernel backs them on first touch.
#[cfg(unix)]
fn commit_pages(addr: usize, bytes: usize) -> Result<(), BackendError> {
    // SAFETY: the range lies in a reservation made by `reserve_pages`.
    if unsafe { libc::mprotect(addr as *mut libc::c_void, bytes, libc::PROT_READ | libc::PROT_WRITE) } == 0 {
        Ok(())
    } else {
        Err(BackendError::OutOfMemory { requested: bytes })
    }
}

#[cfg(not(unix))]
fn commit_pages(_addr: usize, bytes: usize) -> Result<(), BackendError> {
    Err(BackendError::OutOfMemory { requested: bytes })
}

/// Throws the pages' contents away and makes them inaccessible again, keeping
/// the addresses reserved: a fresh `PROT_NONE` mapping laid over the range.
#[cfg(unix)]
unsafe fn decommit_pages(addr: usize, bytes: usize) {
    // SAFETY: `MAP_FIXED` over a range of our own reservation replaces just that range.
    unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            bytes,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
}

#[cfg(not(unix))]
unsafe fn decommit_pages(_addr: usize, _bytes: usize) {}

fn heap_layout(bytes: usize) -> Layout {
    // `bytes` > 0 and the alignment is a power of two; sizes this small never overflow.
    Layout::from_size_align(bytes, HOST_ALIGNMENT).unwrap_or(Layout::new::<u8>())
}

fn heap_alloc(bytes: usize) -> Result<usize, BackendError> {
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { alloc::alloc(heap_layout(bytes)) };
    if ptr.is_null() {
        Err(BackendError::OutOfMemory { requested: bytes })
    } else {
        Ok(ptr as usize)
    }
}

#[cfg(unix)]
fn map_pages(bytes: usize) -> Result<usize, BackendError> {
    // SAFETY: an anonymous private mapping with no address hint has no preconditions.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        Err(BackendError::OutOfMemory { requested: bytes })
    } else {
        Ok(ptr as usize)
    }
}

#[cfg(unix)]
unsafe fn unmap_pages(addr: usize, bytes: usize) {
    // SAFETY: the caller passes a mapping made by `map_pages` with the same length.
    unsafe { libc::munmap(addr as *mut libc::c_void, bytes) };
}

/// Locks a fresh mapping in RAM, or says why not (the caller unmaps it).
#[cfg(unix)]
fn lock_pages(addr: usize, bytes: usize) -> Result<(), BackendError> {
    // SAFETY: `addr..addr + bytes` is a mapping this backend just made.
    if unsafe { libc::mlock(addr as *const libc::c_void, bytes) } == 0 {
        return Ok(());
    }
    let error = std::io::Error::last_os_error();
    Err(BackendError::Device(format!(
        "cannot pin {bytes} bytes of host memory (mlock: {error}); raise the locked-memory limit \
         (RLIMIT_MEMLOCK, `ulimit -l`) or pin less"
    )))
}

#[cfg(not(unix))]
fn lock_pages(_addr: usize, _bytes: usize) -> Result<(), BackendError> {
    Ok(())
}

#[cfg(not(unix))]
fn map_pages(bytes: usize) -> Result<usize, BackendError> {
    heap_alloc(bytes)
}

#[cfg(not(unix))]
unsafe fn unmap_pages(addr: usize, bytes: usize) {
    // SAFETY: on this platform `map_pages` is `heap_alloc`.
    unsafe { alloc::dealloc(addr as *mut u8, heap_layout(bytes)) };
}

struct SystemMemory {
    total: usize,
    available: usize,
}

/// Total and available memory from `/proc/meminfo` (Linux only).
fn system_memory() -> Option<SystemMemory> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<usize> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    };
    Some(SystemMemory { total: field("MemTotal:")?, available: field("MemAvailable:")? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_aligned_and_writable() {
        let backend = HostBackend::new();
        for bytes in [1, 100, 4096, MAP_THRESHOLD, 3 * MAP_THRESHOLD + 7] {
            let addr = backend.allocate(bytes).unwrap();
            assert_eq!(addr % HOST_ALIGNMENT, 0);
            // SAFETY: `addr` points at `bytes` writable bytes we own.
            unsafe {
                std::ptr::write_bytes(addr as *mut u8, 0xAB, bytes);
                backend.free(addr, bytes);
            }
        }
        assert_eq!(backend.bytes_in_use(), 0);
    }

    #[test]
    fn pinned_memory_is_mapped_and_locked_or_says_why_not() {
        let backend = HostBackend::pinned("cpu:pinned", None);
        assert!(backend.is_pinned());
        match backend.allocate(64 << 10) {
            Ok(addr) => {
                assert_eq!(addr % 4096, 0, "pinned memory is whole pages");
                // SAFETY: allocated just above with this size.
                unsafe { backend.free(addr, 64 << 10) };
            }
            Err(error) => assert!(error.to_string().contains("RLIMIT_MEMLOCK"), "{error}"),
        }
        assert_eq!(backend.bytes_in_use(), 0);
    }

    #[test]
    fn reserved_ranges_are_backed_on_demand_and_counted() {
        let backend = HostBackend::with_limit(8 << 20);
        let page = backend.virtual_memory_granularity().unwrap();
        assert!(page.is_power_of_two());
        let range = 64 << 20;
        let base = backend.reserve_address_range(range).unwrap();
        assert_eq!(backend.bytes_in_use(), 0, "reserving costs nothing");
        backend.map(base, 4 << 20).unwrap();
        backend.map(base + (8 << 20), 4 << 20).unwrap();
        assert_eq!(backend.bytes_in_use(), 8 << 20);
        assert_eq!(backend.map(base + (16 << 20), 2 << 20), Err(BackendError::OutOfMemory { requested: 2 << 20 }));
        // SAFETY: the first 4 MiB are mapped and ours.
        unsafe {
            std::ptr::write_bytes(base as *mut u8, 0x5A, 4 << 20);
            backend.unmap(base, 2 << 20);
        }
        assert_eq!(backend.bytes_in_use(), 6 << 20);
        // Mapping again gives fresh zeroed pages.
        backend.map(base, 2 << 20).unwrap();
        // SAFETY: mapped just above.
        assert_eq!(unsafe { *(base as *const u8) }, 0);
        // SAFETY: unmapping what is mapped, then releasing the whole reservation.
        unsafe {
            backend.unmap(base, 4 << 20);
            backend.unmap(base + (8 << 20), 4 << 20);
            backend.release_address_range(base, range);
        }
        assert_eq!(backend.bytes_in_use(), 0);
    }

    #[test]
    fn limit_is_enforced_and_released() {
        let backend = HostBackend::with_limit(3 << 20);
        let a = backend.allocate(2 << 20).unwrap();
        assert_eq!(backend.allocate(2 << 20), Err(BackendError::OutOfMemory { requested: 2 << 20 }));
        assert_eq!(backend.free_bytes(), 1 << 20);
        // SAFETY: `a` was allocated above with this size.
        unsafe { backend.free(a, 2 << 20) };
        let b = backend.allocate(2 << 20).unwrap();
        // SAFETY: `b` was allocated above with this size.
        unsafe { backend.free(b, 2 << 20) };
        assert_eq!(backend.total_bytes(), 3 << 20);
    }
}
