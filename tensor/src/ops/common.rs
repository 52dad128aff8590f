//! Checks and helpers shared by the op families.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::tensor::Tensor;

/// Errors unless every tensor is on the first one's device.
pub(crate) fn same_device(op: &'static str, tensors: &[&Tensor]) -> Result<Device> {
    let device = tensors.first().map(|t| t.device()).unwrap_or(Device::CPU);
    for t in tensors.iter().skip(1) {
        if t.device() != device {
            return Err(TensorError::DeviceMismatch { op, lhs: device, rhs: t.device() });
        }
    }
    Ok(device)
}

/// Errors unless `tensor` has `dtype`.
/// `items` grouped by device, the devices in the order they first appear:
/// one backend call per device for multi-tensor ops.
pub(crate) fn by_device<T>(items: &[T], device: impl Fn(&T) -> Device) -> Vec<(Device, Vec<&T>)> {
    let mut groups: Vec<(Device, Vec<&T>)> = Vec::new();
    for item in items {
        let d = device(item);
        match groups.iter_mut().find(|(g, _)| *g == d) {
            Some((_, group)) => group.push(item),
            None => groups.push((d, vec![item])),
        }
    }
    groups
}

pub(crate) fn expect_dtype(op: &'static str, tensor: &Tensor, dtype: DType) -> Result<()> {
    if tensor.dtype() == dtype {
        Ok(())
    } else {
        Err(TensorError::DTypeMismatch { op, expected: dtype, got: tensor.dtype() })
    }
}

/// Errors unless `tensor` has a floating-point dtype.
pub(crate) fn expect_float(op: &'static str, tensor: &Tensor) -> Result<()> {
    if tensor.dtype().is_float() {
        Ok(())
    } else {
        Err(TensorError::not_float(op, tensor.dtype()))
    }
}

/// Errors unless `tensor` has `rank` dimensions.
pub(crate) fn expect_rank(op: &'static str, tensor: &Tensor, rank: usize) -> Result<()> {
    if tensor.rank() == rank {
        Ok(())
    } else {
        Err(TensorError::RankMismatch { op, expected: rank, got: tensor.dims().to_vec() })
    }
}

/// Test helper: `a` (any float dtype) equals the f64 `want` element by
/// element within `tol`, relative to `1 + |want|`.
#[cfg(test)]
pub(crate) fn close(a: &Tensor, want: &Tensor, tol: f64) {
    let (a, b) = (a.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(), want.to_vec::<f64>().unwrap());
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "element {i}: {x} vs {y}");
    }
}
