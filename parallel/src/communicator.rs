//! [`Communicator`]: one rank's handle on a process group, and
//! [`CollectiveEngine`], the narrow interface an engine (in-process
//! threads, Open MPI, later NCCL) implements to execute collectives.
//!
//! Every communicator owns one worker thread, its *communication stream*:
//! operations run there one after another in submission order, so a
//! non-blocking collective returns a [`Work`] at once and overlaps with the
//! caller's computation, and blocking calls are a submission plus a wait.
//! That is NCCL's model (work enqueued on a stream, one communicator per
//! device) and what Open MPI needs (it only progresses inside MPI calls, so
//! a thread that stays inside them is what makes overlap real).

use crate::collective::{Collective, ReduceOp};
use crate::deadline::Deadline;
use crate::error::{ParallelError, Result};
use crate::health::{Abort, Health};
use crate::work::{Completion, Work};
use brasa_tensor::{Device, Event, SharedError, Stream, Tensor};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// The engine behind a communicator. It runs on the communicator's worker
/// thread (created there by the factory given to [`Communicator::start`],
/// so engines whose handles must stay on one thread, like MPI's, fit), one
/// operation at a time, already validated for this rank alone. It compares
/// [`Collective::signature`]s with its peers before moving data and never
/// blocks longer than its timeout.
pub trait CollectiveEngine {
    /// Executes `op` to completion.
    fn run(&mut self, op: &Collective) -> Result<()>;

    /// Whether the engine reads and writes CUDA device memory itself
    /// (NCCL). Engines that do not (the default) get CUDA tensors staged
    /// through host memory by the communicator.
    fn reads_device_memory(&self) -> bool {
        false
    }

    /// Executes `op` to completion once `ready` has passed: an event
    /// recorded on the submitting thread's current stream when the engine
    /// [reads device memory](CollectiveEngine::reads_device_memory), so
    /// that the collective sees the kernels that produced its inputs.
    /// Engines that move host bytes ignore it.
    fn run_after(&mut self, op: &Collective, ready: Option<&Event>) -> Result<()> {
        let _ = ready;
        self.run(op)
    }
}

/// The environment variable that sets [`CommOptions::default`]'s timeout,
/// in seconds.
pub const COMM_TIMEOUT_ENV: &str = "BRASA_COMM_TIMEOUT_S";

/// The default timeout when [`COMM_TIMEOUT_ENV`] is not set: 300 s.
pub const DEFAULT_COMM_TIMEOUT: Duration = Duration::from_secs(300);

/// Which engine a group of ranks in one process uses
/// ([`CommOptions::backend`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CommBackend {
    /// Threads exchanging through shared host memory; CUDA tensors are
    /// staged through pinned host buffers. Works on every device kind.
    #[default]
    InProcess,
    /// NCCL between CUDA devices (feature `cuda`).
    Nccl,
}

/// Settings of a communicator.
#[derive(Clone, Debug)]
pub struct CommOptions {
    /// How long a rank waits for its peers in one operation before it
    /// returns [`ParallelError::Timeout`]. Default: 300 s, or the
    /// `BRASA_COMM_TIMEOUT_S` environment variable. Any positive duration;
    /// one too long to add to the current instant (`Duration::MAX`) waits
    /// without end. Zero is refused when a communicator starts (every
    /// collective would fail). Set it with [`CommOptions::timeout`], which
    /// also sets aside an invalid `BRASA_COMM_TIMEOUT_S`.
    pub timeout: Duration,
    /// Why `BRASA_COMM_TIMEOUT_S` could not be used, when it could not:
    /// reported by every communicator started with these options.
    pub(crate) env_error: Option<String>,
    /// The engine of groups started in one process ([`CommOptions::backend`]).
    pub(crate) backend: CommBackend,
}

impl Default for CommOptions {
    /// The default timeout, or `BRASA_COMM_TIMEOUT_S` when it is set. An
    /// invalid value is not silently replaced: it is kept, and reported by
    /// [`Communicator::start`] (and so by `in_process_group`,
    /// `run_in_process`, `init_from_env`, `DataParallel`) unless
    /// [`CommOptions::timeout`] overrides it. [`CommOptions::from_env`]
    /// reports it at once.
    fn default() -> CommOptions {
        match CommOptions::from_env() {
            Ok(options) => options,
            Err(error) => CommOptions {
                timeout: DEFAULT_COMM_TIMEOUT,
                env_error: Some(error.to_string()),
                backend: CommBackend::default(),
            },
        }
    }
}

impl CommOptions {
    /// The defaults with `BRASA_COMM_TIMEOUT_S` applied when it is set: a
    /// positive number of seconds (`2.5`, `600`); one larger than a
    /// `Duration` holds (`1e30`, `inf`) is `Duration::MAX`, no timeout.
    /// Anything else (not a number, NaN, zero, negative) is an error naming
    /// the variable and its value.
    pub fn from_env() -> Result<CommOptions> {
        let timeout = match std::env::var(COMM_TIMEOUT_ENV) {
            Err(std::env::VarError::NotPresent) => DEFAULT_COMM_TIMEOUT,
            Err(std::env::VarError::NotUnicode(value)) => {
                return Err(ParallelError::invalid(
                    "CommOptions",
                    format!("{COMM_TIMEOUT_ENV}={value:?} is not valid UTF-8; expected a positive number of seconds"),
                ))
            }
            Ok(text) => crate::deadline::seconds_to_timeout(&text).ok_or_else(|| {
                ParallelError::invalid(
                    "CommOptions",
                    format!(
                        "{COMM_TIMEOUT_ENV}={text:?}: expected a positive number of seconds, such as 300 or 2.5 \
                         (inf: no timeout)"
                    ),
                )
            })?,
        };
        Ok(CommOptions { timeout, env_error: None, backend: CommBackend::default() })
    }

    /// These options with `timeout` (this wins over `BRASA_COMM_TIMEOUT_S`,
    /// valid or not).
    pub fn timeout(mut self, timeout: Duration) -> CommOptions {
        self.timeout = timeout;
        self.env_error = None;
        self
    }

    /// These options with `backend` as the engine of groups that
    /// [`run_on_devices`](crate::run_on_devices),
    /// [`DataParallel`](crate::DataParallel) and
    /// [`group_on_devices`](crate::group_on_devices) start in one process
    /// (PyTorch's `init_process_group(backend=...)`). Default:
    /// [`CommBackend::InProcess`].
    pub fn backend(mut self, backend: CommBackend) -> CommOptions {
        self.backend = backend;
        self
    }

    /// The engine of groups started in one process.
    pub fn chosen_backend(&self) -> CommBackend {
        self.backend
    }

    /// Whether a communicator can start with these options: the
    /// environment's timeout was valid (or overridden) and the timeout is
    /// not zero.
    pub fn check(&self) -> Result<()> {
        if let Some(error) = &self.env_error {
            return Err(ParallelError::invalid("CommOptions", error.clone()));
        }
        if self.timeout.is_zero() {
            return Err(ParallelError::invalid(
                "CommOptions",
                "a timeout of 0 would make every collective fail at once; give a positive duration \
                 (Duration::MAX: no timeout)",
            ));
        }
        Ok(())
    }
}

/// Who a rank is: what every backend reports.
#[derive(Clone, Debug)]
pub struct RankInfo {
    /// This rank, `0..world_size`.
    pub rank: usize,
    /// Ranks in the group.
    pub world_size: usize,
    /// The device this rank's tensors live on.
    pub device: Device,
    /// The engine's name (`in-process`, `mpi`).
    pub backend: &'static str,
}

/// An operation, the event its inputs are ready at (device-memory
/// engines), and where its result goes.
type Job = (Collective, Option<Event>, Arc<Completion>);

struct Inner {
    info: RankInfo,
    timeout: Duration,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
    health: Arc<Health>,
    /// The engine reads CUDA memory itself: no staging, a ready event instead.
    device_native: bool,
}

/// One rank's handle on a process group. Cheap to clone (all clones share
/// one communication stream); dropping the last clone leaves the group, so
/// a rank that returns, fails or panics makes its peers' pending and later
/// collectives fail fast instead of hanging.
///
/// Collectives take tensors on this rank's device and work in place. Each
/// has a blocking form and an `_async` form returning a [`Work`].
#[derive(Clone)]
pub struct Communicator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.inner.info.rank)
            .field("world_size", &self.inner.info.world_size)
            .field("device", &self.inner.info.device)
            .field("backend", &self.inner.info.backend)
            .finish()
    }
}

impl Communicator {
    /// Starts a communicator whose engine `make_backend` builds on the new
    /// worker thread. `abort`, if given, is how this rank leaves the group
    /// from another thread (on drop or after a failure).
    pub fn start(
        info: RankInfo,
        options: &CommOptions,
        abort: Option<Arc<dyn Abort>>,
        make_backend: impl FnOnce() -> Result<Box<dyn CollectiveEngine>> + Send + 'static,
    ) -> Result<Communicator> {
        options.check()?;
        let (jobs, queue) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<bool>>();
        let health = Arc::new(Health::new(info.rank, abort));
        let worker_health = Arc::clone(&health);
        let (rank, backend_name) = (info.rank, info.backend);
        let worker = std::thread::Builder::new()
            .name(format!("brasa-comm-{backend_name}-rank{rank}"))
            .spawn(move || {
                let mut backend = match make_backend() {
                    Ok(backend) => {
                        let _ = ready_tx.send(Ok(backend.reads_device_memory()));
                        backend
                    }
                    Err(error) => {
                        let _ = ready_tx.send(Err(error));
                        return;
                    }
                };
                while let Ok((op, ready, completion)) = queue.recv() {
                    let result = worker_health.check().and_then(|()| {
                        let _range = brasa_profile::record_function(range_name(&op));
                        backend.run_after(&op, ready.as_ref())
                    });
                    if let Err(error) = &result {
                        if !matches!(error, ParallelError::Broken { .. }) {
                            worker_health.fail(error);
                        }
                    }
                    // The job's tensor handles go before the waiter wakes:
                    // a caller that drops its own handle after `wait` frees
                    // the memory then and there, not whenever this thread
                    // is next scheduled (memory plans depend on it).
                    drop(op);
                    completion.complete(result);
                }
            })
            .map_err(|e| ParallelError::Spawn {
                op: "Communicator::start",
                what: "the worker thread".into(),
                source: SharedError::new(e),
            })?;
        let device_native = match ready_rx.recv() {
            Ok(Ok(device_native)) => device_native,
            Ok(Err(error)) => {
                let _ = worker.join();
                return Err(error);
            }
            Err(_) => {
                let _ = worker.join();
                return Err(ParallelError::invalid("Communicator::start", "the backend's worker thread panicked"));
            }
        };
        Ok(Communicator {
            inner: Arc::new(Inner {
                info,
                timeout: options.timeout,
                jobs: Mutex::new(Some(jobs)),
                worker: Mutex::new(Some(worker)),
                health,
                device_native,
            }),
        })
    }

    /// This rank, `0..world_size()`.
    pub fn rank(&self) -> usize {
        self.inner.info.rank
    }

    /// Ranks in the group.
    pub fn world_size(&self) -> usize {
        self.inner.info.world_size
    }

    /// The device this rank's tensors live on.
    pub fn device(&self) -> Device {
        self.inner.info.device
    }

    /// The engine's name (`in-process`, `mpi`).
    pub fn backend(&self) -> &'static str {
        self.inner.info.backend
    }

    /// How long one operation may wait for peers.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// Marks this communicator failed by `error` (as a failed collective
    /// would): later work is refused and the peers are told, so they stop
    /// waiting on this rank at once rather than at their timeout.
    pub(crate) fn give_up(&self, error: &ParallelError) {
        self.inner.health.fail(error);
    }

    /// Whether an earlier failure made this communicator refuse work.
    pub fn is_broken(&self) -> bool {
        self.inner.health.check().is_err()
    }

    /// Submits `op` to the communication stream: validated here (errors
    /// come back at once, in the returned `Work`), run in order on the worker.
    pub fn submit(&self, op: Collective) -> Work {
        let (rank, name) = (self.rank(), op.name());
        let health = Arc::clone(&self.inner.health);
        if let Err(error) = self.check_submission(&op) {
            return Work::finished(Err(error), health, name, rank);
        }
        // CUDA tensors: an engine that reads device memory orders the
        // collective after this thread's work with an event; the others
        // move host bytes (see staging.rs).
        let mut ready = None;
        if self.inner.device_native {
            if let Device::Cuda(_) = self.device() {
                match Stream::current(self.device()).record_event(false) {
                    Ok(event) => ready = Some(event),
                    Err(error) => return Work::finished(Err(error.into()), health, name, rank),
                }
            }
        }
        let (op, staged) = if !self.inner.device_native && crate::staging::needs_staging(&op) {
            match crate::staging::stage(&op) {
                Ok(staged) => {
                    let op = staged.op.clone();
                    (op, Some(staged))
                }
                Err(error) => return Work::finished(Err(error), health, name, rank),
            }
        } else {
            (op, None)
        };
        let completion = Arc::new(Completion::default());
        let sent = match &*self.inner.jobs.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(jobs) => jobs.send((op, ready, Arc::clone(&completion))).is_ok(),
            None => false,
        };
        if !sent {
            let error =
                ParallelError::Broken { rank, cause: "the communication worker has stopped".into(), source: None };
            return Work::finished(Err(error), health, name, rank);
        }
        let work = Work::new(completion, health, name, rank, self.inner.timeout);
        match staged {
            Some(staged) => work.then(move || staged.finish()),
            None => work,
        }
    }

    fn check_submission(&self, op: &Collective) -> Result<()> {
        self.inner.health.check()?;
        op.validate(self.rank(), self.world_size())?;
        let device = self.device();
        let tensors = op.tensors();
        for tensor in tensors {
            if tensor.device() != device {
                return Err(ParallelError::invalid(
                    op.name(),
                    format!("rank {} works on {device} but the tensor is on {}", self.rank(), tensor.device()),
                ));
            }
        }
        Ok(())
    }

    /// Reduces `tensor` over all ranks, in place, without blocking.
    pub fn all_reduce_async(&self, tensor: &Tensor, op: ReduceOp) -> Work {
        self.submit(Collective::AllReduce { tensor: tensor.clone(), op })
    }

    /// Reduces `tensor` over all ranks, in place.
    pub fn all_reduce(&self, tensor: &Tensor, op: ReduceOp) -> Result<()> {
        self.all_reduce_async(tensor, op).wait()
    }

    /// Copies `root`'s `tensor` into every rank's, without blocking.
    pub fn broadcast_async(&self, tensor: &Tensor, root: usize) -> Work {
        self.submit(Collective::Broadcast { tensor: tensor.clone(), root })
    }

    /// Copies `root`'s `tensor` into every rank's.
    pub fn broadcast(&self, tensor: &Tensor, root: usize) -> Result<()> {
        self.broadcast_async(tensor, root).wait()
    }

    /// Gathers every rank's `input` into `output` (world × input elements,
    /// in rank order), without blocking.
    pub fn all_gather_async(&self, output: &Tensor, input: &Tensor) -> Work {
        self.submit(Collective::AllGather { input: input.clone(), output: output.clone() })
    }

    /// Gathers every rank's `input` into `output` (world × input elements,
    /// in rank order). `input` may be this rank's slice of `output`.
    pub fn all_gather(&self, output: &Tensor, input: &Tensor) -> Result<()> {
        self.all_gather_async(output, input).wait()
    }

    /// Reduces slice `rank` of every rank's `input` into `output`, without
    /// blocking.
    pub fn reduce_scatter_async(&self, output: &Tensor, input: &Tensor, op: ReduceOp) -> Work {
        self.submit(Collective::ReduceScatter { input: input.clone(), output: output.clone(), op })
    }

    /// Reduces slice `rank` of every rank's `input` (world × output
    /// elements) into `output`.
    pub fn reduce_scatter(&self, output: &Tensor, input: &Tensor, op: ReduceOp) -> Result<()> {
        self.reduce_scatter_async(output, input, op).wait()
    }

    /// Sends `tensor` to rank `peer`, without blocking.
    pub fn send_async(&self, tensor: &Tensor, peer: usize) -> Work {
        self.submit(Collective::Send { tensor: tensor.clone(), peer })
    }

    /// Sends `tensor` to rank `peer` (returns once it was received).
    pub fn send(&self, tensor: &Tensor, peer: usize) -> Result<()> {
        self.send_async(tensor, peer).wait()
    }

    /// Receives into `tensor` what rank `peer` sends, without blocking.
    pub fn recv_async(&self, tensor: &Tensor, peer: usize) -> Work {
        self.submit(Collective::Recv { tensor: tensor.clone(), peer })
    }

    /// Receives into `tensor` what rank `peer` sends.
    pub fn recv(&self, tensor: &Tensor, peer: usize) -> Result<()> {
        self.recv_async(tensor, peer).wait()
    }

    /// Returns once every rank called it, without blocking.
    pub fn barrier_async(&self) -> Work {
        self.submit(Collective::Barrier)
    }

    /// Returns once every rank called it.
    pub fn barrier(&self) -> Result<()> {
        self.barrier_async().wait()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Leave first, so that peers (and our own worker, if it waits on
        // them) stop waiting; then let the worker finish and join it.
        self.health.leave("left the group (its communicator was dropped: the rank returned, failed or panicked)");
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(worker) = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            // The join is bounded: a worker finishes its queue and its
            // backend's goodbye within the timeout, unless it is stuck in a
            // call that never returns (an MPI collective whose peer froze
            // mid-transfer). Such a worker is detached rather than waited
            // on forever: it owns nothing but its backend, and the process
            // may exit under it.
            // A timeout too long to add to now (Duration::MAX) waits for it
            // as the user asked; nothing here may overflow and panic: a
            // panic in a drop while unwinding aborts the process.
            let deadline = Deadline::after(self.timeout.saturating_add(Duration::from_secs(1)));
            let mut pause = Duration::from_micros(20);
            while !worker.is_finished() && !deadline.passed() {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(5));
            }
            if worker.is_finished() {
                let _ = worker.join();
            }
        }
    }
}

fn range_name(op: &Collective) -> String {
    let bytes = op.bytes();
    if matches!(op, Collective::Barrier) {
        return "comm: barrier".into();
    }
    let size = if bytes >= 1 << 20 {
        format!("{:.2} MiB", bytes as f64 / (1u64 << 20) as f64)
    } else if bytes >= 1 << 10 {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    } else {
        format!("{bytes} B")
    };
    format!("comm: {} ({size})", op.name())
}
