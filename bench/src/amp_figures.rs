//! `amp.*`: the 784-512-512-10 MLP (mean cross entropy) under bf16 autocast
//! against f32, in one run.
//!
//! - `amp.saved_bytes_ratio`: bytes held by saved tensors at the end of
//!   forward (`Var::graph_stats().saved_bytes`), bf16 / f32, batch 4096.
//! - `amp.activation_peak_ratio`: peak allocated during forward + backward
//!   above the bytes allocated just before forward (parameters and input
//!   already exist), bf16 / f32, batch 4096.
//! - `amp.mlp_bf16_samples_per_s`: training steps (forward, backward, SGD
//!   with momentum) under bf16 autocast at batch 512, and
//!   `amp.bf16_vs_f32`: that throughput over the f32 one, measured
//!   alternately in the same run.

use crate::measure::{median, time, Better, Figure, Options};
use crate::nn_figures::mlp;
use brasa_amp::autocast;
use brasa_autograd::Var;
use brasa_nn::functional::cross_entropy;
use brasa_nn::optim::{Optimizer, Sgd, SgdConfig};
use brasa_nn::{Module, ModuleExt, Result, Sequential};
use brasa_tensor::{manual_seed, memory, DType, Device, Tensor};

const DEV: Device = Device::CPU;
const MEMORY_BATCH: usize = 4096;
const THROUGHPUT_BATCH: usize = 512;

pub fn run(options: &Options) -> Vec<Figure> {
    let mut figures = Vec::new();
    if ["amp.saved_bytes_ratio", "amp.activation_peak_ratio"].iter().any(|n| options.wants(n)) {
        match memory_figures(options) {
            Ok(found) => figures.extend(found.into_iter().filter(|f| options.wants(f.name))),
            Err(e) => eprintln!("  amp.saved_bytes_ratio / amp.activation_peak_ratio: {e}"),
        }
    }
    if ["amp.mlp_bf16_samples_per_s", "amp.bf16_vs_f32"].iter().any(|n| options.wants(n)) {
        match throughput_figures(options) {
            Ok(found) => figures.extend(found.into_iter().filter(|f| options.wants(f.name))),
            Err(e) => eprintln!("  amp.mlp_bf16_samples_per_s / amp.bf16_vs_f32: {e}"),
        }
    }
    figures
}

/// Synthetic inputs and class targets for `batch` samples.
fn batch_data(batch: usize) -> Result<(Var, Tensor)> {
    let x = Var::new(Tensor::randn_on([batch, 784], DType::F32, DEV)?);
    let y = Tensor::from_vec_on((0..batch).map(|i| (i * 7 % 10) as i64).collect::<Vec<_>>(), [batch], DEV)?;
    Ok((x, y))
}

/// The mean cross entropy of one forward, under autocast to `amp` if given.
fn forward_loss(model: &Sequential, x: &Var, y: &Tensor, amp: Option<DType>) -> Result<Var> {
    let _amp = amp.map(autocast);
    cross_entropy(&model.forward(x)?, y)
}

/// One step's memory: saved bytes at the end of forward, and the peak
/// above what was allocated before forward.
struct StepMemory {
    saved: usize,
    peak: usize,
}

fn memory_step(model: &Sequential, x: &Var, y: &Tensor, amp: Option<DType>) -> Result<StepMemory> {
    model.zero_grad()?;
    let base = memory::allocated(DEV)?;
    memory::reset_peak(DEV)?;
    let loss = forward_loss(model, x, y, amp)?;
    let saved = loss.graph_stats().saved_bytes;
    loss.backward()?;
    drop(loss);
    let peak = memory::max_allocated(DEV)?.saturating_sub(base);
    Ok(StepMemory { saved, peak })
}

fn memory_figures(options: &Options) -> Result<Vec<Figure>> {
    manual_seed(5);
    let model = mlp()?;
    let (x, y) = batch_data(MEMORY_BATCH)?;
    // Warm the allocator's cache both ways.
    memory_step(&model, &x, &y, None)?;
    memory_step(&model, &x, &y, Some(DType::BF16))?;
    let (mut saved, mut peak) = (Vec::new(), Vec::new());
    for _ in 0..options.reps(3, 1) {
        let f32_step = memory_step(&model, &x, &y, None)?;
        let bf16_step = memory_step(&model, &x, &y, Some(DType::BF16))?;
        eprintln!(
            "  batch {MEMORY_BATCH}: saved {:.1} MiB (f32) / {:.1} MiB (bf16); peak {:.1} MiB / {:.1} MiB",
            mib(f32_step.saved),
            mib(bf16_step.saved),
            mib(f32_step.peak),
            mib(bf16_step.peak)
        );
        saved.push(bf16_step.saved as f64 / f32_step.saved as f64);
        peak.push(bf16_step.peak as f64 / f32_step.peak as f64);
    }
    model.zero_grad()?;
    Ok(vec![
        Figure::new("amp.saved_bytes_ratio", median(&mut saved), "x", Better::Lower),
        Figure::new("amp.activation_peak_ratio", median(&mut peak), "x", Better::Lower),
    ])
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Seconds for `steps` training steps.
fn train_steps(
    model: &Sequential,
    opt: &mut Sgd,
    x: &Var,
    y: &Tensor,
    amp: Option<DType>,
    steps: usize,
) -> Result<f64> {
    let mut outcome: Result<()> = Ok(());
    let seconds = time(|| {
        outcome = (|| -> Result<()> {
            for _ in 0..steps {
                let loss = forward_loss(model, x, y, amp)?;
                loss.backward()?;
                opt.step()?;
                opt.zero_grad()?;
            }
            Ok(())
        })();
    });
    outcome?;
    Ok(seconds)
}

fn throughput_figures(options: &Options) -> Result<Vec<Figure>> {
    manual_seed(6);
    let (f32_model, bf16_model) = (mlp()?, mlp()?);
    let config = SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() };
    let mut f32_opt = Sgd::new(f32_model.parameters(), config)?;
    let mut bf16_opt = Sgd::new(bf16_model.parameters(), config)?;
    let (x, y) = batch_data(THROUGHPUT_BATCH)?;
    let steps = options.reps(20, 3);
    train_steps(&f32_model, &mut f32_opt, &x, &y, None, options.reps(5, 1))?;
    train_steps(&bf16_model, &mut bf16_opt, &x, &y, Some(DType::BF16), options.reps(5, 1))?;
    let (mut bf16_rates, mut ratios) = (Vec::new(), Vec::new());
    for _ in 0..options.reps(5, 1) {
        let f32_seconds = train_steps(&f32_model, &mut f32_opt, &x, &y, None, steps)?;
        let bf16_seconds = train_steps(&bf16_model, &mut bf16_opt, &x, &y, Some(DType::BF16), steps)?;
        let (f32_rate, bf16_rate) =
            ((THROUGHPUT_BATCH * steps) as f64 / f32_seconds, (THROUGHPUT_BATCH * steps) as f64 / bf16_seconds);
        eprintln!("  batch {THROUGHPUT_BATCH}: f32 {f32_rate:.0} samples/s, bf16 autocast {bf16_rate:.0} samples/s");
        bf16_rates.push(bf16_rate);
        ratios.push(bf16_rate / f32_rate);
    }
    Ok(vec![
        Figure::new("amp.mlp_bf16_samples_per_s", median(&mut bf16_rates), "samples/s", Better::Higher),
        Figure::new("amp.bf16_vs_f32", median(&mut ratios), "x", Better::Higher),
    ])
}
