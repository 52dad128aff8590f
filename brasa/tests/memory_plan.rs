//! Memory plans equal the runs they predict, to the byte: whole training
//! steps (forward, loss, backward, Adam) of the MLP, the CNN, a transformer
//! encoder layer, a checkpointed MLP, the MLP under bf16 autocast, four
//! accumulated micro-batches under a GradScaler and a small GPT (AdamW,
//! bf16 autocast), each at three batch sizes and under both allocator
//! configurations, planned on a meta device imitating a fresh logical host
//! device and then run there (the steps are `support/plan_cases.rs`,
//! shared with `cuda_memory_plan.rs`).
//! And `max_batch_size` finds a batch that runs when the next one fails.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use brasa::alloc::AllocatorConfig;
use brasa::prelude::*;
use brasa::tensor::memory::MemoryCategory;
use brasa::tensor::MemoryTarget;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use support::plan_cases::{
    accumulated_scaled_mlp, bf16_mlp, bn_cnn, checkpointed_mlp, cnn, encoder, gpt, mlp, plan_equals_run_on, Setup,
};

const HOST_DEVICES: usize = 128;
static NEXT_DEVICE: AtomicUsize = AtomicUsize::new(1);
/// Autocast and the generator are process-wide: one model at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn fresh_host_device(limit: Option<usize>, config: AllocatorConfig) -> Device {
    brasa::tensor::set_host_device_count(HOST_DEVICES).unwrap();
    let index = NEXT_DEVICE.fetch_add(1, Ordering::Relaxed);
    assert!(index < HOST_DEVICES, "raise HOST_DEVICES");
    brasa::tensor::set_host_memory_limit(index, limit).unwrap();
    brasa::tensor::set_host_allocator_config(index, Some(config)).unwrap();
    Device::cpu(index)
}

/// The plan of `setup` at `batch` for a fresh host device, then the real
/// run there: peaks equal to the byte, categories adding up.
fn plan_equals_run(what: &str, setup: Setup, batch: usize, expandable: bool) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let config = AllocatorConfig::builder().expandable_segments(expandable).build().unwrap();
    let host = fresh_host_device(None, config);
    let label = format!("{what}, expandable segments {expandable}");
    let plan = plan_equals_run_on(host, &label, setup, batch);
    let by_category: usize = plan.peak_by_category.iter().map(|(_, bytes)| bytes).sum();
    assert_eq!(by_category, plan.peak_allocated, "{label}: categories add up");
    let has = |c| plan.peak_by_category.iter().any(|&(category, _)| category == c);
    assert!(has(MemoryCategory::Parameter) && has(MemoryCategory::Input), "{label}: {plan}");
}

fn exact_for_every_size(what: &str, setup: Setup) {
    for batch in [4, 16, 64] {
        for expandable in [false, true] {
            plan_equals_run(what, setup, batch, expandable);
        }
    }
}

#[test]
fn mlp_plans_are_exact() {
    exact_for_every_size("MLP", mlp);
}

#[test]
fn cnn_plans_are_exact() {
    exact_for_every_size("CNN", cnn);
}

#[test]
fn channels_last_batch_norm_cnn_plans_are_exact() {
    exact_for_every_size("channels-last CNN with batch norm", bn_cnn);
}

#[test]
fn encoder_plans_are_exact() {
    exact_for_every_size("transformer encoder", encoder);
}

#[test]
fn checkpointed_mlp_plans_are_exact() {
    exact_for_every_size("checkpointed MLP", checkpointed_mlp);
}

#[test]
fn bf16_autocast_mlp_plans_are_exact() {
    exact_for_every_size("MLP under bf16 autocast", bf16_mlp);
}

#[test]
fn accumulation_with_a_grad_scaler_plans_are_exact() {
    exact_for_every_size(
        "MLP, 4 accumulated micro-batches under bf16 autocast and a GradScaler",
        accumulated_scaled_mlp,
    );
}

#[test]
fn gpt_plans_are_exact() {
    exact_for_every_size("GPT under bf16 autocast", gpt);
}

#[test]
fn a_plan_names_the_allocation_that_would_fail() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let limit = 6 << 20;
    let host = fresh_host_device(Some(limit), AllocatorConfig::default());
    let plan = memory::plan(&MemoryTarget::like(host).unwrap(), |device| cnn(device, 512)).unwrap();
    assert!(!plan.fits);
    let failure = plan.failure.clone().expect("the failing allocation");
    // The real run fails asking for the same bytes.
    let real = (|| -> brasa::nn::Result<()> {
        let mut step = cnn(host, 512)?;
        step()?;
        step()
    })();
    let error = real.expect_err("the real step runs out of memory");
    let oom = brasa::alloc::find_out_of_memory(&error).expect("an out-of-memory error");
    assert_eq!(oom.requested_bytes, failure.requested, "{plan}");
    assert!(plan.to_string().contains("fits: NO"), "{plan}");
    assert!(plan.to_json().contains("\"failure\""));
}

#[test]
fn max_batch_size_finds_the_batch_that_fits() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let limit = 24 << 20;
    let host = fresh_host_device(Some(limit), AllocatorConfig::default());
    let search = memory::max_batch_size(host, 1 << 14, true, cnn).unwrap();
    assert!(search.batch > 1 && search.confirmed, "{search:?}");
    assert!(search.next_lacks.is_some_and(|lack| lack > 0), "{search:?}");
    // The next batch fails on the real device, where the found one ran.
    let next = search.next.expect("a next batch");
    let real = (|| -> brasa::nn::Result<()> {
        let mut step = cnn(host, next)?;
        step()?;
        step()
    })();
    assert!(real.is_err_and(|e| brasa::alloc::find_out_of_memory(&e).is_some()), "batch {next} should not fit");
}
