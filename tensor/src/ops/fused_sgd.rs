//! SGD (with momentum, dampening, Nesterov, weight decay, maximize) as one
//! fused in-place update over a list of parameters (PyTorch's
//! `torch._fused_sgd_`, what `SGD(fused=True)` calls): each parameter's
//! elements, gradient and momentum buffer are read and written once,
//! instead of by up to five in-place ops each walking the tensors again. The
//! result equals the composed update bit for bit (`brasa_kernels::optim`).
//!
//! ```
//! use brasa_tensor::{fused_sgd_, DType, SgdOptions, SgdParam, Tensor};
//! let p = Tensor::ones([3], DType::F32)?;
//! let g = Tensor::from_vec(vec![0.5f32, -0.5, 0.0], [3])?;
//! let buffer = p.zeros_like()?;
//! let options = SgdOptions { lr: 0.1, momentum: 0.9, ..SgdOptions::default() };
//! // The first step starts the momentum buffer at the gradient...
//! fused_sgd_(&[SgdParam::new(&p, &g, Some(&buffer), true)], options)?;
//! assert_eq!(buffer.to_vec::<f32>()?, [0.5, -0.5, 0.0]);
//! assert_eq!(p.to_vec::<f32>()?, [0.95, 1.05, 1.0]);
//! // ...later ones add the gradient to the decayed buffer.
//! fused_sgd_(&[SgdParam::new(&p, &g, Some(&buffer), false)], options)?;
//! assert_eq!(buffer.to_vec::<f32>()?, [0.95, -0.95, 0.0]);
//! # Ok::<(), brasa_tensor::TensorError>(())
//! ```

use crate::backend::{ops_for, SgdUpdate};
use crate::error::{Result, TensorError};
use crate::ops::common::{by_device, expect_float};
use crate::tensor::Tensor;
use brasa_kernels::optim::SgdCoefficients;

const OP: &str = "fused_sgd_";

/// One parameter of [`fused_sgd_`]: the tensor, its gradient (any layout)
/// and its momentum buffer (needed with momentum; contiguous, like the
/// parameter), all of one shape, dtype and device, and whether this is the
/// parameter's first step with momentum.
#[derive(Clone, Copy, Debug)]
pub struct SgdParam<'a> {
    /// The parameter, updated in place.
    pub param: &'a Tensor,
    /// Its gradient.
    pub grad: &'a Tensor,
    /// The momentum buffer, updated in place (with `momentum != 0` only).
    pub momentum_buffer: Option<&'a Tensor>,
    /// The parameter's first step: the buffer is set to `±grad + wd·param`
    /// (as PyTorch's `buf = clone(d)`, without dampening), not read.
    pub first_step: bool,
}

impl<'a> SgdParam<'a> {
    /// A parameter with its gradient, its momentum buffer (`None` for plain
    /// SGD) and whether this is its first step.
    pub fn new(param: &'a Tensor, grad: &'a Tensor, momentum_buffer: Option<&'a Tensor>, first_step: bool) -> Self {
        SgdParam { param, grad, momentum_buffer, first_step }
    }
}

/// The hyperparameters of [`fused_sgd_`]; the default is PyTorch's `SGD()`
/// (lr 1e-3, no momentum, dampening or weight decay). As in PyTorch's
/// fused op they are not validated here (`brasa-nn`'s `SgdConfig` is).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdOptions {
    /// The learning rate.
    pub lr: f64,
    /// The momentum factor; 0 is plain SGD, which has no buffer.
    pub momentum: f64,
    /// The dampening of the momentum's new term.
    pub dampening: f64,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// Ascend rather than descend.
    pub maximize: bool,
}

impl Default for SgdOptions {
    fn default() -> Self {
        SgdOptions { lr: 1e-3, momentum: 0.0, dampening: 0.0, weight_decay: 0.0, nesterov: false, maximize: false }
    }
}

impl SgdOptions {
    /// The coefficients of one parameter's update.
    fn coefficients(&self, first_step: bool) -> SgdCoefficients {
        SgdCoefficients {
            lr: self.lr,
            momentum: self.momentum,
            dampening: self.dampening,
            weight_decay: self.weight_decay,
            nesterov: self.nesterov,
            maximize: self.maximize,
            first_step,
        }
    }

    /// Whether the update keeps a momentum buffer (the kernels test the
    /// same `momentum == 0`).
    fn has_momentum(&self) -> bool {
        self.momentum != 0.0
    }
}

fn invalid(index: usize, problem: impl std::fmt::Display) -> TensorError {
    TensorError::invalid(OP, format!("parameter {index}: {problem}"))
}

fn check_param(index: usize, p: &SgdParam<'_>, momentum: bool) -> Result<()> {
    expect_float(OP, p.param)?;
    let named = |what: &str, t: &Tensor| -> Result<()> {
        let problem = if t.dims() != p.param.dims() {
            Some(format!("shape {:?}, the parameter {:?}", t.dims(), p.param.dims()))
        } else if t.dtype() != p.param.dtype() {
            Some(format!("dtype {}, the parameter {}", t.dtype(), p.param.dtype()))
        } else if t.device() != p.param.device() {
            Some(format!("device {}, the parameter {}", t.device(), p.param.device()))
        } else {
            None
        };
        match problem {
            Some(problem) => Err(invalid(index, format!("{what} has {problem}"))),
            None => Ok(()),
        }
    };
    named("grad", p.grad)?;
    let buffer = match (p.momentum_buffer, momentum) {
        (Some(buffer), true) => {
            named("momentum_buffer", buffer)?;
            Some(buffer)
        }
        (None, true) => return Err(invalid(index, "momentum needs momentum_buffer")),
        // Plain SGD keeps no state: a buffer given anyway is not touched.
        (_, false) => None,
    };
    if !p.param.is_contiguous() || buffer.is_some_and(|b| !b.is_contiguous()) {
        return Err(invalid(index, "the parameter and its momentum buffer must be contiguous (updated in place)"));
    }
    // Each device's kernel writes the buffer while it reads the parameter
    // (and the gradient while it writes both): overlapping memory would
    // make the result depend on the element order, so it is refused here,
    // for every device alike.
    if buffer.is_some_and(|b| b.shares_storage_with(p.param)) {
        return Err(invalid(index, "the momentum buffer shares the parameter's storage; give it its own memory"));
    }
    Ok(())
}

/// SGD on every parameter of `params` in place, each parameter in one pass
/// over its memory. Every parameter is checked before any is written:
/// shapes, dtypes and devices of its gradient and momentum buffer must
/// match it, the buffer must be given when `options.momentum != 0`, and the
/// written tensors must be contiguous. Parameters may live on different
/// devices and have different float dtypes.
pub fn fused_sgd_(params: &[SgdParam<'_>], options: SgdOptions) -> Result<()> {
    let _range = brasa_profile::record_op(OP, &[]);
    let momentum = options.has_momentum();
    for (index, p) in params.iter().enumerate() {
        check_param(index, p, momentum)?;
    }
    let mut updates = Vec::with_capacity(params.len());
    for (index, p) in params.iter().enumerate() {
        let grad = p.grad.contiguous()?;
        // A contiguous gradient is used in place, so it may still share the
        // memory being written (a non-contiguous one was copied).
        let buffer = p.momentum_buffer.filter(|_| momentum);
        if grad.shares_storage_with(p.param) || buffer.is_some_and(|b| grad.shares_storage_with(b)) {
            return Err(invalid(index, "the gradient shares the storage of a tensor the update writes"));
        }
        updates.push(SgdUpdate {
            param: p.param,
            grad,
            momentum_buffer: buffer,
            coefficients: options.coefficients(p.first_step),
        });
    }
    // One call per device, in the order the devices first appear.
    for (device, on_device) in by_device(&updates, |u| u.param.device()) {
        ops_for(device)?.sgd_step(&on_device)?;
        // As the composed in-place ops do: autograd compares versions to
        // catch a tensor it saved being changed under it.
        for u in on_device {
            u.param.storage().bump_version();
            if let Some(buffer) = u.momentum_buffer {
                buffer.storage().bump_version();
            }
        }
    }
    Ok(())
}
