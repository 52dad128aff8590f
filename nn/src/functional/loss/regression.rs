//! The regression losses (PyTorch's `F.mse_loss` and `F.l1_loss`): short
//! compositions of `Var` ops over an input and a target of one shape.

use super::options::Reduction;
use super::targets::check_pair;
use crate::error::Result;
use brasa_autograd::{autocast_inputs, op_names, Var};

/// Mean squared error `(input − target)²`, reduced (PyTorch's `F.mse_loss`).
/// Both must have the same shape and dtype (PyTorch only warns about a
/// broadcast here; it is nearly always a bug, so it is an error). Gradients
/// flow to both.
pub fn mse_loss(input: &Var, target: &Var, reduction: Reduction) -> Result<Var> {
    if let Some(c) = autocast_inputs(op_names::MSE_LOSS, &[input, target])? {
        return mse_loss(&c[0], &c[1], reduction);
    }
    check_pair(op_names::MSE_LOSS, input, target)?;
    let diff = input.sub(target)?;
    reduce(&diff.mul(&diff)?, reduction)
}

/// Mean absolute error `|input − target|`, reduced (PyTorch's `F.l1_loss`;
/// the gradient at 0 is 0). Same checks as [`mse_loss`].
pub fn l1_loss(input: &Var, target: &Var, reduction: Reduction) -> Result<Var> {
    if let Some(c) = autocast_inputs(op_names::L1_LOSS, &[input, target])? {
        return l1_loss(&c[0], &c[1], reduction);
    }
    check_pair(op_names::L1_LOSS, input, target)?;
    reduce(&input.sub(target)?.abs()?, reduction)
}

/// `loss` combined as `reduction` says.
fn reduce(loss: &Var, reduction: Reduction) -> Result<Var> {
    Ok(match reduction {
        Reduction::Mean => loss.mean_all()?,
        Reduction::Sum => loss.sum_all()?,
        Reduction::None => loss.clone(),
    })
}
