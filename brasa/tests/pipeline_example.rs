//! The claims of `examples/pipeline.rs`, as a test: its deep MLP, cut in 2
//! stages by parameter bytes and trained with 1F1B over logical host
//! devices `cpu:0` and `cpu:1`, learns the digits; the report names both
//! stages with their spans and memory, and the bubble is a share.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

// The example's model and evaluation, compiled here as a module (its `main`
// and argument parsing are unused).
#[allow(dead_code)]
#[path = "../examples/pipeline.rs"]
mod example;

use brasa::nn::data::{DataLoader, Digits};
use brasa::nn::functional::cross_entropy;
use brasa::nn::optim::{Adam, AdamConfig, Optimizer};
use brasa::parallel::pipeline::{Partition, Pipeline, PipelineConfig, PipelineRng, Schedule};
use brasa::prelude::*;

#[test]
fn the_pipelined_deep_mlp_learns_the_digits() -> Result<(), Box<dyn std::error::Error>> {
    const EPOCHS: u64 = 12;
    brasa::parallel::ensure_host_devices(2)?;
    let (train, test) = Digits::load()?.train_test()?;
    let dev0 = Device::cpu(0);
    let config = PipelineConfig::new(Partition::ParameterBytes { stages: 2 }, 4)
        .schedule(Schedule::OneFOneB)
        .rng(PipelineRng::Shared);
    let mut pipe = Pipeline::new(example::deep_mlp(dev0)?, cross_entropy, config)?;
    assert_eq!(pipe.stages().len(), 2);
    let mut opt = Adam::new(pipe.parameters(), AdamConfig { lr: 1e-3, ..Default::default() })?;
    let loader = DataLoader::builder(train).batch_size(64).shuffle(true).seed(0).device(dev0).build()?;
    for epoch in 0..EPOCHS {
        for batch in loader.epoch(epoch) {
            let (x, y) = batch?;
            if x.dims()[0] < 4 {
                continue;
            }
            pipe.step(&x, &y)?;
            opt.step()?;
            opt.zero_grad()?;
        }
    }
    let report = pipe.report().expect("a report").clone();
    assert_eq!(report.stages.len(), 2);
    for (s, stage) in report.stages.iter().enumerate() {
        assert_eq!(stage.device, Device::cpu(s));
        assert_eq!(stage.spans.len(), 8, "4 forwards and 4 backwards");
        assert!(stage.peak_bytes > 0 && stage.error.is_none());
    }
    assert!(report.bubble() > 0.0 && report.bubble() < 1.0);
    let test_accuracy = example::accuracy(&mut pipe, &test)?;
    assert!(test_accuracy >= 0.95, "test accuracy {test_accuracy:.4} after {EPOCHS} epochs");
    Ok(())
}
