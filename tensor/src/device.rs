//! Devices: the host, logical host devices, and CUDA devices; the default device.
//!
//! `Device::cpu(n)` are *logical* host devices: each has its own caching
//! allocator and optional byte limit, so multi-device code and out-of-memory
//! handling can be developed and tested on any machine (JAX's forced host
//! device count is the precedent). Their number comes from
//! `BRASA_HOST_DEVICES` or [`crate::set_host_device_count`], fixed at first use.

use std::fmt;
use std::sync::Mutex;

/// Where a tensor's memory lives and its ops run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Device {
    /// Host memory; `Cpu(0)` is the host itself, `Cpu(n)` a logical host device.
    Cpu(usize),
    /// A CUDA device (feature `cuda`).
    Cuda(usize),
    /// A meta device ([`crate::MetaDevice`]): tensors with shapes, dtypes and
    /// storage accounted by the caching allocator of the device it imitates,
    /// and no values. Ops allocate what they would there and compute nothing.
    Meta(usize),
}

impl Device {
    /// The host (`cpu:0`).
    pub const CPU: Device = Device::Cpu(0);

    /// Logical host device `index` (`cpu:0` is the host itself).
    pub const fn cpu(index: usize) -> Device {
        Device::Cpu(index)
    }

    /// CUDA device `index`.
    pub const fn cuda(index: usize) -> Device {
        Device::Cuda(index)
    }

    /// Whether this is host memory.
    pub const fn is_cpu(&self) -> bool {
        matches!(self, Device::Cpu(_))
    }

    /// Whether this is a meta device (shapes and accounted memory, no values).
    pub const fn is_meta(&self) -> bool {
        matches!(self, Device::Meta(_))
    }

    /// The device's ordinal.
    pub const fn index(&self) -> usize {
        match self {
            Device::Cpu(i) | Device::Cuda(i) | Device::Meta(i) => *i,
        }
    }

    /// The device `text` names (`cpu`, `cpu:3`, `cuda`, `cuda:1`, `meta:2`),
    /// or what is wrong with it: `str::parse` (`FromStr`, in error.rs) wraps
    /// the message in a [`TensorError::Device`](crate::TensorError::Device).
    pub(crate) fn parse_name(text: &str) -> std::result::Result<Device, String> {
        let (kind, index) = match text.split_once(':') {
            Some((kind, index)) => {
                let index = index.parse().map_err(|_| format!("bad device `{text}`: the index must be a number"))?;
                (kind, index)
            }
            None => (text, 0),
        };
        match kind {
            "cpu" => Ok(Device::Cpu(index)),
            "cuda" => Ok(Device::Cuda(index)),
            "meta" => Ok(Device::Meta(index)),
            _ => Err(format!("bad device `{text}`: expected cpu, cpu:N, cuda, cuda:N or meta:N")),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu(i) => write!(f, "cpu:{i}"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
            Device::Meta(i) => write!(f, "meta:{i}"),
        }
    }
}

/// How many CUDA devices this process can use (`torch.cuda.device_count()`):
/// 0 without the `cuda` feature, without a driver, or without a GPU. Never
/// panics (the driver library is probed before it is called).
///
/// ```
/// let n = brasa_tensor::cuda_device_count();
/// if n == 0 {
///     println!("no GPU: CUDA tests skip");
/// }
/// ```
pub fn cuda_device_count() -> usize {
    #[cfg(feature = "cuda")]
    {
        // SAFETY: only probes whether the driver library can be loaded.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return 0;
        }
        cudarc::driver::CudaContext::device_count().map_or(0, |n| n.max(0) as usize)
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

static DEFAULT_DEVICE: Mutex<Device> = Mutex::new(Device::CPU);

/// The device constructors use when none is named.
pub fn default_device() -> Device {
    *DEFAULT_DEVICE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sets the device constructors use when none is named (process-wide).
pub fn set_default_device(device: Device) {
    *DEFAULT_DEVICE.lock().unwrap_or_else(|e| e.into_inner()) = device;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_print_and_parse() {
        assert_eq!(Device::cpu(3).to_string(), "cpu:3");
        assert_eq!("cuda:1".parse::<Device>().unwrap(), Device::cuda(1));
        assert_eq!("cpu".parse::<Device>().unwrap(), Device::CPU);
        let bad = |text: &str| match text.parse::<Device>() {
            Err(crate::TensorError::Device(message)) => message,
            other => panic!("{text}: {other:?}"),
        };
        assert!(bad("tpu:0").contains("expected cpu, cpu:N"));
        assert!(bad("cpu:x").contains("the index must be a number"));
    }

    #[test]
    fn the_host_multiplies_half_operands_into_f32() {
        assert!(Device::CPU.multiplies_half_into_f32() && Device::cpu(2).multiplies_half_into_f32());
        // CUDA's products widen both operands first (and without the
        // feature, or a GPU, there is no CUDA backend at all).
        assert!(!Device::cuda(0).multiplies_half_into_f32());
    }
}
