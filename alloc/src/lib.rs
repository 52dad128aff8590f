//! # brasa-alloc
//!
//! A caching device-memory allocator with PyTorch's policy as the floor: 512 B
//! rounding, a small pool (≤ 1 MiB, 2 MiB segments) and a large pool (20 MiB
//! segments below 10 MiB, 2 MiB rounding above), best fit per stream with
//! splitting and coalescing, `max_split_size`, power-of-two rounding divisions,
//! garbage collection under a memory fraction, `record_stream` with deferred
//! reuse, and an out-of-memory ladder that ends in an error a person can act on.
//! With `expandable_segments:True` each stream and pool instead grows one
//! segment page by page in a reserved address range, giving whole free pages
//! back (see [`AllocatorConfig::expandable_segments`]).
//!
//! It sits in front of any [`Backend`]: host memory ([`HostBackend`], also
//! page-locked, by `mlock` or by a device driver through [`HostPinning`]), CUDA
//! (`CudaBackend`, feature `cuda`), or a test backend that fails on command
//! ([`FailingBackend`]). Statistics follow `torch.cuda.memory_stats()`;
//! [`CachingAllocator::summary`] prints PyTorch's table, and
//! [`CachingAllocator::snapshot`] plus an opt-in history serialize to JSON.
//! Each block carries a [`MemoryCategory`] (parameter, gradient, optimizer
//! state, activation, …; [`CachingAllocator::allocate_as`]) and the
//! statistics, events, snapshots and table break allocated bytes down by it.
//!
//! No decision depends on where the backend put memory: ties between free
//! blocks are broken by segment creation order and offset, never by
//! address, so the same requests give the same segments and statistics to
//! the byte on any backend — the basis of memory plans computed on a device
//! that is not there.
//!
//! ```
//! use brasa_alloc::{CachingAllocator, HostBackend, StreamId};
//!
//! let alloc = CachingAllocator::new(HostBackend::with_limit(256 << 20));
//! {
//!     let block = alloc.allocate(3 << 20, StreamId::DEFAULT)?;   // 3 MiB from a 20 MiB segment
//!     assert_eq!(block.size(), 3 << 20);
//!     assert_eq!(alloc.allocated_bytes(), 3 << 20);
//! }                                                               // dropped: back to the cache
//! assert_eq!(alloc.allocated_bytes(), 0);
//! assert_eq!(alloc.reserved_bytes(), 20 << 20);                   // still cached...
//! alloc.empty_cache();
//! assert_eq!(alloc.reserved_bytes(), 0);                          // ...until emptied
//! # Ok::<(), brasa_alloc::AllocError>(())
//! ```
//!
//! Configuration comes from [`AllocatorConfig`]'s builder or from
//! `BRASA_ALLOC_CONF` in the `PYTORCH_ALLOC_CONF` format, e.g.
//! `BRASA_ALLOC_CONF=max_split_size_mb:128,garbage_collection_threshold:0.8`.
//!
//! ## Cargo features
//! - `cuda`: `CudaBackend`, device memory through cudarc's driver API, loaded
//!   dynamically (no CUDA toolkit needed to build; no driver is an `Err`).

mod backend;
mod block;
mod caching;
mod category;
mod config;
#[cfg(feature = "cuda")]
mod cuda;
mod error;
mod failing;
mod host;
mod pinning;
pub mod policy;
mod pool;
mod sizes;
mod snapshot;
mod stats;
mod summary;
mod trace;
mod virtual_backend;

pub use backend::{Backend, BackendError, StreamId};
pub use caching::{Allocation, CachingAllocator};
pub use category::MemoryCategory;
pub use config::{AllocatorConfig, AllocatorConfigBuilder, ConfigError, ENV_VAR, VALID_KEYS};
#[cfg(feature = "cuda")]
pub use cuda::CudaBackend;
pub use error::{find_out_of_memory, format_size, AllocError, OutOfMemory};
pub use failing::{FailingBackend, TestEvent};
pub use host::{HostBackend, HOST_ALIGNMENT};
pub use pinning::{HostEvent, HostPinning, StreamEvent};
pub use policy::PoolKind;
pub use snapshot::{BlockSnapshot, BlockState, FragmentationReport, SegmentSnapshot, Snapshot};
pub use stats::{CategoryStats, MemoryStats, Stat, StatArray};
pub use summary::memory_summary;
pub use trace::{AllocObserver, Observer, TraceAction, TraceEntry};
pub use virtual_backend::VirtualBackend;
