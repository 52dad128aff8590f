//! A host device count too large to hold (from `set_host_device_count` or
//! `BRASA_HOST_DEVICES`) is an error naming the limit, not a capacity
//! overflow panic or an allocation failure that aborts the process. Its own
//! test binary: the count is fixed at the first tensor of a process.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_tensor::{host_device_count, set_host_device_count, TensorError, HOST_DEVICES_ENV};

#[test]
fn an_enormous_host_device_count_is_an_error() {
    for count in [usize::MAX, 1 << 40, 100_000_000_000] {
        let error = set_host_device_count(count).unwrap_err();
        assert!(matches!(error, TensorError::Device(_)), "{count}: {error:?}");
        // The variant holds only the reason, in words: it names the limit.
        assert!(error.to_string().contains("at most"), "{count}: {error}");
    }
    // Nothing was set: the environment decides at first use.
    std::env::set_var(HOST_DEVICES_ENV, "100000000000");
    let error = std::panic::catch_unwind(host_device_count).expect("no panic").unwrap_err();
    assert!(matches!(error, TensorError::Device(_)), "{error:?}");
    let error = error.to_string();
    assert!(error.contains(HOST_DEVICES_ENV) && error.contains("at most"), "{error}");
    // A sensible count still works afterwards.
    std::env::set_var(HOST_DEVICES_ENV, "3");
    assert_eq!(host_device_count().unwrap(), 3);
}
