//! The stage runner: one stage's [`Action`] list executed on its thread and
//! device — receive, compute, send — with each forward and backward of each
//! micro-batch timed and recorded as a profiler range on the stage's track.
//!
//! The forward of micro-batch `j` keeps its input and output (the graph and
//! its saved tensors) until the backward of `j`, which frees them: what a
//! stage holds at once is what its schedule has in flight.

use super::report::Span;
use super::schedule::Action;
use super::transport::{Link, Message};
use super::LossFn;
use crate::error::{ParallelError, Result};
use brasa_autograd::{checkpoint, set_precision_hook, AutogradError, PrecisionHook, Var};
use brasa_nn::Sequential;
use brasa_tensor::{rng_state, set_rng_state, Device, ErrorBox, GeneratorState, Tensor};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// Held while a stage draws from the process-wide random generator for a
/// micro-batch (set state, forward, read state), so stages on other threads
/// cannot interleave their draws with it.
static RNG_SECTION: Mutex<()> = Mutex::new(());

fn rng_section() -> MutexGuard<'static, ()> {
    RNG_SECTION.lock().unwrap_or_else(|e| e.into_inner())
}

/// Elements of the random stream reserved for each micro-batch: micro-batch
/// `j` of a step starts at `offset + j · RNG_STRIDE` of the state the step
/// began with (2^40: far more than any micro-batch draws).
pub(crate) const RNG_STRIDE: u64 = 1 << 40;

/// The generator state micro-batch `j` starts from.
pub(crate) fn micro_batch_rng(base: GeneratorState, j: usize) -> GeneratorState {
    GeneratorState { seed: base.seed, offset: base.offset.wrapping_add((j as u64).wrapping_mul(RNG_STRIDE)) }
}

/// Everything one stage needs for one step.
pub(crate) struct StageWork<'a> {
    pub(crate) stage: usize,
    pub(crate) stages: usize,
    pub(crate) device: Device,
    pub(crate) model: &'a Arc<Sequential>,
    pub(crate) layers: Range<usize>,
    pub(crate) actions: Vec<Action>,
    /// The micro-batches of the input (first stage only).
    pub(crate) inputs: &'a [Tensor],
    /// The micro-batches of the target (last stage only).
    pub(crate) targets: &'a [Tensor],
    pub(crate) loss_fn: &'a LossFn,
    /// What each micro-batch's loss is multiplied by before its backward
    /// (its share of the batch, times the loss scale).
    pub(crate) loss_weights: &'a [f64],
    pub(crate) checkpoint: bool,
    /// The step's starting generator state, when micro-batches get their
    /// own random streams.
    pub(crate) rng: Option<GeneratorState>,
    /// The caller's precision hook (autocast), installed on the stage thread.
    pub(crate) hook: Option<Arc<dyn PrecisionHook>>,
    pub(crate) epoch: Instant,
    /// 1 + the index of the action running (0 before the first), so a
    /// panic can be reported with its micro-batch.
    pub(crate) current: AtomicUsize,
}

/// What a stage did in a step.
pub(crate) struct StageOutcome {
    pub(crate) spans: Vec<Span>,
    /// The last stage's losses per micro-batch, unweighted.
    pub(crate) losses: Vec<f64>,
}

struct InFlight {
    input: Var,
    /// The stage's output, or on the last stage the weighted loss.
    output: Var,
}

/// Puts the thread's precision hook back when dropped.
struct HookGuard(Option<Arc<dyn PrecisionHook>>);

impl Drop for HookGuard {
    fn drop(&mut self) {
        set_precision_hook(self.0.take());
    }
}

impl StageWork<'_> {
    fn failed(&self, action: impl Into<String>, micro_batch: Option<usize>, error: ParallelError) -> ParallelError {
        ParallelError::Stage {
            stage: self.stage,
            device: self.device,
            action: action.into(),
            micro_batch,
            source: ErrorBox::new(error),
        }
    }

    fn is_last(&self) -> bool {
        self.stage + 1 == self.stages
    }

    /// Runs the action list; every error names this stage, what it was
    /// doing and the micro-batch.
    pub(crate) fn run(&self, link: &dyn Link) -> Result<StageOutcome> {
        let _hook = HookGuard(set_precision_hook(self.hook.clone()));
        let mut in_flight: Vec<Option<InFlight>> = (0..self.actions.len() / 2).map(|_| None).collect();
        let mut outcome = StageOutcome { spans: Vec::with_capacity(self.actions.len()), losses: Vec::new() };
        let mut prefetched: Option<Message> = None;
        for (index, &action) in self.actions.iter().enumerate() {
            let j = action.micro_batch();
            self.current.store(index + 1, Ordering::Relaxed);
            match action {
                Action::Forward(_) => {
                    let message = match prefetched.take() {
                        Some(message) => Some(message),
                        None if self.stage > 0 => {
                            Some(link.recv_forward(j).map_err(|e| self.failed("receive activation", Some(j), e))?)
                        }
                        None => None,
                    };
                    let flight = self.forward(j, message, link, &mut outcome)?;
                    if let Some(slot) = in_flight.get_mut(j) {
                        *slot = Some(flight);
                    }
                }
                Action::Backward(_) => {
                    let flight = in_flight.get_mut(j).and_then(Option::take).ok_or_else(|| {
                        self.failed("backward", Some(j), ParallelError::invalid("Pipeline", "backward before forward"))
                    })?;
                    let input_grad = self.backward(j, flight, link, &mut outcome)?;
                    if let Some(grad) = input_grad {
                        // Between ranks a send waits for the receive: a stage
                        // that will next run a forward takes that forward's
                        // input first, which the previous stage sends before
                        // it waits for this gradient (1F1B's exchange order).
                        if link.rendezvous() {
                            if let Some(Action::Forward(k)) = self.actions.get(index + 1) {
                                prefetched = Some(
                                    link.recv_forward(*k)
                                        .map_err(|e| self.failed("receive activation", Some(*k), e))?,
                                );
                            }
                        }
                        link.send_backward(Message { micro_batch: j, tensor: grad, rng: None })
                            .map_err(|e| self.failed("send gradient", Some(j), e))?;
                    }
                }
            }
        }
        Ok(outcome)
    }

    fn forward(
        &self,
        j: usize,
        message: Option<Message>,
        link: &dyn Link,
        outcome: &mut StageOutcome,
    ) -> Result<InFlight> {
        let _range = brasa_profile::record_function(format!("pipeline stage {} forward mb {j}", self.stage));
        let start = self.epoch.elapsed();
        let (input, rng_in, source) = match message {
            Some(message) => {
                let tensor =
                    message.tensor.to(self.device).map_err(|e| self.failed("receive activation", Some(j), e.into()))?;
                let requires_grad = tensor.dtype().is_float();
                let input =
                    Var::from_tensor(tensor, requires_grad).map_err(|e| self.failed("forward", Some(j), e.into()))?;
                (
                    input,
                    message.rng,
                    format!(" (input {:?} from stage {})", input_dims(&message.tensor), self.stage - 1),
                )
            }
            None => {
                let tensor = self
                    .inputs
                    .get(j)
                    .ok_or_else(|| self.failed("forward", Some(j), ParallelError::invalid("Pipeline", "no input")))?;
                let input = Var::new(tensor.to(self.device).map_err(|e| self.failed("forward", Some(j), e.into()))?);
                (input, self.rng.map(|base| micro_batch_rng(base, j)), String::new())
            }
        };
        let (output, rng_out) = {
            let section = rng_in.map(|state| {
                let guard = rng_section();
                set_rng_state(state);
                guard
            });
            let output = self.run_layers(&input).map_err(|e| self.failed(format!("forward{source}"), Some(j), e))?;
            let rng_out = section.map(|_guard| rng_state());
            (output, rng_out)
        };
        let output = if self.is_last() {
            let target = self
                .targets
                .get(j)
                .ok_or_else(|| self.failed("loss", Some(j), ParallelError::invalid("Pipeline", "no target")))?
                .to(self.device)
                .map_err(|e| self.failed("loss", Some(j), e.into()))?;
            let loss = (self.loss_fn)(&output, &target).map_err(|e| self.failed("loss", Some(j), e.into()))?;
            // A plan (meta devices) has no values: its loss is NaN.
            let value = if loss.device().is_meta() {
                f64::NAN
            } else {
                loss.item().map_err(|e| self.failed("loss", Some(j), e.into()))?
            };
            outcome.losses.push(value);
            let weight = self.loss_weights.get(j).copied().unwrap_or(1.0);
            loss.mul_scalar(weight).map_err(|e| self.failed("loss", Some(j), e.into()))?
        } else {
            output
        };
        outcome.spans.push(Span { action: Action::Forward(j), start, end: self.epoch.elapsed() });
        if !self.is_last() {
            link.send_forward(Message { micro_batch: j, tensor: output.tensor().clone(), rng: rng_out })
                .map_err(|e| self.failed("send activation", Some(j), e))?;
        }
        Ok(InFlight { input, output })
    }

    fn run_layers(&self, input: &Var) -> Result<Var> {
        if !self.checkpoint {
            return Ok(self.model.forward_range(input, self.layers.clone())?);
        }
        let model = Arc::clone(self.model);
        let layers = self.layers.clone();
        let segment = move |xs: &[Var]| -> brasa_autograd::Result<Var> {
            let x = xs.first().ok_or_else(|| AutogradError::invalid("Pipeline", "checkpoint without input"))?;
            model.forward_range(x, layers.clone()).map_err(|e| match e {
                brasa_nn::NnError::Autograd(inner) => inner,
                other => AutogradError::external(other),
            })
        };
        Ok(checkpoint(segment, &[input])?)
    }

    /// Runs the backward of micro-batch `j`; returns the gradient of the
    /// stage's input to send back (none on the first stage).
    fn backward(
        &self,
        j: usize,
        flight: InFlight,
        link: &dyn Link,
        outcome: &mut StageOutcome,
    ) -> Result<Option<Tensor>> {
        let grad = if self.is_last() {
            None
        } else {
            let message = link.recv_backward(j).map_err(|e| self.failed("receive gradient", Some(j), e))?;
            Some(message.tensor)
        };
        let _range = brasa_profile::record_function(format!("pipeline stage {} backward mb {j}", self.stage));
        let start = self.epoch.elapsed();
        let fail = |e: ParallelError| self.failed("backward", Some(j), e);
        {
            // A checkpointed stage recomputes its forward here, drawing
            // from the generator again (restored to the forward's state).
            let _section = (self.checkpoint && self.rng.is_some()).then(rng_section);
            // An output that needs no gradient (a first stage without
            // parameters: an input normalisation, a reshape) has no
            // backward to run; the stages before it get zeros below.
            if flight.output.requires_grad() {
                match grad {
                    None => flight.output.backward().map_err(|e| fail(e.into()))?,
                    Some(grad) => {
                        let grad = grad.to(self.device).map_err(|e| fail(e.into()))?;
                        flight.output.backward_with(&grad).map_err(|e| fail(e.into()))?
                    }
                }
            }
        }
        let input_grad = if self.stage == 0 {
            None
        } else {
            Some(match flight.input.grad() {
                Some(grad) => grad,
                // The output did not depend on the input.
                None => flight.input.tensor().zeros_like().map_err(|e| fail(e.into()))?,
            })
        };
        drop(flight);
        outcome.spans.push(Span { action: Action::Backward(j), start, end: self.epoch.elapsed() });
        Ok(input_grad)
    }
}

fn input_dims(tensor: &Tensor) -> Vec<usize> {
    tensor.dims().to_vec()
}
