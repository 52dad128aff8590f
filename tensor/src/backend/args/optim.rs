//! Fused optimizer updates, one parameter each, as a device runs them.

use crate::tensor::Tensor;
use brasa_kernels::optim::{AdamCoefficients, SgdCoefficients};

/// One parameter's Adam update as a device runs it: its tensors (gradient
/// made contiguous) and coefficients.
pub(crate) struct AdamUpdate<'a> {
    /// The parameter (contiguous).
    pub param: &'a Tensor,
    /// Its gradient (contiguous).
    pub grad: Tensor,
    /// `[exp_avg, exp_avg_sq]` and, with amsgrad, `max_exp_avg_sq`.
    pub state: Vec<&'a Tensor>,
    /// What the element loop needs.
    pub coefficients: AdamCoefficients,
}

/// One parameter's SGD update as a device runs it: its tensors (gradient
/// made contiguous) and coefficients.
pub(crate) struct SgdUpdate<'a> {
    /// The parameter (contiguous).
    pub param: &'a Tensor,
    /// Its gradient (contiguous).
    pub grad: Tensor,
    /// The momentum buffer (contiguous), present exactly when the
    /// coefficients have momentum.
    pub momentum_buffer: Option<&'a Tensor>,
    /// What the element loop needs.
    pub coefficients: SgdCoefficients,
}
