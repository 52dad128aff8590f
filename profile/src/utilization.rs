//! A one-call snapshot of memory and compute per device, like GPUtil's
//! `showUtilization()`, plus the host process's resident memory.
//!
//! Devices report through [`DeviceMonitor`], which a device crate implements and
//! registers once with [`register_device_monitor`]; [`utilization`] then asks
//! every registered monitor. Host figures come from `/proc` on Linux and read
//! "unknown" elsewhere.

use std::fmt;
use std::sync::{Arc, Mutex};

use crate::event::{DeviceId, MemoryBaseline};
use crate::session::lock;
use crate::units::format_bytes;
use crate::user_code::call_user;

/// What a device can say about its own load. Implemented by device crates.
pub trait DeviceMonitor: Send + Sync {
    /// The device reported on.
    fn device(&self) -> DeviceId;

    /// A human name (e.g. the GPU model). Default: the device id.
    fn name(&self) -> String {
        self.device().to_string()
    }

    /// Bytes in use on the device (by anyone), if known.
    fn memory_used(&self) -> Option<u64>;

    /// The device's memory capacity, if known.
    fn memory_total(&self) -> Option<u64>;

    /// Percent of time the device's compute was busy recently (0–100), if the
    /// device can tell. Default: unknown.
    fn compute_utilization(&self) -> Option<f64> {
        None
    }

    /// What the device's allocator holds now, per memory category: the
    /// starting point of the memory timeline when a profiler built with
    /// `profile_memory(true)` starts recording (see [`MemoryBaseline`]).
    /// Default: unknown (bytes allocated before the recording then show as
    /// unknown in the timeline).
    fn memory_baseline(&self) -> Option<MemoryBaseline> {
        None
    }
}

/// One device's line of the snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceUtilization {
    /// The device.
    pub device: DeviceId,
    /// Its human name.
    pub name: String,
    /// Bytes in use, if known.
    pub memory_used: Option<u64>,
    /// Capacity, if known.
    pub memory_total: Option<u64>,
    /// Compute busy percent, if known.
    pub compute_percent: Option<f64>,
}

impl DeviceUtilization {
    /// `memory_used / memory_total` in percent, when both are known.
    pub fn memory_percent(&self) -> Option<f64> {
        match (self.memory_used, self.memory_total) {
            (Some(used), Some(total)) if total > 0 => Some(used as f64 * 100.0 / total as f64),
            _ => None,
        }
    }
}

/// Host memory as the operating system reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostMemory {
    /// This process's resident set size (`VmRSS`).
    pub process_resident: Option<u64>,
    /// This process's peak resident set size (`VmHWM`).
    pub process_peak_resident: Option<u64>,
    /// Physical memory of the machine (`MemTotal`).
    pub total: Option<u64>,
    /// Memory available to new allocations without swapping (`MemAvailable`).
    pub available: Option<u64>,
}

/// The snapshot [`utilization`] returns; `Display` prints it as a table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Utilization {
    /// Host and process memory.
    pub host: HostMemory,
    /// One line per registered device, in registration order.
    pub devices: Vec<DeviceUtilization>,
}

static MONITORS: Mutex<Vec<Arc<dyn DeviceMonitor>>> = Mutex::new(Vec::new());

/// Adds a device to what [`utilization`] reports, replacing any monitor already
/// registered for the same device.
pub fn register_device_monitor(monitor: Arc<dyn DeviceMonitor>) {
    let mut monitors = lock(&MONITORS);
    let device = monitor.device();
    monitors.retain(|m| m.device() != device);
    monitors.push(monitor);
}

/// Removes `device`'s monitor; returns whether there was one.
pub fn unregister_device_monitor(device: DeviceId) -> bool {
    let mut monitors = lock(&MONITORS);
    let before = monitors.len();
    monitors.retain(|m| m.device() != device);
    monitors.len() != before
}

/// Every registered monitor's [`DeviceMonitor::memory_baseline`], by device,
/// with a warning for each monitor that panicked.
pub(crate) fn memory_baselines() -> (Vec<MemoryBaseline>, Vec<String>) {
    let monitors: Vec<Arc<dyn DeviceMonitor>> = lock(&MONITORS).clone();
    let mut baselines = Vec::new();
    let mut warnings = Vec::new();
    for monitor in monitors {
        match call_user(|| monitor.memory_baseline()) {
            Ok(Some(baseline)) => baselines.push(MemoryBaseline { device: monitor.device(), ..baseline }),
            Ok(None) => {}
            Err(message) => warnings.push(format!("a device monitor panicked in memory_baseline ({message})")),
        }
    }
    baselines.sort_by_key(|b| b.device);
    (baselines, warnings)
}

/// Host memory plus every registered device's memory and compute, now.
pub fn utilization() -> Utilization {
    let monitors: Vec<Arc<dyn DeviceMonitor>> = lock(&MONITORS).clone();
    utilization_of(&monitors)
}

/// Host memory plus the given devices' memory and compute, now.
pub fn utilization_of(monitors: &[Arc<dyn DeviceMonitor>]) -> Utilization {
    Utilization {
        host: host_memory(),
        devices: monitors
            .iter()
            .map(|m| DeviceUtilization {
                device: m.device(),
                name: m.name(),
                memory_used: m.memory_used(),
                memory_total: m.memory_total(),
                compute_percent: m.compute_utilization(),
            })
            .collect(),
    }
}

/// This process's resident memory and the machine's memory, from `/proc` on
/// Linux; all fields `None` elsewhere.
pub fn host_memory() -> HostMemory {
    #[cfg(target_os = "linux")]
    {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        HostMemory {
            process_resident: kib_field(&status, "VmRSS"),
            process_peak_resident: kib_field(&status, "VmHWM"),
            total: kib_field(&meminfo, "MemTotal"),
            available: kib_field(&meminfo, "MemAvailable"),
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        HostMemory::default()
    }
}

/// Reads `Key:   1234 kB` from a `/proc` text file, in bytes.
fn kib_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(key)?.strip_prefix(':')?;
        let mut parts = rest.split_whitespace();
        let value: u64 = parts.next()?.parse().ok()?;
        match parts.next() {
            Some("kB") => value.checked_mul(1024),
            None => Some(value),
            Some(_) => None,
        }
    })
}

fn or_unknown(value: Option<u64>) -> String {
    value.map_or_else(|| "unknown".to_owned(), format_bytes)
}

fn percent_or_unknown(value: Option<f64>) -> String {
    value.map_or_else(|| "unknown".to_owned(), |p| format!("{p:.1}%"))
}

impl fmt::Display for Utilization {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let header = ["Device", "Name", "Compute", "Memory used", "Memory total", "Memory %"];
        let rows: Vec<[String; 6]> = self
            .devices
            .iter()
            .map(|d| {
                [
                    d.device.to_string(),
                    d.name.clone(),
                    percent_or_unknown(d.compute_percent),
                    or_unknown(d.memory_used),
                    or_unknown(d.memory_total),
                    percent_or_unknown(d.memory_percent()),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &[String]| -> String {
            let inner: Vec<String> = cells
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(i, (c, w))| if i < 2 { format!(" {c:<w$} ") } else { format!(" {c:>w$} ") })
                .collect();
            format!("|{}|", inner.join("|"))
        };
        if rows.is_empty() {
            writeln!(f, "no device monitors registered")?;
        } else {
            writeln!(f, "{}", line(&header.map(str::to_owned)))?;
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(w + 2)).collect();
            writeln!(f, "|{}|", rule.join("|"))?;
            for row in &rows {
                writeln!(f, "{}", line(row))?;
            }
        }
        let h = &self.host;
        writeln!(
            f,
            "host: process resident {} (peak {}) · machine total {} · available {}",
            or_unknown(h.process_resident),
            or_unknown(h.process_peak_resident),
            or_unknown(h.total),
            or_unknown(h.available)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct FakeGpu;
    impl DeviceMonitor for FakeGpu {
        fn device(&self) -> DeviceId {
            DeviceId::cuda(7)
        }
        fn name(&self) -> String {
            "Fake GPU".into()
        }
        fn memory_used(&self) -> Option<u64> {
            Some(1 << 30)
        }
        fn memory_total(&self) -> Option<u64> {
            Some(4 << 30)
        }
        fn compute_utilization(&self) -> Option<f64> {
            Some(87.5)
        }
    }

    struct Opaque;
    impl DeviceMonitor for Opaque {
        fn device(&self) -> DeviceId {
            DeviceId::cpu(3)
        }
        fn memory_used(&self) -> Option<u64> {
            None
        }
        fn memory_total(&self) -> Option<u64> {
            None
        }
    }

    #[test]
    fn proc_fields_parse() {
        let status = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nThreads: 3\n";
        assert_eq!(kib_field(status, "VmRSS"), Some(1024 * 1024));
        assert_eq!(kib_field(status, "VmHWM"), Some(2048 * 1024));
        assert_eq!(kib_field(status, "Threads"), Some(3));
        assert_eq!(kib_field(status, "VmSwap"), None);
        assert_eq!(kib_field("VmRSSX: 5 kB", "VmRSS"), None);
    }

    #[test]
    fn snapshot_of_given_monitors() {
        let monitors: Vec<Arc<dyn DeviceMonitor>> = vec![Arc::new(FakeGpu), Arc::new(Opaque)];
        let u = utilization_of(&monitors);
        assert_eq!(u.devices.len(), 2);
        assert_eq!(u.devices[0].memory_percent(), Some(25.0));
        assert_eq!(u.devices[1].memory_percent(), None);
        let text = u.to_string();
        assert!(text.contains("| cuda:7 "), "{text}");
        assert!(text.contains("87.5%"));
        assert!(text.contains("25.0%"));
        assert!(text.contains("unknown"));
        assert!(text.contains("host: process resident"));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn host_memory_is_known_on_linux() {
        let h = host_memory();
        assert!(h.process_resident.unwrap_or(0) > 0);
        assert!(h.total.unwrap_or(0) >= h.process_resident.unwrap_or(0));
    }

    #[test]
    fn registry_replaces_and_removes() {
        // A device id no other test uses, so this test owns its registry entry.
        struct Probe(u64);
        impl DeviceMonitor for Probe {
            fn device(&self) -> DeviceId {
                DeviceId::new("probe", 9)
            }
            fn memory_used(&self) -> Option<u64> {
                Some(self.0)
            }
            fn memory_total(&self) -> Option<u64> {
                Some(100)
            }
        }
        register_device_monitor(Arc::new(Probe(10)));
        register_device_monitor(Arc::new(Probe(20)));
        let probes: Vec<_> =
            utilization().devices.into_iter().filter(|d| d.device == DeviceId::new("probe", 9)).collect();
        assert_eq!(probes.len(), 1);
        assert_eq!(probes[0].memory_used, Some(20));
        assert!(unregister_device_monitor(DeviceId::new("probe", 9)));
        assert!(!unregister_device_monitor(DeviceId::new("probe", 9)));
    }
}
