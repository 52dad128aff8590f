//! [`GradAccumulator`]: gradient accumulation as one small object — `k`
//! micro-batches, then one optimizer step — for batches larger than memory
//! allows.
//!
//! Each micro-batch's loss is divided by `k` before backward, so with a loss
//! that is a mean over its batch the accumulated gradient equals the
//! gradient of the mean over all `k·b` samples: `k` micro-batches of `b`
//! give the update one batch of `k·b` would (models without batch
//! statistics; batch norm sees `b` samples at a time). Backward adds into
//! the existing `.grad` buffers in place, so accumulating costs no memory
//! beyond one micro-batch's activations.

use super::Optimizer;
use crate::error::{NnError, Result};
use brasa_autograd::Var;

/// Counts micro-batches: [`GradAccumulator::backward`] runs backward of
/// `loss / k`, and [`GradAccumulator::step`] steps the optimizer and drops
/// the gradients once `k` micro-batches were accumulated.
///
/// ```
/// use brasa_nn::optim::{GradAccumulator, Optimizer, Sgd, SgdConfig};
/// use brasa_nn::{functional::cross_entropy, Linear, Module, ModuleExt};
/// use brasa_autograd::Var;
/// use brasa_tensor::{DType, Device, Tensor};
///
/// let model = Linear::new(8, 4, Device::CPU)?;
/// let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.1, ..Default::default() })?;
/// let mut accumulate = GradAccumulator::new(4)?;      // effective batch: 4 × 16
/// let mut steps = 0;
/// for micro_batch in 0..8 {
///     let x = Var::new(Tensor::randn([16, 8], DType::F32)?);
///     let y = Tensor::from_vec((0..16).map(|i| (i + micro_batch) % 4).collect::<Vec<i64>>(), [16])?;
///     accumulate.backward(&cross_entropy(&model.forward(&x)?, &y)?)?;
///     if accumulate.step(&mut opt)? {
///         steps += 1;                                  // every 4th micro-batch
///     }
/// }
/// assert_eq!(steps, 2);
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
#[derive(Clone, Debug)]
pub struct GradAccumulator {
    micro_batches: usize,
    accumulated: usize,
}

impl GradAccumulator {
    /// An accumulator of `micro_batches` (at least 1; 1 is plain training).
    pub fn new(micro_batches: usize) -> Result<GradAccumulator> {
        if micro_batches == 0 {
            return Err(NnError::invalid("GradAccumulator", "needs at least 1 micro-batch per step"));
        }
        Ok(GradAccumulator { micro_batches, accumulated: 0 })
    }

    /// Backward of `loss / k` (gradients add up in the parameters' `.grad`);
    /// true when `k` micro-batches have now been accumulated, i.e. it is
    /// time to step.
    pub fn backward(&mut self, loss: &Var) -> Result<bool> {
        loss.div_scalar(self.micro_batches as f64)?.backward()?;
        self.accumulated += 1;
        Ok(self.is_ready())
    }

    /// When `k` micro-batches were accumulated: `opt.step()`, then
    /// `opt.zero_grad()`, and true; otherwise nothing and false.
    pub fn step(&mut self, opt: &mut dyn Optimizer) -> Result<bool> {
        if !self.is_ready() {
            return Ok(false);
        }
        opt.step()?;
        opt.zero_grad()?;
        self.accumulated = 0;
        Ok(true)
    }

    /// Whether `k` micro-batches were accumulated since the last step.
    pub fn is_ready(&self) -> bool {
        self.accumulated >= self.micro_batches
    }

    /// `k`.
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// Micro-batches accumulated since the last step.
    pub fn accumulated(&self) -> usize {
        self.accumulated
    }

    /// Forgets the count (after dropping the gradients yourself, e.g. on a
    /// skipped step).
    pub fn reset(&mut self) {
        self.accumulated = 0;
    }
}
