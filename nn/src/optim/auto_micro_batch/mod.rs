//! [`AutoMicroBatch`]: a training step that survives running out of memory
//! (the explanation and an example are on the type).

mod peers;
mod report;
mod rows;

pub use peers::{LocalGuard, SplitOutcome, SplitPeers};
pub use report::{SplitReport, SplitRetry};

use super::Optimizer;
use crate::error::{NnError, Result};
use brasa_autograd::Var;
use brasa_tensor::{memory, Device};
use rows::micro_batch_rows;
use std::ops::Range;

/// How a micro-batch's loss relates to the batch's, which decides the
/// weight each micro-batch's backward gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MicroLoss {
    /// A mean over the micro-batch's rows (`Reduction::Mean`, the default of
    /// every loss): weighed by its share of the rows, so the gradients add
    /// up to the mean over the whole batch even when micro-batches differ
    /// in length.
    #[default]
    Mean,
    /// A sum over the rows: added as it is.
    Sum,
}

/// How an [`AutoMicroBatch`] starts and reacts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AutoMicroBatchConfig {
    /// Micro-batches the first step tries (1: the whole batch at once).
    pub initial_micro_batches: usize,
    /// Consecutive steps with allocator retries after which the next step
    /// splits further (0: never; Composer uses 2).
    pub thrash_steps: usize,
    /// What the micro-batch closure's loss is.
    pub loss: MicroLoss,
}

impl Default for AutoMicroBatchConfig {
    fn default() -> Self {
        AutoMicroBatchConfig { initial_micro_batches: 1, thrash_steps: 2, loss: MicroLoss::Mean }
    }
}

/// An optimizer step that survives running out of memory. The device
/// batch stays fixed; when an attempt runs out of
/// memory, everything it held is dropped, the cache is emptied and the
/// step starts over in twice as many micro-batches whose gradients add up
/// to the whole batch's — so the optimizer sees the same batch, and the
/// parameters equal the unsplit step's (to rounding). The split that worked
/// is kept for the next steps, and steps in which the allocator had to free
/// its cache and retry (a sign the next may not fit) split further before
/// anything fails (Composer's `device_train_microbatch_size="auto"`).
///
/// In data parallelism every rank takes the same split: through
/// [`SplitPeers`] (implemented by `brasa-parallel`'s DDP, with and without
/// ZeRO) the ranks compare how each micro-batch went, so a rank that runs
/// out of memory makes every rank retry, and a rank that fails for another
/// reason ends every rank's step in an `Err` — none waits in a collective
/// for a peer that left.
///
/// ```
/// use brasa_nn::optim::{AutoMicroBatch, Optimizer, Sgd, SgdConfig};
/// use brasa_nn::{functional::cross_entropy, Linear, Module, ModuleExt};
/// use brasa_autograd::Var;
/// use brasa_tensor::{DType, Device, Tensor};
///
/// let model = Linear::new(8, 4, Device::CPU)?;
/// let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.1, ..Default::default() })?;
/// let (x, y) = (Tensor::randn([64, 8], DType::F32)?, Tensor::from_vec((0..64).map(|i| i % 4).collect::<Vec<i64>>(), [64])?);
/// let mut auto = AutoMicroBatch::new();
/// let report = auto.step(64, &mut opt, |rows| {
///     let len = rows.len();
///     cross_entropy(&model.forward(&Var::new(x.narrow(0, rows.start, len)?))?, &y.narrow(0, rows.start, len)?)
/// })?;
/// assert_eq!(report.micro_batches, 1); // it fit: one micro-batch, a plain step
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
///
/// The closure given to [`AutoMicroBatch::step`] computes the loss of a
/// range of the batch's rows (forward only: the wrapper weighs the loss
/// and runs backward). It runs again on a retry, so it must not consume
/// its input. Only the out-of-memory errors are retried (recognised by
/// their type, [`NnError::as_out_of_memory`], not their text); every other
/// error is returned as it is.
#[derive(Clone, Debug)]
pub struct AutoMicroBatch {
    config: AutoMicroBatchConfig,
    micro_batches: usize,
    thrashed_steps: usize,
    steps: usize,
    retries: usize,
}

impl Default for AutoMicroBatch {
    fn default() -> Self {
        AutoMicroBatch::new()
    }
}

impl AutoMicroBatch {
    /// Starts with the whole batch, splits after 2 thrashing steps,
    /// weighs mean losses.
    pub fn new() -> AutoMicroBatch {
        AutoMicroBatch::from_valid(AutoMicroBatchConfig::default())
    }

    /// A wrapper with `config`; 0 initial micro-batches is an error.
    pub fn with_config(config: AutoMicroBatchConfig) -> Result<AutoMicroBatch> {
        if config.initial_micro_batches == 0 {
            return Err(NnError::invalid("AutoMicroBatch", "initial_micro_batches must be at least 1"));
        }
        Ok(AutoMicroBatch::from_valid(config))
    }

    fn from_valid(config: AutoMicroBatchConfig) -> AutoMicroBatch {
        let micro_batches = config.initial_micro_batches;
        AutoMicroBatch { config, micro_batches, thrashed_steps: 0, steps: 0, retries: 0 }
    }

    /// Micro-batches the next step starts with: the split that last worked.
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// Steps completed.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// Attempts retried after an out of memory, over every step.
    pub fn retries(&self) -> usize {
        self.retries
    }

    /// Accumulates the gradient of the batch of `rows` rows with
    /// [`accumulate`](Self::accumulate), then `opt.step()` and
    /// `opt.zero_grad()`. An out of memory in the optimizer's own step is
    /// not retried (splitting the batch cannot shrink the optimizer's state):
    /// it is returned.
    pub fn step<E: Into<NnError>>(
        &mut self,
        rows: usize,
        opt: &mut dyn Optimizer,
        micro: impl FnMut(Range<usize>) -> std::result::Result<Var, E>,
    ) -> Result<SplitReport> {
        let report = self.run(rows, opt, None, micro)?;
        opt.step()?;
        opt.zero_grad()?;
        Ok(report)
    }

    /// [`step`](Self::step) among data-parallel ranks: every rank takes the
    /// same split, and the gradients are reduced once the last micro-batch
    /// is done (see [`SplitPeers`]).
    pub fn step_with_peers<E: Into<NnError>>(
        &mut self,
        rows: usize,
        opt: &mut dyn Optimizer,
        peers: &dyn SplitPeers,
        micro: impl FnMut(Range<usize>) -> std::result::Result<Var, E>,
    ) -> Result<SplitReport> {
        let report = self.run(rows, opt, Some(peers), micro)?;
        opt.step()?;
        opt.zero_grad()?;
        Ok(report)
    }

    /// Leaves the gradient of the whole batch in the parameters' `.grad`
    /// without stepping: for steps the caller finishes (a `GradScaler`'s
    /// `step`, which skips the step for every micro-batch at once when any
    /// gradient is not finite; clipping). `opt` is only used to drop
    /// gradients before a retry.
    pub fn accumulate<E: Into<NnError>>(
        &mut self,
        rows: usize,
        opt: &mut dyn Optimizer,
        micro: impl FnMut(Range<usize>) -> std::result::Result<Var, E>,
    ) -> Result<SplitReport> {
        self.run(rows, opt, None, micro)
    }

    /// [`accumulate`](Self::accumulate) among data-parallel ranks.
    pub fn accumulate_with_peers<E: Into<NnError>>(
        &mut self,
        rows: usize,
        opt: &mut dyn Optimizer,
        peers: &dyn SplitPeers,
        micro: impl FnMut(Range<usize>) -> std::result::Result<Var, E>,
    ) -> Result<SplitReport> {
        self.run(rows, opt, Some(peers), micro)
    }

    fn run<E: Into<NnError>>(
        &mut self,
        rows: usize,
        opt: &mut dyn Optimizer,
        peers: Option<&dyn SplitPeers>,
        mut micro: impl FnMut(Range<usize>) -> std::result::Result<Var, E>,
    ) -> Result<SplitReport> {
        let devices = devices_of(opt);
        if let Some(peers) = peers {
            peers.prepare()?;
        }
        let mut report = SplitReport { rows, ..SplitReport::default() };
        loop {
            let count = self.micro_batches;
            let retries_before = allocator_retries(&devices)?;
            let mut own_error = None;
            let mut agreed = SplitOutcome::Finished;
            let mut stopped_at = 0;
            for index in 0..count {
                let range = micro_batch_rows(rows, count, index);
                let len = range.len();
                let outcome = self.run_micro(range, rows, count, peers, &mut micro);
                // Only the last micro-batch's outcome tells thrashing (the
                // counter covers the whole attempt).
                let thrashed = outcome.is_ok() && index + 1 == count && allocator_retries(&devices)? > retries_before;
                let (mine, error) = classify(outcome, thrashed, len, count, rows, peers.map_or(0, |p| p.rank()));
                own_error = error;
                agreed = match peers.map(|p| p.agree(mine)) {
                    Some(Ok(agreed)) => agreed,
                    Some(Err(error)) => {
                        // This rank's own failure says more than the
                        // agreement's (a peer that left, a collective that
                        // did not pair up because the ranks diverged).
                        drop_gradients(opt, peers)?;
                        return Err(own_error.unwrap_or(error));
                    }
                    None => mine,
                };
                stopped_at = index;
                if agreed >= SplitOutcome::OutOfMemory {
                    break;
                }
            }
            match agreed {
                SplitOutcome::Failed { rank } => {
                    drop_gradients(opt, peers)?;
                    return Err(own_error.unwrap_or_else(|| NnError::MicroBatch {
                        message: format!("rank {rank} failed in micro-batch {stopped_at} of {count}; see its error"),
                        source: None,
                    }));
                }
                SplitOutcome::OutOfMemory => {
                    let out_of_memory = own_error.as_ref().and_then(|e| e.as_out_of_memory()).cloned();
                    // Drop the failed attempt's gradients (the graph and the
                    // activations went with the closure's error), then hand
                    // the cached blocks back so the retry meets a clean heap.
                    drop(own_error);
                    drop_gradients(opt, peers)?;
                    for &device in &devices {
                        memory::empty_cache(device)?;
                    }
                    report.retries.push(SplitRetry { micro_batches: count, micro_batch: stopped_at, out_of_memory });
                    self.retries += 1;
                    self.thrashed_steps = 0;
                    self.micro_batches = count * 2;
                    continue;
                }
                SplitOutcome::Finished | SplitOutcome::Thrashed => {}
            }
            if let Some(peers) = peers {
                if let Err(error) = peers.reduce_gradients() {
                    drop_gradients(opt, Some(peers))?;
                    return Err(error);
                }
            }
            // `agreed` is the last micro-batch's: Thrashed if the allocator
            // retried on any rank at any point of this attempt.
            self.thrashed_steps = if agreed == SplitOutcome::Thrashed { self.thrashed_steps + 1 } else { 0 };
            report.micro_batches = count;
            if self.config.thrash_steps > 0 && self.thrashed_steps >= self.config.thrash_steps {
                self.thrashed_steps = 0;
                self.micro_batches = count * 2;
                report.split_for_thrashing = true;
            }
            self.steps += 1;
            return Ok(report);
        }
    }

    /// Forward (the closure) and the weighed backward of one micro-batch.
    fn run_micro<E: Into<NnError>>(
        &self,
        range: Range<usize>,
        rows: usize,
        count: usize,
        peers: Option<&dyn SplitPeers>,
        micro: &mut impl FnMut(Range<usize>) -> std::result::Result<Var, E>,
    ) -> Result<()> {
        if range.is_empty() {
            if let Some(peers) = peers {
                // The other ranks run a forward here, and a forward may
                // communicate (DDP broadcasts buffers): refuse rather than
                // leave them a collective with no partner.
                return Err(NnError::MicroBatch {
                    message: format!(
                        "rank {} has {rows} rows, fewer than the {count} micro-batches the ranks split into",
                        peers.rank()
                    ),
                    source: None,
                });
            }
            return Ok(());
        }
        let _local = peers.map(|p| p.accumulate_locally());
        let len = range.len();
        let loss = micro(range).map_err(Into::into)?;
        let loss = match self.config.loss {
            MicroLoss::Mean if len != rows => loss.mul_scalar(len as f64 / rows as f64)?,
            MicroLoss::Mean | MicroLoss::Sum => loss,
        };
        loss.backward()?;
        Ok(())
    }
}

/// How this rank's micro-batch of `len` rows (of `count` over `rows`)
/// went, and its error: an out of memory is retried unless the
/// micro-batch is a single row, where splitting cannot help.
fn classify(
    outcome: Result<()>,
    thrashed: bool,
    len: usize,
    count: usize,
    rows: usize,
    rank: usize,
) -> (SplitOutcome, Option<NnError>) {
    let error = match outcome {
        Ok(()) if thrashed => return (SplitOutcome::Thrashed, None),
        Ok(()) => return (SplitOutcome::Finished, None),
        Err(error) => error,
    };
    if error.as_out_of_memory().is_none() {
        return (SplitOutcome::Failed { rank }, Some(error));
    }
    if len > 1 {
        return (SplitOutcome::OutOfMemory, Some(error));
    }
    let message = format!(
        "out of memory in a micro-batch of {len} row{} ({count} micro-batches of a {rows}-row batch): \
         splitting cannot help",
        if len == 1 { "" } else { "s" }
    );
    (SplitOutcome::Failed { rank }, Some(NnError::MicroBatch { message, source: Some(Box::new(error)) }))
}

/// Drops the gradients of an attempt that will not be used.
fn drop_gradients(opt: &mut dyn Optimizer, peers: Option<&dyn SplitPeers>) -> Result<()> {
    opt.zero_grad()?;
    if let Some(peers) = peers {
        peers.zero_grad()?;
    }
    Ok(())
}

/// The devices of the optimizer's parameters, each once.
fn devices_of(opt: &dyn Optimizer) -> Vec<Device> {
    let mut devices: Vec<Device> = Vec::new();
    for param in opt.params() {
        let device = param.device();
        if !devices.contains(&device) {
            devices.push(device);
        }
    }
    devices
}

/// Times the devices' allocators freed their caches and retried.
fn allocator_retries(devices: &[Device]) -> Result<u64> {
    let mut total = 0;
    for &device in devices {
        total += memory::stats(device)?.num_alloc_retries;
    }
    Ok(total)
}
