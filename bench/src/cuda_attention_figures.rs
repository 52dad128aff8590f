//! `cuda.sdpa_*` (feature `cuda`, a GPU present): fused attention on
//! `cuda:0` next to PyTorch's `scaled_dot_product_attention` (its flash or
//! cuDNN backend) on the same GPU, interleaved (brasa, PyTorch, brasa,
//! PyTorch; medians). bf16, batch 4, 16 heads, head dim 128, sequence 4096,
//! without and with the causal mask (`cuda.sdpa_causal_*`).
//!
//! - `cuda.sdpa_fwd_tflops`, `cuda.sdpa_bwd_tflops`: FlashAttention's
//!   convention, forward `4·N·H·L·S·D` FLOPs (halved when causal), backward
//!   2.5× the forward.
//! - `cuda.sdpa_vs_torch`: PyTorch's forward + backward time ÷ brasa's
//!   (above 1: brasa is faster).
//!
//! brasa's side times the tensor-level kernels (`Tensor::fused_attention`
//! and `FusedAttentionBackward::run`); PyTorch's is
//! `bench/peers/torch_cuda.py --bench sdpa[_causal]`, which times its
//! forward and `torch.autograd.grad` of the three inputs.

use crate::measure::{median, time, Better, Figure, Options};
use brasa_tensor::{cuda_device_count, manual_seed, synchronize, DType, Device, FusedAttentionConfig, Tensor};

const GPU: Device = Device::cuda(0);
const SHAPE: [usize; 4] = [4, 16, 4096, 128];

/// The figures, or one line saying why there are none.
pub fn run(options: &Options) -> Vec<Figure> {
    if cuda_device_count() == 0 {
        eprintln!("cuda.sdpa: no CUDA device (or no driver): left out");
        return Vec::new();
    }
    let python = crate::measure::torch_python();
    let rounds = options.reps(3, 1);
    let mut figures = Vec::new();
    for (causal, fwd_name, bwd_name, vs_name, bench) in [
        (false, "cuda.sdpa_fwd_tflops", "cuda.sdpa_bwd_tflops", "cuda.sdpa_vs_torch", "sdpa"),
        (
            true,
            "cuda.sdpa_causal_fwd_tflops",
            "cuda.sdpa_causal_bwd_tflops",
            "cuda.sdpa_causal_vs_torch",
            "sdpa_causal",
        ),
    ] {
        if ![fwd_name, bwd_name, vs_name].iter().any(|n| options.wants(n)) {
            continue;
        }
        let (mut fwd, mut bwd, mut theirs) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            match seconds(causal, options.quick) {
                Ok((f, b)) => {
                    fwd.push(f);
                    bwd.push(b);
                }
                Err(e) => eprintln!("cuda.sdpa: brasa: {e}"),
            }
            if let Some(v) = crate::cuda_figures::torch_value(&python, bench) {
                theirs.push(v);
            }
        }
        if fwd.is_empty() {
            continue;
        }
        let (f, b) = (median(&mut fwd), median(&mut bwd));
        let [n, h, l, d] = SHAPE;
        let flops = 4.0 * (n * h * l * l * d) as f64 / if causal { 2.0 } else { 1.0 };
        figures.push(Figure::new(fwd_name, flops / f / 1e12, "TFLOP/s", Better::Higher));
        figures.push(Figure::new(bwd_name, 2.5 * flops / b / 1e12, "TFLOP/s", Better::Higher));
        if !theirs.is_empty() {
            figures.push(Figure::new(vs_name, median(&mut theirs) / (f + b), "x", Better::Higher));
        }
    }
    figures
}

/// Seconds per forward and per backward (medians of their iterations).
fn seconds(causal: bool, quick: bool) -> brasa_tensor::Result<(f64, f64)> {
    manual_seed(0);
    let make = || -> brasa_tensor::Result<Tensor> { Tensor::randn_on(SHAPE, DType::F32, GPU)?.to_dtype(DType::BF16) };
    let (q, k, v, grad) = (make()?, make()?, make()?, make()?);
    let config = FusedAttentionConfig { causal, ..FusedAttentionConfig::new(1.0 / (SHAPE[3] as f64).sqrt()) };
    let forward = || -> brasa_tensor::Result<_> {
        q.fused_attention(&k, &v, &config)?.ok_or_else(|| {
            brasa_tensor::TensorError::Device("cuda:0 has no fused attention for bf16, head dim 128".into())
        })
    };
    let iters = if quick { 3 } else { 20 };
    let fused = forward()?;
    fused.backward.run(&q, &k, &v, &fused.out, &fused.lse, &grad)?;
    synchronize(GPU)?;
    let mut outcome = Ok(());
    let fwd = time(|| {
        for _ in 0..iters {
            if let Err(e) = forward() {
                outcome = Err(e);
            }
        }
        if let Err(e) = synchronize(GPU) {
            outcome = Err(e);
        }
    });
    outcome?;
    let mut outcome = Ok(());
    let bwd = time(|| {
        for _ in 0..iters {
            if let Err(e) = fused.backward.run(&q, &k, &v, &fused.out, &fused.lse, &grad) {
                outcome = Err(e);
            }
        }
        if let Err(e) = synchronize(GPU) {
            outcome = Err(e);
        }
    });
    outcome?;
    Ok((fwd / iters as f64, bwd / iters as f64))
}
