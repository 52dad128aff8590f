//! The claims of `examples/train_digits.rs --shard`, as a test: over the
//! same logical host devices, plain DDP, DDP with ZeRO-2 and FSDP train the
//! same model (the same loss and accuracy: sharding changes where the model
//! states live, not the mathematics), and each rank's model states shrink
//! as the modes promise — ZeRO-2 to P + (G + 2P)/N, FSDP to (P + G + 2P)/N.
//! FSDP's full state dict loads into the unsharded model with the same
//! accuracy.
//!
//! One test: the example seeds the process-wide generator and profiles
//! process-wide, so its runs must not overlap.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

// The example compiled here as a module (its `main` is unused).
#[allow(dead_code)]
#[path = "../examples/train_digits.rs"]
mod example;

use brasa::parallel::MemoryBreakdown;

type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

fn run(options: &str) -> TestResult<example::Outcome> {
    example::run(options.split_whitespace().map(String::from).collect())
}

/// Every rank's model states, all alike.
fn per_rank(outcome: &example::Outcome, world: usize) -> MemoryBreakdown {
    assert_eq!(outcome.model_states.len(), world);
    let first = outcome.model_states[0].expect("rank 0 measured a step");
    for (rank, states) in outcome.model_states.iter().enumerate() {
        assert_eq!(*states, Some(first), "rank {rank}");
    }
    first
}

/// `part` is `1/n` of `whole` up to padding (a shard is padded to a
/// multiple of the world size) and Adam's per-parameter step counters.
fn about_a_share(part: usize, whole: usize, n: usize) -> bool {
    let share = whole as f64 / n as f64;
    (part as f64 - share).abs() <= 0.02 * share + 256.0
}

#[test]
fn every_shard_mode_trains_the_same_model_with_its_own_memory_per_rank() -> TestResult {
    const WORLD: usize = 4;
    let ddp = run("--devices 4 --epochs 2")?;
    let zero2 = run("--devices 4 --shard zero2 --epochs 2")?;
    let fsdp = run("--devices 4 --shard full --epochs 2")?;
    for (mode, outcome) in [("zero2", &zero2), ("full", &fsdp)] {
        assert!(
            (outcome.last_loss - ddp.last_loss).abs() <= 1e-4 * ddp.last_loss.abs().max(1.0),
            "--shard {mode}: last epoch's loss {} vs DDP's {}",
            outcome.last_loss,
            ddp.last_loss
        );
        assert!(
            (outcome.test_accuracy - ddp.test_accuracy).abs() <= 1.0 / 360.0 + 1e-9,
            "--shard {mode}: test accuracy {} vs DDP's {}",
            outcome.test_accuracy,
            ddp.test_accuracy
        );
    }
    assert!(ddp.test_accuracy > 0.8, "two epochs learn the digits: {}", ddp.test_accuracy);
    assert_eq!(fsdp.unsharded, Some(fsdp.test_accuracy), "the full state dict is the trained model");

    let (d, z, f) = (per_rank(&ddp, WORLD), per_rank(&zero2, WORLD), per_rank(&fsdp, WORLD));
    // DDP: one whole replica per rank.
    assert!(about_a_share(d.model_states(), ddp.replica_bytes, 1), "DDP {d:?} vs replica {}", ddp.replica_bytes);
    // ZeRO-2: whole parameters, 1/N of the gradients and of Adam's state.
    assert!(about_a_share(z.parameters, d.parameters, 1), "{z:?}");
    assert!(about_a_share(z.gradients, d.gradients, WORLD), "{z:?}");
    assert!(about_a_share(z.optimizer_state, d.optimizer_state, WORLD), "{z:?}");
    // FSDP: 1/N of all three.
    assert!(about_a_share(f.parameters, d.parameters, WORLD), "{f:?}");
    assert!(about_a_share(f.gradients, d.gradients, WORLD), "{f:?}");
    assert!(about_a_share(f.optimizer_state, d.optimizer_state, WORLD), "{f:?}");
    assert!(f.model_states() < z.model_states() && z.model_states() < d.model_states());

    // The CNN (a Sequential of 8 units, 5 without parameters) shards too.
    let cnn_ddp = run("--devices 2 --model cnn --epochs 1")?;
    let cnn_fsdp = run("--devices 2 --shard full --model cnn --epochs 1")?;
    assert!((cnn_fsdp.test_accuracy - cnn_ddp.test_accuracy).abs() <= 1.0 / 360.0 + 1e-9);
    assert!(about_a_share(per_rank(&cnn_fsdp, 2).model_states(), per_rank(&cnn_ddp, 2).model_states(), 2));
    Ok(())
}

#[test]
fn sharding_needs_several_devices() {
    for options in ["--shard full", "--devices 1 --shard zero2", "--devices 2 --shard full --memory-limit 2MiB"] {
        let error = run(options).expect_err(options).to_string();
        assert!(error.contains("--shard"), "{options}: {error}");
    }
    assert!(run("--devices 2 --shard zero3").expect_err("zero3").to_string().contains("expected none, zero2 or full"));
}
