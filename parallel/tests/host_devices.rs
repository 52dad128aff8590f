//! `ensure_host_devices` never lowers the process's host device count. Its
//! own test binary: the count is fixed at the first host tensor, so no
//! other test may create one first.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_parallel::{ensure_host_devices, ParallelError};
use brasa_tensor::{host_device_count, planned_host_device_count, set_host_device_count};

#[test]
fn ensure_host_devices_keeps_a_larger_count_and_refuses_to_raise_a_fixed_one() {
    // The only test of this binary: nothing has touched the host devices
    // yet. The program asks for 3 (the count is pending until first use).
    set_host_device_count(3).unwrap();
    assert_eq!(planned_host_device_count(), Some(3));
    // Fewer ranks than the program asked for: the count stays 3.
    ensure_host_devices(2).unwrap();
    assert_eq!(host_device_count().unwrap(), 3, "ensure_host_devices(2) lowered set_host_device_count(3)");
    ensure_host_devices(3).unwrap();
    ensure_host_devices(1).unwrap();
    assert_eq!(host_device_count().unwrap(), 3);
    // The count is fixed now: more ranks are an error that says how to fix it.
    let error = ensure_host_devices(4).unwrap_err();
    let ParallelError::Invalid { op: "ensure_host_devices", message } = &error else { panic!("{error:?}") };
    assert!(message.contains("4 ranks") && message.contains("has 3"), "{message}");
    // The advice: the call that raises the count.
    assert!(message.contains("set_host_device_count(4)"), "{message}");
    assert_eq!(host_device_count().unwrap(), 3);
    // A count set the same as the one in use is accepted; any other refused.
    set_host_device_count(3).unwrap();
    assert!(set_host_device_count(2).is_err());
}
