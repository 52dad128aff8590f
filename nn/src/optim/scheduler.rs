//! Learning-rate schedules (PyTorch's `torch.optim.lr_scheduler`), each the
//! closed form of its PyTorch counterpart as a function of the number of
//! [`LrScheduler::step`] calls `t` (epochs or iterations, as you call it):
//!
//! - [`StepLr`]: `base · γ^⌊t / step_size⌋`.
//! - [`CosineAnnealingLr`]: `η_min + (base − η_min)·(1 + cos(π·t / t_max))/2`.
//! - [`LinearWarmup`]: `base · (f + (1 − f)·t / n)` for `t < n` (PyTorch's
//!   `LinearLR` with `end_factor = 1`), then hands over to an inner schedule
//!   that starts at its own step 0 (PyTorch's `SequentialLR`).
//!
//! A schedule reads the optimizer's learning rate when it is made (its
//! `base`) and sets the learning rate of its step 0 then, as PyTorch's do;
//! call `step` after each `optimizer.step()`.
//!
//! ```
//! use brasa_nn::optim::{CosineAnnealingLr, LinearWarmup, LrScheduler, Optimizer, Sgd, SgdConfig};
//! use brasa_autograd::Var;
//! use brasa_tensor::{DType, Tensor};
//!
//! let w = Var::param(Tensor::zeros([3], DType::F32)?)?;
//! let mut opt = Sgd::new(vec![w], SgdConfig { lr: 0.1, ..Default::default() })?;
//! let cosine = CosineAnnealingLr::new(&opt, 100, 0.0)?;
//! let mut schedule = LinearWarmup::new(&mut opt, 10, 0.01, Some(Box::new(cosine)))?;
//! assert_eq!(opt.lr(), 0.1 * 0.01);               // step 0 of the warm-up
//! for _ in 0..10 {
//!     schedule.step(&mut opt)?;
//! }
//! assert_eq!(opt.lr(), 0.1);                      // the cosine's step 0
//! # Ok::<(), brasa_nn::NnError>(())
//! ```

use super::Optimizer;
use crate::error::{NnError, Result};

/// A learning-rate schedule: each [`LrScheduler::step`] advances it and
/// sets the optimizer's learning rate.
pub trait LrScheduler: Send {
    /// Advances one step and sets `opt`'s learning rate to the new value.
    /// A rate the optimizer refuses (one that overflowed to infinity after
    /// many steps of a `gamma > 1`, say) is an error, and then the
    /// optimizer keeps its rate.
    fn step(&mut self, opt: &mut dyn Optimizer) -> Result<()>;

    /// The learning rate of the current step.
    fn lr(&self) -> f64;
}

fn check_base(what: &'static str, base: f64) -> Result<()> {
    if !base.is_finite() || base < 0.0 {
        return Err(NnError::invalid(
            what,
            format!("the optimizer's learning rate must be finite and >= 0, got {base}"),
        ));
    }
    Ok(())
}

/// Multiplies the learning rate by `gamma` every `step_size` steps
/// (PyTorch's `StepLR`).
#[derive(Clone, Debug)]
pub struct StepLr {
    base: f64,
    step_size: usize,
    gamma: f64,
    t: usize,
}

impl StepLr {
    /// A schedule from `opt`'s learning rate; `step_size >= 1`, `gamma`
    /// finite and >= 0 (a negative one would make every other rate negative).
    pub fn new(opt: &dyn Optimizer, step_size: usize, gamma: f64) -> Result<StepLr> {
        check_base("StepLr", opt.lr())?;
        if step_size == 0 {
            return Err(NnError::invalid("StepLr", "step_size must be at least 1"));
        }
        if !gamma.is_finite() || gamma < 0.0 {
            return Err(NnError::invalid("StepLr", format!("gamma must be finite and >= 0, got {gamma}")));
        }
        Ok(StepLr { base: opt.lr(), step_size, gamma, t: 0 })
    }

    /// The learning rate at step `t`: `base · γ^⌊t / step_size⌋`.
    pub fn lr_at(&self, t: usize) -> f64 {
        let decays = i32::try_from(t / self.step_size).unwrap_or(i32::MAX);
        self.base * self.gamma.powi(decays)
    }
}

impl LrScheduler for StepLr {
    fn step(&mut self, opt: &mut dyn Optimizer) -> Result<()> {
        self.t += 1;
        opt.set_lr(self.lr())
    }

    fn lr(&self) -> f64 {
        self.lr_at(self.t)
    }
}

/// Cosine annealing from the base learning rate down to `eta_min` over
/// `t_max` steps (PyTorch's `CosineAnnealingLR`, its closed form; past
/// `t_max` the cosine continues, rising again, as the closed form does).
#[derive(Clone, Debug)]
pub struct CosineAnnealingLr {
    base: f64,
    t_max: usize,
    eta_min: f64,
    t: usize,
}

impl CosineAnnealingLr {
    /// A schedule from `opt`'s learning rate; `t_max >= 1`, `eta_min`
    /// finite and >= 0 (the rates lie between it and the base rate).
    pub fn new(opt: &dyn Optimizer, t_max: usize, eta_min: f64) -> Result<CosineAnnealingLr> {
        check_base("CosineAnnealingLr", opt.lr())?;
        if t_max == 0 {
            return Err(NnError::invalid("CosineAnnealingLr", "t_max must be at least 1"));
        }
        if !eta_min.is_finite() || eta_min < 0.0 {
            return Err(NnError::invalid(
                "CosineAnnealingLr",
                format!("eta_min must be finite and >= 0, got {eta_min}"),
            ));
        }
        Ok(CosineAnnealingLr { base: opt.lr(), t_max, eta_min, t: 0 })
    }

    /// The learning rate at step `t`: `η_min + (base − η_min)·(1 + cos(π·t / t_max))/2`.
    pub fn lr_at(&self, t: usize) -> f64 {
        let phase = std::f64::consts::PI * t as f64 / self.t_max as f64;
        self.eta_min + (self.base - self.eta_min) * (1.0 + phase.cos()) / 2.0
    }
}

impl LrScheduler for CosineAnnealingLr {
    fn step(&mut self, opt: &mut dyn Optimizer) -> Result<()> {
        self.t += 1;
        opt.set_lr(self.lr())
    }

    fn lr(&self) -> f64 {
        self.lr_at(self.t)
    }
}

/// Linear warm-up from `start_factor · base` to `base` over `warmup_steps`
/// steps, then an optional inner schedule (PyTorch's `LinearLR` followed by
/// another scheduler in a `SequentialLR`). The inner schedule starts at its
/// own step 0 when the warm-up ends; without one the rate stays at `base`.
pub struct LinearWarmup {
    base: f64,
    warmup_steps: usize,
    start_factor: f64,
    then: Option<Box<dyn LrScheduler>>,
    t: usize,
}

impl LinearWarmup {
    /// A warm-up from `opt`'s learning rate (make `then` first, from the same
    /// optimizer); sets the rate of step 0, `start_factor · base`.
    /// `warmup_steps >= 1`, `start_factor` in `(0, 1]` (as PyTorch's `LinearLR`).
    pub fn new(
        opt: &mut dyn Optimizer,
        warmup_steps: usize,
        start_factor: f64,
        then: Option<Box<dyn LrScheduler>>,
    ) -> Result<LinearWarmup> {
        check_base("LinearWarmup", opt.lr())?;
        if warmup_steps == 0 {
            return Err(NnError::invalid("LinearWarmup", "warmup_steps must be at least 1"));
        }
        if !(start_factor > 0.0 && start_factor <= 1.0) {
            return Err(NnError::invalid(
                "LinearWarmup",
                format!("start_factor must be in (0, 1], got {start_factor}"),
            ));
        }
        let schedule = LinearWarmup { base: opt.lr(), warmup_steps, start_factor, then, t: 0 };
        opt.set_lr(schedule.lr())?;
        Ok(schedule)
    }

    /// The warm-up factor at step `t` (1 from `warmup_steps` on).
    pub fn factor_at(&self, t: usize) -> f64 {
        let progress = t.min(self.warmup_steps) as f64 / self.warmup_steps as f64;
        self.start_factor + (1.0 - self.start_factor) * progress
    }

    /// The steps taken.
    pub fn steps(&self) -> usize {
        self.t
    }
}

impl std::fmt::Debug for LinearWarmup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinearWarmup")
            .field("base", &self.base)
            .field("warmup_steps", &self.warmup_steps)
            .field("start_factor", &self.start_factor)
            .field("then", &self.then.as_ref().map(|_| "dyn LrScheduler"))
            .field("t", &self.t)
            .finish()
    }
}

impl LrScheduler for LinearWarmup {
    fn step(&mut self, opt: &mut dyn Optimizer) -> Result<()> {
        self.t += 1;
        if self.t > self.warmup_steps {
            if let Some(inner) = self.then.as_mut() {
                inner.step(opt)?;
            }
        }
        opt.set_lr(self.lr())
    }

    fn lr(&self) -> f64 {
        if self.t < self.warmup_steps {
            return self.base * self.factor_at(self.t);
        }
        self.then.as_ref().map_or(self.base, |inner| inner.lr())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optim::{Sgd, SgdConfig};
    use brasa_autograd::Var;
    use brasa_tensor::{DType, Tensor};

    fn sgd(lr: f64) -> Sgd {
        let w = Var::param(Tensor::zeros([1], DType::F32).unwrap()).unwrap();
        Sgd::new(vec![w], SgdConfig { lr, ..Default::default() }).unwrap()
    }

    #[test]
    fn invalid_arguments_are_errors() {
        let mut opt = sgd(0.1);
        let err = StepLr::new(&opt, 0, 0.5).unwrap_err();
        assert!(
            matches!(&err, NnError::Invalid { what: "StepLr", message } if message.starts_with("step_size")),
            "{err:?}"
        );
        for gamma in [f64::NAN, f64::INFINITY, -0.5] {
            let err = StepLr::new(&opt, 2, gamma).unwrap_err();
            assert!(
                matches!(&err, NnError::Invalid { what: "StepLr", message } if message.starts_with("gamma")),
                "{err:?}"
            );
        }
        assert!(CosineAnnealingLr::new(&opt, 0, 0.0).is_err());
        for eta_min in [f64::NAN, f64::NEG_INFINITY, -1e-3] {
            assert!(CosineAnnealingLr::new(&opt, 10, eta_min).is_err(), "{eta_min}");
        }
        let err = LinearWarmup::new(&mut opt, 5, 0.0, None).unwrap_err();
        assert!(
            matches!(&err, NnError::Invalid { what: "LinearWarmup", message } if message.starts_with("start_factor")),
            "{err:?}"
        );
        let err = LinearWarmup::new(&mut opt, 0, 0.5, None).unwrap_err();
        assert!(
            matches!(&err, NnError::Invalid { what: "LinearWarmup", message } if message.starts_with("warmup_steps")),
            "{err:?}"
        );
        assert_eq!(opt.lr(), 0.1);
    }

    #[test]
    fn a_rate_the_optimizer_refuses_is_an_error_and_changes_nothing() {
        let mut opt = sgd(1.0);
        // γ = 1e300: the second decay overflows to infinity.
        let mut grow = StepLr::new(&opt, 1, 1e300).unwrap();
        grow.step(&mut opt).unwrap();
        assert_eq!(opt.lr(), 1e300);
        let err = grow.step(&mut opt).unwrap_err();
        // The optimizer's own refusal.
        assert!(
            matches!(&err, NnError::Invalid { what: "Sgd::set_lr", message }
                if message.starts_with("lr must be finite")),
            "{err:?}"
        );
        assert_eq!(opt.lr(), 1e300, "the optimizer keeps its rate");
    }

    #[test]
    fn warmup_without_inner_stays_at_base() {
        let mut opt = sgd(0.2);
        let mut warm = LinearWarmup::new(&mut opt, 4, 0.5, None).unwrap();
        let mut seen = vec![opt.lr()];
        for _ in 0..6 {
            warm.step(&mut opt).unwrap();
            seen.push(opt.lr());
        }
        let want = [0.1, 0.125, 0.15, 0.175, 0.2, 0.2, 0.2];
        assert!(seen.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-15), "{seen:?}");
        assert_eq!(warm.steps(), 6);
    }
}
