//! FullyShardedDataParallel across 2 MPI processes: the same parameters as
//! one process, step for step; a rank that leaves ends the other in an
//! `Err`. (Across two hosts in network namespaces: `tests/mpi.rs`.)
//!
//! Run: `cargo test -p brasa-parallel --features mpi --test mpi_fsdp`.
#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::Var;
use brasa_nn::functional::cross_entropy;
use brasa_parallel::{FsdpConfig, FullyShardedDataParallel};
use std::time::Duration;

#[path = "support/ddp_case.rs"]
mod ddp_case;
#[path = "support/fsdp_case.rs"]
mod fsdp_case;
#[path = "support/job.rs"]
mod job;
#[path = "support/launch.rs"]
mod launch;
use ddp_case::{ddp_batch, ddp_model};
use fsdp_case::check_fsdp;
use job::{case, is_child, join, local_mpirun, run};

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
