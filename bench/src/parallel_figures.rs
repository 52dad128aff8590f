//! `parallel.*`: figures of `brasa-parallel` (data parallelism on logical
//! host devices).
//!
//! - `parallel.dp_device0_share`: `DataParallel` over 4 devices training
//!   the reference 784-512-512-10 MLP with Adam (batch 128, mean cross
//!   entropy, the batch created on device 0 as a caller would): peak
//!   allocated bytes on device 0 ÷ the mean of the other three, over 10
//!   steps after `reset_peak` (3 with `--quick`). PyTorch's
//!   `nn.DataParallel` piles outputs, loss, reduced gradients and the whole
//!   optimizer state on device 0; target ≤ 1.1.
//!
//! - `parallel.allreduce_*`, `parallel.ddp_*`, `parallel.zero2_*`: see
//!   `ddp_figures`.
//!
//! - `parallel.fsdp_*`: see `fsdp_figures`.
//!
//! - `parallel.pipeline_*`: see `pipeline_figures`.
//!
//! Each figure runs in a child process (`brasa-bench --parallel-worker
//! NAME`): logical host devices are fixed at a process's first tensor, and
//! other groups have created theirs by then. To add a figure, write one
//! function `fn(quick) -> Result<f64, String>` and list it in [`FIGURES`].

use crate::ddp_figures;
use crate::fsdp_figures;
use crate::measure::{Better, Figure, Options};
use crate::pipeline_figures;
use brasa_nn::functional::cross_entropy;
use brasa_nn::optim::{Adam, AdamConfig};
use brasa_nn::{Linear, Relu, Sequential};
use brasa_parallel::{ensure_host_devices, DataParallel, DataParallelConfig};
use brasa_tensor::{manual_seed, memory, DType, Device, Tensor};
use std::process::Command;

/// One figure: its name, unit, direction and the measurement run in the child.
struct ParallelFigure {
    name: &'static str,
    unit: &'static str,
    better: Better,
    measure: fn(quick: bool) -> Result<f64, String>,
}

const FIGURES: &[ParallelFigure] = &[
    ParallelFigure {
        name: "parallel.allreduce_busbw_gbs",
        unit: "GB/s",
        better: Better::Higher,
        measure: ddp_figures::allreduce_busbw,
    },
    ParallelFigure {
        name: "parallel.allreduce_vs_memcpy",
        unit: "x",
        better: Better::Higher,
        measure: ddp_figures::allreduce_vs_memcpy,
    },
    ParallelFigure {
        name: "parallel.ddp_overlap",
        unit: "x",
        better: Better::Higher,
        measure: ddp_figures::ddp_overlap,
    },
    ParallelFigure {
        name: "parallel.ddp_step_ratio",
        unit: "x",
        better: Better::Lower,
        measure: ddp_figures::ddp_step_ratio,
    },
    ParallelFigure {
        name: "parallel.zero2_memory_ratio",
        unit: "x",
        better: Better::Lower,
        measure: ddp_figures::zero2_memory_ratio,
    },
    ParallelFigure {
        name: "parallel.zero2_memory_ratio_4",
        unit: "x",
        better: Better::Lower,
        measure: ddp_figures::zero2_memory_ratio_4,
    },
    ParallelFigure {
        name: "parallel.fsdp_memory_ratio_4",
        unit: "x",
        better: Better::Lower,
        measure: fsdp_figures::fsdp_memory_ratio_4,
    },
    ParallelFigure {
        name: "parallel.fsdp_overlap",
        unit: "share",
        better: Better::Higher,
        measure: fsdp_figures::fsdp_overlap,
    },
    ParallelFigure {
        name: "parallel.fsdp_step_ratio",
        unit: "x",
        better: Better::Lower,
        measure: fsdp_figures::fsdp_step_ratio,
    },
    ParallelFigure { name: "parallel.dp_device0_share", unit: "x", better: Better::Lower, measure: dp_device0_share },
    ParallelFigure {
        name: "parallel.pipeline_bubble",
        unit: "share",
        better: Better::Lower,
        measure: pipeline_figures::pipeline_bubble,
    },
    ParallelFigure {
        name: "parallel.pipeline_bubble_vs_theory",
        unit: "share",
        better: Better::Lower,
        measure: pipeline_figures::pipeline_bubble_vs_theory,
    },
    ParallelFigure {
        name: "parallel.pipeline_1f1b_peak_ratio",
        unit: "x",
        better: Better::Lower,
        measure: pipeline_figures::pipeline_1f1b_peak_ratio,
    },
    ParallelFigure {
        name: "parallel.pipeline_speedup",
        unit: "x",
        better: Better::Higher,
        measure: pipeline_figures::pipeline_speedup,
    },
];

/// Parent side: runs each wanted figure in a child and collects its value.
pub fn run(options: &Options) -> Vec<Figure> {
    let mut figures = Vec::new();
    for figure in FIGURES.iter().filter(|f| options.wants(f.name)) {
        match child_value(figure.name, options.quick) {
            Ok(value) => figures.push(Figure::new(figure.name, value, figure.unit, figure.better)),
            Err(message) => eprintln!("  {} failed: {message}", figure.name),
        }
    }
    figures
}

fn child_value(name: &str, quick: bool) -> Result<f64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut command = Command::new(exe);
    command.args(["--parallel-worker", name]);
    if quick {
        command.arg("--quick");
    }
    let output = command.output().map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!("{}{}", stdout, String::from_utf8_lossy(&output.stderr)));
    }
    let value: serde_json::Value = serde_json::from_str(stdout.trim()).map_err(|e| format!("{e}: {stdout}"))?;
    value["value"].as_f64().ok_or_else(|| format!("no value in {stdout}"))
}

/// Child side: measures figure `name` and prints `{"value": ...}`.
pub fn worker(name: &str, quick: bool) -> Result<(), String> {
    let figure = FIGURES.iter().find(|f| f.name == name).ok_or_else(|| format!("unknown parallel figure {name}"))?;
    let value = (figure.measure)(quick)?;
    println!("{}", serde_json::json!({ "value": value }));
    Ok(())
}

/// The 784-512-512-10 ReLU MLP of the reference workloads, on `device`.
fn mlp(device: Device) -> brasa_nn::Result<Sequential> {
    Ok(Sequential::new()
        .push(Linear::new(784, 512, device)?)
        .push(Relu)
        .push(Linear::new(512, 512, device)?)
        .push(Relu)
        .push(Linear::new(512, 10, device)?))
}

fn dp_device0_share(quick: bool) -> Result<f64, String> {
    const WORLD: usize = 4;
    const BATCH: usize = 128;
    let text = |e: &dyn std::fmt::Display| e.to_string();
    ensure_host_devices(WORLD).map_err(|e| text(&e))?;
    manual_seed(0);
    let devices: Vec<Device> = (0..WORLD).map(Device::cpu).collect();
    let mut dp = DataParallel::with_config(
        &devices,
        mlp,
        |params| Adam::new(params, AdamConfig::default()),
        DataParallelConfig::default(),
    )
    .map_err(|e| text(&e))?;
    let x = Tensor::randn_on([BATCH, 784], DType::F32, Device::CPU).map_err(|e| text(&e))?;
    let labels: Vec<i64> = (0..BATCH).map(|i| ((i * 3) % 10) as i64).collect();
    let y = Tensor::from_vec_on(labels, [BATCH], Device::CPU).map_err(|e| text(&e))?;
    for &device in &devices {
        memory::reset_peak(device).map_err(|e| text(&e))?;
    }
    for _ in 0..if quick { 3 } else { 10 } {
        dp.step(&x, &y, cross_entropy).map_err(|e| text(&e))?;
    }
    let peaks = devices
        .iter()
        .map(|&d| memory::max_allocated(d).map(|bytes| bytes as f64))
        .collect::<Result<Vec<f64>, _>>()
        .map_err(|e| text(&e))?;
    eprintln!("  DataParallel peak allocated per device (bytes): {peaks:?}");
    let mean_others = peaks[1..].iter().sum::<f64>() / (WORLD - 1) as f64;
    if mean_others <= 0.0 {
        return Err(format!("the other devices allocated nothing: {peaks:?}"));
    }
    Ok(peaks[0] / mean_others)
}
