//! The activations a PyTorch user reaches for beyond ReLU/GELU/SiLU:
//! `softplus`, `mish`, `elu`, `celu`, `selu`, `leaky_relu`, `hardswish`,
//! `hardsigmoid` and `log_sigmoid`, each with PyTorch's formula and its
//! gradient convention at the kinks (`torch.nn.functional`).
//!
//! The forwards are composed of tensor ops, so they run wherever those do;
//! each records one node whose backward is the closed-form derivative
//! computed from the saved input, rather than the graph of a dozen
//! elementwise ops the composition would leave behind.

use crate::error::{AutogradError, Result};
use crate::op_names;
use crate::precision::autocast_inputs;
use crate::var::{record, Var};
use brasa_tensor::Tensor;

/// SELU's `alpha` (Klambauer et al., as PyTorch spells it).
const SELU_ALPHA: f64 = 1.673_263_242_354_377_2;
/// SELU's `scale`.
const SELU_SCALE: f64 = 1.050_700_987_355_480_5;

/// Refuses a parameter that is NaN or infinite.
fn finite(op: &'static str, name: &str, value: f64) -> Result<()> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(AutogradError::invalid(op, format!("{name} must be finite, got {value}")))
    }
}

/// `log(1 + e^t)` without overflow: `max(t, 0) + log1p(e^-|t|)`.
fn softplus_stable(t: &Tensor) -> Result<Tensor> {
    let tail = t.abs()?.neg()?.exp()?;
    // `log1p` rather than `log(1 + ·)`: for very negative `t` the result is
    // `e^t`, far below 1's rounding.
    tail.log1p_()?;
    Ok(tail.add(&t.relu()?)?)
}

/// `e^t - 1` for any `t`, accurate near 0 where `exp(t) - 1` cancels
/// (PyTorch uses `expm1`). Up to 1, `2 tanh(t/2) / (1 - tanh(t/2))`: there
/// `1 - tanh(t/2)` is at least 0.53, so nothing cancels (above 1 it tends
/// to 0 and loses every digit, then gives -inf). Above 1, `e^t - 1`: `e^t`
/// is at least `e`, so subtracting 1 loses nothing either.
fn expm1(t: &Tensor) -> Result<Tensor> {
    let half = t.clamp(None, Some(1.0))?.mul_scalar(0.5)?.tanh()?;
    let near_zero = half.mul_scalar(2.0)?.div(&half.affine(-1.0, 1.0)?)?;
    let above_one = t.exp()?.add_scalar(-1.0)?;
    Ok(t.gt_scalar(1.0)?.where_cond(&above_one, &near_zero)?)
}

/// A 0-d tensor holding `value` in `like`'s dtype and device.
fn scalar(like: &Tensor, value: f64) -> Result<Tensor> {
    Ok(like.new_full([], value)?)
}

/// Hardsigmoid's slope inside (-3, 3): PyTorch's backward uses `1/6` as an
/// f32 constant for every dtype (f64 gradients are `0x1.555556p-3`, not
/// `1/6` in f64); f32 gradients are the same either way.
const HARDSIGMOID_SLOPE: f64 = (1.0f32 / 6.0) as f64;

impl Var {
    /// Records `out`, an elementwise function of `self` alone, whose
    /// backward multiplies the output gradient by `derivative(x)`, computed
    /// from the saved input `x` (the activations' closed-form derivatives).
    fn pointwise(
        &self,
        op: &'static str,
        out: Tensor,
        derivative: impl Fn(&Tensor) -> Result<Tensor> + Send + 'static,
    ) -> Var {
        let x = self.tensor();
        record(op, &[self], out, || vec![x.clone()], move |c| Ok(vec![Some(c.grad.mul(&derivative(&c.saved[0])?)?)]))
    }

    /// `log(1 + e^(beta·x)) / beta`, and `x` itself where `beta·x >
    /// threshold` (PyTorch's `F.softplus(x, beta, threshold)`; its defaults
    /// are `beta = 1`, `threshold = 20`). The gradient is
    /// `sigmoid(beta·x)`, and 1 in the linear region. `beta` must be finite
    /// and non-zero, `threshold` not NaN.
    ///
    /// ```
    /// use brasa_autograd::Var;
    /// use brasa_tensor::Tensor;
    ///
    /// let x = Var::new(Tensor::from_vec(vec![0.0f64, 30.0], [2])?);
    /// let y = x.softplus(1.0, 20.0)?.tensor().to_vec::<f64>()?;
    /// assert!((y[0] - 2f64.ln()).abs() < 1e-15);
    /// assert_eq!(y[1], 30.0); // past the threshold: x itself
    /// # Ok::<(), brasa_autograd::AutogradError>(())
    /// ```
    pub fn softplus(&self, beta: f64, threshold: f64) -> Result<Var> {
        const OP: &str = op_names::SOFTPLUS;
        finite(OP, "beta", beta)?;
        if beta == 0.0 {
            return Err(AutogradError::invalid(OP, "beta must be non-zero (the result divides by it), got 0"));
        }
        if threshold.is_nan() {
            return Err(AutogradError::invalid(OP, "threshold must not be NaN"));
        }
        if let Some(c) = autocast_inputs(OP, &[self])? {
            return c[0].softplus(beta, threshold);
        }
        let x = self.tensor();
        let bx = x.mul_scalar(beta)?;
        let soft = softplus_stable(&bx)?.div_scalar(beta)?;
        let out = bx.gt_scalar(threshold)?.where_cond(x, &soft)?;
        Ok(self.pointwise(OP, out, move |x| {
            let bx = x.mul_scalar(beta)?;
            Ok(bx.gt_scalar(threshold)?.where_cond(&scalar(&bx, 1.0)?, &bx.sigmoid()?)?)
        }))
    }

    /// `x · tanh(softplus(x))` (PyTorch's `F.mish`). The gradient is
    /// `t + x · sigmoid(x) · (1 - t²)` with `t = tanh(softplus(x))`.
    ///
    /// ```
    /// use brasa_autograd::Var;
    /// use brasa_tensor::Tensor;
    ///
    /// let y = Var::new(Tensor::from_vec(vec![0.0f64, 1.0], [2])?).mish()?;
    /// let v = y.tensor().to_vec::<f64>()?;
    /// assert_eq!(v[0], 0.0);
    /// assert!((v[1] - (1.0f64.exp().ln_1p()).tanh()).abs() < 1e-15);
    /// # Ok::<(), brasa_autograd::AutogradError>(())
    /// ```
    pub fn mish(&self) -> Result<Var> {
        let x = self.tensor();
        let out = x.mul(&softplus_stable(x)?.tanh()?)?;
        Ok(self.pointwise("mish", out, move |x| {
            // Recomputed rather than saved: one more tensor the size of
            // the input would live until backward otherwise.
            let t = softplus_stable(x)?.tanh()?;
            Ok(x.mul(&x.sigmoid()?)?.mul(&t.mul(&t)?.affine(-1.0, 1.0)?)?.add(&t)?)
        }))
    }

    /// `x` for `x > 0`, else `alpha · (e^x - 1)` (PyTorch's `F.elu`; default
    /// `alpha = 1`). At `x = 0` the gradient is PyTorch's, from the negative
    /// side: `alpha`. `alpha` must be finite (any sign, as PyTorch's
    /// out-of-place `elu` allows).
    ///
    /// ```
    /// use brasa_autograd::Var;
    /// use brasa_tensor::Tensor;
    ///
    /// let y = Var::new(Tensor::from_vec(vec![-1.0f64, 2.0], [2])?).elu(1.0)?;
    /// let v = y.tensor().to_vec::<f64>()?;
    /// assert!((v[0] - (-1.0f64).exp_m1()).abs() < 1e-15);
    /// assert_eq!(v[1], 2.0);
    /// # Ok::<(), brasa_autograd::AutogradError>(())
    /// ```
    pub fn elu(&self, alpha: f64) -> Result<Var> {
        finite("elu", "alpha", alpha)?;
        self.elu_family("elu", alpha, 1.0, 1.0, 1.0)
    }

    /// `max(0, x) + min(0, alpha · (e^(x/alpha) - 1))` (PyTorch's `F.celu`;
    /// default `alpha = 1`). `alpha` must be finite and non-zero (PyTorch
    /// refuses 0 too); a negative `alpha` makes `x/alpha` positive for
    /// negative `x`, where the result may overflow to `-inf` as PyTorch's
    /// does.
    ///
    /// The gradient for `x <= 0` is PyTorch's `elu_backward` with its
    /// constants: `(s · alpha) · e^(x · s)` with `s = 1 / f32(alpha)`, the
    /// reciprocal of `alpha` rounded to an f32 (PyTorch's derivative formula
    /// takes `1.0 / alpha.toFloat()` for every dtype), so f64 gradients
    /// match PyTorch's to the last bits of the exponential rather than being
    /// `e^(x/alpha)`; at 0 it is `alpha / f32(alpha)`, 1 for an `alpha` that
    /// an f32 holds. Where that rounding is 0 or infinite (`|alpha|` beyond
    /// f32's range, where PyTorch's backward fails, or below its smallest
    /// subnormal, where it gives NaN) the f64 `alpha` is used.
    ///
    /// ```
    /// use brasa_autograd::Var;
    /// use brasa_tensor::Tensor;
    ///
    /// let y = Var::new(Tensor::from_vec(vec![-1.0f64], [1])?).celu(2.0)?;
    /// assert!((y.tensor().to_vec::<f64>()?[0] - 2.0 * (-0.5f64).exp_m1()).abs() < 1e-15);
    /// assert!(Var::new(Tensor::from_vec(vec![1.0f64], [1])?).celu(0.0).is_err());
    /// # Ok::<(), brasa_autograd::AutogradError>(())
    /// ```
    pub fn celu(&self, alpha: f64) -> Result<Var> {
        finite("celu", "alpha", alpha)?;
        if alpha == 0.0 {
            return Err(AutogradError::invalid("celu", "alpha must be non-zero (x / alpha is taken), got 0"));
        }
        // PyTorch's derivative formula: `1.0 / alpha.toFloat()`.
        let rounded = f64::from(alpha as f32);
        let grad_input_scale = if rounded.is_finite() && rounded != 0.0 { 1.0 / rounded } else { 1.0 / alpha };
        self.elu_family("celu", alpha, 1.0, alpha, grad_input_scale)
    }

    /// `scale · elu(x, alpha)` with SELU's fixed `alpha ≈ 1.6733` and
    /// `scale ≈ 1.0507` (PyTorch's `F.selu`); the gradient at 0 is
    /// `scale · alpha`.
    ///
    /// ```
    /// use brasa_autograd::Var;
    /// use brasa_tensor::Tensor;
    ///
    /// let y = Var::new(Tensor::from_vec(vec![1.0f64], [1])?).selu()?;
    /// assert!((y.tensor().to_vec::<f64>()?[0] - 1.0507009873554805).abs() < 1e-15);
    /// # Ok::<(), brasa_autograd::AutogradError>(())
    /// ```
    pub fn selu(&self) -> Result<Var> {
        self.elu_family("selu", SELU_ALPHA, SELU_SCALE, 1.0, 1.0)
    }

    /// PyTorch's common ELU kernel: `scale · x` for `x > 0`, else
    /// `alpha · scale · (e^(x / input_divisor) - 1)`; the derivative for
    /// `x <= 0` is PyTorch's `elu_backward`,
    /// `(grad_input_scale · alpha · scale) · e^(x · grad_input_scale)`, with
    /// `grad_input_scale` the reciprocal of `input_divisor` as PyTorch's
    /// derivative formula computes it (CELU's differs from the forward's).
    /// `x / input_divisor` has either sign (CELU with a negative `alpha`).
    fn elu_family(
        &self,
        op: &'static str,
        alpha: f64,
        scale: f64,
        input_divisor: f64,
        grad_input_scale: f64,
    ) -> Result<Var> {
        let x = self.tensor();
        // Only the non-positive side goes through the exponential, so large
        // positive inputs cannot overflow it.
        let negative = expm1(&x.clamp(None, Some(0.0))?.div_scalar(input_divisor)?)?;
        let out = x.gt_scalar(0.0)?.where_cond(&x.mul_scalar(scale)?, &negative.mul_scalar(alpha * scale)?)?;
        Ok(self.pointwise(op, out, move |x| {
            let slope = x
                .clamp(None, Some(0.0))?
                .mul_scalar(grad_input_scale)?
                .exp()?
                .mul_scalar(grad_input_scale * alpha * scale)?;
            Ok(x.gt_scalar(0.0)?.where_cond(&scalar(x, scale)?, &slope)?)
        }))
    }

    /// `x` for `x > 0`, else `negative_slope · x` (PyTorch's
    /// `F.leaky_relu`; default slope 0.01). The gradient at 0 is
    /// `negative_slope`, as PyTorch's. The slope must be finite.
    ///
    /// ```
    /// use brasa_autograd::Var;
    /// use brasa_tensor::Tensor;
    ///
    /// let y = Var::new(Tensor::from_vec(vec![-2.0f64, 3.0], [2])?).leaky_relu(0.1)?;
    /// assert_eq!(y.tensor().to_vec::<f64>()?, [-0.2, 3.0]);
    /// # Ok::<(), brasa_autograd::AutogradError>(())
    /// ```
    pub fn leaky_relu(&self, negative_slope: f64) -> Result<Var> {
        const OP: &str = "leaky_relu";
        finite(OP, "negative_slope", negative_slope)?;
        let x = self.tensor();
        let out = x.gt_scalar(0.0)?.where_cond(x, &x.mul_scalar(negative_slope)?)?;
        Ok(self.pointwise(OP, out, move |x| {
            Ok(x.gt_scalar(0.0)?.where_cond(&scalar(x, 1.0)?, &scalar(x, negative_slope)?)?)
        }))
    }

    /// `min(max(x + 3, 0), 6) / 6` (PyTorch's `F.hardsigmoid`). The
    /// gradient is 1/6 strictly inside `(-3, 3)` and 0 elsewhere, the
    /// bounds included, as PyTorch's.
    ///
    /// ```
    /// use brasa_autograd::Var;
    /// use brasa_tensor::Tensor;
    ///
    /// let y = Var::new(Tensor::from_vec(vec![-4.0f64, 0.0, 1.5, 4.0], [4])?).hardsigmoid()?;
    /// assert_eq!(y.tensor().to_vec::<f64>()?, [0.0, 0.5, 0.75, 1.0]);
    /// # Ok::<(), brasa_autograd::AutogradError>(())
    /// ```
    pub fn hardsigmoid(&self) -> Result<Var> {
        let x = self.tensor();
        let out = x.add_scalar(3.0)?.clamp(Some(0.0), Some(6.0))?.div_scalar(6.0)?;
        Ok(self.pointwise("hardsigmoid", out, move |x| {
            let inside = x.gt_scalar(-3.0)?.to_dtype(x.dtype())?.mul(&x.lt_scalar(3.0)?.to_dtype(x.dtype())?)?;
            Ok(inside.mul_scalar(HARDSIGMOID_SLOPE)?)
        }))
    }

    /// `x · min(max(x + 3, 0), 6) / 6` (PyTorch's `F.hardswish`). The
    /// gradient is PyTorch's: 0 for `x < -3`, `x/3 + 1/2` for
    /// `-3 <= x <= 3` (so -1/2 at -3 and 3/2 at 3), 1 above.
    ///
    /// ```
    /// use brasa_autograd::Var;
    /// use brasa_tensor::Tensor;
    ///
    /// let y = Var::new(Tensor::from_vec(vec![-4.0f64, 1.0, 4.0], [3])?).hardswish()?;
    /// assert_eq!(y.tensor().to_vec::<f64>()?, [0.0, 4.0 / 6.0, 4.0]);
    /// # Ok::<(), brasa_autograd::AutogradError>(())
    /// ```
    pub fn hardswish(&self) -> Result<Var> {
        let x = self.tensor();
        let out = x.mul(&x.add_scalar(3.0)?.clamp(Some(0.0), Some(6.0))?)?.div_scalar(6.0)?;
        Ok(self.pointwise("hardswish", out, move |x| {
            let middle = x.div_scalar(3.0)?.add_scalar(0.5)?;
            let d = x.gt_scalar(3.0)?.where_cond(&scalar(x, 1.0)?, &middle)?;
            Ok(x.lt_scalar(-3.0)?.where_cond(&scalar(x, 0.0)?, &d)?)
        }))
    }

    /// `log(sigmoid(x))`, computed as `min(x, 0) - log1p(e^-|x|)` so that it
    /// neither overflows nor rounds small values away (PyTorch's
    /// `F.logsigmoid`). The gradient is `sigmoid(-x)`.
    ///
    /// ```
    /// use brasa_autograd::Var;
    /// use brasa_tensor::Tensor;
    ///
    /// let y = Var::new(Tensor::from_vec(vec![0.0f64, -800.0], [2])?).log_sigmoid()?;
    /// let v = y.tensor().to_vec::<f64>()?;
    /// assert!((v[0] + 2f64.ln()).abs() < 1e-15);
    /// assert_eq!(v[1], -800.0); // no overflow of e^800
    /// # Ok::<(), brasa_autograd::AutogradError>(())
    /// ```
    pub fn log_sigmoid(&self) -> Result<Var> {
        let x = self.tensor();
        let tail = x.abs()?.neg()?.exp()?;
        tail.log1p_()?;
        let out = x.clamp(None, Some(0.0))?.sub(&tail)?;
        Ok(self.pointwise("log_sigmoid", out, |x| Ok(x.neg()?.sigmoid()?)))
    }
}
