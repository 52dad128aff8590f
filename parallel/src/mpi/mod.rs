//! The Open MPI backend (feature `mpi`): one rank per process, started by
//! `mpirun`, across cores or machines. [`crate::init_from_env`] returns
//! this process's rank of `MPI_COMM_WORLD` as a [`Communicator`] whose
//! collectives run through MPI on the tensors' own host memory.
//!
//! ```no_run
//! // Run as: mpirun -np 2 target/release/examples/my_program
//! use brasa_parallel::{abort_job_on_panic, init_from_env, CommOptions, ReduceOp};
//! use brasa_tensor::{DType, Device, Tensor};
//!
//! abort_job_on_panic(); // a panicking rank ends the whole job at once
//! let comm = init_from_env(&CommOptions::default())?;
//! let x = Tensor::full_on([4], (comm.rank() + 1) as f64, DType::F32, Device::CPU)?;
//! comm.all_reduce(&x, ReduceOp::Sum)?; // in place: 1 + 2 on both ranks
//! drop(comm); // leave the group (and finalize MPI) before main returns
//! # Ok::<(), brasa_parallel::ParallelError>(())
//! ```
//!
//! How it behaves:
//!
//! - **Threads.** MPI is initialised with `MPI_THREAD_SERIALIZED` by the
//!   thread that asks for the world (the query of rank and size needs MPI
//!   before the communicator exists), and from then on only the
//!   communicator's worker thread calls MPI, so the `mpi` crate's handles
//!   (which are not `Send`) never leave it. MPI initialises once per
//!   process: asking again returns an error; clone the communicator.
//! - **Checks.** Before each operation the ranks exchange a descriptor of
//!   it (a non-blocking all-gather with the timeout as deadline), so ranks
//!   that disagree get [`ParallelError::Mismatch`] naming both sides on
//!   every rank, and a peer that does not arrive is a
//!   [`ParallelError::Timeout`] rather than a hang ([`engine`] has the
//!   details). MPI errors are [`ParallelError::Mpi`] with MPI's message.
//! - **Reductions** of f32/f64/f16/bf16: sum and avg (sum, then scaled),
//!   max and min with NaN winning; see `ops.rs` for how half types reduce.
//!   Broadcast, all-gather (in place when the input is this rank's slot
//!   of the output) and send/recv move any dtype.
//! - **Ending.** Dropping the last handle says goodbye to the group: when
//!   every rank said it, MPI is finalized and the process can exit 0. A
//!   peer still waiting in a collective instead gets
//!   [`ParallelError::PeerFailed`]. After a timeout or an MPI error MPI is
//!   never finalized (a peer may still be inside a collective, and
//!   `MPI_Finalize` would then hang both): the process exits without it and
//!   `mpirun` ends the job with a failure. Call [`abort_job_on_panic`] at
//!   the start of `main` so that a panic anywhere ends the job at once.
//!   Pass `mpirun --timeout N` as the last line of defence against a rank
//!   stuck outside brasa.
//!
//! [`Communicator`]: crate::Communicator

mod descriptor;
mod engine;
mod ffi;
mod ops;

use crate::communicator::{CollectiveEngine, CommOptions, Communicator, RankInfo};
use crate::error::{ParallelError, Result};
use ::mpi::environment::Threading;
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::Communicator as _;
use brasa_tensor::Device;
use engine::{MpiAbort, MpiBackend, Shared};
use std::sync::{Arc, Mutex, Once};

/// Where this process is in MPI's one life.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Life {
    /// MPI not initialised by brasa yet.
    Before,
    /// A world communicator exists.
    Running,
    /// Its backend ended (MPI finalized, or left initialised on purpose).
    After,
}

static LIFE: Mutex<Life> = Mutex::new(Life::Before);

/// Called by the backend when it ended.
fn ended() {
    *LIFE.lock().unwrap_or_else(|e| e.into_inner()) = Life::After;
}

/// This process's rank of `MPI_COMM_WORLD` as a communicator on
/// `Device::CPU` (what [`crate::init_from_env`] returns under `mpirun`).
pub(crate) fn world(options: &CommOptions) -> Result<Communicator> {
    let op = "init_from_env";
    // Bad options are refused before MPI starts: it initialises once.
    options.check()?;
    let mut life = LIFE.lock().unwrap_or_else(|e| e.into_inner());
    match *life {
        Life::Before => {}
        Life::Running => {
            return Err(ParallelError::invalid(
                op,
                "this process already has its MPI world communicator (MPI initialises once per process): clone \
                 that one",
            ))
        }
        Life::After => {
            return Err(ParallelError::invalid(
                op,
                "this process's MPI world communicator was dropped, which ended MPI; it cannot be initialised \
                 twice in one process",
            ))
        }
    }
    let (universe, provided) = ::mpi::initialize_with_threading(Threading::Serialized).ok_or_else(|| {
        ParallelError::invalid(
            op,
            "MPI was already initialised by other code in this process; brasa needs to initialise it itself",
        )
    })?;
    *life = Life::After;
    if provided < Threading::Serialized {
        // Every rank gets the same level, so every rank finalizes here.
        drop(universe);
        return Err(ParallelError::Mpi {
            rank: 0,
            message: format!(
                "the MPI library provides thread level {provided:?}; brasa's communication thread needs \
                 Serialized (build MPI with thread support)"
            ),
            code: None,
        });
    }
    let (rank, size) = {
        let world = SimpleCommunicator::world();
        (world.rank(), world.size())
    };
    let (rank, world_size) = match (usize::try_from(rank), usize::try_from(size)) {
        (Ok(rank), Ok(size)) if rank < size => (rank, size),
        _ => {
            std::mem::forget(universe);
            return Err(ParallelError::Mpi {
                rank: 0,
                message: format!("MPI reported rank {rank} of {size}"),
                code: None,
            });
        }
    };
    *life = Life::Running;
    drop(life);
    let info = RankInfo { rank, world_size, device: Device::CPU, backend: "mpi" };
    let shared = Arc::new(Shared::default());
    let abort = Arc::new(MpiAbort { shared: Arc::clone(&shared) });
    let timeout = options.timeout;
    let started = Communicator::start(info, options, Some(abort), move || {
        Ok(Box::new(MpiBackend::new(universe, rank, world_size, timeout, shared)?) as Box<dyn CollectiveEngine>)
    });
    if started.is_err() {
        ended();
    }
    started
}

/// Makes a panic on any thread of this process end the whole MPI job at
/// once: installs a panic hook that runs the previous hook (which prints
/// the message) and then calls `MPI_Abort(MPI_COMM_WORLD, 101)`, so
/// `mpirun` kills every rank and exits non-zero.
///
/// Without it, a panicking rank unwinds: its communicator says goodbye,
/// peers waiting in a collective get [`ParallelError::PeerFailed`] and the
/// job fails when the process exits, but a peer waiting anywhere else (in
/// its own computation, or a send to this rank) only notices at its next
/// timeout. Call it first thing in `main` of every MPI program. Every
/// panic aborts the job, even one that would have been caught; before MPI
/// is initialised and after it ended, the hook only runs the previous one.
/// Calling it again does nothing.
pub fn abort_job_on_panic() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            if ::mpi::is_initialized() && !::mpi::is_finalized() {
                // MPI_Abort from this thread while the worker may be inside
                // MPI: outside what MPI_THREAD_SERIALIZED promises, but
                // Open MPI's abort only asks the launcher to kill the job,
                // and the process is going down either way.
                SimpleCommunicator::world().abort(101);
            }
        }));
    });
}
