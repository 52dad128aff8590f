//! A backend for tests: host memory with a capacity, failures on command, and
//! events that complete only when the test says so.
//!
//! ```
//! use brasa_alloc::{CachingAllocator, FailingBackend, StreamId};
//! let backend = FailingBackend::new(64 << 20);
//! let alloc = CachingAllocator::new(backend.clone());
//! backend.fail_all_allocations(true);
//! let error = alloc.allocate(4 << 20, StreamId::DEFAULT).unwrap_err();
//! assert!(error.to_string().contains("out of memory on test:0"));
//! backend.fail_all_allocations(false);
//! assert!(alloc.allocate(4 << 20, StreamId::DEFAULT).is_ok());
//! ```

use crate::backend::{Backend, BackendError, StreamId};
use crate::host::HostBackend;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// An event of the [`FailingBackend`]: complete once the test calls
/// [`FailingBackend::complete_events`] (or at once when auto-completion is on).
#[derive(Debug, Clone)]
pub struct TestEvent {
    done: Arc<AtomicBool>,
    stream: StreamId,
}

impl TestEvent {
    /// The stream the event was recorded on.
    pub fn stream(&self) -> StreamId {
        self.stream
    }
}

#[derive(Debug)]
struct Inner {
    memory: HostBackend,
    fail_next: AtomicUsize,
    fail_all: AtomicBool,
    fail_sync: AtomicBool,
    device_error: Mutex<Option<String>>,
    auto_complete: AtomicBool,
    allocations: AtomicU64,
    frees: AtomicU64,
    events: Mutex<Vec<TestEvent>>,
}

/// Host memory with a capacity that fails allocations on command; clones share state.
#[derive(Debug, Clone)]
pub struct FailingBackend {
    inner: Arc<Inner>,
}

impl FailingBackend {
    /// A device of `capacity` bytes named `test:0`.
    pub fn new(capacity: usize) -> Self {
        FailingBackend {
            inner: Arc::new(Inner {
                memory: HostBackend::named("test:0", Some(capacity)),
                fail_next: AtomicUsize::new(0),
                fail_all: AtomicBool::new(false),
                fail_sync: AtomicBool::new(false),
                device_error: Mutex::new(None),
                auto_complete: AtomicBool::new(false),
                allocations: AtomicU64::new(0),
                frees: AtomicU64::new(0),
                events: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The next `count` allocations fail with out-of-memory, whatever the capacity.
    pub fn fail_next_allocations(&self, count: usize) {
        self.inner.fail_next.store(count, Ordering::SeqCst);
    }

    /// Every allocation fails while `fail` is true.
    pub fn fail_all_allocations(&self, fail: bool) {
        self.inner.fail_all.store(fail, Ordering::SeqCst);
    }

    /// While `message` is `Some`, every allocation fails with that device
    /// error (a driver failure other than out-of-memory), whatever the
    /// capacity.
    pub fn fail_allocations_with_device_error(&self, message: Option<&str>) {
        *self.inner.device_error.lock().unwrap_or_else(|e| e.into_inner()) = message.map(str::to_owned);
    }

    /// While `fail` is true, the device cannot be synchronised: recording an
    /// event, waiting for one and waiting for the device all fail (a lost
    /// device or a sticky CUDA error), and events never complete.
    pub fn fail_synchronization(&self, fail: bool) {
        self.inner.fail_sync.store(fail, Ordering::SeqCst);
    }

    fn sync_failure(&self, what: &str) -> Result<(), BackendError> {
        if self.inner.fail_sync.load(Ordering::SeqCst) {
            return Err(BackendError::Device(format!("{what} failed on test:0 (injected)")));
        }
        Ok(())
    }

    /// When true, events are complete as soon as they are recorded.
    pub fn auto_complete_events(&self, auto: bool) {
        self.inner.auto_complete.store(auto, Ordering::SeqCst);
    }

    /// Completes every event recorded so far.
    pub fn complete_events(&self) {
        let mut events = self.inner.events.lock().unwrap_or_else(|e| e.into_inner());
        for event in events.drain(..) {
            event.done.store(true, Ordering::SeqCst);
        }
    }

    /// Events recorded and not yet completed.
    pub fn pending_events(&self) -> usize {
        let events = self.inner.events.lock().unwrap_or_else(|e| e.into_inner());
        events.iter().filter(|e| !e.done.load(Ordering::SeqCst)).count()
    }

    /// Successful backend allocations (and mappings) so far.
    pub fn allocation_count(&self) -> u64 {
        self.inner.allocations.load(Ordering::SeqCst)
    }

    /// Backend frees (and unmappings) so far.
    pub fn free_count(&self) -> u64 {
        self.inner.frees.load(Ordering::SeqCst)
    }

    /// Bytes currently held from this backend.
    pub fn bytes_in_use(&self) -> usize {
        self.inner.memory.bytes_in_use()
    }
}

impl Backend for FailingBackend {
    type Event = TestEvent;

    fn device_name(&self) -> String {
        self.inner.memory.device_name()
    }

    fn allocate(&self, bytes: usize) -> Result<usize, BackendError> {
        self.inject_failure(bytes)?;
        let addr = self.inner.memory.allocate(bytes)?;
        self.inner.allocations.fetch_add(1, Ordering::SeqCst);
        Ok(addr)
    }

    unsafe fn free(&self, addr: usize, bytes: usize) {
        // SAFETY: forwarded under the caller's guarantee.
        unsafe { self.inner.memory.free(addr, bytes) };
        self.inner.frees.fetch_add(1, Ordering::SeqCst);
    }

    fn total_bytes(&self) -> usize {
        self.inner.memory.total_bytes()
    }

    fn free_bytes(&self) -> usize {
        self.inner.memory.free_bytes()
    }

    fn record_event(&self, stream: StreamId) -> Result<TestEvent, BackendError> {
        self.sync_failure("record_event")?;
        let done = self.inner.auto_complete.load(Ordering::SeqCst);
        let event = TestEvent { done: Arc::new(AtomicBool::new(done)), stream };
        if !done {
            let mut events = self.inner.events.lock().unwrap_or_else(|e| e.into_inner());
            events.push(event.clone());
        }
        Ok(event)
    }

    fn event_completed(&self, event: &TestEvent) -> bool {
        !self.inner.fail_sync.load(Ordering::SeqCst) && event.done.load(Ordering::SeqCst)
    }

    fn synchronize_event(&self, event: &TestEvent) -> Result<(), BackendError> {
        self.sync_failure("synchronize_event")?;
        // Waiting for the stream means its work, and so the event, is done.
        event.done.store(true, Ordering::SeqCst);
        Ok(())
    }

    fn synchronize_device(&self) -> Result<(), BackendError> {
        self.sync_failure("synchronize_device")?;
        self.complete_events();
        Ok(())
    }

    fn virtual_memory_granularity(&self) -> Option<usize> {
        self.inner.memory.virtual_memory_granularity()
    }

    fn reserve_address_range(&self, bytes: usize) -> Result<usize, BackendError> {
        self.inner.memory.reserve_address_range(bytes)
    }

    unsafe fn release_address_range(&self, addr: usize, bytes: usize) {
        // SAFETY: forwarded under the caller's guarantee.
        unsafe { self.inner.memory.release_address_range(addr, bytes) };
    }

    /// Counts as an allocation, and fails on command like one.
    fn map(&self, addr: usize, bytes: usize) -> Result<(), BackendError> {
        self.inject_failure(bytes)?;
        self.inner.memory.map(addr, bytes)?;
        self.inner.allocations.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Counts as a free.
    unsafe fn unmap(&self, addr: usize, bytes: usize) {
        // SAFETY: forwarded under the caller's guarantee.
        unsafe { self.inner.memory.unmap(addr, bytes) };
        self.inner.frees.fetch_add(1, Ordering::SeqCst);
    }
}

impl FailingBackend {
    /// The failure the test asked for, if this call should fail.
    fn inject_failure(&self, bytes: usize) -> Result<(), BackendError> {
        if let Some(message) = self.inner.device_error.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Err(BackendError::Device(message));
        }
        let injected = self.inner.fail_all.load(Ordering::SeqCst)
            || self.inner.fail_next.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        if injected {
            Err(BackendError::OutOfMemory { requested: bytes })
        } else {
            Ok(())
        }
    }
}
