//! Optimizers, learning-rate schedules, gradient clipping and gradient
//! accumulation (PyTorch's `torch.optim`, `torch.nn.utils.clip_grad_*`).
//!
//! Every optimizer implements [`Optimizer`] (object safe: a training loop
//! can take `&mut dyn Optimizer`) and updates the parameters in place under
//! `no_grad`, with its state (momentum, moments) allocated once at the first
//! step: later steps allocate nothing, neither from the device nor from the
//! caching allocator. Parameters without a gradient are skipped, as in
//! PyTorch.
//!
//! - [`Sgd`] (momentum, dampening, Nesterov, weight decay, maximize),
//!   [`Adam`] and [`AdamW`] (AMSGrad, maximize), with PyTorch's update rules
//!   and defaults.
//! - [`LrScheduler`]: [`StepLr`], [`CosineAnnealingLr`], [`LinearWarmup`].
//! - [`clip_grad_norm_`] and [`clip_grad_value_`].
//! - [`GradAccumulator`]: `k` micro-batches, one optimizer step.
//! - [`AutoMicroBatch`]: a step over a fixed batch that splits itself into
//!   micro-batches when it runs out of memory (ranks agree on the split).
//!
//! An optimizer's [`Optimizer::state_dict`] holds its state under
//! PyTorch-like names (`state.{i}.exp_avg`, `param_groups.0.lr`), and
//! [`Optimizer::load_state_dict`] refuses a state that does not fit, naming
//! the entry.
//!
//! ```
//! use brasa_nn::optim::{Adam, AdamConfig, LrScheduler, Optimizer, StepLr};
//! use brasa_nn::{functional::mse_loss, functional::Reduction, Linear, Module, ModuleExt};
//! use brasa_autograd::Var;
//! use brasa_tensor::{DType, Device, Tensor};
//!
//! let model = Linear::new(3, 1, Device::CPU)?;
//! let mut opt = Adam::new(model.parameters(), AdamConfig { lr: 0.01, ..Default::default() })?;
//! let mut schedule = StepLr::new(&opt, 10, 0.5)?;
//! let (x, y) = (Var::new(Tensor::randn([8, 3], DType::F32)?), Var::new(Tensor::zeros([8, 1], DType::F32)?));
//! for _ in 0..20 {
//!     mse_loss(&model.forward(&x)?, &y, Reduction::Mean)?.backward()?;
//!     opt.step()?;
//!     opt.zero_grad()?;
//!     schedule.step(&mut opt)?;
//! }
//! assert_eq!(opt.lr(), 0.01 * 0.25);
//! # Ok::<(), brasa_nn::NnError>(())
//! ```

mod accumulate;
mod adam;
mod auto_micro_batch;
mod clip;
mod scheduler;
mod sgd;

pub use accumulate::GradAccumulator;
pub use adam::{Adam, AdamConfig, AdamW};
pub use auto_micro_batch::{
    AutoMicroBatch, AutoMicroBatchConfig, LocalGuard, MicroLoss, SplitOutcome, SplitPeers, SplitReport, SplitRetry,
};
pub use clip::{clip_grad_norm_, clip_grad_norm_with, clip_grad_value_, grad_norm};
pub use scheduler::{CosineAnnealingLr, LinearWarmup, LrScheduler, StepLr};
pub use sgd::{Sgd, SgdConfig};

use crate::error::{NnError, Result};
use crate::state_dict::StateDict;
use brasa_autograd::{AutogradError, Var};
use brasa_tensor::{DType, Device, Tensor};
use std::collections::HashSet;

/// An optimizer: updates its parameters in place from their gradients.
/// Object safe, so loops, schedulers and gradient scalers take
/// `&mut dyn Optimizer`.
pub trait Optimizer: Send {
    /// One update of every parameter that has a gradient (under `no_grad`,
    /// in place). The first step allocates the state; later steps allocate
    /// nothing.
    fn step(&mut self) -> Result<()>;

    /// Drops every parameter's gradient (PyTorch's default
    /// `zero_grad(set_to_none=True)`): their memory goes back to the cache.
    fn zero_grad(&mut self) -> Result<()> {
        self.zero_grad_with(true)
    }

    /// Drops the gradients (`set_to_none`) or zeroes them in place (then
    /// backward accumulates into the same buffers: no allocation at all).
    fn zero_grad_with(&mut self, set_to_none: bool) -> Result<()> {
        for param in self.params() {
            param.zero_grad(set_to_none)?;
        }
        Ok(())
    }

    /// The learning rate.
    fn lr(&self) -> f64;

    /// Sets the learning rate (schedulers call this between steps). A rate
    /// that is NaN, infinite or negative is an error and the rate stays as
    /// it was: PyTorch's constructors refuse `lr < 0`, and a NaN rate would
    /// silently turn every parameter into NaN at the next step.
    fn set_lr(&mut self, lr: f64) -> Result<()>;

    /// The parameters, in the order given at construction (state entries
    /// are numbered by this order).
    fn params(&self) -> &[Var];

    /// The state (per-parameter buffers and step counts) and the
    /// hyperparameters, by name. Buffers share storage with the live state:
    /// save it (or copy it) before stepping again if it must stay as it is.
    fn state_dict(&self) -> Result<StateDict>;

    /// Replaces the state and hyperparameters with `state` (copied onto the
    /// parameters' devices and dtypes). A missing, unexpected or misshapen
    /// entry is an error naming it, and then nothing is changed.
    fn load_state_dict(&mut self, state: &StateDict) -> Result<()>;
}

/// Errors unless `params` is a non-empty list of distinct floating-point leaves.
pub(crate) fn check_params(what: &'static str, params: &[Var]) -> Result<()> {
    if params.is_empty() {
        return Err(NnError::invalid(what, "got an empty parameter list"));
    }
    for (i, p) in params.iter().enumerate() {
        if !p.is_leaf() {
            return Err(NnError::invalid(
                what,
                format!("parameter {i} is not a leaf (it was computed from others); an optimizer updates leaves"),
            ));
        }
        if !p.dtype().is_float() {
            return Err(NnError::invalid(what, format!("parameter {i} has dtype {}; only float tensors", p.dtype())));
        }
        if let Some(j) = params[..i].iter().position(|q| q.same_var(p)) {
            return Err(NnError::invalid(
                what,
                format!("parameters {j} and {i} are the same Var; it would be updated twice per step"),
            ));
        }
    }
    Ok(())
}

/// Errors unless `value` is finite and at least 0.
pub(crate) fn check_non_negative(what: &'static str, name: &str, value: f64) -> Result<()> {
    if !value.is_finite() || value < 0.0 {
        return Err(NnError::invalid(what, format!("{name} must be finite and >= 0, got {value}")));
    }
    Ok(())
}

/// Parameter `index`'s gradient, if it has one, checked to fit it: a
/// gradient of another shape would be broadcast over the parameter by the
/// in-place update (and one of another dtype or device refused by it less
/// clearly), so it is an error naming both shapes.
pub(crate) fn checked_grad(what: &'static str, param: &Var) -> Result<Option<Tensor>> {
    let Some(grad) = param.grad() else { return Ok(None) };
    let tensor = param.tensor();
    if grad.dims() != tensor.dims() {
        return Err(AutogradError::GradShape {
            op: what,
            context: "the parameter's .grad holds",
            got: grad.dims().to_vec(),
            expected: tensor.dims().to_vec(),
        }
        .into());
    }
    if grad.device() != tensor.device() {
        return Err(AutogradError::GradDevice {
            op: what,
            context: "the parameter's .grad holds",
            got: grad.device(),
            expected: tensor.device(),
        }
        .into());
    }
    if grad.dtype() != tensor.dtype() {
        return Err(AutogradError::GradDtype {
            op: what,
            context: "the parameter's .grad holds",
            got: grad.dtype(),
            expected: tensor.dtype(),
        }
        .into());
    }
    Ok(Some(grad))
}

/// The dim order (see [`Tensor::dense_dim_order`]) in which `param` and
/// every one of `others` (of `param`'s shape) lie one element after
/// another, so that an element-wise update can walk them all straight
/// through memory in step: row-major tensors, or channels-last weights with
/// gradients and state laid out alike. `None` when there is no such order.
pub(crate) fn walk_order(param: &Tensor, others: &[&Tensor]) -> Option<Vec<usize>> {
    let order = param.dense_dim_order()?;
    let in_step = |t: &Tensor| t.dims() == param.dims() && t.permute(&order).is_ok_and(|v| v.is_contiguous());
    others.iter().all(|t| in_step(t)).then_some(order)
}

/// The name of parameter `index`'s state entry `key`.
pub(crate) fn state_name(index: usize, key: &str) -> String {
    format!("state.{index}.{key}")
}

/// The name of hyperparameter `key` (one parameter group, as in PyTorch's layout).
pub(crate) fn group_name(key: &str) -> String {
    format!("param_groups.0.{key}")
}

/// A 0-d f64 host tensor.
pub(crate) fn scalar(value: f64) -> Result<Tensor> {
    Ok(Tensor::from_vec_on(vec![value], [], Device::CPU)?)
}

/// Writes the hyperparameters and the parameter numbering.
pub(crate) fn write_group(dict: &mut StateDict, params: usize, hyper: &[(&str, f64)]) -> Result<()> {
    for (key, value) in hyper {
        dict.insert(group_name(key), scalar(*value)?);
    }
    let indices: Vec<i64> = (0..params as i64).collect();
    dict.insert(group_name("params"), Tensor::from_vec_on(indices, [params], Device::CPU)?);
    Ok(())
}

/// Reads an optimizer state dict, remembering which entries were used so
/// that [`StateReader::finish`] can name any it did not expect.
pub(crate) struct StateReader<'a> {
    what: &'static str,
    dict: &'a StateDict,
    used: HashSet<String>,
}

impl<'a> StateReader<'a> {
    /// A reader for an optimizer of `params` parameters; checks the numbering.
    pub(crate) fn new(what: &'static str, dict: &'a StateDict, params: usize) -> Result<StateReader<'a>> {
        let mut reader = StateReader { what, dict, used: HashSet::new() };
        let name = group_name("params");
        let numbering = reader.required(&name)?;
        let count = numbering.numel();
        if count != params {
            return Err(
                reader.error(format!("{name}: the state is for {count} parameters, this optimizer has {params}"))
            );
        }
        Ok(reader)
    }

    fn error(&self, message: String) -> NnError {
        NnError::StateDict(format!("{}: {message}", self.what))
    }

    fn required(&mut self, name: &str) -> Result<&'a Tensor> {
        let tensor = self.dict.get(name).ok_or_else(|| self.error(format!("missing entry {name}")))?;
        self.used.insert(name.to_string());
        Ok(tensor)
    }

    /// The values of entry `name`, which must have `len` elements.
    pub(crate) fn values(&mut self, name: &str, len: usize) -> Result<Vec<f64>> {
        let tensor = self.required(name)?;
        if tensor.numel() != len {
            return Err(self.error(format!("{name} should hold {len} value(s), has shape {:?}", tensor.dims())));
        }
        Ok(tensor.to_dtype(DType::F64)?.to_vec::<f64>()?)
    }

    /// The number in the one-element entry `name`.
    pub(crate) fn number(&mut self, name: &str) -> Result<f64> {
        Ok(self.values(name, 1)?[0])
    }

    /// A hyperparameter (`param_groups.0.{key}`).
    pub(crate) fn hyper(&mut self, key: &str) -> Result<f64> {
        self.number(&group_name(key))
    }

    /// A flag hyperparameter (stored as 0 or 1).
    pub(crate) fn flag(&mut self, key: &str) -> Result<bool> {
        Ok(self.hyper(key)? != 0.0)
    }

    /// A step count: a whole number >= 0.
    pub(crate) fn count(&mut self, name: &str) -> Result<u64> {
        let value = self.number(name)?;
        if !(value >= 0.0 && value.fract() == 0.0 && value < 2f64.powi(53)) {
            return Err(self.error(format!("{name} should be a step count, got {value}")));
        }
        Ok(value as u64)
    }

    /// Whether the dict has an entry `name`.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.dict.get(name).is_some()
    }

    /// A copy of entry `name` on `param`'s device and dtype (new storage: the
    /// dict is not aliased), laid out as `param` is (a channels-last weight's
    /// state is channels-last, as it was when saved); its shape must be
    /// `param`'s.
    pub(crate) fn buffer_like(&mut self, name: &str, param: &Tensor) -> Result<Tensor> {
        let source = self.required(name)?;
        if source.dims() != param.dims() {
            return Err(self.error(format!(
                "{name} has shape {:?}, but its parameter has shape {:?}",
                source.dims(),
                param.dims()
            )));
        }
        if !source.dtype().is_float() {
            return Err(self.error(format!("{name} should be floating-point, got {}", source.dtype())));
        }
        let buffer = param.zeros_like_preserve_format()?;
        buffer.copy_(source)?;
        Ok(buffer)
    }

    /// Errors naming the first entry nobody read.
    pub(crate) fn finish(self) -> Result<()> {
        match self.dict.names().find(|name| !self.used.contains(*name)) {
            Some(name) => Err(self.error(format!("unexpected entry {name}"))),
            None => Ok(()),
        }
    }
}

/// One scratch buffer per (device, dtype), as large as the largest parameter
/// there, allocated at the first step and shared by all parameters (an
/// optimizer works through them one at a time).
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    buffers: Vec<Tensor>,
}

impl Scratch {
    /// Allocates the buffers `params` need (once).
    pub(crate) fn ensure(&mut self, params: &[Var]) -> Result<()> {
        if !self.buffers.is_empty() {
            return Ok(());
        }
        let mut sizes: Vec<(Device, DType, usize)> = Vec::new();
        for p in params {
            match sizes.iter_mut().find(|(d, t, _)| *d == p.device() && *t == p.dtype()) {
                Some(entry) => entry.2 = entry.2.max(p.numel()),
                None => sizes.push((p.device(), p.dtype(), p.numel())),
            }
        }
        for (device, dtype, len) in sizes {
            self.buffers.push(Tensor::zeros_on([len], dtype, device)?);
        }
        Ok(())
    }

    /// A view of the scratch shaped like `param` (no allocation).
    pub(crate) fn like(&self, param: &Tensor) -> Result<Tensor> {
        let buffer = self
            .buffers
            .iter()
            .find(|b| b.device() == param.device() && b.dtype() == param.dtype() && b.numel() >= param.numel())
            .ok_or_else(|| {
                NnError::invalid(
                    "optimizer",
                    format!(
                        "internal error: no scratch buffer for a {} {:?} parameter on {}",
                        param.dtype(),
                        param.dims(),
                        param.device()
                    ),
                )
            })?;
        let shape: Vec<isize> = param.dims().iter().map(|&d| d as isize).collect();
        Ok(buffer.narrow(0, 0, param.numel())?.view(&shape)?)
    }
}
