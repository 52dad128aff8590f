//! Memory plans equal the runs they predict, to the byte: whole training
//! steps (forward, loss, backward, Adam) of the MLP, the CNN, a transformer
//! encoder layer, a checkpointed MLP and the MLP under bf16 autocast, each
//! at three batch sizes and under both allocator configurations, planned on
//! a meta device imitating a fresh logical host device and then run there.
//! And `max_batch_size` finds a batch that runs when the next one fails.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa::alloc::AllocatorConfig;
use brasa::autograd::checkpoint;
use brasa::nn::functional::cross_entropy;
use brasa::nn::optim::{Adam, AdamConfig, GradAccumulator, Optimizer};
use brasa::nn::{
    Conv2d, Conv2dConfig, Flatten, Linear, MaxPool2d, Module, ModuleExt, Relu, Sequential, TransformerEncoderLayer,
};
use brasa::prelude::*;
use brasa::tensor::memory::{category_scope, MemoryCategory};
use brasa::tensor::MemoryTarget;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

type Step = Box<dyn FnMut() -> brasa::nn::Result<()>>;
type Setup = fn(Device, usize) -> brasa::nn::Result<Step>;

const HOST_DEVICES: usize = 128;
static NEXT_DEVICE: AtomicUsize = AtomicUsize::new(1);
/// Autocast and the generator are process-wide: one model at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn fresh_host_device(limit: Option<usize>, config: AllocatorConfig) -> Device {
    brasa::tensor::set_host_device_count(HOST_DEVICES).unwrap();
    let index = NEXT_DEVICE.fetch_add(1, Ordering::Relaxed);
    assert!(index < HOST_DEVICES, "raise HOST_DEVICES");
    brasa::tensor::set_host_memory_limit(index, limit).unwrap();
    brasa::tensor::set_host_allocator_config(index, Some(config)).unwrap();
    Device::cpu(index)
}

/// A batch of `batch` rows of `features` and class ids below `classes`, counted as inputs.
fn batch_on(device: Device, batch: usize, features: &[usize], classes: usize) -> brasa::nn::Result<(Tensor, Tensor)> {
    let _input = category_scope(MemoryCategory::Input);
    let mut shape = vec![batch];
    shape.extend_from_slice(features);
    let x = Tensor::randn_on(shape, DType::F32, device)?;
    let ids: Vec<i64> = (0..batch as i64).map(|i| i % classes as i64).collect();
    Ok((x, Tensor::from_slice_on(&ids, [batch], device)?))
}

type Forward = Box<dyn Fn(&Var) -> brasa::nn::Result<Var>>;

/// forward, loss, backward, Adam step, zero_grad: the step every test plans.
fn training_step(parameters: Vec<Var>, forward: Forward, batch: (Tensor, Tensor)) -> brasa::nn::Result<Step> {
    let mut opt = Adam::new(parameters, AdamConfig { lr: 1e-3, ..Default::default() })?;
    Ok(Box::new(move || {
        let (x, y) = &batch;
        let logits = forward(&Var::new(x.clone()))?;
        let loss = cross_entropy(&logits, y)?;
        loss.backward()?;
        opt.step()?;
        opt.zero_grad()?;
        Ok(())
    }))
}

fn sequential(model: Sequential, batch: (Tensor, Tensor)) -> brasa::nn::Result<Step> {
    let parameters = model.parameters();
    training_step(parameters, Box::new(move |x| model.forward(x)), batch)
}

fn mlp_layers(device: Device) -> brasa::nn::Result<[Linear; 3]> {
    Ok([Linear::new(64, 256, device)?, Linear::new(256, 256, device)?, Linear::new(256, 10, device)?])
}

fn mlp(device: Device, batch: usize) -> brasa::nn::Result<Step> {
    let [a, b, head] = mlp_layers(device)?;
    let model = Sequential::new().push(a).push(Relu).push(b).push(Relu).push(head);
    sequential(model, batch_on(device, batch, &[64], 10)?)
}

fn cnn(device: Device, batch: usize) -> brasa::nn::Result<Step> {
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

fn encoder(device: Device, batch: usize) -> brasa::nn::Result<Step> {
    let model = Sequential::new()
        .push(TransformerEncoderLayer::new(64, 4, device)?)
        .push(Flatten::new())
        .push(Linear::new(16 * 64, 10, device)?);
    sequential(model, batch_on(device, batch, &[16, 64], 10)?)
}

fn checkpointed_mlp(device: Device, batch: usize) -> brasa::nn::Result<Step> {
    let [a, b, head] = mlp_layers(device)?;
    let parameters = [a.parameters(), b.parameters(), head.parameters()].concat();
    // The two hidden layers recomputed in backward; the head's input stored.
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

fn bf16_mlp(device: Device, batch: usize) -> brasa::nn::Result<Step> {
    let [a, b, head] = mlp_layers(device)?;
    let model = Sequential::new().push(a).push(Relu).push(b).push(Relu).push(head);
    let parameters = model.parameters();
    let forward = move |x: &Var| -> brasa::nn::Result<Var> {
        let _amp = autocast(DType::BF16);
        model.forward(x)
    };
    training_step(parameters, Box::new(forward), batch_on(device, batch, &[64], 10)?)
}

/// Four micro-batches of `batch / 4` under bf16 autocast and a GradScaler,
/// then one step: accumulation and loss scaling, planned.
fn accumulated_scaled_mlp(device: Device, batch: usize) -> brasa::nn::Result<Step> {
    let [a, b, head] = mlp_layers(device)?;
    let model = Sequential::new().push(a).push(Relu).push(b).push(Relu).push(head);
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

/// The plan of `setup` at `batch` for a fresh host device, then the real
/// run there: peaks equal to the byte, categories adding up.
fn plan_equals_run(what: &str, setup: Setup, batch: usize, expandable: bool) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let config = AllocatorConfig::builder().expandable_segments(expandable).build().unwrap();
    let host = fresh_host_device(None, config);
    let target = MemoryTarget::like(host).unwrap();
    manual_seed(7);
    let plan = memory::plan(&target, |device| setup(device, batch)).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(plan.fits, "{what}: {plan}");
    manual_seed(7);
    {
        let mut step = setup(host, batch).unwrap();
        for _ in 0..brasa::tensor::memory::PLANNED_STEPS {
            step().unwrap();
        }
    }
    let label = format!("{what}, batch {batch}, expandable segments {expandable}");
    assert_eq!(plan.peak_allocated, memory::max_allocated(host).unwrap(), "{label}: peak allocated\n{plan}");
    assert_eq!(plan.peak_reserved, memory::max_reserved(host).unwrap(), "{label}: peak reserved\n{plan}");
    let by_category: usize = plan.peak_by_category.iter().map(|(_, bytes)| bytes).sum();
    assert_eq!(by_category, plan.peak_allocated, "{label}: categories add up");
    let has = |c| plan.peak_by_category.iter().any(|&(category, _)| category == c);
    assert!(has(MemoryCategory::Parameter) && has(MemoryCategory::Input), "{label}: {plan}");
}

fn exact_for_every_size(what: &str, setup: Setup) {
    for batch in [4, 16, 64] {
        for expandable in [false, true] {
            plan_equals_run(what, setup, batch, expandable);
        }
    }
}

#[test]
fn mlp_plans_are_exact() {
    exact_for_every_size("MLP", mlp);
}

#[test]
fn cnn_plans_are_exact() {
    exact_for_every_size("CNN", cnn);
}

#[test]
fn encoder_plans_are_exact() {
    exact_for_every_size("transformer encoder", encoder);
}

#[test]
fn checkpointed_mlp_plans_are_exact() {
    exact_for_every_size("checkpointed MLP", checkpointed_mlp);
}

#[test]
fn bf16_autocast_mlp_plans_are_exact() {
    exact_for_every_size("MLP under bf16 autocast", bf16_mlp);
}

#[test]
fn accumulation_with_a_grad_scaler_plans_are_exact() {
    exact_for_every_size(
        "MLP, 4 accumulated micro-batches under bf16 autocast and a GradScaler",
        accumulated_scaled_mlp,
    );
}

#[test]
fn a_plan_names_the_allocation_that_would_fail() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let limit = 6 << 20;
    let host = fresh_host_device(Some(limit), AllocatorConfig::default());
    let plan = memory::plan(&MemoryTarget::like(host).unwrap(), |device| cnn(device, 512)).unwrap();
    assert!(!plan.fits);
    let failure = plan.failure.clone().expect("the failing allocation");
    // The real run fails asking for the same bytes.
    let real = (|| -> brasa::nn::Result<()> {
        let mut step = cnn(host, 512)?;
        step()?;
        step()
    })();
    let error = real.expect_err("the real step runs out of memory");
    let oom = brasa::alloc::find_out_of_memory(&error).expect("an out-of-memory error");
    assert_eq!(oom.requested_bytes, failure.requested, "{plan}");
    assert!(plan.to_string().contains("fits: NO"), "{plan}");
    assert!(plan.to_json().contains("\"failure\""));
}

#[test]
fn max_batch_size_finds_the_batch_that_fits() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let limit = 24 << 20;
    let host = fresh_host_device(Some(limit), AllocatorConfig::default());
    let search = memory::max_batch_size(host, 1 << 14, true, cnn).unwrap();
    assert!(search.batch > 1 && search.confirmed, "{search:?}");
    assert!(search.next_lacks.is_some_and(|lack| lack > 0), "{search:?}");
    // The next batch fails on the real device, where the found one ran.
    let next = search.next.expect("a next batch");
    let real = (|| -> brasa::nn::Result<()> {
        let mut step = cnn(host, next)?;
        step()?;
        step()
    })();
    assert!(real.is_err_and(|e| brasa::alloc::find_out_of_memory(&e).is_some()), "batch {next} should not fit");
}
