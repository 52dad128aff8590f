//! `nccl.*` (feature `cuda`, a GPU and NCCL present): brasa's NCCL engine
//! next to PyTorch's `torch.distributed` on NCCL, on the same GPU, rounds
//! interleaved (brasa, PyTorch, ...; medians).
//!
//! - `nccl.allreduce_us`, `nccl.allreduce_vs_torch`: one all-reduce of 64 MiB
//!   of f32 in microseconds, over a loop of asynchronous submissions
//!   (`all_reduce_async`, the way DDP's buckets go) waited for at the end,
//!   and brasa's time ÷ PyTorch's (lower is better; target ≤ 1.05).
//! - `nccl.allreduce_1mib_us`, `nccl.allreduce_1mib_vs_torch`: the same
//!   with 1 MiB, where per-collective overheads show.
//! - `nccl.ddp_step_ms`, `nccl.ddp_step_vs_torch`: one training step of the
//!   `cuda.mlp_*` MLP (784-512-512-10, batch 128, SGD momentum) under
//!   `DistributedDataParallel` on this communicator, milliseconds, and
//!   brasa's time ÷ PyTorch DDP's (target ≤ 1.0).
//!
//! The world is one rank on `cuda:0` in both (a one-GPU machine whose NCCL
//! is older than 2.30 allows no more). PyTorch's side is
//! `bench/peers/torch_cuda.py --bench allreduce_{1,64}mib`. Without a GPU
//! or NCCL the group prints one line and no figure.

use crate::cuda_figures::{torch_value, training_step_of};
use crate::measure::{value_and_ratio, Better, Figure, Options};
use brasa_parallel::nccl::{nccl_group, nccl_library_path, nccl_version};
use brasa_parallel::{CommOptions, Communicator, DdpConfig, DistributedDataParallel, ReduceOp, Result, Work};
use brasa_tensor::{cuda_device_count, manual_seed, synchronize, DType, Device, Tensor};
use std::time::Instant;

const GPU: Device = Device::cuda(0);

/// Parent side: the figures, or one line saying why there are none.
pub fn run(options: &Options) -> Vec<Figure> {
    if cuda_device_count() == 0 {
        eprintln!("nccl: no CUDA device (or no driver): the nccl.* figures are left out");
        return Vec::new();
    }
    let version = match nccl_version() {
        Ok(version) => version,
        Err(e) => {
            eprintln!("nccl: {e}: the nccl.* figures are left out");
            return Vec::new();
        }
    };
    let path = nccl_library_path().map(|p| p.display().to_string()).unwrap_or_default();
    eprintln!("nccl: NCCL {}.{}.{} from {path}, world 1 on {GPU}", version.0, version.1, version.2);
    let comm = match nccl_group(&[GPU], &CommOptions::default()) {
        Ok(mut comms) => comms.remove(0),
        Err(e) => {
            eprintln!("nccl: starting a communicator: {e}");
            return Vec::new();
        }
    };
    let python = crate::measure::torch_python();
    let rounds = options.reps(3, 1);
    let mut figures = Vec::new();
    for (mib, iters, value_name, ratio_name) in [
        (64, 50, "nccl.allreduce_us", "nccl.allreduce_vs_torch"),
        (1, 200, "nccl.allreduce_1mib_us", "nccl.allreduce_1mib_vs_torch"),
    ] {
        if !options.wants(value_name) && !options.wants(ratio_name) {
            continue;
        }
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            match all_reduce_us(&comm, mib, iters) {
                Ok(us) => ours.push(us),
                Err(e) => eprintln!("nccl: all-reduce of {mib} MiB: {e}"),
            }
            if let Some(us) = torch_value(&python, &format!("allreduce_{mib}mib")) {
                theirs.push(us);
            }
        }
        figures.extend(value_and_ratio(value_name, "us", ratio_name, Better::Lower, &mut ours, &mut theirs));
    }
    if options.wants("nccl.ddp_step_ms") || options.wants("nccl.ddp_step_vs_torch") {
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            match ddp_step_ms(&comm, options.quick) {
                Ok(ms) => ours.push(ms),
                Err(e) => eprintln!("nccl: DDP step: {e}"),
            }
            if let Some(ms) = torch_value(&python, "ddp_mlp") {
                theirs.push(ms);
            }
        }
        let (value, ratio) = ("nccl.ddp_step_ms", "nccl.ddp_step_vs_torch");
        figures.extend(value_and_ratio(value, "ms", ratio, Better::Lower, &mut ours, &mut theirs));
    }
    figures
}

/// Milliseconds per DDP training step of the MLP over `comm`.
fn ddp_step_ms(comm: &Communicator, quick: bool) -> Result<f64> {
    manual_seed(0);
    let ddp = DistributedDataParallel::new(crate::nn_figures::mlp_on(GPU)?, comm.clone(), DdpConfig::default())?;
    let mut step = training_step_of(ddp, 128, vec![128, 784])?;
    for i in 0..10 {
        step(i)?;
    }
    let steps = if quick { 20 } else { 200 };
    synchronize(GPU)?;
    let started = Instant::now();
    for i in 0..steps {
        step(i)?;
    }
    synchronize(GPU)?;
    Ok(started.elapsed().as_secs_f64() * 1e3 / steps as f64)
}

/// Microseconds per all-reduce of `mib` MiB over `iters` submissions.
fn all_reduce_us(comm: &Communicator, mib: usize, iters: usize) -> Result<f64> {
    let x = Tensor::ones_on([mib << 18], DType::F32, GPU)?;
    for _ in 0..10 {
        comm.all_reduce(&x, ReduceOp::Sum)?;
    }
    synchronize(GPU)?;
    let started = Instant::now();
    let pending: Vec<Work> = (0..iters).map(|_| comm.all_reduce_async(&x, ReduceOp::Sum)).collect();
    for work in pending {
        work.wait()?;
    }
    synchronize(GPU)?;
    Ok(started.elapsed().as_secs_f64() * 1e6 / iters as f64)
}
