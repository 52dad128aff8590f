//! [`SplitPeers`]: what the ranks of a data-parallel group do together so
//! that every rank takes the same split and none waits for another forever.

use crate::error::Result;

/// How one rank's part of a step ended, as the ranks compare it: the
/// largest outcome over the ranks wins ([`SplitPeers::agree`] is a
/// maximum), so one rank's failure reaches every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SplitOutcome {
    /// Done without trouble.
    Finished,
    /// The allocator had to free its cache and retry during the step (a
    /// warning sign: the next step may not fit).
    Thrashed,
    /// Out of memory: every rank splits further and tries again.
    OutOfMemory,
    /// Failed for another reason: every rank ends the step with an error.
    /// The rank that failed, so the others can name it.
    Failed {
        /// The failing rank (the largest one, when several failed).
        rank: usize,
    },
}

impl SplitOutcome {
    /// The outcome as a number whose maximum over ranks is the outcome to
    /// act on (what an all-reduce with `Max` carries).
    pub fn code(self) -> u64 {
        match self {
            SplitOutcome::Finished => 0,
            SplitOutcome::Thrashed => 1,
            SplitOutcome::OutOfMemory => 2,
            SplitOutcome::Failed { rank } => 3 + rank as u64,
        }
    }

    /// The outcome [`SplitOutcome::code`] made.
    pub fn from_code(code: u64) -> SplitOutcome {
        match code {
            0 => SplitOutcome::Finished,
            1 => SplitOutcome::Thrashed,
            2 => SplitOutcome::OutOfMemory,
            failed => SplitOutcome::Failed { rank: (failed - 3) as usize },
        }
    }
}

/// The other ranks of a data-parallel step, as
/// [`AutoMicroBatch`](super::AutoMicroBatch) needs them (`brasa-parallel`
/// implements it for `DistributedDataParallel`, with or without ZeRO).
///
/// The protocol, the same on every rank so that collectives always pair:
/// each micro-batch runs with gradients accumulating locally
/// ([`SplitPeers::accumulate_locally`]), then the ranks
/// [`agree`](SplitPeers::agree) on how it went; after an out of memory on
/// any rank every rank drops its partial gradients and starts over with
/// twice as many micro-batches; after the last micro-batch the gradients
/// are reduced once ([`SplitPeers::reduce_gradients`]). Reducing once at
/// the end gives up overlapping the last backward with communication, and
/// in exchange a backward that runs out of memory can never leave a peer
/// inside a half-launched all-reduce.
pub trait SplitPeers {
    /// This rank.
    fn rank(&self) -> usize;

    /// Called at the start of every step, before anything of the step
    /// allocates: where an implementation allocates what [`agree`]
    /// needs, so that agreeing never allocates.
    ///
    /// [`agree`]: SplitPeers::agree
    fn prepare(&self) -> Result<()> {
        Ok(())
    }

    /// A guard under which backward passes accumulate gradients on this
    /// rank only (DDP's `no_sync`).
    fn accumulate_locally(&self) -> LocalGuard<'_>;

    /// The largest outcome over every rank (an all-reduce with `Max`).
    /// Allocates nothing on the device, so a rank that just ran out of
    /// memory can still take part.
    fn agree(&self, mine: SplitOutcome) -> Result<SplitOutcome>;

    /// Reduces the gradients every rank accumulated locally, as a
    /// synchronised backward would have (averaged, bucketed, sharded under
    /// ZeRO-2).
    fn reduce_gradients(&self) -> Result<()>;

    /// Drops every gradient of the model (the optimizer's parameters may be
    /// shards of it, under ZeRO).
    fn zero_grad(&self) -> Result<()>;
}

/// What [`SplitPeers::accumulate_locally`] returns: while it lives,
/// backward passes accumulate locally. It holds whatever the
/// implementation needs (a `no_sync` guard, say) and drops it with itself.
pub struct LocalGuard<'a> {
    _held: Box<dyn Held + 'a>,
}

impl<'a> LocalGuard<'a> {
    /// A guard holding `held` until it is dropped.
    pub fn new<T: 'a>(held: T) -> LocalGuard<'a> {
        LocalGuard { _held: Box::new(held) }
    }
}

/// Anything at all: a `LocalGuard` only needs to drop what it holds.
trait Held {}
impl<T> Held for T {}
