//! [`Sgd`]: stochastic gradient descent with momentum, dampening, Nesterov
//! momentum, weight decay and maximize — PyTorch's `torch.optim.SGD`.
//!
//! With `d = ±grad + weight_decay·p` (minus for `maximize`):
//!
//! ```text
//! buf = d                                  first step (a copy)
//! buf = momentum·buf + (1 − dampening)·d   later steps
//! p  -= lr · (nesterov ? d + momentum·buf : buf)      (momentum > 0)
//! p  -= lr · d                                        (momentum = 0)
//! ```
//!
//! All in place, without temporaries: `d` is never materialised (its terms
//! are added one at a time), so a step allocates nothing after the first
//! (which allocates the momentum buffers). Without momentum there is no
//! state at all.
//!
//! A parameter whose tensors allow it (parameter, gradient and buffer laid
//! out alike and densely — row-major, or channels-last as after
//! `ModuleExt::to_channels_last` — none sharing another's memory) is
//! updated in one pass over
//! its memory by [`fused_sgd_`], all of them in one call; the others go
//! through the composed in-place ops of `Sgd::update`. The fused kernels
//! replay those ops per element, so both give the same bits.

use super::{
    check_non_negative, check_params, checked_grad, state_name, walk_order, write_group, Optimizer, StateReader,
};
use crate::error::{NnError, Result};
use crate::state_dict::StateDict;
use brasa_autograd::{no_grad, Var};
use brasa_tensor::{fused_sgd_, SgdOptions, SgdParam, Tensor};

/// The hyperparameters of [`Sgd`], with PyTorch's defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdConfig {
    /// The learning rate (default 1e-3), at least 0.
    pub lr: f64,
    /// The momentum factor (default 0: plain SGD), at least 0.
    pub momentum: f64,
    /// The dampening of the momentum's new term (default 0).
    pub dampening: f64,
    /// Nesterov momentum (needs `momentum > 0` and `dampening == 0`).
    pub nesterov: bool,
    /// L2 penalty added to the gradient (default 0), at least 0.
    pub weight_decay: f64,
    /// Maximise the objective instead of minimising it.
    pub maximize: bool,
}

impl Default for SgdConfig {
    fn default() -> SgdConfig {
        SgdConfig { lr: 1e-3, momentum: 0.0, dampening: 0.0, nesterov: false, weight_decay: 0.0, maximize: false }
    }
}

impl SgdConfig {
    /// Errors naming the first invalid value.
    pub fn validate(&self) -> Result<()> {
        check_non_negative("Sgd", "lr", self.lr)?;
        check_non_negative("Sgd", "momentum", self.momentum)?;
        check_non_negative("Sgd", "weight_decay", self.weight_decay)?;
        if !self.dampening.is_finite() {
            return Err(NnError::invalid("Sgd", format!("dampening must be finite, got {}", self.dampening)));
        }
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(NnError::invalid(
                "Sgd",
                format!(
                    "Nesterov momentum requires momentum > 0 and dampening 0, got momentum {} and dampening {}",
                    self.momentum, self.dampening
                ),
            ));
        }
        Ok(())
    }
}

/// Stochastic gradient descent (PyTorch's `torch.optim.SGD`; see the module
/// doc for the update).
///
/// ```
/// use brasa_nn::optim::{Optimizer, Sgd, SgdConfig};
/// use brasa_autograd::Var;
/// use brasa_tensor::Tensor;
///
/// let w = Var::param(Tensor::from_vec(vec![1.0f64, -2.0], [2])?)?;
/// let mut opt = Sgd::new(vec![w.clone()], SgdConfig { lr: 0.25, momentum: 0.9, ..Default::default() })?;
/// w.mul(&w)?.sum_all()?.backward()?;      // grad = 2w
/// opt.step()?;
/// assert_eq!(w.tensor().to_vec::<f64>()?, [0.5, -1.0]);
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
#[derive(Debug)]
pub struct Sgd {
    params: Vec<Var>,
    config: SgdConfig,
    /// Per parameter, once it had a gradient (with momentum only).
    momentum_buffers: Vec<Option<Tensor>>,
}

impl Sgd {
    /// An optimizer of `params` (distinct floating-point leaves, at least
    /// one); `config` is validated.
    pub fn new(params: Vec<Var>, config: SgdConfig) -> Result<Sgd> {
        check_params("Sgd", &params)?;
        config.validate()?;
        let momentum_buffers = vec![None; params.len()];
        Ok(Sgd { params, config, momentum_buffers })
    }

    /// The hyperparameters.
    pub fn config(&self) -> &SgdConfig {
        &self.config
    }

    /// The momentum buffer of parameter `index`, once it exists.
    pub fn momentum_buffer(&self, index: usize) -> Option<&Tensor> {
        self.momentum_buffers.get(index).and_then(Option::as_ref)
    }

    /// One step: the fusable parameters in one [`fused_sgd_`] call, the
    /// others through the composed ops ([`Sgd::update`]).
    fn step_all(&mut self) -> Result<()> {
        let momentum = self.config.momentum != 0.0;
        // (index, parameter, gradient, first step with momentum)
        let mut fused: Vec<(usize, Tensor, Tensor, bool)> = Vec::new();
        for index in 0..self.params.len() {
            let Some(grad) = checked_grad("Sgd::step", &self.params[index])? else { continue };
            let param = self.params[index].tensor().clone();
            if !self.fusable(index, &param, &grad) {
                self.update(index, &grad)?;
                continue;
            }
            let first = momentum && self.momentum_buffers[index].is_none();
            if first {
                // The fused first step writes the buffer without reading it
                // (`buf = ±g + wd·p`); the zeros are only the fill of a
                // fresh tensor laid out as the parameter.
                let _state = brasa_tensor::memory::category_scope(brasa_tensor::memory::MemoryCategory::OptimizerState);
                self.momentum_buffers[index] = Some(param.zeros_like_preserve_format()?);
            }
            fused.push((index, param, grad, first));
        }
        if fused.is_empty() {
            return Ok(());
        }
        let SgdConfig { lr, momentum, dampening, nesterov, weight_decay, maximize } = self.config;
        let options = SgdOptions { lr, momentum, dampening, weight_decay, nesterov, maximize };
        // Each parameter's tensors as contiguous views in its memory order
        // (themselves when row-major), updated in place through the views.
        let mut views: Vec<(Tensor, Tensor, Option<Tensor>, bool)> = Vec::with_capacity(fused.len());
        for (index, param, grad, first) in &fused {
            // The buffer takes part only with momentum (as in `fusable`).
            let buffer = self.momentum_buffers[*index].as_ref().filter(|_| momentum != 0.0);
            let others: Vec<&Tensor> = std::iter::once(grad).chain(buffer).collect();
            let order = walk_order(param, &others)
                .ok_or_else(|| NnError::invalid("Sgd::step", "internal: a fusable parameter lost its layout"))?;
            views.push((
                param.permute(&order)?,
                grad.permute(&order)?,
                buffer.map(|b| b.permute(&order)).transpose()?,
                *first,
            ));
        }
        let list: Vec<SgdParam<'_>> = views
            .iter()
            .map(|(param, grad, buffer, first)| SgdParam::new(param, grad, buffer.as_ref(), *first))
            .collect();
        let result = fused_sgd_(&list, options);
        drop(list);
        if result.is_err() {
            // The op checks every parameter before it writes any: forget
            // the buffers made for this step, so that the next step starts
            // them from the gradient rather than decaying their zeros.
            for (index, _, _, first) in &fused {
                if *first {
                    self.momentum_buffers[*index] = None;
                }
            }
        }
        Ok(result?)
    }

    /// Whether the fused update can run on parameter `index`: it, its
    /// gradient and its momentum buffer (if it has one yet) are laid out
    /// alike and densely ([`walk_order`]), of one dtype and device, and
    /// share no memory. A gradient laid out otherwise would need a copy
    /// each step, so it takes the composed ops, which read it in place and
    /// allocate nothing; a loaded state dict could hold anything else.
    fn fusable(&self, index: usize, param: &Tensor, grad: &Tensor) -> bool {
        let buffer = self.momentum_buffers[index].as_ref().filter(|_| self.config.momentum != 0.0);
        let buffer_ok = buffer.is_none_or(|buffer| {
            buffer.dtype() == param.dtype()
                && buffer.device() == param.device()
                && !buffer.shares_storage_with(param)
                && !buffer.shares_storage_with(grad)
        });
        let others: Vec<&Tensor> = std::iter::once(grad).chain(buffer).collect();
        buffer_ok && walk_order(param, &others).is_some() && !grad.shares_storage_with(param)
    }

    /// The composed update of one parameter, op by op (what the fused
    /// kernels replay per element).
    fn update(&mut self, index: usize, grad: &Tensor) -> Result<()> {
        let SgdConfig { lr, momentum, dampening, nesterov, weight_decay, maximize } = self.config;
        let param = self.params[index].tensor();
        let sign = if maximize { -1.0 } else { 1.0 };
        if momentum == 0.0 {
            // p − lr·(±g + wd·p) = (1 − lr·wd)·p ∓ lr·g
            if weight_decay != 0.0 {
                param.mul_scalar_(1.0 - lr * weight_decay)?;
            }
            param.add_scaled_(-lr * sign, grad)?;
            return Ok(());
        }
        let buffer = match &self.momentum_buffers[index] {
            Some(buffer) => {
                buffer.mul_scalar_(momentum)?;
                buffer.add_scaled_(sign * (1.0 - dampening), grad)?;
                if weight_decay != 0.0 {
                    buffer.add_scaled_((1.0 - dampening) * weight_decay, param)?;
                }
                buffer
            }
            None => {
                let _state = brasa_tensor::memory::category_scope(brasa_tensor::memory::MemoryCategory::OptimizerState);
                let buffer = grad.affine(sign, 0.0)?;
                if weight_decay != 0.0 {
                    buffer.add_scaled_(weight_decay, param)?;
                }
                self.momentum_buffers[index].insert(buffer)
            }
        };
        if nesterov {
            // p − lr·(d + momentum·buf), with d = ±g + wd·p
            if weight_decay != 0.0 {
                param.mul_scalar_(1.0 - lr * weight_decay)?;
            }
            param.add_scaled_(-lr * sign, grad)?;
            param.add_scaled_(-lr * momentum, buffer)?;
        } else {
            param.add_scaled_(-lr, buffer)?;
        }
        Ok(())
    }
}

impl Optimizer for Sgd {
    fn step(&mut self) -> Result<()> {
        let _guard = no_grad();
        self.step_all()
    }

    fn lr(&self) -> f64 {
        self.config.lr
    }

    fn set_lr(&mut self, lr: f64) -> Result<()> {
        check_non_negative("Sgd::set_lr", "lr", lr)?;
        self.config.lr = lr;
        Ok(())
    }

    fn params(&self) -> &[Var] {
        &self.params
    }

    /// `state.{i}.momentum_buffer` for each parameter that has one, and
    /// `param_groups.0.{lr, momentum, dampening, nesterov, weight_decay,
    /// maximize, params}`.
    fn state_dict(&self) -> Result<StateDict> {
        let mut dict = StateDict::new();
        for (index, buffer) in self.momentum_buffers.iter().enumerate() {
            if let Some(buffer) = buffer {
                dict.insert(state_name(index, "momentum_buffer"), buffer.clone());
            }
        }
        let c = &self.config;
        let hyper = [
            ("lr", c.lr),
            ("momentum", c.momentum),
            ("dampening", c.dampening),
            ("nesterov", f64::from(u8::from(c.nesterov))),
            ("weight_decay", c.weight_decay),
            ("maximize", f64::from(u8::from(c.maximize))),
        ];
        write_group(&mut dict, self.params.len(), &hyper)?;
        Ok(dict)
    }

    fn load_state_dict(&mut self, state: &StateDict) -> Result<()> {
        let mut reader = StateReader::new("Sgd", state, self.params.len())?;
        let config = SgdConfig {
            lr: reader.hyper("lr")?,
            momentum: reader.hyper("momentum")?,
            dampening: reader.hyper("dampening")?,
            nesterov: reader.flag("nesterov")?,
            weight_decay: reader.hyper("weight_decay")?,
            maximize: reader.flag("maximize")?,
        };
        config.validate()?;
        let mut buffers = Vec::with_capacity(self.params.len());
        for (index, param) in self.params.iter().enumerate() {
            let name = state_name(index, "momentum_buffer");
            buffers.push(if reader.has(&name) { Some(reader.buffer_like(&name, param.tensor())?) } else { None });
        }
        reader.finish()?;
        self.config = config;
        self.momentum_buffers = buffers;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brasa_tensor::DType;

    #[test]
    fn a_channels_last_weight_steps_fused_as_its_row_major_twin() -> Result<()> {
        let config = SgdConfig { lr: 0.1, momentum: 0.9, weight_decay: 0.01, nesterov: true, ..SgdConfig::default() };
        let values = Tensor::arange(-1.0, 1.0, 2.0 / 54.0, DType::F32)?.reshape(&[2, 3, 3, 3])?;
        let grads = [values.mul_scalar(0.5)?.sin()?, values.cos()?];
        let row_major = param(values.clone());
        let channels_last = param(values.to_channels_last()?);
        let mut opts = [Sgd::new(vec![row_major.clone()], config)?, Sgd::new(vec![channels_last.clone()], config)?];
        for g in &grads {
            row_major.set_grad(Some(g.clone()))?;
            channels_last.set_grad(Some(g.to_channels_last()?))?;
            assert!(opts[1].fusable(0, channels_last.tensor(), &channels_last.grad().unwrap()));
            for opt in &mut opts {
                opt.step()?;
            }
        }
        let buffer = opts[1].momentum_buffer(0).unwrap();
        assert_eq!(buffer.strides(), channels_last.tensor().strides(), "state laid out as its weight");
        assert!(channels_last.tensor().is_channels_last(), "the weight stays channels-last");
        assert_eq!(row_major.tensor().to_vec::<f32>()?, channels_last.tensor().to_vec::<f32>()?);
        assert_eq!(opts[0].momentum_buffer(0).unwrap().to_vec::<f32>()?, buffer.to_vec::<f32>()?);
        Ok(())
    }

    fn param(t: Tensor) -> Var {
        Var::param(t).unwrap()
    }

    #[test]
    fn only_unshared_tensors_laid_out_alike_take_the_fused_path() -> Result<()> {
        let config = SgdConfig { lr: 0.1, momentum: 0.9, ..SgdConfig::default() };
        let contiguous = param(Tensor::ones([3, 2], DType::F32)?);
        let transposed = param(Tensor::ones([2, 3], DType::F32)?.t()?);
        let mut opt = Sgd::new(vec![contiguous.clone(), transposed.clone()], config)?;
        let g = Tensor::ones([3, 2], DType::F32)?;
        let g_t = Tensor::ones([2, 3], DType::F32)?.t()?;
        assert!(opt.fusable(0, contiguous.tensor(), &g));
        assert!(!opt.fusable(0, contiguous.tensor(), &g_t), "a transposed gradient would need a copy");
        assert!(!opt.fusable(1, transposed.tensor(), &g), "a transposed parameter, a row-major gradient");
        assert!(opt.fusable(1, transposed.tensor(), &g_t), "both transposed: walked in step");
        assert!(!opt.fusable(0, contiguous.tensor(), contiguous.tensor()), "a gradient that is the parameter");
        // A buffer loaded from elsewhere that is not contiguous, or that is
        // the gradient's memory, sends the parameter to the composed ops.
        opt.momentum_buffers[0] = Some(Tensor::zeros([2, 3], DType::F32)?.t()?);
        assert!(!opt.fusable(0, contiguous.tensor(), &g));
        opt.momentum_buffers[0] = Some(g.clone());
        assert!(!opt.fusable(0, contiguous.tensor(), &g));
        opt.momentum_buffers[0] = Some(Tensor::zeros([3, 2], DType::F32)?);
        assert!(opt.fusable(0, contiguous.tensor(), &g));
        // A channels-last weight with a channels-last gradient and buffer.
        let w = param(Tensor::ones([4, 3, 3, 3], DType::F32)?.to_channels_last()?);
        let gw = Tensor::ones([4, 3, 3, 3], DType::F32)?.to_channels_last()?;
        opt.params.push(w.clone());
        opt.momentum_buffers.push(Some(w.tensor().zeros_like_preserve_format()?));
        assert!(opt.fusable(2, w.tensor(), &gw));
        assert!(!opt.fusable(2, w.tensor(), &gw.contiguous()?), "a row-major gradient of a channels-last weight");
        opt.momentum_buffers[2] = Some(w.tensor().zeros_like()?);
        assert!(!opt.fusable(2, w.tensor(), &gw), "a row-major buffer of a channels-last weight");
        // Without momentum the buffer plays no part.
        opt.config.momentum = 0.0;
        opt.momentum_buffers[0] = Some(Tensor::zeros([2, 3], DType::F32)?.t()?);
        assert!(opt.fusable(0, contiguous.tensor(), &g));
        Ok(())
    }

    #[test]
    fn the_first_fused_step_starts_the_buffer_from_the_gradient() -> Result<()> {
        // Dampening applies from the second step on: a zero buffer decayed
        // and dampened would give (1 − dampening)·g instead of g.
        let w = param(Tensor::from_slice(&[1.0f64, -2.0], [2])?);
        let config = SgdConfig { lr: 0.5, momentum: 0.9, dampening: 0.5, ..SgdConfig::default() };
        let mut opt = Sgd::new(vec![w.clone()], config)?;
        w.set_grad(Some(Tensor::from_slice(&[0.5f64, 1.0], [2])?))?;
        assert!(opt.momentum_buffer(0).is_none());
        opt.step()?;
        assert_eq!(opt.momentum_buffer(0).map(|b| b.to_vec::<f64>()).transpose()?, Some(vec![0.5, 1.0]));
        assert_eq!(w.tensor().to_vec::<f64>()?, [0.75, -2.5]);
        opt.step()?;
        // buf = 0.9·buf + 0.5·g
        assert_eq!(opt.momentum_buffer(0).map(|b| b.to_vec::<f64>()).transpose()?, Some(vec![0.7, 1.4]));
        Ok(())
    }
}
