//! Parameter initialisation as PyTorch does it, from the seeded global
//! generator ([`brasa_tensor::manual_seed`]): Kaiming (He) and Xavier
//! (Glorot), uniform and normal, and the fan computation they share.
//!
//! ```
//! use brasa_nn::init;
//! use brasa_tensor::{DType, Device};
//!
//! // PyTorch's default for Linear(784, 512): kaiming_uniform(a = √5) = U(±1/√784).
//! let w = init::kaiming_uniform(&[512, 784], 5f64.sqrt(), DType::F32, Device::CPU)?;
//! assert!(w.to_vec::<f32>()?.iter().all(|v| v.abs() <= 1.0 / 28.0));
//! # Ok::<(), brasa_nn::NnError>(())
//! ```

use crate::error::{NnError, Result};
use brasa_tensor::{DType, Device, Tensor};

/// `(fan_in, fan_out)` of a weight: `[out, in, k...]` gives
/// `(in · Πk, out · Πk)`, as `torch.nn.init._calculate_fan_in_and_fan_out`.
pub fn fans(shape: &[usize]) -> Result<(usize, usize)> {
    if shape.len() < 2 {
        return Err(NnError::invalid(
            "init",
            format!("fan in and fan out need a shape of rank 2 or more, got {shape:?}"),
        ));
    }
    let receptive: usize = shape[2..].iter().product();
    Ok((shape[1] * receptive, shape[0] * receptive))
}

/// An error unless `value` is finite (and >= 0 when `non_negative`): a NaN
/// or infinite gain, slope or bound would fill the weights with NaN.
fn check_finite(what: &'static str, name: &str, value: f64, non_negative: bool) -> Result<()> {
    if !value.is_finite() || (non_negative && value < 0.0) {
        let rule = if non_negative { "finite and >= 0" } else { "finite" };
        return Err(NnError::invalid(what, format!("{name} must be {rule}, got {value}")));
    }
    Ok(())
}

/// The gain of leaky ReLU with negative slope `a` (`a = 0`: ReLU, √2).
pub fn leaky_relu_gain(a: f64) -> f64 {
    (2.0 / (1.0 + a * a)).sqrt()
}

/// `U(-b, b)` with `b = gain · √(3 / fan_in)`, `gain` of leaky ReLU with slope
/// `a` (PyTorch's `kaiming_uniform_(w, a)`; Linear and Conv use `a = √5`).
pub fn kaiming_uniform(shape: &[usize], a: f64, dtype: DType, device: Device) -> Result<Tensor> {
    check_finite("kaiming_uniform", "a", a, false)?;
    let (fan_in, _) = fans(shape)?;
    let bound = leaky_relu_gain(a) * (3.0 / fan_in.max(1) as f64).sqrt();
    uniform(shape, bound, dtype, device)
}

/// `N(0, σ²)` with `σ = gain / √fan_in` (PyTorch's `kaiming_normal_(w, a)`).
pub fn kaiming_normal(shape: &[usize], a: f64, dtype: DType, device: Device) -> Result<Tensor> {
    check_finite("kaiming_normal", "a", a, false)?;
    let (fan_in, _) = fans(shape)?;
    let std = leaky_relu_gain(a) / (fan_in.max(1) as f64).sqrt();
    Ok(Tensor::randn_on(shape, dtype, device)?.mul_scalar(std)?)
}

/// `U(-b, b)` with `b = gain · √(6 / (fan_in + fan_out))` (Glorot).
pub fn xavier_uniform(shape: &[usize], gain: f64, dtype: DType, device: Device) -> Result<Tensor> {
    check_finite("xavier_uniform", "gain", gain, false)?;
    let (fan_in, fan_out) = fans(shape)?;
    let bound = gain * (6.0 / (fan_in + fan_out).max(1) as f64).sqrt();
    uniform(shape, bound, dtype, device)
}

/// `N(0, σ²)` with `σ = gain · √(2 / (fan_in + fan_out))` (Glorot).
pub fn xavier_normal(shape: &[usize], gain: f64, dtype: DType, device: Device) -> Result<Tensor> {
    check_finite("xavier_normal", "gain", gain, false)?;
    let (fan_in, fan_out) = fans(shape)?;
    let std = gain * (2.0 / (fan_in + fan_out).max(1) as f64).sqrt();
    Ok(Tensor::randn_on(shape, dtype, device)?.mul_scalar(std)?)
}

/// `U(-bound, bound)`; `bound` finite and >= 0.
pub fn uniform(shape: &[usize], bound: f64, dtype: DType, device: Device) -> Result<Tensor> {
    check_finite("uniform", "bound", bound, true)?;
    Ok(Tensor::uniform_on(shape, -bound, bound, dtype, device)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fans_follow_pytorch() {
        assert_eq!(fans(&[512, 784]).unwrap(), (784, 512));
        assert_eq!(fans(&[64, 32, 3, 3]).unwrap(), (288, 576));
        assert!(fans(&[5]).is_err());
    }

    #[test]
    fn kaiming_uniform_bound_and_spread() {
        let w = kaiming_uniform(&[256, 100], 5f64.sqrt(), DType::F64, Device::CPU).unwrap().to_vec::<f64>().unwrap();
        let bound = 0.1; // 1 / √100
        assert!(w.iter().all(|v| v.abs() <= bound));
        // U(-b, b) has variance b²/3; 25,600 draws put the estimate within a few percent.
        let var = w.iter().map(|v| v * v).sum::<f64>() / w.len() as f64;
        assert!((var / (bound * bound / 3.0) - 1.0).abs() < 0.05, "variance {var}");
    }

    #[test]
    fn non_finite_gains_and_bounds_are_errors() {
        let (dtype, dev) = (DType::F32, Device::CPU);
        assert!(kaiming_uniform(&[4, 4], f64::NAN, dtype, dev).is_err());
        assert!(kaiming_normal(&[4, 4], f64::INFINITY, dtype, dev).is_err());
        assert!(xavier_uniform(&[4, 4], f64::NAN, dtype, dev).is_err());
        assert!(xavier_normal(&[4, 4], f64::NEG_INFINITY, dtype, dev).is_err());
        for bound in [f64::NAN, f64::INFINITY, -1.0] {
            let err = uniform(&[4], bound, dtype, dev).unwrap_err();
            assert!(
                matches!(&err, NnError::Invalid { what: "uniform", message } if message.starts_with("bound")),
                "{err:?}"
            );
        }
        assert!(uniform(&[4], 0.0, dtype, dev).is_ok());
    }

    #[test]
    fn kaiming_normal_std() {
        let w = kaiming_normal(&[128, 200], 0.0, DType::F64, Device::CPU).unwrap().to_vec::<f64>().unwrap();
        let var = w.iter().map(|v| v * v).sum::<f64>() / w.len() as f64;
        assert!((var / (2.0 / 200.0) - 1.0).abs() < 0.05, "variance {var}");
    }
}
