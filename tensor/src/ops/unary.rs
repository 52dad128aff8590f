//! One-operand elementwise ops: `neg`, `abs`, `exp`, `log`, `sqrt`, `rsqrt`,
//! `sin`, `cos`, `tanh`, `sigmoid`, `relu`, `gelu`, `gelu_tanh`, `silu`,
//! `powf`, `clamp`, and arithmetic with a scalar (`affine`, `add_scalar`,
//! `mul_scalar`, ...). Each returns a new contiguous tensor.
//!
//! Dtypes follow PyTorch:
//! - f16 and bf16 are computed in f32 per element and rounded once.
//! - The "float" functions (`exp`, `log`, `sqrt`, `rsqrt`, `sin`, `cos`,
//!   `tanh`, `sigmoid`) promote integer and bool tensors to f32.
//! - The activations `gelu`, `gelu_tanh` and `silu` need a float tensor.
//! - `neg`, `abs`, `relu` and `clamp` keep integer dtypes (wrapping like
//!   PyTorch: `neg` of u8 is `256 - x`) and refuse bool.
//! - With a scalar operand, an integer tensor keeps its dtype when the scalar
//!   has no fractional part (it stands for a Python `int`) and becomes f32
//!   otherwise; bool becomes i64 or f32 likewise. An integral scalar beyond
//!   i64 is an error (PyTorch cannot take such an `int` either); one beyond
//!   u8 wraps into a u8 tensor's arithmetic, as PyTorch's does.
//! - `powf` of an integer or bool tensor with a negative integral exponent is
//!   an error, as in PyTorch.

use crate::backend::ops_for;
use crate::dtype::is_integral_value;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::ops::elementwise::scalar_result_dtype;
use crate::ops::memory_format::keeping_channels_last;
use crate::scalar::integer_scalar;
use crate::tensor::Tensor;
use brasa_kernels::elementwise::UnaryOp;

/// What an op does with a non-float tensor.
#[derive(Clone, Copy, PartialEq, Eq)]
enum IntegerInput {
    /// Compute in f32 (PyTorch's float functions).
    PromoteToF32,
    /// An error naming the dtype.
    Refuse,
}

/// Applies a float op, promoting or refusing non-float inputs.
fn float_op(x: &Tensor, op: UnaryOp, name: &'static str, integers: IntegerInput) -> Result<Tensor> {
    if x.dtype().is_float() {
        return keeping_channels_last(&[x], |v| ops_for(v[0].device())?.unary(name, op, v[0]));
    }
    match integers {
        IntegerInput::PromoteToF32 => float_op(&x.to_dtype(DType::F32)?, op, name, integers),
        IntegerInput::Refuse => Err(TensorError::UnsupportedDType {
            op: name,
            dtype: x.dtype(),
            needs: "a floating-point tensor",
            hint: "; convert it with to_dtype first",
        }),
    }
}

fn refuse_bool(x: &Tensor, name: &'static str) -> Result<()> {
    if x.dtype().is_bool() {
        return Err(TensorError::invalid(
            name,
            "is not defined for bool tensors; use logical ops or convert the dtype",
        ));
    }
    Ok(())
}

/// `op` on any non-bool tensor in its own dtype (the backends' integer
/// kernels wrap, like PyTorch's).
fn same_dtype_op(x: &Tensor, op: UnaryOp, name: &'static str) -> Result<Tensor> {
    refuse_bool(x, name)?;
    keeping_channels_last(&[x], |v| ops_for(v[0].device())?.unary(name, op, v[0]))
}

impl Tensor {
    /// `-x`. Wraps for integers; an error for bool.
    pub fn neg(&self) -> Result<Tensor> {
        same_dtype_op(self, UnaryOp::Neg, "neg")
    }

    /// `|x|`. Integers keep their dtype (`abs(i64::MIN)` wraps to itself); an error for bool.
    pub fn abs(&self) -> Result<Tensor> {
        same_dtype_op(self, UnaryOp::Abs, "abs")
    }

    /// `e^x` (integers and bool are computed in f32).
    pub fn exp(&self) -> Result<Tensor> {
        float_op(self, UnaryOp::Exp, "exp", IntegerInput::PromoteToF32)
    }

    /// Natural logarithm (integers and bool are computed in f32).
    pub fn log(&self) -> Result<Tensor> {
        float_op(self, UnaryOp::Log, "log", IntegerInput::PromoteToF32)
    }

    /// Square root (integers and bool are computed in f32).
    pub fn sqrt(&self) -> Result<Tensor> {
        float_op(self, UnaryOp::Sqrt, "sqrt", IntegerInput::PromoteToF32)
    }

    /// `1 / sqrt(x)` (integers and bool are computed in f32).
    pub fn rsqrt(&self) -> Result<Tensor> {
        float_op(self, UnaryOp::Rsqrt, "rsqrt", IntegerInput::PromoteToF32)
    }

    /// Sine (integers and bool are computed in f32).
    pub fn sin(&self) -> Result<Tensor> {
        float_op(self, UnaryOp::Sin, "sin", IntegerInput::PromoteToF32)
    }

    /// Cosine (integers and bool are computed in f32).
    pub fn cos(&self) -> Result<Tensor> {
        float_op(self, UnaryOp::Cos, "cos", IntegerInput::PromoteToF32)
    }

    /// Hyperbolic tangent (integers and bool are computed in f32).
    pub fn tanh(&self) -> Result<Tensor> {
        float_op(self, UnaryOp::Tanh, "tanh", IntegerInput::PromoteToF32)
    }

    /// `1 / (1 + e^-x)` (integers and bool are computed in f32).
    pub fn sigmoid(&self) -> Result<Tensor> {
        float_op(self, UnaryOp::Sigmoid, "sigmoid", IntegerInput::PromoteToF32)
    }

    /// `max(x, 0)`; NaN stays NaN. Integers keep their dtype; an error for bool.
    pub fn relu(&self) -> Result<Tensor> {
        same_dtype_op(self, UnaryOp::Relu, "relu")
    }

    /// GELU, `x Φ(x)` with the exact normal CDF (PyTorch's default
    /// `approximate='none'`), accurate to an ulp or two in f32 and f64, in the
    /// far negative tail too. Float tensors only.
    ///
    /// ```
    /// use brasa_tensor::{Device, Tensor};
    /// let x = Tensor::from_vec_on(vec![-1.0f32, 0.0, 1.0], [3], Device::CPU)?;
    /// let y = x.gelu()?.to_vec::<f32>()?;
    /// assert!((y[2] - 0.841_344_7).abs() < 1e-6 && y[1] == 0.0);
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn gelu(&self) -> Result<Tensor> {
        float_op(self, UnaryOp::Gelu, "gelu", IntegerInput::Refuse)
    }

    /// GELU's tanh approximation (PyTorch's `approximate='tanh'`). Float tensors only.
    pub fn gelu_tanh(&self) -> Result<Tensor> {
        float_op(self, UnaryOp::GeluTanh, "gelu_tanh", IntegerInput::Refuse)
    }

    /// `x * sigmoid(x)` (SiLU, swish). Float tensors only.
    pub fn silu(&self) -> Result<Tensor> {
        float_op(self, UnaryOp::Silu, "silu", IntegerInput::Refuse)
    }

    /// `x^exponent`. Integer tensors stay integers (wrapping) for a
    /// non-negative integral exponent and go to f32 for a fractional one;
    /// bool is treated as an integer tensor (result i64) likewise. A negative
    /// integral exponent of an integer or bool tensor is an error, as in
    /// PyTorch ("Integers to negative integer powers are not allowed"), and
    /// so is an integral one beyond i64.
    pub fn powf(&self, exponent: f64) -> Result<Tensor> {
        let dtype = scalar_result_dtype(self.dtype(), &[exponent]);
        if dtype.is_float() {
            return float_op(&self.to_dtype(dtype)?, UnaryOp::Powf(exponent), "powf", IntegerInput::Refuse);
        }
        let e = integer_scalar("powf", exponent)?;
        if e < 0 {
            return Err(TensorError::invalid(
                "powf",
                format!(
                    "Integers to negative integer powers are not allowed: a {} tensor to the power {exponent}; \
                     convert it to a float dtype first",
                    self.dtype()
                ),
            ));
        }
        same_dtype_op(&self.to_dtype(dtype)?, UnaryOp::Powf(e as f64), "powf")
    }

    /// `min(max(x, min), max)` with either bound optional (at least one is
    /// needed); NaN stays NaN; with `min > max` every element becomes `max`
    /// (as in PyTorch). Integer tensors with integral bounds keep their dtype,
    /// fractional bounds make the result f32; an error for bool. A bound
    /// beyond an integer dtype's range (`clamp(u8, min = -5)`) clamps
    /// nothing on its side: unlike a fill value it is not stored, so the
    /// result is exact and no error is needed.
    pub fn clamp(&self, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
        let (lo, hi) = clamp_bounds("clamp", self, min, max)?;
        let dtype = scalar_result_dtype(self.dtype(), &[lo, hi].map(|b| if b.is_infinite() { 0.0 } else { b }));
        same_dtype_op(&self.to_dtype(dtype)?, UnaryOp::Clamp { min: lo, max: hi }, "clamp")
    }

    /// `self * mul + add` in one pass (optimizers and autograd use it; see
    /// the module doc for the dtype of integer tensors).
    pub fn affine(&self, mul: f64, add: f64) -> Result<Tensor> {
        scalar_arith(self, "affine", mul, add)
    }

    /// `self + value`.
    pub fn add_scalar(&self, value: f64) -> Result<Tensor> {
        scalar_arith(self, "add_scalar", 1.0, value)
    }

    /// `self - value`.
    pub fn sub_scalar(&self, value: f64) -> Result<Tensor> {
        // For an integer result, negate in i64 (wrapping, so i64::MIN works).
        let add = if !self.dtype().is_float() && is_integral_value(value) {
            integer_scalar("sub_scalar", value)?.wrapping_neg() as f64
        } else {
            -value
        };
        scalar_arith(self, "sub_scalar", 1.0, add)
    }

    /// `self * value`.
    pub fn mul_scalar(&self, value: f64) -> Result<Tensor> {
        scalar_arith(self, "mul_scalar", value, 0.0)
    }

    /// `self / value` (true division: integers and bool give f32).
    pub fn div_scalar(&self, value: f64) -> Result<Tensor> {
        let dtype = if self.dtype().is_float() { self.dtype() } else { DType::F32 };
        let x = self.to_dtype(dtype)?;
        x.div(&crate::ops::elementwise::scalar_like(value, dtype, &x)?)
    }
}

/// The bounds of a clamp as f64, ±infinity where absent; errors for bool
/// tensors, for no bound at all, and for NaN bounds.
pub(crate) fn clamp_bounds(op: &'static str, x: &Tensor, min: Option<f64>, max: Option<f64>) -> Result<(f64, f64)> {
    refuse_bool(x, op)?;
    if min.is_none() && max.is_none() {
        return Err(TensorError::invalid(op, "at least one of min and max must be given"));
    }
    let (lo, hi) = (min.unwrap_or(f64::NEG_INFINITY), max.unwrap_or(f64::INFINITY));
    if lo.is_nan() || hi.is_nan() {
        return Err(TensorError::invalid(op, format!("bounds must not be NaN, got min {min:?} and max {max:?}")));
    }
    Ok((lo, hi))
}

/// `x * mul + add` with the scalar dtype rule.
fn scalar_arith(x: &Tensor, name: &'static str, mul: f64, add: f64) -> Result<Tensor> {
    let dtype = scalar_result_dtype(x.dtype(), &[mul, add]);
    let x = x.to_dtype(dtype)?;
    if dtype.is_float() {
        return float_op(&x, UnaryOp::Affine { mul, add }, name, IntegerInput::Refuse);
    }
    // Integral scalars within i64 (an error otherwise); the kernels wrap
    // them into u8 like PyTorch.
    let (mul, add) = (integer_scalar(name, mul)?, integer_scalar(name, add)?);
    same_dtype_op(&x, UnaryOp::Affine { mul: mul as f64, add: add as f64 }, name)
}

#[cfg(test)]
mod tests {
    use crate::{DType, Device, Tensor, TensorError};

    fn t(values: &[f32]) -> Tensor {
        Tensor::from_slice_on(values, [values.len()], Device::CPU).unwrap()
    }

    #[test]
    fn float_functions_and_activations() {
        let x = t(&[-2.0, -0.5, 0.0, 0.5, 2.0]);
        let relu = x.relu().unwrap().to_vec::<f32>().unwrap();
        assert_eq!(relu, [0.0, 0.0, 0.0, 0.5, 2.0]);
        let exp = x.exp().unwrap().to_vec::<f32>().unwrap();
        assert_eq!(exp[4], 2.0f32.exp());
        let sig = x.sigmoid().unwrap().to_vec::<f32>().unwrap();
        assert_eq!(sig[2], 0.5);
        let silu = x.silu().unwrap().to_vec::<f32>().unwrap();
        assert!((silu[4] - 2.0 / (1.0 + (-2.0f32).exp())).abs() < 1e-7);
        let clamped = x.clamp(Some(-1.0), None).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(clamped, [-1.0, -0.5, 0.0, 0.5, 2.0]);
        assert_eq!(x.affine(2.0, 1.0).unwrap().to_vec::<f32>().unwrap(), [-3.0, 0.0, 1.0, 2.0, 5.0]);
        assert_eq!(x.powf(2.0).unwrap().to_vec::<f32>().unwrap(), [4.0, 0.25, 0.0, 0.25, 4.0]);
    }

    #[test]
    fn integer_inputs_follow_pytorch() {
        let i = Tensor::from_vec_on(vec![-3i64, 0, 4], [3], Device::CPU).unwrap();
        assert_eq!(i.exp().unwrap().dtype(), DType::F32);
        assert_eq!(i.abs().unwrap().to_vec::<i64>().unwrap(), [3, 0, 4]);
        assert_eq!(i.relu().unwrap().to_vec::<i64>().unwrap(), [0, 0, 4]);
        assert_eq!(i.powf(2.0).unwrap().to_vec::<i64>().unwrap(), [9, 0, 16]);
        assert_eq!(i.powf(0.5).unwrap().dtype(), DType::F32);
        assert_eq!(i.mul_scalar(2.0).unwrap().to_vec::<i64>().unwrap(), [-6, 0, 8]);
        assert_eq!(i.add_scalar(0.5).unwrap().to_vec::<f32>().unwrap(), [-2.5, 0.5, 4.5]);
        assert_eq!(i.div_scalar(2.0).unwrap().to_vec::<f32>().unwrap(), [-1.5, 0.0, 2.0]);
        assert_eq!(i.clamp(Some(-1.0), Some(2.0)).unwrap().to_vec::<i64>().unwrap(), [-1, 0, 2]);
        let u = Tensor::from_vec_on(vec![1u8, 200], [2], Device::CPU).unwrap();
        assert_eq!(u.neg().unwrap().to_vec::<u8>().unwrap(), [255, 56]);
        let gelu = i.gelu().unwrap_err();
        assert!(matches!(gelu, TensorError::UnsupportedDType { op: "gelu", dtype: DType::I64, .. }), "{gelu:?}");
        // The message says how to fix it.
        assert_eq!(gelu.to_string(), "gelu: needs a floating-point tensor, got i64; convert it with to_dtype first");
        let b = Tensor::from_vec_on(vec![true, false], [2], Device::CPU).unwrap();
        let err = b.neg().unwrap_err();
        assert!(matches!(err, TensorError::Invalid { op: "neg", .. }), "{err:?}");
        assert_eq!(b.add_scalar(1.0).unwrap().to_vec::<i64>().unwrap(), [2, 1]);
        let err = i.clamp(None, None).unwrap_err();
        assert!(matches!(err, TensorError::Invalid { op: "clamp", .. }), "{err:?}");
    }
}
