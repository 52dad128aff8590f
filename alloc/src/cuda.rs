//! CUDA device memory through cudarc's driver API (feature `cuda`).
//!
//! The driver library is loaded at run time: a machine without it gets an
//! `Err` from [`CudaBackend::new`], never a panic. Events come from a pool of
//! timing-disabled events, as PyTorch's allocator keeps them.
//!
//! Expandable segments use the driver's virtual memory management:
//! `cuMemAddressReserve` for the range, and one `cuMemCreate` handle per
//! granule (`cuMemGetAllocationGranularity`, 2 MiB on current GPUs) mapped
//! with `cuMemMap` and made accessible with `cuMemSetAccess`, so any whole
//! granule can be unmapped and released on its own.

use crate::backend::{Backend, BackendError, StreamId};
use cudarc::driver::{result, sys, CudaContext, CudaStream, DriverError};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

fn device_error(what: &str, source: DriverError) -> BackendError {
    BackendError::Cuda { what: what.to_string(), source }
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
    /// The mapping granularity, when the device supports virtual memory management.
    granularity: Option<usize>,
    /// The physical handle mapped at each mapped granule's address.
    mapped: Mutex<BTreeMap<usize, sys::CUmemGenericAllocationHandle>>,
}

/// Device memory of `ordinal`, as `cuMemCreate` and `cuMemGetAllocationGranularity` describe it.
fn allocation_properties(ordinal: usize) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct for which all zeroes is a valid (empty) value.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal as i32;
    prop
}

fn check(what: &str, code: sys::CUresult) -> Result<(), BackendError> {
    match code {
        sys::cudaError_enum::CUDA_SUCCESS => Ok(()),
        sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => Err(BackendError::OutOfMemory { requested: 0 }),
        other => Err(device_error(what, DriverError(other))),
    }
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
        let prop = allocation_properties(ordinal);
        let mut granularity = 0usize;
        // SAFETY: both pointers are valid for the call; the context is current after `CudaContext::new`.
        let code = unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        };
        let granularity = (code == sys::cudaError_enum::CUDA_SUCCESS && granularity > 0).then_some(granularity);
        Ok(CudaBackend { context, streams, events: Arc::default(), granularity, mapped: Mutex::default() })
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
            Some(raw) => {
                // SAFETY: the event handle is live while `event` is.
                unsafe { result::event::synchronize(raw.0) }.map_err(|e| device_error("cuEventSynchronize", e))
            }
            None => Ok(()),
        }
    }

    fn synchronize_device(&self) -> Result<(), BackendError> {
        self.context.synchronize().map_err(|e| device_error("cuCtxSynchronize", e))
    }

    fn virtual_memory_granularity(&self) -> Option<usize> {
        self.granularity
    }

    fn reserve_address_range(&self, bytes: usize) -> Result<usize, BackendError> {
        self.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is valid for the write; no fixed address or alignment is asked for.
        check("cuMemAddressReserve", unsafe { sys::cuMemAddressReserve(&mut ptr, bytes, 0, 0, 0) })?;
        Ok(ptr as usize)
    }

    unsafe fn release_address_range(&self, addr: usize, bytes: usize) {
        if self.bind().is_ok() {
            // SAFETY: the caller passes a reserved range with nothing mapped in it.
            let _ = unsafe { sys::cuMemAddressFree(addr as sys::CUdeviceptr, bytes) };
        }
    }

    fn map(&self, addr: usize, bytes: usize) -> Result<(), BackendError> {
        let granularity = self.granularity.ok_or_else(|| BackendError::Device("no virtual memory support".into()))?;
        self.bind()?;
        let prop = allocation_properties(self.context.ordinal());
        let mut mapped = self.mapped.lock().unwrap_or_else(|e| e.into_inner());
        let mut done = Vec::new();
        let mut result = Ok(());
        for granule in (addr..addr + bytes).step_by(granularity) {
            let mut handle: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: `handle` and `prop` are valid for the call.
            result = check("cuMemCreate", unsafe { sys::cuMemCreate(&mut handle, granularity, &prop, 0) });
            if result.is_err() {
                break;
            }
            // SAFETY: `granule` lies in a reserved range and has nothing mapped.
            result =
                check("cuMemMap", unsafe { sys::cuMemMap(granule as sys::CUdeviceptr, granularity, 0, handle, 0) });
            if result.is_err() {
                // SAFETY: the handle was created just above and is mapped nowhere.
                let _ = unsafe { sys::cuMemRelease(handle) };
                break;
            }
            done.push((granule, handle));
        }
        if result.is_ok() {
            // SAFETY: a plain C struct for which all zeroes is valid; then filled in.
            let mut access: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
            access.location = prop.location;
            access.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            // SAFETY: the whole range was mapped above; `access` is valid for the call.
            result =
                check("cuMemSetAccess", unsafe { sys::cuMemSetAccess(addr as sys::CUdeviceptr, bytes, &access, 1) });
        }
        match result {
            Ok(()) => {
                mapped.extend(done);
                Ok(())
            }
            Err(error) => {
                for (granule, handle) in done {
                    // SAFETY: mapped above by this call and used by nobody yet.
                    unsafe {
                        let _ = sys::cuMemUnmap(granule as sys::CUdeviceptr, granularity);
                        let _ = sys::cuMemRelease(handle);
                    }
                }
                Err(match error {
                    BackendError::OutOfMemory { .. } => BackendError::OutOfMemory { requested: bytes },
                    other => other,
                })
            }
        }
    }

    unsafe fn unmap(&self, addr: usize, bytes: usize) {
        let Some(granularity) = self.granularity else {
            return;
        };
        if self.bind().is_err() {
            return;
        }
        // Unlike cudaFree, unmapping does not wait for queued kernels that may
        // still use the memory (PyTorch synchronizes here too).
        let _ = self.context.synchronize();
        let mut mapped = self.mapped.lock().unwrap_or_else(|e| e.into_inner());
        for granule in (addr..addr + bytes).step_by(granularity) {
            if let Some(handle) = mapped.remove(&granule) {
                // SAFETY: the caller guarantees the range is mapped and unused; the handle is ours.
                unsafe {
                    let _ = sys::cuMemUnmap(granule as sys::CUdeviceptr, granularity);
                    let _ = sys::cuMemRelease(handle);
                }
            }
        }
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
                if let Some(granularity) = backend.virtual_memory_granularity() {
                    let free_before = backend.free_bytes();
                    let base = backend.reserve_address_range(16 * granularity).unwrap();
                    backend.map(base, 4 * granularity).unwrap();
                    assert!(backend.free_bytes() <= free_before - 4 * granularity);
                    // SAFETY: mapped just above; then the whole range goes back.
                    unsafe {
                        backend.unmap(base, 4 * granularity);
                        backend.release_address_range(base, 16 * granularity);
                    }
                }
            }
        }
    }
}
