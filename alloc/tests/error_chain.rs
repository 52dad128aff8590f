//! A backend failure keeps its structure: the allocator's error has the
//! backend's own error as its `source()`, found by `downcast_ref`, and is
//! not mistaken for an out of memory.

use brasa_alloc::{find_out_of_memory, AllocError, Backend, BackendError, CachingAllocator, StreamId};
use std::error::Error;

/// A device whose every allocation fails with a driver error.
struct FellOff;

impl Backend for FellOff {
    type Event = ();

    fn device_name(&self) -> String {
        "test:7".into()
    }

    fn allocate(&self, _bytes: usize) -> Result<usize, BackendError> {
        Err(BackendError::Device("the device fell off the bus".into()))
    }

    unsafe fn free(&self, _addr: usize, _bytes: usize) {}

    fn total_bytes(&self) -> usize {
        1 << 30
    }

    fn free_bytes(&self) -> usize {
        1 << 30
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
}

#[test]
fn a_backend_failure_is_the_source_of_the_allocator_error() {
    let allocator = CachingAllocator::new(FellOff);
    let error = allocator.allocate(1 << 20, StreamId::DEFAULT).unwrap_err();
    let AllocError::Backend { device, source } = &error else { panic!("not a backend error: {error:?}") };
    assert_eq!(device, "test:7");
    assert_eq!(source, &BackendError::Device("the device fell off the bus".into()));
    // Through `std::error::Error`, as any reporter walks it.
    let below = error.source().and_then(|e| e.downcast_ref::<BackendError>());
    assert_eq!(below, Some(&BackendError::Device("the device fell off the bus".into())));
    assert_eq!(error.to_string(), "device error on test:7: the device fell off the bus");
    assert!(error.as_out_of_memory().is_none() && find_out_of_memory(&error).is_none());
}
