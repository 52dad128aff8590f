//! Comparisons giving bool tensors — `eq`, `ne`, `lt`, `le`, `gt`, `ge`
//! between two tensors (broadcast and promoted like arithmetic) or against a
//! scalar (`*_scalar`) — and `where_cond`, which picks elements from two
//! tensors by a bool condition.
//!
//! Floats compare by IEEE rules: NaN is unequal to everything, itself
//! included, and `-0.0 == 0.0`.

use crate::backend::{ops_for, CompareOp};
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::ops::common::same_device;
use crate::ops::elementwise::{broadcast_all, prepare, result_dtype};
use crate::tensor::Tensor;

/// The op's name for messages and profiler ranges.
fn op_name(op: CompareOp, scalar: bool) -> &'static str {
    match (op, scalar) {
        (op, false) => op.kernel_name(),
        (CompareOp::Eq, true) => "eq_scalar",
        (CompareOp::Ne, true) => "ne_scalar",
        (CompareOp::Lt, true) => "lt_scalar",
        (CompareOp::Le, true) => "le_scalar",
        (CompareOp::Gt, true) => "gt_scalar",
        (CompareOp::Ge, true) => "ge_scalar",
    }
}

fn compare(op: CompareOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let name = op_name(op, false);
    let device = same_device(name, &[a, b])?;
    let dtype = result_dtype(a, b);
    if a.shape() == b.shape() && a.dtype() == dtype && b.dtype() == dtype {
        return ops_for(device)?.compare(name, op, a, b);
    }
    let shape = broadcast_all(name, &[a.shape(), b.shape()])?;
    ops_for(device)?.compare(name, op, &prepare(name, a, dtype, &shape)?, &prepare(name, b, dtype, &shape)?)
}

/// `x op value` for every element. Float tensors compare with the scalar
/// rounded to their dtype (as PyTorch does); integer and bool tensors compare
/// exactly: as i64 for an integral scalar, else as f64.
fn compare_scalar(op: CompareOp, x: &Tensor, value: f64) -> Result<Tensor> {
    ops_for(x.device())?.compare_scalar(op_name(op, true), op, x, value)
}

impl Tensor {
    /// `self == rhs` elementwise (broadcast, compared in the promoted dtype).
    pub fn eq(&self, rhs: &Tensor) -> Result<Tensor> {
        compare(CompareOp::Eq, self, rhs)
    }

    /// `self != rhs` elementwise.
    pub fn ne(&self, rhs: &Tensor) -> Result<Tensor> {
        compare(CompareOp::Ne, self, rhs)
    }

    /// `self < rhs` elementwise.
    pub fn lt(&self, rhs: &Tensor) -> Result<Tensor> {
        compare(CompareOp::Lt, self, rhs)
    }

    /// `self <= rhs` elementwise.
    pub fn le(&self, rhs: &Tensor) -> Result<Tensor> {
        compare(CompareOp::Le, self, rhs)
    }

    /// `self > rhs` elementwise.
    ///
    /// ```
    /// use brasa_tensor::{Device, Tensor};
    /// let x = Tensor::from_vec_on(vec![1.0f32, 5.0, 3.0], [3], Device::CPU)?;
    /// let y = Tensor::from_vec_on(vec![2.0f32, 2.0, 3.0], [3], Device::CPU)?;
    /// assert_eq!(x.gt(&y)?.to_vec::<bool>()?, [false, true, false]);
    /// assert_eq!(x.ge_scalar(3.0)?.to_vec::<bool>()?, [false, true, true]);
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn gt(&self, rhs: &Tensor) -> Result<Tensor> {
        compare(CompareOp::Gt, self, rhs)
    }

    /// `self >= rhs` elementwise.
    pub fn ge(&self, rhs: &Tensor) -> Result<Tensor> {
        compare(CompareOp::Ge, self, rhs)
    }

    /// `self == value` elementwise.
    pub fn eq_scalar(&self, value: f64) -> Result<Tensor> {
        compare_scalar(CompareOp::Eq, self, value)
    }

    /// `self != value` elementwise.
    pub fn ne_scalar(&self, value: f64) -> Result<Tensor> {
        compare_scalar(CompareOp::Ne, self, value)
    }

    /// `self < value` elementwise.
    pub fn lt_scalar(&self, value: f64) -> Result<Tensor> {
        compare_scalar(CompareOp::Lt, self, value)
    }

    /// `self <= value` elementwise.
    pub fn le_scalar(&self, value: f64) -> Result<Tensor> {
        compare_scalar(CompareOp::Le, self, value)
    }

    /// `self > value` elementwise.
    pub fn gt_scalar(&self, value: f64) -> Result<Tensor> {
        compare_scalar(CompareOp::Gt, self, value)
    }

    /// `self >= value` elementwise.
    pub fn ge_scalar(&self, value: f64) -> Result<Tensor> {
        compare_scalar(CompareOp::Ge, self, value)
    }

    /// `on_true` where this bool tensor is true, else `on_false`
    /// (`torch.where`). All three broadcast together; the values are
    /// promoted like arithmetic operands.
    ///
    /// ```
    /// use brasa_tensor::{Device, Tensor};
    /// let x = Tensor::from_vec_on(vec![-1.0f32, 2.0, -3.0], [3], Device::CPU)?;
    /// let zero = Tensor::zeros_on([], x.dtype(), Device::CPU)?;
    /// let relu = x.gt_scalar(0.0)?.where_cond(&x, &zero)?;
    /// assert_eq!(relu.to_vec::<f32>()?, [0.0, 2.0, 0.0]);
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn where_cond(&self, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        let name = "where_cond";
        if self.dtype() != DType::Bool {
            return Err(TensorError::invalid(
                name,
                format!(
                    "the condition must be a bool tensor, got {}; compare it (e.g. ne_scalar(0.0)) first",
                    self.dtype()
                ),
            ));
        }
        same_device(name, &[self, on_true, on_false])?;
        let dtype = result_dtype(on_true, on_false);
        let shape = broadcast_all(name, &[self.shape(), on_true.shape(), on_false.shape()])?;
        let cond = prepare(name, self, DType::Bool, &shape)?;
        let (t, f) = (prepare(name, on_true, dtype, &shape)?, prepare(name, on_false, dtype, &shape)?);
        ops_for(self.device())?.where_cond(&cond, &t, &f)
    }
}

#[cfg(test)]
mod tests {
    use crate::{Device, Tensor, TensorError};

    #[test]
    fn comparisons_broadcast_promote_and_respect_nan() {
        let x = Tensor::from_vec_on(vec![1.0f32, f32::NAN, 3.0], [3, 1], Device::CPU).unwrap();
        let y = Tensor::from_vec_on(vec![1i64, 3], [2], Device::CPU).unwrap();
        assert_eq!(x.eq(&y).unwrap().to_vec::<bool>().unwrap(), [true, false, false, false, false, true]);
        assert_eq!(x.ne(&x).unwrap().to_vec::<bool>().unwrap(), [false, true, false]);
        assert_eq!(x.le(&y).unwrap().to_vec::<bool>().unwrap(), [true, true, false, false, false, true]);
        let big = Tensor::from_vec_on(vec![(1i64 << 53) + 1], [1], Device::CPU).unwrap();
        assert_eq!(big.gt_scalar(9007199254740992.0).unwrap().to_vec::<bool>().unwrap(), [true], "exact for i64");
        let u = Tensor::from_vec_on(vec![0u8, 1, 2], [3], Device::CPU).unwrap();
        assert_eq!(u.lt_scalar(1.5).unwrap().to_vec::<bool>().unwrap(), [true, true, false]);
        assert_eq!(u.ge_scalar(-1.0).unwrap().to_vec::<bool>().unwrap(), [true, true, true]);
    }

    #[test]
    fn where_cond_needs_a_bool_condition() {
        let x = Tensor::from_vec_on(vec![1.0f32, 2.0], [2], Device::CPU).unwrap();
        let err = x.where_cond(&x, &x).unwrap_err();
        assert!(matches!(err, TensorError::Invalid { op: "where_cond", .. }), "{err:?}");
        // The variant holds no dtype: the message says which operand and what it is.
        let err = err.to_string();
        assert!(err.starts_with("where_cond: the condition must be a bool tensor, got f32"), "{err}");
        let c = Tensor::from_vec_on(vec![true, false], [2, 1], Device::CPU).unwrap();
        let other = Tensor::from_vec_on(vec![7i64], [], Device::CPU).unwrap();
        let out = c.where_cond(&x, &other).unwrap();
        assert_eq!(out.dims(), [2, 2]);
        assert_eq!(out.to_vec::<f32>().unwrap(), [1.0, 2.0, 7.0, 7.0]);
    }
}
