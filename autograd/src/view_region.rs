//! Where a view's elements sit in the tensor it was taken from, for the
//! backward of `narrow`, `slice` and `select` (and so of `split`, `chunk`
//! and `unbind`).
//!
//! Such a view's gradient is its output's gradient placed in a gradient of
//! the input that is zero elsewhere. Written as an ordinary backward, every
//! piece of a `split` returns a whole zero-filled gradient and the engine
//! then adds those full-size tensors together: a `qkv` projection split in
//! three costs three zero fills and two full-size additions where PyTorch's
//! one `SplitBackward` writes each piece once. Instead the node hands the
//! engine its [`ViewRegion`] and the engine places each piece into one
//! gradient it owns (`backward.rs`): one zero fill, then each piece copied
//! or added into its region in place.
//!
//! ```
//! use brasa_autograd::Var;
//! use brasa_tensor::{DType, Tensor};
//! let x = Var::param(Tensor::arange(0.0, 6.0, 1.0, DType::F64)?)?;
//! let parts = x.chunk(3, 0)?;
//! parts[0].mul_scalar(2.0)?.add(&parts[2])?.sum_all()?.backward()?;
//! let grad = x.grad().map(|g| g.to_vec::<f64>()).transpose()?;
//! assert_eq!(grad, Some(vec![2.0, 2.0, 0.0, 0.0, 1.0, 1.0]));
//! # Ok::<(), brasa_autograd::AutogradError>(())
//! ```

use crate::error::Result;
use brasa_tensor::Tensor;

/// The elements of a tensor a view selected along one dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ViewRegion {
    /// `len` elements of `dim` from `start` ([`Tensor::narrow`]).
    Narrow { dim: usize, start: usize, len: usize },
    /// Every `step`-th element of `dim` in `start..end` ([`Tensor::slice`]).
    Slice { dim: usize, start: usize, end: usize, step: usize },
    /// Index `index` of `dim`, the dim removed ([`Tensor::select`]).
    Select { dim: usize, index: usize },
}

impl ViewRegion {
    /// The view of `full` (a tensor of the input's shape) that the region
    /// covers: the same view the forward took.
    pub(crate) fn of(self, full: &Tensor) -> Result<Tensor> {
        Ok(match self {
            ViewRegion::Narrow { dim, start, len } => full.narrow(dim, start, len)?,
            ViewRegion::Slice { dim, start, end, step } => full.slice(dim, start, end, step)?,
            ViewRegion::Select { dim, index } => full.select(dim, index)?,
        })
    }
}
