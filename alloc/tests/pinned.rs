//! Pinned host memory registered with a device driver ([`HostPinning`]): the
//! driver pins every segment and unpins it before it is unmapped, and a block
//! that a device stream copied from is reused only after that stream's event
//! (PyTorch's `CachingHostAllocator`), here with a fake driver whose events
//! the test completes by hand.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use brasa_alloc::{
    AllocError, Backend, BackendError, BlockState, CachingAllocator, HostBackend, HostPinning, StreamEvent, StreamId,
};

const MIB: usize = 1 << 20;
/// The one stream the fake driver owns.
const COPY_STREAM: StreamId = StreamId(7);

#[derive(Default)]
struct FakeDriver {
    registered: Mutex<BTreeMap<usize, usize>>,
    events: Mutex<Vec<Arc<AtomicBool>>>,
    fail_register: AtomicBool,
    fail_record: AtomicBool,
    device_syncs: AtomicUsize,
    event_syncs: Arc<AtomicUsize>,
}

impl FakeDriver {
    fn complete_all(&self) {
        for event in self.events.lock().unwrap().iter() {
            event.store(true, Ordering::SeqCst);
        }
    }

    fn registered_bytes(&self) -> usize {
        self.registered.lock().unwrap().values().sum()
    }
}

struct FakeEvent {
    done: Arc<AtomicBool>,
    syncs: Arc<AtomicUsize>,
}

impl StreamEvent for FakeEvent {
    fn is_complete(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }
    fn synchronize(&self) -> Result<(), BackendError> {
        // Waiting for the event: the device runs the stream up to it.
        self.syncs.fetch_add(1, Ordering::SeqCst);
        self.done.store(true, Ordering::SeqCst);
        Ok(())
    }
}

/// The driver as the backend holds it; the test keeps the other handle.
struct Driver(Arc<FakeDriver>);

impl std::ops::Deref for Driver {
    type Target = FakeDriver;
    fn deref(&self) -> &FakeDriver {
        &self.0
    }
}

impl HostPinning for Driver {
    fn name(&self) -> String {
        "fake driver".into()
    }
    fn register(&self, addr: usize, bytes: usize) -> Result<(), BackendError> {
        if self.fail_register.load(Ordering::SeqCst) {
            return Err(BackendError::Device("register refused (injected)".into()));
        }
        assert!(self.registered.lock().unwrap().insert(addr, bytes).is_none(), "registered twice");
        Ok(())
    }
    unsafe fn unregister(&self, addr: usize, bytes: usize) {
        assert_eq!(self.registered.lock().unwrap().remove(&addr), Some(bytes), "unregistered what was registered");
    }
    fn record_event(&self, stream: StreamId) -> Result<Option<Box<dyn StreamEvent>>, BackendError> {
        if stream != COPY_STREAM {
            return Ok(None);
        }
        if self.fail_record.load(Ordering::SeqCst) {
            return Err(BackendError::Device("cannot record (injected)".into()));
        }
        let done = Arc::new(AtomicBool::new(false));
        self.events.lock().unwrap().push(Arc::clone(&done));
        Ok(Some(Box::new(FakeEvent { done, syncs: Arc::clone(&self.event_syncs) })))
    }
    fn synchronize(&self) -> Result<(), BackendError> {
        self.device_syncs.fetch_add(1, Ordering::SeqCst);
        self.complete_all();
        Ok(())
    }
}

fn pinned() -> (Arc<FakeDriver>, CachingAllocator<HostBackend>) {
    let driver = Arc::new(FakeDriver::default());
    let backend = HostBackend::pinned_by("cpu:pinned", None, Arc::new(Driver(Arc::clone(&driver))));
    (driver, CachingAllocator::new(backend))
}

#[test]
fn segments_are_registered_with_the_driver_and_unregistered_before_unmapping() {
    let (driver, alloc) = pinned();
    assert!(alloc.backend().is_pinned());
    assert_eq!(alloc.backend().pinning_name().as_deref(), Some("fake driver"));
    let a = alloc.allocate(4 * MIB, StreamId::DEFAULT).unwrap();
    assert_eq!(driver.registered_bytes(), alloc.reserved_bytes());
    // SAFETY: the block is ours and 4 MiB long: pinned memory is ordinary host memory.
    unsafe { std::ptr::write_bytes(a.addr() as *mut u8, 0x5A, 4 * MIB) };
    drop(a);
    assert!(driver.registered_bytes() > 0, "cached, still pinned");
    alloc.empty_cache();
    assert_eq!(alloc.reserved_bytes(), 0);
    assert_eq!(driver.registered_bytes(), 0);
}

#[test]
fn a_block_a_device_stream_copied_from_waits_for_its_event() {
    let (driver, alloc) = pinned();
    let source = alloc.allocate(4 * MIB, StreamId::DEFAULT).unwrap();
    let source_addr = source.addr();
    // A non-blocking copy from `source` was queued on the driver's stream.
    source.record_stream(COPY_STREAM);
    drop(source);
    assert_eq!(alloc.stats().active_bytes.all.current, 4 * MIB as i64, "freed, awaiting the copy");
    let state = alloc.snapshot().segments[0].blocks[0].state;
    assert_eq!(state, BlockState::ActiveAwaitingFree);

    // The copy has not run: a new pin gets other memory.
    let other = alloc.allocate(4 * MIB, StreamId::DEFAULT).unwrap();
    assert_ne!(other.addr(), source_addr, "reused before the copy ran");
    drop(other);

    // The stream passes the event: the block is free again.
    driver.complete_all();
    let again = alloc.allocate(4 * MIB, StreamId::DEFAULT).unwrap();
    assert_eq!(again.addr(), source_addr, "best fit takes the block back once its copy ran");
    assert_eq!(driver.device_syncs.load(Ordering::SeqCst), 0, "never waited on the device");
    assert_eq!(driver.event_syncs.load(Ordering::SeqCst), 0, "never waited on the event");
}

#[test]
fn streams_the_driver_does_not_own_need_no_event() {
    let (driver, alloc) = pinned();
    let block = alloc.allocate(MIB, StreamId::DEFAULT).unwrap();
    let addr = block.addr();
    block.record_stream(StreamId(3)); // a host stream: its work is done
    drop(block);
    assert!(driver.events.lock().unwrap().is_empty());
    assert_eq!(alloc.allocate(MIB, StreamId::DEFAULT).unwrap().addr(), addr);
}

#[test]
fn empty_cache_waits_for_pending_copies_before_unpinning() {
    let (driver, alloc) = pinned();
    let block = alloc.allocate(4 * MIB, StreamId::DEFAULT).unwrap();
    block.record_stream(COPY_STREAM);
    drop(block);
    alloc.empty_cache();
    assert_eq!(driver.event_syncs.load(Ordering::SeqCst), 1, "waited for the copy's event");
    assert_eq!(alloc.reserved_bytes(), 0);
    assert_eq!(driver.registered_bytes(), 0);
}

#[test]
fn without_an_event_the_free_waits_for_the_whole_device() {
    let (driver, alloc) = pinned();
    let block = alloc.allocate(MIB, StreamId::DEFAULT).unwrap();
    let addr = block.addr();
    block.record_stream(COPY_STREAM);
    driver.fail_record.store(true, Ordering::SeqCst);
    drop(block);
    assert_eq!(driver.device_syncs.load(Ordering::SeqCst), 1);
    assert_eq!(alloc.allocate(MIB, StreamId::DEFAULT).unwrap().addr(), addr, "safe to reuse after the wait");
}

#[test]
fn a_driver_that_refuses_to_pin_is_an_error_that_names_it() {
    let (driver, alloc) = pinned();
    driver.fail_register.store(true, Ordering::SeqCst);
    let error = alloc.allocate(MIB, StreamId::DEFAULT).err().unwrap();
    // A backend error (not an out-of-memory) whose words name the driver.
    let AllocError::Backend { device, source: BackendError::Device(message) } = &error else {
        panic!("expected a backend error, got {error:?}")
    };
    assert_eq!(device, "cpu:pinned");
    assert!(message.contains("fake driver") && message.contains("register refused"), "{message}");
    assert_eq!(alloc.backend().bytes_in_use(), 0, "the mapping was given back");
    assert_eq!(alloc.reserved_bytes(), 0);
}

#[test]
fn plain_host_memory_events_are_complete_at_once() {
    let backend = HostBackend::new();
    let event = backend.record_event(COPY_STREAM).unwrap();
    assert!(backend.event_completed(&event));
    backend.synchronize_event(&event).unwrap();
    assert_eq!(backend.pinning_name(), None);
}
