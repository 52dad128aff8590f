//! The error every `brasa-parallel` operation returns. Failures of a peer are
//! values here, never a hang or a panic: a rank that left, a collective that
//! did not complete within the communicator's timeout, ranks that disagree on
//! what they are doing (the error names both sides).

use brasa_autograd::AutogradError;
use brasa_nn::NnError;
use brasa_tensor::{ErrorBox, SharedError, TensorError};
use std::time::Duration;

/// Why a parallel operation failed.
///
/// Errors from below keep their structure: tensor, autograd and nn errors
/// as they are, a replica's error inside [`ParallelError::Replica`], the
/// first failure inside [`ParallelError::Broken`] and
/// [`ParallelError::Unusable`], and foreign errors (a thread or a thread
/// pool that could not be started) as the [`std::error::Error::source`].
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ParallelError {
    /// A tensor operation failed (shapes, dtypes, devices, out of memory).
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// An autograd operation failed.
    #[error(transparent)]
    Autograd(#[from] AutogradError),
    /// An `nn` operation (module walk, optimizer) failed.
    #[error(transparent)]
    Nn(#[from] NnError),
    /// A collective did not complete within the communicator's timeout.
    #[error(
        "rank {rank}: {op} did not complete within {timeout:?}{}; a peer is slow, stuck, or is not taking part \
         (raise the timeout with CommOptions::timeout if a step is legitimately this slow)",
        waiting_on(.waiting_for)
    )]
    Timeout {
        /// The collective.
        op: &'static str,
        /// The rank that waited.
        rank: usize,
        /// How long it waited.
        timeout: Duration,
        /// The ranks that had not arrived (empty when unknown, e.g. under MPI).
        waiting_for: Vec<usize>,
    },
    /// A peer left the group (its communicator was dropped: it returned,
    /// failed or panicked) while this rank needed it.
    #[error("rank {rank}: {op} cannot complete: rank {peer} {reason}")]
    PeerFailed {
        /// The collective.
        op: &'static str,
        /// The rank that noticed.
        rank: usize,
        /// The rank that is gone.
        peer: usize,
        /// What became of it.
        reason: String,
    },
    /// Ranks called different collectives, or with different sizes or dtypes.
    #[error("rank {rank}: {op}: this rank has {ours}, rank {peer} has {theirs}")]
    Mismatch {
        /// The collective this rank called.
        op: &'static str,
        /// This rank.
        rank: usize,
        /// What this rank passed.
        ours: String,
        /// The disagreeing rank.
        peer: usize,
        /// What that rank passed.
        theirs: String,
    },
    /// A communicator that already failed (a timeout or a lost peer) refuses
    /// further work, as an aborted NCCL communicator does.
    #[error("rank {rank}: the communicator is unusable after an earlier failure: {cause}")]
    Broken {
        /// This rank.
        rank: usize,
        /// The first failure, in words.
        cause: String,
        /// The first failure itself, when it was an error of this rank's
        /// communicator (not a peer's departure).
        #[source]
        source: Option<ErrorBox<ParallelError>>,
    },
    /// A [`DataParallel`](crate::DataParallel) whose optimizer step failed
    /// on some replica refuses further work (the replicas may disagree);
    /// the failure is the source.
    #[error("{op}: this DataParallel is unusable after a failed optimizer step ({source}); build a new one")]
    Unusable {
        /// The call refused.
        op: &'static str,
        /// The failure of the optimizer step.
        #[source]
        source: ErrorBox<ParallelError>,
    },
    /// A thread or a thread pool could not be started; the system's error
    /// (a [`std::io::Error`], a `rayon::ThreadPoolBuildError`) is the source.
    #[error("{op}: cannot start {what}: {source}")]
    Spawn {
        /// The operation.
        op: &'static str,
        /// What could not be started (`"the worker thread of rank 1"`).
        what: String,
        /// The system's error.
        #[source]
        source: SharedError,
    },
    /// A rank's thread panicked (in-process groups).
    #[error("rank {rank} panicked: {message}")]
    RankPanicked {
        /// The rank.
        rank: usize,
        /// The panic message.
        message: String,
    },
    /// One replica of a [`DataParallel`](crate::DataParallel) failed; the
    /// replica's own error is kept whole in `source`.
    #[error("{op}: replica {rank} on {device}: {source}{}", others_too(.others))]
    Replica {
        /// The call that failed.
        op: &'static str,
        /// The replica.
        rank: usize,
        /// Its device.
        device: brasa_tensor::Device,
        /// What went wrong there.
        #[source]
        source: ErrorBox<ParallelError>,
        /// Replicas that failed too (usually because of this one).
        others: Vec<usize>,
    },
    /// A pipeline stage failed: which stage, on which device, what it was
    /// doing (`forward (input [8, 30] from stage 0)`, `loss`, `backward`,
    /// `receive gradient`) and for which micro-batch; its own error (a
    /// shape mismatch, a panic, a neighbour that stopped) is the source.
    #[error("pipeline stage {stage} on {device}: {action}{}: {source}", for_micro_batch(.micro_batch))]
    Stage {
        /// The stage.
        stage: usize,
        /// Its device.
        device: brasa_tensor::Device,
        /// What it was doing.
        action: String,
        /// The micro-batch, when the failure belongs to one.
        micro_batch: Option<usize>,
        /// What went wrong there.
        #[source]
        source: ErrorBox<ParallelError>,
    },
    /// The MPI library reported an error.
    #[error("rank {rank}: MPI: {message}")]
    Mpi {
        /// This rank.
        rank: usize,
        /// What MPI said (with the call that failed).
        message: String,
        /// The MPI error code, when an MPI call returned one.
        code: Option<i32>,
    },
    /// The NCCL library reported an error (or could not be used).
    #[error("rank {rank}: NCCL: {call} failed: {message}")]
    Nccl {
        /// This rank.
        rank: usize,
        /// The NCCL call (`ncclAllReduce`, `ncclCommInitRank`).
        call: &'static str,
        /// What NCCL said: its error string and, where it keeps one, the
        /// communicator's last error message.
        message: String,
        /// NCCL's `ncclResult_t` code (0 when the failure was not a call's).
        code: i32,
    },
    /// Parameters that got no gradient in a data-parallel backward; their
    /// all-reduce would never start. Named by their paths in the module.
    #[error(
        "rank {rank}: {} parameter(s) received no gradient in this step: {}; if the model really skips them, \
         construct DistributedDataParallel with DdpConfig {{ find_unused_parameters: true, .. }}",
        .names.len(),
        .names.join(", ")
    )]
    UnusedParameters {
        /// This rank.
        rank: usize,
        /// The parameters' dotted paths.
        names: Vec<String>,
    },
    /// An invalid argument or configuration, or a call out of order.
    #[error("{op}: {message}")]
    Invalid {
        /// The operation.
        op: &'static str,
        /// What was wrong, with the values seen.
        message: String,
    },
}

fn others_too(ranks: &[usize]) -> String {
    if ranks.is_empty() {
        String::new()
    } else {
        format!(" (replicas {ranks:?} failed too)")
    }
}

fn for_micro_batch(micro_batch: &Option<usize>) -> String {
    micro_batch.map_or_else(String::new, |j| format!(" of micro-batch {j}"))
}

fn waiting_on(ranks: &[usize]) -> String {
    match ranks {
        [] => String::new(),
        [one] => format!(" (waiting for rank {one})"),
        many => format!(" (waiting for ranks {many:?})"),
    }
}

impl ParallelError {
    /// A [`ParallelError::Invalid`] for `op`.
    pub fn invalid(op: &'static str, message: impl Into<String>) -> ParallelError {
        ParallelError::Invalid { op, message: message.into() }
    }

    /// The allocator's out-of-memory report, if this error is (or wraps) an
    /// out of memory: from a tensor, autograd or nn operation, or from the
    /// replica a [`ParallelError::Replica`] names (its device is in the
    /// report).
    pub fn as_out_of_memory(&self) -> Option<&brasa_alloc::OutOfMemory> {
        match self {
            ParallelError::Tensor(error) => error.as_out_of_memory(),
            ParallelError::Autograd(error) => error.as_out_of_memory(),
            ParallelError::Nn(error) => error.as_out_of_memory(),
            ParallelError::Replica { source, .. }
            | ParallelError::Unusable { source, .. }
            | ParallelError::Stage { source, .. } => source.as_out_of_memory(),
            ParallelError::Broken { source: Some(source), .. } => source.as_out_of_memory(),
            _ => None,
        }
    }

    /// Whether this error only reports that another rank failed: a peer
    /// that left, a communicator broken by an earlier failure, or a timeout
    /// waiting for the others, also when it surfaces through autograd or
    /// nn (a DDP hook's collective fails inside `backward()`). When several
    /// ranks fail, the error worth showing is one for which this is false:
    /// the failure that set the others off.
    pub fn is_knock_on(&self) -> bool {
        let inner = match self {
            ParallelError::Autograd(error) => ParallelError::find_in(error),
            ParallelError::Nn(NnError::Autograd(error)) => ParallelError::find_in(error),
            other => Some(other),
        };
        matches!(
            inner,
            Some(ParallelError::PeerFailed { .. } | ParallelError::Broken { .. } | ParallelError::Timeout { .. })
        )
    }

    /// Of several ranks' errors in rank order, the position of the one that
    /// set the others off: the first that is not a knock-on
    /// ([`ParallelError::is_knock_on`]), else the first. `None` when there
    /// is none.
    pub(crate) fn root_cause<'a>(errors: impl IntoIterator<Item = &'a ParallelError>) -> Option<usize> {
        let mut first = None;
        for (at, error) in errors.into_iter().enumerate() {
            if !error.is_knock_on() {
                return Some(at);
            }
            first.get_or_insert(at);
        }
        first
    }

    /// The `ParallelError` inside an autograd or nn error (a failure in a
    /// DDP hook surfaces from `backward()` that way), or this one.
    pub fn find_in(error: &AutogradError) -> Option<&ParallelError> {
        error.downcast_external::<ParallelError>()
    }
}

impl From<ParallelError> for AutogradError {
    fn from(error: ParallelError) -> AutogradError {
        match error {
            ParallelError::Autograd(inner) => inner,
            other => AutogradError::external(other),
        }
    }
}

impl From<ParallelError> for NnError {
    fn from(error: ParallelError) -> NnError {
        match error {
            ParallelError::Nn(inner) => inner,
            ParallelError::Tensor(inner) => NnError::Tensor(inner),
            other => NnError::Autograd(AutogradError::from(other)),
        }
    }
}

/// `Result` with [`ParallelError`].
pub type Result<T> = std::result::Result<T, ParallelError>;
