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
//!   [`SHUTDOWN_GRACE`](super::SHUTDOWN_GRACE)) is handed to the loader
//!   instead, so that dropping the epoch does not wait on a stalled read; the
//!   loader joins such workers when it is dropped (with its last epoch),
//!   waiting at most [`SHUTDOWN_GRACE`](super::SHUTDOWN_GRACE) in all. A thread cannot be killed: one whose read still has not returned
//!   then is reported on stderr and left to exit when the read returns (its
//!   queues are closed, so it reads nothing more).
//!
//! The loader and its settings are here; the epoch iterator is in
//! `epoch.rs`, the worker threads (reading a batch, the pool) in
//! `worker.rs`, and the workers that outlive their epoch in `stragglers.rs`.

use super::batch::TensorBatch;
use super::dataset::Dataset;
use super::epoch::{Epoch, EpochPlan};
use super::sample_order::{epoch_seed, SampleOrder};
use super::stragglers::Stragglers;
use super::worker::{Job, Stage};
use crate::error::{NnError, Result};
use brasa_tensor::Device;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The most batches an epoch may have read ahead at once
/// (`num_workers × prefetch_factor`, or the epoch's batches if fewer): the
/// channels reserve room for that many, and the loader refuses more.
pub const MAX_READ_AHEAD: usize = 1 << 16;

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
        let job = Job {
            dataset: Arc::clone(&self.dataset),
            transform: self.transform.clone(),
            placement: self.placement.clone(),
        };
        let plan = EpochPlan {
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
        };
        Epoch::new(epoch, job, self.sample_order(epoch), plan, Arc::clone(&self.stragglers))
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
