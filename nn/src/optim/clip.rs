//! Gradient clipping, in place (PyTorch's `torch.nn.utils.clip_grad_norm_`
//! and `clip_grad_value_`), and [`grad_norm`] to log the norm without
//! clipping.
//!
//! The total norm is the norm of all gradients taken together (as if
//! concatenated). Half-precision gradients are measured in f32 so that the
//! sum of squares cannot overflow; the per-tensor results are combined in
//! f64. Parameters without a gradient are skipped.
//!
//! ```
//! use brasa_nn::optim::clip_grad_norm_;
//! use brasa_autograd::Var;
//! use brasa_tensor::Tensor;
//!
//! let w = Var::param(Tensor::zeros([2], brasa_tensor::DType::F64)?)?;
//! w.set_grad(Some(Tensor::from_vec(vec![3.0f64, 4.0], [2])?))?;
//! let norm = clip_grad_norm_(&[w.clone()], 1.0, 2.0)?;
//! assert_eq!(norm, 5.0);                          // the norm before clipping
//! let g = w.grad().unwrap().to_vec::<f64>()?;
//! assert!((g[0] - 0.6).abs() < 1e-6 && (g[1] - 0.8).abs() < 1e-6);
//! # Ok::<(), brasa_nn::NnError>(())
//! ```

use crate::error::{NnError, Result};
use brasa_autograd::{no_grad, Var};
use brasa_tensor::{DType, Tensor};

/// Scales all gradients together so that their total `norm_type`-norm is
/// at most `max_norm` (multiplying by `max_norm / (norm + 1e-6)` when that
/// is below 1, as PyTorch does) and returns the total norm before clipping.
/// `norm_type` is any `p > 0` or `f64::INFINITY` (the largest absolute
/// value). A non-finite norm scales the gradients to NaN, as in PyTorch; see
/// [`clip_grad_norm_with`] to make it an error instead. No gradients: 0.
pub fn clip_grad_norm_(params: &[Var], max_norm: f64, norm_type: f64) -> Result<f64> {
    clip_grad_norm_with(params, max_norm, norm_type, false)
}

/// [`clip_grad_norm_`] with PyTorch's `error_if_nonfinite`: when true, a
/// NaN or infinite total norm is an error and the gradients are left as
/// they are.
pub fn clip_grad_norm_with(params: &[Var], max_norm: f64, norm_type: f64, error_if_nonfinite: bool) -> Result<f64> {
    const WHAT: &str = "clip_grad_norm_";
    if max_norm.is_nan() || max_norm < 0.0 {
        return Err(NnError::invalid(WHAT, format!("max_norm must be >= 0, got {max_norm}")));
    }
    let grads: Vec<Tensor> = params.iter().filter_map(Var::grad).collect();
    let total = total_norm(WHAT, &grads, norm_type)?;
    if error_if_nonfinite && !total.is_finite() {
        return Err(NnError::invalid(
            WHAT,
            format!(
                "the total norm of order {norm_type} of the gradients is {total}, so they cannot be clipped; \
                 pass error_if_nonfinite = false to scale them by it anyway"
            ),
        ));
    }
    let coefficient = max_norm / (total + 1e-6);
    // PyTorch multiplies by min(coefficient, 1) always; by 1 changes nothing,
    // so only a smaller (or NaN) coefficient is applied.
    if coefficient < 1.0 || coefficient.is_nan() {
        let _guard = no_grad();
        for g in &grads {
            g.mul_scalar_(coefficient)?;
        }
    }
    Ok(total)
}

/// The total `norm_type`-norm of the parameters' gradients (`p > 0` or
/// `f64::INFINITY`), without changing them; 0 without gradients.
pub fn grad_norm(params: &[Var], norm_type: f64) -> Result<f64> {
    let grads: Vec<Tensor> = params.iter().filter_map(Var::grad).collect();
    total_norm("grad_norm", &grads, norm_type)
}

/// Clamps every gradient element to `[-clip_value, clip_value]` in place
/// (PyTorch's `clip_grad_value_`); `clip_value` must be >= 0.
pub fn clip_grad_value_(params: &[Var], clip_value: f64) -> Result<()> {
    if clip_value.is_nan() || clip_value < 0.0 {
        return Err(NnError::invalid("clip_grad_value_", format!("clip_value must be >= 0, got {clip_value}")));
    }
    let _guard = no_grad();
    for g in params.iter().filter_map(Var::grad) {
        g.clamp_(Some(-clip_value), Some(clip_value))?;
    }
    Ok(())
}

fn total_norm(what: &'static str, grads: &[Tensor], norm_type: f64) -> Result<f64> {
    if norm_type.is_nan() || norm_type <= 0.0 {
        return Err(NnError::invalid(
            what,
            format!("norm_type must be > 0 or infinity (f64::INFINITY), got {norm_type}"),
        ));
    }
    let _guard = no_grad();
    let mut total = 0.0f64;
    for g in grads {
        if g.numel() == 0 {
            continue;
        }
        let g = match g.dtype() {
            DType::F16 | DType::BF16 => g.to_dtype(DType::F32)?,
            _ => g.clone(),
        };
        if norm_type == f64::INFINITY {
            let largest = g.abs()?.max(&[], false)?.item::<f64>()?;
            // NaN wins, as in PyTorch's max.
            total = if largest.is_nan() || total.is_nan() { f64::NAN } else { total.max(largest) };
        } else if norm_type == 2.0 {
            total += g.mul(&g)?.sum_all()?.item::<f64>()?;
        } else if norm_type == 1.0 {
            total += g.abs()?.sum_all()?.item::<f64>()?;
        } else {
            total += g.abs()?.powf(norm_type)?.sum_all()?.item::<f64>()?;
        }
    }
    Ok(if norm_type == f64::INFINITY {
        total
    } else if norm_type == 2.0 {
        total.sqrt()
    } else if norm_type == 1.0 {
        total
    } else {
        total.powf(1.0 / norm_type)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_grad(values: &[f64]) -> Var {
        let v = Var::param(Tensor::zeros([values.len()], DType::F64).unwrap()).unwrap();
        v.set_grad(Some(Tensor::from_slice(values, [values.len()]).unwrap())).unwrap();
        v
    }

    #[test]
    fn norms_of_every_order() -> Result<()> {
        let params = [with_grad(&[3.0, -4.0]), with_grad(&[12.0]), Var::param(Tensor::zeros([3], DType::F64)?)?];
        assert_eq!(grad_norm(&params, 2.0)?, 13.0);
        assert_eq!(grad_norm(&params, 1.0)?, 19.0);
        assert_eq!(grad_norm(&params, f64::INFINITY)?, 12.0);
        let p3 = (27.0f64 + 64.0 + 1728.0).powf(1.0 / 3.0);
        assert!((grad_norm(&params, 3.0)? - p3).abs() < 1e-12);
        let err = grad_norm(&params, 0.0).unwrap_err();
        assert!(matches!(err, NnError::Invalid { what: "grad_norm", .. }), "{err:?}");
        assert_eq!(grad_norm(&params[2..], 2.0)?, 0.0);
        Ok(())
    }

    #[test]
    fn clipping_scales_only_above_the_limit() -> Result<()> {
        let params = [with_grad(&[3.0, -4.0]), with_grad(&[12.0])];
        assert_eq!(clip_grad_norm_(&params, 100.0, 2.0)?, 13.0);
        assert_eq!(params[0].grad().unwrap().to_vec::<f64>()?, [3.0, -4.0]);
        assert_eq!(clip_grad_norm_(&params, 1.3, 2.0)?, 13.0);
        let coefficient = 1.3 / (13.0 + 1e-6);
        assert_eq!(params[1].grad().unwrap().to_vec::<f64>()?, [12.0 * coefficient]);
        assert!((grad_norm(&params, 2.0)? - 1.3).abs() < 1e-6);
        Ok(())
    }

    #[test]
    fn non_finite_norms() -> Result<()> {
        let params = [with_grad(&[f64::INFINITY, 1.0])];
        let err = clip_grad_norm_with(&params, 1.0, 2.0, true).unwrap_err();
        assert!(matches!(err, NnError::Invalid { what: "clip_grad_norm_", .. }), "{err:?}");
        // The variant says no more: the message names the order and the norm.
        assert!(err.to_string().contains("the total norm of order 2 of the gradients is inf"), "{err}");
        assert_eq!(params[0].grad().unwrap().to_vec::<f64>()?[1], 1.0);
        assert_eq!(clip_grad_norm_(&params, 1.0, 2.0)?, f64::INFINITY);
        assert_eq!(params[0].grad().unwrap().to_vec::<f64>()?[1], 0.0);
        let nan = [with_grad(&[f64::NAN, 1.0])];
        assert!(clip_grad_norm_(&nan, 1.0, f64::INFINITY)?.is_nan());
        assert!(nan[0].grad().unwrap().to_vec::<f64>()?[1].is_nan());
        Ok(())
    }

    #[test]
    fn value_clipping() -> Result<()> {
        let params = [with_grad(&[-3.0, 0.5, 2.0])];
        clip_grad_value_(&params, 1.0)?;
        assert_eq!(params[0].grad().unwrap().to_vec::<f64>()?, [-1.0, 0.5, 1.0]);
        assert!(clip_grad_value_(&params, -1.0).is_err());
        Ok(())
    }

    #[test]
    fn half_gradients_do_not_overflow() -> Result<()> {
        let v = Var::param(Tensor::zeros([4], DType::F16)?)?;
        v.set_grad(Some(Tensor::full([4], 60000.0, DType::F16)?))?;
        assert_eq!(grad_norm(&[v], 2.0)?, 120000.0);
        Ok(())
    }
}
