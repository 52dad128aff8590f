//! Trains a classifier on the bundled UCI digits (1,797 8x8 images, fixed
//! 80/20 split) and reports what a practitioner watches: a progress bar with
//! loss and throughput, per-epoch accuracy on the held-out 20 %, the device's
//! allocated / reserved / peak memory, and finally `test_accuracy=0.9xxx`.
//!
//! ```text
//! cargo run --release --example train_digits                  # MLP 64-128-10, Adam
//! cargo run --release --example train_digits -- --model cnn   # a small CNN
//! cargo run --release --example train_digits -- --profile     # + trace.json and memory.html
//! cargo run --release --example train_digits -- --devices 2   # DDP over 2 logical host devices
//! cargo run --release --example train_digits -- --devices 4 --shard zero2   # DDP + ZeRO-2 over 4
//! cargo run --release --example train_digits -- --devices 4 --shard full    # FSDP over 4
//! cargo run --release --features cuda --example train_digits -- --devices cuda:0,cuda:1   # DDP over NCCL
//! cargo run --release --example train_digits -- --batch-size 1024 --memory-limit 2MiB   # survives OOM
//! cargo run --release --example train_digits --features cuda -- --device cuda:0   # on a GPU
//! ```
//!
//! Three training steps of the first epoch are profiled; their op table is
//! printed at the end. Options: `--model mlp|cnn`, `--bf16` (train under
//! bf16 autocast), `--devices N` (DistributedDataParallel over N logical
//! host devices in this process, one thread each; every global batch is
//! split across them, so hyperparameters and accuracy stay those of one
//! device), `--shard none|zero2|full` (with `--devices N`, how the ranks
//! share the model states — parameters, gradients, Adam's state: `none`,
//! plain DDP, every rank holds all of them; `zero2`, DDP with
//! `ZeroStage::Two` and a `ZeroOptimizer`, every rank keeps 1/N of the
//! gradients and of Adam's state; `full`, `FullyShardedDataParallel`
//! (ZeRO-3), every rank keeps 1/N of all three and gathers each layer's
//! parameters just before it runs; the same mathematics, so the same
//! accuracy, and at the end each rank's model states are printed, to
//! compare the modes), `--epochs N`,
//! `--batch-size N|auto` (`auto`: the largest batch whose step fits the
//! device, found by memory plans and confirmed by one real step), `--lr X`,
//! `--seed N`, `--workers N`, `--plan` (print the step's memory plan for
//! the device before training: peaks, categories, the largest tensors),
//! `--memory-limit SIZE` (train on logical host device `cpu:1` limited to
//! SIZE, e.g. `2MiB` — with `--devices N`, on `cpu:1..=N`, each limited —
//! through `AutoMicroBatch`: a step that runs out of memory is split into
//! micro-batches and retried, the batch staying what it is, and what it
//! did is printed), `--profile [DIR]` (also write the Chrome trace and the memory timeline
//! to DIR, default `target/profile`).

use brasa::nn::data::{DataLoader, Digits, TensorDataset};
use brasa::nn::functional::cross_entropy;
use brasa::nn::optim::{Adam, AdamConfig, AutoMicroBatch, Optimizer};
use brasa::nn::{Conv2d, Conv2dConfig, Flatten, Linear, MaxPool2d, Module, ModuleExt, Relu, Sequential};
use brasa::prelude::*;
use brasa::profile::{schedule, Profiler, SortBy, TableOptions};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::time::Instant;

use brasa::nn::Result;
use brasa::parallel::{
    ensure_host_devices, run_in_process, run_on_devices, CommBackend, CommOptions, Communicator, DdpConfig,
    DistributedDataParallel, FsdpConfig, FullyShardedDataParallel, LaunchOptions, MemoryBreakdown, ParallelError,
    ZeroOptimizer, ZeroStage,
};

type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// How the ranks of `--devices N` share the model states (`--shard`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shard {
    /// DDP: every rank holds the parameters, gradients and Adam's state.
    None,
    /// DDP with ZeRO-2: gradients and Adam's state sharded.
    Zero2,
    /// FSDP (ZeRO-3): parameters, gradients and Adam's state sharded.
    Full,
}

impl Shard {
    /// How the header line names the data parallelism.
    fn describe(self) -> &'static str {
        match self {
            Shard::None => "DDP",
            Shard::Zero2 => "DDP + ZeRO-2",
            Shard::Full => "FSDP",
        }
    }

    fn flag(self) -> &'static str {
        match self {
            Shard::None => "none",
            Shard::Zero2 => "zero2",
            Shard::Full => "full",
        }
    }
}

struct Args {
    cnn: bool,
    bf16: bool,
    devices: usize,
    /// `--devices cuda:0,cuda:1`: the ranks' devices named one by one.
    device_list: Option<Vec<Device>>,
    /// `--backend`: the engine of a `--devices` list (NCCL for GPUs).
    backend: CommBackend,
    shard: Shard,
    device: Device,
    epochs: usize,
    batch_size: usize,
    auto_batch: bool,
    plan: bool,
    lr: f64,
    seed: u64,
    workers: usize,
    profile: Option<PathBuf>,
    memory_limit: Option<usize>,
}

/// The options of the command line `cli` (without the program's name).
fn parse_args(cli: Vec<String>) -> AnyResult<Args> {
    let mut args = Args {
        cnn: false,
        bf16: false,
        devices: 1,
        device_list: None,
        backend: CommBackend::InProcess,
        shard: Shard::None,
        device: Device::CPU,
        epochs: 30,
        batch_size: 32,
        auto_batch: false,
        plan: false,
        lr: 2e-3,
        seed: 0,
        workers: 1,
        profile: None,
        memory_limit: None,
    };
    let mut it = cli.into_iter().peekable();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--model" => match value("--model")?.as_str() {
                "mlp" => args.cnn = false,
                "cnn" => args.cnn = true,
                other => return Err(format!("--model {other}: expected mlp or cnn").into()),
            },
            "--bf16" => args.bf16 = true,
            "--devices" => {
                let text = value("--devices")?;
                if text.contains(':') || text.contains(',') {
                    let list = text
                        .split(',')
                        .map(|d| d.trim().parse::<Device>())
                        .collect::<std::result::Result<Vec<_>, _>>()?;
                    args.devices = list.len();
                    // GPUs talk over NCCL unless --backend says otherwise.
                    if list.iter().all(|d| matches!(d, Device::Cuda(_))) {
                        args.backend = CommBackend::Nccl;
                    }
                    args.device_list = Some(list);
                } else {
                    args.devices = text.parse()?;
                }
            }
            "--backend" => {
                args.backend = match value("--backend")?.as_str() {
                    "nccl" => CommBackend::Nccl,
                    "in-process" => CommBackend::InProcess,
                    other => return Err(format!("--backend {other}: expected nccl or in-process").into()),
                }
            }
            "--shard" => match value("--shard")?.as_str() {
                "none" => args.shard = Shard::None,
                "zero2" => args.shard = Shard::Zero2,
                "full" => args.shard = Shard::Full,
                other => return Err(format!("--shard {other}: expected none, zero2 or full").into()),
            },
            "--device" => args.device = value("--device")?.parse()?,
            "--epochs" => args.epochs = value("--epochs")?.parse()?,
            "--batch-size" => match value("--batch-size")?.as_str() {
                "auto" => args.auto_batch = true,
                n => args.batch_size = n.parse()?,
            },
            "--plan" => args.plan = true,
            "--memory-limit" => {
                let text = value("--memory-limit")?;
                let limit = brasa::tensor::parse_byte_size(&text)
                    .ok_or_else(|| format!("--memory-limit {text}: expected a size such as 2MiB or 512KiB"))?;
                args.memory_limit = Some(limit);
            }
            "--lr" => args.lr = value("--lr")?.parse()?,
            "--seed" => args.seed = value("--seed")?.parse()?,
            "--workers" => args.workers = value("--workers")?.parse()?,
            "--profile" => {
                let dir = match it.peek() {
                    Some(next) if !next.starts_with("--") => it.next().unwrap_or_default(),
                    _ => "target/profile".to_string(),
                };
                args.profile = Some(PathBuf::from(dir));
            }
            "-h" | "--help" => {
                println!(
                    "train_digits [--model mlp|cnn] [--bf16] [--device cpu|cuda:N] [--devices N|DEV,DEV,..] [--backend nccl|in-process] [--shard none|zero2|full] [--epochs N] [--batch-size N|auto] [--lr X] [--seed N] [--workers N] \
                     [--plan] [--memory-limit SIZE] [--profile [DIR]]\n\
                     --shard, with --devices N (how the N ranks share parameters, gradients and Adam's state):\n  \
                     none   DistributedDataParallel: every rank holds all of them (default)\n  \
                     zero2  DDP + ZeroOptimizer (ZeRO-2): every rank keeps 1/N of the gradients and of Adam's state\n  \
                     full   FullyShardedDataParallel (ZeRO-3): every rank keeps 1/N of all three"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown option {other} (try --help)").into()),
        }
    }
    if args.devices == 0 {
        return Err("--devices must be at least 1".into());
    }
    if args.shard != Shard::None && args.devices < 2 {
        return Err(format!(
            "--shard {} shards the model states over data-parallel ranks: it needs --devices N (N >= 2)",
            args.shard.flag()
        )
        .into());
    }
    if args.shard == Shard::Full && args.memory_limit.is_some() {
        return Err("--memory-limit splits steps through DDP's no_sync: use it without --shard full".into());
    }
    if args.device_list.is_some() && (args.memory_limit.is_some() || args.device != Device::CPU) {
        return Err("--devices DEV,DEV,.. names every rank's device: leave --device and --memory-limit out".into());
    }
    if args.devices > 1 && args.device != Device::CPU {
        return Err("--devices N runs DDP over logical host devices: leave --device out".into());
    }
    if args.devices > 1 && (args.plan || args.auto_batch) {
        return Err("--plan and --batch-size auto plan one device: leave --devices out".into());
    }
    if args.memory_limit.is_some() && !matches!(args.device, Device::Cpu(0)) {
        return Err("--memory-limit trains on limited logical host devices: leave --device out".into());
    }
    Ok(args)
}

/// What the training loop below holds on `device` at a step, for memory
/// plans: the data set (all samples, the training and test splits), the
/// model and Adam, the batch being trained on and those the loader's
/// workers read ahead (`workers × (prefetch + 1)`: each worker's queue and
/// the one it is reading), then the step itself followed by the epoch's
/// evaluation on the test split (no graph).
fn planned_step(args: &Args, device: Device, batch: usize) -> Result<impl FnMut() -> Result<()>> {
    const PREFETCH: usize = 2; // the loader's default prefetch_factor
    let features: &[usize] = if args.cnn { &[1, 8, 8] } else { &[64] };
    let rows = |n: usize| [&[n][..], features].concat();
    let test_len = Digits::LEN - (Digits::LEN as f64 * Digits::TRAIN_FRACTION) as usize;
    let data = |n: usize| -> Result<(Tensor, Tensor)> {
        let _input = memory::category_scope(memory::MemoryCategory::Input);
        Ok((Tensor::zeros_on(rows(n), DType::F32, device)?, Tensor::zeros_on([n], DType::I64, device)?))
    };
    let resident = [data(Digits::LEN)?, data(Digits::LEN - test_len)?, data(test_len)?];
    let model = if args.cnn { cnn(device)? } else { mlp(device)? };
    let mut opt = Adam::new(model.parameters(), AdamConfig { lr: args.lr, ..Default::default() })?;
    let read_ahead = (0..args.workers * (PREFETCH + 1)).map(|_| data(batch)).collect::<Result<Vec<_>>>()?;
    let (x, y) = data(batch)?;
    let bf16 = args.bf16;
    Ok(move || {
        let _held = (&resident, &read_ahead);
        let loss = {
            let _amp = autocast(if bf16 { DType::BF16 } else { DType::F32 });
            cross_entropy(&model.forward(&Var::new(x.clone()))?, &y)?
        };
        loss.backward()?;
        opt.step()?;
        opt.zero_grad()?;
        drop(loss);
        // The epoch's evaluation, as `accuracy` runs it.
        let _no_grad = no_grad();
        let (test_x, test_y) = &resident[2];
        let predicted = model.forward(&Var::new(test_x.clone()))?.tensor().argmax(&[-1], false)?;
        drop(predicted.eq(test_y)?.to_dtype(DType::F64)?.sum_all()?);
        Ok(())
    })
}

/// `--plan` and `--batch-size auto`, before training.
fn plan_memory(args: &mut Args, samples: usize) -> AnyResult<()> {
    if args.auto_batch {
        let search =
            memory::max_batch_size(args.device, samples, true, |device, batch| planned_step(args, device, batch))?;
        println!(
            "batch size: {} is the largest that fits {} ({} plans, confirmed by one real step){}",
            search.batch,
            args.device,
            search.plans,
            match (search.next, search.next_lacks) {
                (Some(next), Some(lack)) => format!("; {next} would need {} more", mib(lack)),
                _ => format!("; the whole training set ({samples}) fits"),
            }
        );
        if search.batch == 0 {
            return Err(format!("not even a batch of 1 fits {}", args.device).into());
        }
        args.batch_size = search.batch;
    }
    if args.plan {
        let target = brasa::tensor::MemoryTarget::like(args.device)?;
        let plan = memory::plan(&target, |device| planned_step(args, device, args.batch_size))?;
        println!("{plan}");
        if !plan.fits {
            return Err(format!(
                "batch size {} does not fit {}: stopping before training (try --batch-size auto)",
                args.batch_size, args.device
            )
            .into());
        }
    }
    Ok(())
}

fn mlp(dev: Device) -> Result<Sequential> {
    Ok(Sequential::new().push(Linear::new(64, 128, dev)?).push(Relu).push(Linear::new(128, 10, dev)?))
}

/// [1, 8, 8] → conv 3x3 (16) → pool → [16, 4, 4] → conv 3x3 (32) → pool → [32, 2, 2] → linear.
fn cnn(dev: Device) -> Result<Sequential> {
    Ok(Sequential::new()
        .push(Conv2d::with_config(1, 16, 3, Conv2dConfig::default().padding(1), dev)?)
        .push(Relu)
        .push(MaxPool2d::new(2)?)
        .push(Conv2d::with_config(16, 32, 3, Conv2dConfig::default().padding(1), dev)?)
        .push(Relu)
        .push(MaxPool2d::new(2)?)
        .push(Flatten::new())
        .push(Linear::new(128, 10, dev)?))
}

/// Accuracy on a whole dataset, in evaluation mode and without a graph, in
/// chunks of 128 samples (so that it fits wherever a training step does).
/// With FSDP a collective: every rank evaluates (see [`Net::evaluate`]).
fn accuracy(net: &mut Net, data: &TensorDataset) -> Result<f64> {
    const CHUNK: usize = 128;
    net.set_training(false);
    let device = net.parameters().first().map_or(Device::CPU, |p| p.device());
    let mut correct = 0.0;
    {
        let _no_grad = no_grad();
        for start in (0..data.len()).step_by(CHUNK) {
            let len = CHUNK.min(data.len() - start);
            let logits = net.evaluate(&Var::new(data.features().narrow(0, start, len)?.to(device)?))?;
            let predicted = logits.tensor().argmax(&[-1], false)?;
            let labels = data.labels().narrow(0, start, len)?.to(device)?;
            correct += predicted.eq(&labels)?.to_dtype(DType::F64)?.sum_all()?.item::<f64>()?;
        }
    }
    net.set_training(true);
    Ok(correct / data.len() as f64)
}

fn mib(bytes: usize) -> String {
    brasa::alloc::format_size(bytes)
}

/// The model, alone on one device, replicated by DDP on every rank (its
/// gradients and Adam's state sharded with ZeRO-2), or sharded by FSDP.
enum Net {
    Local(Sequential),
    Ddp(DistributedDataParallel<Sequential>),
    Fsdp(FullyShardedDataParallel),
}

impl Net {
    fn forward(&self, x: &Var) -> brasa::parallel::Result<Var> {
        match self {
            Net::Local(model) => Ok(model.forward(x)?),
            Net::Ddp(ddp) => ddp.forward(x),
            Net::Fsdp(fsdp) => fsdp.forward(x),
        }
    }

    /// The forward of an evaluation (no graph): the replica itself, which
    /// rank 0 runs alone; with FSDP the sharded model, whose every forward
    /// gathers each layer from all ranks, so every rank runs it.
    fn evaluate(&self, x: &Var) -> Result<Var> {
        match self {
            Net::Local(model) => model.forward(x),
            Net::Ddp(ddp) => ddp.module().forward(x),
            Net::Fsdp(fsdp) => Ok(fsdp.forward(x)?),
        }
    }

    /// Whether evaluating is a collective that every rank takes part in.
    fn evaluates_on_every_rank(&self) -> bool {
        matches!(self, Net::Fsdp(_))
    }

    fn set_training(&mut self, on: bool) {
        match self {
            Net::Local(model) if on => model.train(),
            Net::Local(model) => model.eval(),
            Net::Ddp(ddp) if on => ddp.module_mut().train(),
            Net::Ddp(ddp) => ddp.module_mut().eval(),
            Net::Fsdp(fsdp) if on => fsdp.train(),
            Net::Fsdp(fsdp) => fsdp.eval(),
        }
    }

    /// What the optimizer updates: the model's parameters, or with FSDP
    /// this rank's shards.
    fn parameters(&self) -> Vec<Var> {
        match self {
            Net::Local(model) => model.parameters(),
            Net::Ddp(ddp) => ddp.module().parameters(),
            Net::Fsdp(fsdp) => fsdp.parameters(),
        }
    }

    /// This rank's model states (parameters, gradients, optimizer state)
    /// and communication buffers now.
    fn model_states(&self, opt: &Optim) -> MemoryBreakdown {
        match (self, opt) {
            (Net::Fsdp(fsdp), _) => fsdp.memory_breakdown(&**opt),
            (_, Optim::Zero(zero)) => zero.memory_breakdown(),
            (net, opt) => MemoryBreakdown::measure(&net.parameters(), &[], &**opt, 0),
        }
    }
}

/// Adam, over the whole model (or FSDP's shards), or over this rank's
/// shards of DDP's buckets with ZeRO.
enum Optim {
    Adam(Adam),
    Zero(ZeroOptimizer<Adam>),
}

impl std::ops::Deref for Optim {
    type Target = dyn Optimizer;
    fn deref(&self) -> &Self::Target {
        match self {
            Optim::Adam(adam) => adam,
            Optim::Zero(zero) => zero,
        }
    }
}

impl std::ops::DerefMut for Optim {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match self {
            Optim::Adam(adam) => adam,
            Optim::Zero(zero) => zero,
        }
    }
}

/// Every rank's `states` on rank 0 (a collective: every rank calls it);
/// `None` for a rank that measured none.
fn gather_model_states(comm: &Communicator, states: Option<MemoryBreakdown>) -> Result<Vec<Option<MemoryBreakdown>>> {
    let mine = match states {
        Some(m) => [m.parameters, m.gradients, m.optimizer_state, m.communication_buffers].map(|b| b as f64),
        None => [-1.0; 4],
    };
    let input = Tensor::from_vec_on(mine.to_vec(), [4], comm.device())?;
    let all = Tensor::zeros_on([4 * comm.world_size()], DType::F64, comm.device())?;
    comm.all_gather(&all, &input)?;
    Ok(all
        .to_vec::<f64>()?
        .chunks(4)
        .map(|b| {
            (b[0] >= 0.0).then(|| MemoryBreakdown {
                parameters: b[0] as usize,
                gradients: b[1] as usize,
                optimizer_state: b[2] as usize,
                communication_buffers: b[3] as usize,
            })
        })
        .collect())
}

/// The model states of `--shard` of each rank (on `devices[rank]`) as a
/// table, each also as a share of one unsharded replica's (`replica`:
/// P + G + 2P, f32 Adam).
fn print_model_states(
    shard: Shard,
    devices: &[Device],
    per_rank: &[Option<MemoryBreakdown>],
    replica: usize,
    after_zero_grad: bool,
) {
    println!(
        "model states per rank, --shard {} ({}), after an optimizer step of the last epoch{}:",
        shard.flag(),
        shard.describe(),
        if after_zero_grad { " and its zero_grad (gradients not counted)" } else { ", before zero_grad" }
    );
    println!(
        "  {:<6}{:>13}{:>13}{:>17}{:>15}{:>15}{:>12}",
        "rank", "parameters", "gradients", "optimizer state", "comm buffers", "model states", "of replica"
    );
    for (device, states) in devices.iter().zip(per_rank) {
        let name = device.to_string();
        match states {
            Some(m) => println!(
                "  {name:<6}{:>13}{:>13}{:>17}{:>15}{:>15}{:>11.1}%",
                mib(m.parameters),
                mib(m.gradients),
                mib(m.optimizer_state),
                mib(m.communication_buffers),
                mib(m.model_states()),
                100.0 * m.model_states() as f64 / replica.max(1) as f64
            ),
            None => println!("  {name:<6} no step measured"),
        }
    }
    println!("  one unsharded replica: P + G + 2P (f32 Adam) = {}", mib(replica));
}

/// This rank's rows of a global batch: rows [rank·b/n, (rank+1)·b/n).
fn shard(t: &Tensor, rank: usize, world: usize) -> Result<Tensor> {
    let rows = t.dims()[0];
    let (start, end) = (rows * rank / world, rows * (rank + 1) / world);
    Ok(t.narrow(0, start, end - start)?)
}

fn main() -> AnyResult<()> {
    run(std::env::args().skip(1).collect())?;
    Ok(())
}

/// What a run measured, as rank 0 saw it (`tests/train_digits_shard.rs`
/// compares the `--shard` modes with it).
#[derive(Clone, Debug, Default)]
#[allow(dead_code)] // read by the test, not by `main`
pub(crate) struct Outcome {
    /// Accuracy on the held-out 20 % after training.
    pub(crate) test_accuracy: f64,
    /// The mean training loss of the last epoch.
    pub(crate) last_loss: f64,
    /// Each rank's model states after a step of the last epoch (empty on
    /// one device).
    pub(crate) model_states: Vec<Option<MemoryBreakdown>>,
    /// One unsharded replica's model states, P + G + 2P (f32 Adam).
    pub(crate) replica_bytes: usize,
    /// With FSDP: the test accuracy of the unsharded model loaded from the
    /// full state dict.
    pub(crate) unsharded: Option<f64>,
}

/// Trains as the command line `cli` (without the program's name) says.
pub(crate) fn run(cli: Vec<String>) -> AnyResult<Outcome> {
    let mut args = parse_args(cli)?;
    if let Some(limit) = args.memory_limit {
        // Logical host devices cpu:1..=N, limited, before the first tensor
        // (cpu:0, unlimited, holds the data set).
        ensure_host_devices(args.devices + 1)?;
        for index in 1..=args.devices {
            brasa::tensor::set_host_memory_limit(index, Some(limit))?;
        }
        args.device = Device::cpu(1);
    }
    if args.plan || args.auto_batch {
        plan_memory(&mut args, (Digits::LEN as f64 * Digits::TRAIN_FRACTION) as usize)?;
    }
    let rank_main = |comm| {
        train(&args, Some(comm)).map_err(|e| match e.downcast::<ParallelError>() {
            Ok(parallel) => *parallel,
            Err(other) => ParallelError::invalid("train_digits", other.to_string()),
        })
    };
    if let Some(devices) = &args.device_list {
        // Logical host devices named in the list must exist before the first tensor.
        let host_devices = devices.iter().filter_map(|d| if let Device::Cpu(i) = d { Some(i + 1) } else { None }).max();
        if let Some(count) = host_devices {
            ensure_host_devices(count)?;
        }
        // One rank per named device (cuda:0,cuda:1: DDP over NCCL).
        let options = LaunchOptions { comm: CommOptions::default().backend(args.backend), threads_per_rank: Some(1) };
        let outcomes = run_on_devices(devices, &options, rank_main)?;
        return Ok(outcomes.into_iter().next().unwrap_or_default());
    }
    if args.devices == 1 {
        return train(&args, None);
    }
    // Logical host devices must exist before the first tensor.
    ensure_host_devices(args.devices)?;
    let threads = (std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) / args.devices).max(1);
    let options = LaunchOptions { threads_per_rank: Some(threads), ..LaunchOptions::default() };
    let outcomes = if args.memory_limit.is_some() {
        let devices: Vec<Device> = (1..=args.devices).map(Device::cpu).collect();
        run_on_devices(&devices, &options, rank_main)?
    } else {
        run_in_process(args.devices, &options, rank_main)?
    };
    Ok(outcomes.into_iter().next().unwrap_or_default())
}

/// Trains on this rank's share of every batch (the whole batch without a
/// communicator); rank 0 reports (the other ranks' outcomes are empty).
fn train(args: &Args, comm: Option<Communicator>) -> AnyResult<Outcome> {
    let (rank, world) = comm.as_ref().map(|c| (c.rank(), c.world_size())).unwrap_or((0, 1));
    let lead = rank == 0;
    let dev = comm.as_ref().map(|c| c.device()).unwrap_or(args.device);
    // The data set stays on the host for the whole run: counted as input.
    let (_digits, train, test) = {
        let _input = memory::category_scope(memory::MemoryCategory::Input);
        let digits = Digits::load()?;
        let (train, test) = if args.cnn { digits.train_test_images()? } else { digits.train_test()? };
        (digits, train, test)
    };
    // The seeded generator is process-wide and in-process ranks are threads:
    // rank 0 draws its initial weights (the ones DDP broadcasts) before the
    // others start drawing, so runs are reproducible.
    if let (Some(comm), false) = (&comm, lead) {
        comm.barrier()?;
    }
    manual_seed(args.seed);
    let model = if args.cnn { cnn(dev)? } else { mlp(dev)? };
    if let (Some(comm), true) = (&comm, lead) {
        comm.barrier()?;
    }
    let num_parameters = model.num_parameters();
    // One unsharded replica's parameter bytes (P), for the model states at the end.
    let param_bytes: usize = model.parameters().iter().map(|p| p.tensor().numel() * p.dtype().size_in_bytes()).sum();
    let adam = AdamConfig { lr: args.lr, ..Default::default() };
    // Rank 0's initial weights are broadcast to every rank.
    let (mut net, mut opt) = match (&comm, args.shard) {
        (None, _) => {
            let net = Net::Local(model);
            let opt = Optim::Adam(Adam::new(net.parameters(), adam)?);
            (net, opt)
        }
        (Some(comm), Shard::None) => {
            let net = Net::Ddp(DistributedDataParallel::new(model, comm.clone(), DdpConfig::default())?);
            let opt = Optim::Adam(Adam::new(net.parameters(), adam)?);
            (net, opt)
        }
        (Some(comm), Shard::Zero2) => {
            let config = DdpConfig { zero: Some(ZeroStage::Two), ..DdpConfig::default() };
            let ddp = DistributedDataParallel::new(model, comm.clone(), config)?;
            // Adam over this rank's shards of DDP's buckets.
            let opt = Optim::Zero(ZeroOptimizer::new(&ddp, |shards| Adam::new(shards, adam))?);
            (Net::Ddp(ddp), opt)
        }
        (Some(comm), Shard::Full) => {
            // Each layer of the Sequential is a unit, sharded over the ranks.
            let fsdp = FullyShardedDataParallel::new(model, comm.clone(), FsdpConfig::default())?;
            let opt = Optim::Adam(Adam::new(fsdp.parameters(), adam)?);
            (Net::Fsdp(fsdp), opt)
        }
    };
    let loader = DataLoader::builder(train.clone())
        .batch_size(args.batch_size)
        .shuffle(true)
        .seed(args.seed)
        .num_workers(args.workers)
        .device(dev)
        .build()?;
    if lead {
        println!(
            "digits: {} train / {} test samples · {} · {} parameters · {} epochs of {} batches{}",
            train.len(),
            test.len(),
            if args.cnn { "CNN" } else { "MLP 64-128-10" },
            num_parameters,
            args.epochs,
            loader.len(),
            if world > 1 {
                // Rank r works on cpu:r, or on cpu:r+1 with --memory-limit.
                let first = usize::from(args.memory_limit.is_some());
                format!(" · {} over {world} devices (cpu:{first}..cpu:{})", args.shard.describe(), first + world - 1)
            } else {
                String::new()
            }
        );
    }

    // Profile steps 2..=4 of the first epoch (step 0 waits, step 1 warms up).
    // The profiler is process-wide: with DDP it records every rank's thread
    // and communication stream.
    let mut profiler = if lead {
        Some(Profiler::builder().record_shapes(true).profile_memory(true).schedule(schedule(1, 1, 3, 1, 0)?).start()?)
    } else {
        None
    };
    let mut op_table = None;
    // With --memory-limit: steps that split themselves when they run out of memory.
    let mut auto = args.memory_limit.map(|_| AutoMicroBatch::new());
    // This rank's model states after the first step of the last epoch.
    let mut states = None;
    let mut last_loss = 0.0;

    let started = Instant::now();
    let style = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")?.progress_chars("=> ");
    for epoch in 0..args.epochs {
        let bar =
            if lead { ProgressBar::new(loader.len() as u64) } else { ProgressBar::hidden() }.with_style(style.clone());
        bar.set_prefix(format!("epoch {:>2}/{}", epoch + 1, args.epochs));
        let epoch_start = Instant::now();
        let (mut loss_sum, mut seen) = (0.0, 0usize);
        for batch in loader.epoch(epoch as u64) {
            let (x, y) = batch?;
            if x.dims()[0] < world {
                continue; // too few rows to give every rank one (same on every rank)
            }
            let (x, y) = (shard(&x, rank, world)?, shard(&y, rank, world)?);
            let measure = epoch + 1 == args.epochs && states.is_none();
            let loss = {
                let _step = brasa::profile::record_function("train_step");
                // bf16 products and convolutions, f32 softmax and loss (a no-op region without --bf16).
                let amp = || autocast(if args.bf16 { DType::BF16 } else { DType::F32 });
                match auto.as_mut() {
                    None => {
                        let loss = {
                            let _amp = amp();
                            cross_entropy(&net.forward(&Var::new(x.contiguous()?))?, &y)?
                        };
                        loss.backward()?; // with DDP: gradients averaged across ranks as backward runs
                        opt.step()?;
                        if measure {
                            states = Some(net.model_states(&opt));
                        }
                        opt.zero_grad()?;
                        loss.item()?
                    }
                    Some(auto) => {
                        // The batch's loss: each micro-batch's mean weighed by its
                        // rows (an attempt that runs out of memory starts over).
                        let (rows, mut loss) = (y.numel(), 0.0);
                        let micro = |range: std::ops::Range<usize>| {
                            if range.start == 0 {
                                loss = 0.0;
                            }
                            let (start, len) = (range.start, range.len());
                            let micro_loss = {
                                let _amp = amp();
                                let input = Var::new(x.narrow(0, start, len)?.contiguous()?);
                                cross_entropy(&net.forward(&input)?, &y.narrow(0, start, len)?)?
                            };
                            loss += micro_loss.item()? * len as f64 / rows as f64;
                            Ok::<_, ParallelError>(micro_loss)
                        };
                        let report = match &net {
                            Net::Ddp(ddp) => auto.step_with_peers(rows, &mut *opt, ddp, micro)?,
                            Net::Local(_) => auto.step(rows, &mut *opt, micro)?,
                            Net::Fsdp(_) => return Err("--memory-limit does not support --shard full".into()),
                        };
                        if measure {
                            states = Some(net.model_states(&opt));
                        }
                        if report.changed_split() && lead {
                            let line = format!("epoch {} step {}: {report}", epoch + 1, bar.position());
                            bar.suspend(|| println!("{line}"));
                        }
                        loss
                    }
                }
            };
            loss_sum += loss * y.numel() as f64; // a number, not a graph
            seen += y.numel();
            if let Some(p) = profiler.as_mut() {
                p.step();
            }
            bar.inc(1);
            bar.set_message(format!(
                "loss {:.4} · {:.0} samples/s",
                loss_sum / seen as f64,
                (seen * world) as f64 / epoch_start.elapsed().as_secs_f64()
            ));
        }
        bar.finish_and_clear();
        if let Some(p) = profiler.take() {
            let result = p.stop();
            op_table =
                Some(result.key_averages().table(&TableOptions::default().sort_by(SortBy::SelfCpu).row_limit(12)));
            if let Some(dir) = &args.profile {
                std::fs::create_dir_all(dir)?;
                result.export_chrome_trace(dir.join("trace.json"))?;
                result.export_memory_timeline(dir.join("memory.html"))?;
                println!(
                    "profile: wrote {} and {}",
                    dir.join("trace.json").display(),
                    dir.join("memory.html").display()
                );
            }
        }
        last_loss = loss_sum / seen.max(1) as f64;
        // With FSDP every rank evaluates (its forward is a collective).
        let val = if lead || net.evaluates_on_every_rank() { accuracy(&mut net, &test)? } else { 0.0 };
        if lead {
            println!(
                "epoch {:>2}/{}  loss {:.4}  val_acc {:.4}  {:.0} samples/s  memory {}: allocated {}, reserved {}, peak {}",
                epoch + 1,
                args.epochs,
                loss_sum / seen.max(1) as f64,
                val,
                (seen * world) as f64 / epoch_start.elapsed().as_secs_f64(),
                dev,
                mib(memory::allocated(dev)?),
                mib(memory::reserved(dev)?),
                mib(memory::max_allocated(dev)?),
            );
        }
    }
    let test_accuracy = if lead || net.evaluates_on_every_rank() { accuracy(&mut net, &test)? } else { 0.0 };
    let trained = started.elapsed();
    // Collectives, so every rank takes part: the model states of every
    // rank, and with FSDP the whole model gathered on rank 0.
    let per_rank_states = match &comm {
        Some(comm) => Some(gather_model_states(comm, states)?),
        None => None,
    };
    let full_dict = match &net {
        Net::Fsdp(fsdp) => fsdp.full_state_dict()?,
        _ => None,
    };
    if !lead {
        return Ok(Outcome::default());
    }
    println!("trained in {:.2} s", trained.as_secs_f64());
    if let (Some(auto), Some(limit)) = (&auto, args.memory_limit) {
        let rows = args.batch_size / world;
        println!(
            "micro-batching on {} limited to {}: {} out-of-memory retr{}, settled on {} micro-batch(es) of up to {} rows per step of {rows}",
            if world > 1 { format!("cpu:1..=cpu:{world}") } else { dev.to_string() },
            mib(limit),
            auto.retries(),
            if auto.retries() == 1 { "y" } else { "ies" },
            auto.micro_batches(),
            rows.div_ceil(auto.micro_batches()),
        );
    }
    if world > 1 {
        let first = usize::from(args.memory_limit.is_some());
        for r in first..first + world {
            let d = Device::cpu(r);
            println!("  {d}: peak {}, reserved {}", mib(memory::max_allocated(d)?), mib(memory::reserved(d)?));
        }
    }
    let replica_bytes = 4 * param_bytes;
    if let Some(per_rank) = &per_rank_states {
        // Rank r works on cpu:r, or on cpu:r+1 with --memory-limit.
        let first = usize::from(args.memory_limit.is_some());
        let devices: Vec<Device> = (first..first + world).map(Device::cpu).collect();
        print_model_states(args.shard, &devices, per_rank, replica_bytes, auto.is_some());
    }
    let mut unsharded = None;
    if let Some(dict) = full_dict {
        // The sharded model gathered whole loads into the unsharded one.
        let model = if args.cnn { cnn(dev)? } else { mlp(dev)? };
        model.load_state_dict(&dict, true)?;
        let accuracy = accuracy(&mut Net::Local(model), &test)?;
        unsharded = Some(accuracy);
        println!(
            "full state dict on rank 0 ({} tensors): the unsharded model's test accuracy {accuracy:.4}",
            dict.len()
        );
    }
    if let Some(table) = op_table {
        println!("\nprofile of three training steps (ops and backward nodes, by self CPU time):\n{table}");
    }
    println!("test_accuracy={test_accuracy:.4}");
    Ok(Outcome {
        test_accuracy,
        last_loss,
        model_states: per_rank_states.unwrap_or_default(),
        replica_bytes,
        unsharded,
    })
}
