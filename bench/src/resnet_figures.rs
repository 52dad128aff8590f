//! `cuda.resnet_*` and `cuda.conv_*` (feature `cuda`, a GPU present):
//! ResNet-18 training and its dominant convolutions on `cuda:0`, brasa next
//! to PyTorch on the same GPU, interleaved (brasa, PyTorch, brasa,
//! PyTorch, …; three rounds each, one with `--quick`), medians of the rounds.
//!
//! - `cuda.resnet_train_samples_per_s`: training steps of ResNet-18 in its
//!   CIFAR form (`ResNetConfig::resnet18(3, 10)`: width 64, 11.17 M
//!   parameters) at batch 128 on random 32×32 images, brasa's samples/s.
//!   A step: forward and mean cross entropy under bf16 autocast, backward,
//!   SGD (lr 0.05, momentum 0.9, weight decay 5e-4), zeroing the
//!   gradients. Each round builds the model, runs warm-up steps that are
//!   not timed, then times five chunks of steps, the device synchronized
//!   before each chunk starts and before it stops; a round's rate is the
//!   median chunk's.
//! - `cuda.resnet_train_vs_torch`: that rate ÷ PyTorch's for the same model
//!   and step (`bench/peers/torch_resnet.py --bench train`), eager, at its
//!   best: model and batches channels last and `cudnn.benchmark` on.
//!   Higher is better; 1 is parity.
//! - `cuda.conv_c64_32x32_vs_torch`, `cuda.conv_c128_16x16_vs_torch`,
//!   `cuda.conv_c256_8x8_vs_torch`, `cuda.conv_c512_4x4_vs_torch`: one 3×3
//!   convolution (stride 1, padding 1, no bias, C → C channels) at batch 128
//!   in bf16, forward and backward (the input's and the weight's gradients,
//!   `brasa_autograd::grad` / `torch.autograd.grad` with a given output
//!   gradient), PyTorch's seconds per iteration ÷ brasa's (so, as every
//!   `*_vs_torch` figure, brasa's rate ÷ PyTorch's: ≥ 1 means brasa is at
//!   least as fast). PyTorch's tensors are channels last with
//!   `cudnn.benchmark` on (`torch_resnet.py --bench conv`).
//! - `cuda.conv_vs_torch`: the four together, as they occur in one
//!   ResNet-18 step: `Σ count·t_torch ÷ Σ count·t_brasa`, with `count` the
//!   number of such convolutions in the model (4, 3, 3, 3).
//! - `cuda.resnet_train_graph_vs_torch`, `cuda.conv_graph_vs_torch`: the
//!   same with brasa's convolutions through cuDNN's graph API
//!   (`cudnn::set_graph_api(true)`), in the same rounds; the others use
//!   the legacy API, brasa's default.
//!
//! Why these shapes: a 3×3 convolution C → C at H×W costs
//! `2·N·H·W·C²·9` FLOPs, the same 9.66 GFLOP at batch 128 for 64 channels
//! at 32×32, 128 at 16×16, 256 at 8×8 and 512 at 4×4 (channels double as
//! the area quarters). ResNet-18 has 4, 3, 3 and 3 of them: 126 of the
//! forward's 142 GFLOP (89 %); the rest is the three strided 3×3
//! convolutions that open stages 2-4 (14.5 GFLOP), the stem (0.45) and the
//! 1×1 projections (1.6). The first shape carries the most (27 %); the
//! other three tie (20 % each), so all four are measured.
//!
//! PyTorch's interpreter is `$BRASA_TORCH_PYTHON`, else `python3`; without
//! PyTorch only the samples/s figure is given. Without a GPU the group
//! prints one line and no figure.

use crate::measure::{chunk_rates, median, time, value_and_ratio, Better, Figure, Options};
use brasa_autograd::Var;
use brasa_nn::functional::cross_entropy;
use brasa_nn::models::{ResNet, ResNetConfig};
use brasa_nn::optim::{Optimizer, Sgd, SgdConfig};
use brasa_nn::{Module, ModuleExt, NnError, Result};
use brasa_tensor::{cuda_device_count, synchronize, Conv2dParams, DType, Device, Generator, Tensor, TensorError};
use std::process::Command;

const GPU: Device = Device::cuda(0);
const BATCH: usize = 128;
/// Warm-up steps (not timed) and timed steps per round (full, quick).
const TRAIN_WARMUP: usize = 5;
const TRAIN_STEPS: (usize, usize) = (50, 5);
/// Warm-up and timed iterations per convolution shape (full, quick).
const CONV_WARMUP: usize = 5;
const CONV_ITERS: (usize, usize) = (50, 5);

/// The measured convolutions: channels, height = width, how many such
/// convolutions ResNet-18 has, and the figure's name.
const SHAPES: [(usize, usize, usize, &str); 4] = [
    (64, 32, 4, "cuda.conv_c64_32x32_vs_torch"),
    (128, 16, 3, "cuda.conv_c128_16x16_vs_torch"),
    (256, 8, 3, "cuda.conv_c256_8x8_vs_torch"),
    (512, 4, 3, "cuda.conv_c512_4x4_vs_torch"),
];
const TRAIN_RATE: &str = "cuda.resnet_train_samples_per_s";
const TRAIN_VS: &str = "cuda.resnet_train_vs_torch";
const CONV_VS: &str = "cuda.conv_vs_torch";
/// The same two ratios with convolutions through cuDNN's graph API
/// (`cudnn::set_graph_api(true)`), measured in the same rounds.
const TRAIN_GRAPH_VS: &str = "cuda.resnet_train_graph_vs_torch";
const CONV_GRAPH_VS: &str = "cuda.conv_graph_vs_torch";

/// Runs `f` with convolutions through cuDNN's graph API (`graph`) or its
/// legacy API, restoring the setting after.
fn with_api<T>(graph: bool, f: impl FnOnce() -> T) -> T {
    let before = brasa_tensor::cudnn::graph_api();
    brasa_tensor::cudnn::set_graph_api(graph);
    let out = f();
    brasa_tensor::cudnn::set_graph_api(before);
    out
}

/// Parent side: the figures, or one line saying why there are none.
pub fn run(options: &Options) -> Vec<Figure> {
    if cuda_device_count() == 0 {
        eprintln!("cuda.resnet, cuda.conv: no CUDA device (or no driver): left out");
        return Vec::new();
    }
    let python = crate::measure::torch_python();
    let torch = Command::new(&python).args(["-c", "import torch"]).output().is_ok_and(|o| o.status.success());
    if !torch {
        eprintln!("resnet: PyTorch is not importable by `{python}` (set BRASA_TORCH_PYTHON): the *_vs_torch figures are left out");
    }
    // As PyTorch's side: cuDNN times each shape's algorithms once.
    brasa_tensor::cudnn::set_benchmark(true);
    let mut figures = Vec::new();
    if options.wants(TRAIN_RATE) || options.wants(TRAIN_VS) || options.wants(TRAIN_GRAPH_VS) {
        figures.extend(train_figures(options, &python, torch));
    }
    if options.wants(CONV_VS) || options.wants(CONV_GRAPH_VS) || SHAPES.iter().any(|s| options.wants(s.3)) {
        if torch {
            figures.extend(conv_figures(options, &python));
        } else {
            eprintln!("resnet: the cuda.conv_* figures are ratios to PyTorch: left out");
        }
    }
    figures
}

fn train_figures(options: &Options, python: &str, torch: bool) -> Vec<Figure> {
    let (mut ours, mut graph, mut theirs) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..options.reps(3, 1) {
        match with_api(false, || train_samples_per_s(options.quick)) {
            Ok(rate) => ours.push(rate),
            Err(e) => eprintln!("resnet: brasa training: {e}"),
        }
        if options.wants(TRAIN_GRAPH_VS) {
            match with_api(true, || train_samples_per_s(options.quick)) {
                Ok(rate) => graph.push(rate),
                Err(e) => eprintln!("resnet: brasa training (cuDNN graph API): {e}"),
            }
        }
        if torch {
            match torch_train_rate(python, options.quick) {
                Ok(rate) => theirs.push(rate),
                Err(e) => eprintln!("resnet: torch_resnet.py --bench train: {e}"),
            }
        }
    }
    if !theirs.is_empty() {
        eprintln!("  (PyTorch: {:.0} samples/s)", median(&mut theirs));
    }
    let mut figures = Vec::new();
    if !graph.is_empty() && !theirs.is_empty() {
        let rate = median(&mut graph);
        eprintln!("  (brasa, cuDNN graph API: {rate:.0} samples/s)");
        figures.push(Figure::new(TRAIN_GRAPH_VS, rate / median(&mut theirs), "x", Better::Higher));
    }
    let mut both = value_and_ratio(TRAIN_RATE, "samples/s", TRAIN_VS, Better::Higher, &mut ours, &mut theirs);
    both.extend(figures);
    both
}

/// Each shape's seconds per iteration and host queueing seconds, one
/// sample per round, for one of cuDNN's APIs.
struct ConvSamples {
    seconds: Vec<Vec<f64>>,
    queued: Vec<Vec<f64>>,
}

impl ConvSamples {
    fn new() -> ConvSamples {
        ConvSamples { seconds: vec![Vec::new(); SHAPES.len()], queued: vec![Vec::new(); SHAPES.len()] }
    }

    fn measure(&mut self, quick: bool, graph: bool) {
        for (i, &(channels, size, _, _)) in SHAPES.iter().enumerate() {
            match with_api(graph, || conv_seconds(channels, size, quick)) {
                Ok((seconds, host)) => {
                    self.seconds[i].push(seconds);
                    self.queued[i].push(host);
                }
                Err(e) => eprintln!("resnet: brasa conv {channels}x{size}x{size} (graph API {graph}): {e}"),
            }
        }
    }
}

fn conv_figures(options: &Options, python: &str) -> Vec<Figure> {
    let (mut legacy, mut graph) = (ConvSamples::new(), ConvSamples::new());
    let mut theirs = vec![Vec::new(); SHAPES.len()];
    for _ in 0..options.reps(3, 1) {
        legacy.measure(options.quick, false);
        if options.wants(CONV_GRAPH_VS) {
            graph.measure(options.quick, true);
        }
        match torch_conv_seconds(python, options.quick) {
            Ok(seconds) => {
                for (i, s) in seconds.into_iter().enumerate() {
                    theirs[i].push(s);
                }
            }
            Err(e) => eprintln!("resnet: torch_resnet.py --bench conv: {e}"),
        }
    }
    let mut figures = Vec::new();
    for (api, samples, total_name) in [("legacy", &mut legacy, CONV_VS), ("graph", &mut graph, CONV_GRAPH_VS)] {
        let (mut ours_total, mut theirs_total, mut complete) = (0.0, 0.0, true);
        for (i, &(channels, size, count, name)) in SHAPES.iter().enumerate() {
            if samples.seconds[i].is_empty() || theirs[i].is_empty() {
                complete = false;
                continue;
            }
            let (a, b) = (median(&mut samples.seconds[i]), median(&mut theirs[i]));
            let flops = 3.0 * conv_flops(channels, size);
            eprintln!(
                "  conv {channels}→{channels} 3x3 at {size}x{size}, batch {BATCH}, bf16, forward + backward: brasa \
                 ({api} cuDNN API) {:.3} ms ({:.1} TFLOP/s; the host queued it in {:.3} ms), PyTorch {:.3} ms ({:.1} \
                 TFLOP/s)",
                a * 1e3,
                flops / a / 1e12,
                median(&mut samples.queued[i]) * 1e3,
                b * 1e3,
                flops / b / 1e12
            );
            // The per-shape figures are the default (legacy) API's.
            if total_name == CONV_VS && options.wants(name) {
                figures.push(Figure::new(name, b / a, "x", Better::Higher));
            }
            ours_total += count as f64 * a;
            theirs_total += count as f64 * b;
        }
        // The weighted ratio needs every shape: without one it would say something else.
        if complete && options.wants(total_name) {
            figures.push(Figure::new(total_name, theirs_total / ours_total, "x", Better::Higher));
        }
    }
    figures
}

/// The forward FLOPs of one C → C 3×3 convolution at `size`×`size`, batch 128.
fn conv_flops(channels: usize, size: usize) -> f64 {
    2.0 * (BATCH * size * size * channels * channels * 9) as f64
}

fn train_steps(quick: bool) -> usize {
    if quick {
        TRAIN_STEPS.1
    } else {
        TRAIN_STEPS.0
    }
}

fn conv_iters(quick: bool) -> usize {
    if quick {
        CONV_ITERS.1
    } else {
        CONV_ITERS.0
    }
}

/// An f32 tensor of standard normal values from `generator` on the GPU.
fn randn(generator: &mut Generator, dims: &[usize]) -> Result<Tensor> {
    let mut values = vec![0f32; dims.iter().product()];
    generator.fill_normal_f32(&mut values, 0.0, 1.0).map_err(TensorError::from)?;
    Ok(Tensor::from_vec_on(values, dims, GPU)?)
}

/// One round of ResNet-18 training on the GPU: samples/s of the median
/// timed chunk, after the warm-up.
fn train_samples_per_s(quick: bool) -> Result<f64> {
    let mut model = ResNet::new(ResNetConfig::resnet18(3, 10), GPU)?;
    // Channels-last weights and batches, as PyTorch's side
    // (`model.to(memory_format=torch.channels_last)`).
    model.to_channels_last()?;
    let mut opt = Sgd::new(
        model.parameters(),
        SgdConfig { lr: 0.05, momentum: 0.9, weight_decay: 5e-4, ..SgdConfig::default() },
    )?;
    let mut generator = Generator::new(1);
    let batches: Vec<(Var, Tensor)> = (0..8)
        .map(|i| -> Result<(Var, Tensor)> {
            // Channels last, as PyTorch's batches.
            let x = Var::new(randn(&mut generator, &[BATCH, 3, 32, 32])?.to_channels_last()?);
            let y: Vec<i64> = (0..BATCH).map(|j| ((i * 7 + j * 3) % 10) as i64).collect();
            Ok((x, Tensor::from_vec_on(y, [BATCH], GPU)?))
        })
        .collect::<Result<_>>()?;
    let steps = train_steps(quick);
    // The loss is not read per step (that would wait for the device): the
    // device is synchronized at the end of each timed chunk instead, the
    // chunks of `chunk_rates`.
    let chunk = (steps / 5).max(1);
    let mut step = |i: usize, timed: bool| -> Result<()> {
        let (x, y) = &batches[i % batches.len()];
        let loss = {
            let _amp = brasa_amp::autocast(DType::BF16);
            cross_entropy(&model.forward(x)?, y)?
        };
        loss.backward()?;
        opt.step()?;
        opt.zero_grad()?;
        if timed && (i + 1).is_multiple_of(chunk) {
            synchronize(GPU)?;
        }
        Ok(())
    };
    for i in 0..TRAIN_WARMUP {
        step(i, false)?;
    }
    synchronize(GPU)?;
    let mut rates = chunk_rates(steps, BATCH, |i| step(i, true))?;
    Ok(median(&mut rates))
}

/// Seconds per forward + backward (input and weight gradients) of a C → C
/// 3×3 convolution at `size`×`size`, batch 128, bf16 on the GPU; and of
/// those, the seconds the host took to queue the work (the loop before the
/// final synchronization): when the two are close, the host's per-call cost
/// (cuDNN's and brasa's), not the GPU, sets the pace.
fn conv_seconds(channels: usize, size: usize, quick: bool) -> Result<(f64, f64)> {
    let mut generator = Generator::new(2);
    let dims = [BATCH, channels, size, size];
    let x = Var::param(randn(&mut generator, &dims)?.to_dtype(DType::BF16)?.to_channels_last()?)?;
    let std = (2.0 / (9 * channels) as f64).sqrt();
    // Channels-last like PyTorch's side's weight.
    let w = Var::param(
        randn(&mut generator, &[channels, channels, 3, 3])?
            .mul_scalar(std)?
            .to_dtype(DType::BF16)?
            .to_channels_last()?,
    )?;
    let dy = randn(&mut generator, &dims)?.to_dtype(DType::BF16)?.to_channels_last()?;
    let params = Conv2dParams { stride: (1, 1), padding: (1, 1), dilation: (1, 1), groups: 1 };
    let once = || -> Result<()> {
        let y = x.conv2d(&w, None, params)?;
        let grads = brasa_autograd::grad(&[&y], &[&x, &w], Some(&[&dy]), false)?;
        if grads.iter().any(Option::is_none) {
            return Err(NnError::invalid("cuda.conv", "the convolution gave no gradient for its input or weight"));
        }
        Ok(())
    };
    for _ in 0..CONV_WARMUP {
        once()?;
    }
    let iters = conv_iters(quick);
    synchronize(GPU)?;
    let mut outcome = Ok(());
    let start = std::time::Instant::now();
    let mut queued = 0.0;
    let seconds = time(|| {
        for _ in 0..iters {
            if outcome.is_ok() {
                outcome = once();
            }
        }
        queued = start.elapsed().as_secs_f64();
        if outcome.is_ok() {
            outcome = synchronize(GPU).map_err(Into::into);
        }
    });
    outcome?;
    Ok((seconds / iters as f64, queued / iters as f64))
}

/// The JSON lines a peer printed (failing if it failed or printed none).
fn reports(
    output: std::io::Result<std::process::Output>,
    who: &str,
) -> std::result::Result<Vec<serde_json::Value>, String> {
    let output = output.map_err(|e| format!("running {who}: {e}"))?;
    if !output.status.success() {
        return Err(format!("{who} failed: {}", String::from_utf8_lossy(&output.stderr).trim()));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).map_err(|e| format!("{who}: bad report {l}: {e}")))
        .collect::<std::result::Result<_, _>>()?;
    if lines.is_empty() {
        return Err(format!("{who} printed no report"));
    }
    Ok(lines)
}

fn torch_command(python: &str, bench: &str) -> Command {
    let mut command = Command::new(python);
    command.arg(crate::measure::peer_script("torch_resnet.py")).args(["--bench", bench, "--device", "cuda:0"]);
    command
}

/// PyTorch's samples/s of one training round.
fn torch_train_rate(python: &str, quick: bool) -> std::result::Result<f64, String> {
    let mut command = torch_command(python, "train");
    command.args([
        "--batch",
        &BATCH.to_string(),
        "--warmup",
        &TRAIN_WARMUP.to_string(),
        "--steps",
        &train_steps(quick).to_string(),
    ]);
    let lines = reports(command.output(), "torch_resnet.py --bench train")?;
    let last = &lines[lines.len() - 1];
    last["samples_per_s"].as_f64().ok_or(format!("torch_resnet.py: report lacks samples_per_s: {last}"))
}

/// PyTorch's seconds per iteration of each of [`SHAPES`], in order.
fn torch_conv_seconds(python: &str, quick: bool) -> std::result::Result<Vec<f64>, String> {
    let shapes: Vec<String> = SHAPES.iter().map(|&(c, size, _, _)| format!("{c}:{size}")).collect();
    let mut command = torch_command(python, "conv");
    command.args([
        "--batch",
        &BATCH.to_string(),
        "--warmup",
        &CONV_WARMUP.to_string(),
        "--iters",
        &conv_iters(quick).to_string(),
        "--shapes",
        &shapes.join(","),
    ]);
    let lines = reports(command.output(), "torch_resnet.py --bench conv")?;
    SHAPES
        .iter()
        .map(|&(c, size, _, _)| {
            lines
                .iter()
                .find(|l| l["channels"].as_u64() == Some(c as u64) && l["size"].as_u64() == Some(size as u64))
                .and_then(|l| l["seconds"].as_f64())
                .ok_or(format!("torch_resnet.py: no seconds for {c} channels at {size}x{size}"))
        })
        .collect()
}
