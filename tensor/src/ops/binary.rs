//! Two-operand arithmetic with NumPy broadcasting and PyTorch's type
//! promotion: `add`, `sub`, `mul`, `div`, `pow`, `maximum`, `minimum`, and
//! the operators `+ - * /` (and unary `-`) on tensors and on a tensor and an
//! `f64`, each giving `Result<Tensor>`.
//!
//! The operands are broadcast to a common shape and computed in the promoted
//! dtype (see [`DType::promote`]; a zero-dimensional tensor does not widen a
//! dimensioned one of its category, as in PyTorch). Only an operand whose
//! dtype differs is converted; broadcasting never copies. Integers wrap;
//! `div` is true division (integers and bool give f32); bool `add`/`mul` are
//! logical or/and; bool `sub` and `pow` are errors. The fused activation
//! backwards (`relu_backward`, `gelu_backward`, `gelu_tanh_backward`) follow
//! the same rules; the GELU ones need floating-point operands.

use crate::backend::ops_for;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::ops::common::same_device;
use crate::ops::elementwise::{broadcast_all, prepare, result_dtype, scalar_like};
use crate::ops::memory_format::keeping_channels_last;
use crate::tensor::Tensor;
use brasa_kernels::elementwise::BinaryOp;

/// The dtype `op` computes in for these operands, or an error.
fn compute_dtype(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<DType> {
    let dtype = result_dtype(a, b);
    match (op, dtype) {
        (BinaryOp::Div, d) if !d.is_float() => Ok(DType::F32),
        (BinaryOp::Sub, DType::Bool) => Err(TensorError::invalid(
            "sub",
            "subtracting bool tensors is not supported; use logical_xor-style ops or convert the dtype",
        )),
        (BinaryOp::Pow, DType::Bool) => {
            Err(TensorError::invalid("pow", "is not supported for bool tensors; convert the dtype first"))
        }
        (BinaryOp::GeluBackward | BinaryOp::GeluTanhBackward, d) if !d.is_float() => {
            Err(TensorError::not_float(op.name(), d))
        }
        (_, d) => Ok(d),
    }
}

/// `op(a, b)` elementwise with broadcasting and promotion.
pub(crate) fn binary_op(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let name = op.name();
    same_device(name, &[a, b])?;
    let dtype = compute_dtype(op, a, b)?;
    // The common case needs neither conversion nor broadcasting: skip the copies of shapes and layouts.
    if a.shape() == b.shape() && a.dtype() == dtype && b.dtype() == dtype {
        return run_binary(op, a, b);
    }
    let shape = broadcast_all(name, &[a.shape(), b.shape()])?;
    let (a, b) = (prepare(name, a, dtype, &shape)?, prepare(name, b, dtype, &shape)?);
    run_binary(op, &a, &b)
}

/// `op(a, b)` on operands already of `dtype` and of one shape, by their device.
fn run_binary(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    keeping_channels_last(&[a, b], |v| ops_for(v[0].device())?.binary(op, v[0], v[1]))
}

impl Tensor {
    /// `self + rhs`, broadcasting and promoting (`i64 + f32 → f32`).
    ///
    /// ```
    /// use brasa_tensor::{Device, Tensor};
    /// let x = Tensor::from_vec_on(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2], Device::CPU)?;
    /// let bias = Tensor::from_vec_on(vec![10i64, 20], [2], Device::CPU)?;
    /// let y = (&x + &bias)?;                       // [2, 2] + [2] → [2, 2], f32
    /// assert_eq!(y.to_vec::<f32>()?, [11.0, 22.0, 13.0, 24.0]);
    /// assert_eq!((&y * 2.0)?.to_vec::<f32>()?, [22.0, 44.0, 26.0, 48.0]);
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn add(&self, rhs: &Tensor) -> Result<Tensor> {
        binary_op(BinaryOp::Add, self, rhs)
    }

    /// `self - rhs`, broadcasting and promoting; an error for two bool tensors.
    pub fn sub(&self, rhs: &Tensor) -> Result<Tensor> {
        binary_op(BinaryOp::Sub, self, rhs)
    }

    /// `self * rhs`, broadcasting and promoting.
    pub fn mul(&self, rhs: &Tensor) -> Result<Tensor> {
        binary_op(BinaryOp::Mul, self, rhs)
    }

    /// `self / rhs` (true division: integer and bool operands give f32).
    pub fn div(&self, rhs: &Tensor) -> Result<Tensor> {
        binary_op(BinaryOp::Div, self, rhs)
    }

    /// `self ^ rhs` elementwise; integers wrap, and a negative integer
    /// exponent gives the truncated quotient (0 unless the base is ±1).
    pub fn pow(&self, rhs: &Tensor) -> Result<Tensor> {
        binary_op(BinaryOp::Pow, self, rhs)
    }

    /// ReLU's backward in one pass: `self` (the gradient) where `output > 0`,
    /// else 0 (PyTorch's `threshold_backward(grad, output, 0)`).
    pub fn relu_backward(&self, output: &Tensor) -> Result<Tensor> {
        binary_op(BinaryOp::ReluBackward, self, output)
    }

    /// Exact GELU's backward in one pass: `self · (Φ(x) + x φ(x))` with
    /// `self` the gradient of [`Tensor::gelu`]'s output and `input` its input
    /// (PyTorch's `gelu_backward(grad, x)`). Float tensors only; NaN where
    /// the input is ±inf, as PyTorch gives.
    ///
    /// ```
    /// use brasa_tensor::{Device, Tensor};
    /// let x = Tensor::from_vec_on(vec![0.0f32, 20.0, -20.0], [3], Device::CPU)?;
    /// let grad = Tensor::ones_on([3], x.dtype(), Device::CPU)?;
    /// assert_eq!(grad.gelu_backward(&x)?.to_vec::<f32>()?, [0.5, 1.0, 0.0]);
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn gelu_backward(&self, input: &Tensor) -> Result<Tensor> {
        binary_op(BinaryOp::GeluBackward, self, input)
    }

    /// The backward of [`Tensor::gelu_tanh`] in one pass, from the gradient
    /// `self` and the op's `input` (PyTorch's
    /// `gelu_backward(grad, x, approximate='tanh')`). Float tensors only.
    pub fn gelu_tanh_backward(&self, input: &Tensor) -> Result<Tensor> {
        binary_op(BinaryOp::GeluTanhBackward, self, input)
    }

    /// The larger of each pair; NaN if either is NaN.
    pub fn maximum(&self, rhs: &Tensor) -> Result<Tensor> {
        binary_op(BinaryOp::Maximum, self, rhs)
    }

    /// The smaller of each pair; NaN if either is NaN.
    pub fn minimum(&self, rhs: &Tensor) -> Result<Tensor> {
        binary_op(BinaryOp::Minimum, self, rhs)
    }
}

// ----- operators ------------------------------------------------------------------

macro_rules! tensor_operator {
    ($trait:ident, $method:ident, $op:expr) => {
        impl std::ops::$trait<&Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                binary_op($op, self, rhs)
            }
        }
        impl std::ops::$trait<Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                binary_op($op, self, &rhs)
            }
        }
        impl std::ops::$trait<&Tensor> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                binary_op($op, &self, rhs)
            }
        }
        impl std::ops::$trait<Tensor> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                binary_op($op, &self, &rhs)
            }
        }
    };
}

tensor_operator!(Add, add, BinaryOp::Add);
tensor_operator!(Sub, sub, BinaryOp::Sub);
tensor_operator!(Mul, mul, BinaryOp::Mul);
tensor_operator!(Div, div, BinaryOp::Div);

/// `tensor op scalar` and `scalar op tensor` with an `f64`, by the scalar
/// dtype rule of [`Tensor::add_scalar`].
macro_rules! scalar_operator {
    ($trait:ident, $method:ident, |$t:ident, $s:ident| $tensor_first:expr, $scalar_first:expr) => {
        impl std::ops::$trait<f64> for &Tensor {
            type Output = Result<Tensor>;
            fn $method(self, $s: f64) -> Result<Tensor> {
                let $t = self;
                $tensor_first
            }
        }
        impl std::ops::$trait<f64> for Tensor {
            type Output = Result<Tensor>;
            fn $method(self, $s: f64) -> Result<Tensor> {
                let $t = &self;
                $tensor_first
            }
        }
        impl std::ops::$trait<&Tensor> for f64 {
            type Output = Result<Tensor>;
            fn $method(self, rhs: &Tensor) -> Result<Tensor> {
                let ($t, $s) = (rhs, self);
                $scalar_first
            }
        }
        impl std::ops::$trait<Tensor> for f64 {
            type Output = Result<Tensor>;
            fn $method(self, rhs: Tensor) -> Result<Tensor> {
                let ($t, $s) = (&rhs, self);
                $scalar_first
            }
        }
    };
}

scalar_operator!(Add, add, |t, s| t.add_scalar(s), t.add_scalar(s));
scalar_operator!(Sub, sub, |t, s| t.sub_scalar(s), t.affine(-1.0, s));
scalar_operator!(Mul, mul, |t, s| t.mul_scalar(s), t.mul_scalar(s));
scalar_operator!(Div, div, |t, s| t.div_scalar(s), {
    let dtype = if t.dtype().is_float() { t.dtype() } else { DType::F32 };
    scalar_like(s, dtype, t)?.div(t)
});

impl std::ops::Neg for &Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(self)
    }
}

impl std::ops::Neg for Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(&self)
    }
}

#[cfg(test)]
mod tests {
    use crate::{DType, Device, LayoutError, Shape, Tensor, TensorError};

    #[test]
    fn broadcasting_promotion_and_operators() {
        let a = Tensor::from_vec_on(vec![1.0f32, 2.0, 3.0], [3, 1], Device::CPU).unwrap();
        let b = Tensor::from_vec_on(vec![10i64, 20], [2], Device::CPU).unwrap();
        let c = (&a + &b).unwrap();
        assert_eq!((c.dims(), c.dtype()), ([3, 2].as_slice(), DType::F32));
        assert_eq!(c.to_vec::<f32>().unwrap(), [11.0, 21.0, 12.0, 22.0, 13.0, 23.0]);
        assert_eq!((&b / &b).unwrap().to_vec::<f32>().unwrap(), [1.0, 1.0]);
        assert_eq!((10.0 - &b).unwrap().to_vec::<i64>().unwrap(), [0, -10]);
        assert_eq!((1.0 / &b).unwrap().to_vec::<f32>().unwrap(), [0.1, 0.05]);
        assert_eq!((-(&b * 3.0).unwrap()).unwrap().to_vec::<i64>().unwrap(), [-30, -60]);
        assert_eq!(
            b.pow(&b.narrow(0, 0, 1).unwrap()).unwrap().to_vec::<i64>().unwrap(),
            [10i64.pow(10), 20i64.pow(10)]
        );
        let err = (&a + &Tensor::zeros_on([2, 2], DType::F32, Device::CPU).unwrap()).unwrap_err();
        let expected = LayoutError::IncompatibleShapes {
            a: Shape::new([3, 1]),
            b: Shape::new([2, 2]),
            dim: -2,
            size_a: 3,
            size_b: 2,
        };
        assert!(matches!(&err, TensorError::OpLayout { op: "add", source } if **source == expected), "{err:?}");
    }

    #[test]
    fn bool_arithmetic_is_logical() {
        let p = Tensor::from_vec_on(vec![true, true, false, false], [4], Device::CPU).unwrap();
        let q = Tensor::from_vec_on(vec![true, false, true, false], [4], Device::CPU).unwrap();
        assert_eq!((&p + &q).unwrap().to_vec::<bool>().unwrap(), [true, true, true, false]);
        assert_eq!((&p * &q).unwrap().to_vec::<bool>().unwrap(), [true, false, false, false]);
        let err = (&p - &q).unwrap_err();
        assert!(matches!(err, TensorError::Invalid { op: "sub", .. }), "{err:?}");
    }
}
