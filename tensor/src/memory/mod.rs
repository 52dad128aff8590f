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
mod plan;

pub use brasa_alloc::MemoryCategory;
pub use category::{category_scope, current_category, CategoryScope};
pub use plan::{max_batch_size, max_batch_size_for, plan, plan_steps, BatchSearch, MemoryPlan, PLANNED_STEPS};

use crate::device::Device;
use crate::error::Result;
use crate::host_devices::host_allocator;
use brasa_alloc::{FragmentationReport, MemoryStats, Observer, Snapshot};

/// Runs `$body` with `$alloc` bound to the device's caching allocator.
macro_rules! with_allocator {
    ($device:expr, $alloc:ident => $body:expr) => {
        match $device {
            Device::Cpu(index) => {
                let $alloc = host_allocator(index)?;
                Ok($body)
            }
            Device::Cuda(index) => cuda_allocator!(index, $alloc => $body),
            Device::Meta(_) => {
                let state = crate::backend::meta::meta_state($device)?;
                let $alloc = &state.allocator;
                Ok($body)
            }
        }
    };
}

#[cfg(feature = "cuda")]
macro_rules! cuda_allocator {
    ($index:expr, $alloc:ident => $body:expr) => {{
        let $alloc = crate::cuda::allocator($index)?;
        Ok($body)
    }};
}

#[cfg(not(feature = "cuda"))]
macro_rules! cuda_allocator {
    ($index:expr, $alloc:ident => $body:expr) => {
        Err(crate::error::TensorError::Device(format!(
            "cuda:{}: brasa-tensor was built without the `cuda` feature",
            $index
        )))
    };
}

/// Bytes held by live tensors (`memory_allocated`).
pub fn allocated(device: Device) -> Result<usize> {
    with_allocator!(device, a => a.allocated_bytes())
}

/// Bytes reserved from the device by the cache (`memory_reserved`).
pub fn reserved(device: Device) -> Result<usize> {
    with_allocator!(device, a => a.reserved_bytes())
}

/// Peak of [`allocated`] since start or [`reset_peak`] (`max_memory_allocated`).
pub fn max_allocated(device: Device) -> Result<usize> {
    with_allocator!(device, a => a.stats().allocated_bytes.all.peak as usize)
}

/// Peak of [`reserved`] since start or [`reset_peak`] (`max_memory_reserved`).
pub fn max_reserved(device: Device) -> Result<usize> {
    with_allocator!(device, a => a.stats().reserved_bytes.all.peak as usize)
}

/// Sets every peak to its current value (`reset_peak_memory_stats`).
pub fn reset_peak(device: Device) -> Result<()> {
    with_allocator!(device, a => a.reset_peak())
}

/// Returns cached memory that no tensor uses to the device (`empty_cache`).
pub fn empty_cache(device: Device) -> Result<()> {
    with_allocator!(device, a => a.empty_cache())
}

/// All allocator statistics (`memory_stats`).
pub fn stats(device: Device) -> Result<MemoryStats> {
    with_allocator!(device, a => a.stats())
}

/// The statistics as PyTorch's `memory_summary` table.
pub fn summary(device: Device) -> Result<String> {
    with_allocator!(device, a => a.summary())
}

/// Segments and blocks, plus recorded history (`memory_snapshot`).
pub fn snapshot(device: Device) -> Result<Snapshot> {
    with_allocator!(device, a => a.snapshot())
}

/// Records the last `max_entries` allocator events (0 stops and clears).
pub fn record_history(device: Device, max_entries: usize) -> Result<()> {
    with_allocator!(device, a => a.record_history(max_entries))
}

/// How the free cached memory is laid out.
pub fn fragmentation(device: Device) -> Result<FragmentationReport> {
    with_allocator!(device, a => a.fragmentation())
}

/// Caps the memory the device's cache may reserve to `fraction` of its capacity.
pub fn set_memory_fraction(device: Device, fraction: f64) -> Result<()> {
    with_allocator!(device, a => a.set_memory_fraction(fraction)?)
}

/// Forwards every allocator event of the device to `observer` (the profiler's hook).
pub fn set_observer(device: Device, observer: Option<Observer>) -> Result<()> {
    with_allocator!(device, a => a.set_observer(observer))
}

/// The device driver that page-locks [`Tensor::pin_memory`](crate::Tensor::pin_memory)'s
/// memory: `Some("CUDA (cuMemHostRegister)")` when built with `cuda` and a CUDA
/// device is present (copies from it to the device are asynchronous), `None`
/// when it is `mlock`ed host memory (device copies from it are synchronous).
/// Decided at the first pinning, for the life of the process.
pub fn pinned_memory_driver() -> Result<Option<String>> {
    Ok(crate::host_devices::pinned_allocator()?.backend().pinning_name())
}

/// Statistics of the page-locked host memory pool behind [`crate::Tensor::pin_memory`]
/// (`torch.cuda.host_memory_stats`).
pub fn pinned_stats() -> Result<MemoryStats> {
    Ok(crate::host_devices::pinned_allocator()?.stats())
}

/// Returns cached page-locked memory that no tensor uses to the OS.
pub fn pinned_empty_cache() -> Result<()> {
    crate::host_devices::pinned_allocator()?.empty_cache();
    Ok(())
}
