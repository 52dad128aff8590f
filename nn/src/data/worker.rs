//! The worker threads of one epoch: a [`Job`] reads one batch (the
//! dataset, the transform, pinning and the device copy, a panic caught as
//! an `Err`), and a [`Pool`] runs jobs on `num_workers` std threads, each
//! with a bounded queue of the batches it owes and one shared, bounded
//! queue of results.
//!
//! Dropping a pool stops its workers: they skip queued batches, finish the
//! one they are reading, and are joined before `drop` returns; one still
//! reading after the pool's grace (the loader's `timeout`, else
//! [`SHUTDOWN_GRACE`]) is handed to the loader's [`Stragglers`] instead.

use super::dataset::Dataset;
use super::stragglers::{Stragglers, SHUTDOWN_GRACE};
use crate::error::{NnError, Result};
use brasa_tensor::SharedError;
use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A step applied to each batch after it is read (in the worker).
pub(super) type Stage<B> = Arc<dyn Fn(B) -> Result<B> + Send + Sync>;

/// What reading one batch takes: the dataset and the steps after it.
pub(super) struct Job<D: Dataset> {
    pub(super) dataset: Arc<D>,
    pub(super) transform: Option<Stage<D::Batch>>,
    pub(super) placement: Option<Stage<D::Batch>>,
}

impl<D: Dataset> Job<D> {
    /// Batch `batch` (samples `indices`): read, transformed, placed. A panic
    /// anywhere in it is caught and becomes an `Err`.
    pub(super) fn run(&self, batch: usize, indices: &[usize], worker: Option<usize>) -> Result<D::Batch> {
        let work = || {
            // Batches are counted as inputs in memory statistics and plans.
            let _input = brasa_tensor::memory::category_scope(brasa_tensor::memory::MemoryCategory::Input);
            let mut out = self.dataset.get_batch(indices)?;
            if let Some(transform) = &self.transform {
                out = transform(out)?;
            }
            if let Some(placement) = &self.placement {
                out = placement(out)?;
            }
            Ok(out)
        };
        catch_unwind(AssertUnwindSafe(work)).unwrap_or_else(|payload| {
            let who = match worker {
                Some(w) => format!("worker {w}"),
                None => "the calling thread".to_string(),
            };
            let message = format!("reading batch {batch} panicked in {who}: {}", panic_message(&*payload));
            // A payload whose own drop panics must not take the thread down.
            let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
            Err(NnError::Data(message))
        })
    }
}

/// The text of a panic's payload, when it has one.
fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(text) = payload.downcast_ref::<&str>() {
        text
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text
    } else {
        "(no message)"
    }
}

/// A batch to read: its number and its samples.
pub(super) type Task = (usize, Vec<usize>);
/// A batch read: its number and the outcome.
pub(super) type Outcome<B> = (usize, Result<B>);

/// One worker thread and the queue of batches it owes.
struct Worker {
    tasks: Option<SyncSender<Task>>,
    thread: Option<JoinHandle<()>>,
}

/// The worker threads of one epoch.
pub(super) struct Pool<B> {
    workers: Vec<Worker>,
    results: Option<Receiver<Outcome<B>>>,
    stop: Arc<AtomicBool>,
    /// How long `drop` waits for the workers before handing those still
    /// reading to the loader (the timeout, else [`SHUTDOWN_GRACE`]).
    grace: Duration,
    /// Where workers still reading after `grace` go.
    stragglers: Arc<Stragglers>,
}

impl<B> Drop for Pool<B> {
    fn drop(&mut self) {
        // Workers check the flag before each batch; closing their task queues
        // wakes the idle ones, and closing the result queue frees any blocked
        // on a send. Then none can block, and joining only waits for batches
        // being read now.
        self.stop.store(true, Ordering::Release);
        for worker in &mut self.workers {
            worker.tasks = None;
        }
        self.results = None;
        // A grace too long to add to now (a timeout of `Duration::MAX`)
        // has no deadline: the drop waits for the reads, as the timeout
        // said to. Adding would panic, and a panic here aborts an unwind.
        let deadline = Instant::now().checked_add(self.grace);
        for worker in &mut self.workers {
            let Some(thread) = worker.thread.take() else { continue };
            while !thread.is_finished() && deadline.is_none_or(|deadline| Instant::now() < deadline) {
                std::thread::sleep(Duration::from_millis(1));
            }
            if !thread.is_finished() {
                // Stalled in the dataset: the loader joins it later; it exits
                // when the read returns, as its queues are closed.
                let name = thread.thread().name().unwrap_or("brasa-data").to_string();
                self.stragglers.adopt(name, thread);
                continue;
            }
            // A worker's panics are caught per batch; one that escaped has
            // already been reported as a lost worker.
            let _ = thread.join();
        }
    }
}

impl<B: Send + 'static> Pool<B> {
    /// Starts `num_workers` threads running `job`, each taking at most
    /// `prefetch_factor` queued batches, with room for `capacity` results
    /// (see `Epoch::dispatch`: never more are outstanding); an error if the
    /// system refuses a thread. `timeout` is the loader's: how long `drop`
    /// waits for a worker before handing it to `stragglers`.
    pub(super) fn start<D: Dataset<Batch = B> + 'static>(
        job: &Arc<Job<D>>,
        num_workers: usize,
        prefetch_factor: usize,
        capacity: usize,
        timeout: Option<Duration>,
        stragglers: &Arc<Stragglers>,
    ) -> Result<Pool<B>> {
        let (results_tx, results_rx) = sync_channel::<Outcome<B>>(capacity);
        let stop = Arc::new(AtomicBool::new(false));
        let mut pool = Pool {
            workers: Vec::with_capacity(num_workers),
            results: Some(results_rx),
            stop,
            grace: timeout.unwrap_or(SHUTDOWN_GRACE),
            stragglers: Arc::clone(stragglers),
        };
        for w in 0..num_workers {
            let (tasks_tx, tasks_rx) = sync_channel::<Task>(prefetch_factor);
            let (job, results, stop) = (Arc::clone(job), results_tx.clone(), Arc::clone(&pool.stop));
            let thread = std::thread::Builder::new()
                .name(format!("brasa-data-{w}"))
                .spawn(move || {
                    while let Ok((batch, indices)) = tasks_rx.recv() {
                        if stop.load(Ordering::Acquire) {
                            break;
                        }
                        let outcome = job.run(batch, &indices, Some(w));
                        if results.send((batch, outcome)).is_err() {
                            break;
                        }
                    }
                })
                .map_err(|source| NnError::Io {
                    context: format!("data loader: could not start worker thread {w}"),
                    source: SharedError::new(source),
                })?;
            pool.workers.push(Worker { tasks: Some(tasks_tx), thread: Some(thread) });
        }
        Ok(pool)
    }
}

impl<B> Pool<B> {
    /// Queues `task` on worker `worker`. Does not block when the caller
    /// keeps each worker at most `prefetch_factor` batches ahead, the
    /// queue's capacity. A failed send means the worker is gone, which the
    /// caller notices when the batch is due.
    pub(super) fn send(&self, worker: usize, task: Task) {
        if let Some(tasks) = &self.workers[worker].tasks {
            let _ = tasks.send(task);
        }
    }

    /// The queue the workers deliver batches to (`None` only while the pool
    /// is being dropped).
    pub(super) fn results(&self) -> Option<&Receiver<Outcome<B>>> {
        self.results.as_ref()
    }

    /// Whether worker `worker`'s thread is still running.
    pub(super) fn is_alive(&self, worker: usize) -> bool {
        self.workers[worker].thread.as_ref().is_some_and(|t| !t.is_finished())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_messages_are_read() {
        let payload = catch_unwind(|| panic!("boom {}", 7)).unwrap_err();
        assert_eq!(panic_message(&*payload), "boom 7");
    }
}
