//! Gradient clipping by the norm of the whole model's gradient when each
//! rank holds only a slice of it (DataParallel's owned pieces, FSDP's
//! shards): the squared local norms are summed over the ranks.

use crate::collective::ReduceOp;
use crate::communicator::Communicator;
use crate::error::Result;
use brasa_autograd::{no_grad, Var};
use brasa_nn::optim::grad_norm;
use brasa_tensor::{DType, Tensor};

/// Scales the gradients of `params` (this rank's slices) so that the L2
/// norm of the whole gradient, over every rank, is at most `max_norm`
/// (PyTorch's `clip_grad_norm_` rule: times `max_norm / (norm + 1e-6)` when
/// that is below 1); returns the norm before clipping. A collective: every
/// rank calls it. On meta devices (a plan) there are no values: the norm
/// is 0 and nothing is scaled.
pub(crate) fn clip_grad_norm(comm: &Communicator, params: &[Var], max_norm: f64) -> Result<f64> {
    let _no_grad = no_grad();
    let meta = comm.device().is_meta();
    let local = if params.is_empty() || meta { 0.0 } else { grad_norm(params, 2.0)? };
    let squares = Tensor::full_on([1], local * local, DType::F64, comm.device())?;
    comm.all_reduce(&squares, ReduceOp::Sum)?;
    if meta {
        return Ok(0.0);
    }
    let norm = squares.item::<f64>()?.sqrt();
    let coefficient = max_norm / (norm + 1e-6);
    if coefficient < 1.0 || coefficient.is_nan() {
        for grad in params.iter().filter_map(Var::grad) {
            grad.mul_scalar_(coefficient)?;
        }
    }
    Ok(norm)
}
