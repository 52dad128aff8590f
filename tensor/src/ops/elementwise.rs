//! What the elementwise op families (unary, binary, compare, in-place
//! arithmetic) share above the seam: PyTorch's dtype rules for tensors and
//! scalars, and the broadcasting and conversion of operands. The strided
//! drivers that walk host tensors live with the host backend
//! (`crate::backend::host`).

use crate::dispatch::dispatch_dtype;
use crate::dtype::{is_integral_value, DType, WithDType};
use crate::error::{Result, TensorError};
use crate::shape::{broadcast_shapes, Shape};
use crate::tensor::Tensor;

// ----- dtype rules ------------------------------------------------------------

/// bool < integral < floating.
fn category(dtype: DType) -> u8 {
    if dtype.is_float() {
        2
    } else if dtype.is_integral() {
        1
    } else {
        0
    }
}

/// The dtype a binary op between `a` and `b` computes in: [`DType::promote`],
/// with PyTorch's rule for zero-dimensional tensors: a 0-d operand does not
/// widen a dimensioned one of the same or a higher category (`f16 tensor +
/// 0-d f32 tensor → f16`), and decides the dtype when its category is higher
/// (`i64 tensor + 0-d f64 tensor → f64`).
pub(crate) fn result_dtype(a: &Tensor, b: &Tensor) -> DType {
    match (a.rank() == 0, b.rank() == 0) {
        (true, false) => zero_dim_rule(b.dtype(), a.dtype()),
        (false, true) => zero_dim_rule(a.dtype(), b.dtype()),
        _ => DType::promote(a.dtype(), b.dtype()),
    }
}

fn zero_dim_rule(dimensioned: DType, zero_dim: DType) -> DType {
    if category(zero_dim) > category(dimensioned) {
        zero_dim
    } else {
        dimensioned
    }
}

/// The dtype an op between a tensor of `dtype` and Rust scalars computes in.
/// Rust has one scalar type here (f64), so its value stands in for Python's
/// int/float distinction: float tensors keep their dtype; integer and bool
/// tensors keep an integer dtype (bool becomes i64) when every scalar is
/// integral, and go to f32 (PyTorch's default float) otherwise.
pub(crate) fn scalar_result_dtype(dtype: DType, scalars: &[f64]) -> DType {
    if dtype.is_float() {
        dtype
    } else if scalars.iter().all(|&s| is_integral_value(s)) {
        if dtype.is_bool() {
            DType::I64
        } else {
            dtype
        }
    } else {
        DType::F32
    }
}

/// Errors unless a result of `computed` can be stored in `into` without
/// changing category (PyTorch's rule for in-place ops and `out=`).
pub(crate) fn check_can_cast(op: &'static str, computed: DType, into: DType) -> Result<()> {
    if category(computed) <= category(into) {
        Ok(())
    } else {
        Err(TensorError::invalid(
            op,
            format!("the result has dtype {computed}, which cannot be stored in place in a tensor of dtype {into}"),
        ))
    }
}

// ----- operands ---------------------------------------------------------------

/// The broadcast shape of `shapes`, as an error of `op` when they do not fit.
pub(crate) fn broadcast_all(op: &'static str, shapes: &[&Shape]) -> Result<Shape> {
    let mut shape = shapes.first().map(|s| (*s).clone()).unwrap_or_else(Shape::scalar);
    for s in shapes.iter().skip(1) {
        shape = broadcast_shapes(&shape, s).map_err(|source| TensorError::OpLayout { op, source: source.into() })?;
    }
    Ok(shape)
}

/// `tensor` converted to `dtype` (a copy only when it differs) and seen
/// through `shape` by broadcasting.
pub(crate) fn prepare(op: &'static str, tensor: &Tensor, dtype: DType, shape: &Shape) -> Result<Tensor> {
    let converted = tensor.to_dtype(dtype)?;
    if converted.shape() == shape {
        return Ok(converted);
    }
    converted.broadcast_as(shape.clone()).map_err(|error| match error {
        TensorError::Layout(source) => TensorError::OpLayout { op, source: source.into() },
        other => other,
    })
}

/// `src` broadcast to `dst`'s shape, converted to its dtype, and copied when
/// it shares `dst`'s storage (so reading it while `dst` is written is safe).
pub(crate) fn prepare_in_place(op: &'static str, dst: &Tensor, src: &Tensor) -> Result<Tensor> {
    if src.device() != dst.device() {
        return Err(TensorError::DeviceMismatch { op, lhs: dst.device(), rhs: src.device() });
    }
    check_can_cast(op, result_dtype(dst, src), dst.dtype())?;
    let src = src.broadcast_as(dst.shape().clone()).map_err(|_| {
        TensorError::shape(
            op,
            format!(
                "operand of shape {:?} cannot be broadcast to the destination's shape {:?}",
                src.dims(),
                dst.dims()
            ),
        )
    })?;
    if src.dtype() != dst.dtype() || src.shares_storage_with(dst) {
        src.copy_to(dst.device(), dst.dtype())
    } else {
        Ok(src)
    }
}

/// A tensor of `shape` whose every element is `value` in `dtype`, as a
/// stride-0 view of one element (for scalar operands of binary ops).
pub(crate) fn scalar_like(value: f64, dtype: DType, reference: &Tensor) -> Result<Tensor> {
    dispatch_dtype!(dtype, T => Tensor::scalar_on(T::from_f64(value), reference.device()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_rules() {
        use DType::*;
        assert_eq!(scalar_result_dtype(I64, &[2.0]), I64);
        assert_eq!(scalar_result_dtype(Bool, &[2.0]), I64);
        assert_eq!(scalar_result_dtype(U8, &[0.5]), F32);
        assert_eq!(scalar_result_dtype(U8, &[f64::INFINITY]), F32);
        assert_eq!(scalar_result_dtype(F16, &[0.5]), F16);
        let error = check_can_cast("add_", F32, I64).unwrap_err();
        assert!(matches!(error, TensorError::Invalid { op: "add_", .. }), "{error:?}");
        check_can_cast("add_", F64, F16).unwrap();
    }
}
