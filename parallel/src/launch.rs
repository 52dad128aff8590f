//! Starting ranks: [`run_in_process`] runs one closure per rank on its own
//! thread and logical host device, and [`init_from_env`] returns the
//! communicator the process was launched with (MPI's world under `mpirun`,
//! else a single rank), so one program runs alone or distributed unchanged.

use crate::communicator::{CommBackend, CommOptions, Communicator};
use crate::error::{ParallelError, Result};
use crate::in_process::in_process_group;
use brasa_tensor::{host_device_count, planned_host_device_count, set_host_device_count, Device, SharedError};

/// How [`run_in_process`] starts its ranks.
#[derive(Clone, Debug, Default)]
pub struct LaunchOptions {
    /// The communicators' options (timeout).
    pub comm: CommOptions,
    /// Threads each rank's tensor ops may use (a rayon pool per rank).
    /// Default: the machine's cores divided among the ranks, at least 1.
    pub threads_per_rank: Option<usize>,
}

/// Makes sure there are at least `world` logical host devices: raises the
/// count while host devices are not in use yet, else checks it. It never
/// lowers the count the process asked for (with
/// [`brasa_tensor::set_host_device_count`] or `BRASA_HOST_DEVICES`): a
/// larger one is kept.
pub fn ensure_host_devices(world: usize) -> Result<()> {
    if planned_host_device_count().is_some_and(|planned| planned >= world) {
        return Ok(());
    }
    if set_host_device_count(world).is_ok() && host_device_count()? >= world {
        return Ok(());
    }
    let count = host_device_count()?;
    if count < world {
        return Err(ParallelError::invalid(
            "ensure_host_devices",
            format!(
                "{world} ranks need {world} logical host devices but the process has {count}; call \
                 brasa_tensor::set_host_device_count({world}) (or set BRASA_HOST_DEVICES={world}) before the \
                 first tensor is created"
            ),
        ));
    }
    Ok(())
}

/// Communicators for a group of one rank per device in `devices`, on the
/// engine `options` name ([`CommOptions::backend`]): the in-process engine
/// ([`in_process_group`]) or NCCL (`nccl_group`, feature `cuda`).
pub fn group_on_devices(devices: &[Device], options: &CommOptions) -> Result<Vec<Communicator>> {
    match options.chosen_backend() {
        CommBackend::InProcess => in_process_group(devices, options),
        #[cfg(feature = "cuda")]
        CommBackend::Nccl => crate::nccl::nccl_group(devices, options),
        #[cfg(not(feature = "cuda"))]
        CommBackend::Nccl => Err(ParallelError::invalid(
            "group_on_devices",
            "CommBackend::Nccl needs brasa-parallel's `cuda` feature (or brasa's); rebuild with --features cuda",
        )),
    }
}

/// Runs `rank_main` once per rank, `world` ranks, each on its own thread,
/// logical host device `Device::Cpu(rank)` and rayon pool, and returns
/// their results in rank order. A rank that fails or panics leaves the
/// group, so the others' collectives fail too instead of hanging. The
/// failure that set the others off is returned (the lowest rank's own
/// error, before peers' reports that it left: see
/// [`ParallelError::is_knock_on`]), a panic as
/// [`ParallelError::RankPanicked`].
pub fn run_in_process<T, F>(world: usize, options: &LaunchOptions, rank_main: F) -> Result<Vec<T>>
where
    T: Send,
    F: Fn(Communicator) -> Result<T> + Sync,
{
    ensure_host_devices(world)?;
    let devices: Vec<Device> = (0..world).map(Device::cpu).collect();
    run_on_devices(&devices, options, rank_main)
}

/// [`run_in_process`] with rank `i` on `devices[i]` (distinct host devices,
/// or meta devices for a plan: see [`crate::plan_in_process`]).
pub fn run_on_devices<T, F>(devices: &[Device], options: &LaunchOptions, rank_main: F) -> Result<Vec<T>>
where
    T: Send,
    F: Fn(Communicator) -> Result<T> + Sync,
{
    let world = devices.len();
    let comms = group_on_devices(devices, &options.comm)?;
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let threads = options.threads_per_rank.unwrap_or((cores / world).max(1));
    let outcomes: Vec<std::thread::Result<Result<T>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                let rank_main = &rank_main;
                let rank = comm.rank();
                std::thread::Builder::new().name(format!("brasa-rank{rank}")).spawn_scoped(scope, move || {
                    // Named by rank, so profiler tracks say whose work they show.
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .thread_name(move |i| format!("brasa-rank{rank}-worker-{i}"))
                        .build()
                        .map_err(|e| ParallelError::Spawn {
                            op: "run_in_process",
                            what: format!("a rayon pool for rank {rank}"),
                            source: SharedError::new(e),
                        })?;
                    pool.install(|| rank_main(comm))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| match handle {
                Ok(handle) => handle.join(),
                Err(e) => Ok(Err(ParallelError::Spawn {
                    op: "run_in_process",
                    what: "a rank's thread".into(),
                    source: SharedError::new(e),
                })),
            })
            .collect()
    });
    let mut results = Vec::with_capacity(world);
    let mut errors = Vec::new();
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            Ok(Ok(value)) => results.push(value),
            Ok(Err(error)) => errors.push(error),
            Err(payload) => errors.push(ParallelError::RankPanicked { rank, message: panic_message(payload.as_ref()) }),
        }
    }
    match ParallelError::root_cause(&errors).and_then(|at| errors.into_iter().nth(at)) {
        Some(error) => Err(error),
        None => Ok(results),
    }
}

/// The text of a panic payload (`panic!` with a literal or a format).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".into()
    }
}

/// Whether this process was started by an MPI launcher (`mpirun`,
/// `mpiexec`, `srun` with PMI).
pub fn launched_by_mpi() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"].iter().any(|v| std::env::var_os(v).is_some())
}

/// The communicator this process was launched with: MPI's world when
/// started by `mpirun` (needs the `mpi` feature: without it, an error that
/// says so), else a group of one rank on `Device::CPU`.
pub fn init_from_env(options: &CommOptions) -> Result<Communicator> {
    if launched_by_mpi() {
        #[cfg(feature = "mpi")]
        {
            return crate::mpi::world(options);
        }
        #[cfg(not(feature = "mpi"))]
        {
            return Err(ParallelError::invalid(
                "init_from_env",
                "this process was started by an MPI launcher but brasa-parallel was built without its `mpi` \
                 feature; rebuild with --features mpi (or brasa's `mpi` feature)",
            ));
        }
    }
    let mut comms = in_process_group(&[Device::CPU], options)?;
    Ok(comms.remove(0))
}
