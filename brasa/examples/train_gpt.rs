//! Trains a character-level GPT on Tiny Shakespeare (bundled with brasa-nn:
//! 1.1 M characters, 65 distinct, nanoGPT's 90/10 split) and reports what a
//! practitioner watches: a progress bar with loss and throughput, the
//! training and held-out loss at each evaluation, the device's allocated /
//! reserved / peak memory, the op profile of three steps, and at the end a
//! sample of generated text and `val_loss=…`.
//!
//! ```text
//! cargo run --release --example train_gpt                          # CPU configuration, a few minutes on 2 cores
//! cargo run --release --example train_gpt -- --steps 200           # a shorter run
//! cargo run --release --example train_gpt -- --bf16 --checkpoint   # bf16 autocast, a checkpoint per block
//! cargo run --release --example train_gpt --features cuda -- --config gpu --device cuda:0 --bf16
//! cargo run --release --example train_gpt -- --fsdp 2 --steps 200  # fully sharded over 2 in-process ranks
//! ```
//!
//! Configurations (nanoGPT's):
//! - `--config cpu` (default): 4 layers, 4 heads, 128 wide, context 64,
//!   batch 12, no dropout, learning rate 1e-3 (0.8 M parameters; nanoGPT
//!   reaches a validation loss of about 1.88 after 2,000 steps).
//! - `--config gpu`: `shakespeare_char`, 6 layers, 6 heads, 384 wide,
//!   context 256, batch 64, dropout 0.2, learning rate 1e-3, 5,000 steps
//!   (10.7 M parameters; validation loss about 1.47).
//!
//! Both train with AdamW (β = (0.9, 0.99), weight decay 0.1 on the matrices
//! and embeddings only), a linear warm-up of 100 steps and a cosine decay to
//! a tenth of the rate at the last step, gradient clipping at norm 1.
//! Options: `--config cpu|gpu`, `--device cpu|cuda:N`, `--bf16` (train under
//! bf16 autocast), `--checkpoint` (recompute each block in backward instead
//! of keeping its activations), `--steps N`, `--batch-size N`, `--lr X`,
//! `--eval-interval N`, `--eval-iters N`, `--seed N`, `--sample-len N`,
//! `--profile [DIR]` (also write the Chrome trace and the memory timeline of
//! the profiled steps to DIR, default `target/profile`), `--fsdp N`.
//!
//! `--fsdp N` trains the same model fully sharded (ZeRO-3, brasa-parallel's
//! `FullyShardedDataParallel`) over N ranks in this process, each on a
//! logical host device (`cpu:0` ... `cpu:N-1`, one thread pool per rank).
//! The model is `Gpt::into_units`: the embedding, each block and the head
//! are the units; the token table, which the head shares, is a unit of its
//! own gathered for the whole step. Every rank draws the same batches and
//! takes its 1/N of the rows of each (the batch size must be a multiple of
//! N), so the steps see the batches of a single-device run and the
//! averaged gradient is the whole batch's. Every rank keeps 1/N of the
//! parameters, gradients and AdamW state; clipping is by the global norm,
//! and the weight decay still spares the norms' gains and the biases
//! (`FullyShardedDataParallel::shard_masks` of the matrices, applied as
//! AdamW's decoupled decay). The
//! evaluations average every rank's rows of the same batches; `--checkpoint`
//! checkpoints every unit (gathered again to recompute it), `--bf16`
//! trains each rank under bf16 autocast. At the end the whole model is
//! gathered on rank 0 into a `Gpt`, which samples the text. Rank 0
//! prints; the op profile is not taken (`--profile` is refused).

use brasa::nn::data::{TinyShakespeare, TokenWindows};
use brasa::nn::functional::cross_entropy;
use brasa::nn::models::{Gpt, GptConfig, SampleOptions};
use brasa::nn::optim::{clip_grad_norm_, AdamConfig, AdamW, CosineAnnealingLr, LinearWarmup, LrScheduler, Optimizer};
use brasa::nn::ModuleExt;
use brasa::parallel::{FsdpConfig, FullyShardedDataParallel};
use brasa::prelude::*;
use brasa::profile::{schedule, Profiler, SortBy, TableOptions};
use brasa::tensor::Generator;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::time::Instant;

type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// A training configuration: the model and its optimisation.
struct Config {
    name: &'static str,
    model: GptConfig,
    batch_size: usize,
    lr: f64,
    steps: usize,
    warmup: usize,
    eval_interval: usize,
    eval_iters: usize,
}

impl Config {
    fn cpu() -> Config {
        Config {
            name: "cpu",
            model: GptConfig::shakespeare_char_cpu(TinyShakespeare::VOCAB_SIZE),
            batch_size: 12,
            lr: 1e-3,
            steps: 2000,
            warmup: 100,
            eval_interval: 250,
            eval_iters: 20,
        }
    }

    fn gpu() -> Config {
        Config {
            name: "gpu",
            model: GptConfig::shakespeare_char(TinyShakespeare::VOCAB_SIZE),
            batch_size: 64,
            lr: 1e-3,
            steps: 5000,
            warmup: 100,
            eval_interval: 250,
            eval_iters: 200,
        }
    }
}

struct Args {
    config: Config,
    device: Device,
    bf16: bool,
    seed: u64,
    sample_len: usize,
    profile: Option<PathBuf>,
    /// Ranks of fully sharded training (`--fsdp N`).
    fsdp: Option<usize>,
}

fn parse_args() -> AnyResult<Args> {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    // The configuration first: the other options adjust it.
    let mut config = Config::cpu();
    if let Some(i) = raw.iter().position(|a| a == "--config") {
        config = match raw.get(i + 1).map(String::as_str) {
            Some("cpu") => Config::cpu(),
            Some("gpu") => Config::gpu(),
            other => return Err(format!("--config {}: expected cpu or gpu", other.unwrap_or("(nothing)")).into()),
        };
    }
    let mut args =
        Args { config, device: Device::CPU, bf16: false, seed: 1337, sample_len: 500, profile: None, fsdp: None };
    let mut it = raw.into_iter().peekable();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        let c = &mut args.config;
        match arg.as_str() {
            "--config" => {
                value("--config")?;
            }
            "--device" => args.device = value("--device")?.parse()?,
            "--bf16" => args.bf16 = true,
            "--checkpoint" => c.model.checkpoint = true,
            "--steps" => c.steps = value("--steps")?.parse()?,
            "--batch-size" => c.batch_size = value("--batch-size")?.parse()?,
            "--lr" => c.lr = value("--lr")?.parse()?,
            "--eval-interval" => c.eval_interval = value("--eval-interval")?.parse()?,
            "--eval-iters" => c.eval_iters = value("--eval-iters")?.parse()?,
            "--seed" => args.seed = value("--seed")?.parse()?,
            "--sample-len" => args.sample_len = value("--sample-len")?.parse()?,
            "--fsdp" => args.fsdp = Some(value("--fsdp")?.parse()?),
            "--profile" => {
                let dir = match it.peek() {
                    Some(next) if !next.starts_with("--") => it.next().unwrap_or_default(),
                    _ => "target/profile".to_string(),
                };
                args.profile = Some(PathBuf::from(dir));
            }
            "-h" | "--help" => {
                println!(
                    "train_gpt [--config cpu|gpu] [--device cpu|cuda:N] [--bf16] [--checkpoint] [--steps N] \
                     [--batch-size N] [--lr X] [--eval-interval N] [--eval-iters N] [--seed N] [--sample-len N] \
                     [--profile [DIR]] [--fsdp N]\n\n--fsdp N: train fully sharded (FSDP) over N in-process ranks on \
                     logical host devices, each taking 1/N of every batch (--batch-size a multiple of N); \
                     --checkpoint then checkpoints every unit"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown option {other} (try --help)").into()),
        }
    }
    let c = &args.config;
    if c.steps == 0 || c.batch_size == 0 || c.eval_interval == 0 || c.eval_iters == 0 {
        return Err("--steps, --batch-size, --eval-interval and --eval-iters must be at least 1".into());
    }
    if let Some(world) = args.fsdp {
        if world == 0 {
            return Err("--fsdp needs at least 1 rank".into());
        }
        if !c.batch_size.is_multiple_of(world) {
            return Err(format!(
                "--fsdp {world}: each rank takes 1/{world} of every batch, so the batch size must be a multiple of \
                 {world}, got {} (set --batch-size)",
                c.batch_size
            )
            .into());
        }
        if args.device != Device::CPU {
            return Err(format!(
                "--fsdp runs its ranks on logical host devices (cpu:0 ... cpu:{}); --device {} is not supported with it",
                world - 1,
                args.device
            )
            .into());
        }
        if args.profile.is_some() {
            return Err("--profile is not supported with --fsdp".into());
        }
    }
    args.config.model.init_seed = args.seed;
    Ok(args)
}

/// The mean loss of `iters` random batches of `data`, in evaluation mode
/// and without a graph (nanoGPT's `estimate_loss`).
fn estimate_loss(model: &mut Gpt, data: &TokenWindows, args: &Args, generator: &mut Generator) -> AnyResult<f64> {
    model.eval();
    let mut total = 0.0;
    {
        let _no_grad = no_grad();
        let c = &args.config;
        for _ in 0..c.eval_iters {
            let (x, y) = data.sample_batch(c.batch_size, c.model.block_size, generator, args.device)?;
            let _amp = autocast(if args.bf16 { DType::BF16 } else { DType::F32 });
            total += model.loss(&x, &y)?.item()?;
        }
    }
    model.train();
    Ok(total / args.config.eval_iters as f64)
}

fn mib(bytes: usize) -> String {
    brasa::alloc::format_size(bytes)
}

/// The first line's common part: the corpus and the model.
fn headline(
    args: &Args,
    corpus: &TinyShakespeare,
    train: &TokenWindows,
    val: &TokenWindows,
    parameters: usize,
) -> String {
    let c = &args.config;
    format!(
        "tiny shakespeare: {} train / {} val characters, vocabulary {} · GPT {}: {} layers, {} heads, {} wide, \
         context {} · {:.2} M parameters",
        train.len(),
        val.len(),
        corpus.vocab().len(),
        c.name,
        c.model.n_layer,
        c.model.n_head,
        c.model.n_embd,
        c.model.block_size,
        parameters as f64 / 1e6,
    )
}

fn main() -> AnyResult<()> {
    let args = parse_args()?;
    if args.fsdp.is_none() {
        // The main thread works on the host's ops beside the pool's threads
        // (brasa::tensor::threads); under --fsdp it only waits for the ranks.
        brasa::tensor::threads::init_threads(None)?;
    }
    let c = &args.config;
    let dev = args.device;
    let corpus = TinyShakespeare::load()?;
    let (train, val) = corpus.train_val()?;
    manual_seed(args.seed); // dropout masks
    if let Some(world) = args.fsdp {
        return train_fsdp(&args, world, &corpus, &train, &val);
    }
    let mut model = Gpt::new(c.model, dev)?;

    // Weight decay on the matrices and embeddings, not on the norms' gains
    // and the biases (nanoGPT's two parameter groups: two optimizers here).
    let (decay, no_decay): (Vec<Var>, Vec<Var>) = model.parameters().into_iter().partition(|p| p.dims().len() >= 2);
    let adamw = AdamConfig { lr: c.lr, betas: (0.9, 0.99), weight_decay: 0.1, ..AdamConfig::default() };
    let mut opt = AdamW::new(decay, adamw)?;
    let mut opt_no_decay = AdamW::new(no_decay, AdamConfig { weight_decay: 0.0, ..adamw })?;
    let warmup = c.warmup.min(c.steps.saturating_sub(1)).max(1);
    let cosine = CosineAnnealingLr::new(&opt, (c.steps - warmup).max(1), c.lr / 10.0)?;
    let mut lr_schedule = LinearWarmup::new(&mut opt, warmup, 1.0 / warmup as f64, Some(Box::new(cosine)))?;
    opt_no_decay.set_lr(opt.lr())?;

    println!(
        "{} · batch {} · {} steps · {}{}{}",
        headline(&args, &corpus, &train, &val, model.num_parameters()),
        c.batch_size,
        c.steps,
        dev,
        if args.bf16 { " · bf16 autocast" } else { "" },
        if c.model.checkpoint { " · a checkpoint per block" } else { "" },
    );

    // Profile steps 2..=4 (step 0 waits, step 1 warms up).
    let mut profiler =
        Some(Profiler::builder().record_shapes(true).profile_memory(true).schedule(schedule(1, 1, 3, 1, 0)?).start()?);
    let mut op_table = None;

    let mut batches = Generator::new(args.seed);
    let mut eval_batches = Generator::new(args.seed.wrapping_add(1));
    let tokens_per_step = c.batch_size * c.model.block_size;
    let bar = ProgressBar::new(c.steps as u64).with_style(
        ProgressStyle::with_template("[{bar:30}] {pos}/{len} {msg} ({elapsed}<{eta})")?.progress_chars("=> "),
    );
    let started = Instant::now();
    let mut window = (Instant::now(), 0usize, 0.0f64); // since the last evaluation: start, steps, loss sum
    let mut val_loss = f64::NAN;
    for step in 1..=c.steps {
        let (x, y) = train.sample_batch(c.batch_size, c.model.block_size, &mut batches, dev)?;
        let loss = {
            let _step = brasa::profile::record_function("train_step");
            let loss = {
                // bf16 products, f32 norms, softmax and loss (a no-op region without --bf16).
                let _amp = autocast(if args.bf16 { DType::BF16 } else { DType::F32 });
                model.loss(&x, &y)?
            };
            loss.backward()?;
            clip_grad_norm_(&model.parameters(), 1.0, 2.0)?;
            opt.step()?;
            opt_no_decay.step()?;
            opt.zero_grad()?;
            opt_no_decay.zero_grad()?;
            lr_schedule.step(&mut opt)?;
            opt_no_decay.set_lr(opt.lr())?;
            loss.item()?
        };
        window.1 += 1;
        window.2 += loss;
        if let Some(p) = profiler.as_mut() {
            p.step();
            if step == 5 {
                let result = profiler.take().map(Profiler::stop);
                if let Some(result) = result {
                    op_table = Some(
                        result.key_averages().table(&TableOptions::default().sort_by(SortBy::SelfCpu).row_limit(15)),
                    );
                    if let Some(dir) = &args.profile {
                        std::fs::create_dir_all(dir)?;
                        result.export_chrome_trace(dir.join("trace.json"))?;
                        result.export_memory_timeline(dir.join("memory.html"))?;
                        let (trace, timeline) = (dir.join("trace.json"), dir.join("memory.html"));
                        bar.suspend(|| println!("profile: wrote {} and {}", trace.display(), timeline.display()));
                    }
                }
            }
        }
        let tokens_per_s = (window.1 * tokens_per_step) as f64 / window.0.elapsed().as_secs_f64();
        bar.inc(1);
        bar.set_message(format!("loss {loss:.4} · lr {:.2e} · {tokens_per_s:.0} tokens/s", opt.lr()));
        if step % c.eval_interval == 0 || step == c.steps {
            let ms_per_step = 1e3 * window.0.elapsed().as_secs_f64() / window.1 as f64;
            let train_loss = estimate_loss(&mut model, &train, &args, &mut eval_batches)?;
            val_loss = estimate_loss(&mut model, &val, &args, &mut eval_batches)?;
            // Through the bar, which is hidden (and its own println silent) when stdout is no terminal.
            let line = format!(
                "step {step:>5}/{}  train loss {:.4} (running {:.4})  val loss {val_loss:.4}  {ms_per_step:.1} ms/step  \
                 {tokens_per_s:.0} tokens/s  memory {dev}: allocated {}, reserved {}, peak {}",
                c.steps,
                train_loss,
                window.2 / window.1 as f64,
                mib(memory::allocated(dev)?),
                mib(memory::reserved(dev)?),
                mib(memory::max_allocated(dev)?),
            );
            bar.suspend(|| println!("{line}"));
            window = (Instant::now(), 0, 0.0);
        }
    }
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "trained {} steps in {seconds:.1} s ({:.1} ms/step, evaluations included)",
        c.steps,
        1e3 * seconds / c.steps as f64
    );
    if let Some(table) = op_table {
        println!("\nprofile of three training steps (ops and backward nodes, by self CPU time):\n{table}");
    }

    let prompt = corpus.vocab().encode("\n")?;
    let options = SampleOptions::new().temperature(0.8).top_k(200).seed(args.seed);
    let sample = {
        let _amp = autocast(if args.bf16 { DType::BF16 } else { DType::F32 });
        model.generate(&prompt, args.sample_len, &options)?
    };
    println!("\nsample (temperature 0.8, top-k 200):\n{}\n", corpus.vocab().decode(&sample)?);
    println!("val_loss={val_loss:.4} time_s={seconds:.1}");
    Ok(())
}

/// `x`'s rows for `rank` of `world` (each rank takes 1/N of every batch).
fn rank_rows(x: &Tensor, rank: usize, world: usize) -> brasa::parallel::Result<Tensor> {
    let rows = x.dims()[0] / world;
    Ok(x.narrow(0, rank * rows, rows)?.contiguous()?)
}

/// The mean cross entropy of the sharded units' logits for `x` against
/// `y`, as `Gpt::loss` computes it.
fn fsdp_loss(fsdp: &FullyShardedDataParallel, x: &Tensor, y: &Tensor) -> brasa::parallel::Result<Var> {
    let logits = fsdp.forward(&Var::new(x.clone()))?;
    let vocab = logits.dims()[2] as isize;
    Ok(cross_entropy(&logits.reshape(&[-1, vocab])?, &y.reshape(&[-1])?)?)
}

/// The mean of every rank's `value` (a collective).
fn rank_mean(comm: &Communicator, value: f64) -> brasa::parallel::Result<f64> {
    let total = Tensor::full_on([1], value, DType::F64, comm.device())?;
    comm.all_reduce(&total, ReduceOp::Sum)?;
    Ok(total.to_vec::<f64>()?[0] / comm.world_size() as f64)
}

/// [`estimate_loss`] of the sharded model: every rank runs its rows of the
/// same batches (the same collectives on every rank) and the ranks' means
/// are averaged.
fn estimate_loss_fsdp(
    fsdp: &mut FullyShardedDataParallel,
    data: &TokenWindows,
    args: &Args,
    generator: &mut Generator,
) -> brasa::parallel::Result<f64> {
    let comm = fsdp.communicator().clone();
    let c = &args.config;
    fsdp.eval();
    let mut total = 0.0;
    {
        let _no_grad = no_grad();
        for _ in 0..c.eval_iters {
            let (x, y) = data.sample_batch(c.batch_size, c.model.block_size, generator, comm.device())?;
            let (x, y) =
                (rank_rows(&x, comm.rank(), comm.world_size())?, rank_rows(&y, comm.rank(), comm.world_size())?);
            let _amp = autocast(if args.bf16 { DType::BF16 } else { DType::F32 });
            total += fsdp_loss(fsdp, &x, &y)?.item()?;
        }
    }
    fsdp.train();
    rank_mean(&comm, total / c.eval_iters as f64)
}

/// `--fsdp N`: the training loop of `main` on `world` in-process ranks,
/// the model sharded by `FullyShardedDataParallel`; rank 0 reports.
fn train_fsdp(
    args: &Args,
    world: usize,
    corpus: &TinyShakespeare,
    train: &TokenWindows,
    val: &TokenWindows,
) -> AnyResult<()> {
    ensure_host_devices(world)?;
    let outcomes = run_in_process(world, &LaunchOptions::default(), |comm| fsdp_rank(args, corpus, train, val, comm))?;
    let (val_loss, seconds) = outcomes.first().copied().unwrap_or((f64::NAN, f64::NAN));
    println!("val_loss={val_loss:.4} time_s={seconds:.1}");
    Ok(())
}

/// One rank of `--fsdp`: returns the last validation loss and the
/// training time in seconds.
fn fsdp_rank(
    args: &Args,
    corpus: &TinyShakespeare,
    train: &TokenWindows,
    val: &TokenWindows,
    comm: Communicator,
) -> brasa::parallel::Result<(f64, f64)> {
    const WEIGHT_DECAY: f64 = 0.1;
    let c = &args.config;
    let (rank, world, dev) = (comm.rank(), comm.world_size(), comm.device());
    let lead = rank == 0;
    // The same seed on every rank gives the same model (and FSDP
    // broadcasts rank 0's weights anyway).
    let model = Gpt::new(c.model, dev)?;
    let num_parameters = model.num_parameters();
    let config = FsdpConfig { checkpoint: c.model.checkpoint, ..FsdpConfig::default() };
    let mut fsdp = FullyShardedDataParallel::new(model.into_units(), comm.clone(), config)?;
    // Weight decay on the matrices and embeddings only, as the single-device
    // run's `decay` group: a shard mixes them with gains and biases.
    let masks = fsdp.shard_masks(|_, dims| dims.len() >= 2)?;

    // AdamW over this rank's shards; its weight decay is applied by hand
    // through the mask (decoupled, as AdamW's: p -= lr·wd·p on the matrices).
    let adamw = AdamConfig { lr: c.lr, betas: (0.9, 0.99), weight_decay: 0.0, ..AdamConfig::default() };
    let mut opt = AdamW::new(fsdp.parameters(), adamw)?;
    let warmup = c.warmup.min(c.steps.saturating_sub(1)).max(1);
    let cosine = CosineAnnealingLr::new(&opt, (c.steps - warmup).max(1), c.lr / 10.0)?;
    let mut lr_schedule = LinearWarmup::new(&mut opt, warmup, 1.0 / warmup as f64, Some(Box::new(cosine)))?;

    if lead {
        let units = fsdp.units();
        let shard_elements: usize = fsdp.parameters().iter().map(Var::numel).sum();
        println!(
            "{} · batch {} ({} rows per rank) · {} steps · FSDP over {world} ranks (cpu:0 ... cpu:{}): {} units{}, \
             {:.2} M parameter elements per rank{}{}",
            headline(args, corpus, train, val, num_parameters),
            c.batch_size,
            c.batch_size / world,
            c.steps,
            world - 1,
            units.len(),
            if units.iter().any(|(name, _)| name == "shared") { " (the tied token table shared)" } else { "" },
            shard_elements as f64 / 1e6,
            if args.bf16 { " · bf16 autocast" } else { "" },
            if c.model.checkpoint { " · a checkpoint per unit" } else { "" },
        );
    }

    // The same batches on every rank (the same seeds as a single-device run).
    let mut batches = Generator::new(args.seed);
    let mut eval_batches = Generator::new(args.seed.wrapping_add(1));
    let tokens_per_step = c.batch_size * c.model.block_size;
    let bar = if lead {
        let style = ProgressStyle::with_template("[{bar:30}] {pos}/{len} {msg} ({elapsed}<{eta})")
            .map_err(|e| ParallelError::invalid("train_gpt", e.to_string()))?
            .progress_chars("=> ");
        ProgressBar::new(c.steps as u64).with_style(style)
    } else {
        ProgressBar::hidden()
    };
    let started = Instant::now();
    let mut window = (Instant::now(), 0usize, 0.0f64); // since the last evaluation: start, steps, loss sum
    let mut val_loss = f64::NAN;
    for step in 1..=c.steps {
        let (x, y) = train.sample_batch(c.batch_size, c.model.block_size, &mut batches, dev)?;
        let (x, y) = (rank_rows(&x, rank, world)?, rank_rows(&y, rank, world)?);
        let loss = {
            let _amp = autocast(if args.bf16 { DType::BF16 } else { DType::F32 });
            fsdp_loss(&fsdp, &x, &y)?
        };
        loss.backward()?; // every shard's gradient averaged over the ranks
        fsdp.clip_grad_norm(1.0)?;
        let decay = -opt.lr() * WEIGHT_DECAY;
        for (shard, mask) in fsdp.parameters().iter().zip(&masks) {
            shard.tensor().add_scaled_(decay, &shard.tensor().mul(mask)?)?;
        }
        opt.step()?;
        opt.zero_grad()?;
        lr_schedule.step(&mut opt)?;
        let loss = rank_mean(&comm, loss.item()?)?; // the whole batch's
        window.1 += 1;
        window.2 += loss;
        let tokens_per_s = (window.1 * tokens_per_step) as f64 / window.0.elapsed().as_secs_f64();
        bar.inc(1);
        bar.set_message(format!("loss {loss:.4} · lr {:.2e} · {tokens_per_s:.0} tokens/s", opt.lr()));
        if step % c.eval_interval == 0 || step == c.steps {
            let ms_per_step = 1e3 * window.0.elapsed().as_secs_f64() / window.1 as f64;
            let train_loss = estimate_loss_fsdp(&mut fsdp, train, args, &mut eval_batches)?;
            val_loss = estimate_loss_fsdp(&mut fsdp, val, args, &mut eval_batches)?;
            if lead {
                let stats = fsdp.stats();
                let line = format!(
                    "step {step:>5}/{}  train loss {train_loss:.4} (running {:.4})  val loss {val_loss:.4}  \
                     {ms_per_step:.1} ms/step  {tokens_per_s:.0} tokens/s  memory {dev}: allocated {}, peak {}  \
                     last step: {} all-gathers ({}), {} reduce-scatters ({}), {:.0}% overlapped",
                    c.steps,
                    window.2 / window.1 as f64,
                    mib(memory::allocated(dev)?),
                    mib(memory::max_allocated(dev)?),
                    stats.all_gathers,
                    mib(stats.all_gather_bytes),
                    stats.reduce_scatters,
                    mib(stats.reduce_scatter_bytes),
                    100.0 * stats.overlap(),
                );
                bar.suspend(|| println!("{line}"));
            }
            window = (Instant::now(), 0, 0.0);
        }
    }
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();

    // The whole model on rank 0 (a collective), into a Gpt that samples.
    let full = fsdp.full_state_dict()?;
    if let Some(full) = full {
        println!(
            "trained {} steps in {seconds:.1} s ({:.1} ms/step, evaluations included)",
            c.steps,
            1e3 * seconds / c.steps as f64
        );
        let mut model = Gpt::new(c.model, dev)?;
        model.load_units_state_dict(&full, true)?;
        let prompt = corpus.vocab().encode("\n")?;
        let options = SampleOptions::new().temperature(0.8).top_k(200).seed(args.seed);
        let sample = {
            let _amp = autocast(if args.bf16 { DType::BF16 } else { DType::F32 });
            model.generate(&prompt, args.sample_len, &options)?
        };
        println!(
            "\nsample (temperature 0.8, top-k 200, rank 0's gathered model):\n{}\n",
            corpus.vocab().decode(&sample)?
        );
    }
    Ok((val_loss, seconds))
}
