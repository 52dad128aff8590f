//! The host's runtime: memory from each logical host device's caching
//! allocator (`devices.rs`), values the process reads in place, copies
//! between host devices as one strided copy, page-locked memory for
//! `pin_memory`, and work that is done when its call returns (the
//! streams and events of [`DeviceRuntime`]'s defaults).

use super::copy::{cast, copy_strided};
use super::devices::host_allocator;
use crate::backend::target::{MemoryTarget, TargetKind};
use crate::backend::{runtime_for, AllocatorRef, Buffer, DeviceRuntime};
use crate::device::Device;
use crate::dispatch::dispatch_dtype;
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::Shape;
use crate::storage::UninitTensor;
use crate::tensor::Tensor;
use brasa_alloc::{Backend as _, MemoryCategory, StreamId};

/// The runtime of the host and the logical host devices.
pub(crate) struct HostRuntime;

impl DeviceRuntime for HostRuntime {
    #[inline]
    fn allocate(&self, device: Device, _dtype: DType, bytes: usize, category: MemoryCategory) -> Result<Buffer> {
        // Host work is synchronous: one pool, the default stream's.
        Ok(Buffer::Host(host_allocator(device.index())?.allocate_as(bytes, StreamId::DEFAULT, category)?))
    }

    fn allocator(&self, device: Device) -> Result<AllocatorRef> {
        Ok(AllocatorRef::Process(host_allocator(device.index())?))
    }

    fn memory_target(&self, device: Device) -> Result<MemoryTarget> {
        let allocator = host_allocator(device.index())?;
        Ok(MemoryTarget::of(
            device.to_string(),
            TargetKind::Host,
            allocator.backend().total_bytes(),
            allocator.backend().virtual_memory_granularity(),
            allocator.config(),
        ))
    }

    fn values_on_host(&self) -> bool {
        true
    }

    fn copy_to_host(&self, _op: &'static str, src: &Tensor, dtype: DType) -> Result<Tensor> {
        cast(src, src.device(), dtype)
    }

    fn copy_in(&self, src: &Tensor, device: Device, dtype: DType) -> Result<Tensor> {
        let source = runtime_for(src.device())?;
        if source.values_on_host() {
            // Between two host devices: one process memory, one strided copy.
            return cast(src, device, dtype);
        }
        source.copy_to_host("to", src, dtype)?.to(device)
    }

    fn tensor_from_host(
        &self,
        _op: &'static str,
        shape: Shape,
        dtype: DType,
        device: Device,
        write: &mut dyn FnMut(UninitTensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        write(UninitTensor::new(shape, dtype, device)?)
    }

    fn pin_memory(&self, src: &Tensor) -> Result<Tensor> {
        dispatch_dtype!(src.dtype(), T => {
            let pinned = UninitTensor::pinned(src.shape().clone(), src.dtype())?;
            let values = src.storage().read::<T>("pin_memory")?;
            // SAFETY: `copy_strided` writes every element of the output (one
            // per element of the source's layout, which has its shape), reading none.
            unsafe {
                pinned.init_with::<T>("pin_memory", |dst| {
                    copy_strided(&values, src.layout(), dst);
                    Ok(())
                })
            }
        })
    }
}
