//! `nn.*`: end-to-end training throughput, peak memory and backend
//! allocations per step, on the workloads of `shared/peers/torch_bench.py`
//! (synthetic data, 16 fixed batches, SGD lr 0.01 momentum 0.9, mean cross
//! entropy, 2 threads on the reference machine).
//!
//! Each workload runs in a child process (`brasa-bench --nn-worker NAME`) so
//! that its peak RSS is its own, not that of the figures measured before it.

use crate::measure::{chunk_rates, median, Better, Figure, Options};
use brasa_autograd::Var;
use brasa_nn::functional::cross_entropy;
use brasa_nn::optim::{Optimizer, Sgd, SgdConfig};
use brasa_nn::{Conv2d, Flatten, Linear, MaxPool2d, Module, ModuleExt, Relu, Result, Sequential};
use brasa_tensor::{manual_seed, memory, DType, Device, Tensor};
use std::process::Command;

const DEV: Device = Device::CPU;

/// One workload: its model, input shape and batch size.
struct Workload {
    name: &'static str,
    batch: usize,
    sample_dims: &'static [usize],
    warmup: usize,
    steps: usize,
    quick_steps: usize,
    build: fn() -> Result<Sequential>,
}

const WORKLOADS: &[Workload] = &[
    Workload { name: "mlp", batch: 128, sample_dims: &[784], warmup: 20, steps: 200, quick_steps: 20, build: mlp },
    Workload { name: "cnn", batch: 64, sample_dims: &[1, 28, 28], warmup: 3, steps: 30, quick_steps: 4, build: cnn },
];

/// The 784-512-512-10 ReLU MLP of the reference workloads.
pub(crate) fn mlp() -> Result<Sequential> {
    mlp_on(DEV)
}

/// [`mlp`] on `device`.
pub(crate) fn mlp_on(device: Device) -> Result<Sequential> {
    Ok(Sequential::new()
        .push(Linear::new(784, 512, device)?)
        .push(Relu)
        .push(Linear::new(512, 512, device)?)
        .push(Relu)
        .push(Linear::new(512, 10, device)?))
}

fn cnn() -> Result<Sequential> {
    cnn_on(DEV)
}

/// The CNN of the reference workloads (conv 1→32, conv 32→64, max pool,
/// linear 9216→128→10) on `device`.
pub(crate) fn cnn_on(device: Device) -> Result<Sequential> {
    Ok(Sequential::new()
        .push(Conv2d::new(1, 32, 3, device)?)
        .push(Relu)
        .push(Conv2d::new(32, 64, 3, device)?)
        .push(Relu)
        .push(MaxPool2d::new(2)?)
        .push(Flatten::new())
        .push(Linear::new(9216, 128, device)?)
        .push(Relu)
        .push(Linear::new(128, 10, device)?))
}

/// Parent side: runs each wanted workload in a child and turns its report into figures.
pub fn run(options: &Options) -> Vec<Figure> {
    let mut figures = Vec::new();
    for workload in WORKLOADS {
        let throughput = match workload.name {
            "mlp" => "nn.mlp_train_samples_per_s",
            _ => "nn.cnn_train_samples_per_s",
        };
        let wanted = options.wants(throughput)
            || (workload.name == "mlp" && (options.wants("nn.mlp_peak_rss_mb") || options.wants("nn.alloc_per_step")));
        if !wanted {
            continue;
        }
        let report = match child_report(workload, options.quick) {
            Ok(report) => report,
            Err(message) => {
                eprintln!("  nn.{} failed: {message}", workload.name);
                continue;
            }
        };
        figures.push(Figure::new(throughput, report.samples_per_s, "samples/s", Better::Higher));
        if workload.name == "mlp" {
            figures.push(Figure::new("nn.mlp_peak_rss_mb", report.peak_rss_mb, "MiB", Better::Lower));
            figures.push(Figure::new("nn.alloc_per_step", report.device_allocs_per_step, "allocs", Better::Lower));
        }
    }
    figures
}

struct Report {
    samples_per_s: f64,
    peak_rss_mb: f64,
    device_allocs_per_step: f64,
}

fn child_report(workload: &Workload, quick: bool) -> std::result::Result<Report, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut command = Command::new(exe);
    command.args(["--nn-worker", workload.name]);
    if quick {
        command.arg("--quick");
    }
    let output = command.output().map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!("{}{}", stdout, String::from_utf8_lossy(&output.stderr)));
    }
    let value: serde_json::Value = serde_json::from_str(stdout.trim()).map_err(|e| format!("{e}: {stdout}"))?;
    let get = |key: &str| value[key].as_f64().ok_or_else(|| format!("no {key} in {stdout}"));
    Ok(Report {
        samples_per_s: get("samples_per_s")?,
        peak_rss_mb: get("peak_rss_mb")?,
        device_allocs_per_step: get("device_allocs_per_step")?,
    })
}

/// Child side: trains one workload and prints its report as JSON.
pub fn worker(name: &str, quick: bool) -> Result<()> {
    let workload = WORKLOADS
        .iter()
        .find(|w| w.name == name)
        .ok_or_else(|| brasa_nn::NnError::invalid("brasa-bench", format!("unknown nn workload {name}")))?;
    manual_seed(0);
    let model = (workload.build)()?;
    let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() })?;
    let mut shape = vec![workload.batch];
    shape.extend_from_slice(workload.sample_dims);
    let batches: Vec<(Var, Tensor)> = (0..16)
        .map(|i| -> Result<(Var, Tensor)> {
            let x = Var::new(Tensor::randn_on(shape.clone(), DType::F32, DEV)?);
            let y: Vec<i64> = (0..workload.batch).map(|j| ((i * 7 + j * 3) % 10) as i64).collect();
            Ok((x, Tensor::from_vec_on(y, [workload.batch], DEV)?))
        })
        .collect::<Result<_>>()?;
    let mut step = |i: usize| -> Result<()> {
        let (x, y) = &batches[i % batches.len()];
        let loss = cross_entropy(&model.forward(x)?, y)?;
        loss.backward()?;
        opt.step()?;
        opt.zero_grad()?;
        Ok(())
    };
    let steps = if quick { workload.quick_steps } else { workload.steps };
    for i in 0..workload.warmup.min(steps) {
        step(i)?;
    }
    let allocs_before = memory::stats(DEV)?.num_device_alloc;
    let mut rates = chunk_rates(steps, workload.batch, &mut step)?;
    let allocs = memory::stats(DEV)?.num_device_alloc - allocs_before;
    let report = serde_json::json!({
        "samples_per_s": median(&mut rates),
        "peak_rss_mb": peak_rss_bytes() as f64 / (1024.0 * 1024.0),
        "device_allocs_per_step": allocs as f64 / steps as f64,
    });
    println!("{report}");
    Ok(())
}

/// The process's peak resident set (`VmHWM`), or 0 where `/proc` has none.
fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}
