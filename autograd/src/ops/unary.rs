//! Elementwise functions of one `Var` and its scalar forms: the derivative
//! of each, written with tensor ops on what the forward saved.

use super::mask_as;
use crate::error::Result;
use crate::op_names;
use crate::precision::autocast_inputs;
use crate::var::{record, Var};

impl Var {
    /// `-x`.
    pub fn neg(&self) -> Result<Var> {
        let out = self.tensor().neg()?;
        Ok(record("neg", &[self], out, Vec::new, |c| Ok(vec![Some(c.grad.neg()?)])))
    }

    /// `|x|` (gradient 0 at 0).
    pub fn abs(&self) -> Result<Var> {
        let out = self.tensor().abs()?;
        Ok(record(
            "abs",
            &[self],
            out,
            || vec![self.tensor().clone()],
            |c| {
                let x = &c.saved[0];
                let sign = mask_as(&x.gt_scalar(0.0)?, x.dtype())?.sub(&mask_as(&x.lt_scalar(0.0)?, x.dtype())?)?;
                Ok(vec![Some(c.grad.mul(&sign)?)])
            },
        ))
    }

    /// `e^x`.
    pub fn exp(&self) -> Result<Var> {
        if let Some(c) = autocast_inputs(op_names::EXP, &[self])? {
            return c[0].exp();
        }
        let out = self.tensor().exp()?;
        let saved = out.clone();
        Ok(record("exp", &[self], out, || vec![saved], |c| Ok(vec![Some(c.grad.mul(&c.saved[0])?)])))
    }

    /// Natural logarithm.
    pub fn log(&self) -> Result<Var> {
        if let Some(c) = autocast_inputs(op_names::LOG, &[self])? {
            return c[0].log();
        }
        let out = self.tensor().log()?;
        Ok(record("log", &[self], out, || vec![self.tensor().clone()], |c| Ok(vec![Some(c.grad.div(&c.saved[0])?)])))
    }

    /// Square root.
    pub fn sqrt(&self) -> Result<Var> {
        let out = self.tensor().sqrt()?;
        let saved = out.clone();
        Ok(record("sqrt", &[self], out, || vec![saved], |c| Ok(vec![Some(c.grad.div(&c.saved[0])?.mul_scalar(0.5)?)])))
    }

    /// `1 / sqrt(x)`.
    pub fn rsqrt(&self) -> Result<Var> {
        if let Some(c) = autocast_inputs(op_names::RSQRT, &[self])? {
            return c[0].rsqrt();
        }
        let out = self.tensor().rsqrt()?;
        let saved = out.clone();
        Ok(record(
            "rsqrt",
            &[self],
            out,
            || vec![saved],
            |c| {
                let y = &c.saved[0];
                Ok(vec![Some(c.grad.mul(&y.mul(y)?.mul(y)?)?.mul_scalar(-0.5)?)])
            },
        ))
    }

    /// Sine.
    pub fn sin(&self) -> Result<Var> {
        let out = self.tensor().sin()?;
        Ok(record(
            "sin",
            &[self],
            out,
            || vec![self.tensor().clone()],
            |c| Ok(vec![Some(c.grad.mul(&c.saved[0].cos()?)?)]),
        ))
    }

    /// Cosine.
    pub fn cos(&self) -> Result<Var> {
        let out = self.tensor().cos()?;
        Ok(record(
            "cos",
            &[self],
            out,
            || vec![self.tensor().clone()],
            |c| Ok(vec![Some(c.grad.mul(&c.saved[0].sin()?)?.neg()?)]),
        ))
    }

    /// Hyperbolic tangent.
    pub fn tanh(&self) -> Result<Var> {
        let out = self.tensor().tanh()?;
        let saved = out.clone();
        Ok(record(
            "tanh",
            &[self],
            out,
            || vec![saved],
            |c| {
                let y = &c.saved[0];
                Ok(vec![Some(c.grad.mul(&y.mul(y)?.affine(-1.0, 1.0)?)?)])
            },
        ))
    }

    /// `1 / (1 + e^-x)`.
    pub fn sigmoid(&self) -> Result<Var> {
        let out = self.tensor().sigmoid()?;
        let saved = out.clone();
        Ok(record(
            "sigmoid",
            &[self],
            out,
            || vec![saved],
            |c| {
                let y = &c.saved[0];
                Ok(vec![Some(c.grad.mul(&y.mul(&y.affine(-1.0, 1.0)?)?)?)])
            },
        ))
    }

    /// `max(x, 0)` (gradient 0 at 0). Saves its output only.
    pub fn relu(&self) -> Result<Var> {
        let out = self.tensor().relu()?;
        let saved = out.clone();
        Ok(record(
            "relu",
            &[self],
            out,
            || vec![saved],
            |c| {
                // One pass, one output: no mask tensor.
                Ok(vec![Some(c.grad.relu_backward(&c.saved[0])?)])
            },
        ))
    }

    /// GELU with the exact normal CDF. Saves its input only; the backward is
    /// one fused pass, `grad · (Φ(x) + x φ(x))` ([`Tensor::gelu_backward`],
    /// PyTorch's `gelu_backward`).
    ///
    /// [`Tensor::gelu_backward`]: brasa_tensor::Tensor::gelu_backward
    pub fn gelu(&self) -> Result<Var> {
        let out = self.tensor().gelu()?;
        Ok(record(
            "gelu",
            &[self],
            out,
            || vec![self.tensor().clone()],
            |c| Ok(vec![Some(c.grad.gelu_backward(&c.saved[0])?)]),
        ))
    }

    /// GELU's tanh approximation. Saves its input only; the backward is one
    /// fused pass ([`Tensor::gelu_tanh_backward`], PyTorch's
    /// `gelu_backward(approximate='tanh')`).
    ///
    /// [`Tensor::gelu_tanh_backward`]: brasa_tensor::Tensor::gelu_tanh_backward
    pub fn gelu_tanh(&self) -> Result<Var> {
        let out = self.tensor().gelu_tanh()?;
        Ok(record(
            "gelu_tanh",
            &[self],
            out,
            || vec![self.tensor().clone()],
            |c| Ok(vec![Some(c.grad.gelu_tanh_backward(&c.saved[0])?)]),
        ))
    }

    /// `x * sigmoid(x)`.
    pub fn silu(&self) -> Result<Var> {
        let out = self.tensor().silu()?;
        Ok(record(
            "silu",
            &[self],
            out,
            || vec![self.tensor().clone()],
            |c| {
                let x = &c.saved[0];
                let s = x.sigmoid()?;
                let d = s.mul(&x.mul(&s.affine(-1.0, 1.0)?)?.add_scalar(1.0)?)?;
                Ok(vec![Some(c.grad.mul(&d)?)])
            },
        ))
    }

    /// `x^exponent`.
    pub fn powf(&self, exponent: f64) -> Result<Var> {
        if let Some(c) = autocast_inputs(op_names::POW, &[self])? {
            return c[0].powf(exponent);
        }
        let out = self.tensor().powf(exponent)?;
        Ok(record(
            "powf",
            &[self],
            out,
            || vec![self.tensor().clone()],
            move |c| Ok(vec![Some(c.grad.mul(&c.saved[0].powf(exponent - 1.0)?.mul_scalar(exponent)?)?)]),
        ))
    }

    /// Clamps to `[min, max]` (either optional); the gradient is PyTorch
    /// 2.15's for scalar bounds: `where(min < x < max, grad, 0)`. The bounds
    /// are exclusive (an element sitting exactly on a bound gets no
    /// gradient, as a clamped one does not), compared in `x`'s dtype as
    /// PyTorch casts the scalar bounds, so with `min >= max` and for NaN
    /// inputs the gradient is 0, and a non-finite upstream gradient never
    /// leaks into a clamped element (a select, not a multiply by a 0/1
    /// mask: `0 * inf` is NaN).
    ///
    /// ```
    /// use brasa_autograd::Var;
    /// use brasa_tensor::Tensor;
    /// let x = Var::param(Tensor::from_vec(vec![-2.0f64, -1.0, 0.5, 1.0, 3.0], [5])?)?;
    /// x.clamp(Some(-1.0), Some(1.0))?.sum_all()?.backward()?;
    /// assert_eq!(x.grad().unwrap().to_vec::<f64>()?, [0.0, 0.0, 1.0, 0.0, 0.0]);
    /// # Ok::<(), brasa_autograd::AutogradError>(())
    /// ```
    pub fn clamp(&self, min: Option<f64>, max: Option<f64>) -> Result<Var> {
        let out = self.tensor().clamp(min, max)?;
        Ok(record(
            "clamp",
            &[self],
            out,
            || vec![self.tensor().clone()],
            move |c| {
                let x = &c.saved[0];
                // A bound as `x`'s dtype holds it (rounded, or ±inf past its
                // range), as PyTorch compares `x > min` with the scalar cast
                // to `x`'s dtype: `0.1f32 < 0.1` is then false.
                let bound = |b: f64| -> Result<brasa_tensor::Tensor> {
                    Ok(brasa_tensor::Tensor::full_on([], b, brasa_tensor::DType::F64, x.device())?
                        .to_dtype(x.dtype())?)
                };
                let inside = match (min, max) {
                    (Some(lo), Some(hi)) => {
                        let (above, below) = (x.gt(&bound(lo)?)?, x.lt(&bound(hi)?)?);
                        // Logical and of two bool masks: `below` where
                        // `above` holds, else `above` itself (false).
                        above.where_cond(&below, &above)?
                    }
                    (Some(lo), None) => x.gt(&bound(lo)?)?,
                    (None, Some(hi)) => x.lt(&bound(hi)?)?,
                    // The forward refuses a clamp with no bound.
                    (None, None) => return Ok(vec![Some(c.grad.clone())]),
                };
                let zero = brasa_tensor::Tensor::zeros_on([], c.grad.dtype(), c.grad.device())?;
                Ok(vec![Some(inside.where_cond(c.grad, &zero)?)])
            },
        ))
    }

    /// `x * mul + add`.
    pub fn affine(&self, mul: f64, add: f64) -> Result<Var> {
        let out = self.tensor().affine(mul, add)?;
        Ok(record("affine", &[self], out, Vec::new, move |c| Ok(vec![Some(c.grad.mul_scalar(mul)?)])))
    }

    /// `x + value`.
    pub fn add_scalar(&self, value: f64) -> Result<Var> {
        let out = self.tensor().add_scalar(value)?;
        Ok(record("add_scalar", &[self], out, Vec::new, |c| Ok(vec![Some(c.grad.clone())])))
    }

    /// `x - value`.
    pub fn sub_scalar(&self, value: f64) -> Result<Var> {
        let out = self.tensor().sub_scalar(value)?;
        Ok(record("sub_scalar", &[self], out, Vec::new, |c| Ok(vec![Some(c.grad.clone())])))
    }

    /// `x * value`.
    pub fn mul_scalar(&self, value: f64) -> Result<Var> {
        let out = self.tensor().mul_scalar(value)?;
        Ok(record("mul_scalar", &[self], out, Vec::new, move |c| Ok(vec![Some(c.grad.mul_scalar(value)?)])))
    }

    /// `x / value`.
    pub fn div_scalar(&self, value: f64) -> Result<Var> {
        let out = self.tensor().div_scalar(value)?;
        Ok(record("div_scalar", &[self], out, Vec::new, move |c| Ok(vec![Some(c.grad.div_scalar(value)?)])))
    }

    /// `value - x`.
    pub fn rsub_scalar(&self, value: f64) -> Result<Var> {
        self.affine(-1.0, value)
    }

    /// A copy on another device, recorded in the graph: backward moves the
    /// gradient back to this `Var`'s device. This is what makes the
    /// model-parallel pattern `stage2(stage1(x).to(dev1))` train: without
    /// it, re-wrapping the moved tensor would cut the graph and the first
    /// stage would get no gradient. Moving to the same device is a no-op
    /// that returns this `Var` itself.
    pub fn to(&self, device: brasa_tensor::Device) -> Result<Var> {
        let from = self.device();
        if from == device {
            return Ok(self.clone());
        }
        let out = self.tensor().to(device)?;
        Ok(record("to_device", &[self], out, Vec::new, move |c| Ok(vec![Some(c.grad.to(from)?)])))
    }

    /// A copy in another dtype (the gradient goes back to this dtype).
    pub fn to_dtype(&self, dtype: brasa_tensor::DType) -> Result<Var> {
        let from = self.dtype();
        let out = self.tensor().to_dtype(dtype)?;
        Ok(record("to_dtype", &[self], out, Vec::new, move |c| Ok(vec![Some(c.grad.to_dtype(from)?)])))
    }
}
