//! Pipeline parallelism on the bundled digits: a deep MLP cut into 2 stages
//! (balanced by parameter bytes), each on its own logical host device and
//! thread, trained with the 1F1B schedule over micro-batches. Prints the
//! stages, each epoch's loss and bubble, the last step's per-stage report
//! (busy time, idle share, peak memory on each device) and finally
//! `test_accuracy=0.9xxx` like `train_digits`.
//!
//! ```text
//! cargo run --release --example pipeline
//! cargo run --release --example pipeline -- --schedule gpipe --micro-batches 8
//! cargo run --release --example pipeline -- --trace target/pipeline-trace.json
//! ```
//!
//! Options: `--schedule 1f1b|gpipe`, `--micro-batches N` (default 4),
//! `--epochs N` (default 30), `--batch-size N` (default 64), `--trace FILE`
//! (a Chrome trace of one step: one track per stage, a range per forward
//! and backward of each micro-batch).

use brasa::nn::data::{DataLoader, Digits, TensorDataset};
use brasa::nn::functional::cross_entropy;
use brasa::nn::optim::{Adam, AdamConfig, Optimizer};
use brasa::nn::{Linear, Relu, Sequential};
use brasa::parallel::pipeline::{Partition, Pipeline, PipelineConfig, PipelineRng, Schedule};
use brasa::prelude::*;
use brasa::profile::Profiler;
use std::path::PathBuf;

type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

struct Args {
    schedule: Schedule,
    micro_batches: usize,
    epochs: usize,
    batch_size: usize,
    trace: Option<PathBuf>,
}

fn parse_args() -> AnyResult<Args> {
    let mut args = Args { schedule: Schedule::OneFOneB, micro_batches: 4, epochs: 30, batch_size: 64, trace: None };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--schedule" => {
                args.schedule = match value("--schedule")?.as_str() {
                    "1f1b" => Schedule::OneFOneB,
                    "gpipe" => Schedule::GPipe,
                    other => return Err(format!("--schedule {other}: expected 1f1b or gpipe").into()),
                }
            }
            "--micro-batches" => args.micro_batches = value("--micro-batches")?.parse()?,
            "--epochs" => args.epochs = value("--epochs")?.parse()?,
            "--batch-size" => args.batch_size = value("--batch-size")?.parse()?,
            "--trace" => args.trace = Some(PathBuf::from(value("--trace")?)),
            "-h" | "--help" => {
                println!(
                    "pipeline [--schedule 1f1b|gpipe] [--micro-batches N] [--epochs N] [--batch-size N] [--trace FILE]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown option {other} (try --help)").into()),
        }
    }
    Ok(args)
}

/// 64 → 256 → 256 → 256 → 256 → 256 → 10, ReLU between: 12 layers.
pub fn deep_mlp(dev: Device) -> brasa::nn::Result<Sequential> {
    let widths = [64, 256, 256, 256, 256, 256];
    let mut model = Sequential::new();
    for pair in widths.windows(2) {
        model = model.push(Linear::new(pair[0], pair[1], dev)?).push(Relu);
    }
    model.append(Box::new(Linear::new(256, 10, dev)?));
    Ok(model)
}

/// Share of `data` the pipeline classifies right (evaluation mode, no graph).
pub fn accuracy(pipe: &mut Pipeline, data: &TensorDataset) -> AnyResult<f64> {
    pipe.set_training(false)?;
    let logits = pipe.forward(data.features())?;
    pipe.set_training(true)?;
    let predicted = logits.argmax(&[-1], false)?.to(Device::CPU)?;
    let correct = predicted.eq(&data.labels().to(Device::CPU)?)?.to_dtype(DType::F64)?.sum_all()?.item::<f64>()?;
    Ok(correct / data.len() as f64)
}

fn main() -> AnyResult<()> {
    let args = parse_args()?;
    brasa::parallel::ensure_host_devices(2)?;
    manual_seed(0);
    let (train, test) = Digits::load()?.train_test()?;
    let dev0 = Device::cpu(0);
    let config = PipelineConfig::new(Partition::ParameterBytes { stages: 2 }, args.micro_batches)
        .schedule(args.schedule)
        // No dropout here: stages need not take turns drawing random numbers.
        .rng(PipelineRng::Shared);
    let mut pipe = Pipeline::new(deep_mlp(dev0)?, cross_entropy, config)?;
    let mut opt = Adam::new(pipe.parameters(), AdamConfig { lr: 1e-3, ..Default::default() })?;
    println!(
        "pipeline: {} layers in 2 stages {:?} on cpu:0 and cpu:1, {} schedule, {} micro-batches of a batch of {}",
        pipe.model().len(),
        pipe.stages(),
        args.schedule.name(),
        args.micro_batches,
        args.batch_size
    );
    let loader = DataLoader::builder(train).batch_size(args.batch_size).shuffle(true).seed(0).device(dev0).build()?;
    let mut bubbles = Vec::new();
    for epoch in 0..args.epochs {
        let (mut loss_sum, mut batches) = (0.0, 0usize);
        for batch in loader.epoch(epoch as u64) {
            let (x, y) = batch?;
            if x.dims()[0] < args.micro_batches {
                continue; // a last batch too small to split
            }
            let profiler = match (&args.trace, epoch, batches) {
                (Some(_), 0, 3) => Some(Profiler::builder().start()?),
                _ => None,
            };
            loss_sum += pipe.step(&x, &y)?;
            if let (Some(profiler), Some(path)) = (profiler, &args.trace) {
                profiler.stop().export_chrome_trace(path)?;
                println!("chrome trace of one step: {}", path.display());
            }
            opt.step()?;
            opt.zero_grad()?;
            if let Some(report) = pipe.report() {
                bubbles.push(report.bubble());
            }
            batches += 1;
        }
        if (epoch + 1) % 10 == 0 || epoch + 1 == args.epochs {
            let bubble = bubbles.iter().sum::<f64>() / bubbles.len().max(1) as f64;
            bubbles.clear();
            println!(
                "epoch {:>2}  loss {:.4}  bubble {:.1} % (ideal {:.1} %)  test accuracy {:.4}",
                epoch + 1,
                loss_sum / batches.max(1) as f64,
                100.0 * bubble,
                100.0 * Schedule::ideal_bubble(2, args.micro_batches),
                accuracy(&mut pipe, &test)?
            );
        }
    }
    if let Some(report) = pipe.report() {
        println!("last step:\n{report}");
    }
    for device in [Device::cpu(0), Device::cpu(1)] {
        println!(
            "{device}: allocated {}, peak {}",
            brasa::alloc::format_size(memory::allocated(device)?),
            brasa::alloc::format_size(memory::max_allocated(device)?)
        );
    }
    println!("test_accuracy={:.4}", accuracy(&mut pipe, &test)?);
    Ok(())
}
