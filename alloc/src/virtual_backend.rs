//! [`VirtualBackend`]: a device that hands out addresses and no memory, so a
//! [`CachingAllocator`](crate::CachingAllocator) can run its real policy
//! (rounding, pools, splitting, segments, expandable segments, the
//! out-of-memory ladder) over a device that is not there.
//!
//! It is what a memory plan runs on: a virtual backend *imitating* a target
//! (a CUDA device of some capacity, a host device with a byte limit) takes
//! the target's capacity and page granularity, refuses an allocation exactly
//! where the target would, and counts the bytes it "holds". Nothing is ever
//! mapped and the addresses must never be dereferenced.
//!
//! ```
//! use brasa_alloc::{CachingAllocator, StreamId, VirtualBackend};
//!
//! // An 80 GiB device, planned on a machine that has far less memory.
//! let alloc = CachingAllocator::new(VirtualBackend::new("meta:cuda:0", 80 << 30));
//! let block = alloc.allocate(30 << 30, StreamId::DEFAULT)?;
//! assert_eq!(alloc.reserved_bytes(), 30 << 30);
//! assert!(alloc.allocate(60 << 30, StreamId::DEFAULT).is_err());   // as the device would
//! drop(block);
//! # Ok::<(), brasa_alloc::AllocError>(())
//! ```

use crate::backend::{Backend, BackendError, StreamId};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Where the first made-up address starts: far from zero (so no address is
/// null) and aligned for any page size.
const FIRST_ADDRESS: usize = 1 << 40;

/// Made-up addresses are aligned to this (the host allocator's 64 bytes
/// would do; a page keeps mapped ranges page-aligned as well).
const ADDRESS_ALIGNMENT: usize = 4096;

/// A device with a capacity and no memory, for plans run through a caching allocator.
#[derive(Debug)]
pub struct VirtualBackend {
    name: String,
    capacity: usize,
    granularity: Option<usize>,
    in_use: AtomicUsize,
    next_address: AtomicUsize,
}

impl VirtualBackend {
    /// A virtual device called `name` that holds at most `capacity` bytes
    /// and cannot map pages into reserved ranges (no expandable segments).
    pub fn new(name: impl Into<String>, capacity: usize) -> Self {
        VirtualBackend {
            name: name.into(),
            capacity,
            granularity: None,
            in_use: AtomicUsize::new(0),
            next_address: AtomicUsize::new(FIRST_ADDRESS),
        }
    }

    /// The same device, able to reserve address ranges and back them in
    /// pages of `granularity` bytes (a power of two), as the imitated
    /// device does: the host's page size, or CUDA's allocation granularity
    /// (2 MiB). Expandable segments need it.
    pub fn with_granularity(mut self, granularity: usize) -> Self {
        debug_assert!(granularity.is_power_of_two(), "a page size is a power of two");
        self.granularity = Some(granularity);
        self
    }

    /// Bytes currently "held" by the allocator above (segments and mapped pages).
    pub fn bytes_in_use(&self) -> usize {
        self.in_use.load(Ordering::Relaxed)
    }

    /// The capacity it imitates.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Counts `bytes` against the capacity, or refuses as the device would.
    fn hold(&self, bytes: usize) -> Result<(), BackendError> {
        self.in_use
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.capacity)
            })
            .map(|_| ())
            .map_err(|_| BackendError::OutOfMemory { requested: bytes })
    }

    /// A fresh address range of `bytes`, never handed out before.
    fn fresh_addresses(&self, bytes: usize) -> Result<usize, BackendError> {
        let span = bytes.checked_next_multiple_of(ADDRESS_ALIGNMENT).ok_or_else(|| self.exhausted(bytes))?;
        let mut start = 0;
        self.next_address
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |next| {
                start = next;
                next.checked_add(span)
            })
            .map(|_| start)
            .map_err(|_| self.exhausted(bytes))
    }

    fn exhausted(&self, bytes: usize) -> BackendError {
        BackendError::Device(format!("{}: no virtual addresses left for {bytes} bytes", self.name))
    }
}

impl Backend for VirtualBackend {
    /// Nothing runs on a virtual device: every event is complete.
    type Event = ();

    fn device_name(&self) -> String {
        self.name.clone()
    }

    fn allocate(&self, bytes: usize) -> Result<usize, BackendError> {
        if bytes == 0 {
            return Err(BackendError::Device(format!("{} asked for 0 bytes", self.name)));
        }
        self.hold(bytes)?;
        self.fresh_addresses(bytes).inspect_err(|_| {
            self.in_use.fetch_sub(bytes, Ordering::Relaxed);
        })
    }

    unsafe fn free(&self, _addr: usize, bytes: usize) {
        self.in_use.fetch_sub(bytes, Ordering::Relaxed);
    }

    fn total_bytes(&self) -> usize {
        self.capacity
    }

    fn free_bytes(&self) -> usize {
        self.capacity.saturating_sub(self.bytes_in_use())
    }

    fn record_event(&self, _stream: StreamId) -> Result<(), BackendError> {
        Ok(())
    }

    fn event_completed(&self, _event: &()) -> bool {
        true
    }

    fn synchronize_event(&self, _event: &()) -> Result<(), BackendError> {
        Ok(())
    }

    fn synchronize_device(&self) -> Result<(), BackendError> {
        Ok(())
    }

    fn virtual_memory_granularity(&self) -> Option<usize> {
        self.granularity
    }

    fn reserve_address_range(&self, bytes: usize) -> Result<usize, BackendError> {
        if self.granularity.is_none() {
            return Err(BackendError::Device(format!("{} cannot reserve address ranges", self.name)));
        }
        self.fresh_addresses(bytes)
    }

    unsafe fn release_address_range(&self, _addr: usize, _bytes: usize) {}

    fn map(&self, _addr: usize, bytes: usize) -> Result<(), BackendError> {
        if self.granularity.is_none() {
            return Err(BackendError::Device(format!("{} cannot map memory into reserved ranges", self.name)));
        }
        self.hold(bytes)
    }

    unsafe fn unmap(&self, _addr: usize, bytes: usize) {
        self.in_use.fetch_sub(bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AllocatorConfig, CachingAllocator, HostBackend};

    #[test]
    fn capacity_is_enforced_and_addresses_are_fresh() {
        let backend = VirtualBackend::new("meta", 10 << 20);
        let a = backend.allocate(4 << 20).unwrap();
        let b = backend.allocate(4 << 20).unwrap();
        assert!(b >= a + (4 << 20), "ranges never overlap");
        assert_eq!(backend.allocate(4 << 20), Err(BackendError::OutOfMemory { requested: 4 << 20 }));
        // SAFETY: `a` came from `allocate` with these bytes.
        unsafe { backend.free(a, 4 << 20) };
        assert_eq!(backend.bytes_in_use(), 4 << 20);
        assert_ne!(backend.allocate(4 << 20).unwrap(), a, "a freed range is not handed out again");
    }

    #[test]
    fn the_caching_allocator_over_it_matches_a_limited_host_device() {
        // The same requests on a real host device with a limit and on a
        // virtual one imitating it give the same statistics, to the byte,
        // and fail at the same request.
        for expandable in [false, true] {
            let config = AllocatorConfig::builder().expandable_segments(expandable).build().unwrap();
            let limit = 48 << 20;
            let host = CachingAllocator::with_config(HostBackend::with_limit(limit), config.clone());
            let page = HostBackend::new().virtual_memory_granularity().unwrap();
            let virt = CachingAllocator::with_config(VirtualBackend::new("meta", limit).with_granularity(page), config);
            let sizes = [100usize, 3 << 20, 700 << 10, 12 << 20, 5, 9 << 20, 30 << 20, 1 << 20];
            let (mut kept_host, mut kept_virt) = (Vec::new(), Vec::new());
            for (i, &size) in sizes.iter().enumerate() {
                let (h, v) = (host.allocate(size, StreamId::DEFAULT), virt.allocate(size, StreamId::DEFAULT));
                assert_eq!(h.is_ok(), v.is_ok(), "request {i} of {size} bytes (expandable {expandable})");
                if i % 3 != 2 {
                    kept_host.extend(h.ok());
                    kept_virt.extend(v.ok());
                }
                let (hs, vs) = (host.stats(), virt.stats());
                assert_eq!(hs.allocated_bytes, vs.allocated_bytes, "request {i}");
                assert_eq!(hs.reserved_bytes, vs.reserved_bytes, "request {i}");
            }
        }
    }
}
