//! The recipe of `examples/oom_recovery.rs`, run as a function: on a device
//! limited to 64 MiB, the first batch runs out of memory, the batch is halved
//! (at least once), and training then completes and learns.

#[allow(dead_code)]
#[path = "../examples/oom_recovery.rs"]
mod oom_recovery;

use oom_recovery::{limited_device, train, MEMORY_LIMIT, START_BATCH, STEPS};

#[test]
fn an_out_of_memory_halves_the_batch_and_training_then_succeeds() {
    let report = train(limited_device().unwrap()).unwrap();
    assert!(!report.ooms.is_empty(), "the first batch should not fit: {report:?}");
    for (device, requested, batch) in &report.ooms {
        assert_eq!(device, "cpu:1");
        assert!(*requested > 0 && *requested <= MEMORY_LIMIT, "{requested} bytes for a batch of {batch}");
    }
    assert_eq!(report.ooms[0].2, START_BATCH);
    assert!(report.final_batch <= START_BATCH / 2, "{report:?}");
    assert_eq!(report.final_batch, START_BATCH >> report.ooms.len(), "each out of memory halves the batch once");
    assert_eq!(report.steps, STEPS);
    assert!(report.last_loss.is_finite() && report.last_loss < report.first_loss, "{report:?}");
    let line = report.summary();
    assert!(
        line.starts_with(&format!("oom_recovery: trained {STEPS} steps after {} out-of-memory", report.ooms.len())),
        "{line}"
    );
}
