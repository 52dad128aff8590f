//! # brasa-parallel
//!
//! Training on several devices for brasa, the Rust deep-learning training
//! runtime: collectives on real engines and the data-parallel wrappers built
//! on them.
//!
//! - [`Communicator`]: rank, world size, and in-place collectives on tensors
//!   of every float dtype — [`all_reduce`](Communicator::all_reduce) (sum,
//!   avg, max, min), [`broadcast`](Communicator::broadcast),
//!   [`all_gather`](Communicator::all_gather),
//!   [`reduce_scatter`](Communicator::reduce_scatter),
//!   [`send`](Communicator::send) / [`recv`](Communicator::recv),
//!   [`barrier`](Communicator::barrier) — each also non-blocking (`_async`,
//!   returning a [`Work`] to wait on or poll). A peer that fails or vanishes
//!   is an `Err` within the communicator's timeout, never a hang; ranks
//!   that disagree on sizes or dtypes get an `Err` naming both.
//! - Backends: in-process ([`in_process_group`], [`run_in_process`]: one
//!   rank per thread and logical host device, through shared memory) and
//!   Open MPI (feature `mpi`), across processes and machines;
//!   [`init_from_env`] picks the one the process was launched with.
//!
//! ```
//! use brasa_parallel::{run_in_process, LaunchOptions, ReduceOp};
//! use brasa_tensor::{DType, Tensor};
//!
//! let sums = run_in_process(2, &LaunchOptions::default(), |comm| {
//!     let x = Tensor::full_on([4], (comm.rank() + 1) as f64, DType::F32, comm.device())?;
//!     comm.all_reduce(&x, ReduceOp::Sum)?;          // 1 + 2 on every rank
//!     Ok(x.to_vec::<f32>()?)
//! })?;
//! assert_eq!(sums, [vec![3.0; 4], vec![3.0; 4]]);
//! # Ok::<(), brasa_parallel::ParallelError>(())
//! ```
//!
//! ## Cargo features
//!
//! - `mpi`: the Open MPI backend (the `mpi` crate; needs an MPI with `mpicc`
//!   and libclang when building).
//! - `cuda`: CUDA tensors through `brasa-tensor`.

mod collective;
mod communicator;
mod data_parallel;
mod ddp;
mod error;
mod health;
mod in_process;
mod launch;
mod memory;
#[cfg(feature = "mpi")]
mod mpi;
mod work;
mod zero;

#[cfg(feature = "mpi")]
pub use self::mpi::abort_job_on_panic;
pub use collective::{Collective, ReduceOp, Signature};
pub use communicator::{Backend, CommOptions, Communicator, RankInfo};
pub use data_parallel::{chunk_sizes, DataParallel, DataParallelConfig, LossReduction};
pub use ddp::{
    assign_buckets, Compression, DdpConfig, DdpStats, DistributedDataParallel, NoSync, ZeroStage, BUCKET_CAP_BYTES,
    FIRST_BUCKET_BYTES,
};
pub use error::{ParallelError, Result};
pub use health::Abort;
pub use in_process::in_process_group;
pub use launch::{ensure_host_devices, init_from_env, launched_by_mpi, run_in_process, LaunchOptions};
pub use memory::MemoryBreakdown;
pub use work::Work;
pub use zero::ZeroOptimizer;
