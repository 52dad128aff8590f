//! Trains a classifier on the bundled UCI digits (1,797 8x8 images, fixed
//! 80/20 split) and reports what a practitioner watches: a progress bar with
//! loss and throughput, per-epoch accuracy on the held-out 20 %, the device's
//! allocated / reserved / peak memory, and finally `test_accuracy=0.9xxx`.
//!
//! ```text
//! cargo run --release --example train_digits                  # MLP 64-128-10, Adam
//! cargo run --release --example train_digits -- --model cnn   # a small CNN
//! cargo run --release --example train_digits -- --profile     # + trace.json and memory.html
//! ```
//!
//! Three training steps of the first epoch are profiled; their op table is
//! printed at the end. Options: `--model mlp|cnn`, `--bf16` (train under
//! bf16 autocast), `--epochs N`,
//! `--batch-size N`, `--lr X`, `--seed N`, `--workers N`, `--profile [DIR]`
//! (also write the Chrome trace and the memory timeline to DIR, default
//! `target/profile`).

use brasa::nn::data::{DataLoader, Digits, TensorDataset};
use brasa::nn::functional::cross_entropy;
use brasa::nn::optim::{Adam, AdamConfig, Optimizer};
use brasa::nn::{Conv2d, Conv2dConfig, Flatten, Linear, MaxPool2d, Module, ModuleExt, Relu, Sequential};
use brasa::prelude::*;
use brasa::profile::{schedule, Profiler, SortBy, TableOptions};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::time::Instant;

use brasa::nn::Result;

type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

struct Args {
    cnn: bool,
    bf16: bool,
    epochs: usize,
    batch_size: usize,
    lr: f64,
    seed: u64,
    workers: usize,
    profile: Option<PathBuf>,
}

fn parse_args() -> AnyResult<Args> {
    let mut args =
        Args { cnn: false, bf16: false, epochs: 30, batch_size: 32, lr: 2e-3, seed: 0, workers: 1, profile: None };
    let mut it = std::env::args().skip(1).peekable();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--model" => match value("--model")?.as_str() {
                "mlp" => args.cnn = false,
                "cnn" => args.cnn = true,
                other => return Err(format!("--model {other}: expected mlp or cnn").into()),
            },
            "--bf16" => args.bf16 = true,
            "--epochs" => args.epochs = value("--epochs")?.parse()?,
            "--batch-size" => args.batch_size = value("--batch-size")?.parse()?,
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
                    "train_digits [--model mlp|cnn] [--bf16] [--epochs N] [--batch-size N] [--lr X] [--seed N] [--workers N] \
                     [--profile [DIR]]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown option {other} (try --help)").into()),
        }
    }
    Ok(args)
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

/// Accuracy on a whole dataset, in evaluation mode and without a graph.
fn accuracy(model: &mut Sequential, data: &TensorDataset) -> Result<f64> {
    model.eval();
    let correct = {
        let _no_grad = no_grad();
        let logits = model.forward(&Var::new(data.features().clone()))?;
        let predicted = logits.tensor().argmax(&[-1], false)?;
        predicted.eq(data.labels())?.to_dtype(DType::F64)?.sum_all()?.item::<f64>()?
    };
    model.train();
    Ok(correct / data.len() as f64)
}

fn mib(bytes: usize) -> String {
    brasa::alloc::format_size(bytes)
}

fn main() -> AnyResult<()> {
    let args = parse_args()?;
    let dev = Device::CPU;
    manual_seed(args.seed);
    let digits = Digits::load()?;
    let (train, test) = if args.cnn { digits.train_test_images()? } else { digits.train_test()? };
    let mut model = if args.cnn { cnn(dev)? } else { mlp(dev)? };
    let mut opt = Adam::new(model.parameters(), AdamConfig { lr: args.lr, ..Default::default() })?;
    let loader = DataLoader::builder(train.clone())
        .batch_size(args.batch_size)
        .shuffle(true)
        .seed(args.seed)
        .num_workers(args.workers)
        .device(dev)
        .build()?;
    println!(
        "digits: {} train / {} test samples · {} · {} parameters · {} epochs of {} batches",
        train.len(),
        test.len(),
        if args.cnn { "CNN" } else { "MLP 64-128-10" },
        model.num_parameters(),
        args.epochs,
        loader.len()
    );

    // Profile steps 2..=4 of the first epoch (step 0 waits, step 1 warms up).
    let mut profiler =
        Some(Profiler::builder().record_shapes(true).profile_memory(true).schedule(schedule(1, 1, 3, 1, 0)?).start()?);
    let mut op_table = None;

    let started = Instant::now();
    let style = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")?.progress_chars("=> ");
    for epoch in 0..args.epochs {
        let bar = ProgressBar::new(loader.len() as u64).with_style(style.clone());
        bar.set_prefix(format!("epoch {:>2}/{}", epoch + 1, args.epochs));
        let epoch_start = Instant::now();
        let (mut loss_sum, mut seen) = (0.0, 0usize);
        for batch in loader.epoch(epoch as u64) {
            let (x, y) = batch?;
            let loss = {
                let _step = brasa::profile::record_function("train_step");
                let loss = {
                    // bf16 products and convolutions, f32 softmax and loss (a no-op region without --bf16).
                    let _amp = autocast(if args.bf16 { DType::BF16 } else { DType::F32 });
                    cross_entropy(&model.forward(&Var::new(x))?, &y)?
                };
                loss.backward()?;
                opt.step()?;
                opt.zero_grad()?;
                loss
            };
            loss_sum += loss.item()? * y.numel() as f64; // a number, not a graph
            seen += y.numel();
            if let Some(p) = profiler.as_mut() {
                p.step();
            }
            bar.inc(1);
            bar.set_message(format!(
                "loss {:.4} · {:.0} samples/s",
                loss_sum / seen as f64,
                seen as f64 / epoch_start.elapsed().as_secs_f64()
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
        let val = accuracy(&mut model, &test)?;
        println!(
            "epoch {:>2}/{}  loss {:.4}  val_acc {:.4}  {:.0} samples/s  memory {}: allocated {}, reserved {}, peak {}",
            epoch + 1,
            args.epochs,
            loss_sum / seen.max(1) as f64,
            val,
            seen as f64 / epoch_start.elapsed().as_secs_f64(),
            dev,
            mib(memory::allocated(dev)?),
            mib(memory::reserved(dev)?),
            mib(memory::max_allocated(dev)?),
        );
    }
    let test_accuracy = accuracy(&mut model, &test)?;
    println!("trained in {:.2} s", started.elapsed().as_secs_f64());
    if let Some(table) = op_table {
        println!("\nprofile of three training steps (ops and backward nodes, by self CPU time):\n{table}");
    }
    println!("test_accuracy={test_accuracy:.4}");
    Ok(())
}
