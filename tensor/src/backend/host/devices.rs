//! The registry of logical host devices and their caching allocators, and
//! the pool of page-locked host memory they share.
//!
//! The number of devices is fixed at first use: from
//! [`set_host_device_count`], else `BRASA_HOST_DEVICES`, else 1. Each device's
//! allocator is created on first use with its byte limit: from
//! [`set_host_memory_limit`], else `BRASA_HOST_MEMORY_LIMIT` (e.g. `512MiB`,
//! `2GiB`, or plain bytes), else none. Allocator policy comes from
//! `BRASA_ALLOC_CONF`.

use crate::device::Device;
use crate::error::{Result, TensorError};
use brasa_alloc::{AllocatorConfig, CachingAllocator, HostBackend};
use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

/// Environment variable with the number of logical host devices.
pub const HOST_DEVICES_ENV: &str = "BRASA_HOST_DEVICES";
/// Environment variable with a byte limit for every logical host device.
pub const HOST_MEMORY_LIMIT_ENV: &str = "BRASA_HOST_MEMORY_LIMIT";
/// The most logical host devices a process may have: one per rank of an
/// in-process group, far more than any machine has cores. A larger count
/// is an error rather than a table too large to allocate.
pub const MAX_HOST_DEVICES: usize = 1 << 16;

struct HostDevices {
    allocators: Vec<OnceLock<CachingAllocator<HostBackend>>>,
}

#[derive(Default)]
struct HostConfig {
    count: Option<usize>,
    limits: BTreeMap<usize, Option<usize>>,
    allocator_configs: BTreeMap<usize, Option<AllocatorConfig>>,
}

static HOST_DEVICES: OnceLock<HostDevices> = OnceLock::new();
static HOST_CONFIG: Mutex<HostConfig> =
    Mutex::new(HostConfig { count: None, limits: BTreeMap::new(), allocator_configs: BTreeMap::new() });

fn config() -> std::sync::MutexGuard<'static, HostConfig> {
    HOST_CONFIG.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sets the number of logical host devices. Must come before the first host
/// tensor is created (later it is an error unless the count is unchanged).
pub fn set_host_device_count(count: usize) -> Result<()> {
    if count == 0 {
        return Err(TensorError::Device("set_host_device_count: at least one host device is needed".into()));
    }
    if count > MAX_HOST_DEVICES {
        return Err(TensorError::Device(format!(
            "set_host_device_count({count}): a process has at most {MAX_HOST_DEVICES} logical host devices"
        )));
    }
    if let Some(devices) = HOST_DEVICES.get() {
        if devices.allocators.len() != count {
            return Err(TensorError::Device(format!(
                "set_host_device_count({count}): host devices were already initialized with {} device(s); \
                 set the count before the first host tensor is created",
                devices.allocators.len()
            )));
        }
        return Ok(());
    }
    config().count = Some(count);
    Ok(())
}

/// Sets (or with `None` removes) the byte limit of logical host device `index`.
/// Must come before that device's first allocation.
pub fn set_host_memory_limit(index: usize, limit: Option<usize>) -> Result<()> {
    if let Some(devices) = HOST_DEVICES.get() {
        if devices.allocators.get(index).is_some_and(|a| a.get().is_some()) {
            return Err(TensorError::Device(format!(
                "set_host_memory_limit: cpu:{index} has already allocated memory; set its limit before first use"
            )));
        }
    }
    config().limits.insert(index, limit);
    Ok(())
}

/// Sets (or with `None` removes) the caching-allocator configuration of
/// logical host device `index`, in place of `BRASA_ALLOC_CONF`'s. Must come
/// before that device's first allocation.
pub fn set_host_allocator_config(index: usize, allocator_config: Option<AllocatorConfig>) -> Result<()> {
    if let Some(devices) = HOST_DEVICES.get() {
        if devices.allocators.get(index).is_some_and(|a| a.get().is_some()) {
            return Err(TensorError::Device(format!(
                "set_host_allocator_config: cpu:{index} already has its allocator; configure it before first use"
            )));
        }
    }
    config().allocator_configs.insert(index, allocator_config);
    Ok(())
}

/// The number of logical host devices the process will have, without
/// fixing it: the count in use once a host tensor exists, else the one set
/// by [`set_host_device_count`], else a valid `BRASA_HOST_DEVICES`, else
/// `None` (one device unless something sets it first). For code that must
/// raise the count but never lower what the program asked for.
pub fn planned_host_device_count() -> Option<usize> {
    if let Some(devices) = HOST_DEVICES.get() {
        return Some(devices.allocators.len());
    }
    config().count.or_else(|| {
        std::env::var(HOST_DEVICES_ENV)
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .filter(|n| (1..=MAX_HOST_DEVICES).contains(n))
    })
}

/// The number of logical host devices (initializing the registry if needed).
pub fn host_device_count() -> Result<usize> {
    Ok(host_devices()?.allocators.len())
}

fn host_devices() -> Result<&'static HostDevices> {
    if let Some(devices) = HOST_DEVICES.get() {
        return Ok(devices);
    }
    let count = match config().count {
        Some(count) => count,
        None => match std::env::var(HOST_DEVICES_ENV) {
            Ok(text) => text.trim().parse().ok().filter(|n| (1..=MAX_HOST_DEVICES).contains(n)).ok_or_else(|| {
                TensorError::Device(format!(
                    "{HOST_DEVICES_ENV}={text:?}: expected a positive whole number, at most {MAX_HOST_DEVICES}"
                ))
            })?,
            Err(_) => 1,
        },
    };
    Ok(HOST_DEVICES.get_or_init(|| HostDevices { allocators: (0..count).map(|_| OnceLock::new()).collect() }))
}

static PINNED: OnceLock<CachingAllocator<HostBackend>> = OnceLock::new();

/// The caching allocator of page-locked host memory, shared by all host
/// devices (PyTorch's `CachingHostAllocator`).
///
/// Which kind of page-locking is decided at its first use, for the life of
/// the process: registered with the CUDA driver when brasa-tensor is built
/// with `cuda` and a CUDA device is present (copies from it to a device can
/// then be asynchronous, `Tensor::to_non_blocking`); otherwise `mlock`ed host
/// memory — still never paged out, but a device copy from it is synchronous.
/// (PyTorch raises when there is no CUDA; brasa keeps the host fallback so
/// that code pinning its batches, such as a `DataLoader` with `pin_memory`,
/// runs unchanged on a machine without a GPU.)
pub(crate) fn pinned_allocator() -> Result<&'static CachingAllocator<HostBackend>> {
    if let Some(allocator) = PINNED.get() {
        return Ok(allocator);
    }
    let config = AllocatorConfig::from_env().map_err(brasa_alloc::AllocError::from)?;
    let backend = match device_pinning() {
        Some(pinning) => HostBackend::pinned_by("cpu:pinned", None, pinning),
        None => HostBackend::pinned("cpu:pinned", None),
    };
    Ok(PINNED.get_or_init(|| observed(backend, config, Device::CPU)))
}

/// The device driver that pins host memory for its devices, when there is one.
fn device_pinning() -> Option<std::sync::Arc<dyn brasa_alloc::HostPinning>> {
    #[cfg(feature = "cuda")]
    if let Ok(pinning) = crate::backend::cuda::pinned::CudaPinning::new() {
        return Some(std::sync::Arc::new(pinning));
    }
    None
}

/// The caching allocator of logical host device `index`.
pub(crate) fn host_allocator(index: usize) -> Result<&'static CachingAllocator<HostBackend>> {
    let devices = host_devices()?;
    let slot = devices.allocators.get(index).ok_or_else(|| {
        TensorError::Device(format!(
            "cpu:{index} does not exist: {} host device(s) are configured (set {HOST_DEVICES_ENV} or call \
             set_host_device_count before the first tensor is created)",
            devices.allocators.len()
        ))
    })?;
    if let Some(allocator) = slot.get() {
        return Ok(allocator);
    }
    let limit = match config().limits.get(&index) {
        Some(limit) => *limit,
        None => match std::env::var(HOST_MEMORY_LIMIT_ENV) {
            Ok(text) => Some(parse_byte_size(&text).ok_or_else(|| {
                TensorError::Device(format!(
                    "{HOST_MEMORY_LIMIT_ENV}={text:?}: expected a size such as 536870912, 512MiB or 2GiB"
                ))
            })?),
            Err(_) => None,
        },
    };
    let alloc_config = match config().allocator_configs.get(&index).cloned().flatten() {
        Some(chosen) => chosen,
        None => AllocatorConfig::from_env().map_err(brasa_alloc::AllocError::from)?,
    };
    let mut created = false;
    let allocator = slot.get_or_init(|| {
        created = true;
        observed(HostBackend::named(format!("cpu:{index}"), limit), alloc_config, Device::Cpu(index))
    });
    if created {
        crate::profiling::register_host_monitor(index);
    }
    Ok(allocator)
}

/// A caching allocator whose events reach the profiler while one records.
fn observed(backend: HostBackend, config: AllocatorConfig, device: Device) -> CachingAllocator<HostBackend> {
    let allocator = CachingAllocator::with_config(backend, config);
    allocator.set_observer(Some(crate::profiling::allocator_observer(device)));
    allocator
}

/// Parses `1024`, `64KiB`, `512MiB`, `2GiB` (also `K`/`KB`, `M`/`MB`, `G`/`GB`, all binary).
pub fn parse_byte_size(text: &str) -> Option<usize> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let bytes = number * scale;
    (bytes.is_finite() && bytes >= 0.0).then_some(bytes as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse() {
        assert_eq!(parse_byte_size("1024"), Some(1024));
        assert_eq!(parse_byte_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_byte_size("2GiB"), Some(2 << 30));
        assert_eq!(parse_byte_size("1.5 G"), Some(3 << 29));
        assert_eq!(parse_byte_size("lots"), None);
        assert_eq!(parse_byte_size("12 parsecs"), None);
    }
}
