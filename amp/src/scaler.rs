//! [`GradScaler`]: dynamic loss scaling, PyTorch's `torch.amp.GradScaler`
//! with its defaults and update rule.
//!
//! f16 gradients below 2⁻²⁴ (≈ 6·10⁻⁸) flush to zero. Multiplying the loss
//! by a large scale before backward lifts them into range; the gradients
//! are divided by it again ([`GradScaler::unscale_`]) before the optimizer
//! uses them. When a gradient overflowed (inf or NaN) the step is skipped
//! and the scale halved; after `growth_interval` clean steps it doubles:
//!
//! ```text
//! if found_inf: scale *= backoff_factor; tracker = 0
//! else:
//!     tracker += 1
//!     if tracker == growth_interval:
//!         if isfinite(scale * growth_factor): scale *= growth_factor
//!         tracker = 0
//! ```
//!
//! Defaults: scale 65536 (2¹⁶), ×2 every 2000 clean steps, ×0.5 on
//! inf/NaN. The scale is an f32 as in PyTorch, and growth never takes it
//! past f32's range (the step that would is not taken); backoff never takes
//! it below the smallest normal f32 (2⁻¹²⁶), whose reciprocal is still
//! finite — a scale of 0 would unscale every gradient to NaN and skip every
//! step from then on. Every scale and factor is checked as the f32 it
//! becomes: an initial scale that underflows to 0, or a growth factor that
//! rounds to 1, is refused. bf16 keeps f32's exponent range, so bf16
//! training does not need a scaler.
//!
//! Each optimizer goes `READY → UNSCALED → STEPPED` between two
//! [`GradScaler::update`]s; calling out of order is an
//! [`crate::AmpError::ScalerOrder`], with PyTorch's messages. An optimizer
//! is recognised by its parameters (the same `Var`s in the same order), not
//! by where it lives, so moving or swapping optimizers between `unscale_`
//! and `step` neither unscales a gradient twice nor steps on scaled ones.
//!
//! ```
//! use brasa_amp::{autocast, GradScaler};
//! use brasa_nn::{functional::cross_entropy, optim::{clip_grad_norm_, Optimizer, Sgd, SgdConfig}, Linear, Module, ModuleExt};
//! use brasa_autograd::Var;
//! use brasa_tensor::{DType, Device, Tensor};
//!
//! let model = Linear::new(4, 3, Device::CPU)?;
//! let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.1, ..Default::default() })?;
//! let mut scaler = GradScaler::new();
//! let (x, y) = (Var::new(Tensor::randn([8, 4], DType::F32)?), Tensor::from_vec(vec![0i64, 1, 2, 0, 1, 2, 0, 1], [8])?);
//! for _ in 0..3 {
//!     let loss = {
//!         let _amp = autocast(DType::F16);
//!         cross_entropy(&model.forward(&x)?, &y)?
//!     };
//!     scaler.scale(&loss)?.backward()?;
//!     scaler.unscale_(&opt)?;                       // real gradients: clip them
//!     clip_grad_norm_(opt.params(), 1.0, 2.0)?;
//!     scaler.step(&mut opt)?;                       // skipped if a gradient is inf/NaN
//!     scaler.update()?;
//!     opt.zero_grad()?;
//! }
//! assert_eq!(scaler.get_scale(), 65536.0);
//! # Ok::<(), brasa_amp::AmpError>(())
//! ```

use crate::error::{AmpError, Result};
use crate::stage::OptimizerStage;
use brasa_autograd::{no_grad, Var};
use brasa_nn::optim::Optimizer;
use brasa_nn::StateDict;
use brasa_tensor::{DType, Device, Tensor};

/// How a [`GradScaler`] is built; the default is PyTorch's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GradScalerConfig {
    /// The first scale (default 2¹⁶ = 65536), positive, finite and at
    /// least the smallest normal f32 once converted to f32.
    pub init_scale: f64,
    /// The factor the scale grows by after `growth_interval` clean steps
    /// (default 2, must be > 1 as an f32, and finite).
    pub growth_factor: f64,
    /// The factor the scale shrinks by on inf/NaN (default 0.5, in (0, 1)
    /// as an f32).
    pub backoff_factor: f64,
    /// Clean steps between growths (default 2000, must be > 0).
    pub growth_interval: u32,
    /// When false the scaler does nothing: `scale` returns the loss, `step`
    /// steps, `update` does nothing (default true).
    pub enabled: bool,
}

impl Default for GradScalerConfig {
    fn default() -> GradScalerConfig {
        GradScalerConfig {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            enabled: true,
        }
    }
}

/// The smallest scale: the smallest normal f32, whose reciprocal (the
/// unscale factor) is still finite in f32.
const MIN_SCALE: f32 = f32::MIN_POSITIVE;

/// `value` as the f32 scale it becomes, or an error naming `name` when that
/// is NaN, infinite, or below [`MIN_SCALE`] (0 after underflow, negative).
fn checked_scale(what: &'static str, name: &str, value: f64) -> Result<f32> {
    let scale = value as f32;
    if !(scale.is_finite() && scale >= MIN_SCALE) {
        return Err(AmpError::invalid(
            what,
            format!(
                "{name} must be positive and finite in f32, at least {MIN_SCALE:e} (it is {scale} as an f32), \
                 got {value}"
            ),
        ));
    }
    Ok(scale)
}

impl GradScalerConfig {
    fn validate(&self) -> Result<()> {
        let what = "GradScaler";
        checked_scale(what, "init_scale", self.init_scale)?;
        let growth = self.growth_factor as f32;
        if !(growth.is_finite() && growth > 1.0) {
            return Err(AmpError::invalid(
                what,
                format!("growth_factor must be finite and > 1 in f32, got {}", self.growth_factor),
            ));
        }
        let backoff = self.backoff_factor as f32;
        if !(backoff > 0.0 && backoff < 1.0) {
            return Err(AmpError::invalid(
                what,
                format!("backoff_factor must be in (0, 1) in f32, got {}", self.backoff_factor),
            ));
        }
        if self.growth_interval == 0 {
            return Err(AmpError::invalid(what, "growth_interval must be positive, got 0"));
        }
        Ok(())
    }
}

/// One optimizer's state between updates.
#[derive(Clone, Debug)]
struct PerOptimizer {
    /// The optimizer's parameters: its identity (see [`GradScaler::step`]).
    /// Held until the next update, so they cannot be freed and their
    /// addresses reused by another optimizer's.
    params: Vec<Var>,
    stage: OptimizerStage,
    /// Set once its gradients were checked.
    found_inf: Option<bool>,
}

/// Dynamic loss scaling; see the module docs.
#[derive(Clone, Debug)]
pub struct GradScaler {
    config: GradScalerConfig,
    /// The current scale, an f32 as PyTorch's `_scale`.
    scale: f32,
    /// Clean steps since the last growth or backoff.
    growth_tracker: u32,
    optimizers: Vec<PerOptimizer>,
}

impl Default for GradScaler {
    fn default() -> GradScaler {
        GradScaler::new()
    }
}

/// Whether `entry` is the state of `params`' optimizer: the same `Var`s in
/// the same order.
fn same_params(entry: &[Var], params: &[Var]) -> bool {
    entry.len() == params.len() && entry.iter().zip(params).all(|(a, b)| a.same_var(b))
}

impl GradScaler {
    /// A scaler with PyTorch's defaults (65536, ×2 every 2000 clean steps,
    /// ×0.5 on inf/NaN).
    pub fn new() -> GradScaler {
        // Built directly rather than through `with_config`: the default
        // configuration is valid (the `default_config_is_valid` test checks
        // it against `validate`), so there is no error to return.
        let config = GradScalerConfig::default();
        debug_assert!(config.validate().is_ok());
        GradScaler { config, scale: config.init_scale as f32, growth_tracker: 0, optimizers: Vec::new() }
    }

    /// A scaler built as `config` says (growth > 1, backoff in (0, 1), a
    /// positive interval and a positive finite initial scale).
    pub fn with_config(config: GradScalerConfig) -> Result<GradScaler> {
        config.validate()?;
        Ok(GradScaler { config, scale: config.init_scale as f32, growth_tracker: 0, optimizers: Vec::new() })
    }

    /// How the scaler was built.
    pub fn config(&self) -> &GradScalerConfig {
        &self.config
    }

    /// Whether the scaler scales (see [`GradScalerConfig::enabled`]).
    pub fn is_enabled(&self) -> bool {
        self.config.enabled
    }

    /// The current scale (1 when disabled, as PyTorch's `get_scale`).
    pub fn get_scale(&self) -> f64 {
        if self.config.enabled {
            self.scale as f64
        } else {
            1.0
        }
    }

    /// Clean steps since the scale last changed (PyTorch's `_growth_tracker`).
    pub fn growth_tracker(&self) -> u32 {
        self.growth_tracker
    }

    /// `loss · scale`, to call `backward` on (the loss itself when disabled).
    pub fn scale(&self, loss: &Var) -> Result<Var> {
        if !self.config.enabled {
            return Ok(loss.clone());
        }
        Ok(loss.mul_scalar(self.scale as f64)?)
    }

    /// Where `opt` is between two updates.
    pub fn stage(&self, opt: &dyn Optimizer) -> OptimizerStage {
        self.entry(opt.params()).map_or(OptimizerStage::Ready, |e| e.stage)
    }

    /// Whether `opt`'s gradients held an inf or NaN, once they were checked
    /// (by [`GradScaler::unscale_`] or [`GradScaler::step`]) since the last update.
    pub fn found_inf(&self, opt: &dyn Optimizer) -> Option<bool> {
        self.entry(opt.params()).and_then(|e| e.found_inf)
    }

    fn entry(&self, params: &[Var]) -> Option<&PerOptimizer> {
        self.optimizers.iter().find(|e| same_params(&e.params, params))
    }

    fn entry_mut(&mut self, params: &[Var]) -> &mut PerOptimizer {
        let index = match self.optimizers.iter().position(|e| same_params(&e.params, params)) {
            Some(i) => i,
            None => {
                self.optimizers.push(PerOptimizer {
                    params: params.to_vec(),
                    stage: OptimizerStage::Ready,
                    found_inf: None,
                });
                self.optimizers.len() - 1
            }
        };
        &mut self.optimizers[index]
    }

    /// Divides `opt`'s gradients by the scale in place and records whether
    /// any is inf or NaN, so they can be inspected or clipped before
    /// [`GradScaler::step`]. Once per optimizer between updates, before its
    /// step; f16 gradients are refused (PyTorch's "Attempting to unscale
    /// FP16 gradients": keep f32 master weights). A no-op when disabled.
    pub fn unscale_(&mut self, opt: &dyn Optimizer) -> Result<()> {
        if !self.config.enabled {
            return Ok(());
        }
        let stage = self.stage(opt);
        match stage {
            OptimizerStage::Unscaled => {
                return Err(AmpError::ScalerOrder {
                    call: "unscale_",
                    message: "unscale_() has already been called on this optimizer since the last update()",
                    stage,
                })
            }
            OptimizerStage::Stepped => {
                return Err(AmpError::ScalerOrder {
                    call: "unscale_",
                    message: "unscale_() is being called after step()",
                    stage,
                })
            }
            OptimizerStage::Ready => {}
        }
        // PyTorch's `scale.double().reciprocal().float()`.
        let inv_scale = (1.0 / self.scale as f64) as f32 as f64;
        let found_inf = unscale_grads(opt.params(), inv_scale)?;
        let entry = self.entry_mut(opt.params());
        entry.stage = OptimizerStage::Unscaled;
        entry.found_inf = Some(found_inf);
        Ok(())
    }

    /// Replaces the inf/NaN verdict [`GradScaler::unscale_`] recorded for
    /// `opt`. For sharded training, where each rank's check sees only its
    /// own shards and every rank must take the same decision (PyTorch's
    /// `ShardedGradScaler` all-reduces it): pass whether *any* rank found
    /// one, e.g. `FullyShardedDataParallel::any_rank_nonfinite`. An error
    /// unless `unscale_` was called on `opt` since the last update and
    /// `step` was not.
    pub fn set_found_inf(&mut self, opt: &dyn Optimizer, found_inf: bool) -> Result<()> {
        if !self.config.enabled {
            return Ok(());
        }
        let stage = self.stage(opt);
        if stage != OptimizerStage::Unscaled {
            return Err(AmpError::ScalerOrder {
                call: "set_found_inf",
                message: "set_found_inf() needs unscale_() first, and cannot follow step()",
                stage,
            });
        }
        self.entry_mut(opt.params()).found_inf = Some(found_inf);
        Ok(())
    }

    /// Unscales `opt`'s gradients (unless [`GradScaler::unscale_`] already
    /// did) and steps it if every gradient is finite; returns whether it
    /// stepped. Once per optimizer between updates.
    ///
    /// The optimizer is recognised by its parameters (the same `Var`s in the
    /// same order), so it may be moved between `unscale_` and `step`, and
    /// another optimizer is never taken for it.
    pub fn step(&mut self, opt: &mut dyn Optimizer) -> Result<bool> {
        if !self.config.enabled {
            opt.step()?;
            return Ok(true);
        }
        let stage = self.stage(opt);
        if stage == OptimizerStage::Stepped {
            return Err(AmpError::ScalerOrder {
                call: "step",
                message: "step() has already been called since the last update()",
                stage,
            });
        }
        if stage == OptimizerStage::Ready {
            self.unscale_(opt)?;
        }
        let found_inf = self.entry(opt.params()).and_then(|e| e.found_inf).unwrap_or(false);
        if !found_inf {
            opt.step()?;
        }
        self.entry_mut(opt.params()).stage = OptimizerStage::Stepped;
        Ok(!found_inf)
    }

    /// Updates the scale from the inf/NaN checks of every optimizer since
    /// the last update (PyTorch's rule, see the module docs) and makes
    /// every optimizer READY again. An error if no optimizer was checked
    /// (PyTorch: "No inf checks were recorded prior to update"). A no-op
    /// when disabled.
    pub fn update(&mut self) -> Result<()> {
        if !self.config.enabled {
            return Ok(());
        }
        let checks: Vec<bool> = self.optimizers.iter().filter_map(|e| e.found_inf).collect();
        if checks.is_empty() {
            return Err(AmpError::ScalerOrder {
                call: "update",
                message: "no inf checks were recorded prior to update(): call step() (or unscale_()) first",
                stage: OptimizerStage::Ready,
            });
        }
        self.apply_rule(checks.contains(&true));
        self.optimizers.clear();
        Ok(())
    }

    /// Sets the scale to `new_scale` instead of applying the rule (PyTorch's
    /// `update(new_scale)`; the growth tracker is left as it is) and makes
    /// every optimizer READY again.
    pub fn update_to(&mut self, new_scale: f64) -> Result<()> {
        if !self.config.enabled {
            return Ok(());
        }
        self.scale = checked_scale("GradScaler::update_to", "the scale", new_scale)?;
        self.optimizers.clear();
        Ok(())
    }

    /// PyTorch's `_amp_update_scale_`, in f32.
    fn apply_rule(&mut self, found_inf: bool) {
        if found_inf {
            // Never below the smallest normal f32: a scale of 0 could never
            // recover (every unscaled gradient would be NaN).
            self.scale = (self.scale * self.config.backoff_factor as f32).max(MIN_SCALE);
            self.growth_tracker = 0;
            return;
        }
        let successful = self.growth_tracker + 1;
        if successful == self.config.growth_interval {
            let grown = self.scale * self.config.growth_factor as f32;
            // Never past f32's range: at the top the scale stays.
            if grown.is_finite() {
                self.scale = grown;
            }
            self.growth_tracker = 0;
        } else {
            self.growth_tracker = successful;
        }
    }

    /// The scale, the factors, the interval and the growth tracker under
    /// PyTorch's names (`scale`, `growth_factor`, `backoff_factor`,
    /// `growth_interval`, `_growth_tracker`) as 0-d host tensors; empty when
    /// disabled.
    pub fn state_dict(&self) -> Result<StateDict> {
        let mut dict = StateDict::new();
        if !self.config.enabled {
            return Ok(dict);
        }
        dict.insert("scale", Tensor::from_vec_on(vec![self.scale], [], Device::CPU)?);
        dict.insert("growth_factor", Tensor::from_vec_on(vec![self.config.growth_factor], [], Device::CPU)?);
        dict.insert("backoff_factor", Tensor::from_vec_on(vec![self.config.backoff_factor], [], Device::CPU)?);
        dict.insert("growth_interval", Tensor::from_vec_on(vec![self.config.growth_interval as i64], [], Device::CPU)?);
        dict.insert("_growth_tracker", Tensor::from_vec_on(vec![self.growth_tracker as i64], [], Device::CPU)?);
        Ok(dict)
    }

    /// Restores what [`GradScaler::state_dict`] saved. An empty dict (from
    /// a disabled scaler), a missing entry or an invalid value is an error,
    /// and then nothing changes.
    pub fn load_state_dict(&mut self, dict: &StateDict) -> Result<()> {
        if dict.is_empty() {
            return Err(AmpError::StateDict(
                "the dict is empty, possibly because it was saved from a disabled GradScaler".into(),
            ));
        }
        let read = |name: &str| -> Result<f64> {
            let tensor = dict.get(name).ok_or_else(|| AmpError::StateDict(format!("missing entry {name}")))?;
            if tensor.numel() != 1 {
                return Err(AmpError::StateDict(format!("{name} must hold one value, got shape {:?}", tensor.dims())));
            }
            Ok(tensor.to_dtype(DType::F64)?.reshape(&[])?.item::<f64>()?)
        };
        let (scale, tracker) = (read("scale")?, read("_growth_tracker")?);
        let interval = read("growth_interval")?;
        let config = GradScalerConfig {
            growth_factor: read("growth_factor")?,
            backoff_factor: read("backoff_factor")?,
            growth_interval: if interval >= 1.0 && interval <= u32::MAX as f64 { interval as u32 } else { 0 },
            init_scale: self.config.init_scale,
            enabled: true,
        };
        let refused = |source| AmpError::StateDictValue { source: brasa_tensor::ErrorBox::new(source) };
        config.validate().map_err(refused)?;
        let scale = checked_scale("GradScaler", "scale", scale).map_err(refused)?;
        if !(tracker >= 0.0 && tracker < config.growth_interval as f64 && tracker.fract() == 0.0) {
            return Err(AmpError::StateDict(format!(
                "_growth_tracker must be a whole number in [0, growth_interval = {}), got {tracker}",
                config.growth_interval
            )));
        }
        self.config = config;
        self.scale = scale;
        self.growth_tracker = tracker as u32;
        Ok(())
    }
}

/// Multiplies every gradient by `inv_scale` in place; true when one held
/// an inf or NaN (checked before, so the check does not depend on the scale).
fn unscale_grads(params: &[Var], inv_scale: f64) -> Result<bool> {
    let _no_grad = no_grad();
    let mut found_inf = false;
    for (index, param) in params.iter().enumerate() {
        let Some(grad) = param.grad() else { continue };
        if grad.dtype() == DType::F16 {
            return Err(AmpError::Fp16Gradients { index });
        }
        if !grad.dtype().is_float() {
            continue;
        }
        found_inf |= !all_finite(&grad)?;
        if inv_scale != 1.0 {
            grad.mul_scalar_(inv_scale)?;
        }
    }
    Ok(found_inf)
}

/// Whether every element of `t` is finite (assumed on a meta device, which
/// has no values). The sum is one read and no buffer: a finite sum proves every element finite; a non-finite one may
/// be an overflow of the sum itself, settled by summing `t · 0` (NaN
/// exactly where an element is not finite, 0 elsewhere).
pub(crate) fn all_finite(t: &Tensor) -> Result<bool> {
    if t.numel() == 0 {
        return Ok(true);
    }
    if t.device().is_meta() {
        // A memory plan has no values: it assumes finite gradients, after
        // allocating what the check of finite ones allocates.
        drop(t.sum_all()?.to_dtype(DType::F64)?);
        return Ok(true);
    }
    if t.sum_all()?.to_dtype(DType::F64)?.item::<f64>()?.is_finite() {
        return Ok(true);
    }
    Ok(t.mul_scalar(0.0)?.sum_all()?.to_dtype(DType::F64)?.item::<f64>()?.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finite_check_sees_inf_and_nan_but_not_overflowing_sums() -> Result<()> {
        let big = Tensor::from_vec(vec![60000.0f32, 60000.0], [2])?.to_dtype(DType::F16)?;
        assert!(all_finite(&big)?, "the sum overflows f16, the elements do not");
        let inf = Tensor::from_vec(vec![1.0f32, f32::INFINITY], [2])?;
        let nan = Tensor::from_vec(vec![f32::NAN, 1.0], [2])?;
        assert!(!all_finite(&inf)? && !all_finite(&nan)?);
        Ok(())
    }

    #[test]
    fn backoff_never_takes_the_scale_to_zero() -> Result<()> {
        let config = GradScalerConfig { init_scale: 1e-37, backoff_factor: 1e-3, ..Default::default() };
        let mut scaler = GradScaler::with_config(config)?;
        for _ in 0..5 {
            scaler.apply_rule(true);
        }
        assert_eq!(scaler.get_scale(), f32::MIN_POSITIVE as f64);
        assert!((1.0 / scaler.scale).is_finite(), "its reciprocal unscales to finite values");
        for bad in [0.0, 1e-45, f64::NAN, -1.0] {
            let err = scaler.update_to(bad).unwrap_err();
            assert!(matches!(err, AmpError::Invalid { what: "GradScaler::update_to", .. }), "{bad}: {err:?}");
        }
        Ok(())
    }

    #[test]
    fn default_config_is_valid() -> Result<()> {
        GradScalerConfig::default().validate()?;
        let scaler = GradScaler::new();
        assert_eq!(scaler.get_scale(), GradScalerConfig::default().init_scale);
        Ok(())
    }

    #[test]
    fn invalid_configs_are_refused() {
        for config in [
            GradScalerConfig { growth_factor: 1.0, ..Default::default() },
            GradScalerConfig { backoff_factor: 1.0, ..Default::default() },
            GradScalerConfig { growth_interval: 0, ..Default::default() },
            GradScalerConfig { init_scale: f64::INFINITY, ..Default::default() },
            GradScalerConfig { init_scale: 1e39, ..Default::default() },
            // Underflows to 0 (or a subnormal whose reciprocal is inf) in f32.
            GradScalerConfig { init_scale: 1e-50, ..Default::default() },
            GradScalerConfig { init_scale: 1e-40, ..Default::default() },
            GradScalerConfig { init_scale: f64::NAN, ..Default::default() },
            GradScalerConfig { init_scale: -1.0, ..Default::default() },
            GradScalerConfig { init_scale: 0.0, ..Default::default() },
            GradScalerConfig { growth_factor: f64::NAN, ..Default::default() },
            GradScalerConfig { growth_factor: 1e39, ..Default::default() },
            // Rounds to 1 in f32: the scale would never grow.
            GradScalerConfig { growth_factor: 1.0 + 1e-10, ..Default::default() },
            GradScalerConfig { backoff_factor: f64::NAN, ..Default::default() },
            GradScalerConfig { backoff_factor: 0.0, ..Default::default() },
            GradScalerConfig { backoff_factor: 1e-50, ..Default::default() },
            // Rounds to 1 in f32: the scale would never back off.
            GradScalerConfig { backoff_factor: 1.0 - 1e-10, ..Default::default() },
            GradScalerConfig { backoff_factor: -0.5, ..Default::default() },
        ] {
            let err = GradScaler::with_config(config).unwrap_err();
            assert!(matches!(err, AmpError::Invalid { what: "GradScaler", .. }), "{config:?}: {err:?}");
        }
    }
}
