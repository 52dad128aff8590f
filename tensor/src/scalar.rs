//! A scalar argument (a Python number in PyTorch's API) stored in a tensor's
//! dtype, or the op's [`TensorError::ValueOutOfRange`] when the dtype cannot
//! hold it.

use crate::dtype::WithDType;
use crate::error::TensorError;

/// `value` as a `T`, or an error naming `op` when `T`'s dtype cannot hold it
/// ([`DType::can_hold`]). Integer dtypes drop the fraction and wrap negative
/// integers into u8, as PyTorch does; the others convert by
/// [`WithDType::from_f64`].
pub(crate) fn checked_scalar<T: WithDType>(op: &'static str, value: f64) -> Result<T, TensorError> {
    if !T::DTYPE.can_hold(value) {
        return Err(TensorError::ValueOutOfRange { op, value, dtype: T::DTYPE });
    }
    // In range, so `as i64` truncates without saturating.
    Ok(if T::DTYPE.is_integral() { T::from_i64(value as i64) } else { T::from_f64(value) })
}

/// An integral scalar combined with an integer tensor (it stands for a
/// Python `int`) as an i64, or an error naming `op` when it is beyond i64
/// (PyTorch cannot take such an `int` either).
pub(crate) fn integer_scalar(op: &'static str, value: f64) -> Result<i64, TensorError> {
    checked_scalar::<i64>(op, value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_convert_as_pytorch_or_name_the_op() {
        assert_eq!(checked_scalar::<u8>("fill_", -1.0).unwrap(), 255);
        assert_eq!(checked_scalar::<u8>("fill_", 7.9).unwrap(), 7);
        assert_eq!(checked_scalar::<i64>("fill_", -2.5).unwrap(), -2);
        assert!(checked_scalar::<bool>("fill_", f64::NAN).unwrap());
        let error = checked_scalar::<u8>("full", 300.0).unwrap_err();
        assert!(matches!(error, TensorError::ValueOutOfRange { op: "full", dtype: crate::DType::U8, .. }));
        assert_eq!(error.to_string(), "full: value 300 cannot be converted to u8 without overflow");
        assert_eq!(integer_scalar("add_scalar", -9e18).unwrap(), -9_000_000_000_000_000_000);
        assert!(integer_scalar("add_scalar", 1e19).is_err());
    }
}
