//! The host's in-place updates (`add_`, `addcmul_`, `sqrt_`, ...): the
//! fused slice loops of `brasa_kernels::elementwise` over `dst`'s view,
//! split over rayon's threads when `dst` is contiguous and large, and
//! allocating nothing (an optimizer step in steady state allocates nothing).

use super::integer::IntElement;
use super::strided::{update_in_place, Cost};
use crate::backend::Update;
use crate::dispatch::{dispatch_float, dispatch_int};
use crate::dtype::WithDType;
use crate::error::{Result, TensorError};
use crate::scalar::integer_scalar;
use crate::tensor::Tensor;
use brasa_kernels::elementwise::{
    addcdiv, addcmul, axpy, binary_update, binary_update_self, unary_update, update0, update1, BinaryOp, Float,
    FloatElement, UnaryOp,
};

/// See [`crate::backend::DeviceOps::update`].
pub(super) fn update(name: &'static str, op: Update, dst: &Tensor, operands: &[&Tensor]) -> Result<()> {
    let operand =
        |k: usize| operands.get(k).copied().ok_or_else(|| TensorError::internal(name, "an operand is missing"));
    let not_float = || TensorError::not_float(name, dst.dtype());
    match op {
        Update::Unary(op) => {
            let cost = if op.is_expensive() { Cost::Expensive } else { Cost::Cheap };
            dispatch_float!(dst.dtype(), T => update_in_place::<T, 0>(name, dst, [], cost, |d, []| unary_update(op, d)),
                dispatch_int!(dst.dtype(), T => int_unary::<T>(name, op, dst),
                    Err(TensorError::invalid(name, "is not defined for bool tensors"))))
        }
        Update::Log1p => float_f64(name, dst, f64::ln_1p),
        Update::LogSigmoid => float_f64(name, dst, log_sigmoid),
        Update::Binary(op) => {
            let x = operand(0)?;
            let itself = x.shares_storage_with(dst) && x.layout() == dst.layout();
            dispatch_float!(dst.dtype(), T => {
                if itself {
                    update_in_place::<T, 0>(name, dst, [], Cost::Cheap, |d, []| binary_update_self(op, d))
                } else {
                    update_in_place::<T, 1>(name, dst, [x], Cost::Cheap, |d, [x]| binary_update(op, d, x))
                }
            }, dispatch_int!(dst.dtype(), T => {
                let f: fn(T, T) -> T = match op {
                    BinaryOp::Add => T::wrapping_add,
                    BinaryOp::Sub => T::wrapping_sub,
                    BinaryOp::Mul => T::wrapping_mul,
                    BinaryOp::Maximum => Ord::max,
                    BinaryOp::Minimum => Ord::min,
                    _ => return Err(TensorError::internal(name, "unsupported integer in-place op")),
                };
                apply_with(name, dst, x, itself, f)
            }, {
                let f: fn(bool, bool) -> bool = match op {
                    BinaryOp::Add | BinaryOp::Maximum => |p, q| p | q,
                    BinaryOp::Mul | BinaryOp::Minimum => |p, q| p & q,
                    _ => return Err(TensorError::internal(name, "unsupported bool in-place op")),
                };
                apply_with(name, dst, x, itself, f)
            }))
        }
        Update::AddScaled(alpha) => {
            let x = operand(0)?;
            dispatch_float!(dst.dtype(), T => update_in_place::<T, 1>(name, dst, [x], Cost::Cheap, |d, [x]| axpy(alpha, x, d)),
                dispatch_int!(dst.dtype(), T => {
                    let a = T::from_i64(integer_scalar(name, alpha)?);
                    update_in_place::<T, 1>(name, dst, [x], Cost::Cheap, |d, [x]| {
                        update1(d, x, |v, w: T| v.wrapping_add(w.wrapping_mul(a)))
                    })
                }, Err(TensorError::invalid(name, "is not supported for bool tensors"))))
        }
        Update::Lerp(weight) => {
            let end = operand(0)?;
            dispatch_float!(dst.dtype(), T => {
                let w = <<T as FloatElement>::Compute as Float>::from_f64(weight);
                update_in_place::<T, 1>(name, dst, [end], Cost::Cheap, |d, [e]| {
                    update1(d, e, |v: T, e: T| T::store(v.load() + w * (e.load() - v.load())))
                })
            }, Err(not_float()))
        }
        Update::Addcmul(value) => {
            let (a, b) = (operand(0)?, operand(1)?);
            dispatch_float!(dst.dtype(), T => update_in_place::<T, 2>(name, dst, [a, b], Cost::Cheap,
                |d, [x, y]| addcmul(value, x, y, d)), Err(not_float()))
        }
        Update::Addcdiv(value) => {
            let (a, b) = (operand(0)?, operand(1)?);
            dispatch_float!(dst.dtype(), T => update_in_place::<T, 2>(name, dst, [a, b], Cost::Cheap,
                |d, [x, y]| addcdiv(value, x, y, d)), Err(not_float()))
        }
    }
}

/// The integer forms of the in-place unary ops (wrapping, like PyTorch).
fn int_unary<T: IntElement>(name: &'static str, op: UnaryOp, dst: &Tensor) -> Result<()> {
    let apply = |f: &(dyn Fn(T) -> T + Sync)| {
        update_in_place::<T, 0>(name, dst, [], Cost::Cheap, |d, []| update0(d, |v: T| f(v)))
    };
    match op {
        UnaryOp::Neg => apply(&|v: T| T::ZERO.wrapping_sub(v)),
        UnaryOp::Abs => apply(&|v: T| IntElement::wrapping_abs(v)),
        UnaryOp::Relu => apply(&|v: T| v.max(T::ZERO)),
        UnaryOp::Clamp { min, max } => {
            // `as` saturates f64 → integer, and ±inf lands on the extremes.
            let (lo, hi) = (T::from_f64(min), T::from_f64(max));
            apply(&move |v: T| v.max(lo).min(hi))
        }
        UnaryOp::Affine { mul, add } => {
            let (m, a) = (T::from_i64(integer_scalar(name, mul)?), T::from_i64(integer_scalar(name, add)?));
            apply(&move |v: T| v.wrapping_mul(m).wrapping_add(a))
        }
        other => Err(TensorError::internal(name, format!("{} has no integer kernel", other.name()))),
    }
}

/// `dst = f(dst, rhs)`, or `dst = f(dst, dst)` when `rhs` is `dst` itself.
fn apply_with<T: WithDType>(
    name: &'static str,
    dst: &Tensor,
    rhs: &Tensor,
    itself: bool,
    f: fn(T, T) -> T,
) -> Result<()> {
    if itself {
        update_in_place::<T, 0>(name, dst, [], Cost::Cheap, |d, []| update0(d, |v| f(v, v)))
    } else {
        update_in_place::<T, 1>(name, dst, [rhs], Cost::Cheap, |d, [x]| update1(d, x, f))
    }
}

/// `dst = f(dst)` computed in f64 per element (functions the kernels do not
/// have, such as `log1p`), for a float tensor.
fn float_f64(name: &'static str, dst: &Tensor, f: fn(f64) -> f64) -> Result<()> {
    dispatch_float!(dst.dtype(), T => update_in_place::<T, 0>(name, dst, [], Cost::Expensive, |d, []| {
        update0(d, |v: T| T::store(<<T as FloatElement>::Compute as Float>::from_f64(f(Float::to_f64(v.load())))))
    }), Err(TensorError::not_float(name, dst.dtype())))
}

/// `log(sigmoid(x))` without overflow: `min(x, 0) - log1p(exp(-|x|))`.
fn log_sigmoid(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    x.min(0.0) - (-x.abs()).exp().ln_1p()
}
