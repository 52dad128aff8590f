//! Cross entropy with class-index targets (PyTorch's `F.cross_entropy`):
//! [`cross_entropy`] and [`cross_entropy_with`] (class weights, label
//! smoothing, `ignore_index`). A floating-point target is sent to
//! [`cross_entropy_probs`], as PyTorch dispatches on the target's dtype.
//!
//! It runs on every training step, so it is one autograd node rather than a
//! chain of ops: its forward computes the log-softmax once (freed before it
//! returns) and saves only the logits it was given, the class indices and a
//! few per-position coefficients; its backward makes the gradient in one
//! softmax buffer and finishes it in place:
//! `(softmax − smoothed one-hot) · weight · grad`.

use super::cross_entropy_probs::cross_entropy_probs;
use super::options::{CrossEntropyOptions, Reduction};
use super::targets::{finish, grad_factor, missing, unbatched, Targets};
use crate::error::{NnError, Result};
use brasa_autograd::{apply, autocast_inputs, is_grad_enabled, op_names, Function, FunctionCtx, Var};
use brasa_tensor::{DType, Tensor};

/// Cross entropy between `logits` (`[N, C]`, `[N, C, d1, ...]` or `[C]`,
/// unnormalised) and class indices `target` (`i64`, `[N]`, `[N, d1, ...]`
/// or `[]`), averaged over the targets, with PyTorch's defaults (`-100` is
/// ignored); or class probabilities of the logits' shape (a floating-point
/// `target`, see [`cross_entropy_probs`]). See
/// [`cross_entropy_with`].
pub fn cross_entropy(logits: &Var, target: &Tensor) -> Result<Var> {
    cross_entropy_with(logits, target, &CrossEntropyOptions::default())
}

/// Cross entropy with options, exactly as PyTorch's `F.cross_entropy` with
/// class-index targets. Per position `n` with target `y` (weights `w`, all 1
/// without `weight`; `ε` the label smoothing; `C` classes):
///
/// `loss_n = −(1 − ε)·w_y·log p_y − (ε/C)·Σ_c w_c·log p_c`, 0 where `y` is ignored;
///
/// `Mean` divides the sum by `Σ_n w_{y_n}` over the positions not ignored
/// (NaN when there are none, as in PyTorch). Errors name the problem: a
/// target out of `0..C`, shapes that do not fit, a non-float `logits`, a
/// non-`i64` target.
///
/// A floating-point `target` holds class probabilities instead (of the
/// logits' shape), as in PyTorch: see [`cross_entropy_probs`],
/// which this calls with the target as a constant.
pub fn cross_entropy_with(logits: &Var, target: &Tensor, options: &CrossEntropyOptions) -> Result<Var> {
    const WHAT: &str = op_names::CROSS_ENTROPY;
    if target.dtype().is_float() {
        return cross_entropy_probs(logits, &Var::new(target.clone()), options);
    }
    if let Some(c) = autocast_inputs(WHAT, &[logits])? {
        return cross_entropy_with(&c[0], target, options);
    }
    let epsilon = options.label_smoothing;
    if !(0.0..=1.0).contains(&epsilon) {
        return Err(NnError::invalid(WHAT, format!("label_smoothing must be in [0, 1], got {epsilon}")));
    }
    if logits.rank() == 1 {
        return unbatched(WHAT, logits, target, options.reduction, |x, t| cross_entropy_with(x, t, options));
    }
    let targets = Targets::new(WHAT, logits.tensor(), target, options.weight.as_ref(), options.ignore_index)?;
    let dtype = logits.dtype();
    let classes = targets.classes as f64;
    let keep = epsilon * targets.weight_sum / classes;
    // Forward coefficients: the picked log-probability's and the smoothing sum's.
    let pick: Vec<f64> = targets.class_weight.iter().map(|w| (1.0 - epsilon) * w).collect();
    let smooth: Vec<f64> = targets.counted.iter().map(|&c| if c { epsilon / classes } else { 0.0 }).collect();
    let smoothing = match (epsilon > 0.0, &options.weight) {
        (false, _) => Smoothing::Off,
        (true, None) => Smoothing::Uniform,
        (true, Some(_)) => Smoothing::Weighted,
    };
    let weight_view = match (&smoothing, &options.weight) {
        (Smoothing::Weighted, Some(w)) => Some(class_view(w, logits.rank(), dtype)?),
        _ => None,
    };
    let backward = if is_grad_enabled() && logits.requires_grad() {
        // dL/dx = G·(A·softmax − B·one_hot − S·w) with G the output's gradient.
        let scale = targets.scale(options.reduction);
        let a: Vec<f64> =
            pick.iter().zip(&targets.counted).map(|(b, &c)| if c { scale * (b + keep) } else { 0.0 }).collect();
        let mut tensors = vec![targets.per_position(a, dtype)?];
        if !matches!(smoothing, Smoothing::Off) {
            tensors.push(targets.per_position(pick.iter().map(|b| scale * b).collect(), dtype)?);
            tensors.push(targets.per_position(smooth.iter().map(|s| scale * s).collect(), dtype)?);
        }
        tensors.extend(weight_view.clone());
        Some(tensors)
    } else {
        None
    };
    let function = CrossEntropy {
        reduction: options.reduction,
        smoothing,
        inverse_total: 1.0 / targets.total_weight,
        pick: Some(targets.per_position(pick, dtype)?),
        smooth: if epsilon > 0.0 { Some(targets.per_position(smooth, dtype)?) } else { None },
        counted: targets.counted_mask()?,
        weight_view,
        index: Some(targets.index),
        backward,
    };
    Ok(apply(function, &[logits])?)
}

/// `weight` (`[C]`) as `[1, C, 1, ...]` of `rank` dims in `dtype`.
fn class_view(weight: &Tensor, rank: usize, dtype: DType) -> Result<Tensor> {
    let mut shape = vec![1isize; rank];
    shape[1] = weight.numel() as isize;
    Ok(weight.to_dtype(dtype)?.reshape(&shape)?)
}

/// How the label smoothing term enters the gradient.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Smoothing {
    /// `ε = 0`.
    Off,
    /// `ε > 0`, no class weights: `− S·1`.
    Uniform,
    /// `ε > 0` with class weights: `− S·w`.
    Weighted,
}

/// The cross-entropy node. The tensors are moved into the forward, which
/// saves the backward's through the context (so they are released after
/// backward, as every op's are).
struct CrossEntropy {
    reduction: Reduction,
    smoothing: Smoothing,
    /// `1 / Σ w[y]`, for the mean.
    inverse_total: f64,
    /// `(1 − ε)·w[y]` per position.
    pick: Option<Tensor>,
    /// `ε/C` per counted position (with label smoothing).
    smooth: Option<Tensor>,
    counted: Option<Tensor>,
    /// The class weights as `[1, C, 1, ...]` (weighted smoothing only).
    weight_view: Option<Tensor>,
    index: Option<Tensor>,
    /// `[A, B, S, w]` (`[A]` without smoothing), scaled for the reduction;
    /// `None` when no gradient is needed.
    backward: Option<Vec<Tensor>>,
}

impl Function for CrossEntropy {
    fn name(&self) -> &'static str {
        "cross_entropy"
    }

    fn forward(&mut self, ctx: &mut FunctionCtx, inputs: &[Tensor]) -> brasa_autograd::Result<Tensor> {
        let logits = &inputs[0];
        let index = self.index.take().ok_or_else(|| missing("cross_entropy"))?;
        let pick = self.pick.take().ok_or_else(|| missing("cross_entropy"))?;
        let log_probs = logits.log_softmax(1)?;
        let per_position = log_probs.gather(1, &index)?;
        per_position.mul_(&pick)?;
        if let Some(smooth) = self.smooth.take() {
            let total = match &self.weight_view {
                Some(w) => log_probs.mul(w)?.sum(&[1], true)?,
                None => log_probs.sum(&[1], true)?,
            };
            per_position.addcmul_(1.0, &total, &smooth)?;
        }
        drop(log_probs);
        if let Some(backward) = self.backward.take() {
            ctx.save_for_backward(logits);
            ctx.save_for_backward(&index);
            backward.iter().for_each(|t| ctx.save_for_backward(t));
        }
        self.weight_view = None;
        finish(per_position, self.counted.take().as_ref(), self.reduction, self.inverse_total)
    }

    fn backward(
        &mut self,
        saved: &[Tensor],
        grad: &Tensor,
        needs: &[bool],
    ) -> brasa_autograd::Result<Vec<Option<Tensor>>> {
        if !needs.first().copied().unwrap_or(false) {
            return Ok(vec![None]);
        }
        let (logits, index, a) = (&saved[0], &saved[1], &saved[2]);
        let factor = grad_factor(grad, self.reduction)?;
        let out = logits.softmax(1)?;
        let scaled = a.mul(&factor)?;
        out.mul_(&scaled)?;
        if self.smoothing == Smoothing::Off {
            // B = A: subtract it at the target.
            scaled.neg_()?;
            out.scatter_add_(1, index, &scaled)?;
        } else {
            let at_target = saved[3].mul(&factor)?;
            at_target.neg_()?;
            out.scatter_add_(1, index, &at_target)?;
            let spread = saved[4].mul(&factor)?;
            match self.smoothing {
                Smoothing::Weighted => out.addcmul_(-1.0, &spread, &saved[5])?,
                _ => out.sub_(&spread)?,
            }
        }
        Ok(vec![Some(out)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cross_entropy_saves_the_logits_and_small_tensors_only() -> Result<()> {
        let logits = Var::param(Tensor::randn([64, 100], DType::F32)?)?;
        let target = Tensor::from_vec((0..64).map(|i| i % 100).collect::<Vec<i64>>(), [64])?;
        let loss = cross_entropy(&logits, &target)?;
        let stats = loss.graph_stats();
        // The logits (shared with the input, 64·100·4 bytes) plus index and one
        // coefficient per sample: no log-softmax buffer is kept.
        assert!(stats.saved_bytes <= 64 * 100 * 4 + 64 * 8 + 64 * 4 + 2048, "{stats:?}");
        Ok(())
    }

    #[test]
    fn no_graph_and_no_backward_coefficients_without_grad() -> Result<()> {
        let logits = Var::new(Tensor::randn([4, 3], DType::F32)?);
        let target = Tensor::from_vec(vec![0i64, 1, 2, 0], [4])?;
        let loss = cross_entropy(&logits, &target)?;
        assert!(!loss.requires_grad());
        Ok(())
    }
}
