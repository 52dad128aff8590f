//! The recipe of `examples/oom_recovery.rs`, run as a function: on a device
//! limited to 64 MiB, the first step of 8192 rows runs out of memory, it is
//! split (at least once) and retried, the split is kept, and training
//! completes and learns with the batch unchanged.

#[allow(dead_code)]
#[path = "../examples/oom_recovery.rs"]
mod oom_recovery;

use oom_recovery::{limited_device, train, MEMORY_LIMIT, STEPS};

#[test]
fn an_out_of_memory_splits_the_step_and_training_then_succeeds() {
    let report = train(limited_device().unwrap()).unwrap();
    assert!(!report.ooms.is_empty(), "the first batch should not fit: {report:?}");
    for (device, requested, _) in &report.ooms {
        assert_eq!(device, "cpu:1");
        assert!(*requested > 0 && *requested <= MEMORY_LIMIT, "{requested} bytes");
    }
    assert_eq!(report.ooms[0].2, 1, "the first attempt is the whole batch");
    assert_eq!(report.micro_batches, 1 << report.ooms.len(), "each out of memory doubles the split once");
    assert_eq!(report.steps, STEPS);
    assert!(report.last_loss.is_finite() && report.last_loss < report.first_loss, "{report:?}");
    let line = report.summary();
    assert!(
        line.starts_with(&format!("oom_recovery: trained {STEPS} steps of 8192 rows after {}", report.ooms.len())),
        "{line}"
    );
}
