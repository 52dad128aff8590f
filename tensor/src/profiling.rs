//! The bridge to `brasa-profile`: every device allocator forwards its events
//! to the profiler while one records (op ranges are opened by the ops
//! themselves with `brasa_profile::record_op`). While no profiler runs, the
//! cost is one relaxed atomic load per allocation and free.

use crate::device::Device;
use brasa_alloc::{AllocObserver, Observer, TraceAction, TraceEntry};
use brasa_profile::{DeviceId, MemoryEvent};
use std::sync::Arc;

/// Forwards one device's allocator events as profiler memory events.
struct ProfileForwarder {
    device: DeviceId,
}

impl AllocObserver for ProfileForwarder {
    #[inline]
    fn enabled(&self) -> bool {
        brasa_profile::enabled()
    }

    fn on_event(&self, entry: &TraceEntry) {
        let (addr, allocated, reserved) =
            (entry.addr as u64, entry.total_allocated as u64, entry.total_reserved as u64);
        let event = match entry.action {
            TraceAction::Alloc => MemoryEvent::alloc(self.device, addr, entry.size as u64, allocated, reserved),
            TraceAction::FreeRequested => MemoryEvent::free(self.device, addr, entry.size as u64, allocated, reserved),
            // Segments change only what is reserved: a zero-byte event carries the new total.
            TraceAction::SegmentAlloc
            | TraceAction::SegmentFree
            | TraceAction::SegmentMap
            | TraceAction::SegmentUnmap => MemoryEvent::alloc(self.device, addr, 0, allocated, reserved),
            // Nothing the profiler's timeline shows (retags move bytes between categories).
            _ => return,
        };
        brasa_profile::record_memory_event(event);
    }
}

/// The observer a device's allocator gets when it is created.
pub(crate) fn allocator_observer(device: Device) -> Observer {
    let device = match device {
        Device::Cpu(index) => DeviceId::cpu(index as u32),
        Device::Cuda(index) => DeviceId::cuda(index as u32),
        Device::Meta(index) => DeviceId::new("meta", index as u32),
    };
    Arc::new(ProfileForwarder { device })
}

/// What `brasa_profile::utilization()` reports for a logical host device:
/// the bytes its caching allocator holds and the device's capacity (its
/// byte limit, else the machine's memory).
struct HostDeviceMonitor {
    index: usize,
}

impl brasa_profile::DeviceMonitor for HostDeviceMonitor {
    fn device(&self) -> DeviceId {
        DeviceId::cpu(self.index as u32)
    }

    fn name(&self) -> String {
        format!("cpu:{} (logical host device)", self.index)
    }

    fn memory_used(&self) -> Option<u64> {
        crate::memory::reserved(Device::Cpu(self.index)).ok().map(|b| b as u64)
    }

    fn memory_total(&self) -> Option<u64> {
        use brasa_alloc::Backend;
        crate::host_devices::host_allocator(self.index).ok().map(|a| a.backend().total_bytes() as u64)
    }
}

/// Registers logical host device `index` with `brasa_profile::utilization()`.
pub(crate) fn register_host_monitor(index: usize) {
    brasa_profile::register_device_monitor(Arc::new(HostDeviceMonitor { index }));
}

/// What `brasa_profile::utilization()` reports for a CUDA device: the GPU's
/// name, and its used and total memory as the driver counts them
/// (`cuMemGetInfo`, so other processes' memory is included, as
/// `nvidia-smi` shows it). Compute utilization needs NVML, which brasa does
/// not load: it reads as unknown.
#[cfg(feature = "cuda")]
struct CudaDeviceMonitor {
    index: usize,
}

#[cfg(feature = "cuda")]
impl CudaDeviceMonitor {
    fn backend(&self) -> Option<&'static brasa_alloc::CudaBackend> {
        crate::cuda::allocator(self.index).ok().map(|a| a.backend())
    }
}

#[cfg(feature = "cuda")]
impl brasa_profile::DeviceMonitor for CudaDeviceMonitor {
    fn device(&self) -> DeviceId {
        DeviceId::cuda(self.index as u32)
    }

    fn name(&self) -> String {
        let model = self.backend().and_then(|b| b.context().name().ok()).unwrap_or_default();
        format!("cuda:{} {model}", self.index).trim_end().to_string()
    }

    fn memory_used(&self) -> Option<u64> {
        use brasa_alloc::Backend;
        let backend = self.backend()?;
        let total = backend.total_bytes() as u64;
        // Zero total: the driver did not answer.
        (total > 0).then(|| total.saturating_sub(backend.free_bytes() as u64))
    }

    fn memory_total(&self) -> Option<u64> {
        use brasa_alloc::Backend;
        let total = self.backend()?.total_bytes() as u64;
        (total > 0).then_some(total)
    }
}

/// Registers CUDA device `index` with `brasa_profile::utilization()` (done
/// when its allocator is created, that is at the device's first use).
#[cfg(feature = "cuda")]
pub(crate) fn register_cuda_monitor(index: usize) {
    brasa_profile::register_device_monitor(Arc::new(CudaDeviceMonitor { index }));
}
