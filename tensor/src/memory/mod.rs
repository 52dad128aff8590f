//! `torch.cuda.memory_*` for every device: what is allocated, what is
//! reserved, the peaks, the cache, the allocator's table and snapshot.
//!
//! ```
//! use brasa_tensor::{memory, DType, Device, Tensor};
//! let dev = Device::CPU;
//! let before = memory::allocated(dev)?;
//! {
//!     let _x = Tensor::zeros_on([1024, 1024], DType::F32, dev)?;
//!     assert_eq!(memory::allocated(dev)?, before + 4 << 20);
//! }
//! assert_eq!(memory::allocated(dev)?, before);   // freed when the last owner dropped
//! # Ok::<(), brasa_tensor::TensorError>(())
//! ```

mod category;
mod external;
mod plan;

pub use brasa_alloc::MemoryCategory;
pub use category::{category_scope, current_category, CategoryScope};
pub use external::{external, register_external};
pub use plan::{
    max_batch_size, max_batch_size_for, plan, plan_devices, plan_on, plan_steps, BatchSearch, MemoryPlan, PLANNED_STEPS,
};

use crate::backend::{pinned_allocator, runtime_for, AllocatorRef};
use crate::device::Device;
use crate::error::Result;
use brasa_alloc::{FragmentationReport, MemoryStats, Observer, Snapshot};

/// The caching allocator of `device`, from its runtime.
fn allocator(device: Device) -> Result<AllocatorRef> {
    runtime_for(device)?.allocator(device)
}

/// Bytes held by live tensors (`memory_allocated`).
pub fn allocated(device: Device) -> Result<usize> {
    Ok(allocator(device)?.allocated_bytes())
}

/// Bytes reserved from the device by the cache (`memory_reserved`).
pub fn reserved(device: Device) -> Result<usize> {
    Ok(allocator(device)?.reserved_bytes())
}

/// Peak of [`allocated`] since start or [`reset_peak`] (`max_memory_allocated`).
pub fn max_allocated(device: Device) -> Result<usize> {
    Ok(allocator(device)?.stats().allocated_bytes.all.peak as usize)
}

/// Peak of [`reserved`] since start or [`reset_peak`] (`max_memory_reserved`).
pub fn max_reserved(device: Device) -> Result<usize> {
    Ok(allocator(device)?.stats().reserved_bytes.all.peak as usize)
}

/// Sets every peak to its current value (`reset_peak_memory_stats`).
pub fn reset_peak(device: Device) -> Result<()> {
    allocator(device)?.reset_peak();
    Ok(())
}

/// Returns cached memory that no tensor uses to the device (`empty_cache`).
pub fn empty_cache(device: Device) -> Result<()> {
    allocator(device)?.empty_cache();
    Ok(())
}

/// All allocator statistics (`memory_stats`).
pub fn stats(device: Device) -> Result<MemoryStats> {
    Ok(allocator(device)?.stats())
}

/// The statistics as PyTorch's `memory_summary` table.
pub fn summary(device: Device) -> Result<String> {
    let mut text = allocator(device)?.summary();
    // What libraries hold there themselves (NCCL's buffers), when any say.
    text.push_str(&external::summary_lines(device));
    Ok(text)
}

/// Segments and blocks, plus recorded history (`memory_snapshot`).
pub fn snapshot(device: Device) -> Result<Snapshot> {
    Ok(allocator(device)?.snapshot())
}

/// Records the last `max_entries` allocator events (0 stops and clears).
pub fn record_history(device: Device, max_entries: usize) -> Result<()> {
    allocator(device)?.record_history(max_entries);
    Ok(())
}

/// How the free cached memory is laid out.
pub fn fragmentation(device: Device) -> Result<FragmentationReport> {
    Ok(allocator(device)?.fragmentation())
}

/// Caps the memory the device's cache may reserve to `fraction` of its capacity.
pub fn set_memory_fraction(device: Device, fraction: f64) -> Result<()> {
    Ok(allocator(device)?.set_memory_fraction(fraction)?)
}

/// Forwards every allocator event of the device to `observer` (the profiler's hook).
pub fn set_observer(device: Device, observer: Option<Observer>) -> Result<()> {
    allocator(device)?.set_observer(observer);
    Ok(())
}

/// The device driver that page-locks [`Tensor::pin_memory`](crate::Tensor::pin_memory)'s
/// memory: `Some("CUDA (cuMemHostRegister)")` when built with `cuda` and a CUDA
/// device is present (copies from it to the device are asynchronous), `None`
/// when it is `mlock`ed host memory (device copies from it are synchronous).
/// Decided at the first pinning, for the life of the process.
pub fn pinned_memory_driver() -> Result<Option<String>> {
    Ok(pinned_allocator()?.backend().pinning_name())
}

/// Statistics of the page-locked host memory pool behind [`crate::Tensor::pin_memory`]
/// (`torch.cuda.host_memory_stats`).
pub fn pinned_stats() -> Result<MemoryStats> {
    Ok(pinned_allocator()?.stats())
}

/// Returns cached page-locked memory that no tensor uses to the OS.
pub fn pinned_empty_cache() -> Result<()> {
    pinned_allocator()?.empty_cache();
    Ok(())
}
