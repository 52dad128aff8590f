//! The meta device's runtime: storages accounted by the real caching
//! allocator of the imitated target over a virtual backend, and no values:
//! reading is an error naming the op, copies onto a meta device account the
//! copy and read nothing, and work (which there is none of) is done at once.

use super::device::meta_state;
use super::{no_values, op_scope, MetaBuffer};
use crate::backend::target::MemoryTarget;
use crate::backend::{AllocatorRef, Buffer, DeviceRuntime};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::Shape;
use crate::storage::UninitTensor;
use crate::tensor::Tensor;
use brasa_alloc::MemoryCategory;

/// The runtime of meta devices.
pub(crate) struct MetaRuntime;

impl DeviceRuntime for MetaRuntime {
    fn allocate(&self, device: Device, dtype: DType, bytes: usize, category: MemoryCategory) -> Result<Buffer> {
        Ok(Buffer::Meta(MetaBuffer::allocate(device, dtype, bytes, category)?))
    }

    fn allocator(&self, device: Device) -> Result<AllocatorRef> {
        Ok(AllocatorRef::Shared(meta_state(device)?.allocator.clone()))
    }

    fn memory_target(&self, device: Device) -> Result<MemoryTarget> {
        Ok(meta_state(device)?.target.clone())
    }

    fn values_on_host(&self) -> bool {
        false
    }

    fn holds_values(&self) -> bool {
        false
    }

    fn copy_to_host(&self, op: &'static str, src: &Tensor, _dtype: DType) -> Result<Tensor> {
        Err(no_values(op, src.device()))
    }

    /// Onto a meta device: the copy is accounted there, nothing is read.
    fn copy_in(&self, src: &Tensor, device: Device, dtype: DType) -> Result<Tensor> {
        let _op = op_scope("copy");
        Tensor::uninit_like(src, dtype, device)?.planned("copy")
    }

    /// A meta tensor keeps no values: only the storage is accounted.
    fn tensor_from_host(
        &self,
        op: &'static str,
        shape: Shape,
        dtype: DType,
        device: Device,
        _write: &mut dyn FnMut(UninitTensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let _op = op_scope(op);
        UninitTensor::new(shape, dtype, device)?.planned(op)
    }
}
