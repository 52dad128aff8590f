//! Memory plans for a CUDA target equal the runs on `cuda:0` they predict,
//! to the byte (feature `cuda`, a GPU present; issue 26): whole training
//! steps of an MLP, a CNN (convolutions on the im2col path: cuDNN is
//! switched off, whose workspaces plans do not model), a channels-last CNN
//! with batch norm (on the im2col path too), a transformer
//! encoder, the MLP under bf16 autocast, four accumulated micro-batches
//! under a GradScaler, a checkpointed MLP, and a small GPT under bf16
//! autocast (fused attention), each planned on a meta device imitating
//! `cuda:0` (`MemoryTarget::like`) and then run there from an empty
//! allocator. Skips with one line where there is no GPU.
//!
//! The host twin of this file is `memory_plan.rs`; on CUDA the backend's
//! own scratch (split reductions, im2col buffers, index checks, fused
//! attention's buffers) must be planned too, which the host never
//! allocates.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use brasa::prelude::*;
use brasa::tensor::{cuda_device_count, cudnn, synchronize};
use std::sync::{Mutex, MutexGuard};
use support::plan_cases::{
    accumulated_scaled_mlp, bf16_mlp, bn_cnn, checkpointed_mlp, cnn, encoder, gpt, mlp, plan_equals_run_on, Setup,
};

/// The device's allocator, cuDNN's switch, autocast and the generator are
/// process-wide: one case at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// This test's turn on the GPU, or `None` (said once) without one.
fn gpu() -> Option<MutexGuard<'static, ()>> {
    if cuda_device_count() == 0 {
        eprintln!("skipped: no CUDA device (or no driver)");
        return None;
    }
    Some(SERIAL.lock().unwrap_or_else(|e| e.into_inner()))
}

/// The plan of `setup` at `batch` for `cuda:0` as it is now (empty), then
/// the real run there: peaks equal to the byte.
fn plan_equals_cuda_run(what: &str, setup: Setup, batch: usize) {
    let device = Device::cuda(0);
    synchronize(device).unwrap();
    memory::empty_cache(device).unwrap();
    let held = memory::allocated(device).unwrap();
    assert_eq!(
        held, 0,
        "{what}: {held} bytes of cuda:0 are still allocated before the step (a leak of an earlier case?)"
    );
    assert_eq!(memory::reserved(device).unwrap(), 0, "{what}: empty_cache left memory reserved");
    memory::reset_peak(device).unwrap();
    plan_equals_run_on(device, what, setup, batch);
}

fn exact_for_every_size(what: &str, setup: Setup) {
    let Some(_gpu) = gpu() else { return };
    for batch in [4, 64] {
        plan_equals_cuda_run(what, setup, batch);
    }
}

#[test]
fn mlp_plans_equal_cuda_runs() {
    exact_for_every_size("MLP", mlp);
}

/// [`exact_for_every_size`] with cuDNN switched off (convolutions on the
/// im2col path, which plans model), the switch put back even when a case
/// fails.
fn exact_without_cudnn(what: &str, setup: Setup) {
    let Some(guard) = gpu() else { return };
    let enabled = cudnn::enabled();
    cudnn::set_enabled(false);
    drop(guard);
    let outcome = std::panic::catch_unwind(|| exact_for_every_size(what, setup));
    cudnn::set_enabled(enabled);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn cnn_plans_equal_cuda_runs_on_the_im2col_path() {
    exact_without_cudnn("CNN without cuDNN", cnn);
}

#[test]
fn channels_last_batch_norm_cnn_plans_equal_cuda_runs() {
    // Batch norm's temporaries of partial results (`batch_norm_row_pieces`).
    exact_without_cudnn("channels-last CNN with batch norm, without cuDNN", bn_cnn);
}

#[test]
fn encoder_plans_equal_cuda_runs() {
    exact_for_every_size("transformer encoder", encoder);
}

#[test]
fn bf16_autocast_mlp_plans_equal_cuda_runs() {
    exact_for_every_size("MLP under bf16 autocast", bf16_mlp);
}

#[test]
fn accumulation_with_a_grad_scaler_plans_equal_cuda_runs() {
    exact_for_every_size("MLP, 4 micro-batches under bf16 autocast and a GradScaler", accumulated_scaled_mlp);
}

#[test]
fn checkpointed_mlp_plans_equal_cuda_runs() {
    exact_for_every_size("checkpointed MLP", checkpointed_mlp);
}

#[test]
fn gpt_plans_equal_cuda_runs() {
    exact_for_every_size("GPT under bf16 autocast (fused attention)", gpt);
}
