//! In-place arithmetic for optimizers and gradient accumulation: `add_`,
//! `sub_`, `mul_`, `div_`, the scalar forms, `add_scaled_` (axpy),
//! `addcmul_`, `addcdiv_`, `lerp_` and `clamp_`.
//!
//! Each writes through this tensor's view (any strides, except broadcast
//! dims, which would write one element twice), bumps the storage's version,
//! and allocates nothing from the device when the operands already have this
//! tensor's dtype and do not share its storage: a training step in steady
//! state allocates nothing new. An operand is broadcast to this tensor's
//! shape; one of another dtype is converted to this dtype first (a copy), as
//! is one that shares this tensor's storage (so `x.add_(&x.t()?)` reads the
//! old values). As in PyTorch, the result must keep this tensor's dtype
//! category: an integer tensor cannot take a float operand or a fractional
//! scalar, and `div_` needs a float tensor.

use crate::backend::{run_update, Update};
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::ops::elementwise::{check_can_cast, prepare_in_place, scalar_result_dtype};
use crate::ops::unary::clamp_bounds;
use crate::tensor::Tensor;
use brasa_kernels::elementwise::{BinaryOp, UnaryOp};

fn not_float(op: &'static str, dtype: DType) -> TensorError {
    TensorError::not_float(op, dtype)
}

/// Whether `rhs` is `dst` itself (same storage, layout and dtype): then each
/// element meets only itself and the op needs no copy of `rhs`.
fn is_same_view(dst: &Tensor, rhs: &Tensor) -> bool {
    rhs.shares_storage_with(dst) && rhs.layout() == dst.layout() && rhs.dtype() == dst.dtype()
}

/// `self = op(self, rhs)`.
fn binary_in_place(op: BinaryOp, name: &'static str, dst: &Tensor, rhs: &Tensor) -> Result<()> {
    let dtype = dst.dtype();
    match op {
        BinaryOp::Div if !dtype.is_float() => {
            return Err(TensorError::invalid(
                name,
                format!("true division gives a float result, which cannot be stored in place in a {dtype} tensor"),
            ))
        }
        BinaryOp::Sub if dtype.is_bool() => {
            return Err(TensorError::invalid(name, "subtracting bool tensors is not supported"))
        }
        _ => {}
    }
    let rhs = if is_same_view(dst, rhs) { rhs.clone() } else { prepare_in_place(name, dst, rhs)? };
    run_update(name, Update::Binary(op), dst, &[&rhs])
}

/// Errors unless scalars combined with a `dtype` tensor keep its category.
fn check_scalars(op: &'static str, dtype: DType, scalars: &[f64]) -> Result<()> {
    check_can_cast(op, scalar_result_dtype(dtype, scalars), dtype)
}

/// `self = self * mul + add`.
fn affine_in_place(name: &'static str, dst: &Tensor, mul: f64, add: f64) -> Result<()> {
    let dtype = dst.dtype();
    check_scalars(name, dtype, &[mul, add])?;
    if dtype.is_bool() {
        return Err(TensorError::invalid(name, format!("is not supported for {dtype} tensors")));
    }
    if !dtype.is_float() {
        // Integral scalars within i64 (an error otherwise).
        crate::scalar::integer_scalar(name, mul)?;
        crate::scalar::integer_scalar(name, add)?;
    }
    run_update(name, Update::Unary(UnaryOp::Affine { mul, add }), dst, &[])
}

/// Runs a float-only fused update on `dst` with `operands` prepared for it.
fn float_update(name: &'static str, dst: &Tensor, op: Update, operands: &[&Tensor]) -> Result<()> {
    if !dst.dtype().is_float() {
        return Err(not_float(name, dst.dtype()));
    }
    let prepared: Vec<Tensor> = operands.iter().map(|t| prepare_in_place(name, dst, t)).collect::<Result<_>>()?;
    let refs: Vec<&Tensor> = prepared.iter().collect();
    run_update(name, op, dst, &refs)
}

impl Tensor {
    /// `self += rhs` (rhs broadcast to this shape and converted to this dtype).
    ///
    /// ```
    /// use brasa_tensor::{Device, DType, Tensor};
    /// let grad = Tensor::zeros_on([2, 2], DType::F32, Device::CPU)?;
    /// let micro = Tensor::ones_on([2, 2], DType::F32, Device::CPU)?;
    /// grad.add_(&micro)?;                       // gradient accumulation, no allocation
    /// grad.add_scaled_(0.5, &micro)?;           // grad += 0.5 * micro
    /// assert_eq!(grad.to_vec::<f32>()?, [1.5; 4]);
    /// assert_eq!(grad.version(), 2);
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn add_(&self, rhs: &Tensor) -> Result<()> {
        binary_in_place(BinaryOp::Add, "add_", self, rhs)
    }

    /// `self -= rhs`.
    pub fn sub_(&self, rhs: &Tensor) -> Result<()> {
        binary_in_place(BinaryOp::Sub, "sub_", self, rhs)
    }

    /// `self *= rhs`.
    pub fn mul_(&self, rhs: &Tensor) -> Result<()> {
        binary_in_place(BinaryOp::Mul, "mul_", self, rhs)
    }

    /// `self /= rhs` (float tensors only: true division).
    pub fn div_(&self, rhs: &Tensor) -> Result<()> {
        binary_in_place(BinaryOp::Div, "div_", self, rhs)
    }

    /// `self += value`.
    pub fn add_scalar_(&self, value: f64) -> Result<()> {
        affine_in_place("add_scalar_", self, 1.0, value)
    }

    /// `self *= value`.
    pub fn mul_scalar_(&self, value: f64) -> Result<()> {
        affine_in_place("mul_scalar_", self, value, 0.0)
    }

    /// `self = self * mul + add` in one pass.
    pub fn affine_(&self, mul: f64, add: f64) -> Result<()> {
        affine_in_place("affine_", self, mul, add)
    }

    /// `self += alpha * x` (BLAS axpy; PyTorch's `add_(x, alpha=...)`). Integer
    /// tensors need an integral `alpha`.
    pub fn add_scaled_(&self, alpha: f64, x: &Tensor) -> Result<()> {
        let name = "add_scaled_";
        let dtype = self.dtype();
        check_scalars(name, dtype, &[alpha])?;
        if dtype.is_bool() {
            return Err(TensorError::invalid(name, "is not supported for bool tensors"));
        }
        if !dtype.is_float() {
            crate::scalar::integer_scalar(name, alpha)?;
        }
        let x = prepare_in_place(name, self, x)?;
        run_update(name, Update::AddScaled(alpha), self, &[&x])
    }

    /// `self += value * a * b` (Adam's second moment). Float tensors only.
    pub fn addcmul_(&self, value: f64, a: &Tensor, b: &Tensor) -> Result<()> {
        float_update("addcmul_", self, Update::Addcmul(value), &[a, b])
    }

    /// `self += value * a / b` (Adam's step). Float tensors only.
    pub fn addcdiv_(&self, value: f64, a: &Tensor, b: &Tensor) -> Result<()> {
        float_update("addcdiv_", self, Update::Addcdiv(value), &[a, b])
    }

    /// `self += weight * (end - self)` (an exponential moving average step).
    /// Float tensors only.
    pub fn lerp_(&self, end: &Tensor, weight: f64) -> Result<()> {
        float_update("lerp_", self, Update::Lerp(weight), &[end])
    }

    /// Clamps in place to `[min, max]` (either optional, at least one given;
    /// NaN stays NaN). Integer tensors need integral bounds.
    pub fn clamp_(&self, min: Option<f64>, max: Option<f64>) -> Result<()> {
        let name = "clamp_";
        let (lo, hi) = clamp_bounds(name, self, min, max)?;
        let dtype = self.dtype();
        check_scalars(name, dtype, &[lo, hi].map(|b| if b.is_infinite() { 0.0 } else { b }))?;
        run_update(name, Update::Unary(UnaryOp::Clamp { min: lo, max: hi }), self, &[])
    }
}

#[cfg(test)]
mod tests {
    use crate::{DType, Device, Tensor, TensorError};

    #[test]
    fn updates_write_through_views_and_bump_the_version() {
        let x = Tensor::zeros_on([2, 3], DType::F32, Device::CPU).unwrap();
        let column = x.narrow(1, 1, 1).unwrap();
        column.add_scalar_(2.0).unwrap();
        x.t().unwrap().add_(&Tensor::from_vec_on(vec![1.0f32, 2.0, 3.0], [3, 1], Device::CPU).unwrap()).unwrap();
        assert_eq!(x.to_vec::<f32>().unwrap(), [1.0, 4.0, 3.0, 1.0, 4.0, 3.0]);
        assert_eq!(x.version(), 2);
        let expanded = Tensor::zeros_on([3], DType::F32, Device::CPU).unwrap().expand([2, 3]).unwrap();
        let err = expanded.add_scalar_(1.0).unwrap_err();
        assert!(matches!(err, TensorError::Invalid { op: "add_scalar_", .. }), "{err:?}");
    }

    #[test]
    fn aliasing_operands_read_old_values() {
        let m = Tensor::from_vec_on(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2], Device::CPU).unwrap();
        m.add_(&m.t().unwrap()).unwrap();
        assert_eq!(m.to_vec::<f32>().unwrap(), [2.0, 5.0, 5.0, 8.0]);
        m.mul_(&m).unwrap();
        assert_eq!(m.to_vec::<f32>().unwrap(), [4.0, 25.0, 25.0, 64.0]);
    }

    #[test]
    fn category_rules() {
        let i = Tensor::from_vec_on(vec![1i64, 2], [2], Device::CPU).unwrap();
        i.add_scaled_(3.0, &i.clone()).unwrap();
        assert_eq!(i.to_vec::<i64>().unwrap(), [4, 8]);
        let f = Tensor::ones_on([2], DType::F32, Device::CPU).unwrap();
        let err = i.add_(&f).unwrap_err();
        assert!(matches!(err, TensorError::Invalid { op: "add_", .. }), "{err:?}");
        // The variant holds no dtypes: the message names both.
        assert_eq!(
            err.to_string(),
            "add_: the result has dtype f32, which cannot be stored in place in a tensor of dtype i64"
        );
        let err = i.add_scalar_(0.5).unwrap_err();
        assert!(matches!(err, TensorError::Invalid { op: "add_scalar_", .. }), "{err:?}");
        let err = i.div_(&i.clone()).unwrap_err();
        assert!(matches!(err, TensorError::Invalid { op: "div_", .. }), "{err:?}");
        let err = i.addcmul_(1.0, &i, &i).unwrap_err();
        assert!(matches!(err, TensorError::UnsupportedDType { op: "addcmul_", dtype: DType::I64, .. }), "{err:?}");
        let h = Tensor::ones_on([2], DType::F16, Device::CPU).unwrap();
        h.add_(&Tensor::from_vec_on(vec![0.5f64, 1.5], [2], Device::CPU).unwrap()).unwrap();
        assert_eq!(h.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(), [1.5, 2.5]);
    }
}
