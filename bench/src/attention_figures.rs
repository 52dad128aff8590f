//! `nn.sdpa_*`: memory-efficient scaled dot-product attention
//! (`Var::scaled_dot_product_attention`) against the naive composition
//! `softmax(q·kᵀ·scale)·v` of `Var` ops, forward + backward (loss Σ out) at
//! batch 4, 8 heads, sequence 2048, head dim 64, f32, same inputs,
//! measured alternately in one run.
//!
//! - `nn.sdpa_peak_ratio`: peak allocated bytes during forward + backward
//!   above what was allocated before (the inputs), sdpa ÷ naive.
//! - `nn.sdpa_time_ratio`: median step time, sdpa ÷ naive.

use crate::measure::{median, try_time, Better, Figure, Options};
use brasa_autograd::{Result, SdpaOptions, Var};
use brasa_tensor::{manual_seed, memory, DType, Device, Tensor};

const DEV: Device = Device::CPU;
const SHAPE: [usize; 4] = [4, 8, 2048, 64];

pub fn run(options: &Options) -> Vec<Figure> {
    if !["nn.sdpa_peak_ratio", "nn.sdpa_time_ratio"].iter().any(|n| options.wants(n)) {
        return Vec::new();
    }
    match figures(options) {
        Ok(found) => found.into_iter().filter(|f| options.wants(f.name)).collect(),
        Err(e) => {
            eprintln!("  nn.sdpa_peak_ratio / nn.sdpa_time_ratio: {e}");
            Vec::new()
        }
    }
}

fn naive(q: &Var, k: &Var, v: &Var) -> Result<Var> {
    let scale = 1.0 / (SHAPE[3] as f64).sqrt();
    q.matmul(&k.transpose(-2, -1)?)?.mul_scalar(scale)?.softmax(-1)?.matmul(v)
}

fn sdpa(q: &Var, k: &Var, v: &Var) -> Result<Var> {
    q.scaled_dot_product_attention(k, v, &SdpaOptions::new())
}

/// One forward + backward: (seconds, peak bytes above the start).
fn step(inputs: &[Var], f: fn(&Var, &Var, &Var) -> Result<Var>) -> Result<(f64, usize)> {
    for v in inputs {
        v.zero_grad(true)?;
    }
    let base = memory::allocated(DEV)?;
    memory::reset_peak(DEV)?;
    let seconds = try_time(|| -> Result<()> {
        let out = f(&inputs[0], &inputs[1], &inputs[2])?;
        out.sum_all()?.backward()
    })?;
    let peak = memory::max_allocated(DEV)?.saturating_sub(base);
    Ok((seconds, peak))
}

fn figures(options: &Options) -> Result<Vec<Figure>> {
    manual_seed(9);
    let inputs: Vec<Var> =
        (0..3).map(|_| Var::param(Tensor::randn_on(SHAPE, DType::F32, DEV)?)).collect::<Result<_>>()?;
    // Warm the allocator's cache both ways.
    step(&inputs, naive)?;
    step(&inputs, sdpa)?;
    let (mut peaks, mut times) = (Vec::new(), Vec::new());
    for _ in 0..options.reps(3, 1) {
        let (naive_s, naive_peak) = step(&inputs, naive)?;
        let (sdpa_s, sdpa_peak) = step(&inputs, sdpa)?;
        eprintln!(
            "  {SHAPE:?}: naive {naive_s:.3} s, peak {:.1} MiB; sdpa {sdpa_s:.3} s, peak {:.1} MiB",
            mib(naive_peak),
            mib(sdpa_peak)
        );
        peaks.push(sdpa_peak as f64 / naive_peak as f64);
        times.push(sdpa_s / naive_s);
    }
    Ok(vec![
        Figure::new("nn.sdpa_peak_ratio", median(&mut peaks), "x", Better::Lower),
        Figure::new("nn.sdpa_time_ratio", median(&mut times), "x", Better::Lower),
    ])
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
