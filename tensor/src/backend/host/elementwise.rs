//! The host's elementwise kernels: unary, binary, comparisons and
//! `where_cond`, on the strided drivers of [`super::strided`] (rows of
//! coalesced dims, rayon chunks for large outputs) with the slice loops of
//! `brasa_kernels::elementwise`.

use super::integer::IntElement;
use super::strided::{map_binary, map_ternary, map_unary, Cost};
use crate::backend::CompareOp;
use crate::dispatch::{dispatch_dtype, dispatch_float, dispatch_int};
use crate::dtype::WithDType;
use crate::error::{Result, TensorError};
use crate::scalar::integer_scalar;
use crate::tensor::Tensor;
use brasa_kernels::elementwise::{binary, map1, map2, map3, unary, BinaryOp, UnaryOp};

/// See [`crate::backend::DeviceOps::unary`].
pub(super) fn unary_op(name: &'static str, op: UnaryOp, x: &Tensor) -> Result<Tensor> {
    let cost = if op.is_expensive() { Cost::Expensive } else { Cost::Cheap };
    dispatch_float!(x.dtype(), T => map_unary::<T, T>(name, x, cost, |src, dst| unary(op, src, dst)),
        dispatch_int!(x.dtype(), T => int_unary::<T>(name, op, x),
            Err(TensorError::internal(name, "a bool tensor reached the unary kernels"))))
}

/// The integer forms of the unary ops (wrapping, like PyTorch).
fn int_unary<T: IntElement>(name: &'static str, op: UnaryOp, x: &Tensor) -> Result<Tensor> {
    match op {
        UnaryOp::Neg => int_map::<T>(x, name, |v| T::ZERO.wrapping_sub(v)),
        UnaryOp::Abs => int_map::<T>(x, name, |v| v.wrapping_abs()),
        UnaryOp::Relu => int_map::<T>(x, name, |v| v.max(T::ZERO)),
        UnaryOp::Clamp { min, max } => {
            // `as` saturates f64 → integer, and ±inf lands on the extremes.
            let (lo, hi) = (T::from_f64(min), T::from_f64(max));
            int_map::<T>(x, name, move |v| v.max(lo).min(hi))
        }
        UnaryOp::Powf(exponent) => {
            let e = integer_scalar(name, exponent)?;
            // In i64, wrapping, then narrowed: the same result modulo 2^8 for
            // u8, with exponents past 255 taken as they are.
            int_map::<T>(x, name, move |v| T::from_i64(v.to_i64().int_pow(e)))
        }
        UnaryOp::Affine { mul, add } => {
            // Integral scalars within i64 (checked by the op); `from_i64`
            // wraps into u8 like PyTorch.
            let (m, a) = (T::from_i64(integer_scalar(name, mul)?), T::from_i64(integer_scalar(name, add)?));
            int_map::<T>(x, name, move |v| v.wrapping_mul(m).wrapping_add(a))
        }
        other => Err(TensorError::internal(name, format!("{} has no integer kernel", other.name()))),
    }
}

/// Applies `f` to every element of an integer tensor, keeping its dtype.
fn int_map<T: IntElement>(x: &Tensor, name: &'static str, f: impl Fn(T) -> T + Sync) -> Result<Tensor> {
    map_unary::<T, T>(name, x, Cost::Cheap, |src, dst| map1(src, dst, &f))
}

/// See [`crate::backend::DeviceOps::binary`].
pub(super) fn binary_op(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let name = op.name();
    let cost = if op.is_expensive() { Cost::Expensive } else { Cost::Cheap };
    dispatch_float!(a.dtype(), T => map_binary::<T, T, T>(name, a, b, cost, |x, y, out| binary(op, x, y, out)),
        dispatch_int!(a.dtype(), T => int_binary::<T>(op, a, b),
            bool_binary(op, a, b)))
}

fn int_binary<T: IntElement>(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let name = op.name();
    let cost = Cost::Cheap;
    match op {
        BinaryOp::Add => map_binary::<T, T, T>(name, a, b, cost, |x, y, o| map2(x, y, o, T::wrapping_add)),
        BinaryOp::Sub => map_binary::<T, T, T>(name, a, b, cost, |x, y, o| map2(x, y, o, T::wrapping_sub)),
        BinaryOp::Mul => map_binary::<T, T, T>(name, a, b, cost, |x, y, o| map2(x, y, o, T::wrapping_mul)),
        BinaryOp::Pow => map_binary::<T, T, T>(name, a, b, cost, |x, y, o| map2(x, y, o, T::int_pow)),
        BinaryOp::Maximum => map_binary::<T, T, T>(name, a, b, cost, |x, y, o| map2(x, y, o, Ord::max)),
        BinaryOp::Minimum => map_binary::<T, T, T>(name, a, b, cost, |x, y, o| map2(x, y, o, Ord::min)),
        BinaryOp::ReluBackward => map_binary::<T, T, T>(name, a, b, cost, |x, y, o| {
            map2(x, y, o, |g, out| if out > T::default() { g } else { T::default() })
        }),
        BinaryOp::Div => Err(TensorError::internal(name, "integer true division reached the kernel")),
        BinaryOp::GeluBackward | BinaryOp::GeluTanhBackward => {
            Err(TensorError::internal(name, "an integer tensor reached a float-only kernel"))
        }
    }
}

fn bool_binary(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let name = op.name();
    let cost = Cost::Cheap;
    match op {
        BinaryOp::Add | BinaryOp::Maximum => {
            map_binary::<bool, bool, bool>(name, a, b, cost, |x, y, o| map2(x, y, o, |p, q| p | q))
        }
        BinaryOp::Mul | BinaryOp::Minimum => {
            map_binary::<bool, bool, bool>(name, a, b, cost, |x, y, o| map2(x, y, o, |p, q| p & q))
        }
        BinaryOp::Sub
        | BinaryOp::Div
        | BinaryOp::Pow
        | BinaryOp::ReluBackward
        | BinaryOp::GeluBackward
        | BinaryOp::GeluTanhBackward => {
            Err(TensorError::internal(name, "this bool op should have been refused or promoted"))
        }
    }
}

/// Binds `$f` to the comparison as a two-argument closure on `$T`.
macro_rules! with_compare {
    ($op:expr, $T:ty, $f:ident => $body:expr) => {
        match $op {
            CompareOp::Eq => {
                let $f = |a: $T, b: $T| a == b;
                $body
            }
            CompareOp::Ne => {
                let $f = |a: $T, b: $T| a != b;
                $body
            }
            CompareOp::Lt => {
                let $f = |a: $T, b: $T| a < b;
                $body
            }
            CompareOp::Le => {
                let $f = |a: $T, b: $T| a <= b;
                $body
            }
            CompareOp::Gt => {
                let $f = |a: $T, b: $T| a > b;
                $body
            }
            CompareOp::Ge => {
                let $f = |a: $T, b: $T| a >= b;
                $body
            }
        }
    };
}

/// See [`crate::backend::DeviceOps::compare`].
pub(super) fn compare_op(name: &'static str, op: CompareOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    dispatch_dtype!(a.dtype(), T => with_compare!(op, T, f =>
        map_binary::<T, T, bool>(name, a, b, Cost::Cheap, |x, y, out| map2(x, y, out, f))))
}

/// See [`crate::backend::DeviceOps::compare_scalar`].
pub(super) fn compare_scalar_op(name: &'static str, op: CompareOp, x: &Tensor, value: f64) -> Result<Tensor> {
    let integral = crate::dtype::is_integral_value(value) && value.abs() < 9.2e18;
    dispatch_dtype!(x.dtype(), T => {
        if T::DTYPE.is_float() {
            let s = T::from_f64(value);
            with_compare!(op, T, f => map_unary::<T, bool>(name, x, Cost::Cheap, |src, out| map1(src, out, |v| f(v, s))))
        } else if integral {
            let s = value as i64;
            with_compare!(op, i64, f =>
                map_unary::<T, bool>(name, x, Cost::Cheap, |src, out| map1(src, out, |v: T| f(v.to_i64(), s))))
        } else {
            with_compare!(op, f64, f =>
                map_unary::<T, bool>(name, x, Cost::Cheap, |src, out| map1(src, out, |v: T| f(v.to_f64(), value))))
        }
    })
}

/// See [`crate::backend::DeviceOps::where_cond`].
pub(super) fn where_op(cond: &Tensor, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
    let name = "where_cond";
    dispatch_dtype!(on_true.dtype(), T => map_ternary::<bool, T, T, T>(name, [cond, on_true, on_false], Cost::Cheap,
        |c, x, y, out| map3(c, x, y, out, |c, x, y| if c { x } else { y })))
}
