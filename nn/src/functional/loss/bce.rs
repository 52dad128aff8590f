//! Binary cross entropy on logits (PyTorch's
//! `F.binary_cross_entropy_with_logits`): one autograd node in the
//! numerically stable form, with PyTorch's `weight` and `pos_weight`.

use super::options::{BceWithLogitsOptions, Reduction};
use super::targets::check_pair;
use crate::error::{NnError, Result};
use brasa_autograd::{apply, autocast_inputs, op_names, Function, FunctionCtx, Var};
use brasa_tensor::{broadcast_shapes, Tensor};

/// Binary cross entropy on logits (PyTorch's
/// `F.binary_cross_entropy_with_logits`), in the numerically stable form
/// `loss = (1 − t)·x − (1 + (pos_weight − 1)·t)·log σ(x)` with
/// `log σ(x) = min(x, 0) − log1p(e^−|x|)`: no overflow for large `|x|`.
/// `target` (probabilities, the shape and dtype of `logits`) may require
/// grad too; `pos_weight` (the weight of positive examples, broadcast to
/// `logits`, typically `[classes]`) is a constant. For PyTorch's `weight`
/// (a per-element rescaling) see [`binary_cross_entropy_with_logits_with`].
pub fn binary_cross_entropy_with_logits(
    logits: &Var,
    target: &Var,
    reduction: Reduction,
    pos_weight: Option<&Tensor>,
) -> Result<Var> {
    let options = BceWithLogitsOptions { reduction, weight: None, pos_weight: pos_weight.cloned() };
    binary_cross_entropy_with_logits_with(logits, target, &options)
}

/// [`binary_cross_entropy_with_logits`] with PyTorch's `weight` as well as
/// `pos_weight`:
/// `loss = −w·[pos_weight·t·log σ(x) + (1 − t)·log(1 − σ(x))]`, computed
/// in the stable form `w·[(1 − t)·x − (1 + (pos_weight − 1)·t)·log σ(x)]`
/// and then reduced (the mean divides by the number of elements, not by the
/// weights' sum, as in PyTorch). Each weight must be floating-point, on the
/// logits' device and broadcast to their shape; an error says which does not.
///
/// ```
/// use brasa_autograd::Var;
/// use brasa_nn::functional::{binary_cross_entropy_with_logits_with, BceWithLogitsOptions, Reduction};
/// use brasa_tensor::Tensor;
/// let x = Var::param(Tensor::from_vec(vec![0.0f64, 0.0], [2])?)?;
/// let t = Var::new(Tensor::from_vec(vec![1.0f64, 0.0], [2])?);
/// let options = BceWithLogitsOptions {
///     reduction: Reduction::None,
///     weight: Some(Tensor::from_vec(vec![2.0f64, 0.5], [2])?),
///     ..Default::default()
/// };
/// let loss = binary_cross_entropy_with_logits_with(&x, &t, &options)?;
/// let ln2 = std::f64::consts::LN_2;
/// assert_eq!(loss.tensor().to_vec::<f64>()?, [2.0 * ln2, 0.5 * ln2]);
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
pub fn binary_cross_entropy_with_logits_with(
    logits: &Var,
    target: &Var,
    options: &BceWithLogitsOptions,
) -> Result<Var> {
    const WHAT: &str = op_names::BINARY_CROSS_ENTROPY_WITH_LOGITS;
    if let Some(c) = autocast_inputs(WHAT, &[logits, target])? {
        return binary_cross_entropy_with_logits_with(&c[0], &c[1], options);
    }
    check_pair(WHAT, logits, target)?;
    let constant = |name: &str, w: &Tensor| -> Result<Tensor> {
        if !w.dtype().is_float() {
            return Err(NnError::invalid(WHAT, format!("{name} must be floating-point, got {}", w.dtype())));
        }
        if w.device() != logits.device() {
            return Err(NnError::invalid(
                WHAT,
                format!("{name} is on {}, the logits on {}", w.device(), logits.device()),
            ));
        }
        let fits = broadcast_shapes(w.shape(), logits.shape()).is_ok_and(|s| s.dims() == logits.dims());
        if !fits {
            return Err(NnError::invalid(
                WHAT,
                format!("{name} of shape {:?} does not broadcast to the logits' shape {:?}", w.dims(), logits.dims()),
            ));
        }
        Ok(w.to_dtype(logits.dtype())?)
    };
    let pos_weight_minus_one = match &options.pos_weight {
        None => None,
        Some(w) => Some(constant("pos_weight", w)?.add_scalar(-1.0)?),
    };
    let weight = options.weight.as_ref().map(|w| constant("weight", w)).transpose()?;
    let numel = logits.numel();
    let node = BceWithLogits { reduction: options.reduction, numel, pos_weight_minus_one, weight };
    Ok(apply(node, &[logits, target])?)
}

/// The BCE-with-logits node: saves the logits and targets it was given.
struct BceWithLogits {
    reduction: Reduction,
    numel: usize,
    /// `pos_weight − 1`, in the logits' dtype.
    pos_weight_minus_one: Option<Tensor>,
    /// The per-element `weight`, in the logits' dtype: it scales the loss
    /// and so both gradients.
    weight: Option<Tensor>,
}

impl Function for BceWithLogits {
    fn name(&self) -> &'static str {
        "binary_cross_entropy_with_logits"
    }

    fn forward(&mut self, ctx: &mut FunctionCtx, inputs: &[Tensor]) -> brasa_autograd::Result<Tensor> {
        let (x, t) = (&inputs[0], &inputs[1]);
        let log_sigmoid = x.affine(1.0, 0.0)?;
        log_sigmoid.log_sigmoid_()?;
        // (1 − t)·x − (1 + (pw − 1)·t)·log σ(x)
        let loss = t.affine(-1.0, 1.0)?;
        loss.mul_(x)?;
        match &self.pos_weight_minus_one {
            Some(pw1) => {
                let log_weight = t.mul(pw1)?;
                log_weight.add_scalar_(1.0)?;
                loss.addcmul_(-1.0, &log_weight, &log_sigmoid)?;
            }
            None => loss.sub_(&log_sigmoid)?,
        }
        if let Some(w) = &self.weight {
            loss.mul_(w)?;
        }
        ctx.save_for_backward(x);
        ctx.save_for_backward(t);
        Ok(match self.reduction {
            Reduction::None => loss,
            Reduction::Sum => loss.sum_all()?,
            Reduction::Mean => loss.mean_all()?,
        })
    }

    fn backward(
        &mut self,
        saved: &[Tensor],
        grad: &Tensor,
        needs: &[bool],
    ) -> brasa_autograd::Result<Vec<Option<Tensor>>> {
        let (x, t) = (&saved[0], &saved[1]);
        let factor = match self.reduction {
            Reduction::Mean => grad.mul_scalar(1.0 / self.numel as f64)?,
            Reduction::Sum | Reduction::None => grad.clone(),
        };
        // The weight scales every element's loss, so both gradients too.
        let factor = match &self.weight {
            Some(w) => factor.mul(w)?,
            None => factor,
        };
        let grad_x = if needs.first().copied().unwrap_or(false) {
            let g = match &self.pos_weight_minus_one {
                // σ(x) − t
                None => {
                    let g = x.sigmoid()?;
                    g.sub_(t)?;
                    g
                }
                // (1 − t) − (1 + (pw − 1)·t)·σ(−x)
                Some(pw1) => {
                    let log_weight = t.mul(pw1)?;
                    log_weight.add_scalar_(1.0)?;
                    let g = x.neg()?;
                    g.sigmoid_()?;
                    g.mul_(&log_weight)?;
                    g.affine_(-1.0, 1.0)?;
                    g.sub_(t)?;
                    g
                }
            };
            g.mul_(&factor)?;
            Some(g)
        } else {
            None
        };
        let grad_t = if needs.get(1).copied().unwrap_or(false) {
            // −x − (pw − 1)·log σ(x)
            let g = match &self.pos_weight_minus_one {
                None => x.neg()?,
                Some(pw1) => {
                    let g = x.affine(1.0, 0.0)?;
                    g.log_sigmoid_()?;
                    let g = g.mul(pw1)?;
                    g.add_(x)?;
                    g.neg_()?;
                    g
                }
            };
            g.mul_(&factor)?;
            Some(g)
        } else {
            None
        };
        Ok(vec![grad_x, grad_t])
    }
}
