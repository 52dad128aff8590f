//! The training steps that memory plans are checked against, shared by
//! `memory_plan.rs` (logical host devices) and `cuda_memory_plan.rs`
//! (`cuda:0`): each `Setup` builds a model, its optimizer and a batch on a
//! device, and returns one training step to plan or run.

use brasa::autograd::checkpoint;
use brasa::nn::functional::cross_entropy;
use brasa::nn::models::{Gpt, GptConfig};
use brasa::nn::optim::{Adam, AdamConfig, AdamW, GradAccumulator, Optimizer};
use brasa::nn::{
    BatchNorm1d, BatchNorm2d, Conv2d, Conv2dConfig, Flatten, Linear, MaxPool2d, Module, ModuleExt, Relu, Sequential,
    TransformerEncoderLayer,
};
use brasa::prelude::*;
use brasa::tensor::memory::{category_scope, MemoryCategory, MemoryPlan, PLANNED_STEPS};
use brasa::tensor::{synchronize, MemoryTarget};

pub type Step = Box<dyn FnMut() -> brasa::nn::Result<()>>;
pub type Setup = fn(Device, usize) -> brasa::nn::Result<Step>;

/// A batch of `batch` rows of `features` and class ids below `classes`.
pub fn batch_on(
    device: Device,
    batch: usize,
    features: &[usize],
    classes: usize,
) -> brasa::nn::Result<(Tensor, Tensor)> {
    let _input = category_scope(MemoryCategory::Input);
    let mut shape = vec![batch];
    shape.extend_from_slice(features);
    let x = Tensor::randn_on(shape, DType::F32, device)?;
    let ids: Vec<i64> = (0..batch as i64).map(|i| i % classes as i64).collect();
    Ok((x, Tensor::from_slice_on(&ids, [batch], device)?))
}

type Forward = Box<dyn Fn(&Var) -> brasa::nn::Result<Var>>;

/// forward, loss, backward, Adam step, zero_grad.
pub fn training_step(parameters: Vec<Var>, forward: Forward, batch: (Tensor, Tensor)) -> brasa::nn::Result<Step> {
    let mut opt = Adam::new(parameters, AdamConfig { lr: 1e-3, ..Default::default() })?;
    Ok(Box::new(move || {
        let (x, y) = &batch;
        let loss = cross_entropy(&forward(&Var::new(x.clone()))?, y)?;
        loss.backward()?;
        opt.step()?;
        opt.zero_grad()?;
        Ok(())
    }))
}

pub fn sequential(model: Sequential, batch: (Tensor, Tensor)) -> brasa::nn::Result<Step> {
    let parameters = model.parameters();
    training_step(parameters, Box::new(move |x| model.forward(x)), batch)
}

pub fn mlp_model(device: Device) -> brasa::nn::Result<Sequential> {
    Ok(Sequential::new()
        .push(Linear::new(64, 256, device)?)
        .push(Relu)
        .push(Linear::new(256, 256, device)?)
        .push(Relu)
        .push(Linear::new(256, 10, device)?))
}

pub fn mlp(device: Device, batch: usize) -> brasa::nn::Result<Step> {
    sequential(mlp_model(device)?, batch_on(device, batch, &[64], 10)?)
}

pub fn cnn(device: Device, batch: usize) -> brasa::nn::Result<Step> {
    let model = Sequential::new()
        .push(Conv2d::with_config(1, 16, 3, Conv2dConfig::default().padding(1), device)?)
        .push(Relu)
        .push(MaxPool2d::new(2)?)
        .push(Conv2d::with_config(16, 32, 3, Conv2dConfig::default().padding(1), device)?)
        .push(Relu)
        .push(MaxPool2d::new(2)?)
        .push(Flatten::new())
        .push(Linear::new(32 * 7 * 7, 10, device)?);
    sequential(model, batch_on(device, batch, &[1, 28, 28], 10)?)
}

/// A channels-last CNN with batch norm after its convolution and its hidden
/// linear layer: on CUDA both batch norms reduce `[rows, C, 1]` inputs in
/// pieces through a temporary the plan must hold.
pub fn bn_cnn(device: Device, batch: usize) -> brasa::nn::Result<Step> {
    let mut model = Sequential::new()
        .push(Conv2d::with_config(1, 8, 3, Conv2dConfig::default().padding(1), device)?)
        .push(BatchNorm2d::new(8, device)?)
        .push(Relu)
        .push(MaxPool2d::new(2)?)
        .push(Flatten::new())
        .push(Linear::new(8 * 14 * 14, 32, device)?)
        .push(BatchNorm1d::new(32, device)?)
        .push(Relu)
        .push(Linear::new(32, 10, device)?);
    model.to_channels_last()?;
    let (x, y) = batch_on(device, batch, &[1, 28, 28], 10)?;
    let x = {
        let _input = category_scope(MemoryCategory::Input);
        x.to_channels_last()?
    };
    sequential(model, (x, y))
}

pub fn encoder(device: Device, batch: usize) -> brasa::nn::Result<Step> {
    let model = Sequential::new()
        .push(TransformerEncoderLayer::new(64, 4, device)?)
        .push(Flatten::new())
        .push(Linear::new(16 * 64, 10, device)?);
    sequential(model, batch_on(device, batch, &[16, 64], 10)?)
}

pub fn bf16_mlp(device: Device, batch: usize) -> brasa::nn::Result<Step> {
    let model = mlp_model(device)?;
    let parameters = model.parameters();
    let forward = move |x: &Var| -> brasa::nn::Result<Var> {
        let _amp = autocast(DType::BF16);
        model.forward(x)
    };
    training_step(parameters, Box::new(forward), batch_on(device, batch, &[64], 10)?)
}

/// Four micro-batches under bf16 autocast and a GradScaler, then one step.
/// The scaler's check for infinite gradients reads a value back on the
/// GPU; the plan assumes finite gradients, which these are.
pub fn accumulated_scaled_mlp(device: Device, batch: usize) -> brasa::nn::Result<Step> {
    let model = mlp_model(device)?;
    let mut opt = Adam::new(model.parameters(), AdamConfig::default())?;
    let mut scaler = GradScaler::new();
    let mut accumulate = GradAccumulator::new(4)?;
    let micro = (batch / 4).max(1);
    let batches = (0..4).map(|_| batch_on(device, micro, &[64], 10)).collect::<brasa::nn::Result<Vec<_>>>()?;
    Ok(Box::new(move || {
        for (x, y) in &batches {
            let loss = {
                let _amp = autocast(DType::BF16);
                cross_entropy(&model.forward(&Var::new(x.clone()))?, y)?
            };
            accumulate.backward(&scaler.scale(&loss)?)?;
        }
        scaler.step(&mut opt)?;
        scaler.update()?;
        accumulate.reset();
        opt.zero_grad()?;
        Ok(())
    }))
}

pub fn checkpointed_mlp(device: Device, batch: usize) -> brasa::nn::Result<Step> {
    let (a, b, head) = (Linear::new(64, 256, device)?, Linear::new(256, 256, device)?, Linear::new(256, 10, device)?);
    let parameters = [a.parameters(), b.parameters(), head.parameters()].concat();
    let hidden_parameters = [a.parameters(), b.parameters()].concat();
    let forward = move |x: &Var| -> brasa::nn::Result<Var> {
        let p = hidden_parameters.clone();
        let hidden = checkpoint(
            move |inputs: &[Var]| {
                let h = inputs[0].matmul(&p[0].t()?)?.add(&p[1])?.relu()?;
                h.matmul(&p[2].t()?)?.add(&p[3])?.relu()
            },
            &[x],
        )?;
        head.forward(&hidden)
    };
    training_step(parameters, Box::new(forward), batch_on(device, batch, &[64], 10)?)
}

/// A two-layer GPT (64 wide, 4 heads of 16, context 32) under bf16
/// autocast with AdamW: its attention runs the fused kernels on CUDA.
pub fn gpt(device: Device, batch: usize) -> brasa::nn::Result<Step> {
    const VOCAB: usize = 65;
    let config = GptConfig::new(VOCAB, 32, 2, 4, 64);
    let model = Gpt::new(config, device)?;
    let mut opt = AdamW::new(model.parameters(), AdamConfig::adamw())?;
    let ids: Vec<i64> = (0..batch * 33).map(|i| ((i * 7 + 3) % VOCAB) as i64).collect();
    let (x, y) = {
        let _input = category_scope(MemoryCategory::Input);
        let window = Tensor::from_vec_on(ids, [batch, 33], device)?;
        (window.narrow(1, 0, 32)?.contiguous()?, window.narrow(1, 1, 32)?.contiguous()?)
    };
    Ok(Box::new(move || {
        let loss = {
            let _amp = autocast(DType::BF16);
            model.loss(&x, &y)?
        };
        loss.backward()?;
        opt.step()?;
        opt.zero_grad()?;
        Ok(())
    }))
}

/// Plans `setup` at `batch` for `device` as it is now
/// (`MemoryTarget::like`), then runs the planned steps there from the same
/// seed: the plan fits and both its peaks equal the run's to the byte
/// (`what` names the case in the messages). Returns the plan.
pub fn plan_equals_run_on(device: Device, what: &str, setup: Setup, batch: usize) -> MemoryPlan {
    let target = MemoryTarget::like(device).unwrap();
    manual_seed(7);
    let plan = memory::plan(&target, |d| setup(d, batch)).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(plan.fits, "{what}: {plan}");
    manual_seed(7);
    {
        let mut step = setup(device, batch).unwrap();
        for _ in 0..PLANNED_STEPS {
            step().unwrap();
        }
        synchronize(device).unwrap();
    }
    let label = format!("{what}, batch {batch} on {device}");
    assert_eq!(plan.peak_allocated, memory::max_allocated(device).unwrap(), "{label}: peak allocated\n{plan}");
    assert_eq!(plan.peak_reserved, memory::max_reserved(device).unwrap(), "{label}: peak reserved\n{plan}");
    plan
}
