//! `autograd.*`: gradient checkpointing against a plain step on a deep MLP,
//! and the engine's overhead over the tensor kernels a backward runs.

use crate::measure::{median, time, Better, Figure, Options};
use brasa_autograd::{checkpoint_sequential, no_grad, Layer, Var};
use brasa_tensor::{manual_seed, memory, DType, Device, Tensor};
use std::hint::black_box;
use std::sync::Arc;

const DEV: Device = Device::CPU;

pub fn run(options: &Options) -> Vec<Figure> {
    let mut figures = Vec::new();
    let wants_checkpoint =
        ["autograd.checkpoint_saved_ratio", "autograd.checkpoint_peak_ratio", "autograd.checkpoint_time_ratio"]
            .iter()
            .any(|name| options.wants(name));
    if wants_checkpoint {
        match checkpoint_figures(options) {
            Ok(found) => figures.extend(found.into_iter().filter(|f| options.wants(f.name))),
            Err(e) => eprintln!("  autograd.checkpoint_*: {e}"),
        }
    }
    if options.wants("autograd.backward_overhead") {
        match backward_overhead(options) {
            Ok(figure) => figures.push(figure),
            Err(e) => eprintln!("  autograd.backward_overhead: {e}"),
        }
    }
    figures
}

type Result<T> = brasa_autograd::Result<T>;

fn linear_params(fan_in: usize, fan_out: usize) -> Result<(Var, Var)> {
    let scale = (1.0 / fan_in as f64).sqrt();
    let w = Tensor::randn_on([fan_out, fan_in], DType::F32, DEV)?.mul_scalar(scale)?;
    let b = Tensor::zeros_on([fan_out], DType::F32, DEV)?;
    Ok((Var::param(w)?, Var::param(b)?))
}

/// One training step's measurements: saved bytes at the end of forward,
/// peak above the bytes allocated just before forward, and time.
struct Step {
    saved: usize,
    peak: usize,
    seconds: f64,
}

fn step(layers: &[Layer], params: &[Var], x: &Var, segments: Option<usize>) -> Result<Step> {
    for p in params {
        p.zero_grad(true)?;
    }
    let base = memory::allocated(DEV)?;
    memory::reset_peak(DEV)?;
    let mut saved = 0;
    let mut outcome = Ok(());
    let seconds = time(|| {
        outcome = (|| {
            let y = match segments {
                Some(s) => checkpoint_sequential(layers, s, x)?,
                None => layers.iter().try_fold(x.clone(), |h, l| l(&h))?,
            };
            let loss = y.mean_all()?;
            saved = loss.graph_stats().saved_bytes;
            loss.backward()
        })();
    });
    outcome?;
    let peak = memory::max_allocated(DEV)?.saturating_sub(base);
    Ok(Step { saved, peak, seconds })
}

/// A 32-layer MLP (width 512, ReLU, batch 1024), one step with
/// `checkpoint_sequential` at √n segments against one without.
fn checkpoint_figures(options: &Options) -> Result<Vec<Figure>> {
    const DEPTH: usize = 32;
    const WIDTH: usize = 512;
    manual_seed(0);
    let mut params = Vec::new();
    let mut layers: Vec<Layer> = Vec::new();
    for _ in 0..DEPTH {
        let (w, b) = linear_params(WIDTH, WIDTH)?;
        params.extend([w.clone(), b.clone()]);
        layers.push(Arc::new(move |x: &Var| x.linear(&w, Some(&b))?.relu()));
    }
    let x = Var::new(Tensor::randn_on([1024, WIDTH], DType::F32, DEV)?);
    let segments = (DEPTH as f64).sqrt().round() as usize;
    // Warm the allocator's cache and the kernels once each way.
    step(&layers, &params, &x, None)?;
    step(&layers, &params, &x, Some(segments))?;
    let (mut saved, mut peak, mut times) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..options.reps(5, 1) {
        let plain = step(&layers, &params, &x, None)?;
        let ckpt = step(&layers, &params, &x, Some(segments))?;
        saved.push(ckpt.saved as f64 / plain.saved as f64);
        peak.push(ckpt.peak as f64 / plain.peak as f64);
        times.push(ckpt.seconds / plain.seconds);
    }
    Ok(vec![
        Figure::new("autograd.checkpoint_saved_ratio", median(&mut saved), "x", Better::Lower),
        Figure::new("autograd.checkpoint_peak_ratio", median(&mut peak), "x", Better::Lower),
        Figure::new("autograd.checkpoint_time_ratio", median(&mut times), "x", Better::Lower),
    ])
}

/// Backward of the 784-512-512-10 MLP at batch 128 through the engine,
/// divided by the same backward's tensor ops run directly.
fn backward_overhead(options: &Options) -> Result<Figure> {
    manual_seed(1);
    let dims = [784usize, 512, 512, 10];
    let layers: Vec<(Var, Var)> = dims.windows(2).map(|d| linear_params(d[0], d[1])).collect::<Result<_>>()?;
    let x = Var::new(Tensor::randn_on([128, 784], DType::F32, DEV)?);
    let forward = || -> Result<Var> {
        let mut h = x.clone();
        for (i, (w, b)) in layers.iter().enumerate() {
            h = h.linear(w, Some(b))?;
            if i + 1 < layers.len() {
                h = h.relu()?;
            }
        }
        h.mean_all()
    };
    let engine = || -> Result<f64> {
        for (w, b) in &layers {
            w.zero_grad(true)?;
            b.zero_grad(true)?;
        }
        let loss = forward()?;
        let mut outcome = Ok(());
        let seconds = time(|| outcome = loss.backward());
        outcome?;
        Ok(seconds)
    };
    // The same kernels by hand: mean's broadcast, then per layer (last
    // first) ReLU mask, bias sum, weight product `gᵀ·x` and, except for the
    // first layer whose input needs no gradient, the input product `g·W`.
    let manual = || -> Result<f64> {
        let _g = no_grad();
        let mut acts = vec![x.tensor().clone()];
        for (i, (w, b)) in layers.iter().enumerate() {
            let mut h = acts[i].matmul(&w.tensor().t()?)?.add(b.tensor())?;
            if i + 1 < layers.len() {
                h = h.relu()?;
            }
            acts.push(h);
        }
        let out = acts.last().map(|t| t.dims().to_vec()).unwrap_or_default();
        let seconds = time(|| {
            let result = (|| -> brasa_tensor::Result<()> {
                let ones = Tensor::ones_on([], DType::F32, DEV)?;
                let mut g = ones.div_scalar((out[0] * out[1]) as f64)?.reshape(&[1, 1])?.broadcast_as(out.clone())?;
                for i in (0..layers.len()).rev() {
                    if i + 1 < layers.len() {
                        g = g.mul(&acts[i + 1].gt_scalar(0.0)?.to_dtype(DType::F32)?)?;
                    }
                    let gb = g.sum(&[0], false)?;
                    let gw = g.t()?.matmul(&acts[i])?;
                    black_box((gb, gw));
                    if i == 0 {
                        break;
                    }
                    g = g.matmul(layers[i].0.tensor())?;
                }
                black_box(g);
                Ok(())
            })();
            black_box(result.is_ok());
        });
        Ok(seconds)
    };
    engine()?;
    manual()?;
    let mut ratios = Vec::new();
    for _ in 0..options.reps(21, 3) {
        let e = engine()?;
        let m = manual()?;
        ratios.push(e / m);
    }
    Ok(Figure::new("autograd.backward_overhead", median(&mut ratios), "x", Better::Lower))
}
