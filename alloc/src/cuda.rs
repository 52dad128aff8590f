//! CUDA device memory through cudarc's driver API (feature `cuda`).
//!
//! The driver library is loaded at run time: a machine without it gets an
//! `Err` from [`CudaBackend::new`], never a panic. Events come from a pool of
//! timing-disabled events, as PyTorch's allocator keeps them.

use crate::backend::{Backend, BackendError, StreamId};
use cudarc::driver::{result, sys, CudaContext, CudaStream};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

fn device_error(what: &str, error: impl std::fmt::Debug) -> BackendError {
    BackendError::Device(format!("{what}: {error:?}"))
}

/// A pool of reusable timing-disabled events.
#[derive(Default)]
struct EventPool {
    free: Mutex<Vec<RawEvent>>,
}

struct RawEvent(sys::CUevent);

// SAFETY: a CUevent handle may be used from any thread of the process.
unsafe impl Send for RawEvent {}

impl Drop for RawEvent {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `event::create` and is dropped once.
        let _ = unsafe { result::event::destroy(self.0) };
    }
}

/// An event recorded on a stream; returns to its pool when dropped.
pub struct CudaEvent {
    raw: Option<RawEvent>,
    pool: Arc<EventPool>,
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take() {
            self.pool.free.lock().unwrap_or_else(|e| e.into_inner()).push(raw);
        }
    }
}

struct RegisteredStream(Arc<CudaStream>);

/// Memory of one CUDA device.
pub struct CudaBackend {
    context: Arc<CudaContext>,
    streams: Mutex<HashMap<StreamId, RegisteredStream>>,
    events: Arc<EventPool>,
}

impl CudaBackend {
    /// The backend of device `ordinal`, or an `Err` when there is no driver or no such device.
    pub fn new(ordinal: usize) -> Result<Self, BackendError> {
        // SAFETY: only probes whether the driver library can be loaded.
        if !unsafe { sys::is_culib_present() } {
            return Err(BackendError::Device("no CUDA driver found (libcuda could not be loaded)".into()));
        }
        let context = CudaContext::new(ordinal).map_err(|e| device_error(&format!("no CUDA device {ordinal}"), e))?;
        let default = RegisteredStream(context.default_stream());
        let streams = Mutex::new(HashMap::from([(StreamId::DEFAULT, default)]));
        Ok(CudaBackend { context, streams, events: Arc::default() })
    }

    /// The device's context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.context
    }

    /// Makes `stream` known to the allocator under `id` (0 is the default stream).
    pub fn register_stream(&self, id: StreamId, stream: Arc<CudaStream>) {
        self.streams.lock().unwrap_or_else(|e| e.into_inner()).insert(id, RegisteredStream(stream));
    }

    fn bind(&self) -> Result<(), BackendError> {
        self.context.bind_to_thread().map_err(|e| device_error("binding the CUDA context", e))
    }

    fn take_event(&self) -> Result<RawEvent, BackendError> {
        if let Some(raw) = self.events.free.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(raw);
        }
        result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map(RawEvent)
            .map_err(|e| device_error("creating an event", e))
    }
}

impl Backend for CudaBackend {
    type Event = CudaEvent;

    fn device_name(&self) -> String {
        format!("cuda:{}", self.context.ordinal())
    }

    fn allocate(&self, bytes: usize) -> Result<usize, BackendError> {
        self.bind()?;
        // SAFETY: the context is current on this thread; the size is non-zero.
        match unsafe { result::malloc_sync(bytes) } {
            Ok(ptr) => Ok(ptr as usize),
            Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => {
                Err(BackendError::OutOfMemory { requested: bytes })
            }
            Err(e) => Err(device_error("cuMemAlloc", e)),
        }
    }

    unsafe fn free(&self, addr: usize, _bytes: usize) {
        if self.bind().is_ok() {
            // SAFETY: the caller guarantees `addr` came from `allocate` and is unused.
            let _ = unsafe { result::free_sync(addr as sys::CUdeviceptr) };
        }
    }

    fn total_bytes(&self) -> usize {
        self.bind().ok().and_then(|_| result::mem_get_info().ok()).map(|(_, total)| total).unwrap_or(0)
    }

    fn free_bytes(&self) -> usize {
        self.bind().ok().and_then(|_| result::mem_get_info().ok()).map(|(free, _)| free).unwrap_or(0)
    }

    fn record_event(&self, stream: StreamId) -> Result<CudaEvent, BackendError> {
        self.bind()?;
        let cu_stream = {
            let streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
            let registered = streams
                .get(&stream)
                .ok_or_else(|| BackendError::Device(format!("{stream} was never registered with the CUDA backend")))?;
            registered.0.cu_stream()
        };
        let raw = self.take_event()?;
        // SAFETY: both handles are live; the context is current.
        unsafe { result::event::record(raw.0, cu_stream) }.map_err(|e| device_error("cuEventRecord", e))?;
        Ok(CudaEvent { raw: Some(raw), pool: Arc::clone(&self.events) })
    }

    fn event_completed(&self, event: &CudaEvent) -> bool {
        // SAFETY: the event handle is live while `event` is.
        event.raw.as_ref().is_none_or(|raw| unsafe { result::event::query(raw.0) }.is_ok())
    }

    fn synchronize_event(&self, event: &CudaEvent) -> Result<(), BackendError> {
        match &event.raw {
            // SAFETY: the event handle is live while `event` is.
            Some(raw) => {
                unsafe { result::event::synchronize(raw.0) }.map_err(|e| device_error("cuEventSynchronize", e))
            }
            None => Ok(()),
        }
    }

    fn synchronize_device(&self) -> Result<(), BackendError> {
        self.context.synchronize().map_err(|e| device_error("cuCtxSynchronize", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_backend_allocates_or_says_why_not() {
        match CudaBackend::new(0) {
            Err(error) => eprintln!("skipped: no CUDA device ({error})"),
            Ok(backend) => {
                let addr = backend.allocate(1 << 20).unwrap();
                assert_ne!(addr, 0);
                // SAFETY: allocated just above with this size.
                unsafe { backend.free(addr, 1 << 20) };
                assert!(backend.total_bytes() > 0);
            }
        }
    }
}
