//! Each thread's current stream of each device (PyTorch's
//! `torch.cuda.current_stream`): where ops queue their work and which pool
//! their memory comes from. Streams are named by process-wide unique ids.

use crate::device::Device;
use brasa_alloc::StreamId;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

static NEXT_STREAM: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's current stream of each device that has one other than
    /// the default.
    static CURRENT: RefCell<HashMap<Device, StreamId>> = RefCell::new(HashMap::new());
}

/// A stream id no stream had before (never [`StreamId::DEFAULT`]).
pub(crate) fn next_stream_id() -> StreamId {
    StreamId(NEXT_STREAM.fetch_add(1, Ordering::Relaxed))
}

/// The id of this thread's current stream on `device`.
pub(crate) fn current_stream_id(device: Device) -> StreamId {
    CURRENT.with(|c| c.borrow().get(&device).copied().unwrap_or(StreamId::DEFAULT))
}

/// Makes `id` this thread's current stream on `device`; returns the one it replaces.
pub(crate) fn set_current_stream(device: Device, id: StreamId) -> StreamId {
    CURRENT.with(|c| c.borrow_mut().insert(device, id).unwrap_or(StreamId::DEFAULT))
}
