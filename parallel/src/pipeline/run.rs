//! [`Pipeline`]: building one (moving each stage's layers to its device,
//! starting its thread pool) and running a step (splitting the batch,
//! starting the stages, gathering their losses, spans, peaks and errors).

use super::microbatch::{micro_batch_sizes, split_rows};
use super::report::{PipelineReport, StageReport};
use super::stage::{micro_batch_rng, StageOutcome, StageWork};
use super::transport::{ChannelLink, CommLink, Link};
use super::{LossFn, LossReduction, PipelineConfig, PipelineRng};
use crate::communicator::Communicator;
use crate::error::{ParallelError, Result};
use crate::launch::{ensure_host_devices, panic_message};
use brasa_autograd::{no_grad, precision_hook, Var};
use brasa_nn::{ModuleExt, Sequential};
use brasa_tensor::{memory, rng_state, set_rng_state, Device, ErrorBox, SharedError, Tensor};
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where the stages run.
enum Placement {
    /// Every stage in this process, stage `s` on `devices[s]`.
    Threads { devices: Vec<Device> },
    /// Only stage `comm.rank()`, on `comm.device()`.
    Rank { comm: Communicator },
}

/// A `Sequential` trained as a pipeline; see the [module docs](super).
pub struct Pipeline {
    model: Arc<Sequential>,
    ranges: Vec<Range<usize>>,
    placement: Placement,
    /// One rayon pool per stage this process runs.
    pools: Vec<rayon::ThreadPool>,
    loss_fn: LossFn,
    config: PipelineConfig,
    report: Option<PipelineReport>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("stages", &self.ranges)
            .field("schedule", &self.config.schedule)
            .field("micro_batches", &self.config.micro_batches)
            .finish()
    }
}

const OP: &str = "Pipeline::new";

fn pool(stage: usize, threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| {
            if i == 0 {
                format!("brasa-pipeline-stage{stage}")
            } else {
                format!("brasa-pipeline-stage{stage}-{i}")
            }
        })
        .build()
        .map_err(|e| ParallelError::Spawn {
            op: OP,
            what: format!("the thread pool of stage {stage}"),
            source: SharedError::new(e),
        })
}

fn move_layers(model: &mut Sequential, range: Range<usize>, device: Device) -> Result<()> {
    for index in range {
        if let Some(layer) = model.get_mut(index) {
            layer.to_device(device)?;
        }
    }
    Ok(())
}

impl Pipeline {
    /// Cuts `model` into stages as `config` says, each on its own device
    /// and thread of this process (stage `s` on `Device::cpu(s)` unless
    /// `config.devices` names others), and moves each stage's layers to
    /// its device. `loss_fn` computes the loss of one micro-batch on the
    /// last stage. Build the optimizer afterwards, on
    /// [`Pipeline::parameters`].
    pub fn new<F>(mut model: Sequential, loss_fn: F, config: PipelineConfig) -> Result<Pipeline>
    where
        F: Fn(&Var, &Tensor) -> brasa_nn::Result<Var> + Send + Sync + 'static,
    {
        let ranges = config.partition.ranges(&model)?;
        let stages = ranges.len();
        let devices = match &config.devices {
            Some(devices) if devices.len() == stages => devices.clone(),
            Some(devices) => {
                return Err(ParallelError::invalid(
                    OP,
                    format!("the partition makes {stages} stages but {} devices were given", devices.len()),
                ))
            }
            None => {
                ensure_host_devices(stages)?;
                (0..stages).map(Device::cpu).collect()
            }
        };
        check(&config, stages)?;
        for (range, &device) in ranges.iter().zip(&devices) {
            move_layers(&mut model, range.clone(), device)?;
        }
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let threads = config.threads_per_stage.unwrap_or((cores / stages).max(1));
        let pools = (0..stages).map(|s| pool(s, threads)).collect::<Result<_>>()?;
        Ok(Pipeline {
            model: Arc::new(model),
            ranges,
            placement: Placement::Threads { devices },
            pools,
            loss_fn: Box::new(loss_fn),
            config,
            report: None,
        })
    }

    /// The pipeline's stage `comm.rank()` of `comm.world_size()`, on
    /// `comm.device()`: every rank builds the same `model` (same seed) and
    /// config and calls this; rank 0's cut is used by all (so a cut by
    /// measured time agrees). Only this rank's layers are moved and
    /// trained. Activations and gradients travel with the communicator's
    /// `send`/`recv` (tested with 2 ranks).
    pub fn over_ranks<F>(
        mut model: Sequential,
        loss_fn: F,
        comm: Communicator,
        config: PipelineConfig,
    ) -> Result<Pipeline>
    where
        F: Fn(&Var, &Tensor) -> brasa_nn::Result<Var> + Send + Sync + 'static,
    {
        if comm.device().is_meta() {
            return Err(ParallelError::invalid(
                OP,
                "a pipeline over ranks exchanges shapes as values, which meta devices do not have: plan a pipeline \
                 with Pipeline::new on the meta devices of memory::plan_devices",
            ));
        }
        let stages = comm.world_size();
        let ours = config.partition.ranges(&model)?;
        if ours.len() != stages {
            return Err(ParallelError::invalid(
                OP,
                format!("the partition makes {} stages but the communicator has {stages} ranks", ours.len()),
            ));
        }
        check(&config, stages)?;
        // Rank 0's boundaries, as f64 (exact for any layer count).
        let starts: Vec<f64> = ours.iter().map(|r| r.start as f64).collect();
        let shared = Tensor::from_vec_on(starts, [stages], comm.device())?;
        comm.broadcast(&shared, 0)?;
        let starts: Vec<usize> = shared.to_vec::<f64>()?.into_iter().map(|s| s as usize).collect();
        let ranges: Vec<Range<usize>> =
            (0..stages).map(|s| starts[s]..starts.get(s + 1).copied().unwrap_or(model.len())).collect();
        move_layers(&mut model, ranges[comm.rank()].clone(), comm.device())?;
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let pools = vec![pool(comm.rank(), config.threads_per_stage.unwrap_or(cores))?];
        Ok(Pipeline {
            model: Arc::new(model),
            ranges,
            placement: Placement::Rank { comm },
            pools,
            loss_fn: Box::new(loss_fn),
            config,
            report: None,
        })
    }

    /// The stages this process runs, with their devices.
    fn local_stages(&self) -> Vec<(usize, Device)> {
        match &self.placement {
            Placement::Threads { devices } => devices.iter().copied().enumerate().collect(),
            Placement::Rank { comm } => vec![(comm.rank(), comm.device())],
        }
    }

    /// The layer ranges of all stages.
    pub fn stages(&self) -> &[Range<usize>] {
        &self.ranges
    }

    /// The configuration.
    pub fn config(&self) -> &PipelineConfig {
        &self.config
    }

    /// The whole model (layers of stages other processes run stay where
    /// they were built).
    pub fn model(&self) -> &Sequential {
        &self.model
    }

    /// The parameters of stage `stage`'s layers.
    pub fn stage_parameters(&self, stage: usize) -> Vec<Var> {
        let range = self.ranges.get(stage).cloned().unwrap_or(0..0);
        range.filter_map(|i| self.model.get(i)).flat_map(|layer| layer.parameters()).collect()
    }

    /// The parameters of the stages this process runs (all of them in
    /// one process; this rank's under [`Pipeline::over_ranks`]).
    pub fn parameters(&self) -> Vec<Var> {
        self.local_stages().into_iter().flat_map(|(s, _)| self.stage_parameters(s)).collect()
    }

    /// Sets train (true) or eval mode on every layer.
    pub fn set_training(&mut self, training: bool) -> Result<()> {
        let model = Arc::get_mut(&mut self.model)
            .ok_or_else(|| ParallelError::invalid("Pipeline::set_training", "the model is in use by a running step"))?;
        model.set_training(training);
        Ok(())
    }

    /// The last step's report (after a failed step too).
    pub fn report(&self) -> Option<&PipelineReport> {
        self.report.as_ref()
    }

    /// The model's output for `input`, stage after stage on the caller's
    /// thread with grad off (evaluation). In one process only.
    pub fn forward(&self, input: &Tensor) -> Result<Tensor> {
        let Placement::Threads { devices } = &self.placement else {
            return Err(ParallelError::invalid("Pipeline::forward", "over ranks, evaluate with step's losses instead"));
        };
        let _no_grad = no_grad();
        let mut x = Var::new(input.clone());
        for (range, &device) in self.ranges.iter().zip(devices) {
            x = self.model.forward_range(&x.to(device)?, range.clone())?;
        }
        Ok(x.tensor().clone())
    }

    /// One forward and backward of `input` (batch along dim 0) against
    /// `target` through the pipeline; returns the batch's loss (the
    /// micro-batch losses combined by the loss reduction). Gradients are
    /// accumulated into the parameters' `.grad`; the optimizer step is the
    /// caller's. Under [`Pipeline::over_ranks`] every rank calls it (the
    /// first stage reads `input`, the last `target`) and every rank gets
    /// the loss.
    pub fn step(&mut self, input: &Tensor, target: &Tensor) -> Result<f64> {
        self.step_scaled(input, target, 1.0)
    }

    /// [`Pipeline::step`] with each micro-batch's loss multiplied by
    /// `loss_scale` before its backward (a `GradScaler`'s
    /// `get_scale()`); the returned loss is unscaled.
    pub fn step_scaled(&mut self, input: &Tensor, target: &Tensor, loss_scale: f64) -> Result<f64> {
        const STEP: &str = "Pipeline::step";
        let m = self.config.micro_batches;
        let batch = input.dims().first().copied().unwrap_or(0);
        let sizes = micro_batch_sizes(batch, m)?;
        if !loss_scale.is_finite() || loss_scale <= 0.0 {
            return Err(ParallelError::invalid(
                STEP,
                format!("the loss scale must be finite and > 0, got {loss_scale}"),
            ));
        }
        let shares: Vec<f64> = sizes
            .iter()
            .map(|&n| match self.config.loss_reduction {
                LossReduction::Mean => n as f64 / batch as f64,
                LossReduction::Sum => 1.0,
            })
            .collect();
        let weights: Vec<f64> = shares.iter().map(|s| s * loss_scale).collect();
        let inputs = split_rows(input, &sizes, "input")?;
        let targets = split_rows(target, &sizes, "target")?;
        let rng = match self.config.rng {
            PipelineRng::PerMicroBatch => Some(rng_state()),
            PipelineRng::Shared => None,
        };
        let hook = precision_hook();
        let stages = self.ranges.len();
        let local = self.local_stages();
        let mut baselines = Vec::with_capacity(local.len());
        for &(_, device) in &local {
            memory::reset_peak(device)?;
            baselines.push(memory::allocated(device)?);
        }
        let epoch = Instant::now();
        let works: Vec<StageWork<'_>> = local
            .iter()
            .map(|&(stage, device)| StageWork {
                stage,
                stages,
                device,
                model: &self.model,
                layers: self.ranges[stage].clone(),
                actions: self.config.schedule.actions(stage, stages, m),
                inputs: if stage == 0 { &inputs } else { &[] },
                targets: if stage + 1 == stages { &targets } else { &[] },
                loss_fn: &self.loss_fn,
                loss_weights: &weights,
                checkpoint: self.config.checkpoint.contains(&stage),
                rng,
                hook: hook.clone(),
                epoch,
                current: Default::default(),
            })
            .collect();
        let outcomes: Vec<Result<StageOutcome>> = match &self.placement {
            Placement::Threads { .. } => {
                let links = ChannelLink::chain(stages, self.config.timeout);
                let pools = &self.pools;
                std::thread::scope(|scope| {
                    let handles: Vec<_> = works
                        .iter()
                        .zip(links)
                        .map(|(work, link)| {
                            let pool = &pools[work.stage];
                            let spawned = std::thread::Builder::new()
                                .name(format!("brasa-pipeline-launch{}", work.stage))
                                .spawn_scoped(scope, move || pool.install(move || run_guarded(work, link)));
                            (work, spawned)
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|(work, spawned)| match spawned {
                            Ok(handle) => handle.join().unwrap_or_else(|payload| Err(work.panicked(payload.as_ref()))),
                            Err(e) => Err(ParallelError::Spawn {
                                op: STEP,
                                what: format!("the thread of stage {}", work.stage),
                                source: SharedError::new(e),
                            }),
                        })
                        .collect()
                })
            }
            Placement::Rank { comm } => {
                let link = CommLink { comm: comm.clone(), device: comm.device() };
                let outcome = self.pools[0].install(|| run_guarded(&works[0], link));
                if let Err(error) = &outcome {
                    // Peers waiting on this rank fail now, not at their timeout.
                    comm.give_up(error);
                }
                vec![outcome]
            }
        };
        if let Some(base) = rng {
            set_rng_state(micro_batch_rng(base, m));
        }
        let mut reports = Vec::with_capacity(local.len());
        let mut losses = Vec::new();
        for ((&(stage, device), outcome), baseline) in local.iter().zip(&outcomes).zip(&baselines) {
            let peak = memory::max_allocated(device)?;
            let (spans, error) = match outcome {
                Ok(outcome) => {
                    losses.extend_from_slice(&outcome.losses);
                    (outcome.spans.clone(), None)
                }
                Err(error) => (Vec::new(), Some(error.to_string())),
            };
            reports.push(StageReport {
                stage,
                device,
                layers: self.ranges[stage].clone(),
                busy: spans.iter().map(|s| s.end.saturating_sub(s.start)).sum::<Duration>(),
                spans,
                peak_bytes: peak,
                activation_peak_bytes: peak.saturating_sub(*baseline),
                error,
            });
        }
        let wall = PipelineReport::wall_of(&reports);
        self.report = Some(PipelineReport {
            schedule: self.config.schedule,
            micro_batches: m,
            total_stages: stages,
            stages: reports,
            wall,
        });
        if let Some(error) = root_cause(outcomes) {
            return Err(error);
        }
        let mut loss: f64 = losses.iter().zip(&shares).map(|(l, s)| l * s).sum();
        if let Placement::Rank { comm } = &self.placement {
            // Only the last rank computed the loss: everyone gets it.
            let shared = Tensor::from_vec_on(vec![loss], [1], comm.device())?;
            comm.broadcast(&shared, stages - 1)?;
            loss = shared.to_vec::<f64>()?.first().copied().unwrap_or(f64::NAN);
        }
        Ok(loss)
    }
}

fn check(config: &PipelineConfig, stages: usize) -> Result<()> {
    config.checked_timeout()?;
    if config.micro_batches == 0 {
        return Err(ParallelError::invalid(OP, "the number of micro-batches must be at least 1, got 0"));
    }
    if let Some(bad) = config.checkpoint.iter().find(|&&s| s >= stages) {
        return Err(ParallelError::invalid(OP, format!("checkpoint names stage {bad} but there are {stages} stages")));
    }
    Ok(())
}

/// Runs a stage, turning a panic into an error that names it; the link is
/// dropped on the way out either way, which is what tells the neighbours.
fn run_guarded(work: &StageWork<'_>, link: impl Link) -> Result<StageOutcome> {
    let outcome = catch_unwind(AssertUnwindSafe(|| work.run(&link)));
    drop(link);
    outcome.unwrap_or_else(|payload| Err(work.panicked(payload.as_ref())))
}

impl StageWork<'_> {
    fn panicked(&self, payload: &(dyn std::any::Any + Send)) -> ParallelError {
        let current = self.current.load(Ordering::Relaxed);
        let action = current.checked_sub(1).and_then(|i| self.actions.get(i)).copied();
        ParallelError::Stage {
            stage: self.stage,
            device: self.device,
            action: action.map_or("run", |a| a.kind()).to_string(),
            micro_batch: action.map(|a| a.micro_batch()),
            source: ErrorBox::new(ParallelError::RankPanicked { rank: self.stage, message: panic_message(payload) }),
        }
    }
}

/// The error to report: the first stage that failed on its own, else the
/// first that timed out waiting (the slow stage is its neighbour), else
/// the first error (a neighbour that stopped).
fn root_cause(outcomes: Vec<Result<StageOutcome>>) -> Option<ParallelError> {
    let mut errors: Vec<ParallelError> = outcomes.into_iter().filter_map(Result::err).collect();
    let rank = |e: &ParallelError| match e {
        ParallelError::Stage { source, .. } => match **source {
            ParallelError::Timeout { .. } => 1,
            ParallelError::PeerFailed { .. } | ParallelError::Broken { .. } => 2,
            _ => 0,
        },
        _ => 0,
    };
    let best = (0..errors.len()).min_by_key(|&i| (rank(&errors[i]), i))?;
    Some(errors.swap_remove(best))
}
