//! # brasa-tensor
//!
//! Strided tensors for brasa, the Rust deep-learning training runtime:
//! devices ([`Device`]: the host, logical host devices, CUDA), dtypes
//! ([`DType`], with PyTorch's promotion), views that share storage
//! ([`Layout`]), constructors, and ops whose loops live in `brasa-kernels`.
//! Every tensor's memory comes from its device's caching allocator
//! (`brasa-alloc`): it goes back to the cache when the last tensor using it is
//! dropped, and [`memory`] reports allocated, reserved and peak bytes for every
//! device, as `torch.cuda.memory_*` does.
//!
//! ```
//! use brasa_tensor::{memory, DType, Device, Tensor};
//!
//! let dev = Device::CPU;
//! let before = memory::allocated(dev)?;
//! {
//!     let x = Tensor::arange(0.0, 6.0, 1.0, DType::F32)?.reshape(&[2, 3])?;
//!     let y = x.t()?;                              // a view: same storage
//!     assert!(y.shares_storage_with(&x));
//!     let z = x.matmul(&y)?;                       // [2, 3] · [3, 2]
//!     assert_eq!(z.to_vec::<f32>()?, [5.0, 14.0, 14.0, 50.0]);
//!     assert_eq!(z.sum_all()?.item::<f32>()?, 83.0);
//! }
//! assert_eq!(memory::allocated(dev)?, before);     // freed when the scope ended
//! # Ok::<(), brasa_tensor::TensorError>(())
//! ```
//!
//! Errors are values ([`TensorError`]) that name the problem: shapes, dtypes,
//! devices, indices, out-of-memory. Nothing panics on bad input.
//!
//! ## Cargo features
//!
//! - `cuda`: CUDA devices through `brasa-alloc`'s CUDA backend: host↔device
//!   copies, and every op through the device seam (`backend`): the PTX
//!   kernels of `brasa-kernels`, matrix products and convolutions on cuBLAS.

mod backend;
pub(crate) mod construct;
#[cfg(feature = "cuda")]
pub mod cuda_interop;
#[cfg(feature = "cuda")]
pub mod cuda_library;
pub mod cudnn;
mod default_generator;
mod device;
mod dispatch;
mod display;
pub mod dtype;
mod error;
mod host_access;
mod inplace;
pub mod layout;
pub mod memory;
mod ops;
mod profiling;
pub mod rng;
mod scalar;
pub mod shape;
mod storage;
mod stream;
mod tensor;
pub mod threads;

pub use backend::host::devices::{
    host_device_count, parse_byte_size, planned_host_device_count, set_host_allocator_config, set_host_device_count,
    set_host_memory_limit, HOST_DEVICES_ENV, HOST_MEMORY_LIMIT_ENV, MAX_HOST_DEVICES,
};
pub use backend::meta::{FailedAllocation, LiveTensor, MetaDevice, PlanAssumption};
pub use backend::target::{MemoryTarget, TargetKind, CUDA_GRANULARITY};
/// The kernel errors a [`TensorError::Kernel`], [`TensorError::Index`] or
/// [`TensorError::ScratchTooLarge`] carries as its source.
pub use brasa_kernels::{index::IndexError, scratch::ScratchError, KernelError};
pub use default_generator::{manual_seed, rng_state, set_rng_state};
pub use device::{cuda_device_count, default_device, set_default_device, Device};
pub use dtype::{convert_slice, DType, DTypeError, WithDType};
pub use error::{ErrorBox, Result, SharedError, TensorError};
pub use host_access::{HostBytes, HostBytesMut};
pub use layout::{ContiguousRuns, Layout, LayoutError, StridedOffsets};
pub use ops::Conv2dParams;
pub use ops::Pool2dParams;
pub use ops::ScatterReduce;
pub use ops::{fused_adam_, AdamOptions, AdamParam};
pub use ops::{fused_sgd_, SgdOptions, SgdParam};
pub use ops::{Conv1dParams, ConvTranspose1dParams, ConvTranspose2dParams};
pub use ops::{FusedAttention, FusedAttentionBackward, FusedAttentionConfig};
pub use rng::{philox4x32_10, Generator, GeneratorState, RngError};
pub use shape::{broadcast_shapes, resolve_dim, DimIndex, Shape};
pub use storage::Storage;
pub use stream::{synchronize, Event, Stream, StreamGuard};
pub use tensor::Tensor;
