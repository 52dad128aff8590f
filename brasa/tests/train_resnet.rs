//! The claim of `examples/train_resnet.rs`, as a test: a narrow ResNet-18
//! (base width 8, through the example's own code: the digits upscaled to
//! 32×32, SGD with momentum and a cosine rate) learns the digits in a few
//! dozen steps. The run is deterministic (seeded weights and batch order);
//! it measured a test accuracy of 0.886 and a mean loss of 1.38 over its
//! steps (chance: 0.10 and ln 10 = 2.30), so the thresholds leave room
//! for another CPU's kernels and summation order, not for a model that
//! does not learn.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

// The example compiled here as a module (its `main` is unused).
#[allow(dead_code)]
#[path = "../examples/train_resnet.rs"]
mod example;

#[test]
fn a_narrow_resnet_learns_the_upscaled_digits() {
    // 960 samples: two thirds of an epoch, about 40 s in a debug build on two cores.
    const STEPS: usize = 60;
    let cli = format!("--width 8 --batch-size 16 --steps {STEPS} --seed 0");
    let outcome = example::run(cli.split_whitespace().map(String::from).collect()).unwrap();
    assert_eq!(outcome.steps, STEPS);
    assert!(outcome.last_loss < 1.8, "mean training loss {:.4}, expected < 1.8", outcome.last_loss);
    assert!(
        outcome.test_accuracy >= 0.8,
        "test accuracy {:.4} after {STEPS} steps, expected ≥ 0.8",
        outcome.test_accuracy
    );
}
