//! `memory.*`: how good and how cheap memory plans are.
//!
//! - `memory.plan_error`: the largest |planned − measured| ÷ measured peak
//!   reserved bytes over training steps (forward, loss, backward, Adam) of
//!   an MLP, a CNN and a transformer encoder layer at batches 8, 64 and 256,
//!   under the default allocator configuration and expandable segments, each
//!   planned on a meta device imitating a fresh logical host device and then
//!   run there (peak allocated is compared too, and counts in the maximum).
//!   Target 0.
//! - `memory.plan_time_ratio`: planning the CNN's two steps at batch 256 ÷
//!   running them, medians of interleaved rounds. Target ≤ 0.05.
//! - `memory.plan_gpt2_s` and `memory.plan_gpt2_rss_mib`: planning two
//!   steps of GPT-2 small (124M parameters, context 1024, batch 8, AdamW,
//!   bf16 autocast) for an 80 GiB CUDA device, and the planning process's
//!   peak resident memory. Targets ≤ 1 s and ≤ 200 MiB.
//! - `memory.offload_peak_ratio`: the peak allocated bytes of a logical host
//!   device over a forward and backward of a 32-layer, 512-wide MLP (Linear
//!   and ReLU, batch 2048) under `save_on_host` ÷ the same without it.
//!   Parameters and the batch are on the device in both; host copies are
//!   pinned where a device driver pins memory, pageable on a host-only
//!   machine (where pinning is `mlock`, capped by `RLIMIT_MEMLOCK`, and
//!   the device peak is the same either way). Target ≤ 0.5.
//! - `memory.auto_split_overhead`: a settled `AutoMicroBatch` step (an MLP
//!   784-1024-1024-10, batch 1024 in 4 micro-batches, SGD with momentum)
//!   ÷ the same accumulation written by hand (narrow, forward, loss ÷ 4,
//!   backward; step), medians of interleaved rounds. Target ≤ 1.02.
//!
//! Each runs in a child process (`--memory-worker NAME`): logical host
//! devices are created there, and the resident memory is the plan's alone.

use crate::measure::{median, time, BenchResult, Better, Figure, Options};
use brasa_alloc::AllocatorConfig;
use brasa_amp::autocast;
use brasa_autograd::{save_on_host_with, OffloadOptions, Var};
use brasa_nn::functional::cross_entropy;
use brasa_nn::models::{Gpt, GptConfig};
use brasa_nn::optim::{Adam, AdamConfig, AutoMicroBatch, AutoMicroBatchConfig, Optimizer, Sgd, SgdConfig};
use brasa_nn::{
    Conv2d, Conv2dConfig, Flatten, Linear, MaxPool2d, Module, ModuleExt, Relu, Sequential, TransformerEncoderLayer,
};
use brasa_tensor::memory::{self, category_scope, MemoryCategory};
use brasa_tensor::{DType, Device, MemoryTarget, Tensor};
use std::process::Command;

type Step = Box<dyn FnMut() -> brasa_nn::Result<()>>;
type Setup = fn(Device, usize) -> brasa_nn::Result<Step>;

const HOST_DEVICES: usize = 64;

/// The figures, each from a worker process.
pub fn run(options: &Options) -> BenchResult<Vec<Figure>> {
    let mut figures = Vec::new();
    if options.wants("memory.plan_error") {
        figures.push(Figure::new("memory.plan_error", worker_value("plan_error", "error")?, "ratio", Better::Lower));
    }
    if options.wants("memory.plan_time_ratio") {
        let ratio = worker_value("plan_time_ratio", "ratio")?;
        figures.push(Figure::new("memory.plan_time_ratio", ratio, "x", Better::Lower));
    }
    if options.wants("memory.offload_peak_ratio") {
        let ratio = worker_value("offload_peak_ratio", "ratio")?;
        figures.push(Figure::new("memory.offload_peak_ratio", ratio, "x", Better::Lower));
    }
    if options.wants("memory.auto_split_overhead") {
        let ratio = auto_split_overhead(options.reps(15, 3))?;
        figures.push(Figure::new("memory.auto_split_overhead", ratio, "x", Better::Lower));
    }
    if options.wants("memory.plan_gpt2") {
        let report = worker_report("plan_gpt2")?;
        figures.push(Figure::new("memory.plan_gpt2_s", field(&report, "seconds")?, "s", Better::Lower));
        figures.push(Figure::new("memory.plan_gpt2_rss_mib", field(&report, "peak_rss_mib")?, "MiB", Better::Lower));
    }
    Ok(figures)
}

/// One figure's work in this process (`--memory-worker NAME`): prints a JSON report.
pub fn worker(name: &str) -> BenchResult<()> {
    brasa_tensor::set_host_device_count(HOST_DEVICES)?;
    let report = match name {
        "plan_error" => format!("{{\"error\": {}}}", plan_error()?),
        "plan_time_ratio" => format!("{{\"ratio\": {}}}", plan_time_ratio()?),
        "offload_peak_ratio" => format!("{{\"ratio\": {}}}", offload_peak_ratio()?),
        "plan_gpt2" => {
            let started = std::time::Instant::now();
            let plan = memory::plan(&MemoryTarget::cuda(80 << 30), |device| gpt2_step(device, 8))?;
            let seconds = started.elapsed().as_secs_f64();
            eprintln!("{plan}");
            format!("{{\"seconds\": {seconds}, \"peak_rss_mib\": {}}}", peak_rss_mib().unwrap_or(f64::NAN))
        }
        other => return Err(format!("no memory worker `{other}`").into()),
    };
    println!("{report}");
    Ok(())
}

fn worker_report(name: &str) -> BenchResult<serde_json::Value> {
    let exe = std::env::current_exe()?;
    let output = Command::new(exe).args(["--memory-worker", name]).output()?;
    if !output.status.success() {
        return Err(format!("memory worker {name} failed: {}", String::from_utf8_lossy(&output.stderr).trim()).into());
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().rev().find(|l| l.starts_with('{')).ok_or("the memory worker printed no report")?;
    Ok(serde_json::from_str(line)?)
}

fn worker_value(name: &str, key: &str) -> BenchResult<f64> {
    field(&worker_report(name)?, key)
}

fn field(report: &serde_json::Value, key: &str) -> BenchResult<f64> {
    report.get(key).and_then(serde_json::Value::as_f64).ok_or_else(|| format!("no `{key}` in {report}").into())
}

/// Logical host device `index` with `config` (a device no other case used).
fn host_device(index: usize, expandable: bool) -> BenchResult<Device> {
    let config = AllocatorConfig::builder().expandable_segments(expandable).build()?;
    brasa_tensor::set_host_allocator_config(index, Some(config))?;
    Ok(Device::cpu(index))
}

fn plan_error() -> BenchResult<f64> {
    let cases: [(&str, Setup); 3] = [("mlp", mlp), ("cnn", cnn), ("encoder", encoder)];
    let mut worst = 0f64;
    let mut index = 1;
    for (name, setup) in cases {
        for batch in [8, 64, 256] {
            for expandable in [false, true] {
                let device = host_device(index, expandable)?;
                index += 1;
                let plan = memory::plan(&MemoryTarget::like(device)?, |d| setup(d, batch))?;
                {
                    let mut step = setup(device, batch)?;
                    for _ in 0..memory::PLANNED_STEPS {
                        step()?;
                    }
                }
                let (reserved, allocated) = (memory::max_reserved(device)?, memory::max_allocated(device)?);
                let error = (plan.peak_reserved.abs_diff(reserved) as f64 / reserved as f64)
                    .max(plan.peak_allocated.abs_diff(allocated) as f64 / allocated as f64);
                eprintln!(
                    "  {name} batch {batch} expandable {expandable}: planned {} / {} reserved / allocated, measured {reserved} / {allocated}",
                    plan.peak_reserved, plan.peak_allocated
                );
                worst = worst.max(error);
            }
        }
    }
    Ok(worst)
}

fn plan_time_ratio() -> BenchResult<f64> {
    let (mut planned, mut real) = (Vec::new(), Vec::new());
    for round in 0..5 {
        let device = host_device(1 + round, false)?;
        let target = MemoryTarget::like(device)?;
        planned.push(time(|| drop(memory::plan(&target, |d| cnn(d, 256)))));
        let mut step = cnn(device, 256)?;
        real.push(time(|| {
            for _ in 0..memory::PLANNED_STEPS {
                drop(step());
            }
        }));
    }
    let (plan_s, real_s) = (median(&mut planned), median(&mut real));
    eprintln!("  CNN batch 256, two steps: planned in {:.2} ms, run in {:.1} ms", plan_s * 1e3, real_s * 1e3);
    Ok(plan_s / real_s)
}

/// `memory.auto_split_overhead`: settled `AutoMicroBatch` steps ÷
/// hand-written accumulation of the same 4 micro-batches, interleaved.
fn auto_split_overhead(rounds: usize) -> BenchResult<f64> {
    const BATCH: usize = 1024;
    const MICRO: usize = 4;
    let device = Device::CPU;
    let model = || -> brasa_nn::Result<Sequential> {
        Ok(Sequential::new()
            .push(Linear::new(784, 1024, device)?)
            .push(Relu)
            .push(Linear::new(1024, 1024, device)?)
            .push(Relu)
            .push(Linear::new(1024, 10, device)?))
    };
    let sgd = |m: &Sequential| Sgd::new(m.parameters(), SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() });
    let x = Tensor::randn_on([BATCH, 784], DType::F32, device)?;
    let y = Tensor::from_vec_on((0..BATCH as i64).map(|i| i % 10).collect::<Vec<_>>(), [BATCH], device)?;
    let loss = |m: &Sequential, start: usize, len: usize| -> brasa_nn::Result<Var> {
        cross_entropy(&m.forward(&Var::new(x.narrow(0, start, len)?))?, &y.narrow(0, start, len)?)
    };
    let (by_hand, wrapped) = (model()?, model()?);
    let (mut hand_opt, mut auto_opt) = (sgd(&by_hand)?, sgd(&wrapped)?);
    let mut auto =
        AutoMicroBatch::with_config(AutoMicroBatchConfig { initial_micro_batches: MICRO, ..Default::default() })?;
    let mut hand_step = || -> brasa_nn::Result<()> {
        for k in 0..MICRO {
            loss(&by_hand, k * BATCH / MICRO, BATCH / MICRO)?.div_scalar(MICRO as f64)?.backward()?;
        }
        hand_opt.step()?;
        hand_opt.zero_grad()
    };
    let mut auto_step = || -> brasa_nn::Result<()> {
        let report = auto.step(BATCH, &mut auto_opt, |rows| loss(&wrapped, rows.start, rows.len()))?;
        assert_eq!(report.micro_batches, MICRO, "the wrapper must stay settled: {report}");
        Ok(())
    };
    // Warm both (optimizer state, allocator cache), then interleave.
    hand_step()?;
    auto_step()?;
    let (mut hand, mut wrapped_times) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        hand.push(crate::measure::try_time(&mut hand_step)?);
        wrapped_times.push(crate::measure::try_time(&mut auto_step)?);
    }
    let (hand_s, auto_s) = (median(&mut hand), median(&mut wrapped_times));
    eprintln!("  batch {BATCH} in {MICRO}: by hand {:.2} ms, AutoMicroBatch {:.2} ms", hand_s * 1e3, auto_s * 1e3);
    Ok(auto_s / hand_s)
}

/// The batch of `memory.offload_peak_ratio`'s MLP.
const OFFLOAD_BATCH: usize = 2048;

fn offload_peak_ratio() -> BenchResult<f64> {
    // Pinned copies pay off where a device driver pins them (asynchronous
    // copies back); `mlock`ed ones would only be capped by RLIMIT_MEMLOCK.
    let pin_memory = memory::pinned_memory_driver()?.is_some();
    let options = OffloadOptions { pin_memory, ..OffloadOptions::default() };
    let plain = offload_mlp_peak(host_device(60, false)?, None)?;
    let offloaded = offload_mlp_peak(host_device(61, false)?, Some(options))?;
    let mib = |bytes: usize| bytes as f64 / f64::from(1 << 20);
    eprintln!(
        "  32×512 MLP, batch {OFFLOAD_BATCH}: peak {:.1} MiB with save_on_host ({} host memory), {:.1} MiB without",
        mib(offloaded),
        if pin_memory { "pinned" } else { "pageable" },
        mib(plain)
    );
    Ok(offloaded as f64 / plain as f64)
}

/// The device's peak allocated bytes over a forward and backward of the
/// 32×512 MLP, offloading with `offload` when given.
fn offload_mlp_peak(device: Device, offload: Option<OffloadOptions>) -> BenchResult<usize> {
    let mut model = Sequential::new();
    for _ in 0..32 {
        model = model.push(Linear::new(512, 512, device)?).push(Relu);
    }
    let x = {
        let _input = category_scope(MemoryCategory::Input);
        Var::new(Tensor::randn_on([OFFLOAD_BATCH, 512], DType::F32, device)?)
    };
    memory::reset_peak(device)?;
    let loss = {
        let _offload = offload.map(save_on_host_with);
        model.forward(&x)?.mean_all()?
    };
    loss.backward()?;
    Ok(memory::max_allocated(device)?)
}

/// A batch counted as input, and the step: forward, loss, backward, Adam.
fn training_step(model: Sequential, device: Device, batch: usize, features: &[usize]) -> brasa_nn::Result<Step> {
    let (x, y) = {
        let _input = category_scope(MemoryCategory::Input);
        let x = Tensor::randn_on([&[batch][..], features].concat(), DType::F32, device)?;
        let ids: Vec<i64> = (0..batch as i64).map(|i| i % 10).collect();
        (x, Tensor::from_slice_on(&ids, [batch], device)?)
    };
    let mut opt = Adam::new(model.parameters(), AdamConfig::default())?;
    Ok(Box::new(move || {
        let loss = cross_entropy(&model.forward(&Var::new(x.clone()))?, &y)?;
        loss.backward()?;
        opt.step()?;
        opt.zero_grad()?;
        Ok(())
    }))
}

fn mlp(device: Device, batch: usize) -> brasa_nn::Result<Step> {
    let model = Sequential::new()
        .push(Linear::new(784, 512, device)?)
        .push(Relu)
        .push(Linear::new(512, 512, device)?)
        .push(Relu)
        .push(Linear::new(512, 10, device)?);
    training_step(model, device, batch, &[784])
}

fn cnn(device: Device, batch: usize) -> brasa_nn::Result<Step> {
    let model = Sequential::new()
        .push(Conv2d::with_config(1, 32, 3, Conv2dConfig::default().padding(1), device)?)
        .push(Relu)
        .push(MaxPool2d::new(2)?)
        .push(Conv2d::with_config(32, 64, 3, Conv2dConfig::default().padding(1), device)?)
        .push(Relu)
        .push(MaxPool2d::new(2)?)
        .push(Flatten::new())
        .push(Linear::new(64 * 7 * 7, 10, device)?);
    training_step(model, device, batch, &[1, 28, 28])
}

fn encoder(device: Device, batch: usize) -> brasa_nn::Result<Step> {
    let model = Sequential::new()
        .push(TransformerEncoderLayer::new(128, 4, device)?)
        .push(Flatten::new())
        .push(Linear::new(32 * 128, 10, device)?);
    training_step(model, device, batch, &[32, 128])
}

/// GPT-2 small with AdamW; the step under bf16 autocast.
fn gpt2_step(device: Device, batch: usize) -> brasa_nn::Result<impl FnMut() -> brasa_nn::Result<()>> {
    let config = GptConfig::gpt2();
    let context = config.block_size;
    let model = Gpt::new(config, device)?;
    let mut opt = Adam::new(model.parameters(), AdamConfig { lr: 6e-4, weight_decay: 0.1, ..AdamConfig::adamw() })?;
    let ids = {
        let _input = category_scope(MemoryCategory::Input);
        Tensor::zeros_on([batch, context], DType::I64, device)?
    };
    Ok(move || {
        let loss = {
            let _amp = autocast(DType::BF16);
            model.loss(&ids, &ids)?
        };
        loss.backward()?;
        opt.step()?;
        opt.zero_grad()?;
        Ok(())
    })
}

/// This process's peak resident memory (Linux's `VmHWM`).
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<f64>().ok()? / 1024.0)
}
