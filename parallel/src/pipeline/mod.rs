//! Pipeline parallelism: a `Sequential` cut into stages, each on its own
//! device and thread (or its own MPI rank), the batch cut into
//! micro-batches that flow through the stages under a [`Schedule`] —
//! GPipe or 1F1B — with gradients accumulated across micro-batches into
//! each stage's parameters, equal to the unsplit model's.
//!
//! ```
//! use brasa_nn::{functional::cross_entropy, Linear, ModuleExt, Relu, Sequential};
//! use brasa_nn::optim::{Optimizer, Sgd, SgdConfig};
//! use brasa_parallel::pipeline::{Partition, Pipeline, PipelineConfig, Schedule};
//! use brasa_tensor::{DType, Device, Tensor};
//!
//! brasa_parallel::ensure_host_devices(2)?;
//! let dev = Device::cpu(0);
//! let model = Sequential::new()
//!     .push(Linear::new(16, 32, dev)?).push(Relu)
//!     .push(Linear::new(32, 32, dev)?).push(Relu)
//!     .push(Linear::new(32, 4, dev)?);
//! let config = PipelineConfig::new(Partition::Boundaries(vec![2]), 4).schedule(Schedule::OneFOneB);
//! let mut pipe = Pipeline::new(model, |out, y| cross_entropy(out, y), config)?; // layers 2.. move to cpu:1
//! let mut opt = Sgd::new(pipe.parameters(), SgdConfig { lr: 0.1, ..Default::default() })?;
//! let x = Tensor::randn([8, 16], DType::F32)?;
//! let y = Tensor::from_vec(vec![0i64, 1, 2, 3, 0, 1, 2, 3], [8])?;
//! let loss = pipe.step(&x, &y)?;            // 4 micro-batches of 2 rows, 1F1B
//! opt.step()?;
//! opt.zero_grad();
//! let report = pipe.report().expect("a step ran");
//! println!("loss {loss:.3}, bubble {:.1} %\n{report}", 100.0 * report.bubble());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - **Stages** ([`Partition`]): by layer index, or balanced by parameter
//!   bytes or by measured forward time. In one process stage `s` runs on
//!   logical host device `Device::cpu(s)` (or the devices given) and its
//!   own thread with its own rayon pool (threads named
//!   `brasa-pipeline-stage{s}`, so each stage is a track of the Chrome
//!   trace); [`Pipeline::over_ranks`] puts stage `s` on rank `s` of a
//!   [`Communicator`] and moves activations and gradients with its
//!   `send`/`recv`.
//! - **Micro-batches** ([`micro_batch_sizes`]): `torch.tensor_split`'s rule
//!   — sizes differ by at most one, the first `N mod m` one row larger;
//!   more micro-batches than rows is an error. With
//!   [`LossReduction::Mean`] (a loss that averages over its rows, as
//!   `cross_entropy` does) micro-batch `j`'s loss is weighted by `n_j / N`,
//!   so the gradients are the full batch's even when `m` does not divide
//!   `N`; with [`LossReduction::Sum`] losses add up. Gradients accumulate
//!   into `.grad` like `backward()` does: zero them between steps.
//! - **Random numbers** ([`PipelineRng`]): by default micro-batch `j`
//!   starts from the generator state the step began with, advanced by `j ·
//!   2^40`, and continues across stages where the previous stage stopped; a
//!   step leaves the generator at micro-batch `m`'s start. Running the
//!   micro-batches one after another on one device from those states gives
//!   the same dropout masks.
//! - **Checkpointing**: stages listed in [`PipelineConfig::checkpoint`]
//!   keep only their input per micro-batch and recompute in backward.
//! - **Mixed precision**: the caller's autocast (its precision hook) is
//!   active on every stage thread; for a `GradScaler` pass its scale to
//!   [`Pipeline::step_scaled`], then `scaler.step(&mut opt)` and
//!   `scaler.update()` as usual.
//! - **Failures**: a stage that returns an error or panics ends its
//!   links, so its neighbours fail at once and every stage stops; `step`
//!   returns the first stage's own error ([`ParallelError::Stage`], naming
//!   the stage, its device, what it was doing and the micro-batch), and
//!   [`PipelineReport`] has every stage's error. A stage that is merely
//!   slow makes its neighbours fail after [`PipelineConfig::timeout`]. The
//!   gradients of a failed step are partial: zero them.
//! - **Report** ([`Pipeline::report`]): per stage the spans of every
//!   forward and backward, busy time, idle share (the bubble) and the
//!   allocator's peak on its device.

mod microbatch;
mod partition;
mod report;
mod run;
mod schedule;
mod stage;
mod transport;

pub use microbatch::micro_batch_sizes;
pub use partition::{balance, Partition};
pub use report::{PipelineReport, Span, StageReport};
pub use run::Pipeline;
pub use schedule::{Action, Schedule};

pub use crate::data_parallel::LossReduction;
#[allow(unused_imports)] // named in the docs above
use crate::{communicator::Communicator, error::ParallelError};
use brasa_autograd::Var;
use brasa_tensor::{Device, Tensor};
use std::time::Duration;

/// The loss of one micro-batch: the last stage's output and the
/// micro-batch's rows of the target.
pub type LossFn = Box<dyn Fn(&Var, &Tensor) -> brasa_nn::Result<Var> + Send + Sync>;

/// Where the random numbers of a micro-batch (dropout) come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum PipelineRng {
    /// Each micro-batch its own stream of the process-wide generator (see
    /// the module docs), independent of timing. Stage forwards hold a
    /// process-wide lock while they draw, so forwards of different stages
    /// do not overlap each other (backwards overlap everything).
    #[default]
    PerMicroBatch,
    /// Stages draw from the generator as they go, with no lock: for models
    /// that draw nothing during training (no dropout), where the lock would
    /// only cost overlap. Draws of concurrent stages interleave by timing.
    Shared,
}

/// How a [`Pipeline`] is built and run.
#[derive(Clone, Debug)]
pub struct PipelineConfig {
    /// How the model is cut into stages.
    pub partition: Partition,
    /// Micro-batches per step.
    pub micro_batches: usize,
    /// GPipe or 1F1B (default).
    pub schedule: Schedule,
    /// How micro-batch losses combine (default: mean).
    pub loss_reduction: LossReduction,
    /// Stages whose forward is checkpointed (recomputed in backward).
    pub checkpoint: Vec<usize>,
    /// Random streams per micro-batch (default) or shared.
    pub rng: PipelineRng,
    /// How long a stage waits for a neighbour (default 300 s, or
    /// `BRASA_COMM_TIMEOUT_S`, as communicators): any positive duration,
    /// `Duration::MAX` for none. Set it with [`PipelineConfig::timeout`],
    /// which also sets aside an invalid `BRASA_COMM_TIMEOUT_S`.
    pub timeout: Duration,
    /// Threads of each stage's rayon pool (default: the machine's cores
    /// divided among the stages, at least 1).
    pub threads_per_stage: Option<usize>,
    /// The stages' devices in one process (default `Device::cpu(s)`).
    pub devices: Option<Vec<Device>>,
    /// Why `BRASA_COMM_TIMEOUT_S` could not be used, if it could not
    /// (reported when the pipeline is built).
    env_error: Option<String>,
}

impl PipelineConfig {
    /// `partition` and `micro_batches` with the defaults for the rest.
    pub fn new(partition: Partition, micro_batches: usize) -> PipelineConfig {
        let comm = crate::communicator::CommOptions::default();
        PipelineConfig {
            partition,
            micro_batches,
            schedule: Schedule::default(),
            loss_reduction: LossReduction::Mean,
            checkpoint: Vec::new(),
            rng: PipelineRng::default(),
            timeout: comm.timeout,
            threads_per_stage: None,
            devices: None,
            env_error: comm.env_error,
        }
    }

    /// With `schedule`.
    pub fn schedule(mut self, schedule: Schedule) -> PipelineConfig {
        self.schedule = schedule;
        self
    }

    /// With `stages` checkpointed.
    pub fn checkpoint(mut self, stages: Vec<usize>) -> PipelineConfig {
        self.checkpoint = stages;
        self
    }

    /// With `rng`.
    pub fn rng(mut self, rng: PipelineRng) -> PipelineConfig {
        self.rng = rng;
        self
    }

    /// With `timeout`.
    pub fn timeout(mut self, timeout: Duration) -> PipelineConfig {
        self.timeout = timeout;
        self.env_error = None;
        self
    }

    /// The timeout, checked as a communicator's: an error for an invalid
    /// `BRASA_COMM_TIMEOUT_S` left in place or a timeout of zero.
    pub(crate) fn checked_timeout(&self) -> crate::error::Result<Duration> {
        let comm = crate::communicator::CommOptions {
            timeout: self.timeout,
            env_error: self.env_error.clone(),
            backend: Default::default(),
        };
        comm.check()?;
        Ok(self.timeout)
    }

    /// With `threads` per stage.
    pub fn threads_per_stage(mut self, threads: usize) -> PipelineConfig {
        self.threads_per_stage = Some(threads);
        self
    }

    /// With `reduction`.
    pub fn loss_reduction(mut self, reduction: LossReduction) -> PipelineConfig {
        self.loss_reduction = reduction;
        self
    }
}
