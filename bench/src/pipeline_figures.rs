//! `parallel.pipeline_*`: figures of `brasa-parallel`'s `Pipeline`, 2 stages
//! on logical host devices `cpu:0` and `cpu:1`, one thread each (a rayon
//! pool of 1 per stage, so the two stages use the machine's 2 cores and
//! ops do not add threads of their own), 8 micro-batches, 1F1B.
//!
//! The workload is an MLP of eight 512 → 512 Linear+ReLU blocks (plus a
//! 10-way head), cut in the middle by parameter bytes, trained with mean
//! cross entropy on a batch of 8 × 128 rows. No dropout, so the stages
//! draw no random numbers (`PipelineRng::Shared`: no lock between them).
//!
//! - `parallel.pipeline_bubble`: the measured idle share of the stages
//!   (from the per-stage timestamps of `Pipeline::report`: `1 − busy /
//!   wall`, mean over stages and over the measured steps).
//! - `parallel.pipeline_bubble_vs_theory`: that minus `(p − 1)/(m + p −
//!   1)` = 1/9 (target: within 0.03).
//! - `parallel.pipeline_1f1b_peak_ratio`: stage 0's activation peak (its
//!   device's peak allocated bytes during a step minus what was allocated
//!   when the step began; gradients already exist), 1F1B ÷ GPipe, same
//!   model and batch (theory 2/8; target ≤ 0.35).
//! - `parallel.pipeline_speedup`: samples/s of the 2-stage pipeline ÷
//!   samples/s of the unsplit model (whole batch, forward and backward) on
//!   one thread, measured in the same process one after the other (target
//!   ≥ 1.6).

use brasa_nn::functional::cross_entropy;
use brasa_nn::{Linear, Module, Relu, Sequential};
use brasa_parallel::ensure_host_devices;
use brasa_parallel::pipeline::{Partition, Pipeline, PipelineConfig, PipelineRng, Schedule};
use brasa_tensor::{manual_seed, DType, Device, Tensor};
use std::time::Instant;

const MICRO_BATCHES: usize = 8;
const ROWS: usize = 256;
const WIDTH: usize = 512;
const BLOCKS: usize = 8;

fn text(e: &dyn std::fmt::Display) -> String {
    e.to_string()
}

fn model(device: Device) -> Result<Sequential, String> {
    let mut model = Sequential::new();
    for _ in 0..BLOCKS {
        model = model.push(Linear::new(WIDTH, WIDTH, device).map_err(|e| text(&e))?).push(Relu);
    }
    Ok(model.push(Linear::new(WIDTH, 10, device).map_err(|e| text(&e))?))
}

fn batch() -> Result<(Tensor, Tensor), String> {
    ensure_host_devices(2).map_err(|e| text(&e))?;
    let rows = MICRO_BATCHES * ROWS;
    let x = Tensor::randn_on([rows, WIDTH], DType::F32, Device::cpu(0)).map_err(|e| text(&e))?;
    let labels: Vec<i64> = (0..rows).map(|i| ((i * 7) % 10) as i64).collect();
    let y = Tensor::from_vec_on(labels, [rows], Device::cpu(0)).map_err(|e| text(&e))?;
    Ok((x, y))
}

fn pipeline(schedule: Schedule) -> Result<Pipeline, String> {
    ensure_host_devices(2).map_err(|e| text(&e))?;
    manual_seed(0);
    let config = PipelineConfig::new(Partition::ParameterBytes { stages: 2 }, MICRO_BATCHES)
        .schedule(schedule)
        .rng(PipelineRng::Shared)
        .threads_per_stage(1);
    Pipeline::new(model(Device::cpu(0))?, cross_entropy, config).map_err(|e| text(&e))
}

fn steps(quick: bool) -> usize {
    if quick {
        3
    } else {
        12
    }
}

/// The mean measured bubble over the steps after a warm-up step.
fn measured_bubble(quick: bool) -> Result<f64, String> {
    let mut pipe = pipeline(Schedule::OneFOneB)?;
    let (x, y) = batch()?;
    pipe.step(&x, &y).map_err(|e| text(&e))?;
    let mut bubbles = Vec::new();
    for _ in 0..steps(quick) {
        pipe.step(&x, &y).map_err(|e| text(&e))?;
        let report = pipe.report().ok_or("no report")?;
        bubbles.push(report.bubble());
    }
    if let Some(report) = pipe.report() {
        eprintln!("  last step:\n{report}");
    }
    bubbles.sort_by(f64::total_cmp);
    // The median: one step disturbed by another process says little.
    Ok(bubbles[bubbles.len() / 2])
}

pub fn pipeline_bubble(quick: bool) -> Result<f64, String> {
    measured_bubble(quick)
}

pub fn pipeline_bubble_vs_theory(quick: bool) -> Result<f64, String> {
    Ok(measured_bubble(quick)? - Schedule::ideal_bubble(2, MICRO_BATCHES))
}

fn stage0_activation_peak(schedule: Schedule) -> Result<usize, String> {
    let mut pipe = pipeline(schedule)?;
    let (x, y) = batch()?;
    pipe.step(&x, &y).map_err(|e| text(&e))?; // gradients exist from here on
    let mut peak = 0;
    for _ in 0..2 {
        pipe.step(&x, &y).map_err(|e| text(&e))?;
        peak = peak.max(pipe.report().ok_or("no report")?.stages[0].activation_peak_bytes);
    }
    Ok(peak)
}

pub fn pipeline_1f1b_peak_ratio(_quick: bool) -> Result<f64, String> {
    let ofob = stage0_activation_peak(Schedule::OneFOneB)?;
    let gpipe = stage0_activation_peak(Schedule::GPipe)?;
    eprintln!("  stage 0 activation peak: 1F1B {ofob} B, GPipe {gpipe} B");
    if gpipe == 0 {
        return Err("GPipe's stage 0 allocated nothing".into());
    }
    Ok(ofob as f64 / gpipe as f64)
}

pub fn pipeline_speedup(quick: bool) -> Result<f64, String> {
    let (x, y) = batch()?;
    let samples = (steps(quick) * x.dims()[0]) as f64;
    // The unsplit model on one thread: a rayon pool of 1 around everything.
    let single = rayon::ThreadPoolBuilder::new().num_threads(1).build().map_err(|e| text(&e))?;
    let unsplit = single.install(|| -> Result<f64, String> {
        manual_seed(0);
        let model = model(Device::cpu(0))?;
        let run = || -> Result<(), String> {
            let out = model.forward(&brasa_autograd::Var::new(x.clone())).map_err(|e| text(&e))?;
            cross_entropy(&out, &y).map_err(|e| text(&e))?.backward().map_err(|e| text(&e))?;
            Ok(())
        };
        run()?;
        let start = Instant::now();
        for _ in 0..steps(quick) {
            run()?;
        }
        Ok(samples / start.elapsed().as_secs_f64())
    })?;
    let mut pipe = pipeline(Schedule::OneFOneB)?;
    pipe.step(&x, &y).map_err(|e| text(&e))?;
    let start = Instant::now();
    for _ in 0..steps(quick) {
        pipe.step(&x, &y).map_err(|e| text(&e))?;
    }
    let piped = samples / start.elapsed().as_secs_f64();
    eprintln!("  samples/s: unsplit on 1 thread {unsplit:.0}, 2-stage pipeline {piped:.0}");
    Ok(piped / unsplit)
}
