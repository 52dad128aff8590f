//! [`Work`]: the handle a non-blocking collective returns. Wait on it, or
//! poll it while computing; a wait never outlasts the communicator's
//! timeout.

use crate::deadline::Deadline;
use crate::error::{ParallelError, Result};
use crate::health::Health;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Where a worker leaves the outcome of one operation.
#[derive(Default)]
pub(crate) struct Completion {
    result: Mutex<Option<Result<()>>>,
    done: Condvar,
}

impl Completion {
    pub(crate) fn complete(&self, result: Result<()>) {
        *self.result.lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
        self.done.notify_all();
    }
}

/// A submitted collective or transfer. Operations on one communicator run
/// one after another, in submission order (like NCCL work on one stream);
/// this handle says when this one is done and how it ended.
///
/// Dropping a `Work` without waiting does not cancel the operation: it still
/// runs, and its failure, if any, makes the communicator refuse later work.
/// On CUDA tensors (staged through host memory) the results reach the
/// device in `wait`: wait before reading them.
#[must_use = "a collective's outcome is only known by waiting on its Work"]
pub struct Work {
    completion: Arc<Completion>,
    health: Arc<Health>,
    op: &'static str,
    rank: usize,
    timeout: Duration,
    /// Runs after a successful wait (copies staged results back to a device).
    finish: Option<Box<dyn FnOnce() -> Result<()> + Send>>,
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Work").field("op", &self.op).field("rank", &self.rank).finish()
    }
}

impl Work {
    pub(crate) fn new(
        completion: Arc<Completion>,
        health: Arc<Health>,
        op: &'static str,
        rank: usize,
        timeout: Duration,
    ) -> Work {
        Work { completion, health, op, rank, timeout, finish: None }
    }

    /// This work with `finish` run after it succeeded, in the waiting thread.
    pub(crate) fn then(mut self, finish: impl FnOnce() -> Result<()> + Send + 'static) -> Work {
        self.finish = Some(Box::new(finish));
        self
    }

    /// A `Work` that is already done with `result` (work refused at submission).
    pub(crate) fn finished(result: Result<()>, health: Arc<Health>, op: &'static str, rank: usize) -> Work {
        let completion = Arc::new(Completion::default());
        completion.complete(result);
        Work { completion, health, op, rank, timeout: Duration::ZERO, finish: None }
    }

    /// The collective's name.
    pub fn op(&self) -> &'static str {
        self.op
    }

    /// Whether the operation finished (successfully or not): poll this to
    /// overlap communication with computation.
    pub fn is_completed(&self) -> bool {
        self.completion.result.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Blocks until the operation finished, at most the communicator's
    /// timeout; then returns how it ended. A timeout marks the communicator
    /// unusable and tells the peers this rank gave up.
    pub fn wait(self) -> Result<()> {
        let timeout = self.timeout;
        self.wait_timeout(timeout)
    }

    /// [`Work::wait`] with a timeout of its own: any duration, zero to poll
    /// (an unfinished operation then times out), `Duration::MAX` to wait
    /// without end.
    pub fn wait_timeout(mut self, timeout: Duration) -> Result<()> {
        let deadline = Deadline::after(timeout);
        let mut slot = self.completion.result.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(result) = slot.take() {
                drop(slot);
                result?;
                return match self.finish.take() {
                    Some(finish) => finish(),
                    None => Ok(()),
                };
            }
            if deadline.passed() {
                drop(slot);
                let error = ParallelError::Timeout { op: self.op, rank: self.rank, timeout, waiting_for: Vec::new() };
                self.health.fail(&error);
                return Err(error);
            }
            slot = deadline.wait(&self.completion.done, slot);
        }
    }
}
