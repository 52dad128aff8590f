//! In-place one-operand ops for optimizers and losses: `neg_`, `abs_`,
//! `relu_`, `sqrt_`, `rsqrt_`, `exp_`, `log_`, `log1p_`, `sigmoid_`,
//! `tanh_`, `log_sigmoid_`, and the elementwise `maximum_` / `minimum_`
//! with a second tensor (AMSGrad's running maximum).
//!
//! Like the in-place arithmetic, each writes through this tensor's view (any
//! strides, except broadcast dims), bumps the storage's version, and
//! allocates nothing from the device: an optimizer step built from them
//! allocates nothing in steady state. The result must keep this tensor's
//! dtype, so the float functions (`sqrt_`, `exp_`, ...) need a float tensor;
//! `neg_`, `abs_`, `relu_`, `maximum_` and `minimum_` also take integer
//! tensors (wrapping as their out-of-place forms do). f16 and bf16 are
//! computed in f32 per element and rounded once.

use crate::backend::{run_update, Update};
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::ops::elementwise::prepare_in_place;
use crate::tensor::Tensor;
use brasa_kernels::elementwise::{BinaryOp, UnaryOp};

fn needs_float(op: &'static str, dtype: DType) -> TensorError {
    TensorError::UnsupportedDType {
        op,
        dtype,
        needs: "a floating-point tensor (an in-place result keeps the tensor's dtype)",
        hint: "",
    }
}

/// `self = op(self)` for a float tensor (`Update::Unary`, `Log1p`, `LogSigmoid`).
fn float_in_place(name: &'static str, dst: &Tensor, op: Update) -> Result<()> {
    if !dst.dtype().is_float() {
        return Err(needs_float(name, dst.dtype()));
    }
    run_update(name, op, dst, &[])
}

fn refuse_bool(name: &'static str, dst: &Tensor) -> Result<()> {
    if dst.dtype().is_bool() {
        return Err(TensorError::invalid(name, "is not defined for bool tensors"));
    }
    Ok(())
}

/// `self = op(self)` keeping any non-bool dtype (integers wrap).
fn same_dtype_in_place(name: &'static str, dst: &Tensor, op: UnaryOp) -> Result<()> {
    refuse_bool(name, dst)?;
    run_update(name, Update::Unary(op), dst, &[])
}

/// `self = max(self, other)` or `min(...)`, `other` broadcast to this shape.
fn extremum_in_place(name: &'static str, op: BinaryOp, dst: &Tensor, other: &Tensor) -> Result<()> {
    refuse_bool(name, dst)?;
    let other = prepare_in_place(name, dst, other)?;
    run_update(name, Update::Binary(op), dst, &[&other])
}

impl Tensor {
    /// `self = -self`. Integers wrap; an error for bool.
    pub fn neg_(&self) -> Result<()> {
        same_dtype_in_place("neg_", self, UnaryOp::Neg)
    }

    /// `self = |self|`. Integers keep their dtype; an error for bool.
    pub fn abs_(&self) -> Result<()> {
        same_dtype_in_place("abs_", self, UnaryOp::Abs)
    }

    /// `self = max(self, 0)`; NaN stays NaN. Integers keep their dtype; an error for bool.
    pub fn relu_(&self) -> Result<()> {
        same_dtype_in_place("relu_", self, UnaryOp::Relu)
    }

    /// `self = sqrt(self)` (Adam's denominator). Float tensors only.
    ///
    /// ```
    /// use brasa_tensor::{Device, Tensor};
    /// let v = Tensor::from_vec_on(vec![4.0f32, 9.0], [2], Device::CPU)?;
    /// v.sqrt_()?;
    /// assert_eq!(v.to_vec::<f32>()?, [2.0, 3.0]);
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn sqrt_(&self) -> Result<()> {
        float_in_place("sqrt_", self, Update::Unary(UnaryOp::Sqrt))
    }

    /// `self = 1 / sqrt(self)`. Float tensors only.
    pub fn rsqrt_(&self) -> Result<()> {
        float_in_place("rsqrt_", self, Update::Unary(UnaryOp::Rsqrt))
    }

    /// `self = e^self`. Float tensors only.
    pub fn exp_(&self) -> Result<()> {
        float_in_place("exp_", self, Update::Unary(UnaryOp::Exp))
    }

    /// `self = ln(self)`. Float tensors only.
    pub fn log_(&self) -> Result<()> {
        float_in_place("log_", self, Update::Unary(UnaryOp::Log))
    }

    /// `self = ln(1 + self)`, accurate for small values. Float tensors only.
    pub fn log1p_(&self) -> Result<()> {
        float_in_place("log1p_", self, Update::Log1p)
    }

    /// `self = 1 / (1 + e^-self)`. Float tensors only.
    pub fn sigmoid_(&self) -> Result<()> {
        float_in_place("sigmoid_", self, Update::Unary(UnaryOp::Sigmoid))
    }

    /// `self = tanh(self)`. Float tensors only.
    pub fn tanh_(&self) -> Result<()> {
        float_in_place("tanh_", self, Update::Unary(UnaryOp::Tanh))
    }

    /// `self = log(sigmoid(self))`, computed as `min(x, 0) - log1p(e^-|x|)`
    /// so that it neither overflows nor loses the small values (PyTorch's
    /// `logsigmoid`). Float tensors only.
    pub fn log_sigmoid_(&self) -> Result<()> {
        float_in_place("log_sigmoid_", self, Update::LogSigmoid)
    }

    /// `self = maximum(self, other)` elementwise, `other` broadcast to this
    /// shape and converted to this dtype; NaN if either is NaN (PyTorch's
    /// `maximum`). An error for bool.
    pub fn maximum_(&self, other: &Tensor) -> Result<()> {
        extremum_in_place("maximum_", BinaryOp::Maximum, self, other)
    }

    /// `self = minimum(self, other)` elementwise (see [`Tensor::maximum_`]).
    pub fn minimum_(&self, other: &Tensor) -> Result<()> {
        extremum_in_place("minimum_", BinaryOp::Minimum, self, other)
    }
}

#[cfg(test)]
mod tests {
    use crate::{DType, Device, Tensor, TensorError};

    fn t(values: &[f64]) -> Tensor {
        Tensor::from_slice_on(values, [values.len()], Device::CPU).unwrap()
    }

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-15 * y.abs().max(1.0))
    }

    #[test]
    fn float_functions_match_out_of_place() {
        let x = t(&[0.25, 1.0, 4.0, 9.0]);
        type Op = fn(&Tensor) -> crate::Result<()>;
        type OutOfPlace = fn(&Tensor) -> crate::Result<Tensor>;
        let pairs: [(Op, OutOfPlace); 8] = [
            (Tensor::sqrt_, Tensor::sqrt),
            (Tensor::rsqrt_, Tensor::rsqrt),
            (Tensor::exp_, Tensor::exp),
            (Tensor::log_, Tensor::log),
            (Tensor::sigmoid_, Tensor::sigmoid),
            (Tensor::tanh_, Tensor::tanh),
            (Tensor::neg_, Tensor::neg),
            (Tensor::abs_, Tensor::abs),
        ];
        for (in_place, out_of_place) in pairs {
            let y = x.affine(1.0, 0.0).unwrap();
            in_place(&y).unwrap();
            assert_eq!(y.version(), 1);
            assert_eq!(y.to_vec::<f64>().unwrap(), out_of_place(&x).unwrap().to_vec::<f64>().unwrap());
        }
    }

    #[test]
    fn log1p_and_log_sigmoid_are_accurate_and_stable() {
        let x = t(&[1e-20, -0.5, 3.0]);
        x.log1p_().unwrap();
        assert!(close(&x.to_vec::<f64>().unwrap(), &[1e-20, 0.5f64.ln(), 4.0f64.ln()]));
        let y = t(&[-1000.0, -1.0, 0.0, 2.0, 800.0, f64::NAN]);
        y.log_sigmoid_().unwrap();
        let got = y.to_vec::<f64>().unwrap();
        let reference = |x: f64| -(1.0 + (-x).exp()).ln();
        assert_eq!(got[0], -1000.0);
        assert!(close(&got[1..4], &[reference(-1.0), -(2.0f64.ln()), reference(2.0)]));
        assert!(got[4] <= 0.0 && got[4] > -1e-300);
        assert!(got[5].is_nan());
        let h = Tensor::from_vec_on(vec![half::f16::from_f32(0.0)], [1], Device::CPU).unwrap();
        h.log_sigmoid_().unwrap();
        assert!((h.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()[0] + std::f32::consts::LN_2).abs() < 1e-3);
    }

    #[test]
    fn writes_through_strided_views() {
        let m = Tensor::from_vec_on(vec![1.0f32, 4.0, 9.0, 16.0], [2, 2], Device::CPU).unwrap();
        m.t().unwrap().narrow(0, 1, 1).unwrap().sqrt_().unwrap();
        assert_eq!(m.to_vec::<f32>().unwrap(), [1.0, 2.0, 9.0, 4.0]);
        m.relu_().unwrap();
        let expanded = Tensor::zeros_on([3], DType::F32, Device::CPU).unwrap().expand([2, 3]).unwrap();
        let err = expanded.exp_().unwrap_err();
        assert!(matches!(err, TensorError::Invalid { op: "exp_", .. }), "{err:?}");
    }

    #[test]
    fn maximum_and_minimum_broadcast_and_propagate_nan() {
        let a = t(&[1.0, 5.0, f64::NAN, -2.0]);
        a.maximum_(&t(&[3.0, 3.0, 0.0, -3.0])).unwrap();
        let got = a.to_vec::<f64>().unwrap();
        assert_eq!(got[..2], [3.0, 5.0]);
        assert!(got[2].is_nan());
        assert_eq!(got[3], -2.0);
        let b = t(&[1.0, 5.0]);
        b.minimum_(&Tensor::from_vec_on(vec![2.0f64], [1], Device::CPU).unwrap()).unwrap();
        assert_eq!(b.to_vec::<f64>().unwrap(), [1.0, 2.0]);
        let i = Tensor::from_vec_on(vec![-3i64, 7], [2], Device::CPU).unwrap();
        i.maximum_(&Tensor::from_vec_on(vec![0i64, 9], [2], Device::CPU).unwrap()).unwrap();
        assert_eq!(i.to_vec::<i64>().unwrap(), [0, 9]);
        let err = i.maximum_(&t(&[0.5, 1.0])).unwrap_err();
        assert!(matches!(err, TensorError::Invalid { op: "maximum_", .. }), "{err:?}");
    }

    #[test]
    fn dtype_rules() {
        let i = Tensor::from_vec_on(vec![-3i64, 4], [2], Device::CPU).unwrap();
        let err = i.sqrt_().unwrap_err();
        assert!(matches!(err, TensorError::UnsupportedDType { op: "sqrt_", dtype: DType::I64, .. }), "{err:?}");
        // The message says why an integer tensor cannot take it in place.
        assert_eq!(
            err.to_string(),
            "sqrt_: needs a floating-point tensor (an in-place result keeps the tensor's dtype), got i64"
        );
        i.abs_().unwrap();
        assert_eq!(i.to_vec::<i64>().unwrap(), [3, 4]);
        i.neg_().unwrap();
        i.relu_().unwrap();
        assert_eq!(i.to_vec::<i64>().unwrap(), [0, 0]);
        let b = Tensor::from_vec_on(vec![true], [1], Device::CPU).unwrap();
        let err = b.neg_().unwrap_err();
        assert!(matches!(err, TensorError::Invalid { op: "neg_", .. }), "{err:?}");
        let u = Tensor::from_vec_on(vec![1u8, 200], [2], Device::CPU).unwrap();
        u.neg_().unwrap();
        assert_eq!(u.to_vec::<u8>().unwrap(), [255, 56]);
    }
}
