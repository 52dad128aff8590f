//! The bridge to `brasa-profile`: every device allocator forwards its events
//! to the profiler while one records (op ranges are opened by the ops
//! themselves with `brasa_profile::record_op`), each with its memory category
//! (`MemoryCategory::name`: `"parameter"`, `"activation"`, …) so the memory
//! timeline can stack allocated bytes by what they are for; a retag (autograd
//! saving a tensor for backward, a gradient landing in a leaf) moves a block's
//! bytes between categories. The device monitors also report what each
//! allocator holds per category when a recording starts, the timeline's first
//! point. While no profiler runs, the cost is one relaxed atomic load per
//! allocation and free.

use crate::device::Device;
use brasa_alloc::{AllocObserver, MemoryStats, Observer, TraceAction, TraceEntry};
use brasa_profile::{DeviceId, MemoryBaseline, MemoryEvent};
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
        if let Some(event) = memory_event(self.device, entry) {
            brasa_profile::record_memory_event(event);
        }
    }
}

/// The profiler's view of one allocator event (`None` for what its timeline
/// does not show: frees completing after stream work, OOMs, quarantine).
fn memory_event(device: DeviceId, entry: &TraceEntry) -> Option<MemoryEvent> {
    let (addr, size) = (entry.addr as u64, entry.size as u64);
    let (allocated, reserved) = (entry.total_allocated as u64, entry.total_reserved as u64);
    let category = entry.category.name();
    let event = match entry.action {
        TraceAction::Alloc => MemoryEvent::alloc(device, addr, size, allocated, reserved),
        TraceAction::FreeRequested => MemoryEvent::free(device, addr, size, allocated, reserved),
        TraceAction::Retag { from } => {
            return Some(MemoryEvent::retag(device, addr, size, from.name(), category, allocated, reserved))
        }
        // Segments change only what is reserved: a zero-byte event carries the new total.
        TraceAction::SegmentAlloc | TraceAction::SegmentFree | TraceAction::SegmentMap | TraceAction::SegmentUnmap => {
            MemoryEvent::alloc(device, addr, 0, allocated, reserved)
        }
        _ => return None,
    };
    Some(event.with_category(category))
}

/// What a device's allocator holds now, for the memory timeline's first point.
fn memory_baseline(device: DeviceId, stats: &MemoryStats) -> MemoryBaseline {
    let bytes = |value: i64| u64::try_from(value).unwrap_or(0);
    MemoryBaseline {
        device,
        total_allocated: bytes(stats.allocated_bytes.all.current),
        total_reserved: bytes(stats.reserved_bytes.all.current),
        by_category: stats
            .by_category
            .iter()
            .filter(|(_, stat)| stat.current > 0)
            .map(|(category, stat)| (category.name(), bytes(stat.current)))
            .collect(),
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
        crate::backend::host::devices::host_allocator(self.index).ok().map(|a| a.backend().total_bytes() as u64)
    }

    fn memory_baseline(&self) -> Option<MemoryBaseline> {
        let stats = crate::memory::stats(Device::Cpu(self.index)).ok()?;
        Some(memory_baseline(self.device(), &stats))
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
        crate::backend::cuda::device::allocator(self.index).ok().map(|a| a.backend())
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

    fn memory_baseline(&self) -> Option<MemoryBaseline> {
        let stats = crate::memory::stats(Device::Cuda(self.index)).ok()?;
        Some(memory_baseline(self.device(), &stats))
    }
}

/// Registers CUDA device `index` with `brasa_profile::utilization()` (done
/// when its allocator is created, that is at the device's first use).
#[cfg(feature = "cuda")]
pub(crate) fn register_cuda_monitor(index: usize) {
    brasa_profile::register_device_monitor(Arc::new(CudaDeviceMonitor { index }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use brasa_alloc::{CachingAllocator, HostBackend, MemoryCategory, StreamId};

    fn entry(action: TraceAction, category: MemoryCategory) -> TraceEntry {
        TraceEntry {
            action,
            addr: 0x40,
            size: 1024,
            requested_size: 1000,
            stream: StreamId::DEFAULT,
            category,
            time_us: 0,
            device_free: 0,
            total_allocated: 4096,
            total_reserved: 8192,
        }
    }

    #[test]
    fn events_carry_their_category_and_retags_are_forwarded() {
        let dev = DeviceId::cpu(3);
        let alloc = memory_event(dev, &entry(TraceAction::Alloc, MemoryCategory::Input)).unwrap();
        assert_eq!((alloc.bytes, alloc.category, alloc.retag), (1024, "input", None));
        assert_eq!((alloc.total_allocated, alloc.total_reserved), (4096, 8192));
        let free = memory_event(dev, &entry(TraceAction::FreeRequested, MemoryCategory::OptimizerState)).unwrap();
        assert_eq!((free.bytes, free.category), (-1024, "optimizer_state"));
        let retag = entry(TraceAction::Retag { from: MemoryCategory::Temporary }, MemoryCategory::Activation);
        let retag = memory_event(dev, &retag).unwrap();
        assert_eq!((retag.bytes, retag.category, retag.addr), (0, "activation", 0x40));
        assert_eq!(retag.retag.map(|r| (r.from, r.bytes)), Some(("temporary", 1024)));
        let segment = memory_event(dev, &entry(TraceAction::SegmentAlloc, MemoryCategory::Parameter)).unwrap();
        assert_eq!((segment.bytes, segment.total_reserved), (0, 8192));
        assert!(memory_event(dev, &entry(TraceAction::FreeCompleted, MemoryCategory::Other)).is_none());
        assert!(memory_event(dev, &entry(TraceAction::Oom, MemoryCategory::Other)).is_none());
    }

    #[test]
    fn baselines_are_the_allocators_categories() {
        let alloc = CachingAllocator::new(HostBackend::new());
        let weights = alloc.allocate_as(4 << 20, StreamId::DEFAULT, MemoryCategory::Parameter).unwrap();
        let batch = alloc.allocate_as(1 << 20, StreamId::DEFAULT, MemoryCategory::Input).unwrap();
        let stats = alloc.stats();
        let baseline = memory_baseline(DeviceId::cpu(0), &stats);
        assert_eq!(baseline.by_category, [("parameter", 4 << 20), ("input", 1 << 20)]);
        assert_eq!(baseline.total_allocated, 5 << 20);
        assert_eq!(baseline.total_reserved, stats.reserved_bytes.all.current as u64);
        drop((weights, batch));
    }
}
