//! What a device is, for memory planning: [`MemoryTarget`] (its kind,
//! capacity, page granularity and allocator configuration), which a meta
//! device imitates and every device's runtime can describe itself as.

use super::runtime_for;
use crate::device::Device;
use crate::error::Result;
use brasa_alloc::{AllocatorConfig, Backend as _};

/// CUDA's allocation granularity for `cuMemCreate` on current GPUs (2 MiB):
/// the page of expandable segments on a CUDA target.
pub const CUDA_GRANULARITY: usize = 2 << 20;

/// Which device's op implementations a meta device imitates: the ops
/// allocate what that device's backend allocates (outputs, temporaries,
/// workspaces).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TargetKind {
    /// The host or a logical host device.
    Host,
    /// A CUDA device.
    Cuda,
}

/// The device a meta device imitates: its kind, capacity, page granularity
/// and allocator configuration.
///
/// ```
/// use brasa_tensor::{MemoryTarget, TargetKind};
///
/// let h100 = MemoryTarget::cuda(80 << 30);
/// assert_eq!(h100.kind(), TargetKind::Cuda);
/// assert_eq!(h100.capacity(), 80 << 30);
/// let small_host = MemoryTarget::host(Some(512 << 20));
/// assert_eq!(small_host.capacity(), 512 << 20);
/// ```
#[derive(Clone, Debug)]
pub struct MemoryTarget {
    name: String,
    kind: TargetKind,
    capacity: usize,
    granularity: Option<usize>,
    config: AllocatorConfig,
}

impl MemoryTarget {
    /// A CUDA device with `capacity` bytes (what `cuMemGetInfo` reports as
    /// total), the default allocator configuration and CUDA's 2 MiB page.
    pub fn cuda(capacity: usize) -> MemoryTarget {
        MemoryTarget {
            name: "cuda".to_string(),
            kind: TargetKind::Cuda,
            capacity,
            granularity: Some(CUDA_GRANULARITY),
            config: AllocatorConfig::default(),
        }
    }

    /// A host device with an optional byte `limit` (no limit: the machine's
    /// memory), the default allocator configuration and the host's page.
    pub fn host(limit: Option<usize>) -> MemoryTarget {
        let backend = brasa_alloc::HostBackend::named("cpu", limit);
        MemoryTarget {
            name: "cpu".to_string(),
            kind: TargetKind::Host,
            capacity: backend.total_bytes(),
            granularity: backend.virtual_memory_granularity(),
            config: AllocatorConfig::default(),
        }
    }

    /// The device `device` as it is configured now: its kind, its capacity
    /// (a logical host device's limit) and its allocator's configuration.
    /// Creates the device's allocator if it had none (allocating nothing).
    /// Memory that libraries hold there outside the caching allocator
    /// ([`crate::memory::external`]: NCCL's buffers, say) is not the
    /// allocator's to use, so it is taken off the capacity.
    pub fn like(device: Device) -> Result<MemoryTarget> {
        let target = runtime_for(device)?.memory_target(device)?;
        let held: u64 = crate::memory::external(device).iter().map(|(_, bytes)| bytes).sum();
        let capacity = target.capacity.saturating_sub(usize::try_from(held).unwrap_or(usize::MAX));
        Ok(target.with_capacity(capacity))
    }

    /// A target of these parts (what a device's runtime reports).
    pub(crate) fn of(
        name: String,
        kind: TargetKind,
        capacity: usize,
        granularity: Option<usize>,
        config: AllocatorConfig,
    ) -> MemoryTarget {
        MemoryTarget { name, kind, capacity, granularity, config }
    }

    /// The same device with another allocator configuration.
    pub fn with_config(mut self, config: AllocatorConfig) -> MemoryTarget {
        self.config = config;
        self
    }

    /// The same device with another capacity.
    pub fn with_capacity(mut self, capacity: usize) -> MemoryTarget {
        self.capacity = capacity;
        self
    }

    /// Which device's ops are imitated.
    pub fn kind(&self) -> TargetKind {
        self.kind
    }

    /// The capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The allocator configuration.
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    /// The target in words (`cuda`, `cpu`, or the imitated device: `cpu:2`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The page of expandable segments on the target, where it maps them.
    pub(crate) fn granularity(&self) -> Option<usize> {
        self.granularity
    }
}
