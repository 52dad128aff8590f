//! `softmax` and `log_softmax` along one dim, numerically stable (the max of
//! each slice is subtracted before exponentiating, so 1000.0 is as safe as
//! 1.0). `f16`/`bf16` are computed in `f32` and rounded once.
//!
//! The input is made contiguous and seen as `[outer, n, inner]` with `n` the
//! softmax dim; the device normalises each slice
//! ([`crate::backend::DeviceOps::softmax`]).

use crate::backend::ops_for;
use crate::error::Result;
use crate::ops::common::expect_float;
use crate::shape::{resolve_dim, DimIndex};
use crate::tensor::Tensor;

fn softmax_impl(x: &Tensor, op: &'static str, dim: impl DimIndex, log: bool) -> Result<Tensor> {
    let _range = brasa_profile::record_op(op, &[x.dims()]);
    expect_float(op, x)?;
    let rank = x.rank();
    // A 0-d tensor is a single slice of one element (dim 0 or -1), as in PyTorch.
    let d = resolve_dim(dim, rank.max(1), op)?;
    let x = x.contiguous()?;
    let dims = x.dims();
    let n = dims.get(d).copied().unwrap_or(1);
    let inner: usize = dims.get(d + 1..).map_or(1, |rest| rest.iter().product());
    ops_for(x.device())?.softmax(op, &x, n, inner, log)
}

impl Tensor {
    /// `exp(x - max) / Σ exp(x - max)` along `dim` (negative counts from the
    /// end): every slice along `dim` sums to 1. Floating-point tensors only;
    /// `f16`/`bf16` are computed in `f32`. A NaN in a slice makes it all NaN.
    pub fn softmax(&self, dim: impl DimIndex) -> Result<Tensor> {
        softmax_impl(self, "softmax", dim, false)
    }

    /// `x - max - ln Σ exp(x - max)` along `dim`: the logarithm of
    /// [`Tensor::softmax`], computed without forming the softmax (accurate
    /// for very negative log-probabilities).
    pub fn log_softmax(&self, dim: impl DimIndex) -> Result<Tensor> {
        softmax_impl(self, "log_softmax", dim, true)
    }
}

#[cfg(test)]
mod tests {
    use crate::{DType, Device, Tensor, TensorError};

    #[test]
    fn rows_and_columns_sum_to_one() {
        let x = Tensor::from_vec_on(vec![1f32, 2.0, 3.0, 1000.0, 1000.0, 1000.0], [2, 3], Device::CPU).unwrap();
        let rows = x.softmax(-1).unwrap().to_vec::<f32>().unwrap();
        assert!((rows[3] - 1.0 / 3.0).abs() < 1e-6, "{rows:?}");
        assert!((rows[..3].iter().sum::<f32>() - 1.0).abs() < 1e-6);
        let columns = x.softmax(0).unwrap().to_vec::<f32>().unwrap();
        assert!((columns[0] + columns[3] - 1.0).abs() < 1e-6, "{columns:?}");
        assert_eq!(columns[0], 0.0);
        let log = x.log_softmax(1).unwrap().to_vec::<f32>().unwrap();
        assert!((log[3] + 3f32.ln()).abs() < 1e-5, "{log:?}");
        let half = x.to_dtype(DType::BF16).unwrap().softmax(1).unwrap();
        assert_eq!(half.dtype(), DType::BF16);
        let error = Tensor::zeros_on([2], DType::I64, Device::CPU).unwrap().softmax(0).unwrap_err();
        assert!(matches!(error, TensorError::UnsupportedDType { op: "softmax", dtype: DType::I64, .. }), "{error:?}");
        assert!(x.softmax(2).is_err());
        let scalar = Tensor::scalar_on(3.0f32, Device::CPU).unwrap();
        assert_eq!(scalar.softmax(0).unwrap().item::<f32>().unwrap(), 1.0);
    }
}
