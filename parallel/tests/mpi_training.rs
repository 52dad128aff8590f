//! Training across 2 MPI processes, with the launch pattern of
//! `tests/mpi.rs` (`support/job.rs`):
//!
//! - `AutoMicroBatch`: rank 0 alone runs out of memory with the whole
//!   batch; both ranks retry with the same split and end equal to one
//!   process's unsplit steps.
//! - `FullyShardedDataParallel`: the same parameters as one process, step
//!   for step (with accumulation, with checkpointed units); a rank that
//!   leaves ends the other in an `Err`. (Across two hosts: `tests/mpi.rs`.)
//!
//! Run: `cargo test -p brasa-parallel --features mpi --test mpi_training`.
#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::Var;
use brasa_nn::functional::cross_entropy;
use brasa_nn::optim::{AutoMicroBatch, Optimizer};
use brasa_nn::{Module, ModuleExt};
use brasa_parallel::{
    Communicator, DdpConfig, DistributedDataParallel, FsdpConfig, FullyShardedDataParallel, ParallelError, Result,
};
use brasa_tensor::{DType, Device, Tensor};
use std::time::Duration;

#[path = "support/ddp_case.rs"]
mod ddp_case;
#[path = "support/fsdp_case.rs"]
mod fsdp_case;
#[path = "support/job.rs"]
mod job;
#[path = "support/launch.rs"]
mod launch;
use ddp_case::{ddp_batch, ddp_model, parameter_values, sgd, DDP_BATCH};
use fsdp_case::check_fsdp;
use job::{case, is_child, join, local_mpirun, run};

/// Rank's part: `AutoMicroBatch` over the job's ranks, where rank 0 alone
/// runs out of memory whenever it is given the whole batch (a real
/// allocator error: a request larger than the limit of logical device
/// `cpu:1`). Both ranks must retry with two micro-batches, settle there,
/// and end equal to one process's unsplit steps on the whole batch.
fn check_auto_micro_batch(comm: &Communicator, steps: usize) -> Result<()> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let reference = ddp_model()?;
    let mut reference_opt = sgd(reference.parameters())?;
    let ddp = DistributedDataParallel::new(ddp_model()?, comm.clone(), DdpConfig::default())?;
    let mut opt = sgd(ddp.module().parameters())?;
    let mut auto = AutoMicroBatch::new();
    let rows = DDP_BATCH / world;
    for step in 0..steps {
        let (full_x, full_y) = ddp_batch(step, 0, 1)?;
        cross_entropy(&reference.forward(&brasa_autograd::Var::new(full_x))?, &full_y)?.backward()?;
        reference_opt.step()?;
        reference_opt.zero_grad()?;
        let (x, y) = ddp_batch(step, rank, world)?;
        let report = auto.step_with_peers(rows, &mut opt, &ddp, |range| {
            if rank == 0 && range.len() == rows {
                // More than cpu:1 may ever hold: an out of memory, as a
                // too-large batch would give.
                Tensor::zeros_on([1 << 20], DType::F32, Device::cpu(1))?;
            }
            let len = range.len();
            let logits = ddp.forward(&brasa_autograd::Var::new(x.narrow(0, range.start, len)?))?;
            Ok::<_, ParallelError>(cross_entropy(&logits, &y.narrow(0, range.start, len)?)?)
        })?;
        assert_eq!(report.micro_batches, 2, "rank {rank} step {step}: {report}");
        assert_eq!(report.retries.len(), usize::from(step == 0), "rank {rank} step {step}: {report}");
        let (got, want) = (parameter_values(ddp.module())?, parameter_values(&reference)?);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "rank {rank} step {step} parameter {i}: {g} vs {w}");
        }
    }
    println!("BRASA-AUTO-MICRO-BATCH-OK rank={rank} steps={steps}");
    Ok(())
}

#[test]
fn auto_micro_batch_over_two_processes_retries_together() {
    if is_child() {
        brasa_tensor::set_host_device_count(2).unwrap();
        brasa_tensor::set_host_memory_limit(1, Some(1 << 20)).unwrap();
        let comm = join(Duration::from_secs(40));
        check_auto_micro_batch(&comm, 3).unwrap();
        drop(comm);
        return;
    }
    let job = run(local_mpirun("auto_micro_batch_over_two_processes_retries_together", ""));
    job.assert_success();
    job.assert_marker("BRASA-AUTO-MICRO-BATCH-OK rank=0");
    job.assert_marker("BRASA-AUTO-MICRO-BATCH-OK rank=1");
}

#[test]
fn fsdp_over_two_processes_matches_one_process() {
    const TEST: &str = "fsdp_over_two_processes_matches_one_process";
    if is_child() {
        let comm = join(Duration::from_secs(10));
        match case().as_str() {
            "default" => check_fsdp(&comm, 5, FsdpConfig::default()).unwrap(),
            "checkpoint" => {
                check_fsdp(&comm, 3, FsdpConfig { checkpoint: true, prefetch: false, ..FsdpConfig::default() }).unwrap()
            }
            "peer-leaves" => {
                let fsdp =
                    FullyShardedDataParallel::new(ddp_model().unwrap(), comm.clone(), FsdpConfig::default()).unwrap();
                if comm.rank() == 1 {
                    // Leaves the group instead of training.
                    drop(fsdp);
                    drop(comm);
                    return;
                }
                let (x, y) = ddp_batch(0, 0, 2).unwrap();
                let outcome = fsdp.forward(&Var::new(x)).and_then(|out| Ok(cross_entropy(&out, &y)?.backward()?));
                let error = outcome.expect_err("rank 1 left: the all-gathers cannot complete");
                println!("BRASA-FSDP-PEER-ERROR rank=0: {error}");
                std::process::exit(3);
            }
            other => panic!("unknown case {other:?}"),
        }
        drop(comm);
        return;
    }
    for case in ["default", "checkpoint"] {
        let job = run(local_mpirun(TEST, case));
        job.assert_success();
        job.assert_marker("BRASA-FSDP-OK rank=0 world=2");
        job.assert_marker("BRASA-FSDP-OK rank=1 world=2");
    }
    let job = run(local_mpirun(TEST, "peer-leaves"));
    job.assert_failed_without_hanging(Duration::from_secs(40));
    job.assert_marker("BRASA-FSDP-PEER-ERROR rank=0");
}
