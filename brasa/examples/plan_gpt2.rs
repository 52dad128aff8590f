//! Plans one training step of GPT-2 small (124M parameters, context 1024,
//! batch 8, AdamW, bf16 autocast) for an 80 GiB CUDA device, on whatever
//! machine this runs on: no GPU and no device memory are touched. Prints
//! the plan (peak allocated and reserved, what is alive at the peak and for
//! what) and how long planning took.
//!
//! ```text
//! cargo run --release --example plan_gpt2                      # 80 GiB, batch 8
//! cargo run --release --example plan_gpt2 -- --batch 16 --gib 40 --json
//! cargo run --release --example plan_gpt2 -- --max-batch       # the largest batch that fits
//! ```

use brasa::nn::models::{Gpt, GptConfig};
use brasa::nn::optim::{Adam, AdamConfig, Optimizer};
use brasa::prelude::*;
use brasa::tensor::memory::{category_scope, MemoryCategory};
use brasa::tensor::MemoryTarget;

type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

struct Args {
    batch: usize,
    gib: usize,
    json: bool,
    max_batch: bool,
}

fn parse_args() -> AnyResult<Args> {
    let mut args = Args { batch: 8, gib: 80, json: false, max_batch: false };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match flag.as_str() {
            "--batch" => args.batch = value("--batch")?.parse()?,
            "--gib" => args.gib = value("--gib")?.parse()?,
            "--json" => args.json = true,
            "--max-batch" => args.max_batch = true,
            "--help" | "-h" => {
                println!("plan_gpt2 [--batch N] [--gib N] [--json] [--max-batch]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    Ok(args)
}

/// GPT-2 small and AdamW on `device`; the step: a bf16 forward, the loss,
/// backward, the optimizer step.
fn gpt2_step(device: Device, batch: usize) -> brasa::nn::Result<impl FnMut() -> brasa::nn::Result<()>> {
    let config = GptConfig::gpt2();
    let context = config.block_size;
    let model = Gpt::new(config, device)?;
    let mut opt = Adam::new(model.parameters(), AdamConfig { lr: 6e-4, weight_decay: 0.1, ..AdamConfig::adamw() })?;
    let (ids, targets) = {
        let _input = category_scope(MemoryCategory::Input);
        let ids = Tensor::zeros_on([batch, context], DType::I64, device)?;
        (ids.clone(), ids)
    };
    Ok(move || {
        let loss = {
            let _amp = autocast(DType::BF16);
            model.loss(&ids, &targets)?
        };
        loss.backward()?;
        opt.step()?;
        opt.zero_grad()?;
        Ok(())
    })
}

/// The process's peak resident memory (Linux), for the planning cost.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn main() -> AnyResult<()> {
    let args = parse_args()?;
    let target = MemoryTarget::cuda(args.gib << 30);
    if args.max_batch {
        let search = memory::max_batch_size_for(&target, 1 << 12, gpt2_step)?;
        println!(
            "GPT-2 small on {}: the largest batch that fits is {} ({} plans); batch {} lacks {}",
            target.name(),
            search.batch,
            search.plans,
            search.next.unwrap_or(0),
            brasa::alloc::format_size(search.next_lacks.unwrap_or(0))
        );
        println!("{}", search.plan);
        return Ok(());
    }
    let plan = memory::plan(&target, |device| gpt2_step(device, args.batch))?;
    if args.json {
        println!("{}", plan.to_json());
    } else {
        println!("GPT-2 small (124M), batch {}, context 1024, AdamW, bf16 autocast:", args.batch);
        println!("{plan}");
        if let Some(rss) = peak_rss_mib() {
            println!("  planning process peak RSS: {rss:.0} MiB");
        }
    }
    Ok(())
}
