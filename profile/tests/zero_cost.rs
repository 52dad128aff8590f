//! When no profiler runs, recording calls allocate nothing: a counting global
//! allocator sees no allocation across thousands of calls.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use brasa_profile::{
    device_span, enabled, record_function, record_function_with_shapes, record_memory_event, record_op, DeviceId,
    DeviceTimer, HostClock, HostTimer, MemoryEvent,
};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator, which upholds
// GlobalAlloc's contract; the counter is a side effect only.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// The only test in this binary, so no other test thread allocates meanwhile.
#[test]
fn recording_calls_do_not_allocate_when_off() {
    let timer: Arc<dyn DeviceTimer> = Arc::new(HostTimer::new(DeviceId::cpu(0), Arc::new(HostClock)));
    assert!(!enabled());
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    for i in 0..10_000u64 {
        let _a = record_function("step");
        let _b = record_function_with_shapes("matmul", &[&[2, 3], &[3, 4]]);
        let _c = record_op("add", &[&[4]]);
        let _k = device_span(&timer, "kernel");
        record_memory_event(MemoryEvent::alloc(DeviceId::cpu(0), i, 64, 64, 64));
        assert!(!_a.is_recording() && !_k.is_recording());
    }
    let after = ALLOCATIONS.load(Ordering::SeqCst);
    assert_eq!(after - before, 0, "allocations while profiling is off");
}
