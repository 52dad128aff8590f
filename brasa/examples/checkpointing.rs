//! Gradient checkpointing: a deep MLP takes one training step with and
//! without [`checkpoint_sequential`] (√n segments). Checkpointed segments keep
//! only their input during forward and run again during backward, so the
//! activations saved for backward, and with them the peak memory, shrink,
//! for about one extra forward pass of compute. The gradients are the same.
//!
//! ```text
//! cargo run --release --example checkpointing
//! ```
//!
//! The model is 24 blocks of `Linear(512, 512) + ReLU` and a linear head, on a
//! batch of 2,048: activations (`2048 × 512` floats per block) outweigh the
//! weights and their gradients, as in most deep networks trained on large
//! batches. (When weight gradients dominate, e.g. width 1024 on a batch of
//! 512, the peak comes at the end of backward, when all gradients exist, and
//! no checkpointing can lower it.) The runs use their own logical host
//! device, `cpu:1`, so its allocator counts only this model's tensors.

use brasa::alloc::format_size;
use brasa::autograd::Layer;
use brasa::prelude::*;
use std::sync::Arc;
use std::time::Instant;

type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const DEPTH: usize = 24;
const WIDTH: usize = 512;
const BATCH: usize = 2048;
const CLASSES: usize = 10;

struct Step {
    /// Peak allocated bytes during forward and backward, above what was allocated before forward.
    peak_above_baseline: usize,
    /// Allocated above the baseline when forward is done: the activations kept for backward.
    after_forward: usize,
    /// Bytes that the graph's saved tensors hold when forward is done (the
    /// activations, plus the input and the weights that the linears keep).
    saved_bytes: usize,
    forward_s: f64,
    backward_s: f64,
    loss: f64,
    grads: Vec<Vec<f32>>,
}

/// One forward and backward; `segments: None` runs the blocks plainly.
fn step(
    blocks: &[Layer],
    head: &Linear,
    params: &[Var],
    x: &Var,
    y: &Tensor,
    segments: Option<usize>,
) -> AnyResult<Step> {
    let dev = x.device();
    let baseline = memory::allocated(dev)?;
    memory::reset_peak(dev)?;

    let started = Instant::now();
    let features = match segments {
        Some(segments) => checkpoint_sequential(blocks, segments, x)?,
        None => blocks.iter().try_fold(x.clone(), |h, block| block(&h))?,
    };
    let loss = cross_entropy(&head.forward(&features)?, y)?;
    drop(features); // the graph keeps what backward needs
    let forward_s = started.elapsed().as_secs_f64();
    let saved_bytes = loss.graph_stats().saved_bytes;
    let after_forward = memory::allocated(dev)? - baseline;

    let started = Instant::now();
    loss.backward()?;
    let backward_s = started.elapsed().as_secs_f64();
    let peak_above_baseline = memory::max_allocated(dev)? - baseline;

    let grads = params
        .iter()
        .map(|p| p.grad().ok_or("a parameter got no gradient")?.to_vec::<f32>().map_err(Into::into))
        .collect::<AnyResult<Vec<_>>>()?;
    for p in params {
        p.zero_grad(true)?;
    }
    Ok(Step { peak_above_baseline, after_forward, saved_bytes, forward_s, backward_s, loss: loss.item()?, grads })
}

/// How to print one quantity of a [`Step`] (a row of the comparison table).
type Quantity = fn(&Step) -> String;

fn main() -> AnyResult<()> {
    // Two logical host devices: cpu:0 for anything else, cpu:1 for this model alone.
    brasa::tensor::set_host_device_count(2)?;
    let dev = Device::cpu(1);
    manual_seed(0);

    // The blocks as the closures checkpoint_sequential takes; each holds
    // (shared handles to) its layer's parameters.
    let linears = (0..DEPTH).map(|_| Linear::new(WIDTH, WIDTH, dev)).collect::<brasa::nn::Result<Vec<_>>>()?;
    let blocks: Vec<Layer> = linears
        .iter()
        .map(|l| {
            let (w, b) = (l.weight.clone(), l.bias.clone());
            Arc::new(move |x: &Var| x.linear(&w, b.as_ref())?.relu()) as Layer
        })
        .collect();
    let head = Linear::new(WIDTH, CLASSES, dev)?;
    let params: Vec<Var> = linears.iter().flat_map(|l| l.parameters()).chain(head.parameters()).collect();

    let x = Var::new(Tensor::randn_on([BATCH, WIDTH], DType::F32, dev)?);
    let y = x.tensor().narrow(1, 0, CLASSES)?.argmax(&[-1], false)?;
    let segments = (DEPTH as f64).sqrt().round() as usize;

    println!(
        "MLP of {DEPTH} x (Linear {WIDTH}->{WIDTH} + ReLU) + Linear {WIDTH}->{CLASSES}, batch {BATCH}, f32, on {dev}: {} \
         of parameters",
        format_size(params.iter().map(|p| p.numel() * 4).sum())
    );
    step(&blocks, &head, &params, &x, &y, None)?; // warm-up: the allocator's cache fills once

    let plain = step(&blocks, &head, &params, &x, &y, None)?;
    let ckpt = step(&blocks, &head, &params, &x, &y, Some(segments))?;
    let ckpt_label = format!("checkpoint_sequential({segments})");
    println!("{:<40} {:>18} {:>26}", "", "no checkpointing", ckpt_label);
    let rows: [(&str, Quantity); 6] = [
        ("peak above the pre-forward baseline", |s| format_size(s.peak_above_baseline)),
        ("allocated after forward (above it)", |s| format_size(s.after_forward)),
        ("saved tensors after forward (all)", |s| format_size(s.saved_bytes)),
        ("forward", |s| format!("{:.3} s", s.forward_s)),
        ("backward (with recomputation)", |s| format!("{:.3} s", s.backward_s)),
        ("step", |s| format!("{:.3} s", s.forward_s + s.backward_s)),
    ];
    for (name, value) in rows {
        println!("{name:<40} {:>18} {:>26}", value(&plain), value(&ckpt));
    }
    println!("{:<40} {:>18.6} {:>26.6}", "loss", plain.loss, ckpt.loss);
    println!(
        "checkpointing: peak {:.1}% and saved tensors {:.1}% of the plain step's, for {:.2}x the time",
        100.0 * ckpt.peak_above_baseline as f64 / plain.peak_above_baseline as f64,
        100.0 * ckpt.saved_bytes as f64 / plain.saved_bytes as f64,
        (ckpt.forward_s + ckpt.backward_s) / (plain.forward_s + plain.backward_s)
    );
    let diff = plain
        .grads
        .iter()
        .flatten()
        .zip(ckpt.grads.iter().flatten())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    println!("largest difference between the gradients of the two steps: {diff:.3e}");
    if diff > 1e-6 {
        return Err(format!("the gradients differ by {diff:.3e}").into());
    }
    Ok(())
}
