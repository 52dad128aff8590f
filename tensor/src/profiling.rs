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
            TraceAction::SegmentAlloc | TraceAction::SegmentFree => {
                MemoryEvent::alloc(self.device, addr, 0, allocated, reserved)
            }
            TraceAction::FreeCompleted | TraceAction::Oom => return,
        };
        brasa_profile::record_memory_event(event);
    }
}

/// The observer a device's allocator gets when it is created.
pub(crate) fn allocator_observer(device: Device) -> Observer {
    let device = match device {
        Device::Cpu(index) => DeviceId::cpu(index as u32),
        Device::Cuda(index) => DeviceId::cuda(index as u32),
    };
    Arc::new(ProfileForwarder { device })
}

#[cfg(test)]
mod tests {
    use crate::{memory, set_host_device_count, DType, Device, Tensor};
    use brasa_profile::Profiler;

    #[test]
    fn a_profile_sees_ops_and_their_memory() {
        set_host_device_count(8).unwrap();
        let dev = Device::cpu(7);
        let a = Tensor::ones_on([64, 64], DType::F32, dev).unwrap();
        let profiler = Profiler::builder().profile_memory(true).record_shapes(true).start().unwrap();
        let b = a.matmul(&a).unwrap().relu().unwrap();
        let result = profiler.stop();
        drop(b);
        let table = result.key_averages();
        // Other tests of this binary may run ops meanwhile: at least ours are there.
        assert!(table.get("matmul").is_some_and(|row| row.count >= 1));
        assert!(table.get("relu").is_some_and(|row| row.count >= 1));
        let on_device: Vec<_> = result.memory.iter().filter(|m| m.event.device.index == 7).collect();
        assert!(on_device.iter().any(|m| m.event.bytes == 64 * 64 * 4), "the matmul output's allocation is recorded");
        assert!(memory::allocated(dev).unwrap() >= 64 * 64 * 4);
    }
}
