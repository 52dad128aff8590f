//! [`DataLoader`]: batches of a [`Dataset`] in a seeded order, read ahead by
//! worker threads, optionally pinned and moved to a device
//! (`torch.utils.data.DataLoader`).
//!
//! How an epoch runs:
//! - The sample order is fixed by the settings: `0..N`, or with shuffling a
//!   permutation drawn from a generator seeded by `(seed, epoch)`. It does not
//!   depend on the number of workers. It is a [`SampleOrder`], computed as
//!   batches are read rather than stored: the permutation of a dataset of up
//!   to 2²⁰ samples is drawn once per epoch (Fisher–Yates, 8 bytes a sample),
//!   a larger one is a keyed bijection evaluated per position (no memory at
//!   all), so a dataset of any length can be loaded.
//! - With `num_workers = 0` each batch is read in the calling thread when the
//!   iterator is advanced. With workers, batch `b` goes to worker
//!   `b % num_workers` (std threads, spawned on the first `next`); at most
//!   `prefetch_factor` batches per worker are queued or ready at any time
//!   (bounded channels, sized for at most the epoch's batches: a large
//!   prefetch factor on a small dataset reserves nothing more, and a
//!   read-ahead window above [`MAX_READ_AHEAD`] batches is refused by
//!   `build`), and the iterator hands them out in batch order, so the batches
//!   are the same as with no workers.
//! - In the worker (or the calling thread) a batch is read with
//!   [`Dataset::get_batch`], passed through the optional transform, pinned
//!   if asked, and copied to the target device with `to_non_blocking`, so the
//!   training loop receives batches that are already where it computes.
//! - A batch whose reading fails — an `Err` or a panic — is an `Err` in its
//!   place in the sequence; the following batches still come. A worker thread
//!   that disappears without answering ends the epoch with an `Err`, never a
//!   hang; with a `timeout`, so does a batch that takes longer than it.
//! - Dropping the iterator stops the workers: they skip queued batches, finish
//!   the one they are reading, and are joined before `drop` returns. A worker
//!   still reading after the `timeout` (or, without one, after
//!   [`SHUTDOWN_GRACE`]) is handed to the loader instead, so that dropping the
//!   epoch does not wait on a stalled read; the loader joins such workers when
//!   it is dropped (with its last epoch), waiting at most [`SHUTDOWN_GRACE`]
//!   in all. A thread cannot be killed: one whose read still has not returned
//!   then is reported on stderr and left to exit when the read returns (its
//!   queues are closed, so it reads nothing more).

use super::batch::TensorBatch;
use super::dataset::Dataset;
use super::sample_order::{epoch_seed, SampleOrder};
use crate::error::{NnError, Result};
use brasa_tensor::{Device, SharedError};
use std::any::Any;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the iterator waits on the workers before checking that the one
/// owing the next batch is still alive.
const LIVENESS_POLL: Duration = Duration::from_millis(50);

/// How long dropping a loader waits, in all, for worker threads still in a
/// dataset read (PyTorch waits as long for its worker processes before it
/// terminates them, `MP_STATUS_CHECK_INTERVAL`); also how long dropping an
/// epoch without a `timeout` waits for each before handing it to the loader.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The most batches an epoch may have read ahead at once
/// (`num_workers × prefetch_factor`, or the epoch's batches if fewer): the
/// channels reserve room for that many, and the loader refuses more.
pub const MAX_READ_AHEAD: usize = 1 << 16;

// ----- the loader --------------------------------------------------------------------

/// A step applied to each batch after it is read (in the worker).
type Stage<B> = Arc<dyn Fn(B) -> Result<B> + Send + Sync>;

/// The settings of a [`DataLoader`]; see [`DataLoaderBuilder`] for each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Settings {
    batch_size: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    num_workers: usize,
    prefetch_factor: usize,
    pin_memory: bool,
    device: Option<Device>,
    timeout: Option<Duration>,
}

/// Configures a [`DataLoader`]; made by [`DataLoader::builder`].
pub struct DataLoaderBuilder<D: Dataset> {
    dataset: D,
    settings: Settings,
    transform: Option<Stage<D::Batch>>,
    placement: Option<Stage<D::Batch>>,
}

impl<D: Dataset> DataLoaderBuilder<D> {
    /// Samples per batch (default 1).
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.settings.batch_size = batch_size;
        self
    }

    /// Whether each epoch visits the samples in a fresh random order
    /// (default false: `0..N`).
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.settings.shuffle = shuffle;
        self
    }

    /// The shuffle's seed (default 0): epoch `e` uses a permutation drawn
    /// from `(seed, e)`, the same for any number of workers.
    pub fn seed(mut self, seed: u64) -> Self {
        self.settings.seed = seed;
        self
    }

    /// Whether to leave out a last batch smaller than `batch_size`
    /// (default false).
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.settings.drop_last = drop_last;
        self
    }

    /// Worker threads that read batches ahead (default 0: read in the
    /// calling thread when the iterator is advanced).
    pub fn num_workers(mut self, num_workers: usize) -> Self {
        self.settings.num_workers = num_workers;
        self
    }

    /// Batches each worker may have queued or ready ahead of the training
    /// loop (default 2); bounds the memory held by read-ahead batches.
    pub fn prefetch_factor(mut self, prefetch_factor: usize) -> Self {
        self.settings.prefetch_factor = prefetch_factor;
        self
    }

    /// How long the training loop waits for a worker's batch before the
    /// epoch ends with an `Err` (default: no limit; `timeout` in PyTorch).
    /// For datasets that can stall (network or disk reads). Workers stuck past
    /// it are not waited for when the epoch ends; the loader joins them when
    /// it is dropped (see the module docs). Applies only with workers. Zero
    /// means no limit, as PyTorch's `timeout=0`.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = (!timeout.is_zero()).then_some(timeout);
        self
    }

    /// A function applied to each batch in the worker right after it is read
    /// (augmentation, normalisation, a dtype change), before pinning and the
    /// device copy.
    pub fn transform(mut self, transform: impl Fn(D::Batch) -> Result<D::Batch> + Send + Sync + 'static) -> Self {
        self.transform = Some(Arc::new(transform));
        self
    }
}

impl<D: Dataset> DataLoaderBuilder<D>
where
    D::Batch: TensorBatch,
{
    /// Whether batches' host tensors are copied into page-locked memory in
    /// the worker, so that a copy to a GPU can run asynchronously
    /// (default false).
    pub fn pin_memory(mut self, pin_memory: bool) -> Self {
        self.settings.pin_memory = pin_memory;
        self.placement = placement(self.settings);
        self
    }

    /// The device batches are delivered on: the worker copies them there with
    /// `to_non_blocking` (after pinning, if asked: on a CUDA device the copies
    /// from pinned memory are then asynchronous DMA) and waits for the copies
    /// itself, so the training loop gets them ready to use, on any stream.
    /// Read-ahead batches then occupy that device's memory.
    pub fn device(mut self, device: Device) -> Self {
        self.settings.device = Some(device);
        self.placement = placement(self.settings);
        self
    }
}

/// The batches of an epoch over `samples`.
fn batch_count(samples: usize, batch_size: usize, drop_last: bool) -> usize {
    if drop_last {
        samples / batch_size
    } else {
        samples.div_ceil(batch_size)
    }
}

/// The pin-and-move step for these settings, if there is anything to do.
fn placement<B: TensorBatch + 'static>(settings: Settings) -> Option<Stage<B>> {
    let (pin, device) = (settings.pin_memory, settings.device);
    if !pin && device.is_none() {
        return None;
    }
    Some(Arc::new(move |batch: B| {
        let batch = if pin { batch.pinned()? } else { batch };
        match device {
            Some(device) => {
                let batch = batch.to_device(device)?;
                // From pinned memory the copies are only queued (on this
                // worker's current stream). The worker, not the training loop,
                // waits for them, so a delivered batch is complete and may be
                // used on any stream of the device, as a synchronous copy's.
                brasa_tensor::Stream::current(device).record_event(false)?.synchronize()?;
                Ok(batch)
            }
            None => Ok(batch),
        }
    }))
}

impl<D: Dataset> DataLoaderBuilder<D> {
    /// The loader, or an error for a zero batch size or prefetch factor, or
    /// a read-ahead window (`num_workers × prefetch_factor`, at most the
    /// epoch's batches) above [`MAX_READ_AHEAD`] batches.
    pub fn build(self) -> Result<DataLoader<D>> {
        let s = &self.settings;
        if s.batch_size == 0 {
            return Err(NnError::invalid("DataLoader", "batch_size must be at least 1"));
        }
        if s.prefetch_factor == 0 {
            return Err(NnError::invalid("DataLoader", "prefetch_factor must be at least 1"));
        }
        let batches = batch_count(self.dataset.len(), s.batch_size, s.drop_last);
        let window = s.num_workers.saturating_mul(s.prefetch_factor).min(batches);
        if window > MAX_READ_AHEAD {
            return Err(NnError::invalid(
                "DataLoader",
                format!(
                    "num_workers ({}) × prefetch_factor ({}) would read {window} batches ahead; at most \
                     {MAX_READ_AHEAD} can be (lower prefetch_factor)",
                    s.num_workers, s.prefetch_factor
                ),
            ));
        }
        Ok(DataLoader {
            dataset: Arc::new(self.dataset),
            settings: self.settings,
            transform: self.transform,
            placement: self.placement,
            next_epoch: AtomicU64::new(0),
            stragglers: Arc::new(Stragglers::default()),
        })
    }
}

/// Batches of a dataset, epoch after epoch, in a seeded order, read ahead by
/// worker threads and optionally pinned and moved to a device.
///
/// `for batch in &loader` runs the next epoch (the first is epoch 0);
/// [`DataLoader::epoch`] runs a given one. Each yields `Result<D::Batch>` in
/// batch order.
pub struct DataLoader<D: Dataset> {
    dataset: Arc<D>,
    settings: Settings,
    transform: Option<Stage<D::Batch>>,
    placement: Option<Stage<D::Batch>>,
    next_epoch: AtomicU64,
    /// Workers of past epochs still in a read when their epoch ended.
    stragglers: Arc<Stragglers>,
}

impl<D: Dataset> DataLoader<D> {
    /// A builder over `dataset` with PyTorch's defaults: batch size 1, no
    /// shuffle (seed 0 when shuffling), keep the last batch, no workers,
    /// prefetch factor 2, no pinning, no device copy.
    pub fn builder(dataset: D) -> DataLoaderBuilder<D> {
        DataLoaderBuilder {
            dataset,
            settings: Settings {
                batch_size: 1,
                shuffle: false,
                seed: 0,
                drop_last: false,
                num_workers: 0,
                prefetch_factor: 2,
                pin_memory: false,
                device: None,
                timeout: None,
            },
            transform: None,
            placement: None,
        }
    }

    /// The dataset.
    pub fn dataset(&self) -> &D {
        &self.dataset
    }

    /// The number of batches in an epoch.
    pub fn len(&self) -> usize {
        batch_count(self.dataset.len(), self.settings.batch_size, self.settings.drop_last)
    }

    /// Whether an epoch has no batches.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Samples per batch.
    pub fn batch_size(&self) -> usize {
        self.settings.batch_size
    }

    /// The number of worker threads (0: batches are read in the calling thread).
    pub fn num_workers(&self) -> usize {
        self.settings.num_workers
    }

    /// Batches each worker may hold ahead of the training loop.
    pub fn prefetch_factor(&self) -> usize {
        self.settings.prefetch_factor
    }

    /// Whether batches are pinned.
    pub fn is_pinning(&self) -> bool {
        self.settings.pin_memory
    }

    /// The device batches are delivered on, if one was set.
    pub fn device(&self) -> Option<Device> {
        self.settings.device
    }

    /// The epoch the next [`DataLoader::iter`] will run.
    pub fn next_epoch(&self) -> u64 {
        self.next_epoch.load(Ordering::Relaxed)
    }

    /// Sets the epoch the next [`DataLoader::iter`] will run (to resume
    /// training, or to keep several loaders in step).
    pub fn set_epoch(&self, epoch: u64) {
        self.next_epoch.store(epoch, Ordering::Relaxed);
    }

    /// The order in which epoch `epoch` visits the samples: `0..N`, or the
    /// epoch's permutation when shuffling (computed as it is read, see
    /// [`SampleOrder`]).
    pub fn sample_order(&self, epoch: u64) -> SampleOrder {
        let n = self.dataset.len();
        if self.settings.shuffle {
            SampleOrder::shuffled(n, epoch_seed(self.settings.seed, epoch))
        } else {
            SampleOrder::sequential(n)
        }
    }

    /// Runs the next epoch (0 first, then 1, ...; see [`DataLoader::set_epoch`]).
    pub fn iter(&self) -> Epoch<D> {
        let epoch = self.next_epoch.fetch_add(1, Ordering::Relaxed);
        self.epoch(epoch)
    }

    /// Runs epoch `epoch`, whose order depends only on the seed and `epoch`.
    /// Does not change which epoch [`DataLoader::iter`] runs next.
    pub fn epoch(&self, epoch: u64) -> Epoch<D> {
        self.stragglers.reap();
        let batches = self.len();
        let num_workers = self.settings.num_workers.min(batches);
        Epoch {
            epoch,
            job: Arc::new(Job {
                dataset: Arc::clone(&self.dataset),
                transform: self.transform.clone(),
                placement: self.placement.clone(),
            }),
            order: self.sample_order(epoch),
            batch_size: self.settings.batch_size,
            batches,
            // More workers than batches would only idle.
            num_workers,
            // Nor can a worker hold more batches ahead than the epoch has, nor
            // all of them more than `MAX_READ_AHEAD` (only possible for a
            // dataset that grew since `build` checked it).
            prefetch_factor: self
                .settings
                .prefetch_factor
                .min(batches.max(1))
                .min((MAX_READ_AHEAD / num_workers.max(1)).max(1)),
            timeout: self.settings.timeout,
            stragglers: Arc::clone(&self.stragglers),
            next_yield: 0,
            next_send: 0,
            pool: None,
            pending: HashMap::new(),
            finished: false,
        }
    }
}

impl<D: Dataset + 'static> IntoIterator for &DataLoader<D> {
    type Item = Result<D::Batch>;
    type IntoIter = Epoch<D>;

    fn into_iter(self) -> Epoch<D> {
        self.iter()
    }
}

impl<D: Dataset> std::fmt::Debug for DataLoader<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.settings;
        f.debug_struct("DataLoader")
            .field("samples", &self.dataset.len())
            .field("batches", &self.len())
            .field("batch_size", &s.batch_size)
            .field("shuffle", &s.shuffle)
            .field("seed", &s.seed)
            .field("drop_last", &s.drop_last)
            .field("num_workers", &s.num_workers)
            .field("prefetch_factor", &s.prefetch_factor)
            .field("pin_memory", &s.pin_memory)
            .field("device", &s.device)
            .field("timeout", &s.timeout)
            .field("transform", &self.transform.is_some())
            .finish()
    }
}

// ----- one epoch ------------------------------------------------------------------------

/// What reading one batch takes: the dataset and the steps after it.
struct Job<D: Dataset> {
    dataset: Arc<D>,
    transform: Option<Stage<D::Batch>>,
    placement: Option<Stage<D::Batch>>,
}

impl<D: Dataset> Job<D> {
    /// Batch `batch` (samples `indices`): read, transformed, placed. A panic
    /// anywhere in it is caught and becomes an `Err`.
    fn run(&self, batch: usize, indices: &[usize], worker: Option<usize>) -> Result<D::Batch> {
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
type Task = (usize, Vec<usize>);
/// A batch read: its number and the outcome.
type Outcome<B> = (usize, Result<B>);

/// Worker threads still in a dataset read when their epoch ended, joined
/// when the loader and its last epoch are gone (at most [`SHUTDOWN_GRACE`]
/// in all), and reaped as they finish whenever an epoch starts.
#[derive(Default)]
struct Stragglers {
    threads: std::sync::Mutex<Vec<(String, JoinHandle<()>)>>,
}

impl Stragglers {
    fn threads(&self) -> std::sync::MutexGuard<'_, Vec<(String, JoinHandle<()>)>> {
        self.threads.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn adopt(&self, name: String, thread: JoinHandle<()>) {
        self.threads().push((name, thread));
    }

    /// Joins the ones that have finished.
    fn reap(&self) {
        let mut threads = self.threads();
        let (done, running): (Vec<_>, Vec<_>) = threads.drain(..).partition(|(_, t)| t.is_finished());
        *threads = running;
        drop(threads);
        for (_, thread) in done {
            let _ = thread.join();
        }
    }
}

impl Drop for Stragglers {
    fn drop(&mut self) {
        let threads = std::mem::take(&mut *self.threads());
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        for (name, thread) in threads {
            while !thread.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            if thread.is_finished() {
                let _ = thread.join();
            } else {
                // Threads cannot be killed; its queues are closed, so it exits
                // as soon as the dataset returns.
                eprintln!(
                    "brasa-nn DataLoader: worker thread {name} is still in a dataset read {SHUTDOWN_GRACE:?} after \
                     the loader was dropped; leaving it to exit when the read returns"
                );
            }
        }
    }
}

/// One worker thread and the queue of batches it owes.
struct Worker {
    tasks: Option<SyncSender<Task>>,
    thread: Option<JoinHandle<()>>,
}

/// The worker threads of one epoch.
struct Pool<B> {
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
        let (results_tx, results_rx) = sync_channel::<Outcome<D::Batch>>(capacity);
        let stop = Arc::new(AtomicBool::new(false));
        let mut pool = Pool {
            workers: Vec::with_capacity(self.num_workers),
            results: Some(results_rx),
            stop,
            grace: self.timeout.unwrap_or(SHUTDOWN_GRACE),
            stragglers: Arc::clone(&self.stragglers),
        };
        for w in 0..self.num_workers {
            let (tasks_tx, tasks_rx) = sync_channel::<Task>(self.prefetch_factor);
            let (job, results, stop) = (Arc::clone(&self.job), results_tx.clone(), Arc::clone(&pool.stop));
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
            if let Some(tasks) = &pool.workers[batch % self.num_workers].tasks {
                // Does not block: a worker has at most `prefetch_factor`
                // batches outstanding, the queue's capacity. A failed send
                // means the worker is gone, which `receive` notices when the
                // batch is due.
                let _ = tasks.send(task);
            }
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
            let Some(results) = &pool.results else {
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
                    let alive = pool.workers[owner].thread.as_ref().is_some_and(|t| !t.is_finished());
                    if !alive {
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
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_messages_are_read() {
        let payload = catch_unwind(|| panic!("boom {}", 7)).unwrap_err();
        assert_eq!(panic_message(&*payload), "boom 7");
    }
}
