//! Optimizers against hand-written references of PyTorch's update rules,
//! memory in steady state, gradient accumulation, schedules, clipping and
//! optimizer state dicts.
//!
//! Every test first sets the number of logical host devices to 4 (the count
//! is fixed at first use and tests run in parallel, so all agree on it);
//! only the allocation test uses `cpu:3`, so its counts see no other test.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{AutogradError, Var};
use brasa_nn::functional::cross_entropy;
use brasa_nn::optim::{
    clip_grad_norm_, grad_norm, Adam, AdamConfig, AdamW, CosineAnnealingLr, GradAccumulator, LinearWarmup, LrScheduler,
    Optimizer, Sgd, SgdConfig, StepLr,
};
use brasa_nn::{Linear, Module, ModuleExt, NnError, StateDict};
use brasa_tensor::{memory, set_host_device_count, DType, Device, Tensor};

type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

fn devices() {
    set_host_device_count(4).expect("every test of this file asks for 4 host devices");
}

fn f64s(values: &[f64], dims: &[usize]) -> Tensor {
    Tensor::from_slice(values, dims).unwrap()
}

/// A deterministic gradient that depends on the parameter and the step.
fn synthetic_grad(p: &[f64], step: usize) -> Vec<f64> {
    p.iter().enumerate().map(|(i, &x)| 0.3 * x + 0.1 * (step + 1) as f64 * (i as f64 - 1.0) + 0.05).collect()
}

fn assert_close(got: &[f64], want: &[f64], tol: f64, context: &str) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= tol * w.abs().max(1.0), "{context}: got {got:?}, want {want:?}");
    }
}

/// PyTorch's single-tensor SGD, written out.
fn reference_sgd(p: &mut [f64], g: &[f64], buffer: &mut Option<Vec<f64>>, c: &SgdConfig) {
    let mut d: Vec<f64> = g.iter().map(|&x| if c.maximize { -x } else { x }).collect();
    if c.weight_decay != 0.0 {
        d.iter_mut().zip(p.iter()).for_each(|(d, &p)| *d += c.weight_decay * p);
    }
    if c.momentum != 0.0 {
        match buffer {
            None => *buffer = Some(d.clone()),
            Some(b) => b.iter_mut().zip(&d).for_each(|(b, &d)| *b = *b * c.momentum + (1.0 - c.dampening) * d),
        }
        let b = buffer.as_ref().unwrap();
        if c.nesterov {
            d.iter_mut().zip(b).for_each(|(d, &b)| *d += c.momentum * b);
        } else {
            d = b.clone();
        }
    }
    p.iter_mut().zip(&d).for_each(|(p, &d)| *p += -c.lr * d);
}

#[test]
fn sgd_follows_pytorch_for_every_option() -> TestResult {
    devices();
    let configs = [
        SgdConfig { lr: 0.1, ..Default::default() },
        SgdConfig { lr: 0.1, weight_decay: 0.01, ..Default::default() },
        SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() },
        SgdConfig { lr: 0.05, momentum: 0.9, dampening: 0.3, weight_decay: 0.02, ..Default::default() },
        SgdConfig { lr: 0.05, momentum: 0.8, nesterov: true, ..Default::default() },
        SgdConfig { lr: 0.05, momentum: 0.8, nesterov: true, weight_decay: 0.1, ..Default::default() },
        SgdConfig { lr: 0.05, momentum: 0.7, weight_decay: 0.1, maximize: true, ..Default::default() },
    ];
    for config in configs {
        let start = [0.5, -1.25, 2.0, 0.75];
        let param = Var::param(f64s(&start, &[2, 2]))?;
        let frozen = Var::param(f64s(&[1.0, 2.0], &[2]))?;
        let mut opt = Sgd::new(vec![param.clone(), frozen.clone()], config)?;
        let (mut want, mut buffer) = (start.to_vec(), None);
        for step in 0..3 {
            let g = synthetic_grad(&param.tensor().to_vec::<f64>()?, step);
            param.set_grad(Some(f64s(&g, &[2, 2])))?;
            opt.step()?;
            reference_sgd(&mut want, &g, &mut buffer, &config);
            assert_close(&param.tensor().to_vec::<f64>()?, &want, 1e-14, &format!("{config:?} step {step}"));
            opt.zero_grad()?;
            assert!(param.grad().is_none());
        }
        // A parameter without a gradient is skipped and gets no state.
        assert_eq!(frozen.tensor().to_vec::<f64>()?, [1.0, 2.0]);
        assert!(opt.momentum_buffer(1).is_none());
        assert_eq!(opt.momentum_buffer(0).is_some(), config.momentum != 0.0);
    }
    Ok(())
}

/// PyTorch's single-tensor Adam/AdamW state, written out.
#[derive(Default)]
struct ReferenceAdam {
    step: u64,
    m: Vec<f64>,
    v: Vec<f64>,
    v_max: Vec<f64>,
}

impl ReferenceAdam {
    fn update(&mut self, p: &mut [f64], g: &[f64], c: &AdamConfig, decoupled: bool) {
        if self.step == 0 {
            self.m = vec![0.0; p.len()];
            self.v = vec![0.0; p.len()];
            self.v_max = vec![0.0; p.len()];
        }
        self.step += 1;
        let mut g: Vec<f64> = g.iter().map(|&x| if c.maximize { -x } else { x }).collect();
        if decoupled {
            p.iter_mut().for_each(|p| *p *= 1.0 - c.lr * c.weight_decay);
        } else if c.weight_decay != 0.0 {
            g.iter_mut().zip(p.iter()).for_each(|(g, &p)| *g += c.weight_decay * p);
        }
        let (b1, b2) = c.betas;
        let t = self.step as f64;
        let step_size = c.lr / (1.0 - b1.powf(t));
        let bc2_sqrt = (1.0 - b2.powf(t)).sqrt();
        for i in 0..p.len() {
            self.m[i] += (1.0 - b1) * (g[i] - self.m[i]);
            self.v[i] = self.v[i] * b2 + (1.0 - b2) * g[i] * g[i];
            self.v_max[i] = self.v_max[i].max(self.v[i]);
            let second = if c.amsgrad { self.v_max[i] } else { self.v[i] };
            let denom = second.sqrt() / bc2_sqrt + c.eps;
            p[i] += -step_size * self.m[i] / denom;
        }
    }
}

#[test]
fn adam_and_adamw_follow_pytorch() -> TestResult {
    devices();
    let configs = [
        AdamConfig { lr: 0.01, ..Default::default() },
        AdamConfig { lr: 0.02, betas: (0.8, 0.99), eps: 1e-6, weight_decay: 0.1, ..Default::default() },
        AdamConfig { lr: 0.02, weight_decay: 0.05, amsgrad: true, ..Default::default() },
        AdamConfig { lr: 0.01, maximize: true, weight_decay: 0.01, ..Default::default() },
        AdamConfig { lr: 0.01, amsgrad: true, maximize: true, ..Default::default() },
    ];
    for config in configs {
        for decoupled in [false, true] {
            let start = [0.5, -1.25, 2.0, 0.75, 0.0, -0.3];
            let param = Var::param(f64s(&start, &[3, 2]))?;
            let other = Var::param(f64s(&[3.0], &[1]))?;
            let params = vec![param.clone(), other.clone()];
            let mut opt: Box<dyn Optimizer> =
                if decoupled { Box::new(AdamW::new(params, config)?) } else { Box::new(Adam::new(params, config)?) };
            let (mut want, mut reference) = (start.to_vec(), ReferenceAdam::default());
            for step in 0..3 {
                // Gradients that shrink and flip sign, so AMSGrad's maximum matters.
                let scale = [1.0, -0.2, 0.5][step];
                let g: Vec<f64> =
                    synthetic_grad(&param.tensor().to_vec::<f64>()?, step).iter().map(|g| g * scale).collect();
                param.set_grad(Some(f64s(&g, &[3, 2])))?;
                opt.step()?;
                reference.update(&mut want, &g, &config, decoupled);
                let context = format!("{config:?} decoupled {decoupled} step {step}");
                assert_close(&param.tensor().to_vec::<f64>()?, &want, 1e-13, &context);
                opt.zero_grad()?;
            }
            assert_eq!(other.tensor().to_vec::<f64>()?, [3.0]);
        }
    }
    Ok(())
}

#[test]
fn adam_exposes_its_moments() -> TestResult {
    devices();
    let w = Var::param(f64s(&[1.0, 2.0], &[2]))?;
    let mut opt = Adam::new(vec![w.clone()], AdamConfig::default())?;
    assert!(opt.moments(0).is_none());
    w.set_grad(Some(f64s(&[0.5, -1.0], &[2])))?;
    opt.step()?;
    let (step, m, v) = opt.moments(0).unwrap();
    assert_eq!(step, 1);
    assert_close(&m.to_vec::<f64>()?, &[0.05, -0.1], 1e-15, "exp_avg");
    assert_close(&v.to_vec::<f64>()?, &[0.00025, 0.001], 1e-15, "exp_avg_sq");
    Ok(())
}

#[test]
fn fused_and_composed_adam_steps_agree_bit_for_bit() -> TestResult {
    // A transposed parameter cannot be updated in one contiguous pass, so it
    // takes the composed in-place ops; its contiguous twin takes the fused
    // kernel. Same values, same gradients: same bits after every step.
    devices();
    for config in [AdamConfig::adamw(), AdamConfig { amsgrad: true, weight_decay: 0.1, ..Default::default() }] {
        for decoupled in [false, true] {
            let start = Tensor::randn([6, 4], DType::F32)?;
            let twin = Tensor::zeros([6, 4], DType::F32)?;
            twin.copy_(&start)?;
            let transposed = Var::param(Tensor::zeros([4, 6], DType::F32)?.t()?)?;
            transposed.tensor().copy_(&start)?;
            assert!(!transposed.tensor().is_contiguous());
            let fused = Var::param(twin)?;
            let mut opts: Vec<Box<dyn Optimizer>> = [&fused, &transposed]
                .into_iter()
                .map(|p| -> Box<dyn Optimizer> {
                    if decoupled {
                        Box::new(AdamW::new(vec![p.clone()], config).unwrap())
                    } else {
                        Box::new(Adam::new(vec![p.clone()], config).unwrap())
                    }
                })
                .collect();
            for _ in 0..3 {
                let g = Tensor::randn([6, 4], DType::F32)?;
                fused.set_grad(Some(g.clone()))?;
                transposed.set_grad(Some(g))?;
                for opt in &mut opts {
                    opt.step()?;
                }
                assert_eq!(fused.tensor().to_vec::<f32>()?, transposed.tensor().contiguous()?.to_vec::<f32>()?);
            }
        }
    }
    Ok(())
}

#[test]
fn fused_and_composed_sgd_steps_agree_bit_for_bit() -> TestResult {
    // Three twins in one optimizer: a contiguous parameter with a contiguous
    // gradient takes the fused kernel; a transposed parameter, and a
    // contiguous one whose gradient is transposed, take the composed
    // in-place ops. Same values, same gradients: same bits after every step,
    // the first (which starts the momentum buffers) included.
    devices();
    let configs = [
        SgdConfig { lr: 0.1, ..Default::default() },
        SgdConfig { lr: 0.1, weight_decay: 0.01, maximize: true, ..Default::default() },
        SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() },
        SgdConfig { lr: 0.05, momentum: 0.9, dampening: 0.3, weight_decay: 0.02, ..Default::default() },
        SgdConfig { lr: 0.05, momentum: 0.8, nesterov: true, weight_decay: 0.1, ..Default::default() },
        SgdConfig { lr: 0.05, momentum: 0.7, weight_decay: 0.1, maximize: true, ..Default::default() },
    ];
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        for config in configs {
            let start = Tensor::randn([6, 4], DType::F32)?.to_dtype(dtype)?;
            let fused = Var::param(Tensor::zeros([6, 4], dtype)?)?;
            let transposed = Var::param(Tensor::zeros([4, 6], dtype)?.t()?)?;
            let strided_grad = Var::param(Tensor::zeros([6, 4], dtype)?)?;
            for p in [&fused, &transposed, &strided_grad] {
                p.tensor().copy_(&start)?;
            }
            assert!(!transposed.tensor().is_contiguous());
            let params = vec![fused.clone(), transposed.clone(), strided_grad.clone()];
            let mut opt = Sgd::new(params.clone(), config)?;
            let bits = |t: &Tensor| -> Vec<u64> {
                let values = t.contiguous().unwrap().to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
                values.iter().map(|v| v.to_bits()).collect()
            };
            for step in 0..3 {
                let g = Tensor::randn([6, 4], DType::F32)?.to_dtype(dtype)?;
                let g_t = Tensor::zeros([4, 6], dtype)?.t()?;
                g_t.copy_(&g)?;
                fused.set_grad(Some(g.clone()))?;
                transposed.set_grad(Some(g))?;
                strided_grad.set_grad(Some(g_t))?;
                opt.step()?;
                let what = format!("{dtype} {config:?} step {step}");
                let want = bits(fused.tensor());
                assert_ne!(want, bits(&start), "{what}: the step moved the parameter");
                assert_eq!(want, bits(transposed.tensor()), "{what}: transposed parameter");
                assert_eq!(want, bits(strided_grad.tensor()), "{what}: transposed gradient");
                if config.momentum != 0.0 {
                    let buffer = |i| bits(opt.momentum_buffer(i).unwrap());
                    assert_eq!(buffer(0), buffer(1), "{what}: momentum buffers");
                    assert_eq!(buffer(0), buffer(2), "{what}: momentum buffers");
                } else {
                    assert!(opt.momentum_buffer(0).is_none(), "plain SGD keeps no state");
                }
            }
        }
    }
    Ok(())
}

/// One training step of a small model on `cpu:3`.
fn train_step(model: &[Linear; 2], x: &Var, y: &Tensor, opt: &mut dyn Optimizer) -> TestResult {
    let hidden = model[0].forward(x)?.relu()?;
    let loss = cross_entropy(&model[1].forward(&hidden)?, y)?;
    loss.backward()?;
    drop(loss);
    opt.step()?;
    opt.zero_grad()?;
    Ok(())
}

#[test]
fn steady_state_training_steps_allocate_nothing_new() -> TestResult {
    devices();
    let dev = Device::cpu(3);
    type Make = fn(Vec<Var>) -> brasa_nn::Result<Box<dyn Optimizer>>;
    let makers: [Make; 4] = [
        |p| Ok(Box::new(Sgd::new(p, SgdConfig { lr: 0.1, momentum: 0.9, weight_decay: 1e-4, ..Default::default() })?)),
        |p| Ok(Box::new(Sgd::new(p, SgdConfig { lr: 0.1, momentum: 0.9, nesterov: true, ..Default::default() })?)),
        |p| Ok(Box::new(Adam::new(p, AdamConfig { weight_decay: 1e-4, amsgrad: true, ..Default::default() })?)),
        |p| Ok(Box::new(AdamW::new(p, AdamConfig { maximize: true, ..AdamConfig::adamw() })?)),
    ];
    for make in makers {
        // Weights of 2 MiB: they and their gradients and state live in the large pool.
        let model = [Linear::new(512, 1024, dev)?, Linear::new(1024, 5, dev)?];
        let params: Vec<Var> = model.iter().flat_map(ModuleExt::parameters).collect();
        let mut opt = make(params)?;
        let x = Var::new(Tensor::randn_on([8, 512], DType::F32, dev)?);
        let y = Tensor::from_vec_on((0..8).map(|i| i % 5).collect::<Vec<i64>>(), [8], dev)?;
        // The first steps allocate the optimizer's state and fill the cache.
        for _ in 0..2 {
            train_step(&model, &x, &y, opt.as_mut())?;
        }
        let before = memory::stats(dev)?;
        for _ in 0..5 {
            train_step(&model, &x, &y, opt.as_mut())?;
        }
        let after = memory::stats(dev)?;
        assert_eq!(after.num_device_alloc, before.num_device_alloc, "a training step asked the device for memory");
        assert_eq!(after.reserved_bytes.all.current, before.reserved_bytes.all.current);
        assert_eq!(after.allocated_bytes.all.current, before.allocated_bytes.all.current, "memory leaked per step");
        // The optimizer step itself allocates nothing at all, not even from the cache.
        let hidden = model[0].forward(&x)?.relu()?;
        cross_entropy(&model[1].forward(&hidden)?, &y)?.backward()?;
        let before_step = memory::stats(dev)?;
        opt.step()?;
        let after_step = memory::stats(dev)?;
        assert_eq!(after_step.allocation.all.allocated, before_step.allocation.all.allocated);
        assert_eq!(after_step.num_device_alloc, before_step.num_device_alloc);
        opt.zero_grad()?;
    }
    Ok(())
}

/// A small f64 MLP (two `Linear` layers and a ReLU), with the same weights
/// for the same seed.
fn mlp(seed: u64) -> brasa_nn::Result<[Linear; 2]> {
    brasa_tensor::manual_seed(seed);
    Ok([
        Linear::with_options(6, 10, true, DType::F64, Device::CPU)?,
        Linear::with_options(10, 3, true, DType::F64, Device::CPU)?,
    ])
}

fn mlp_loss(model: &[Linear; 2], x: &Tensor, y: &Tensor) -> brasa_nn::Result<Var> {
    let hidden = model[0].forward(&Var::new(x.clone()))?.relu()?;
    cross_entropy(&model[1].forward(&hidden)?, y)
}

fn weights(model: &[Linear; 2]) -> Vec<f64> {
    model.iter().flat_map(ModuleExt::parameters).flat_map(|p| p.tensor().to_vec::<f64>().unwrap()).collect()
}

#[test]
fn accumulated_micro_batches_give_the_full_batch_update() -> TestResult {
    devices();
    let (k, b) = (4, 5);
    let big = mlp(7)?;
    let small = mlp(7)?;
    small.iter().zip(&big).try_for_each(|(s, g)| s.load_state_dict(&g.state_dict(), true).map(|_| ()))?;
    assert_eq!(weights(&big), weights(&small));
    let config = SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() };
    let params = |m: &[Linear; 2]| m.iter().flat_map(ModuleExt::parameters).collect::<Vec<_>>();
    let mut opt_big = Sgd::new(params(&big), config)?;
    let mut opt_small = Sgd::new(params(&small), config)?;
    let mut accumulate = GradAccumulator::new(k)?;
    for round in 0..2 {
        let x = Tensor::randn([k * b, 6], DType::F64)?;
        let y = Tensor::from_vec((0..k * b).map(|i| ((i * 7 + round) % 3) as i64).collect::<Vec<_>>(), [k * b])?;
        mlp_loss(&big, &x, &y)?.backward()?;
        opt_big.step()?;
        opt_big.zero_grad()?;
        for micro in 0..k {
            let ready =
                accumulate.backward(&mlp_loss(&small, &x.narrow(0, micro * b, b)?, &y.narrow(0, micro * b, b)?)?)?;
            assert_eq!(ready, micro == k - 1);
            assert_eq!(accumulate.step(&mut opt_small)?, micro == k - 1);
        }
        assert_eq!(accumulate.accumulated(), 0);
        assert!(params(&small).iter().all(|p| p.grad().is_none()));
        assert_close(&weights(&small), &weights(&big), 1e-10, &format!("round {round}"));
    }
    assert!(GradAccumulator::new(0).is_err());
    Ok(())
}

#[test]
fn schedules_follow_pytorch_closed_forms() -> TestResult {
    devices();
    let new_opt = |lr: f64| {
        Sgd::new(vec![Var::param(Tensor::zeros([1], DType::F32).unwrap())?], SgdConfig { lr, ..Default::default() })
    };
    let mut opt = new_opt(0.1)?;
    let mut step_lr = StepLr::new(&opt, 3, 0.1)?;
    let mut seen = vec![opt.lr()];
    for _ in 0..7 {
        step_lr.step(&mut opt)?;
        seen.push(opt.lr());
    }
    assert_close(&seen, &[0.1, 0.1, 0.1, 0.01, 0.01, 0.01, 0.001, 0.001], 1e-15, "StepLR");

    let mut opt = new_opt(0.1)?;
    let mut cosine = CosineAnnealingLr::new(&opt, 10, 0.001)?;
    for t in 1..=12 {
        cosine.step(&mut opt)?;
        let want = 0.001 + (0.1 - 0.001) * (1.0 + (std::f64::consts::PI * t as f64 / 10.0).cos()) / 2.0;
        assert_close(&[opt.lr(), cosine.lr()], &[want, want], 1e-15, "CosineAnnealingLR");
    }
    assert_close(&[cosine.lr_at(5)], &[0.0505], 1e-14, "half way");
    assert_close(&[cosine.lr_at(10)], &[0.001], 1e-14, "t_max");

    // PyTorch: SequentialLR([LinearLR(start_factor=0.25, total_iters=4), StepLR(2, 0.5)], milestones=[4]).
    let mut opt = new_opt(0.1)?;
    let inner = StepLr::new(&opt, 2, 0.5)?;
    let mut warm = LinearWarmup::new(&mut opt, 4, 0.25, Some(Box::new(inner)))?;
    let mut seen = vec![opt.lr()];
    for _ in 0..8 {
        warm.step(&mut opt)?;
        seen.push(opt.lr());
    }
    let want = [0.025, 0.04375, 0.0625, 0.08125, 0.1, 0.1, 0.05, 0.05, 0.025];
    assert_close(&seen, &want, 1e-15, "warm-up then StepLR");
    assert_eq!(warm.lr(), opt.lr());
    Ok(())
}

#[test]
fn clip_grad_norm_scales_all_gradients_together() -> TestResult {
    devices();
    let model = mlp(3)?;
    let params: Vec<Var> = model.iter().flat_map(ModuleExt::parameters).collect();
    let x = Tensor::randn([8, 6], DType::F64)?;
    let y = Tensor::from_vec((0..8).map(|i| i % 3).collect::<Vec<i64>>(), [8])?;
    mlp_loss(&model, &x, &y)?.backward()?;
    let grads: Vec<f64> = params.iter().flat_map(|p| p.grad().unwrap().to_vec::<f64>().unwrap()).collect();
    let want = grads.iter().map(|g| g * g).sum::<f64>().sqrt();
    assert_close(&[grad_norm(&params, 2.0)?], &[want], 1e-14, "grad_norm");
    let max_norm = want / 4.0;
    let total = clip_grad_norm_(&params, max_norm, 2.0)?;
    assert_close(&[total], &[want], 1e-14, "returned norm");
    let clipped: Vec<f64> = params.iter().flat_map(|p| p.grad().unwrap().to_vec::<f64>().unwrap()).collect();
    let coefficient = max_norm / (want + 1e-6);
    let scaled: Vec<f64> = grads.iter().map(|g| g * coefficient).collect();
    assert_close(&clipped, &scaled, 1e-14, "clipped gradients");
    let largest = clipped.iter().fold(0.0f64, |m, g| m.max(g.abs()));
    assert_close(&[grad_norm(&params, f64::INFINITY)?], &[largest], 1e-15, "inf norm");
    Ok(())
}

/// Trains `steps` steps with fixed gradients derived from the weights.
fn fixed_steps(opt: &mut dyn Optimizer, params: &[Var], steps: usize) -> TestResult {
    for step in 0..steps {
        for p in params {
            let g = synthetic_grad(&p.tensor().to_vec::<f64>()?, step);
            p.set_grad(Some(Tensor::from_vec(g, p.dims())?))?;
        }
        opt.step()?;
        opt.zero_grad()?;
    }
    Ok(())
}

fn twin_params() -> (Vec<Var>, Vec<Var>) {
    let make = || {
        vec![Var::param(f64s(&[0.5, -1.0, 2.0, 0.25], &[2, 2])).unwrap(), Var::param(f64s(&[1.5, -0.5], &[2])).unwrap()]
    };
    (make(), make())
}

#[test]
fn optimizer_state_dicts_round_trip_through_safetensors() -> TestResult {
    devices();
    type Make = fn(Vec<Var>, bool) -> brasa_nn::Result<Box<dyn Optimizer>>;
    let makers: [Make; 3] = [
        |p, fresh| {
            let lr = if fresh { 0.5 } else { 0.05 };
            Ok(Box::new(Sgd::new(
                p,
                SgdConfig { lr, momentum: 0.9, dampening: 0.1, weight_decay: 0.01, ..Default::default() },
            )?))
        },
        |p, fresh| {
            let config = if fresh {
                AdamConfig::default()
            } else {
                AdamConfig { lr: 0.01, betas: (0.8, 0.95), amsgrad: true, weight_decay: 0.1, ..Default::default() }
            };
            Ok(Box::new(Adam::new(p, config)?))
        },
        |p, _| Ok(Box::new(AdamW::new(p, AdamConfig { lr: 0.01, ..AdamConfig::adamw() })?)),
    ];
    for make in makers {
        let (a, b) = twin_params();
        let mut trained = make(a.clone(), false)?;
        fixed_steps(trained.as_mut(), &a, 2)?;
        for (pa, pb) in a.iter().zip(&b) {
            pb.tensor().copy_(pa.tensor())?;
        }
        let saved = StateDict::from_bytes(&trained.state_dict()?.to_bytes()?)?;
        let mut fresh = make(b.clone(), true)?;
        fresh.load_state_dict(&saved)?;
        assert_eq!(fresh.lr(), trained.lr());
        fixed_steps(trained.as_mut(), &a, 1)?;
        fixed_steps(fresh.as_mut(), &b, 1)?;
        for (pa, pb) in a.iter().zip(&b) {
            assert_eq!(pa.tensor().to_vec::<f64>()?, pb.tensor().to_vec::<f64>()?);
        }
        // Loading copied the state: the saved dict is not aliased.
        let names: Vec<&str> = saved.names().collect();
        assert!(names.contains(&"param_groups.0.lr") && names.contains(&"param_groups.0.params"), "{names:?}");
    }
    Ok(())
}

#[test]
fn state_dict_names_follow_pytorch() -> TestResult {
    devices();
    let (a, _) = twin_params();
    let mut adam = Adam::new(a.clone(), AdamConfig { amsgrad: true, ..Default::default() })?;
    a[0].set_grad(Some(Tensor::ones([2, 2], DType::F64)?))?;
    adam.step()?;
    let dict = adam.state_dict()?;
    let names: Vec<&str> = dict.names().collect();
    for name in
        ["state.0.step", "state.0.exp_avg", "state.0.exp_avg_sq", "state.0.max_exp_avg_sq", "param_groups.0.betas"]
    {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    // Parameter 1 had no gradient: no state.
    assert!(!names.iter().any(|n| n.starts_with("state.1.")));
    assert_eq!(dict.get("state.0.step").unwrap().item::<f64>()?, 1.0);
    // The buffers are the live state.
    assert!(dict.get("state.0.exp_avg").unwrap().shares_storage_with(adam.moments(0).unwrap().1));
    Ok(())
}

#[test]
fn mismatched_optimizer_states_are_refused_by_name() -> TestResult {
    devices();
    let (a, b) = twin_params();
    let mut sgd = Sgd::new(a.clone(), SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() })?;
    fixed_steps(&mut sgd, &a, 1)?;
    let mut adam = Adam::new(b.clone(), AdamConfig::default())?;
    fixed_steps(&mut adam, &b, 1)?;
    let adam_state = adam.state_dict()?;
    let sgd_state = sgd.state_dict()?;

    // Each refusal is an NnError::StateDict; its message names the optimizer
    // and the entry, which is what this test is about.
    let refusal = |result: Result<(), NnError>| match result {
        Err(NnError::StateDict(message)) => message,
        other => panic!("expected a StateDict error, got {other:?}"),
    };
    let err = refusal(sgd.load_state_dict(&adam_state));
    assert!(err.starts_with("Sgd: missing entry param_groups.0.momentum"), "{err}");
    let err = refusal(adam.load_state_dict(&sgd_state));
    assert!(err.starts_with("Adam: missing entry param_groups.0.decoupled_weight_decay"), "{err}");
    let mut adamw = AdamW::new(b.clone(), AdamConfig::default())?;
    let err = refusal(adamw.load_state_dict(&adam_state));
    assert!(err.contains("the state is Adam's, this optimizer is AdamW"), "{err}");

    let mut misshapen = sgd_state.clone();
    misshapen.insert("state.1.momentum_buffer", Tensor::zeros([3], DType::F64)?);
    let err = refusal(sgd.load_state_dict(&misshapen));
    assert!(err.contains("state.1.momentum_buffer has shape [3], but its parameter has shape [2]"), "{err}");

    let mut extra = sgd_state.clone();
    extra.insert("state.0.exp_avg", Tensor::zeros([2, 2], DType::F64)?);
    let err = refusal(sgd.load_state_dict(&extra));
    assert!(err.contains("unexpected entry state.0.exp_avg"), "{err}");

    let mut partial = adam_state.clone();
    partial.remove("state.0.exp_avg_sq");
    let err = refusal(adam.load_state_dict(&partial));
    assert!(err.contains("missing entry state.0.exp_avg_sq"), "{err}");

    let mut one = Sgd::new(vec![a[0].clone()], SgdConfig::default())?;
    let err = refusal(one.load_state_dict(&sgd_state));
    assert!(err.contains("the state is for 2 parameters, this optimizer has 1"), "{err}");

    // A refused load changes nothing.
    let lr = sgd.lr();
    let mut bad_lr = sgd_state.clone();
    bad_lr.insert("param_groups.0.lr", Tensor::from_vec(vec![-1.0f64], [])?);
    let err = sgd.load_state_dict(&bad_lr).unwrap_err();
    assert!(
        matches!(&err, NnError::Invalid { what: "Sgd", message } if message.starts_with("lr must be finite and >= 0")),
        "{err:?}"
    );
    assert_eq!(sgd.lr(), lr);
    Ok(())
}

#[test]
fn invalid_configurations_are_errors() -> TestResult {
    devices();
    let w = || vec![Var::param(Tensor::zeros([2], DType::F32).unwrap()).unwrap()];
    let nesterov = Sgd::new(w(), SgdConfig { nesterov: true, ..Default::default() }).err().unwrap().to_string();
    assert_eq!(
        nesterov,
        "Sgd: Nesterov momentum requires momentum > 0 and dampening 0, got momentum 0 and dampening 0"
    );
    assert!(Sgd::new(w(), SgdConfig { lr: -0.1, ..Default::default() }).is_err());
    assert!(Sgd::new(w(), SgdConfig { momentum: f64::NAN, ..Default::default() }).is_err());
    let betas = Adam::new(w(), AdamConfig { betas: (0.9, 1.0), ..Default::default() }).err().unwrap().to_string();
    assert_eq!(betas, "Adam: betas.1 must be in [0, 1), got 1");
    assert!(AdamW::new(w(), AdamConfig { eps: -1.0, ..Default::default() }).is_err());
    let empty = Sgd::new(Vec::new(), SgdConfig::default()).err().unwrap();
    assert!(
        matches!(&empty, NnError::Invalid { what: "Sgd", message } if message == "got an empty parameter list"),
        "{empty:?}"
    );
    let p = Var::param(Tensor::zeros([2], DType::F32)?)?;
    let twice = Adam::new(vec![p.clone(), p], AdamConfig::default()).err().unwrap();
    assert!(
        matches!(&twice, NnError::Invalid { what: "Adam", message }
            if message.starts_with("parameters 0 and 1 are the same Var")),
        "{twice:?}"
    );
    let x = Var::param(Tensor::zeros([2], DType::F32)?)?;
    let computed = Sgd::new(vec![x.mul_scalar(2.0)?], SgdConfig::default()).err().unwrap();
    assert!(
        matches!(&computed, NnError::Invalid { what: "Sgd", message }
            if message.starts_with("parameter 0 is not a leaf")),
        "{computed:?}"
    );
    Ok(())
}

#[test]
fn zero_grad_can_keep_the_buffers() -> TestResult {
    devices();
    let w = Var::param(f64s(&[1.0, 2.0], &[2]))?;
    let mut opt = Sgd::new(vec![w.clone()], SgdConfig::default())?;
    w.mul(&w)?.sum_all()?.backward()?;
    let grad = w.grad().unwrap();
    opt.zero_grad_with(false)?;
    let kept = w.grad().unwrap();
    assert!(kept.shares_storage_with(&grad));
    assert_eq!(kept.to_vec::<f64>()?, [0.0, 0.0]);
    opt.zero_grad()?;
    assert!(w.grad().is_none());
    Ok(())
}

#[test]
fn learning_rates_that_would_poison_training_are_refused() -> TestResult {
    devices();
    let w = Var::param(f64s(&[1.0, -2.0], &[2]))?;
    let mut optimizers: Vec<Box<dyn Optimizer>> = vec![
        Box::new(Sgd::new(vec![w.clone()], SgdConfig { lr: 0.1, ..Default::default() })?),
        Box::new(Adam::new(vec![w.clone()], AdamConfig { lr: 0.1, ..Default::default() })?),
        Box::new(AdamW::new(vec![w.clone()], AdamConfig { lr: 0.1, ..AdamConfig::adamw() })?),
    ];
    for opt in &mut optimizers {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1e-3] {
            let err = opt.set_lr(bad).unwrap_err();
            assert!(
                matches!(&err, NnError::Invalid { message, .. } if message.starts_with("lr must be finite and >= 0")),
                "{err:?}"
            );
            assert_eq!(opt.lr(), 0.1, "a refused rate leaves the rate as it was");
        }
        opt.set_lr(0.0)?;
        opt.set_lr(0.05)?;
        assert_eq!(opt.lr(), 0.05);
        // Training goes on with finite weights.
        w.mul(&w)?.sum_all()?.backward()?;
        opt.step()?;
        opt.zero_grad()?;
        assert!(w.tensor().to_vec::<f64>()?.iter().all(|v| v.is_finite()));
    }
    Ok(())
}

#[test]
fn out_of_range_hyperparameters_are_refused_by_every_optimizer() -> TestResult {
    devices();
    let w = || vec![Var::param(Tensor::zeros([2], DType::F32).unwrap()).unwrap()];
    for config in [
        SgdConfig { lr: f64::NAN, ..Default::default() },
        SgdConfig { momentum: -0.5, ..Default::default() },
        SgdConfig { weight_decay: -1e-4, ..Default::default() },
        SgdConfig { weight_decay: f64::INFINITY, ..Default::default() },
        SgdConfig { dampening: f64::NAN, ..Default::default() },
    ] {
        assert!(Sgd::new(w(), config).is_err(), "{config:?}");
    }
    for config in [
        AdamConfig { lr: -1.0, ..Default::default() },
        AdamConfig { betas: (1.0, 0.999), ..Default::default() },
        AdamConfig { betas: (0.9, f64::NAN), ..Default::default() },
        AdamConfig { betas: (-0.1, 0.999), ..Default::default() },
        AdamConfig { eps: -1e-8, ..Default::default() },
        AdamConfig { eps: f64::NAN, ..Default::default() },
        AdamConfig { weight_decay: -0.01, ..Default::default() },
    ] {
        assert!(Adam::new(w(), config).is_err(), "{config:?}");
        assert!(AdamW::new(w(), config).is_err(), "{config:?}");
    }
    Ok(())
}

#[test]
fn a_gradient_of_another_shape_never_reaches_the_update() -> TestResult {
    devices();
    for kind in 0..3 {
        let w = Var::param(f64s(&[1.0, 2.0, 3.0, 4.0], &[2, 2]))?;
        let mut opt: Box<dyn Optimizer> = match kind {
            0 => Box::new(Sgd::new(vec![w.clone()], SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() })?),
            1 => Box::new(Adam::new(vec![w.clone()], AdamConfig::default())?),
            _ => Box::new(AdamW::new(vec![w.clone()], AdamConfig::adamw())?),
        };
        // A [2] gradient would broadcast over the [2, 2] parameter.
        let err = w.set_grad(Some(f64s(&[1.0, 1.0], &[2]))).unwrap_err();
        assert!(
            matches!(&err, AutogradError::GradShape { got, expected, .. } if got == &[2] && expected == &[2, 2]),
            "{err:?}"
        );
        opt.step()?;
        assert_eq!(w.tensor().to_vec::<f64>()?, [1.0, 2.0, 3.0, 4.0], "optimizer {kind} changed nothing");
    }
    Ok(())
}
