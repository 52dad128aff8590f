//! In-place writes: `fill_`, `zero_`, `copy_`. Each bumps the storage's
//! version, which autograd uses to catch a tensor changed after it was saved.

use crate::backend::ops_for;
use crate::dispatch::dispatch_dtype;
use crate::dtype::WithDType;
use crate::error::{Result, TensorError};
use crate::scalar::checked_scalar;
use crate::tensor::Tensor;

impl Tensor {
    /// Sets every element (of this view) to `value`. A value the dtype
    /// cannot hold is an error and nothing is written (see
    /// [`Tensor::full_on`] for the rule, PyTorch's). An expanded view is
    /// allowed, as in PyTorch: its shared elements all get the one value,
    /// each written once.
    pub fn fill_(&self, value: f64) -> Result<()> {
        // The value as the dtype stores it (`-1` into u8 is 255), as f64.
        let value = dispatch_dtype!(self.dtype(), T => checked_scalar::<T>("fill_", value)?.to_f64());
        ops_for(self.device())?.fill("fill_", self, value)?;
        self.storage().bump_version();
        Ok(())
    }

    /// Sets every element (of this view) to zero.
    pub fn zero_(&self) -> Result<()> {
        self.fill_(0.0)
    }

    /// Copies `src` into this tensor, broadcasting it to this shape and
    /// converting its dtype; across devices too. This tensor must not be a
    /// view whose elements share memory (an expanded one): that is an error
    /// naming its shape and strides, as in PyTorch.
    pub fn copy_(&self, src: &Tensor) -> Result<()> {
        self.check_writable("copy_")?;
        let src = src.broadcast_as(self.shape().clone()).map_err(|_| {
            TensorError::shape(
                "copy_",
                format!("source of shape {:?} cannot be broadcast to destination shape {:?}", src.dims(), self.dims()),
            )
        })?;
        // A source on another device, of another dtype, or overlapping this
        // storage is first made into a contiguous host copy of our dtype.
        let src = if src.device() != self.device() || src.dtype() != self.dtype() || src.shares_storage_with(self) {
            src.copy_to(self.device(), self.dtype())?
        } else {
            src
        };
        // The storages differ (a sharing source was copied above).
        ops_for(self.device())?.copy_into("copy_", self, &src)?;
        self.storage().bump_version();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::{DType, Device, Tensor, TensorError};

    #[test]
    fn fill_writes_through_views() {
        let t = Tensor::zeros_on([2, 3], DType::F32, Device::CPU).unwrap();
        t.narrow(1, 1, 2).unwrap().fill_(5.0).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), [0.0, 5.0, 5.0, 0.0, 5.0, 5.0]);
        assert_eq!(t.version(), 1);
    }

    #[test]
    fn copy_broadcasts_converts_and_handles_overlap() {
        let t = Tensor::zeros_on([2, 3], DType::F64, Device::CPU).unwrap();
        t.copy_(&Tensor::from_vec_on(vec![1i64, 2, 3], [3], Device::CPU).unwrap()).unwrap();
        assert_eq!(t.to_vec::<f64>().unwrap(), [1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
        // Copy a tensor's transpose into itself: overlapping storage is handled.
        let m = Tensor::from_vec_on(vec![1f32, 2.0, 3.0, 4.0], [2, 2], Device::CPU).unwrap();
        m.copy_(&m.t().unwrap()).unwrap();
        assert_eq!(m.to_vec::<f32>().unwrap(), [1.0, 3.0, 2.0, 4.0]);
        let bad = Tensor::zeros_on([4], DType::F32, Device::CPU).unwrap();
        let err = m.copy_(&bad).unwrap_err();
        assert!(matches!(err, TensorError::Shape { op: "copy_", .. }), "{err:?}");
    }
}
