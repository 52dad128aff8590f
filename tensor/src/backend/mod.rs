//! The device seam: every op is written once, above two narrow per-device
//! interfaces, and each device implements both.
//!
//! - [`DeviceOps`] (`ops.rs`) is what a device *computes*. An op in
//!   `crate::ops` does the part that is the same on every device: checking
//!   operands (devices, dtypes, shapes), PyTorch's dtype promotion,
//!   broadcasting (stride-0 views, never copies), choosing the dtype it
//!   computes in, and the errors a user sees. It then asks the operands'
//!   device for its ops ([`ops_for`]) and hands them operands that are
//!   ready: one device, the compute dtype, one shape, and the checked plans
//!   and operand bundles of `args/` (`ConvPlan`, `PoolPlan`,
//!   `MatmulOperands`, `AdamUpdate`...). The device only executes: it
//!   allocates the output, walks the strided operands and runs the kernel.
//! - [`DeviceRuntime`] (`runtime.rs`) is what a device *is* besides: its
//!   caching allocator (every storage's memory, the statistics of
//!   `crate::memory`), where its values live and how they are copied in and
//!   out, pinning, streams, events and synchronisation
//!   ([`runtime_for`]). A storage's memory is a [`Buffer`], whose variants
//!   only this module and the devices look into.
//!
//! Each device is a folder implementing both:
//!
//! | device | ops | runtime |
//! |---|---|---|
//! | the host and logical host devices (`cpu:n`) | [`host::HostOps`]: the loops of `brasa-kernels` on the strided drivers of `host/strided.rs`, on rayon's threads for large tensors | [`host::HostRuntime`]: the registry of logical host devices and their allocators (`host/devices.rs`), page-locked memory |
//! | CUDA (`cuda:n`, feature `cuda`) | `cuda::CudaOps`: kernels compiled to PTX by `cargo xtask kernels` (committed in `brasa-kernels`), launched on the device's current stream, cuBLAS for products | `cuda::CudaRuntime`: one allocator per device, driver streams and events, host↔device copies, asynchronous copies from pinned memory |
//! | meta (`meta:n`) | [`meta::MetaOps`]: allocates what the imitated device's ops allocate, computes nothing | [`meta::MetaRuntime`]: the real caching allocator over a virtual backend, no values |
//!
//! Paths only go down: the public API (`Tensor`, `crate::ops`,
//! `crate::memory`, `Stream`) calls [`ops_for`] and [`runtime_for`], which
//! pick the device's implementation; nothing outside this module matches on
//! a device kind to do its work, and nothing here calls back into
//! `crate::ops`. Adding a device means a folder implementing the two traits;
//! no op changes. (The models are candle's `BackendDevice` /
//! `BackendStorage` and burn's backend traits.)
//!
//! Names: `brasa-alloc` has memory backends (`brasa_alloc::HostBackend`,
//! `brasa_alloc::CudaBackend`, `brasa_alloc::VirtualBackend`) behind its
//! `brasa_alloc::Backend` trait; the runtimes here own caching allocators
//! over them. The ops are `*Ops`, the runtimes `*Runtime`.
//!
//! ```
//! use brasa_tensor::{DType, Tensor};
//!
//! // The same call runs on whichever device holds the operands.
//! let x = Tensor::arange(0.0, 4.0, 1.0, DType::F32)?;
//! let y = (x.exp()? + &x)?;
//! assert_eq!(y.dtype(), DType::F32);
//! # Ok::<(), brasa_tensor::TensorError>(())
//! ```

mod args;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub(crate) mod current_stream;
pub(crate) mod host;
pub(crate) mod im2col;
pub(crate) mod meta;
mod ops;
mod runtime;
pub(crate) mod target;

pub(crate) use args::{
    merged_stride, out_dims, read_checked_indices, AdamUpdate, AttentionOperands, BatchNormBackwardElemt, CompareOp,
    ConvPlan, Distribution, DropoutDraws, Indices, LayerNormBackward, MatmulOperands, PoolPlan, ReduceOp, Sequence,
    SgdUpdate, Update,
};
pub(crate) use ops::{output, run_update, DeviceOps};
pub(crate) use runtime::{AllocatorRef, DeviceEvent, DeviceRuntime};

use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
#[cfg(not(feature = "cuda"))]
use crate::error::TensorError;
use brasa_alloc::{Allocation, CachingAllocator, MemoryCategory, StreamId};

// A device's question that only its backend can answer (an inherent method
// of `Device`, written here so that `device.rs` stays below the backends).
impl Device {
    /// Whether [`Tensor::matmul_out_dtype`](crate::Tensor::matmul_out_dtype)
    /// multiplies f16/bf16 operands on this device as they are (the host's
    /// half kernels sum them into f32), rather than widening both to f32
    /// first. Callers that could either keep a half product or ask for f32
    /// sums (attention, a linear layer's weight gradient) take the f32 sums
    /// only where they cost no more. False for a device this build cannot
    /// run.
    pub fn multiplies_half_into_f32(&self) -> bool {
        ops_for(*self).is_ok_and(|backend| backend.multiplies_half_into_f32())
    }
}

/// The ops of `device`.
pub(crate) fn ops_for(device: Device) -> Result<&'static dyn DeviceOps> {
    match device {
        Device::Cpu(_) => Ok(&host::HostOps),
        #[cfg(feature = "cuda")]
        Device::Cuda(index) => Ok(cuda::CudaOps::get(index)?),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => Err(no_cuda(device)),
        Device::Meta(_) => Ok(meta::ops_for(device)?),
    }
}

/// The runtime of `device`.
#[inline]
pub(crate) fn runtime_for(device: Device) -> Result<&'static dyn DeviceRuntime> {
    match device {
        Device::Cpu(_) => Ok(&host::HostRuntime),
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => Ok(&cuda::CudaRuntime),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => Err(no_cuda(device)),
        Device::Meta(_) => Ok(&meta::MetaRuntime),
    }
}

/// Fresh memory for `bytes` bytes of `dtype` on `device`, counted under
/// `category`: [`DeviceRuntime::allocate`] of the device's runtime. Every
/// op's output comes through here, so the host's allocation (the common
/// case, tens of nanoseconds) is called directly, where it inlines, and the
/// other devices' through their runtime.
#[inline]
pub(crate) fn allocate(device: Device, dtype: DType, bytes: usize, category: MemoryCategory) -> Result<Buffer> {
    match device {
        Device::Cpu(_) => host::HostRuntime.allocate(device, dtype, bytes, category),
        _ => runtime_for(device)?.allocate(device, dtype, bytes, category),
    }
}

/// The error for a CUDA device in a build without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
fn no_cuda(device: Device) -> TensorError {
    TensorError::Device(format!("{device}: brasa-tensor was built without the `cuda` feature"))
}

/// The caching allocator of page-locked host memory, shared by all host
/// devices (`Tensor::pin_memory`).
pub(crate) fn pinned_allocator() -> Result<&'static CachingAllocator<brasa_alloc::HostBackend>> {
    host::devices::pinned_allocator()
}

/// A storage's memory: a block of its device's caching allocator, or on a
/// meta device an accounted block with no memory behind it.
pub(crate) enum Buffer {
    /// Host memory (a logical host device's, or page-locked).
    Host(Allocation<brasa_alloc::HostBackend>),
    /// Device memory of a CUDA device.
    #[cfg(feature = "cuda")]
    Cuda(Allocation<brasa_alloc::CudaBackend>),
    /// Accounted, never backed: see [`crate::MetaDevice`].
    Meta(meta::MetaBuffer),
}

/// Page-locked host memory for `bytes` bytes, from the pool behind
/// [`pinned_allocator`].
pub(crate) fn pinned_buffer(bytes: usize) -> Result<Buffer> {
    Ok(Buffer::Host(pinned_allocator()?.allocate(bytes, StreamId::DEFAULT)?))
}

impl Buffer {
    /// Marks the memory as used by `stream` too, so the allocator reuses it
    /// only after the work queued there so far has finished.
    pub(crate) fn record_stream(&self, stream: StreamId) {
        match self {
            Buffer::Host(block) => block.record_stream(stream),
            #[cfg(feature = "cuda")]
            Buffer::Cuda(block) => block.record_stream(stream),
            Buffer::Meta(buffer) => buffer.record_stream(stream),
        }
    }

    /// The memory category the allocator counts this buffer under.
    pub(crate) fn category(&self) -> MemoryCategory {
        match self {
            Buffer::Host(block) => block.category(),
            #[cfg(feature = "cuda")]
            Buffer::Cuda(block) => block.category(),
            Buffer::Meta(buffer) => buffer.category(),
        }
    }

    /// Counts this buffer under `category` from now on.
    pub(crate) fn set_category(&self, category: MemoryCategory) {
        match self {
            Buffer::Host(block) => block.set_category(category),
            #[cfg(feature = "cuda")]
            Buffer::Cuda(block) => block.set_category(category),
            Buffer::Meta(buffer) => buffer.set_category(category),
        }
    }

    /// The address of the first byte in the process's memory, or the error
    /// for reading it on the host, naming `op`: device memory (of `device`)
    /// is not the process's, and a meta device has none.
    #[inline]
    pub(crate) fn host_addr(&self, op: &'static str, device: Device) -> Result<usize> {
        match self {
            Buffer::Host(block) => Ok(block.addr()),
            #[cfg(feature = "cuda")]
            Buffer::Cuda(_) => Err(cuda::unsupported(op)),
            Buffer::Meta(_) => Err(meta::no_values(op, device)),
        }
    }

    /// Whether memory backs the buffer (false on a meta device: a tensor
    /// there is made without writing its elements).
    pub(crate) fn has_memory(&self) -> bool {
        !matches!(self, Buffer::Meta(_))
    }
}
