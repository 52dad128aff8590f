//! The measurements behind the collective, DDP and ZeRO figures of the
//! `parallel.*` group (each runs in its own child process, see
//! `parallel_figures`):
//!
//! - `parallel.allreduce_busbw_gbs`: in-process all-reduce (sum) of 64 MiB
//!   f32 over 2 ranks, one thread each; bus bandwidth as nccl-tests defines
//!   it, `S/t · 2(n−1)/n`; median of the repetitions after a warm-up.
//! - `parallel.allreduce_vs_memcpy`: that ÷ the bandwidth of copying the
//!   same 64 MiB with the same two threads (each half, into a preallocated
//!   buffer), interleaved with it in the same run. Also printed to stderr
//!   for a sweep of sizes, 1–64 MiB.
//! - `parallel.ddp_overlap`: a 32-layer 512-wide ReLU MLP at batch 256 on 2
//!   ranks: the share of gradient bytes whose all-reduce was launched while
//!   backward still had gradients to compute (mean over steps after the
//!   bucket rebuild).
//! - `parallel.ddp_step_ratio`: that MLP's SGD step on 2 in-process ranks
//!   (one thread each, half the batch each) ÷ one process with 2 threads on
//!   the whole batch; interleaved rounds, median of the ratios.
//! - `parallel.zero2_memory_ratio` / `_4`: parameters + gradients + Adam
//!   state per rank under ZeRO-2 ÷ under DDP, 2 and 4 ranks (formula for
//!   f32 Adam: 0.625 and 0.4375).

use brasa_autograd::Var;
use brasa_nn::functional::{mse_loss, Reduction};
use brasa_nn::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use brasa_nn::{Linear, ModuleExt, Relu, Sequential};
use brasa_parallel::{
    ensure_host_devices, run_in_process, CommOptions, DdpConfig, DistributedDataParallel, LaunchOptions,
    MemoryBreakdown, ReduceOp, ZeroOptimizer, ZeroStage,
};
use brasa_tensor::{DType, Device, Tensor};
use std::time::{Duration, Instant};

type Outcome = Result<f64, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn one_thread_each() -> LaunchOptions {
    LaunchOptions { comm: CommOptions::default().timeout(Duration::from_secs(120)), threads_per_rank: Some(1) }
}

/// (bus bandwidth GB/s, memcpy GB/s) for `bytes` of f32 over 2 ranks,
/// medians of `reps` interleaved repetitions.
fn allreduce_and_memcpy(bytes: usize, reps: usize) -> Result<(f64, f64), String> {
    ensure_host_devices(2).map_err(err)?;
    let n = bytes / 4;
    let results = run_in_process(2, &one_thread_each(), |comm| {
        let data = Tensor::full_on([n], 1.0, DType::F32, comm.device())?;
        let copy_from = Tensor::full_on([n / 2], 1.0, DType::F32, comm.device())?;
        let copy_into = Tensor::zeros_on([n / 2], DType::F32, comm.device())?;
        let (mut reduce_times, mut copy_times) = (Vec::new(), Vec::new());
        comm.all_reduce(&data, ReduceOp::Sum)?; // warm-up: pages touched
        for _ in 0..reps {
            comm.barrier()?;
            let start = Instant::now();
            comm.all_reduce(&data, ReduceOp::Sum)?;
            reduce_times.push(start.elapsed().as_secs_f64());
            // The same two threads copy half each, at the same time.
            comm.barrier()?;
            let start = Instant::now();
            {
                let source = copy_from.host_bytes()?;
                let mut dest = copy_into.host_bytes_mut()?;
                dest.copy_from_slice(&source);
            }
            comm.barrier()?;
            copy_times.push(start.elapsed().as_secs_f64());
        }
        // Values stay exact powers of two: 2^(reps+1) everywhere.
        let expected = 2f32.powi(reps as i32 + 1);
        if data.to_vec::<f32>()?.iter().any(|v| *v != expected) {
            return Err(brasa_parallel::ParallelError::invalid("allreduce figure", "wrong all-reduce result"));
        }
        Ok((reduce_times, copy_times))
    })
    .map_err(err)?;
    // A collective ends when its slowest rank does.
    let slowest = |times: Vec<&Vec<f64>>| -> Vec<f64> {
        (0..reps).map(|i| times.iter().map(|t| t[i]).fold(0.0, f64::max)).collect()
    };
    let reduce = slowest(results.iter().map(|r| &r.0).collect());
    let copies = slowest(results.iter().map(|r| &r.1).collect());
    let world = 2.0;
    let busbw = bytes as f64 / median(reduce) * 2.0 * (world - 1.0) / world / 1e9;
    let copy = bytes as f64 / median(copies) / 1e9;
    Ok((busbw, copy))
}

pub fn allreduce_busbw(quick: bool) -> Outcome {
    Ok(allreduce_and_memcpy(64 << 20, if quick { 3 } else { 11 })?.0)
}

pub fn allreduce_vs_memcpy(quick: bool) -> Outcome {
    if !quick {
        for mib in [1usize, 4, 16] {
            let (busbw, copy) = allreduce_and_memcpy(mib << 20, 21)?;
            eprintln!(
                "    sweep {mib:>2} MiB: busbw {busbw:.2} GB/s, memcpy {copy:.2} GB/s, ratio {:.2}",
                busbw / copy
            );
        }
    }
    let (busbw, copy) = allreduce_and_memcpy(64 << 20, if quick { 3 } else { 11 })?;
    eprintln!("    64 MiB: busbw {busbw:.2} GB/s, memcpy {copy:.2} GB/s");
    Ok(busbw / copy)
}

const LAYERS: usize = 32;
const WIDTH: usize = 512;
const BATCH: usize = 256;

fn deep_mlp(dev: Device) -> brasa_nn::Result<Sequential> {
    let mut model = Sequential::new();
    for _ in 0..LAYERS {
        model = model.push(Linear::new(WIDTH, WIDTH, dev)?).push(Relu);
    }
    Ok(model)
}

fn step(
    forward: impl Fn(&Var) -> brasa_parallel::Result<Var>,
    x: &Var,
    y: &Var,
    opt: &mut dyn Optimizer,
) -> brasa_parallel::Result<()> {
    mse_loss(&forward(x)?, y, Reduction::Mean)?.backward()?;
    opt.step()?;
    opt.zero_grad()?;
    Ok(())
}

/// Seconds per step of DDP on 2 ranks (and the mean overlap), `steps` steps
/// after 2 warm-up steps (the second rebuilds the buckets).
fn ddp_steps(steps: usize) -> Result<(f64, f64), String> {
    let results = run_in_process(2, &one_thread_each(), |comm| {
        let dev = comm.device();
        let ddp = DistributedDataParallel::new(deep_mlp(dev)?, comm.clone(), DdpConfig::default())?;
        let mut opt = Sgd::new(ddp.module().parameters(), SgdConfig { lr: 1e-3, momentum: 0.9, ..Default::default() })?;
        let x = Var::new(Tensor::randn_on([BATCH / 2, WIDTH], DType::F32, dev)?);
        let y = Var::new(Tensor::zeros_on([BATCH / 2, WIDTH], DType::F32, dev)?);
        for _ in 0..2 {
            step(|x| ddp.forward(x), &x, &y, &mut opt)?;
        }
        comm.barrier()?;
        let start = Instant::now();
        let mut overlap = 0.0;
        for _ in 0..steps {
            step(|x| ddp.forward(x), &x, &y, &mut opt)?;
            overlap += ddp.stats().overlap();
        }
        comm.barrier()?;
        Ok((start.elapsed().as_secs_f64() / steps as f64, overlap / steps as f64))
    })
    .map_err(err)?;
    Ok(results[0])
}

/// Seconds per step of the same MLP in one process, 2 threads, whole batch.
fn single_steps(steps: usize) -> Result<f64, String> {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().map_err(err)?;
    pool.install(|| {
        let dev = Device::cpu(0);
        let model = deep_mlp(dev).map_err(err)?;
        let mut opt =
            Sgd::new(model.parameters(), SgdConfig { lr: 1e-3, momentum: 0.9, ..Default::default() }).map_err(err)?;
        let x = Var::new(Tensor::randn_on([BATCH, WIDTH], DType::F32, dev).map_err(err)?);
        let y = Var::new(Tensor::zeros_on([BATCH, WIDTH], DType::F32, dev).map_err(err)?);
        let forward = |x: &Var| Ok(brasa_nn::Module::forward(&model, x)?);
        for _ in 0..2 {
            step(forward, &x, &y, &mut opt).map_err(err)?;
        }
        let start = Instant::now();
        for _ in 0..steps {
            step(forward, &x, &y, &mut opt).map_err(err)?;
        }
        Ok(start.elapsed().as_secs_f64() / steps as f64)
    })
}

pub fn ddp_overlap(quick: bool) -> Outcome {
    ensure_host_devices(2).map_err(err)?;
    Ok(ddp_steps(if quick { 2 } else { 5 })?.1)
}

pub fn ddp_step_ratio(quick: bool) -> Outcome {
    ensure_host_devices(2).map_err(err)?;
    let (rounds, steps) = if quick { (1, 2) } else { (5, 5) };
    let mut ratios = Vec::new();
    for _ in 0..rounds {
        let single = single_steps(steps)?;
        let (ddp, _) = ddp_steps(steps)?;
        eprintln!("    one process, 2 threads: {:.1} ms/step; DDP 2 ranks: {:.1} ms/step", single * 1e3, ddp * 1e3);
        ratios.push(ddp / single);
    }
    Ok(median(ratios))
}

/// Model states per rank (rank 0) after a few Adam steps.
fn model_states(world: usize, zero: Option<ZeroStage>) -> Result<usize, String> {
    let results = run_in_process(world, &one_thread_each(), |comm| {
        let dev = comm.device();
        let config = DdpConfig { zero, ..DdpConfig::default() };
        let ddp = DistributedDataParallel::new(deep_mlp(dev)?, comm.clone(), config)?;
        let adam = AdamConfig { lr: 1e-4, ..Default::default() };
        let mut opt: Box<dyn Optimizer> = match zero {
            None => Box::new(Adam::new(ddp.module().parameters(), adam)?),
            Some(_) => Box::new(ZeroOptimizer::new(&ddp, |shards| Adam::new(shards, adam))?),
        };
        let x = Var::new(Tensor::randn_on([16, WIDTH], DType::F32, dev)?);
        let y = Var::new(Tensor::zeros_on([16, WIDTH], DType::F32, dev)?);
        let mut held = MemoryBreakdown::default();
        for _ in 0..2 {
            mse_loss(&ddp.forward(&x)?, &y, Reduction::Mean)?.backward()?;
            opt.step()?;
            let mut params = ddp.module().parameters();
            params.extend(opt.params().iter().cloned());
            held = MemoryBreakdown::measure(&params, &[], opt.as_ref(), 0);
            opt.zero_grad()?;
        }
        if comm.rank() == 0 {
            eprintln!("    {world} ranks, {zero:?}:\n{held}");
        }
        Ok(held.model_states())
    })
    .map_err(err)?;
    Ok(results[0])
}

pub fn zero2_memory_ratio(_quick: bool) -> Outcome {
    ensure_host_devices(2).map_err(err)?;
    Ok(model_states(2, Some(ZeroStage::Two))? as f64 / model_states(2, None)? as f64)
}

pub fn zero2_memory_ratio_4(_quick: bool) -> Outcome {
    ensure_host_devices(4).map_err(err)?;
    Ok(model_states(4, Some(ZeroStage::Two))? as f64 / model_states(4, None)? as f64)
}
