//! A simulated training loop with a toy allocator: prints the op table and writes
//! a Chrome trace and a memory timeline (allocated bytes stacked by category:
//! inputs, activations, gradients, optimizer state; the weights, allocated before
//! the recording by an allocator that reports no baseline, show as
//! "(before this trace)").
//!
//! `cargo run -p brasa-profile --example training_loop -- /tmp` writes
//! `/tmp/trace.json` and `/tmp/memory.html`.

use std::collections::HashMap;
use std::sync::Arc;

use brasa_profile::{
    device_span, record_function, record_memory_event, record_op, schedule, utilization, DeviceId, DeviceTimer,
    HostClock, HostTimer, MemoryEvent, ProfileError, Profiler, SortBy, TableOptions,
};

/// A toy caching allocator: reserves 20 MiB segments, forwards every event.
struct ToyAllocator {
    device: DeviceId,
    next_addr: u64,
    live: HashMap<u64, (u64, &'static str)>,
    allocated: u64,
    reserved: u64,
}

impl ToyAllocator {
    const SEGMENT: u64 = 20 << 20;

    fn new(device: DeviceId) -> Self {
        Self { device, next_addr: 0x7f00_0000_0000, live: HashMap::new(), allocated: 0, reserved: 0 }
    }

    fn alloc(&mut self, bytes: u64, category: &'static str) -> u64 {
        let addr = self.next_addr;
        self.next_addr += bytes.next_multiple_of(512);
        self.allocated += bytes;
        while self.reserved < self.allocated {
            self.reserved += Self::SEGMENT;
        }
        self.live.insert(addr, (bytes, category));
        let event = MemoryEvent::alloc(self.device, addr, bytes, self.allocated, self.reserved);
        record_memory_event(event.with_category(category));
        addr
    }

    /// The block at `addr` now counts as `category` (as autograd re-tags what it saves).
    fn retag(&mut self, addr: u64, category: &'static str) {
        if let Some((bytes, from)) = self.live.get_mut(&addr) {
            let event = MemoryEvent::retag(self.device, addr, *bytes, from, category, self.allocated, self.reserved);
            *from = category;
            record_memory_event(event);
        }
    }

    fn free(&mut self, addr: u64) {
        if let Some((bytes, category)) = self.live.remove(&addr) {
            self.allocated -= bytes;
            let event = MemoryEvent::free(self.device, addr, bytes, self.allocated, self.reserved);
            record_memory_event(event.with_category(category));
        }
    }
}

fn busy(iterations: u64) {
    std::hint::black_box((0..iterations).fold(0u64, |a, b| a.wrapping_mul(31).wrapping_add(b)));
}

const MIB: u64 = 1 << 20;

fn main() -> Result<(), ProfileError> {
    let out_dir = std::env::args().nth(1).map_or_else(std::env::temp_dir, Into::into);
    let device = DeviceId::cpu(1);
    let timer: Arc<dyn DeviceTimer> = Arc::new(HostTimer::new(device, Arc::new(HostClock)));
    let mut alloc = ToyAllocator::new(device);
    let weights = alloc.alloc(96 * MIB, "parameter"); // before the recording: "(before this trace)"
    let mut momentum: Option<u64> = None;

    let mut profiler = Profiler::builder()
        .record_shapes(true)
        .profile_memory(true)
        .schedule(schedule(1, 1, 3, 1, 0)?)
        .on_trace_ready(|r| eprintln!("trace ready at step {:?}: {} ranges", r.step, r.ranges.len()))
        .start()?;
    for _step in 0..6 {
        let batch = {
            let _load = record_function("data_loader");
            busy(200_000);
            alloc.alloc(24 * MIB, "input")
        };
        let (h, a, logits) = {
            let _fwd = record_function("forward");
            let h = {
                let _op = record_op("linear1", &[&[256, 1024], &[1024, 4096]]);
                let _k = device_span(&timer, "gemm_256x4096");
                busy(600_000);
                alloc.alloc(128 * MIB, "activation")
            };
            let a = {
                let _op = record_op("gelu", &[&[256, 4096]]);
                let _k = device_span(&timer, "gelu_kernel");
                busy(150_000);
                let a = alloc.alloc(128 * MIB, "temporary");
                alloc.retag(a, "activation"); // saved for backward
                a
            };
            let logits = {
                let _op = record_op("linear2", &[&[256, 4096], &[4096, 1000]]);
                let _k = device_span(&timer, "gemm_256x1000");
                busy(300_000);
                alloc.alloc(40 * MIB, "activation")
            };
            (h, a, logits)
        };
        {
            let _bwd = record_function("backward");
            let grad = {
                let _op = record_op("linear2_backward", &[&[256, 1000]]);
                let _k = device_span(&timer, "gemm_bwd");
                busy(400_000);
                alloc.alloc(64 * MIB, "gradient")
            };
            alloc.free(logits);
            alloc.free(a);
            alloc.free(h);
            {
                let _op = record_op("linear1_backward", &[&[256, 4096]]);
                let _k = device_span(&timer, "gemm_bwd_1");
                busy(500_000);
            }
            alloc.free(grad);
        }
        {
            let _opt = record_function("optimizer.step");
            if momentum.is_none() {
                momentum = Some(alloc.alloc(96 * MIB, "optimizer_state"));
            }
            busy(200_000);
        }
        alloc.free(batch);
        profiler.step();
    }
    let result = profiler.stop();
    alloc.free(weights);
    if let Some(m) = momentum {
        alloc.free(m);
    }

    println!("{}", result.key_averages().table(&TableOptions::default().sort_by(SortBy::CpuTotal).row_limit(12)));
    let trace = out_dir.join("trace.json");
    let html = out_dir.join("memory.html");
    result.export_chrome_trace(&trace)?;
    result.export_memory_timeline(&html)?;
    println!("wrote {} and {}", trace.display(), html.display());
    print!("{}", utilization());
    Ok(())
}
