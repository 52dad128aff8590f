//! `nn.gpt_train_*`: training steps of the character-level GPT of
//! `train_gpt`'s CPU configuration (nanoGPT's: 4 layers, 4 heads, 128
//! wide, context 64, batch 12, vocabulary 65, no dropout), brasa next to
//! PyTorch on the same machine, interleaved.
//!
//! A step is what `train_gpt` does per batch: forward and mean cross
//! entropy, backward, gradient clipping at norm 1, AdamW (β = (0.9, 0.99),
//! weight decay 0.1 on the matrices and embeddings, none on the norms:
//! two parameter groups) and zeroing the gradients. The batches are random
//! token windows (the speed does not depend on the text). PyTorch's side
//! is `bench/peers/torch_gpt.py`: the same model written as nanoGPT writes
//! it (`F.scaled_dot_product_attention` with `is_causal`, a tied head),
//! eager (no `torch.compile`), on as many threads as brasa.
//!
//! Each measurement runs in a child process (brasa's through `brasa-bench
//! --gpt-worker`), alternating brasa, PyTorch, brasa, …, three rounds each;
//! the figures are the medians: `nn.gpt_train_steps_per_s` (brasa) and,
//! when PyTorch is importable, `nn.gpt_train_vs_torch` (brasa's steps/s ÷
//! PyTorch's; higher is better). The interpreter is `$BRASA_TORCH_PYTHON`,
//! else `python3`.
//!
//! With the `cuda` feature and a GPU, `cuda.gpt_train_steps_per_s` and
//! `cuda.gpt_train_vs_torch` are the same for nanoGPT's `shakespeare_char`
//! configuration (6 layers, 6 heads, 384 wide, context 256, batch 64,
//! dropout 0.2) on `cuda:0` under bf16 autocast, against PyTorch eager
//! with `torch.autocast(bfloat16)` on the same GPU; both sides synchronize
//! the device at the end of each timed chunk and read no loss in between.

use crate::measure::{chunk_rates, median, value_and_ratio, Better, Figure, Options};
use brasa_nn::models::{Gpt, GptConfig};
use brasa_nn::optim::{clip_grad_norm_, AdamConfig, AdamW, Optimizer};
use brasa_nn::{ModuleExt, Result};
use brasa_tensor::{synchronize, DType, Device, Generator, Tensor, TensorError};
use std::process::Command;

/// Tiny Shakespeare's vocabulary.
const VOCAB: usize = 65;
/// Warm-up and timed steps per run (full, quick).
const WARMUP: usize = 3;
const STEPS: (usize, usize) = (40, 5);

fn steps(quick: bool) -> usize {
    if quick {
        STEPS.1
    } else {
        STEPS.0
    }
}

/// Parent side: interleaved brasa and PyTorch children, then the figures.
pub fn run(options: &Options) -> Vec<Figure> {
    figures(options, false)
}

/// The `cuda.gpt_*` figures (feature `cuda`; one line and none without a GPU).
#[cfg(feature = "cuda")]
pub fn run_cuda(options: &Options) -> Vec<Figure> {
    if brasa_tensor::cuda_device_count() == 0 {
        eprintln!("cuda.gpt: no CUDA device (or no driver): left out");
        return Vec::new();
    }
    figures(options, true)
}

fn figures(options: &Options, gpu: bool) -> Vec<Figure> {
    let (rate_name, vs_name) = if gpu {
        ("cuda.gpt_train_steps_per_s", "cuda.gpt_train_vs_torch")
    } else {
        ("nn.gpt_train_steps_per_s", "nn.gpt_train_vs_torch")
    };
    if !options.wants(rate_name) && !options.wants(vs_name) {
        return Vec::new();
    }
    let python = crate::measure::torch_python();
    let torch = Command::new(&python).args(["-c", "import torch"]).output().is_ok_and(|o| o.status.success());
    if !torch {
        eprintln!("gpt: PyTorch is not importable by `{python}` (set BRASA_TORCH_PYTHON): {vs_name} is left out");
    }
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..options.reps(3, 1) {
        match brasa_rate(options.quick, gpu) {
            Ok(rate) => ours.push(rate),
            Err(e) => eprintln!("gpt: brasa worker: {e}"),
        }
        if torch {
            match torch_rate(&python, options.quick, gpu) {
                Ok(rate) => theirs.push(rate),
                Err(e) => eprintln!("gpt: torch_gpt.py: {e}"),
            }
        }
    }
    if !theirs.is_empty() {
        eprintln!("  (PyTorch: {:.2} steps/s)", median(&mut theirs));
    }
    value_and_ratio(rate_name, "steps/s", vs_name, Better::Higher, &mut ours, &mut theirs)
}

fn brasa_rate(quick: bool, gpu: bool) -> std::result::Result<f64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut command = Command::new(exe);
    command.args(["--gpt-worker", if gpu { "gpu" } else { "cpu" }]);
    if quick {
        command.arg("--quick");
    }
    steps_per_s(&command.output().map_err(|e| e.to_string())?, "brasa worker")
}

fn torch_rate(python: &str, quick: bool, gpu: bool) -> std::result::Result<f64, String> {
    let script = crate::measure::peer_script("torch_gpt.py");
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).to_string();
    let mut command = Command::new(python);
    command.arg(&script).args([
        "--threads",
        &threads,
        "--warmup",
        &WARMUP.to_string(),
        "--steps",
        &steps(quick).to_string(),
    ]);
    if gpu {
        command.args(["--config", "gpu", "--device", "cuda", "--bf16"]);
    }
    let output = command.output().map_err(|e| format!("running {python} {script}: {e}"))?;
    steps_per_s(&output, "torch_gpt.py")
}

/// The `steps_per_s` of a child's last JSON line.
fn steps_per_s(output: &std::process::Output, who: &str) -> std::result::Result<f64, String> {
    if !output.status.success() {
        return Err(format!("{who} failed: {}", String::from_utf8_lossy(&output.stderr).trim()));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().rev().find(|l| l.starts_with('{')).ok_or(format!("{who} printed no report"))?;
    let value: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("{who}: bad report {line}: {e}"))?;
    value["steps_per_s"].as_f64().ok_or(format!("{who}: report lacks steps_per_s: {line}"))
}

/// Child side: times training steps of the CPU configuration (or with
/// `gpu`, the GPU configuration on `cuda:0` under bf16 autocast) and
/// prints `{"steps_per_s": …, "final_loss": …}`.
pub fn worker(quick: bool, gpu: bool) -> Result<()> {
    crate::measure::join_host_pool()?;
    let (config, batch, dev) = if gpu {
        (GptConfig::shakespeare_char(VOCAB), 64, Device::cuda(0))
    } else {
        (GptConfig::shakespeare_char_cpu(VOCAB), 12, Device::CPU)
    };
    let model = Gpt::new(config, dev)?;
    let (decay, no_decay): (Vec<_>, Vec<_>) = model.parameters().into_iter().partition(|p| p.dims().len() >= 2);
    let adamw = AdamConfig { lr: 1e-3, betas: (0.9, 0.99), weight_decay: 0.1, ..AdamConfig::default() };
    let mut opt = AdamW::new(decay, adamw)?;
    let mut opt_no_decay = AdamW::new(no_decay, AdamConfig { weight_decay: 0.0, ..adamw })?;
    let params = model.parameters();
    // Eight batches of random windows, cycled.
    let mut generator = Generator::new(1);
    let batches: Vec<(Tensor, Tensor)> = (0..8)
        .map(|_| -> Result<(Tensor, Tensor)> {
            let mut draws = vec![0f64; batch * (config.block_size + 1)];
            generator.fill_uniform_f64(&mut draws, 0.0, VOCAB as f64).map_err(TensorError::from)?;
            let ids: Vec<i64> = draws.iter().map(|&u| (u as i64).min(VOCAB as i64 - 1)).collect();
            let window = Tensor::from_vec_on(ids, [batch, config.block_size + 1], dev)?;
            Ok((
                window.narrow(1, 0, config.block_size)?.contiguous()?,
                window.narrow(1, 1, config.block_size)?.contiguous()?,
            ))
        })
        .collect::<Result<_>>()?;
    let mut last_loss = None;
    // On the GPU the loss is not read per step (that would wait for the
    // device): the device is synchronized at the end of each timed chunk.
    let chunk = (steps(quick) / 5).max(1);
    let mut step = |i: usize| -> Result<()> {
        let (x, y) = &batches[i % batches.len()];
        let loss = {
            let _amp = brasa_amp::autocast(if gpu { DType::BF16 } else { DType::F32 });
            model.loss(x, y)?
        };
        loss.backward()?;
        clip_grad_norm_(&params, 1.0, 2.0)?;
        opt.step()?;
        opt_no_decay.step()?;
        opt.zero_grad()?;
        opt_no_decay.zero_grad()?;
        if gpu {
            if (i + 1).is_multiple_of(chunk) {
                synchronize(dev)?;
            }
        } else {
            loss.item()?;
        }
        last_loss = Some(loss);
        Ok(())
    };
    for i in 0..WARMUP {
        step(i)?;
    }
    synchronize(dev)?;
    let mut rates = chunk_rates(steps(quick), 1, &mut step)?;
    let final_loss = match &last_loss {
        Some(loss) => loss.item()?,
        None => f64::NAN,
    };
    let report = serde_json::json!({ "steps_per_s": median(&mut rates), "final_loss": final_loss });
    println!("{report}");
    Ok(())
}
