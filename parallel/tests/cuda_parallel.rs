//! Collectives, DDP and FSDP on CUDA tensors over the in-process engine:
//! two ranks sharing `cuda:0` (their tensors staged through page-locked
//! host memory), equal to one process. Skipped, with one line, without a
//! CUDA device. `nccl.rs` runs the same cases on NCCL.
//!
//! Run: `cargo test -p brasa-parallel --features cuda --test cuda_parallel`.
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/cuda_case.rs"]
mod cuda_case;

use brasa_parallel::{LaunchOptions, Result};
use cuda_case::{collectives_match, ddp_and_fsdp_match_one_process, first_gpu};

#[test]
fn collectives_on_cuda_tensors_are_correct() -> Result<()> {
    let Some(gpu) = first_gpu() else { return Ok(()) };
    collectives_match(&[gpu, gpu], &LaunchOptions::default())?;
    Ok(())
}

#[test]
fn ddp_and_fsdp_on_one_gpu_match_one_process() -> Result<()> {
    let Some(gpu) = first_gpu() else { return Ok(()) };
    ddp_and_fsdp_match_one_process(&[gpu, gpu], &LaunchOptions::default())
}
