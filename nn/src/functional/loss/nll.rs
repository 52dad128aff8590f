//! The negative log-likelihood of class indices (PyTorch's `F.nll_loss`):
//! [`nll_loss`] and [`nll_loss_with`], one autograd node that saves only the
//! indices and one coefficient per position.

use super::options::{NllLossOptions, Reduction};
use super::targets::{finish, grad_factor, missing, unbatched, Targets};
use crate::error::Result;
use brasa_autograd::{apply, autocast_inputs, is_grad_enabled, op_names, Function, FunctionCtx, Var};
use brasa_tensor::Tensor;

/// The negative log-likelihood of class indices `target` under `log_probs`
/// (`[N, C]`, `[N, C, d1, ...]` or `[C]`; usually a log-softmax), averaged,
/// with PyTorch's defaults. See [`nll_loss_with`].
pub fn nll_loss(log_probs: &Var, target: &Tensor) -> Result<Var> {
    nll_loss_with(log_probs, target, &NllLossOptions::default())
}

/// PyTorch's `F.nll_loss`: `loss_n = −w_y·input[n, y]` (0 where `y` is
/// ignored); `Mean` divides the sum by `Σ_n w_{y_n}` over the positions not
/// ignored. Checks as [`cross_entropy_with`](super::cross_entropy_with)
/// does.
pub fn nll_loss_with(log_probs: &Var, target: &Tensor, options: &NllLossOptions) -> Result<Var> {
    const WHAT: &str = op_names::NLL_LOSS;
    if let Some(c) = autocast_inputs(WHAT, &[log_probs])? {
        return nll_loss_with(&c[0], target, options);
    }
    if log_probs.rank() == 1 {
        return unbatched(WHAT, log_probs, target, options.reduction, |x, t| nll_loss_with(x, t, options));
    }
    let targets = Targets::new(WHAT, log_probs.tensor(), target, options.weight.as_ref(), options.ignore_index)?;
    let dtype = log_probs.dtype();
    let backward = if is_grad_enabled() && log_probs.requires_grad() {
        let scale = targets.scale(options.reduction);
        let a = targets.class_weight.iter().zip(&targets.counted).map(|(w, &c)| if c { scale * w } else { 0.0 });
        Some(targets.per_position(a.collect(), dtype)?)
    } else {
        None
    };
    let function = NllLoss {
        reduction: options.reduction,
        inverse_total: 1.0 / targets.total_weight,
        pick: Some(targets.per_position(targets.class_weight.clone(), dtype)?),
        counted: targets.counted_mask()?,
        index: Some(targets.index),
        backward,
        input_dims: log_probs.dims().to_vec(),
    };
    Ok(apply(function, &[log_probs])?)
}

/// The NLL node: saves only the indices and one coefficient per position
/// (its gradient is a scatter into zeros, which needs no input values).
struct NllLoss {
    reduction: Reduction,
    inverse_total: f64,
    /// `w[y]` per position.
    pick: Option<Tensor>,
    counted: Option<Tensor>,
    index: Option<Tensor>,
    /// `w[y]` scaled for the reduction, when a gradient is needed.
    backward: Option<Tensor>,
    input_dims: Vec<usize>,
}

impl Function for NllLoss {
    fn name(&self) -> &'static str {
        "nll_loss"
    }

    fn forward(&mut self, ctx: &mut FunctionCtx, inputs: &[Tensor]) -> brasa_autograd::Result<Tensor> {
        let index = self.index.take().ok_or_else(|| missing("nll_loss"))?;
        let pick = self.pick.take().ok_or_else(|| missing("nll_loss"))?;
        let per_position = inputs[0].gather(1, &index)?;
        per_position.mul_(&pick)?;
        if let Some(backward) = self.backward.take() {
            ctx.save_for_backward(&index);
            ctx.save_for_backward(&backward);
        }
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
        let (index, a) = (&saved[0], &saved[1]);
        let scaled = a.mul(&grad_factor(grad, self.reduction)?)?;
        scaled.neg_()?;
        let out = scaled.new_zeros(self.input_dims.clone())?;
        out.scatter_add_(1, index, &scaled)?;
        Ok(vec![Some(out)])
    }
}
