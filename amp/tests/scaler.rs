//! GradScaler: PyTorch's update rule step by step, skipped steps, growth at
//! the top of f32's range, the READY/UNSCALED/STEPPED errors and state dicts.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_amp::{AmpError, GradScaler, GradScalerConfig, OptimizerStage, Result};
use brasa_autograd::Var;
use brasa_nn::optim::{Optimizer, Sgd, SgdConfig};
use brasa_nn::StateDict;
use brasa_tensor::{DType, Tensor};

fn param(values: &[f32]) -> Result<Var> {
    Ok(Var::param(Tensor::from_vec(values.to_vec(), [values.len()])?)?)
}

fn sgd(params: Vec<Var>) -> Result<Sgd> {
    Ok(Sgd::new(params, SgdConfig { lr: 1.0, ..Default::default() })?)
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
}

/// Gives `p` the gradient `scale · values` (what backward of a scaled loss gives).
fn set_scaled_grad(p: &Var, values: &[f32], scale: f64) -> Result<()> {
    let g = Tensor::from_vec(values.to_vec(), [values.len()])?.mul_scalar(scale)?;
    p.set_grad(Some(g))?;
    Ok(())
}

#[test]
fn defaults_are_pytorchs() {
    let scaler = GradScaler::new();
    let c = scaler.config();
    assert_eq!((c.init_scale, c.growth_factor, c.backoff_factor, c.growth_interval), (65536.0, 2.0, 0.5, 2000));
    assert_eq!(scaler.get_scale(), 65536.0);
    assert_eq!(scaler.growth_tracker(), 0);
}

#[test]
fn scale_multiplies_the_loss() -> Result<()> {
    let scaler = GradScaler::new();
    let loss = Var::new(Tensor::from_vec(vec![0.5f32], [])?);
    assert_eq!(scaler.scale(&loss)?.item()?, 32768.0);
    Ok(())
}

#[test]
fn update_rule_step_by_step() -> Result<()> {
    let config = GradScalerConfig { init_scale: 8.0, growth_interval: 3, ..Default::default() };
    let mut scaler = GradScaler::with_config(config)?;
    let p = param(&[1.0, 2.0])?;
    let mut opt = sgd(vec![p.clone()])?;
    // (gradient finite?, expected scale after update, expected tracker)
    let script = [
        (true, 8.0, 1),
        (true, 8.0, 2),
        (true, 16.0, 0), // third clean step: ×2
        (false, 8.0, 0), // inf: ×0.5, tracker reset
        (true, 8.0, 1),
        (false, 4.0, 0),
        (false, 2.0, 0),
        (true, 2.0, 1),
        (true, 2.0, 2),
        (true, 4.0, 0),
    ];
    for (i, &(finite, scale, tracker)) in script.iter().enumerate() {
        let before = values(p.tensor());
        let grad = if finite { [0.5, -0.25] } else { [f32::INFINITY, 1.0] };
        set_scaled_grad(&p, &grad, scaler.get_scale())?;
        let stepped = scaler.step(&mut opt)?;
        assert_eq!(stepped, finite, "step {i}");
        assert_eq!(scaler.found_inf(&opt), Some(!finite));
        let after = values(p.tensor());
        if finite {
            // Unscaled before the update: lr 1 · the true gradient.
            assert_eq!(after, [before[0] - 0.5, before[1] + 0.25], "step {i}");
        } else {
            assert_eq!(after, before, "step {i}: skipped, parameters unchanged");
        }
        scaler.update()?;
        assert_eq!((scaler.get_scale(), scaler.growth_tracker()), (scale, tracker), "after step {i}");
        assert_eq!(scaler.stage(&opt), OptimizerStage::Ready);
        opt.zero_grad()?;
    }
    Ok(())
}

#[test]
fn nan_gradients_skip_the_step_too() -> Result<()> {
    let mut scaler = GradScaler::new();
    let p = param(&[1.0])?;
    let mut opt = sgd(vec![p.clone()])?;
    p.set_grad(Some(Tensor::from_vec(vec![f32::NAN], [1])?))?;
    assert!(!scaler.step(&mut opt)?);
    assert_eq!(values(p.tensor()), [1.0]);
    scaler.update()?;
    assert_eq!(scaler.get_scale(), 32768.0);
    Ok(())
}

#[test]
fn growth_that_would_overflow_keeps_the_scale_finite() -> Result<()> {
    let top = 2f64.powi(127);
    let config = GradScalerConfig { init_scale: top, growth_interval: 1, ..Default::default() };
    let mut scaler = GradScaler::with_config(config)?;
    let p = param(&[0.0])?;
    let mut opt = sgd(vec![p.clone()])?;
    for _ in 0..3 {
        p.set_grad(Some(Tensor::zeros([1], DType::F32)?))?;
        assert!(scaler.step(&mut opt)?);
        scaler.update()?;
        assert_eq!(scaler.get_scale(), top, "2^128 is inf in f32: the scale stays");
        assert!(scaler.get_scale().is_finite());
        assert_eq!(scaler.growth_tracker(), 0);
    }
    // Long runs of clean steps at the default interval never leave f32's range either.
    let mut scaler = GradScaler::with_config(GradScalerConfig { growth_interval: 1, ..Default::default() })?;
    for _ in 0..200 {
        p.set_grad(Some(Tensor::zeros([1], DType::F32)?))?;
        scaler.step(&mut opt)?;
        scaler.update()?;
    }
    assert_eq!(scaler.get_scale(), top);
    Ok(())
}

#[test]
fn unscale_divides_so_gradients_can_be_clipped() -> Result<()> {
    let mut scaler = GradScaler::new();
    let p = param(&[0.0, 0.0])?;
    let mut opt = sgd(vec![p.clone()])?;
    set_scaled_grad(&p, &[3.0, 4.0], scaler.get_scale())?;
    scaler.unscale_(&opt)?;
    assert_eq!(scaler.stage(&opt), OptimizerStage::Unscaled);
    assert_eq!(values(&p.grad().unwrap()), [3.0, 4.0]);
    let norm = brasa_nn::optim::clip_grad_norm_(opt.params(), 1.0, 2.0)?;
    assert!((norm - 5.0).abs() < 1e-6);
    assert!(scaler.step(&mut opt)?, "not unscaled twice");
    let after = values(p.tensor());
    assert!((after[0] + 0.6).abs() < 1e-6 && (after[1] + 0.8).abs() < 1e-6, "{after:?}");
    scaler.update()?;
    Ok(())
}

/// The call, the stage and the message (PyTorch's words) of a
/// [`AmpError::ScalerOrder`].
fn order_error(result: Result<impl std::fmt::Debug>) -> (&'static str, OptimizerStage, &'static str) {
    match result {
        Err(AmpError::ScalerOrder { call, stage, message }) => (call, stage, message),
        other => panic!("expected a ScalerOrder error, got {other:?}"),
    }
}

#[test]
fn ready_unscaled_stepped_errors() -> Result<()> {
    let mut scaler = GradScaler::new();
    let p = param(&[1.0])?;
    let mut opt = sgd(vec![p.clone()])?;
    let (call, stage, message) = order_error(scaler.update());
    assert_eq!((call, stage), ("update", OptimizerStage::Ready));
    assert!(message.contains("no inf checks"), "{message}");

    set_scaled_grad(&p, &[1.0], scaler.get_scale())?;
    scaler.unscale_(&opt)?;
    let (call, stage, message) = order_error(scaler.unscale_(&opt));
    assert_eq!((call, stage), ("unscale_", OptimizerStage::Unscaled));
    assert!(message.contains("already been called"), "{message}");

    scaler.step(&mut opt)?;
    assert_eq!(scaler.stage(&opt), OptimizerStage::Stepped);
    let (call, stage, message) = order_error(scaler.unscale_(&opt));
    assert_eq!((call, stage), ("unscale_", OptimizerStage::Stepped));
    assert!(message.contains("after step()"), "{message}");
    let (call, stage, message) = order_error(scaler.step(&mut opt));
    assert_eq!((call, stage), ("step", OptimizerStage::Stepped));
    assert!(message.contains("already been called"), "{message}");

    scaler.update()?;
    assert_eq!(scaler.stage(&opt), OptimizerStage::Ready);
    set_scaled_grad(&p, &[1.0], scaler.get_scale())?;
    scaler.step(&mut opt)?;
    scaler.update()?;
    Ok(())
}

#[test]
fn optimizers_are_tracked_separately_and_any_inf_backs_off() -> Result<()> {
    let mut scaler = GradScaler::new();
    let (a, b) = (param(&[1.0])?, param(&[1.0])?);
    let (mut opt_a, mut opt_b) = (sgd(vec![a.clone()])?, sgd(vec![b.clone()])?);
    set_scaled_grad(&a, &[1.0], scaler.get_scale())?;
    b.set_grad(Some(Tensor::from_vec(vec![f32::INFINITY], [1])?))?;
    assert!(scaler.step(&mut opt_a)?);
    assert_eq!(scaler.stage(&opt_b), OptimizerStage::Ready);
    assert!(!scaler.step(&mut opt_b)?);
    assert_eq!(values(a.tensor()), [0.0]);
    assert_eq!(values(b.tensor()), [1.0]);
    scaler.update()?;
    assert_eq!(scaler.get_scale(), 32768.0);
    Ok(())
}

#[test]
fn fp16_gradients_are_refused() -> Result<()> {
    let mut scaler = GradScaler::new();
    let p = Var::param(Tensor::ones([2], DType::F16)?)?;
    let opt = sgd(vec![p.clone()])?;
    p.set_grad(Some(Tensor::ones([2], DType::F16)?))?;
    let err = scaler.unscale_(&opt).unwrap_err();
    assert!(matches!(err, AmpError::Fp16Gradients { index: 0 }), "{err:?}");
    // PyTorch's words.
    assert!(err.to_string().contains("FP16 gradients"), "{err}");
    // bf16 gradients keep f32's range: allowed, as in PyTorch.
    let q = Var::param(Tensor::ones([2], DType::BF16)?)?;
    let opt = sgd(vec![q.clone()])?;
    q.set_grad(Some(Tensor::ones([2], DType::BF16)?.mul_scalar(65536.0)?))?;
    scaler.unscale_(&opt)?;
    assert_eq!(values(&q.grad().unwrap()), [1.0, 1.0]);
    Ok(())
}

#[test]
fn state_dict_round_trips() -> Result<()> {
    let config = GradScalerConfig { init_scale: 1024.0, growth_interval: 5, growth_factor: 4.0, ..Default::default() };
    let mut scaler = GradScaler::with_config(config)?;
    let p = param(&[1.0])?;
    let mut opt = sgd(vec![p.clone()])?;
    for finite in [true, true, false, true, true, true] {
        let g = if finite { 0.0 } else { f32::INFINITY };
        p.set_grad(Some(Tensor::from_vec(vec![g], [1])?))?;
        scaler.step(&mut opt)?;
        scaler.update()?;
    }
    assert_eq!((scaler.get_scale(), scaler.growth_tracker()), (512.0, 3));
    let dict = scaler.state_dict()?;
    let names: Vec<&str> = dict.names().collect();
    for name in ["scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"] {
        assert!(names.contains(&name), "{names:?}");
    }
    assert_eq!(dict.len(), 5);

    // Through bytes (safetensors), into a scaler with other settings.
    let restored_dict = StateDict::from_bytes(&dict.to_bytes()?)?;
    let mut restored = GradScaler::new();
    restored.load_state_dict(&restored_dict)?;
    assert_eq!((restored.get_scale(), restored.growth_tracker()), (512.0, 3));
    assert_eq!(restored.config().growth_factor, 4.0);
    assert_eq!(restored.config().growth_interval, 5);
    // Both continue identically: two more clean steps grow the scale ×4.
    for s in [&mut scaler, &mut restored] {
        for _ in 0..2 {
            p.set_grad(Some(Tensor::zeros([1], DType::F32)?))?;
            s.step(&mut opt)?;
            s.update()?;
        }
        assert_eq!((s.get_scale(), s.growth_tracker()), (2048.0, 0));
    }
    Ok(())
}

#[test]
fn bad_state_dicts_are_refused_and_change_nothing() -> Result<()> {
    let disabled = GradScaler::with_config(GradScalerConfig { enabled: false, ..Default::default() })?;
    assert!(disabled.state_dict()?.is_empty());
    let mut scaler = GradScaler::new();
    let err = scaler.load_state_dict(&disabled.state_dict()?).unwrap_err();
    assert!(matches!(&err, AmpError::StateDict(message) if message.starts_with("the dict is empty")), "{err:?}");

    let mut dict = GradScaler::new().state_dict()?;
    dict.remove("_growth_tracker");
    let err = scaler.load_state_dict(&dict).unwrap_err();
    assert!(matches!(&err, AmpError::StateDict(message) if message == "missing entry _growth_tracker"), "{err:?}");
    let mut dict = GradScaler::new().state_dict()?;
    dict.insert("backoff_factor", Tensor::from_vec(vec![2.0f64], [])?);
    let err = scaler.load_state_dict(&dict).unwrap_err();
    assert!(
        matches!(&err, AmpError::StateDictValue { source }
            if matches!(**source, AmpError::Invalid { what: "GradScaler", .. })),
        "{err:?}"
    );
    assert_eq!(scaler.get_scale(), 65536.0);
    assert_eq!(scaler.config().backoff_factor, 0.5);
    Ok(())
}

#[test]
fn a_disabled_scaler_is_transparent() -> Result<()> {
    let mut scaler = GradScaler::with_config(GradScalerConfig { enabled: false, ..Default::default() })?;
    let p = param(&[1.0])?;
    let mut opt = sgd(vec![p.clone()])?;
    let loss = p.sum_all()?;
    let scaled = scaler.scale(&loss)?;
    assert!(scaled.same_var(&loss));
    assert_eq!(scaler.get_scale(), 1.0);
    scaled.backward()?;
    assert!(scaler.step(&mut opt)?);
    scaler.update()?;
    assert_eq!(values(p.tensor()), [0.0]);
    Ok(())
}

#[test]
fn a_moved_optimizer_is_not_unscaled_twice() -> Result<()> {
    let mut scaler = GradScaler::new();
    let p = param(&[1.0])?;
    let opt = sgd(vec![p.clone()])?;
    set_scaled_grad(&p, &[2.0], scaler.get_scale())?;
    scaler.unscale_(&opt)?;
    assert_eq!(values(&p.grad().unwrap()), [2.0]);
    // Moved between unscale_ and step: still the same optimizer.
    let mut moved = Box::new(opt);
    assert_eq!(scaler.stage(&*moved), OptimizerStage::Unscaled);
    let err = scaler.unscale_(&*moved).unwrap_err();
    assert!(matches!(err, AmpError::ScalerOrder { call: "unscale_", stage: OptimizerStage::Unscaled, .. }), "{err}");
    assert!(scaler.step(&mut *moved)?);
    assert_eq!(values(&p.grad().unwrap()), [2.0], "unscaled once");
    assert_eq!(values(p.tensor()), [-1.0], "1 - lr·2");
    scaler.update()?;
    Ok(())
}

#[test]
fn swapped_optimizers_are_each_unscaled_once() -> Result<()> {
    let mut scaler = GradScaler::new();
    let (a, b) = (param(&[1.0])?, param(&[1.0])?);
    let (mut opt_a, mut opt_b) = (sgd(vec![a.clone()])?, sgd(vec![b.clone()])?);
    set_scaled_grad(&a, &[2.0], scaler.get_scale())?;
    set_scaled_grad(&b, &[4.0], scaler.get_scale())?;
    scaler.unscale_(&opt_a)?;
    std::mem::swap(&mut opt_a, &mut opt_b);
    // `opt_a` now holds b's optimizer, which was not unscaled.
    assert_eq!(scaler.stage(&opt_a), OptimizerStage::Ready);
    assert_eq!(scaler.stage(&opt_b), OptimizerStage::Unscaled);
    assert!(scaler.step(&mut opt_a)?);
    assert!(scaler.step(&mut opt_b)?);
    assert_eq!(values(&a.grad().unwrap()), [2.0]);
    assert_eq!(values(&b.grad().unwrap()), [4.0]);
    assert_eq!((values(a.tensor()), values(b.tensor())), (vec![-1.0], vec![-3.0]));
    scaler.update()?;
    Ok(())
}

#[test]
fn scales_that_underflow_or_are_not_finite_are_refused() {
    for init_scale in [1e-50, 1e-40, 0.0, -1.0, f64::NAN, f64::INFINITY, 1e39] {
        let err = GradScaler::with_config(GradScalerConfig { init_scale, ..Default::default() }).unwrap_err();
        assert!(matches!(err, AmpError::Invalid { what: "GradScaler", .. }), "{init_scale}: {err:?}");
        // The variant says no more: the message names the field.
        assert!(err.to_string().contains("init_scale must be positive and finite in f32"), "{init_scale}: {err}");
    }
    for (growth_factor, backoff_factor) in [(1.0 + 1e-10, 0.5), (f64::NAN, 0.5), (2.0, 1.0 - 1e-10), (2.0, 1e-50)] {
        let config = GradScalerConfig { growth_factor, backoff_factor, ..Default::default() };
        let err = GradScaler::with_config(config).unwrap_err();
        assert!(matches!(err, AmpError::Invalid { what: "GradScaler", .. }), "{config:?}: {err:?}");
    }
    let mut scaler = GradScaler::new();
    for bad in [0.0, 1e-45, -2.0, f64::NAN, f64::INFINITY] {
        let err = scaler.update_to(bad).unwrap_err();
        assert!(matches!(err, AmpError::Invalid { what: "GradScaler::update_to", .. }), "{bad}: {err:?}");
        assert_eq!(scaler.get_scale(), 65536.0);
    }
}

#[test]
fn set_lr_through_the_scaler_s_optimizers_refuses_nan() -> Result<()> {
    let p = param(&[1.0])?;
    let mut opt = sgd(vec![p])?;
    assert!(opt.set_lr(f64::NAN).is_err());
    assert_eq!(opt.lr(), 1.0);
    Ok(())
}
