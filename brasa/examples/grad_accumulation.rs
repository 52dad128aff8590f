//! Gradient accumulation as a memory technique: the same MLP, the same data
//! and the same optimizer, trained once with batches of `B` and once with `k`
//! micro-batches of `B/k` through [`GradAccumulator`]. The updates are the
//! same (up to f32 rounding); the peak memory is not, because only one
//! micro-batch's activations are alive at a time.
//!
//! ```text
//! cargo run --release --example grad_accumulation
//! ```
//!
//! The runs use their own logical host device, `cpu:1`, so its allocator
//! counts only this model's tensors: the peaks are exact byte counts of what
//! was alive, not estimates. The parameters, their gradients and the
//! momentum buffers (7 MiB each here) are the same in both runs; what differs
//! is the activations saved for backward (`B × 1024` floats per layer).

use brasa::alloc::format_size;
use brasa::prelude::*;
use std::time::Instant;

type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const BATCH: usize = 2048;
const MICRO_BATCHES: usize = 8;
const STEPS: usize = 3;
/// Largest acceptable difference between the two runs' parameters (f32).
const TOLERANCE: f32 = 1e-5;

/// 784-1024-1024-10: activations (`BATCH × 1024` per hidden layer) outweigh
/// the 1.8 M parameters.
fn mlp(dev: Device) -> brasa::nn::Result<Sequential> {
    Ok(Sequential::new()
        .push(Linear::new(784, 1024, dev)?)
        .push(Relu)
        .push(Linear::new(1024, 1024, dev)?)
        .push(Relu)
        .push(Linear::new(1024, 10, dev)?))
}

struct Run {
    /// Peak of allocated bytes during training, above what was allocated before it.
    peak_above_baseline: usize,
    /// Allocated before training: parameters and data.
    baseline: usize,
    losses: Vec<f64>,
    seconds: f64,
    initial: Vec<Vec<f32>>,
    trained: Vec<Vec<f32>>,
}

/// `STEPS` optimizer steps on `(x, y)`, each from `k` micro-batches.
fn train(k: usize, x: &Tensor, y: &Tensor, dev: Device) -> AnyResult<Run> {
    manual_seed(1); // both runs start from the same weights
    let model = mlp(dev)?;
    let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() })?;
    let mut accumulate = GradAccumulator::new(k)?;
    let snapshot = |model: &Sequential| -> AnyResult<Vec<Vec<f32>>> {
        Ok(model.parameters().iter().map(|p| p.tensor().to_vec::<f32>()).collect::<Result<_, _>>()?)
    };
    let initial = snapshot(&model)?;

    let baseline = memory::allocated(dev)?;
    memory::reset_peak(dev)?;
    let started = Instant::now();
    let micro = x.dims()[0] / k;
    let mut losses = Vec::new();
    for _ in 0..STEPS {
        let mut step_loss = 0.0;
        for j in 0..k {
            // Views of the big batch: no copy.
            let (xb, yb) = (x.narrow(0, j * micro, micro)?, y.narrow(0, j * micro, micro)?);
            let loss = cross_entropy(&model.forward(&Var::new(xb))?, &yb)?;
            accumulate.backward(&loss)?; // backward of loss / k: gradients add up in .grad
            step_loss += loss.item()? / k as f64;
        }
        assert!(accumulate.step(&mut opt)?, "k micro-batches make one step");
        losses.push(step_loss);
    }
    let seconds = started.elapsed().as_secs_f64();
    let peak_above_baseline = memory::max_allocated(dev)? - baseline;
    Ok(Run { peak_above_baseline, baseline, losses, seconds, initial, trained: snapshot(&model)? })
}

/// Bytes of the (f32) parameters.
fn param_bytes(run: &Run) -> usize {
    run.initial.iter().map(|p| p.len() * std::mem::size_of::<f32>()).sum()
}

fn max_abs_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter().flatten().zip(b.iter().flatten()).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn main() -> AnyResult<()> {
    // Two logical host devices: cpu:0 for anything else, cpu:1 for this model alone.
    brasa::tensor::set_host_device_count(2)?;
    let dev = Device::cpu(1);

    // Synthetic data: the label is the position of the largest of the first ten features.
    manual_seed(0);
    let x = Tensor::randn_on([BATCH, 784], DType::F32, dev)?;
    let y = x.narrow(1, 0, 10)?.argmax(&[-1], false)?;

    println!(
        "MLP 784-1024-1024-10, f32, SGD (lr 0.05, momentum 0.9), {STEPS} steps of an effective batch of {BATCH}, on {dev}"
    );
    let whole = train(1, &x, &y, dev)?;
    let split = train(MICRO_BATCHES, &x, &y, dev)?;
    println!("baseline (parameters + data): {}", format_size(whole.baseline));
    let state_bytes = param_bytes(&whole);
    println!("in both runs: gradients {0} + momentum buffers {0}", format_size(state_bytes));
    for (label, run) in [
        (format!("1 batch of {BATCH}"), &whole),
        (format!("{MICRO_BATCHES} micro-batches of {}", BATCH / MICRO_BATCHES), &split),
    ] {
        let losses: Vec<String> = run.losses.iter().map(|l| format!("{l:.4}")).collect();
        println!(
            "{label:<24} peak above baseline {:>10}   {:.2} s   losses [{}]",
            format_size(run.peak_above_baseline),
            run.seconds,
            losses.join(", ")
        );
    }
    println!(
        "peak memory with accumulation: {:.1}% of the single batch's ({} saved)",
        100.0 * split.peak_above_baseline as f64 / whole.peak_above_baseline as f64,
        format_size(whole.peak_above_baseline.saturating_sub(split.peak_above_baseline))
    );

    assert_eq!(max_abs_diff(&whole.initial, &split.initial), 0.0, "same starting weights");
    let update = max_abs_diff(&whole.trained, &whole.initial);
    let diff = max_abs_diff(&whole.trained, &split.trained);
    println!("largest parameter change over training: {update:.3e}");
    println!(
        "largest difference between the two runs' parameters: {diff:.3e} (tolerance {TOLERANCE:.0e}): {}",
        if diff <= TOLERANCE { "same updates" } else { "DIFFERENT" }
    );
    if diff > TOLERANCE {
        return Err(format!("the runs disagree by {diff:.3e} > {TOLERANCE:.0e}").into());
    }
    Ok(())
}
