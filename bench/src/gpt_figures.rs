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

use crate::measure::{chunk_rates, median, Better, Figure, Options};
use brasa_nn::models::{Gpt, GptConfig};
use brasa_nn::optim::{clip_grad_norm_, AdamConfig, AdamW, Optimizer};
use brasa_nn::{ModuleExt, Result};
use brasa_tensor::{Device, Generator, Tensor, TensorError};
use std::process::Command;

const DEV: Device = Device::CPU;
/// Tiny Shakespeare's vocabulary.
const VOCAB: usize = 65;
const BATCH: usize = 12;
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
    if !options.wants("nn.gpt_train_steps_per_s") && !options.wants("nn.gpt_train_vs_torch") {
        return Vec::new();
    }
    let python = crate::measure::torch_python();
    let torch = Command::new(&python).args(["-c", "import torch"]).output().is_ok_and(|o| o.status.success());
    if !torch {
        eprintln!(
            "gpt: PyTorch is not importable by `{python}` (set BRASA_TORCH_PYTHON): nn.gpt_train_vs_torch is left out"
        );
    }
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..options.reps(3, 1) {
        match brasa_rate(options.quick) {
            Ok(rate) => ours.push(rate),
            Err(e) => eprintln!("gpt: brasa worker: {e}"),
        }
        if torch {
            match torch_rate(&python, options.quick) {
                Ok(rate) => theirs.push(rate),
                Err(e) => eprintln!("gpt: torch_gpt.py: {e}"),
            }
        }
    }
    if ours.is_empty() {
        return Vec::new();
    }
    let rate = median(&mut ours);
    let mut figures = vec![Figure::new("nn.gpt_train_steps_per_s", rate, "steps/s", Better::Higher)];
    if !theirs.is_empty() {
        let torch_rate = median(&mut theirs);
        eprintln!("  (PyTorch: {torch_rate:.2} steps/s)");
        figures.push(Figure::new("nn.gpt_train_vs_torch", rate / torch_rate, "x", Better::Higher));
    }
    figures
}

fn brasa_rate(quick: bool) -> std::result::Result<f64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut command = Command::new(exe);
    command.arg("--gpt-worker");
    if quick {
        command.arg("--quick");
    }
    steps_per_s(&command.output().map_err(|e| e.to_string())?, "brasa worker")
}

fn torch_rate(python: &str, quick: bool) -> std::result::Result<f64, String> {
    let script = crate::measure::peer_script("torch_gpt.py");
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).to_string();
    let output = Command::new(python)
        .arg(&script)
        .args(["--threads", &threads, "--warmup", &WARMUP.to_string(), "--steps", &steps(quick).to_string()])
        .output()
        .map_err(|e| format!("running {python} {script}: {e}"))?;
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

/// Child side: times training steps of the CPU configuration and prints
/// `{"steps_per_s": …, "final_loss": …}`.
pub fn worker(quick: bool) -> Result<()> {
    let config = GptConfig::shakespeare_char_cpu(VOCAB);
    let model = Gpt::new(config, DEV)?;
    let (decay, no_decay): (Vec<_>, Vec<_>) = model.parameters().into_iter().partition(|p| p.dims().len() >= 2);
    let adamw = AdamConfig { lr: 1e-3, betas: (0.9, 0.99), weight_decay: 0.1, ..AdamConfig::default() };
    let mut opt = AdamW::new(decay, adamw)?;
    let mut opt_no_decay = AdamW::new(no_decay, AdamConfig { weight_decay: 0.0, ..adamw })?;
    let params = model.parameters();
    // Eight batches of random windows, cycled.
    let mut generator = Generator::new(1);
    let batches: Vec<(Tensor, Tensor)> = (0..8)
        .map(|_| -> Result<(Tensor, Tensor)> {
            let mut draws = vec![0f64; BATCH * (config.block_size + 1)];
            generator.fill_uniform_f64(&mut draws, 0.0, VOCAB as f64).map_err(TensorError::from)?;
            let ids: Vec<i64> = draws.iter().map(|&u| (u as i64).min(VOCAB as i64 - 1)).collect();
            let window = Tensor::from_vec_on(ids, [BATCH, config.block_size + 1], DEV)?;
            Ok((
                window.narrow(1, 0, config.block_size)?.contiguous()?,
                window.narrow(1, 1, config.block_size)?.contiguous()?,
            ))
        })
        .collect::<Result<_>>()?;
    let mut last_loss = f64::NAN;
    let mut step = |i: usize| -> Result<()> {
        let (x, y) = &batches[i % batches.len()];
        let loss = model.loss(x, y)?;
        loss.backward()?;
        clip_grad_norm_(&params, 1.0, 2.0)?;
        opt.step()?;
        opt_no_decay.step()?;
        opt.zero_grad()?;
        opt_no_decay.zero_grad()?;
        last_loss = loss.item()?;
        Ok(())
    };
    for i in 0..WARMUP {
        step(i)?;
    }
    let mut rates = chunk_rates(steps(quick), 1, &mut step)?;
    let report = serde_json::json!({ "steps_per_s": median(&mut rates), "final_loss": last_loss });
    println!("{report}");
    Ok(())
}
