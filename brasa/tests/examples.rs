//! The claims the examples make, as tests: the digits MLP of `train_digits`
//! learns the task, gradient accumulation lowers the peak memory without
//! changing the update, and checkpointing lowers the peak without changing
//! the gradients.
//!
//! The tests of this binary run in parallel in one process, so each one works
//! on its own logical host device (`cpu:1`, `cpu:2`, `cpu:3`; every test sets
//! the same count first) and the memory numbers of one are not disturbed by
//! the others. For the same reason nothing here draws from the process-wide
//! random generator (a parallel test could draw in between): weights and data
//! come from local [`Generator`]s, so every run computes the same numbers.

use brasa::autograd::Layer;
use brasa::nn::data::{DataLoader, Digits, TensorDataset};
use brasa::prelude::*;
use brasa::tensor::Generator;
use std::sync::Arc;

type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Logical host device `index`, out of the four this binary configures.
fn device(index: usize) -> TestResult<Device> {
    brasa::tensor::set_host_device_count(4)?;
    Ok(Device::cpu(index))
}

/// An f32 tensor of `U(−bound, bound)` samples from `generator`.
fn uniform(generator: &mut Generator, dims: &[usize], bound: f32, dev: Device) -> TestResult<Tensor> {
    let mut values = vec![0f32; dims.iter().product()];
    generator.fill_uniform_f32(&mut values, -bound, bound)?;
    Ok(Tensor::from_vec_on(values, dims, dev)?)
}

/// An f32 tensor of standard normal samples from `generator`.
fn normal(generator: &mut Generator, dims: &[usize], dev: Device) -> TestResult<Tensor> {
    let mut values = vec![0f32; dims.iter().product()];
    generator.fill_normal_f32(&mut values, 0.0, 1.0)?;
    Ok(Tensor::from_vec_on(values, dims, dev)?)
}

/// A `Linear` initialised as PyTorch does (weight and bias from `U(±1/√in)`),
/// but from `generator` rather than the process-wide generator.
fn linear(generator: &mut Generator, in_features: usize, out_features: usize, dev: Device) -> TestResult<Linear> {
    let bound = 1.0 / (in_features as f32).sqrt();
    Ok(Linear {
        weight: Var::param(uniform(generator, &[out_features, in_features], bound, dev)?)?,
        bias: Some(Var::param(uniform(generator, &[out_features], bound, dev)?)?),
    })
}

/// `widths[0] → widths[1] → … → widths[n]`, with ReLU between the linears.
fn mlp(seed: u64, widths: &[usize], dev: Device) -> TestResult<Sequential> {
    let mut generator = Generator::new(seed);
    let mut model = Sequential::new();
    for (i, pair) in widths.windows(2).enumerate() {
        if i > 0 {
            model = model.push(Relu);
        }
        model = model.push(linear(&mut generator, pair[0], pair[1], dev)?);
    }
    Ok(model)
}

/// Every parameter's values, in order.
fn values(params: &[Var]) -> TestResult<Vec<Vec<f32>>> {
    Ok(params.iter().map(|p| p.tensor().to_vec::<f32>()).collect::<Result<_, _>>()?)
}

fn max_abs_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .flat_map(|(a, b)| {
            assert_eq!(a.len(), b.len());
            a.iter().zip(b).map(|(x, y)| (x - y).abs())
        })
        .fold(0.0, f32::max)
}

/// Accuracy on a whole dataset, without a graph.
fn accuracy(model: &Sequential, data: &TensorDataset, dev: Device) -> TestResult<f64> {
    let _no_grad = no_grad();
    let logits = model.forward(&Var::new(data.features().to(dev)?))?;
    let predicted = logits.tensor().argmax(&[-1], false)?;
    let correct = predicted.eq(&data.labels().to(dev)?)?.to_dtype(DType::F64)?.sum_all()?.item::<f64>()?;
    Ok(correct / data.len() as f64)
}

/// `train_digits`'s default model and recipe: MLP 64-128-10, Adam (lr 2e-3),
/// batches of 32, the fixed 80/20 split.
#[test]
fn digits_mlp_reaches_95_percent() -> TestResult {
    const EPOCHS: usize = 15;
    let dev = device(1)?;
    let (train, test) = Digits::load()?.train_test()?;
    let model = mlp(0, &[64, 128, 10], dev)?;
    let mut opt = Adam::new(model.parameters(), AdamConfig { lr: 2e-3, ..Default::default() })?;
    let loader = DataLoader::builder(train).batch_size(32).shuffle(true).seed(0).device(dev).build()?;
    for epoch in 0..EPOCHS {
        for batch in loader.epoch(epoch as u64) {
            let (x, y) = batch?;
            cross_entropy(&model.forward(&Var::new(x))?, &y)?.backward()?;
            opt.step()?;
            opt.zero_grad()?;
        }
    }
    let test_accuracy = accuracy(&model, &test, dev)?;
    assert!(test_accuracy >= 0.95, "test accuracy {test_accuracy:.4} after {EPOCHS} epochs, expected ≥ 0.95");
    Ok(())
}

/// What one run of [`train_accumulating`] observed.
struct AccumulationRun {
    peak_above_baseline: usize,
    initial: Vec<Vec<f32>>,
    trained: Vec<Vec<f32>>,
}

/// Two SGD steps on `(x, y)`, each from `k` micro-batches, with a fresh
/// model of fixed initial weights.
fn train_accumulating(k: usize, x: &Tensor, y: &Tensor, dev: Device) -> TestResult<AccumulationRun> {
    let model = mlp(1, &[64, 256, 256, 10], dev)?;
    let params = model.parameters();
    let initial = values(&params)?;
    let mut opt = Sgd::new(params.clone(), SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() })?;
    let mut accumulate = GradAccumulator::new(k)?;
    let baseline = memory::allocated(dev)?;
    memory::reset_peak(dev)?;
    let micro = x.dims()[0] / k;
    for _ in 0..2 {
        for j in 0..k {
            let (xb, yb) = (x.narrow(0, j * micro, micro)?, y.narrow(0, j * micro, micro)?);
            accumulate.backward(&cross_entropy(&model.forward(&Var::new(xb))?, &yb)?)?;
        }
        assert!(accumulate.step(&mut opt)?, "{k} micro-batches make a step");
    }
    let peak_above_baseline = memory::max_allocated(dev)? - baseline;
    Ok(AccumulationRun { peak_above_baseline, initial, trained: values(&params)? })
}

#[test]
fn grad_accumulation_lowers_the_peak_and_keeps_the_update() -> TestResult {
    const BATCH: usize = 1024;
    const K: usize = 8;
    let dev = device(2)?;
    let x = normal(&mut Generator::new(2), &[BATCH, 64], dev)?;
    let y = x.narrow(1, 0, 10)?.argmax(&[-1], false)?;

    let whole = train_accumulating(1, &x, &y, dev)?;
    let split = train_accumulating(K, &x, &y, dev)?;
    assert_eq!(max_abs_diff(&whole.initial, &split.initial), 0.0, "both runs start from the same weights");
    assert!(max_abs_diff(&whole.trained, &whole.initial) > 1e-3, "the steps changed the parameters");
    let diff = max_abs_diff(&whole.trained, &split.trained);
    assert!(diff <= 1e-5, "{K} micro-batches of {} and one batch of {BATCH} disagree by {diff:e}", BATCH / K);
    assert!(
        split.peak_above_baseline < whole.peak_above_baseline,
        "peak with {K} micro-batches {} B, with one batch {} B",
        split.peak_above_baseline,
        whole.peak_above_baseline
    );
    // The activations of 1,024 samples (1 MiB per hidden layer) dwarf the
    // parameter-sized state (gradients, momentum: 330 KiB each).
    assert!(
        split.peak_above_baseline * 2 < whole.peak_above_baseline,
        "accumulation should at least halve the peak: {} B vs {} B",
        split.peak_above_baseline,
        whole.peak_above_baseline
    );
    Ok(())
}

/// What one step of [`checkpoint_step`] observed.
struct CheckpointStep {
    peak_above_baseline: usize,
    saved_bytes: usize,
    loss: f64,
    grads: Vec<Vec<f32>>,
}

fn checkpoint_step(
    blocks: &[Layer],
    head: &Linear,
    params: &[Var],
    x: &Var,
    y: &Tensor,
    segments: Option<usize>,
) -> TestResult<CheckpointStep> {
    let dev = x.device();
    let baseline = memory::allocated(dev)?;
    memory::reset_peak(dev)?;
    let features = match segments {
        Some(segments) => checkpoint_sequential(blocks, segments, x)?,
        None => blocks.iter().try_fold(x.clone(), |h, block| block(&h))?,
    };
    let loss = cross_entropy(&head.forward(&features)?, y)?;
    drop(features);
    // Per graph, not the process-wide `saved_tensor_bytes`: other tests run alongside.
    let saved_bytes = loss.graph_stats().saved_bytes;
    loss.backward()?;
    let peak_above_baseline = memory::max_allocated(dev)? - baseline;
    let grads = params
        .iter()
        .map(|p| Ok(p.grad().ok_or("a parameter got no gradient")?.to_vec::<f32>()?))
        .collect::<TestResult<Vec<_>>>()?;
    for p in params {
        p.zero_grad(true)?;
    }
    Ok(CheckpointStep { peak_above_baseline, saved_bytes, loss: loss.item()?, grads })
}

#[test]
fn checkpointing_lowers_the_peak_and_keeps_the_gradients() -> TestResult {
    const DEPTH: usize = 8;
    const WIDTH: usize = 128;
    const BATCH: usize = 512;
    let dev = device(3)?;
    let mut generator = Generator::new(3);
    let linears = (0..DEPTH).map(|_| linear(&mut generator, WIDTH, WIDTH, dev)).collect::<TestResult<Vec<_>>>()?;
    let blocks: Vec<Layer> = linears
        .iter()
        .map(|l| {
            let (w, b) = (l.weight.clone(), l.bias.clone());
            Arc::new(move |x: &Var| x.linear(&w, b.as_ref())?.relu()) as Layer
        })
        .collect();
    let head = linear(&mut generator, WIDTH, 10, dev)?;
    let params: Vec<Var> = linears.iter().flat_map(|l| l.parameters()).chain(head.parameters()).collect();
    let x = Var::new(normal(&mut generator, &[BATCH, WIDTH], dev)?);
    let y = x.tensor().narrow(1, 0, 10)?.argmax(&[-1], false)?;

    let plain = checkpoint_step(&blocks, &head, &params, &x, &y, None)?;
    let ckpt = checkpoint_step(&blocks, &head, &params, &x, &y, Some(3))?; // ≈ √8 segments
    assert!((plain.loss - ckpt.loss).abs() <= 1e-6, "losses {} and {} differ", plain.loss, ckpt.loss);
    let diff = max_abs_diff(&plain.grads, &ckpt.grads);
    assert!(diff <= 1e-6, "checkpointed gradients differ by {diff:e}");
    assert!(
        ckpt.saved_bytes < plain.saved_bytes,
        "saved after forward: {} B checkpointed, {} B plain",
        ckpt.saved_bytes,
        plain.saved_bytes
    );
    assert!(
        ckpt.peak_above_baseline < plain.peak_above_baseline,
        "peak: {} B checkpointed, {} B plain",
        ckpt.peak_above_baseline,
        plain.peak_above_baseline
    );
    Ok(())
}
