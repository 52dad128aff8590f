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
//! - [`pipeline`]: a `Sequential` cut into stages on their own devices and
//!   threads (or MPI ranks), trained over micro-batches with GPipe or 1F1B
//!   ([`Pipeline`]).
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
//!
//! ## MPI (feature `mpi`)
//!
//! Build needs Open MPI's `mpicc` and libclang (Debian:
//! `libopenmpi-dev openmpi-bin libclang1-14 libclang-common-14-dev`). Under
//! `mpirun`, [`init_from_env`] returns this process's rank of
//! `MPI_COMM_WORLD`, a [`Communicator`] like any other: every collective on
//! f32/f64/f16/bf16 (copies of any dtype), in place on host tensors, with
//! the same signature checks (a [`ParallelError::Mismatch`] naming both
//! ranks) and timeouts (a [`ParallelError::Timeout`], never a hang).
//!
//! ```no_run
//! # #[cfg(feature = "mpi")]
//! # fn main() -> brasa_parallel::Result<()> {
//! // mpirun -np 2 --bind-to none target/release/examples/mpi_allreduce
//! use brasa_parallel::{abort_job_on_panic, init_from_env, CommOptions, ReduceOp};
//! use brasa_tensor::{DType, Device, Tensor};
//!
//! abort_job_on_panic(); // a panic on any rank ends the job at once
//! let comm = init_from_env(&CommOptions::default())?;
//! let x = Tensor::full_on([4], (comm.rank() + 1) as f64, DType::F32, Device::CPU)?;
//! comm.all_reduce(&x, ReduceOp::Sum)?;
//! drop(comm); // say goodbye: MPI finalizes once every rank did
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "mpi"))]
//! # fn main() {}
//! ```
//!
//! - One rank per process; MPI initialises once per process (clone the
//!   communicator rather than asking again). Only the communicator's worker
//!   thread calls MPI after initialisation (`MPI_THREAD_SERIALIZED`).
//! - Dropping the last handle says goodbye: when every rank has, MPI is
//!   finalized and the job can exit 0; a peer still in a collective gets
//!   [`ParallelError::PeerFailed`]. After a timeout or an MPI error MPI is
//!   left unfinalized on purpose (`MPI_Finalize` would wait for a peer that
//!   is stuck), so the process exits without it and `mpirun` fails the job.
//! - Call `abort_job_on_panic()` first thing in `main`, and pass `mpirun
//!   --timeout N` as the last line of defence.
//! - `examples/mpi_allreduce.rs` measures the all-reduce bus bandwidth;
//!   `tests/mpi.rs` runs 2-rank jobs, including two "hosts" in network
//!   namespaces over TCP.

mod collective;
mod communicator;
mod data_parallel;
mod ddp;
mod deadline;
mod error;
mod health;
mod in_process;
mod launch;
mod memory;
#[cfg(feature = "mpi")]
mod mpi;
#[cfg(feature = "cuda")]
pub mod nccl;
pub mod pipeline;
mod plan;
mod sharding;
mod staging;
mod work;

#[cfg(feature = "mpi")]
pub use self::mpi::abort_job_on_panic;
pub use collective::{Collective, ReduceOp, Signature};
pub use communicator::{
    CollectiveEngine, CommBackend, CommOptions, Communicator, RankInfo, COMM_TIMEOUT_ENV, DEFAULT_COMM_TIMEOUT,
};
pub use data_parallel::{chunk_sizes, DataParallel, DataParallelConfig, LossReduction};
pub use ddp::{
    assign_buckets, Compression, DdpConfig, DdpStats, DistributedDataParallel, NoSync, ZeroStage, BUCKET_CAP_BYTES,
    FIRST_BUCKET_BYTES,
};
pub use error::{ParallelError, Result};
pub use health::Abort;
pub use in_process::in_process_group;
pub use launch::{
    ensure_host_devices, group_on_devices, init_from_env, launched_by_mpi, run_in_process, run_on_devices,
    LaunchOptions,
};
pub use memory::MemoryBreakdown;
pub use pipeline::{Partition, Pipeline, PipelineConfig, PipelineReport, Schedule};
pub use plan::plan_in_process;
pub use sharding::fsdp::{FsdpConfig, FsdpNoSync, FsdpStats, FullyShardedDataParallel, MixedPrecision};
pub use sharding::ZeroOptimizer;
pub use work::Work;
