//! Device memory that libraries allocate themselves, outside the caching
//! allocator (NCCL's channel buffers, for one): a library registers a
//! reporter once, and [`external`] and [`summary`](super::summary) list
//! what each reports for a device, so `memory_summary` accounts for memory
//! that `allocated` and `reserved` cannot see.
//!
//! ```
//! use brasa_tensor::{memory, Device};
//! memory::register_external("my-library", |device| (device == Device::CPU).then_some(4096));
//! assert!(memory::external(Device::CPU).contains(&("my-library".to_string(), 4096)));
//! ```

use crate::device::Device;
use std::sync::{Arc, Mutex};

/// What a library holds on a device, in bytes (`None`: nothing known there).
type Reporter = Arc<dyn Fn(Device) -> Option<u64> + Send + Sync>;

static REPORTERS: Mutex<Vec<(String, Reporter)>> = Mutex::new(Vec::new());

/// Registers `reporter` under `name` (replacing an earlier one of that
/// name): it answers how many bytes the library holds on a device outside
/// the caching allocator, or `None`.
pub fn register_external(name: &str, reporter: impl Fn(Device) -> Option<u64> + Send + Sync + 'static) {
    let mut reporters = REPORTERS.lock().unwrap_or_else(|e| e.into_inner());
    reporters.retain(|(n, _)| n != name);
    reporters.push((name.to_string(), Arc::new(reporter)));
}

/// What every registered library reports for `device`, by name (those that
/// report nothing are left out).
pub fn external(device: Device) -> Vec<(String, u64)> {
    // The reporters run without the lock: one may take locks of its own.
    let reporters: Vec<(String, Reporter)> = REPORTERS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    reporters.into_iter().filter_map(|(name, report)| report(device).map(|bytes| (name, bytes))).collect()
}

/// The lines [`summary`](super::summary) adds for `device`: empty when no
/// library reports memory there.
pub(crate) fn summary_lines(device: Device) -> String {
    let entries = external(device);
    if entries.is_empty() {
        return String::new();
    }
    let mut text = String::from("Outside the caching allocator (libraries' own device memory):\n");
    for (name, bytes) in entries {
        text.push_str(&format!("  {name:<24} {:>12.2} MiB\n", bytes as f64 / (1u64 << 20) as f64));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reporters_are_listed_per_device_and_replaced_by_name() {
        register_external("test-a", |d| (d == Device::cpu(7)).then_some(10));
        register_external("test-a", |d| (d == Device::cpu(7)).then_some(3 << 20));
        register_external("test-b", |_| None);
        let listed = external(Device::cpu(7));
        assert!(listed.contains(&("test-a".to_string(), 3 << 20)));
        assert!(!listed.iter().any(|(n, _)| n == "test-b"));
        assert!(!external(Device::cpu(6)).iter().any(|(n, _)| n == "test-a"));
        let lines = summary_lines(Device::cpu(7));
        assert!(lines.contains("test-a") && lines.contains("3.00 MiB"), "{lines}");
    }
}
