//! One epoch of a [`DataLoader`](super::DataLoader): [`Epoch`], the
//! iterator that hands out the batches in order.
//!
//! With no workers it reads each batch in the calling thread when advanced.
//! With workers (started on the first `next`), batch `b` goes to worker
//! `b % num_workers`, each worker holds at most `prefetch_factor` batches
//! queued or ready, and batches that arrive before their turn wait in
//! `pending`, so the sequence is the same for any number of workers. A
//! worker that disappears without answering ends the epoch with an `Err`,
//! never a hang; with a `timeout`, so does a batch that takes longer.

use super::dataset::Dataset;
use super::sample_order::SampleOrder;
use super::stragglers::Stragglers;
use super::worker::{Job, Pool};
use crate::error::{NnError, Result};
use std::collections::HashMap;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the iterator waits on the workers before checking that the one
/// owing the next batch is still alive.
const LIVENESS_POLL: Duration = Duration::from_millis(50);

/// How an epoch reads its batches, fixed by the loader when it starts one.
#[derive(Clone, Copy, Debug)]
pub(super) struct EpochPlan {
    /// Samples per batch.
    pub(super) batch_size: usize,
    /// Batches in the epoch.
    pub(super) batches: usize,
    /// Worker threads (0: batches are read in the calling thread).
    pub(super) num_workers: usize,
    /// Batches each worker may hold queued or ready.
    pub(super) prefetch_factor: usize,
    /// How long the iterator waits for a worker's batch (none: no limit).
    pub(super) timeout: Option<Duration>,
}

/// The batches of one epoch, in order: an iterator of `Result<Batch>`.
/// Dropping it stops and joins its workers.
pub struct Epoch<D: Dataset> {
    epoch: u64,
    job: Arc<Job<D>>,
    order: SampleOrder,
    batch_size: usize,
    batches: usize,
    num_workers: usize,
    prefetch_factor: usize,
    timeout: Option<Duration>,
    stragglers: Arc<Stragglers>,
    /// The batch the iterator hands out next.
    next_yield: usize,
    /// The next batch to give a worker.
    next_send: usize,
    pool: Option<Pool<D::Batch>>,
    /// Batches that arrived before their turn.
    pending: HashMap<usize, Result<D::Batch>>,
    /// Set after a worker was lost or could not start: nothing more comes.
    finished: bool,
}

impl<D: Dataset> Epoch<D> {
    /// Epoch `epoch` over `order`, each batch read by `job`, as `plan` says;
    /// the workers start on the first `next`.
    pub(super) fn new(
        epoch: u64,
        job: Job<D>,
        order: SampleOrder,
        plan: EpochPlan,
        stragglers: Arc<Stragglers>,
    ) -> Epoch<D> {
        let EpochPlan { batch_size, batches, num_workers, prefetch_factor, timeout } = plan;
        Epoch {
            epoch,
            job: Arc::new(job),
            order,
            batch_size,
            batches,
            num_workers,
            prefetch_factor,
            timeout,
            stragglers,
            next_yield: 0,
            next_send: 0,
            pool: None,
            pending: HashMap::new(),
            finished: false,
        }
    }

    /// The epoch's number.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Batches not handed out yet.
    pub fn remaining(&self) -> usize {
        if self.finished {
            0
        } else {
            self.batches - self.next_yield
        }
    }

    /// The samples of batch `batch`.
    fn indices(&self, batch: usize) -> Vec<usize> {
        let start = batch.saturating_mul(self.batch_size);
        self.order.range(start, start.saturating_add(self.batch_size))
    }

    /// Starts the worker threads; an error if the system refuses a thread.
    fn start_pool(&mut self) -> Result<()>
    where
        D: 'static,
    {
        // At most this many batches are outstanding (see `dispatch`), and never
        // more than the epoch has: the channels reserve no more than that.
        let capacity = self.num_workers.saturating_mul(self.prefetch_factor).min(self.batches);
        let pool =
            Pool::start(&self.job, self.num_workers, self.prefetch_factor, capacity, self.timeout, &self.stragglers)?;
        self.pool = Some(pool);
        Ok(())
    }

    /// Queues batches on their workers until each holds `prefetch_factor`
    /// (counting the ones ready and not yet handed out).
    fn dispatch(&mut self) {
        let ahead = self.num_workers.saturating_mul(self.prefetch_factor);
        let limit = self.batches.min(self.next_yield.saturating_add(ahead));
        while self.next_send < limit {
            let batch = self.next_send;
            let task = (batch, self.indices(batch));
            let Some(pool) = &self.pool else { return };
            // Does not block: a worker has at most `prefetch_factor` batches
            // outstanding, the queue's capacity. A failed send means the
            // worker is gone, which `receive` notices when the batch is due.
            pool.send(batch % self.num_workers, task);
            self.next_send += 1;
        }
    }

    /// Waits for batch `batch` from the workers.
    fn receive(&mut self, batch: usize) -> Result<D::Batch> {
        let started = Instant::now();
        loop {
            if let Some(outcome) = self.pending.remove(&batch) {
                return outcome;
            }
            let Some(pool) = &self.pool else {
                return Err(NnError::Data("internal: no workers".into()));
            };
            let Some(results) = pool.results() else {
                return Err(NnError::Data("internal: no result queue".into()));
            };
            let owner = batch % self.num_workers;
            let wait = match self.timeout {
                Some(timeout) => timeout.saturating_sub(started.elapsed()).min(LIVENESS_POLL),
                None => LIVENESS_POLL,
            };
            match results.recv_timeout(wait) {
                Ok((b, outcome)) => {
                    self.pending.insert(b, outcome);
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Some(timeout) = self.timeout.filter(|&t| started.elapsed() >= t) {
                        self.finished = true;
                        self.pool = None;
                        return Err(NnError::Data(format!(
                            "batch {batch} of epoch {} was not ready after {timeout:?} (worker {owner}); the epoch \
                             ends here",
                            self.epoch
                        )));
                    }
                    if !pool.is_alive(owner) {
                        // It may have answered just before it ended.
                        while let Ok((b, outcome)) = results.try_recv() {
                            self.pending.insert(b, outcome);
                        }
                        if !self.pending.contains_key(&batch) {
                            return Err(self.lost_worker(owner, batch));
                        }
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return Err(self.lost_worker(owner, batch)),
            }
        }
    }

    /// Ends the epoch after worker `owner` stopped without batch `batch`.
    fn lost_worker(&mut self, owner: usize, batch: usize) -> NnError {
        self.finished = true;
        self.pool = None;
        NnError::Data(format!(
            "worker {owner} stopped without delivering batch {batch} of epoch {}; the epoch ends here",
            self.epoch
        ))
    }
}

impl<D: Dataset + 'static> Iterator for Epoch<D> {
    type Item = Result<D::Batch>;

    fn next(&mut self) -> Option<Result<D::Batch>> {
        if self.finished || self.next_yield >= self.batches {
            // Release the workers as soon as the epoch is over.
            self.pool = None;
            return None;
        }
        let batch = self.next_yield;
        if self.num_workers == 0 {
            self.next_yield += 1;
            return Some(self.job.run(batch, &self.indices(batch), None));
        }
        if self.pool.is_none() {
            if let Err(error) = self.start_pool() {
                self.finished = true;
                self.pool = None;
                return Some(Err(error));
            }
        }
        self.dispatch();
        let outcome = self.receive(batch);
        self.next_yield += 1;
        self.dispatch();
        Some(outcome)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        // A lost worker can end the epoch early, so only the upper bound is sure.
        (0, Some(self.remaining()))
    }
}

impl<D: Dataset> std::fmt::Debug for Epoch<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Epoch")
            .field("epoch", &self.epoch)
            .field("batches", &self.batches)
            .field("next", &self.next_yield)
            .field("num_workers", &self.num_workers)
            .finish()
    }
}
