//! `workloads.*` (and `nn.transformer_train_*`): whole training steps of
//! common models, brasa next to PyTorch on the same machine, interleaved.
//!
//! Each workload trains in f32 and under bf16 autocast: a wide GELU MLP, a
//! deep narrow MLP with AdamW, a CNN with batch norm, a half-width ResNet-18
//! (CIFAR form; in the default memory format and channels-last) and a pre-norm transformer encoder block; plus issue 17's transformer classifier (4
//! post-norm encoder layers, f32 only, figures `nn.transformer_train_*`). Per workload and dtype the figures
//! are brasa's samples/s, the bytes its graph saves for backward, and —
//! when PyTorch is importable — both as ratios to PyTorch's
//! (`_vs_torch`: samples/s ratio, higher is better; `_saved_vs_torch`: saved
//! bytes ratio, lower is better).
//!
//! Every measurement runs in a child process: brasa's through
//! `brasa-bench --workload-worker NAME:DTYPE`, PyTorch's through
//! `bench/peers/torch_workloads.py` (same models, batch sizes, optimizers
//! and synthetic data), alternating brasa, PyTorch, brasa, … so that both
//! see the same machine state; the figure is the median of the rounds (two).
//! The Python interpreter is `$BRASA_TORCH_PYTHON`, else `python3`.
//!
//! Saved bytes are the same quantity on both sides: the distinct storages
//! the graph of one forward keeps for backward (brasa:
//! `Var::graph_stats().saved_bytes` of the loss; PyTorch: a
//! `saved_tensors_hooks` pack hook summing storages by address).

use crate::measure::{chunk_rates, median, Better, Figure, Options};
use brasa_amp::autocast;
use brasa_autograd::Var;
use brasa_nn::functional::cross_entropy;
use brasa_nn::models::{ResNet, ResNetConfig};
use brasa_nn::optim::{AdamConfig, AdamW, Optimizer, Sgd, SgdConfig};
use brasa_nn::{
    BatchNorm2d, Conv2d, Conv2dConfig, Flatten, Gelu, Linear, MaxPool2d, Module, ModuleExt, NnError, Parameters, Relu,
    Result, Sequential, TransformerActivation, TransformerEncoderLayer, TransformerEncoderLayerConfig,
};
use brasa_tensor::{manual_seed, DType, Device, Tensor};
use std::process::Command;

const DEV: Device = Device::CPU;

/// Which optimizer a workload trains with.
#[derive(Clone, Copy)]
enum Opt {
    /// SGD, lr 0.01, momentum 0.9.
    Sgd,
    /// AdamW with PyTorch's defaults (lr 1e-3, weight decay 1e-2).
    AdamW,
}

/// One workload: what `torch_workloads.py` calls by the same name.
struct Workload {
    name: &'static str,
    /// The figures' stem (`{stem}_{dtype}_…`).
    stem: &'static str,
    batch: usize,
    sample_dims: &'static [usize],
    classes: usize,
    optimizer: Opt,
    /// Whether the model and the batches are channels-last (PyTorch's
    /// `model.to(memory_format=torch.channels_last)` and the same for `x`).
    channels_last: bool,
    /// The dtypes it is measured in ("f32", "bf16").
    dtypes: &'static [&'static str],
    /// Timed steps per run (full, quick).
    steps: (usize, usize),
    build: fn() -> Result<Box<dyn Module>>,
}

const BOTH: &[&str] = &["f32", "bf16"];

const WORKLOADS: &[Workload] = &[
    Workload {
        name: "wide_mlp",
        stem: "workloads.wide_mlp",
        batch: 256,
        sample_dims: &[3072],
        classes: 100,
        channels_last: false,
        optimizer: Opt::Sgd,
        dtypes: BOTH,
        steps: (10, 2),
        build: wide_mlp,
    },
    Workload {
        name: "deep_mlp",
        stem: "workloads.deep_mlp",
        batch: 128,
        sample_dims: &[256],
        classes: 10,
        channels_last: false,
        optimizer: Opt::AdamW,
        dtypes: BOTH,
        steps: (50, 5),
        build: deep_mlp,
    },
    Workload {
        name: "cnn_bn",
        stem: "workloads.cnn_bn",
        batch: 64,
        sample_dims: &[3, 32, 32],
        classes: 10,
        channels_last: false,
        optimizer: Opt::Sgd,
        dtypes: BOTH,
        steps: (10, 2),
        build: cnn_bn,
    },
    // ResNet-18 in its CIFAR form at half width (32/64/128/256 channels):
    // the convnet users train, with residual additions, 1×1 shortcuts and
    // global average pooling, in PyTorch's default memory format.
    Workload {
        name: "resnet",
        stem: "workloads.resnet",
        batch: 32,
        sample_dims: &[3, 32, 32],
        classes: 10,
        channels_last: false,
        optimizer: Opt::Sgd,
        dtypes: BOTH,
        steps: (10, 2),
        build: || Ok(Box::new(ResNet::new(ResNetConfig::resnet18(3, 10).width(32), DEV)?)),
    },
    // The same ResNet channels-last on both sides: what PyTorch's CPU
    // convolutions (oneDNN) run fastest, and brasa's host convolutions run
    // as rows of pixels.
    Workload {
        name: "resnet_channels_last",
        stem: "workloads.resnet_channels_last",
        batch: 32,
        sample_dims: &[3, 32, 32],
        classes: 10,
        channels_last: true,
        optimizer: Opt::Sgd,
        dtypes: BOTH,
        steps: (10, 2),
        build: || Ok(Box::new(ResNet::new(ResNetConfig::resnet18(3, 10).width(32), DEV)?)),
    },
    Workload {
        name: "encoder",
        stem: "workloads.encoder",
        batch: 16,
        sample_dims: &[128, 256],
        classes: 10,
        channels_last: false,
        optimizer: Opt::AdamW,
        dtypes: BOTH,
        steps: (6, 2),
        build: || encoder_classifier(1, 256, 4, 1024, true, 0.0),
    },
    // Issue 17's figure: 4 post-norm layers, d_model 384, 6 heads, d_ff 1536,
    // GELU, sequence 128, batch 16, AdamW (PyTorch's default dropout 0.1).
    Workload {
        name: "transformer",
        stem: "nn.transformer_train",
        batch: 16,
        sample_dims: &[128, 384],
        classes: 10,
        channels_last: false,
        optimizer: Opt::AdamW,
        dtypes: &["f32"],
        steps: (5, 1),
        build: || encoder_classifier(4, 384, 6, 1536, false, 0.1),
    },
];

/// Encoder layers over `[batch, sequence, d_model]`, mean-pooled over the
/// sequence into a 10-way linear head (`EncoderClassifier` of the peer script).
fn encoder_classifier(
    layers: usize,
    d_model: usize,
    heads: usize,
    d_ff: usize,
    norm_first: bool,
    dropout: f64,
) -> Result<Box<dyn Module>> {
    let config = TransformerEncoderLayerConfig::new()
        .dim_feedforward(d_ff)
        .dropout(dropout)
        .activation(TransformerActivation::Gelu)
        .batch_first(true)
        .norm_first(norm_first);
    let mut model = Sequential::new();
    for _ in 0..layers {
        model = model.push(TransformerEncoderLayer::with_config(d_model, heads, config, DEV)?);
    }
    Ok(Box::new(model.push(MeanOverSequence).push(Linear::new(d_model, 10, DEV)?)))
}

/// `[N, L, E] → [N, E]`: the mean over the sequence.
#[derive(Parameters, Clone, Copy, Debug)]
struct MeanOverSequence;

impl Module for MeanOverSequence {
    fn forward(&self, input: &Var) -> Result<Var> {
        Ok(input.mean(&[1], false)?)
    }
}

/// 3072-2048-2048-100 with GELU.
fn wide_mlp() -> Result<Box<dyn Module>> {
    Ok(Box::new(
        Sequential::new()
            .push(Linear::new(3072, 2048, DEV)?)
            .push(Gelu)
            .push(Linear::new(2048, 2048, DEV)?)
            .push(Gelu)
            .push(Linear::new(2048, 100, DEV)?),
    ))
}

/// Eight 256-wide ReLU layers and a 10-way head.
fn deep_mlp() -> Result<Box<dyn Module>> {
    let mut model = Sequential::new();
    for _ in 0..8 {
        model = model.push(Linear::new(256, 256, DEV)?).push(Relu);
    }
    Ok(Box::new(model.push(Linear::new(256, 10, DEV)?)))
}

/// Two conv(3×3, pad 1)–batch-norm–ReLU–max-pool blocks on 3×32×32 images.
fn cnn_bn() -> Result<Box<dyn Module>> {
    let conv = |i, o| Conv2d::with_config(i, o, 3, Conv2dConfig::new().padding(1), DEV);
    Ok(Box::new(
        Sequential::new()
            .push(conv(3, 32)?)
            .push(BatchNorm2d::new(32, DEV)?)
            .push(Relu)
            .push(MaxPool2d::new(2)?)
            .push(conv(32, 64)?)
            .push(BatchNorm2d::new(64, DEV)?)
            .push(Relu)
            .push(MaxPool2d::new(2)?)
            .push(Flatten::new())
            .push(Linear::new(64 * 8 * 8, 10, DEV)?),
    ))
}

/// What one run of one side reports.
#[derive(Clone, Copy, Debug)]
struct RunReport {
    samples_per_s: f64,
    saved_bytes: f64,
}

/// Parent side: for each wanted workload and dtype, alternates brasa and
/// PyTorch children and turns the medians into figures.
pub fn run(options: &Options) -> Vec<Figure> {
    let python = importable_torch_python();
    if python.is_none() {
        eprintln!(
            "workloads: PyTorch is not importable by `{}` (set BRASA_TORCH_PYTHON): the _vs_torch figures are left out",
            crate::measure::torch_python()
        );
    }
    // Two rounds each side: a full run of every workload takes minutes on 2 cores.
    let rounds = options.reps(2, 1);
    let mut figures = Vec::new();
    for workload in WORKLOADS {
        // Our medians per dtype, for the bf16 ÷ f32 figures.
        let mut medians: Vec<(&str, RunReport)> = Vec::new();
        for &dtype in workload.dtypes {
            // One dtype: no dtype in the names (`nn.transformer_train_vs_torch`).
            let stem = match workload.dtypes {
                [_] => workload.stem.to_string(),
                _ => format!("{}_{dtype}", workload.stem),
            };
            if !options.wants(&stem) {
                continue;
            }
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            let mut failed = None;
            for _ in 0..rounds {
                match child_report(workload, dtype, options.quick) {
                    Ok(report) => ours.push(report),
                    Err(e) => failed = Some(e),
                }
                if let Some(python) = &python {
                    match torch_report(python, workload, dtype, options.quick) {
                        Ok(report) => theirs.push(report),
                        Err(e) => eprintln!("workloads: PyTorch {stem}: {e}"),
                    }
                }
            }
            if let Some(e) = failed {
                eprintln!("workloads: {stem}: {e}");
                continue;
            }
            figures.extend(figures_for(&stem, &ours, &theirs));
            medians.push((dtype, median_report(&ours)));
        }
        figures.extend(bf16_figures(workload.stem, &medians));
    }
    figures
}

/// The medians of a side's runs.
fn median_report(reports: &[RunReport]) -> RunReport {
    let med = |f: fn(&RunReport) -> f64| median(&mut reports.iter().map(f).collect::<Vec<_>>());
    RunReport { samples_per_s: med(|r| r.samples_per_s), saved_bytes: med(|r| r.saved_bytes) }
}

/// What bf16 autocast buys over f32 on our side, when both were measured:
/// `{stem}_bf16_vs_f32` (speed) and `{stem}_bf16_saved_ratio` (bytes held
/// for backward after one forward, bf16 ÷ f32).
fn bf16_figures(stem: &str, medians: &[(&str, RunReport)]) -> Vec<Figure> {
    let find = |dtype: &str| medians.iter().find(|(d, _)| *d == dtype).map(|(_, r)| *r);
    let (Some(f32_report), Some(bf16_report)) = (find("f32"), find("bf16")) else {
        return Vec::new();
    };
    vec![
        Figure::new(
            leak(format!("{stem}_bf16_vs_f32")),
            bf16_report.samples_per_s / f32_report.samples_per_s,
            "x",
            Better::Higher,
        ),
        Figure::new(
            leak(format!("{stem}_bf16_saved_ratio")),
            bf16_report.saved_bytes / f32_report.saved_bytes,
            "x",
            Better::Lower,
        ),
    ]
}

/// The four figures of one workload in one dtype (two without PyTorch).
fn figures_for(stem: &str, ours: &[RunReport], theirs: &[RunReport]) -> Vec<Figure> {
    let RunReport { samples_per_s: rate, saved_bytes: saved } = median_report(ours);
    let mut figures = vec![
        Figure::new(leak(format!("{stem}_samples_per_s")), rate, "samples/s", Better::Higher),
        Figure::new(leak(format!("{stem}_saved_mb")), saved / (1024.0 * 1024.0), "MiB", Better::Lower),
    ];
    if !theirs.is_empty() {
        let RunReport { samples_per_s: torch_rate, saved_bytes: torch_saved } = median_report(theirs);
        figures.push(Figure::new(leak(format!("{stem}_vs_torch")), rate / torch_rate, "x", Better::Higher));
        figures.push(Figure::new(leak(format!("{stem}_saved_vs_torch")), saved / torch_saved, "x", Better::Lower));
    }
    figures
}

/// Figure names are `'static` (most are literals); these few are built once
/// per run of the binary.
fn leak(name: String) -> &'static str {
    Box::leak(name.into_boxed_str())
}

/// The peer interpreter, when it can import torch.
fn importable_torch_python() -> Option<String> {
    let python = crate::measure::torch_python();
    let ok = Command::new(&python).args(["-c", "import torch"]).output().is_ok_and(|o| o.status.success());
    ok.then_some(python)
}

fn steps(workload: &Workload, quick: bool) -> usize {
    if quick {
        workload.steps.1
    } else {
        workload.steps.0
    }
}

fn torch_report(python: &str, workload: &Workload, dtype: &str, quick: bool) -> std::result::Result<RunReport, String> {
    let script = crate::measure::peer_script("torch_workloads.py");
    let script = script.as_str();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).to_string();
    let output = Command::new(python)
        .arg(script)
        .args(["--workload", workload.name, "--dtype", dtype, "--threads", &threads])
        .args(["--steps", &steps(workload, quick).to_string()])
        .output()
        .map_err(|e| format!("running {python} {script}: {e}"))?;
    parse_report(&output, "torch_workloads.py")
}

fn child_report(workload: &Workload, dtype: &str, quick: bool) -> std::result::Result<RunReport, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut command = Command::new(exe);
    command.args(["--workload-worker", &format!("{}:{dtype}", workload.name)]);
    if quick {
        command.arg("--quick");
    }
    let output = command.output().map_err(|e| e.to_string())?;
    parse_report(&output, "brasa worker")
}

fn parse_report(output: &std::process::Output, who: &str) -> std::result::Result<RunReport, String> {
    if !output.status.success() {
        return Err(format!("{who} failed: {}", String::from_utf8_lossy(&output.stderr).trim()));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().rev().find(|l| l.starts_with('{')).ok_or(format!("{who} printed no report"))?;
    let value: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("{who}: bad report {line}: {e}"))?;
    let get = |key: &str| value[key].as_f64().ok_or(format!("{who}: report lacks {key}: {line}"));
    Ok(RunReport { samples_per_s: get("samples_per_s")?, saved_bytes: get("saved_bytes")? })
}

/// Child side: trains `NAME:DTYPE` and prints its report as JSON; with
/// `profile`, prints instead the op table (by self CPU time) of three steps
/// after the warm-up (`brasa-bench --workload-profile NAME:DTYPE`).
pub fn worker(spec: &str, quick: bool, profile: bool) -> Result<()> {
    crate::measure::join_host_pool()?;
    let unknown = || NnError::invalid("brasa-bench", format!("unknown workload `{spec}` (expected NAME:f32|bf16)"));
    let (name, dtype) = spec.split_once(':').ok_or_else(unknown)?;
    let workload = WORKLOADS.iter().find(|w| w.name == name).ok_or_else(unknown)?;
    let low = match dtype {
        "f32" => None,
        "bf16" => Some(DType::BF16),
        _ => return Err(unknown()),
    };
    manual_seed(0);
    let mut model = (workload.build)()?;
    if workload.channels_last {
        model.to_channels_last()?;
    }
    let mut opt: Box<dyn Optimizer> = match workload.optimizer {
        Opt::Sgd => {
            Box::new(Sgd::new(model.parameters(), SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() })?)
        }
        Opt::AdamW => Box::new(AdamW::new(model.parameters(), AdamConfig::adamw())?),
    };
    let mut shape = vec![workload.batch];
    shape.extend_from_slice(workload.sample_dims);
    let batches: Vec<(Var, Tensor)> = (0..4)
        .map(|i| -> Result<(Var, Tensor)> {
            let x = Tensor::randn_on(shape.clone(), DType::F32, DEV)?;
            let x = Var::new(if workload.channels_last { x.to_channels_last()? } else { x });
            let y: Vec<i64> = (0..workload.batch).map(|j| ((i * 7 + j * 3) % workload.classes) as i64).collect();
            Ok((x, Tensor::from_vec_on(y, [workload.batch], DEV)?))
        })
        .collect::<Result<_>>()?;
    let forward_loss = |i: usize| -> Result<Var> {
        let (x, y) = &batches[i % batches.len()];
        let _amp = low.map(autocast);
        cross_entropy(&model.forward(x)?, y)
    };
    let mut step = |i: usize| -> Result<()> {
        forward_loss(i)?.backward()?;
        opt.step()?;
        opt.zero_grad()
    };
    for i in 0..3 {
        step(i)?;
    }
    if profile {
        use brasa_profile::{Profiler, SortBy, TableOptions};
        // `BRASA_PROFILE_SHAPES=1` splits each op's row by its input shapes
        // (PyTorch's `group_by_input_shape=True`): which product is slow.
        let by_shape = std::env::var_os("BRASA_PROFILE_SHAPES").is_some_and(|v| v == "1");
        let profiler = Profiler::builder()
            .record_shapes(by_shape)
            .start()
            .map_err(|e| NnError::invalid("brasa-bench", e.to_string()))?;
        for i in 0..3 {
            step(i)?;
        }
        let result = profiler.stop();
        let averages = if by_shape { result.key_averages_by_input_shape() } else { result.key_averages() };
        let table = averages.table(&TableOptions::default().sort_by(SortBy::SelfCpu).row_limit(40));
        println!("{} {dtype}: three training steps\n{table}", workload.name);
        return Ok(());
    }
    let saved_bytes = forward_loss(0)?.graph_stats().saved_bytes;
    let steps = steps(workload, quick);
    let mut rates = chunk_rates(steps, workload.batch, &mut step)?;
    let report = serde_json::json!({
        "workload": workload.name,
        "dtype": dtype,
        "samples_per_s": median(&mut rates),
        "saved_bytes": saved_bytes,
    });
    println!("{report}");
    Ok(())
}
