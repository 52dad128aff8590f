//! Cross entropy with class-probability targets (PyTorch's
//! `F.cross_entropy` given a floating-point target of the input's shape):
//! [`cross_entropy_probs`], differentiable in the logits and the target;
//! [`crate::functional::cross_entropy_with`] sends a floating-point target
//! here, as PyTorch dispatches on the target's dtype.
//!
//! It is a short composition of `Var` ops (log-softmax, products, a sum
//! over the classes) rather than one node like the class-index loss: the
//! target is a dense tensor of the logits' size anyway, and the composition
//! gives the target its gradient (`−w·log p`, PyTorch differentiates it
//! too) with no backward of its own to get wrong.

use super::options::{CrossEntropyOptions, Reduction};
use crate::error::{NnError, Result};
use brasa_autograd::{autocast_inputs, op_names, Var};

/// PyTorch's default `ignore_index`, which probability targets accept only
/// because it is the default.
const DEFAULT_IGNORE_INDEX: i64 = -100;

/// Cross entropy between `logits` (`[N, C]`, `[N, C, d1, ...]` or `[C]`,
/// unnormalised) and class probabilities `target` of the same shape, dtype
/// (floating-point) and device, as PyTorch's `F.cross_entropy` with
/// probability targets. Per position `n` (a sample and its `d1, ...`),
/// with class weights `w` (all 1 without `weight`), `ε` the label
/// smoothing and `C` classes:
///
/// `loss_n = −Σ_c w_c · t_nc · log_softmax(x)_nc`, with `t = (1 − ε)·target + ε/C`;
///
/// `Mean` divides the sum by the number of positions `N·d1·…` (not by the
/// weights, PyTorch's rule for probability targets; NaN when there are
/// none), `Sum` adds them, `None` returns them (`[N, d1, ...]`, or `[]`
/// for an unbatched input). The targets need not sum to 1. Gradients flow
/// to `logits` and to `target`. `ignore_index` has no meaning here: any
/// value but PyTorch's default `Some(-100)` (or `None`) is an error, as in
/// PyTorch, and so are shapes, dtypes or devices that differ and a `weight`
/// that is not `[C]`.
///
/// ```
/// use brasa_autograd::Var;
/// use brasa_nn::functional::{cross_entropy_probs, CrossEntropyOptions};
/// use brasa_tensor::Tensor;
///
/// let logits = Var::param(Tensor::from_vec(vec![0.0f64, 0.0, 0.0, 0.0], [2, 2])?)?;
/// let target = Var::new(Tensor::from_vec(vec![1.0f64, 0.0, 0.5, 0.5], [2, 2])?);
/// let loss = cross_entropy_probs(&logits, &target, &CrossEntropyOptions::default())?;
/// assert!((loss.item()? - std::f64::consts::LN_2).abs() < 1e-12);
/// loss.backward()?;
/// // (softmax · Σ_c t_c − t) / N
/// assert_eq!(logits.grad().unwrap().to_vec::<f64>()?, [-0.25, 0.25, 0.0, 0.0]);
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
pub fn cross_entropy_probs(logits: &Var, target: &Var, options: &CrossEntropyOptions) -> Result<Var> {
    const WHAT: &str = op_names::CROSS_ENTROPY;
    if let Some(c) = autocast_inputs(WHAT, &[logits, target])? {
        return cross_entropy_probs(&c[0], &c[1], options);
    }
    let epsilon = options.label_smoothing;
    if !(0.0..=1.0).contains(&epsilon) {
        return Err(NnError::invalid(WHAT, format!("label_smoothing must be in [0, 1], got {epsilon}")));
    }
    if let Some(i) = options.ignore_index.filter(|&i| i != DEFAULT_IGNORE_INDEX) {
        return Err(NnError::invalid(
            WHAT,
            format!("ignore_index ({i}) is not supported with class-probability (floating-point) targets"),
        ));
    }
    check_probabilities(WHAT, logits, target)?;
    if logits.rank() == 1 {
        // Unbatched: a batch of one.
        let out = cross_entropy_probs(&logits.unsqueeze(0)?, &target.unsqueeze(0)?, options)?;
        return Ok(if options.reduction == Reduction::None { out.squeeze(0)? } else { out });
    }
    let classes = logits.dims()[1];
    let smoothed = if epsilon > 0.0 {
        target.mul_scalar(1.0 - epsilon)?.add_scalar(epsilon / classes as f64)?
    } else {
        target.clone()
    };
    let mut terms = logits.log_softmax(1)?.mul(&smoothed)?;
    if let Some(weight) = &options.weight {
        if weight.dims() != [classes] || !weight.dtype().is_float() || weight.device() != logits.device() {
            return Err(NnError::invalid(
                WHAT,
                format!(
                    "weight must be a floating-point tensor of shape [{classes}] (one per class) on {}, got {} {:?} on {}",
                    logits.device(),
                    weight.dtype(),
                    weight.dims(),
                    weight.device()
                ),
            ));
        }
        let mut view = vec![1isize; logits.rank()];
        view[1] = classes as isize;
        let weight = weight.to_dtype(logits.dtype())?.reshape(&view)?;
        terms = terms.mul(&Var::new(weight))?;
    }
    let loss = terms.sum(&[1], false)?.neg()?;
    Ok(match options.reduction {
        Reduction::Mean => loss.mean_all()?,
        Reduction::Sum => loss.sum_all()?,
        Reduction::None => loss,
    })
}

/// Logits `[N, C, ...]` or `[C]` of a float dtype, and a target of the same
/// shape, dtype and device.
fn check_probabilities(what: &'static str, logits: &Var, target: &Var) -> Result<()> {
    if !logits.dtype().is_float() {
        return Err(NnError::invalid(what, format!("the input must be floating-point, got {}", logits.dtype())));
    }
    if logits.rank() == 0 {
        return Err(NnError::invalid(
            what,
            format!("the input must be [N, C], [N, C, d1, ...] or [C], got shape {:?}", logits.dims()),
        ));
    }
    if target.dtype() != logits.dtype() {
        return Err(NnError::invalid(
            what,
            format!(
                "class-probability targets must have the input's dtype {}, got {}; convert one of them",
                logits.dtype(),
                target.dtype()
            ),
        ));
    }
    if target.dims() != logits.dims() {
        return Err(NnError::invalid(
            what,
            format!(
                "class-probability targets must have the input's shape {:?}, got {:?} (class indices are i64)",
                logits.dims(),
                target.dims()
            ),
        ));
    }
    if target.device() != logits.device() {
        return Err(NnError::invalid(
            what,
            format!("the input is on {} but the target on {}", logits.device(), target.device()),
        ));
    }
    Ok(())
}
