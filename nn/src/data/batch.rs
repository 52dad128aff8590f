//! [`TensorBatch`]: batches made of tensors, which a
//! [`DataLoader`](super::DataLoader) can pin and move to a device.
//!
//! ```
//! use brasa_nn::data::TensorBatch;
//! use brasa_tensor::{DType, Device, Tensor};
//! let batch = (Tensor::zeros([2, 3], DType::F32)?, Tensor::zeros([2], DType::I64)?);
//! let (x, y) = batch.to_device(Device::CPU)?;
//! assert_eq!((x.dims(), y.dims()), (&[2, 3][..], &[2][..]));
//! # Ok::<(), brasa_nn::NnError>(())
//! ```

use crate::error::Result;
use brasa_tensor::{Device, Tensor};

/// A batch made of tensors, which the loader can pin and move to a device
/// (`(features, labels)`, a single tensor, tuples and vectors of them).
/// Implement it for your own batch type to get `pin_memory` and `device`.
pub trait TensorBatch: Sized {
    /// The batch with `f` applied to each of its tensors.
    fn map_tensors(self, f: &mut dyn FnMut(Tensor) -> Result<Tensor>) -> Result<Self>;

    /// The batch with its host tensors in page-locked memory.
    fn pinned(self) -> Result<Self> {
        self.map_tensors(&mut |t| if t.device().is_cpu() { Ok(t.pin_memory()?) } else { Ok(t) })
    }

    /// The batch on `device`, copied with `to_non_blocking` (tensors already
    /// there are kept as they are).
    fn to_device(self, device: Device) -> Result<Self> {
        self.map_tensors(&mut |t| Ok(t.to_non_blocking(device)?))
    }
}

impl TensorBatch for Tensor {
    fn map_tensors(self, f: &mut dyn FnMut(Tensor) -> Result<Tensor>) -> Result<Self> {
        f(self)
    }
}

impl<A: TensorBatch, B: TensorBatch> TensorBatch for (A, B) {
    fn map_tensors(self, f: &mut dyn FnMut(Tensor) -> Result<Tensor>) -> Result<Self> {
        Ok((self.0.map_tensors(f)?, self.1.map_tensors(f)?))
    }
}

impl<A: TensorBatch, B: TensorBatch, C: TensorBatch> TensorBatch for (A, B, C) {
    fn map_tensors(self, f: &mut dyn FnMut(Tensor) -> Result<Tensor>) -> Result<Self> {
        Ok((self.0.map_tensors(f)?, self.1.map_tensors(f)?, self.2.map_tensors(f)?))
    }
}

impl<T: TensorBatch> TensorBatch for Vec<T> {
    fn map_tensors(self, f: &mut dyn FnMut(Tensor) -> Result<Tensor>) -> Result<Self> {
        self.into_iter().map(|item| item.map_tensors(f)).collect()
    }
}
