//! [`Adam`] and [`AdamW`] — PyTorch's `torch.optim.Adam` and
//! `torch.optim.AdamW`, with AMSGrad and maximize.
//!
//! Per parameter `p` with gradient `g` at step `t` (counted per parameter):
//!
//! ```text
//! g  = ±g (+ weight_decay·p for Adam: an L2 penalty)
//! p *= 1 − lr·weight_decay                          (AdamW: decoupled decay)
//! m  = lerp(m, g, 1 − β1)                           exp_avg
//! v  = β2·v + (1 − β2)·g²                           exp_avg_sq
//! v̂  = max(v̂, v)                                    max_exp_avg_sq (AMSGrad)
//! p -= lr/(1 − β1^t) · m / (sqrt(v or v̂)/sqrt(1 − β2^t) + eps)
//! ```
//!
//! The bias corrections are PyTorch's: applied to the step size and to
//! `sqrt(v)` before `eps` is added. Everything is in place: the moments are
//! allocated at a parameter's first step, and the denominator (and the
//! decayed gradient of Adam with weight decay, or the negated one of
//! maximize) is computed in one scratch buffer per device and dtype, as
//! large as the largest parameter and shared by all, so a step allocates
//! nothing after the first.

use super::{
    check_non_negative, check_params, checked_grad, state_name, walk_order, write_group, Optimizer, Scratch,
    StateReader,
};
use crate::error::{NnError, Result};
use crate::state_dict::StateDict;
use brasa_autograd::{no_grad, Var};
use brasa_tensor::{fused_adam_, AdamOptions, AdamParam, Tensor};

/// The hyperparameters of [`Adam`] and [`AdamW`], with `torch.optim.Adam`'s
/// defaults (`AdamW` in PyTorch defaults to `weight_decay = 1e-2`: see
/// [`AdamConfig::adamw`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamConfig {
    /// The learning rate (default 1e-3).
    pub lr: f64,
    /// `(β1, β2)`, the decay rates of the moment estimates (default `(0.9, 0.999)`), each in `[0, 1)`.
    pub betas: (f64, f64),
    /// Added to the denominator for stability (default 1e-8).
    pub eps: f64,
    /// Weight decay (default 0): an L2 penalty for `Adam`, decoupled for `AdamW`.
    pub weight_decay: f64,
    /// Use the running maximum of the second moment (AMSGrad).
    pub amsgrad: bool,
    /// Maximise the objective instead of minimising it.
    pub maximize: bool,
}

impl Default for AdamConfig {
    fn default() -> AdamConfig {
        AdamConfig { lr: 1e-3, betas: (0.9, 0.999), eps: 1e-8, weight_decay: 0.0, amsgrad: false, maximize: false }
    }
}

impl AdamConfig {
    /// `torch.optim.AdamW`'s defaults: these with `weight_decay = 1e-2`.
    pub fn adamw() -> AdamConfig {
        AdamConfig { weight_decay: 1e-2, ..AdamConfig::default() }
    }

    /// Errors naming the first invalid value.
    pub fn validate(&self, what: &'static str) -> Result<()> {
        check_non_negative(what, "lr", self.lr)?;
        check_non_negative(what, "eps", self.eps)?;
        check_non_negative(what, "weight_decay", self.weight_decay)?;
        for (i, beta) in [self.betas.0, self.betas.1].into_iter().enumerate() {
            if !(0.0..1.0).contains(&beta) {
                return Err(NnError::invalid(what, format!("betas.{i} must be in [0, 1), got {beta}")));
            }
        }
        Ok(())
    }
}

/// One parameter's state.
#[derive(Debug)]
struct MomentState {
    step: u64,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    max_exp_avg_sq: Option<Tensor>,
}

/// What `Adam` and `AdamW` share; `decoupled` tells them apart.
#[derive(Debug)]
struct AdamCore {
    what: &'static str,
    decoupled: bool,
    params: Vec<Var>,
    config: AdamConfig,
    state: Vec<Option<MomentState>>,
    scratch: Scratch,
}

impl AdamCore {
    fn new(what: &'static str, decoupled: bool, params: Vec<Var>, config: AdamConfig) -> Result<AdamCore> {
        check_params(what, &params)?;
        config.validate(what)?;
        let state = params.iter().map(|_| None).collect();
        Ok(AdamCore { what, decoupled, params, config, state, scratch: Scratch::default() })
    }

    /// One step: every parameter whose tensors allow it (laid out alike and
    /// densely, state complete) in one fused pass each ([`fused_adam_`], one call for all of
    /// them), the others through the composed in-place ops. Both give the
    /// same bits.
    fn step(&mut self) -> Result<()> {
        let _guard = no_grad();
        self.scratch.ensure(&self.params)?;
        let mut fused: Vec<(usize, Tensor, Tensor)> = Vec::new();
        for index in 0..self.params.len() {
            let Some(grad) = checked_grad(self.what, &self.params[index])? else { continue };
            let param = self.params[index].tensor().clone();
            self.state_for(index, &param)?;
            if self.fusable(index, &param) {
                fused.push((index, param, grad));
            } else {
                self.update(index, &grad)?;
            }
        }
        if fused.is_empty() {
            return Ok(());
        }
        let AdamConfig { lr, betas, eps, weight_decay, amsgrad, maximize } = self.config;
        let options = AdamOptions { lr, betas, eps, weight_decay, decoupled: self.decoupled, amsgrad, maximize };
        // Each parameter's tensors as contiguous views in its memory order
        // (themselves when row-major), updated in place through the views.
        let mut views: Vec<(Tensor, Tensor, Tensor, Tensor, Option<Tensor>, u64)> = Vec::with_capacity(fused.len());
        for (index, param, grad) in &fused {
            let state = self.state[*index].as_ref().ok_or_else(|| NnError::invalid(self.what, "internal: no state"))?;
            // The amsgrad buffer takes part only with amsgrad (as in `fusable`).
            let max = state.max_exp_avg_sq.as_ref().filter(|_| amsgrad);
            let written: Vec<&Tensor> = [&state.exp_avg, &state.exp_avg_sq].into_iter().chain(max).collect();
            let order = walk_order(param, &written)
                .ok_or_else(|| NnError::invalid(self.what, "internal: a fusable parameter lost its layout"))?;
            // The gradient is only read: any layout (a copy in the op if it
            // does not walk in step).
            views.push((
                param.permute(&order)?,
                grad.permute(&order)?,
                state.exp_avg.permute(&order)?,
                state.exp_avg_sq.permute(&order)?,
                max.map(|t| t.permute(&order)).transpose()?,
                state.step + 1,
            ));
        }
        let list: Vec<AdamParam<'_>> = views
            .iter()
            .map(|(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step)| AdamParam {
                param,
                grad,
                exp_avg,
                exp_avg_sq,
                max_exp_avg_sq: max_exp_avg_sq.as_ref(),
                step: *step,
            })
            .collect();
        fused_adam_(&list, options)?;
        // Counted only once the update is done (the fused op checks every
        // parameter before it writes any).
        for (index, _, _) in &fused {
            if let Some(state) = &mut self.state[*index] {
                state.step += 1;
            }
        }
        Ok(())
    }

    /// The state of parameter `index`, created (zero moments) on its first step.
    fn state_for(&mut self, index: usize, param: &Tensor) -> Result<&mut MomentState> {
        // Moments made here are counted as optimizer state.
        let _state = brasa_tensor::memory::category_scope(brasa_tensor::memory::MemoryCategory::OptimizerState);
        let amsgrad = self.config.amsgrad;
        Ok(match &mut self.state[index] {
            Some(state) => state,
            slot @ None => slot.insert(MomentState {
                step: 0,
                // Laid out as the parameter (channels-last for a
                // channels-last weight), so the fused update walks all of
                // them in step.
                exp_avg: param.zeros_like_preserve_format()?,
                exp_avg_sq: param.zeros_like_preserve_format()?,
                max_exp_avg_sq: if amsgrad { Some(param.zeros_like_preserve_format()?) } else { None },
            }),
        })
    }

    /// Whether the fused update can run on parameter `index`: it and its
    /// state are laid out alike and densely ([`walk_order`]: updated in
    /// place in one pass), of one dtype, and amsgrad has its buffer. A
    /// loaded state dict could hold anything else.
    fn fusable(&self, index: usize, param: &Tensor) -> bool {
        let Some(state) = &self.state[index] else { return false };
        let max = match (&state.max_exp_avg_sq, self.config.amsgrad) {
            (Some(max), true) => Some(max),
            (None, true) => return false,
            (_, false) => None,
        };
        let state_tensors: Vec<&Tensor> = [&state.exp_avg, &state.exp_avg_sq].into_iter().chain(max).collect();
        state_tensors.iter().all(|t| t.dtype() == param.dtype()) && walk_order(param, &state_tensors).is_some()
    }

    fn update(&mut self, index: usize, grad: &Tensor) -> Result<()> {
        let AdamConfig { lr, betas: (beta1, beta2), eps, weight_decay, amsgrad, maximize } = self.config;
        let param = &self.params[index].tensor().clone();
        self.state_for(index, param)?;
        let scratch = self.scratch.like(param)?;
        let state = self.state[index].as_mut().ok_or_else(|| NnError::invalid(self.what, "internal: no state"))?;
        state.step += 1;
        if self.decoupled && weight_decay != 0.0 {
            param.mul_scalar_(1.0 - lr * weight_decay)?;
        }
        let l2 = !self.decoupled && weight_decay != 0.0;
        let effective = if l2 || maximize {
            scratch.copy_(grad)?;
            if maximize {
                scratch.neg_()?;
            }
            if l2 {
                scratch.add_scaled_(weight_decay, param)?;
            }
            &scratch
        } else {
            grad
        };
        state.exp_avg.lerp_(effective, 1.0 - beta1)?;
        state.exp_avg_sq.mul_scalar_(beta2)?;
        state.exp_avg_sq.addcmul_(1.0 - beta2, effective, effective)?;
        let second = match (&state.max_exp_avg_sq, amsgrad) {
            (Some(max), true) => {
                max.maximum_(&state.exp_avg_sq)?;
                max
            }
            _ => &state.exp_avg_sq,
        };
        // PyTorch computes these in Python floats: `beta ** step`, `bc2 ** 0.5`.
        let t = state.step as f64;
        let bias_correction1 = 1.0 - beta1.powf(t);
        let bias_correction2_sqrt = (1.0 - beta2.powf(t)).powf(0.5);
        let step_size = lr / bias_correction1;
        // denom = sqrt(v) / sqrt(bc2) + eps, in the scratch buffer.
        scratch.copy_(second)?;
        scratch.sqrt_()?;
        scratch.affine_(1.0 / bias_correction2_sqrt, eps)?;
        param.addcdiv_(-step_size, &state.exp_avg, &scratch)?;
        Ok(())
    }

    fn state_dict(&self) -> Result<StateDict> {
        let mut dict = StateDict::new();
        for (index, state) in self.state.iter().enumerate() {
            let Some(state) = state else { continue };
            dict.insert(state_name(index, "step"), super::scalar(state.step as f64)?);
            dict.insert(state_name(index, "exp_avg"), state.exp_avg.clone());
            dict.insert(state_name(index, "exp_avg_sq"), state.exp_avg_sq.clone());
            if let Some(max) = &state.max_exp_avg_sq {
                dict.insert(state_name(index, "max_exp_avg_sq"), max.clone());
            }
        }
        let c = &self.config;
        let flag = |b: bool| f64::from(u8::from(b));
        let hyper = [
            ("lr", c.lr),
            ("eps", c.eps),
            ("weight_decay", c.weight_decay),
            ("amsgrad", flag(c.amsgrad)),
            ("maximize", flag(c.maximize)),
            ("decoupled_weight_decay", flag(self.decoupled)),
        ];
        write_group(&mut dict, self.params.len(), &hyper)?;
        let betas = Tensor::from_vec_on(vec![c.betas.0, c.betas.1], [2], brasa_tensor::Device::CPU)?;
        dict.insert(super::group_name("betas"), betas);
        Ok(dict)
    }

    fn load_state_dict(&mut self, dict: &StateDict) -> Result<()> {
        let mut reader = StateReader::new(self.what, dict, self.params.len())?;
        let decoupled = reader.flag("decoupled_weight_decay")?;
        if decoupled != self.decoupled {
            let (saved, this) = if decoupled { ("AdamW", "Adam") } else { ("Adam", "AdamW") };
            return Err(NnError::StateDict(format!(
                "{}: param_groups.0.decoupled_weight_decay: the state is {saved}'s, this optimizer is {this}",
                self.what
            )));
        }
        let betas = reader.values(&super::group_name("betas"), 2)?;
        let config = AdamConfig {
            lr: reader.hyper("lr")?,
            betas: (betas[0], betas[1]),
            eps: reader.hyper("eps")?,
            weight_decay: reader.hyper("weight_decay")?,
            amsgrad: reader.flag("amsgrad")?,
            maximize: reader.flag("maximize")?,
        };
        config.validate(self.what)?;
        let mut states = Vec::with_capacity(self.params.len());
        for (index, param) in self.params.iter().enumerate() {
            let step_name = state_name(index, "step");
            let max_name = state_name(index, "max_exp_avg_sq");
            let any =
                ["step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"].iter().any(|k| reader.has(&state_name(index, k)));
            if !any {
                states.push(None);
                continue;
            }
            let param = param.tensor();
            states.push(Some(MomentState {
                step: reader.count(&step_name)?,
                exp_avg: reader.buffer_like(&state_name(index, "exp_avg"), param)?,
                exp_avg_sq: reader.buffer_like(&state_name(index, "exp_avg_sq"), param)?,
                max_exp_avg_sq: if config.amsgrad || reader.has(&max_name) {
                    Some(reader.buffer_like(&max_name, param)?)
                } else {
                    None
                },
            }));
        }
        reader.finish()?;
        self.config = config;
        self.state = states;
        Ok(())
    }
}

macro_rules! adam_optimizer {
    ($name:ident, $decoupled:expr, $doc:literal, $example:literal) => {
        #[doc = $doc]
        ///
        /// ```
        #[doc = $example]
        /// use brasa_autograd::Var;
        /// use brasa_tensor::{fused_adam_, AdamOptions, AdamParam, Tensor};
        ///
        /// let w = Var::param(Tensor::from_vec(vec![1.0f64, -2.0], [2])?)?;
        #[doc = concat!("let mut opt = ", stringify!($name), "::new(vec![w.clone()], AdamConfig { lr: 0.1, ..Default::default() })?;")]
        /// w.mul(&w)?.sum_all()?.backward()?;
        /// opt.step()?;                              // the first step moves each weight by about lr
        /// let moved = w.tensor().to_vec::<f64>()?;
        /// assert!((moved[0] - 0.9).abs() < 1e-6 && (moved[1] + 1.9).abs() < 1e-6);
        /// # Ok::<(), brasa_nn::NnError>(())
        /// ```
        #[derive(Debug)]
        pub struct $name(AdamCore);

        impl $name {
            /// An optimizer of `params` (distinct floating-point leaves, at
            /// least one); `config` is validated.
            pub fn new(params: Vec<Var>, config: AdamConfig) -> Result<$name> {
                Ok($name(AdamCore::new(stringify!($name), $decoupled, params, config)?))
            }

            /// The hyperparameters.
            pub fn config(&self) -> &AdamConfig {
                &self.0.config
            }

            /// Parameter `index`'s step count, first and second moments, once it has state.
            pub fn moments(&self, index: usize) -> Option<(u64, &Tensor, &Tensor)> {
                let state = self.0.state.get(index)?.as_ref()?;
                Some((state.step, &state.exp_avg, &state.exp_avg_sq))
            }
        }

        impl Optimizer for $name {
            fn step(&mut self) -> Result<()> {
                self.0.step()
            }

            fn lr(&self) -> f64 {
                self.0.config.lr
            }

            fn set_lr(&mut self, lr: f64) -> Result<()> {
                check_non_negative(self.0.what, "lr", lr)?;
                self.0.config.lr = lr;
                Ok(())
            }

            fn params(&self) -> &[Var] {
                &self.0.params
            }

            /// `state.{i}.{step, exp_avg, exp_avg_sq, max_exp_avg_sq}` for each
            /// parameter with state, and `param_groups.0.{lr, betas, eps,
            /// weight_decay, amsgrad, maximize, decoupled_weight_decay, params}`.
            fn state_dict(&self) -> Result<StateDict> {
                self.0.state_dict()
            }

            fn load_state_dict(&mut self, state: &StateDict) -> Result<()> {
                self.0.load_state_dict(state)
            }
        }
    };
}

adam_optimizer!(
    Adam,
    false,
    "Adam (PyTorch's `torch.optim.Adam`): weight decay is an L2 penalty added to the gradient. See the module doc.",
    "use brasa_nn::optim::{Adam, AdamConfig, Optimizer};"
);

adam_optimizer!(
    AdamW,
    true,
    "AdamW (PyTorch's `torch.optim.AdamW`): weight decay shrinks the weights directly, `p *= 1 − lr·weight_decay`, \
     apart from the gradient's moments. See the module doc; PyTorch's AdamW defaults to `weight_decay = 1e-2` \
     ([`AdamConfig::adamw`]).",
    "use brasa_nn::optim::{AdamW, AdamConfig, Optimizer};"
);
