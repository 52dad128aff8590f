//! Trains a ResNet-18 (the CIFAR form: 3×3 stem, no max pool) on the
//! bundled UCI digits, each 8×8 grey image upscaled 4× (nearest) to 32×32,
//! and reports per epoch the mean training loss, the accuracy on the
//! held-out 20 %, the device's peak memory and the time; at the end
//! `test_accuracy=0.9xxx`.
//!
//! ```text
//! cargo run --release --example train_resnet                       # host: width 16, 5 epochs, about a minute on 2 cores
//! cargo run --release --example train_resnet -- --width 8 --steps 100
//! cargo run --release --example train_resnet --features cuda -- --device cuda:0 --bf16   # ResNet-18 proper
//! ```
//!
//! The recipe is the usual CIFAR one: SGD with momentum 0.9 and weight
//! decay 5e-4, a cosine learning rate from `--lr` down to zero over the
//! run, batch norm in training mode, evaluation in evaluation mode. On
//! `cuda:N` the defaults are the real model (width 64, batch 128, 15
//! epochs); on the host a narrower one that trains in about a minute on
//! two cores (width 16, batch 64, 5 epochs: test accuracy about 0.99). Options: `--device
//! cpu|cuda:N`, `--width N` (the base width; 64 is ResNet-18), `--batch-size
//! N`, `--epochs N`, `--steps N` (the total number of steps; overrides
//! `--epochs`, the last epoch may be partial), `--lr X`, `--seed N` (the
//! initial weights and the batch order), `--bf16` (forward and loss under
//! bf16 autocast), `--channels-last` (the model's convolution weights and
//! the input batches in NHWC order, PyTorch's
//! `memory_format=torch.channels_last`, so the convolutions run channels
//! last; and, on CUDA, cuDNN picks each shape's algorithms by
//! timing them, PyTorch's `cudnn.benchmark = True`).

use brasa::nn::data::Digits;
use brasa::nn::models::{ResNet, ResNetConfig};
use brasa::nn::optim::CosineAnnealingLr;
use brasa::prelude::*;
use std::time::Instant;

type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Digits are 8×8; the model is for 32×32.
const UPSCALE: usize = 4;
/// Rows per forward when measuring accuracy.
const EVAL_CHUNK: usize = 256;

struct Args {
    device: Device,
    width: Option<usize>,
    batch_size: Option<usize>,
    epochs: Option<usize>,
    steps: Option<usize>,
    lr: f64,
    seed: u64,
    bf16: bool,
    channels_last: bool,
}

/// The options of the command line `cli` (without the program's name).
fn parse_args(cli: Vec<String>) -> AnyResult<Args> {
    let mut args = Args {
        device: Device::CPU,
        width: None,
        batch_size: None,
        epochs: None,
        steps: None,
        lr: 0.05,
        seed: 0,
        bf16: false,
        channels_last: false,
    };
    let mut it = cli.into_iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--device" => args.device = value("--device")?.parse()?,
            "--width" => args.width = Some(value("--width")?.parse()?),
            "--batch-size" => args.batch_size = Some(value("--batch-size")?.parse()?),
            "--epochs" => args.epochs = Some(value("--epochs")?.parse()?),
            "--steps" => args.steps = Some(value("--steps")?.parse()?),
            "--lr" => args.lr = value("--lr")?.parse()?,
            "--seed" => args.seed = value("--seed")?.parse()?,
            "--bf16" => args.bf16 = true,
            "--channels-last" => args.channels_last = true,
            "-h" | "--help" => {
                println!(
                    "train_resnet [--device cpu|cuda:N] [--width N] [--batch-size N] [--epochs N] [--steps N] \
                     [--lr X] [--seed N] [--bf16] [--channels-last]\n\
                     defaults: on the host width 16, batch 64, 5 epochs; on CUDA width 64 (ResNet-18), batch 128, 15 epochs"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown option {other} (try --help)").into()),
        }
    }
    if [args.width, args.batch_size, args.epochs, args.steps].contains(&Some(0)) {
        return Err("--width, --batch-size, --epochs and --steps must be at least 1".into());
    }
    Ok(args)
}

/// `[N, C, H, W]` images with every pixel repeated `factor` times across
/// and down (nearest-neighbour upscaling): `[N, C, factor·H, factor·W]`.
fn upscale(images: &Tensor, factor: usize) -> AnyResult<Tensor> {
    let &[n, c, h, w] = images.dims() else {
        return Err(format!("upscale: expected images [N, C, H, W], got {:?}", images.dims()).into());
    };
    let (n, c, h, w, f) = (n as isize, c as isize, h as isize, w as isize, factor as isize);
    let wide = [n as usize, c as usize, h as usize, factor, w as usize, factor];
    Ok(images.reshape(&[n, c, h, 1, w, 1])?.broadcast_as(wide)?.contiguous()?.reshape(&[n, c, h * f, w * f])?)
}

/// The accuracy of `model` on `(images, labels)`, in evaluation mode and
/// without a graph, `EVAL_CHUNK` rows at a time; training mode is restored.
fn accuracy(model: &mut ResNet, images: &Tensor, labels: &Tensor, args: &Args) -> AnyResult<f64> {
    model.eval();
    let rows = labels.dims()[0];
    let mut correct = 0.0;
    {
        let _no_grad = no_grad();
        for start in (0..rows).step_by(EVAL_CHUNK) {
            let len = EVAL_CHUNK.min(rows - start);
            let x = images.narrow(0, start, len)?.to(args.device)?;
            let logits = {
                let _amp = autocast(if args.bf16 { DType::BF16 } else { DType::F32 });
                model.forward(&Var::new(x))?
            };
            // f32 before the argmax: under bf16 autocast the head's logits are bf16.
            let predicted = logits.tensor().to_dtype(DType::F32)?.argmax(&[-1], false)?;
            let y = labels.narrow(0, start, len)?.to(args.device)?;
            correct += predicted.eq(&y)?.to_dtype(DType::F64)?.sum_all()?.item::<f64>()?;
        }
    }
    model.train();
    Ok(correct / rows as f64)
}

fn mib(bytes: usize) -> String {
    brasa::alloc::format_size(bytes)
}

fn main() -> AnyResult<()> {
    run(std::env::args().skip(1).collect())?;
    Ok(())
}

/// What a run measured (`tests/train_resnet.rs` checks it).
#[derive(Clone, Debug)]
#[allow(dead_code)] // read by the test, not by `main`
pub(crate) struct Outcome {
    /// Accuracy on the held-out 20 % after training.
    pub(crate) test_accuracy: f64,
    /// The mean training loss of the last epoch.
    pub(crate) last_loss: f64,
    /// The optimizer steps taken.
    pub(crate) steps: usize,
}

/// Trains as the command line `cli` (without the program's name) says.
pub(crate) fn run(cli: Vec<String>) -> AnyResult<Outcome> {
    let args = parse_args(cli)?;
    let dev = args.device;
    let on_host = dev.is_cpu();
    let width = args.width.unwrap_or(if on_host { 16 } else { 64 });
    let batch_size = args.batch_size.unwrap_or(if on_host { 64 } else { 128 });
    // With --channels-last the convolutions also pick their algorithms by
    // timing them once per shape, as PyTorch's
    // `torch.backends.cudnn.benchmark = True` (cuDNN only: no-op on the host).
    if args.channels_last {
        brasa::tensor::cudnn::set_benchmark(true);
    }

    // The digits as 32×32 images, kept on the host; each batch is copied to the device.
    let (train, test) = Digits::load()?.train_test_images()?;
    let (train_x, train_y) = train.into_parts();
    let train = TensorDataset::new(upscale(&train_x, UPSCALE)?, train_y)?;
    let (test_x, test_y) = test.into_parts();
    let test_x = upscale(&test_x, UPSCALE)?;

    let config = ResNetConfig::resnet18(1, Digits::CLASSES).width(width).init_seed(args.seed);
    let mut model = ResNet::new(config, dev)?;
    // Channels-last weights with channels-last batches, as PyTorch's
    // `model.to(memory_format=torch.channels_last)`: every convolution runs
    // channels last without converting its filter, its outputs (the next
    // layer's inputs) stay so, and the weight gradients and SGD's momentum
    // follow the weights' layout.
    if args.channels_last {
        model.to_channels_last()?;
    }
    let mut opt = Sgd::new(
        model.parameters(),
        SgdConfig { lr: args.lr, momentum: 0.9, weight_decay: 5e-4, ..SgdConfig::default() },
    )?;
    let loader = DataLoader::builder(train).batch_size(batch_size).shuffle(true).seed(args.seed).build()?;
    let steps_per_epoch = loader.len();
    let total_steps = match (args.steps, args.epochs) {
        (Some(steps), _) => steps,
        (None, epochs) => epochs.unwrap_or(if on_host { 5 } else { 15 }) * steps_per_epoch,
    };
    let epochs = total_steps.div_ceil(steps_per_epoch);
    let mut schedule = CosineAnnealingLr::new(&opt, total_steps, 0.0)?;

    println!(
        "digits upscaled to 32x32: {} train / {} test · ResNet-18 layout, width {width}, {:.2} M parameters · \
         batch {batch_size} · {total_steps} steps ({epochs} epoch(s) of up to {steps_per_epoch}) · SGD lr {} cosine · {dev}{}",
        loader.dataset().len(),
        test_y.dims()[0],
        model.num_parameters() as f64 / 1e6,
        args.lr,
        if args.bf16 { " · bf16 autocast" } else { "" },
    );

    let started = Instant::now();
    let (mut step, mut last_loss, mut test_accuracy) = (0, f64::NAN, f64::NAN);
    memory::reset_peak(dev)?;
    for epoch in 0..epochs {
        let epoch_start = Instant::now();
        // The loss is summed on the device and read once per epoch: reading
        // it every step would wait for the device every step.
        let mut loss_sum = Tensor::scalar_on(0f32, dev)?;
        let mut seen = 0;
        for batch in loader.epoch(epoch as u64) {
            if step == total_steps {
                break;
            }
            let (x, y) = batch?;
            let (x, y) = (x.to(dev)?, y.to(dev)?);
            let x = if args.channels_last { x.to_channels_last()? } else { x };
            let loss = {
                let _amp = autocast(if args.bf16 { DType::BF16 } else { DType::F32 });
                cross_entropy(&model.forward(&Var::new(x))?, &y)?
            };
            loss.backward()?;
            opt.step()?;
            opt.zero_grad()?;
            schedule.step(&mut opt)?;
            let rows = y.numel();
            loss_sum = loss_sum.add(&loss.tensor().to_dtype(DType::F32)?.mul_scalar(rows as f64)?)?;
            seen += rows;
            step += 1;
        }
        last_loss = loss_sum.item::<f64>()? / seen.max(1) as f64;
        let train_seconds = epoch_start.elapsed().as_secs_f64();
        test_accuracy = accuracy(&mut model, &test_x, &test_y, &args)?;
        println!(
            "epoch {:>2}/{epochs}  loss {last_loss:.4}  test_acc {test_accuracy:.4}  {:.1} s ({:.0} samples/s)  \
             memory {dev}: peak {}, reserved {}",
            epoch + 1,
            train_seconds,
            seen as f64 / train_seconds,
            mib(memory::max_allocated(dev)?),
            mib(memory::reserved(dev)?),
        );
    }
    println!("trained in {:.2} s", started.elapsed().as_secs_f64());
    println!("test_accuracy={test_accuracy:.4}");
    Ok(Outcome { test_accuracy, last_loss, steps: step })
}
