//! Pinned host memory for a device: the seam between [`HostBackend`](crate::HostBackend)
//! and a device driver that page-locks host memory and copies from it
//! asynchronously.
//!
//! A device copies from page-locked host memory by DMA, after the call that
//! queued the copy has returned. So a pinned block must not be reused (or
//! given back to the OS) before every stream that copies from it has passed
//! the copy. The caching allocator already knows how: [`Allocation::record_stream`]
//! marks a block as used by a stream, and when the block is freed the backend
//! records an event on that stream and the block waits for it (PyTorch's
//! `CachingHostAllocator` does the same with `record_event`). For host memory
//! the backend's events come from a [`HostPinning`]: the driver's events on its
//! own streams. Without one, host work is synchronous and every event is
//! complete at once.
//!
//! [`Allocation::record_stream`]: crate::Allocation::record_stream

use crate::backend::{BackendError, StreamId};
use std::fmt;

/// A device driver's way of pinning host memory and of saying when its
/// streams are done with it. brasa-tensor implements it for CUDA
/// (`cuMemHostRegister`, CUDA events); tests implement it with events they
/// complete by hand.
pub trait HostPinning: Send + Sync + 'static {
    /// Who pins, in messages: e.g. `CUDA (cuMemHostRegister)`.
    fn name(&self) -> String;

    /// Page-locks `addr..addr + bytes` (a fresh, page-aligned mapping) and
    /// makes it known to the device, so copies from it can be asynchronous.
    fn register(&self, addr: usize, bytes: usize) -> Result<(), BackendError>;

    /// Undoes [`HostPinning::register`] before the pages are unmapped.
    ///
    /// # Safety
    /// `addr..addr + bytes` must be exactly a range registered by this driver
    /// that no device work still uses.
    unsafe fn unregister(&self, addr: usize, bytes: usize);

    /// An event at the current end of `stream`'s work. `Ok(None)` when the
    /// stream is not one of the driver's (a host stream, whose work is done
    /// when its call returns).
    fn record_event(&self, stream: StreamId) -> Result<Option<Box<dyn StreamEvent>>, BackendError>;

    /// Waits for all the work queued on every stream of the driver: the
    /// fallback when an event cannot be recorded or waited for.
    fn synchronize(&self) -> Result<(), BackendError>;
}

/// An event recorded by a [`HostPinning`] on one of its streams.
pub trait StreamEvent: Send {
    /// Whether the work before the event has finished (never blocks).
    fn is_complete(&self) -> bool;

    /// Blocks until the work before the event has finished.
    fn synchronize(&self) -> Result<(), BackendError>;
}

/// The event type of [`HostBackend`](crate::HostBackend): complete when
/// recorded for host work, a device stream's event when a [`HostPinning`]
/// recorded it.
#[derive(Default)]
pub struct HostEvent(Option<Box<dyn StreamEvent>>);

impl HostEvent {
    /// An event that is already complete (host work).
    pub fn complete() -> Self {
        HostEvent(None)
    }

    /// Wraps a driver's event.
    pub fn on_device(event: Box<dyn StreamEvent>) -> Self {
        HostEvent(Some(event))
    }

    /// Whether the work before the event has finished (never blocks).
    pub fn is_complete(&self) -> bool {
        self.0.as_ref().is_none_or(|event| event.is_complete())
    }

    /// Blocks until the work before the event has finished.
    pub fn synchronize(&self) -> Result<(), BackendError> {
        self.0.as_ref().map_or(Ok(()), |event| event.synchronize())
    }
}

impl fmt::Debug for HostEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.0 {
            None => "host (complete)",
            Some(event) if event.is_complete() => "device (complete)",
            Some(_) => "device (pending)",
        };
        f.debug_tuple("HostEvent").field(&state).finish()
    }
}
