//! A backend failure keeps its structure: the allocator's error has the
//! backend's own error as its `source()`, found by `downcast_ref`, and is
//! not mistaken for an out of memory.

use brasa_alloc::{find_out_of_memory, AllocError, BackendError, CachingAllocator, FailingBackend, StreamId};
use std::error::Error;

#[test]
fn a_backend_failure_is_the_source_of_the_allocator_error() {
    let backend = FailingBackend::new(64 << 20);
    backend.fail_allocations_with_device_error(Some("the device fell off the bus"));
    let allocator = CachingAllocator::new(backend);
    let error = allocator.allocate(1 << 20, StreamId::DEFAULT).unwrap_err();
    let AllocError::Backend { device, source } = &error else { panic!("not a backend error: {error:?}") };
    assert_eq!(device, "test:0");
    assert_eq!(source, &BackendError::Device("the device fell off the bus".into()));
    // Through `std::error::Error`, as any reporter walks it.
    let below = error.source().and_then(|e| e.downcast_ref::<BackendError>());
    assert_eq!(below, Some(&BackendError::Device("the device fell off the bus".into())));
    assert_eq!(error.to_string(), "device error on test:0: the device fell off the bus");
    assert!(error.as_out_of_memory().is_none() && find_out_of_memory(&error).is_none());
}
