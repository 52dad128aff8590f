//! [`gradcheck`]: compares the gradients backward computes with central
//! finite differences, for any function of `Var`s — this crate's own ops and
//! users' [`crate::Function`]s alike.
//!
//! The check projects the output onto fixed pseudo-random weights `v`
//! (so one backward gives `Jᵀv`) and perturbs every input element in place
//! (through a one-element view, so non-contiguous inputs stay as given).

use crate::backward::grad;
use crate::error::{AutogradError, Result};
use crate::grad_mode::no_grad;
use crate::var::Var;
use brasa_tensor::{DType, Tensor};

/// Fixed weights in `±[0.5, 1.5)` for the output projection.
fn weights(out: &Tensor) -> Result<Tensor> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let values: Vec<f64> = (0..out.numel())
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let u = (state >> 11) as f64 / (1u64 << 53) as f64;
            if state & 1 == 0 {
                0.5 + u
            } else {
                -0.5 - u
            }
        })
        .collect();
    Ok(Tensor::from_vec_on(values, out.dims(), out.device())?.to_dtype(out.dtype())?)
}

/// The one-element view of `t` at row-major position `flat`.
fn element(t: &Tensor, mut flat: usize) -> Result<Tensor> {
    let mut view = t.clone();
    for dim in (0..t.rank()).rev() {
        let size = t.dims()[dim];
        view = view.narrow(dim, flat % size, 1)?;
        flat /= size;
    }
    Ok(view)
}

/// Checks `f`'s gradients with respect to every floating-point input
/// against central differences with step `eps`: each element must satisfy
/// `|analytic − numeric| ≤ atol + rtol·|numeric|`. Floating-point inputs
/// must be f64 and have no broadcast (stride-0) dims; other inputs (indices)
/// are passed as constants. `f` is called once with grad and twice per
/// input element without.
///
/// ```
/// use brasa_autograd::gradcheck;
/// use brasa_tensor::{DType, Tensor};
/// let x = Tensor::randn([3, 4], DType::F64)?;
/// gradcheck(|v| v[0].tanh()?.sum(&[1], false), &[x], 1e-6, 1e-7, 1e-5)?;
/// # Ok::<(), brasa_autograd::AutogradError>(())
/// ```
pub fn gradcheck(f: impl Fn(&[Var]) -> Result<Var>, inputs: &[Tensor], eps: f64, atol: f64, rtol: f64) -> Result<()> {
    if !(eps.is_finite() && eps > 0.0) {
        return Err(AutogradError::invalid("gradcheck", format!("eps must be finite and > 0, got {eps}")));
    }
    for (name, value) in [("atol", atol), ("rtol", rtol)] {
        if !(value.is_finite() && value >= 0.0) {
            return Err(AutogradError::invalid("gradcheck", format!("{name} must be finite and >= 0, got {value}")));
        }
    }
    // PyTorch: "gradcheck expects at least one input tensor to require
    // gradient". A check of nothing would pass without checking anything.
    if inputs.iter().all(|t| !t.dtype().is_float() || t.numel() == 0) {
        return Err(AutogradError::invalid(
            "gradcheck",
            "there is nothing to check: no floating-point input with at least one element",
        ));
    }
    for t in inputs.iter().filter(|t| t.dtype().is_float()) {
        if t.dtype() != DType::F64 {
            return Err(AutogradError::invalid(
                "gradcheck",
                format!("floating-point inputs must be f64 (finite differences in {} are too noisy)", t.dtype()),
            ));
        }
        if t.strides().iter().zip(t.dims()).any(|(&s, &d)| s == 0 && d > 1) {
            return Err(AutogradError::invalid("gradcheck", "an input has broadcast (stride-0) dims"));
        }
    }
    let vars: Vec<Var> =
        inputs.iter().map(|t| Var::from_tensor(t.clone(), t.dtype().is_float())).collect::<Result<_>>()?;
    let out = f(&vars)?;
    let v = weights(out.tensor())?;
    let loss = out.mul(&Var::new(v.clone()))?.sum_all()?;
    let wrt: Vec<&Var> = vars.iter().filter(|x| x.requires_grad()).collect();
    let analytic = if loss.requires_grad() { grad(&[&loss], &wrt, None, false)? } else { vec![None; wrt.len()] };
    drop(loss);
    let projected = |vars: &[Var]| -> Result<f64> {
        let _g = no_grad();
        let out = f(vars)?;
        Ok(out.tensor().to_dtype(DType::F64)?.mul(&v.to_dtype(DType::F64)?)?.sum_all()?.item::<f64>()?)
    };
    for (input, (var, g)) in vars.iter().filter(|x| x.requires_grad()).zip(analytic).enumerate() {
        let analytic = match g {
            Some(g) => g.to_dtype(DType::F64)?.to_vec::<f64>()?,
            None => vec![0.0; var.numel()],
        };
        for (index, &a) in analytic.iter().enumerate() {
            let cell = element(var.tensor(), index)?;
            let original = cell.to_vec::<f64>()?[0];
            cell.fill_(original + eps)?;
            let plus = projected(&vars);
            cell.fill_(original - eps)?;
            let minus = projected(&vars);
            cell.fill_(original)?;
            let numeric = (plus? - minus?) / (2.0 * eps);
            // Written so that a NaN or infinity on either side fails: two NaNs
            // (or two infinities) agree on nothing.
            let close = a.is_finite() && numeric.is_finite() && (a - numeric).abs() <= atol + rtol * numeric.abs();
            if !close {
                return Err(AutogradError::GradcheckFailed { input, index, analytic: a, numeric });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catches_a_wrong_gradient() -> Result<()> {
        let x = Tensor::from_vec(vec![0.3f64, -0.7, 1.1], [3])?;
        gradcheck(|v| v[0].sin(), std::slice::from_ref(&x), 1e-6, 1e-8, 1e-6)?;
        // A hook that doubles the gradient makes backward wrong.
        let wrong = gradcheck(
            |v| {
                let y = v[0].sin()?;
                if y.requires_grad() {
                    y.register_hook(|g| Ok(Some(g.mul_scalar(2.0)?)))?;
                }
                Ok(y)
            },
            &[x],
            1e-6,
            1e-8,
            1e-6,
        );
        assert!(matches!(wrong, Err(AutogradError::GradcheckFailed { input: 0, index: 0, .. })));
        Ok(())
    }

    #[test]
    fn nan_gradients_and_nothing_to_check_fail() -> Result<()> {
        // sqrt at -1: NaN by backward and by finite differences.
        let x = Tensor::from_vec(vec![-1.0f64], [1])?;
        let nan = gradcheck(|v| v[0].sqrt(), std::slice::from_ref(&x), 1e-6, 1e-8, 1e-6);
        assert!(matches!(nan, Err(AutogradError::GradcheckFailed { .. })), "{nan:?}");
        // No floating-point input, or only empty ones: nothing was checked.
        let ints = Tensor::from_vec(vec![1i64, 2], [2])?;
        let none = gradcheck(|v| Ok(v[0].clone()), &[ints], 1e-6, 1e-8, 1e-6).unwrap_err();
        assert!(matches!(none, AutogradError::Invalid { op: "gradcheck", .. }), "{none:?}");
        // The variant says no more: the message says why.
        assert!(none.to_string().contains("nothing to check"), "{none}");
        let empty = Tensor::zeros([0], DType::F64)?;
        assert!(gradcheck(|v| v[0].exp(), &[empty], 1e-6, 1e-8, 1e-6).is_err());
        assert!(gradcheck(|v| v[0].exp(), std::slice::from_ref(&x), f64::NAN, 1e-8, 1e-6).is_err());
        assert!(gradcheck(|v| v[0].exp(), &[x], 0.0, 1e-8, 1e-6).is_err());
        Ok(())
    }

    #[test]
    fn refuses_f32() -> Result<()> {
        let x = Tensor::ones([2], DType::F32)?;
        assert!(gradcheck(|v| v[0].exp(), &[x], 1e-3, 1e-3, 1e-3).is_err());
        Ok(())
    }
}
