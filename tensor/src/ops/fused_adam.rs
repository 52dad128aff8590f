//! Adam and AdamW as one fused in-place update over a list of parameters
//! (PyTorch's `torch._fused_adam_`, what `Adam(fused=True)` calls): each
//! parameter's elements, gradient and moments are read and written once,
//! instead of by six in-place ops each walking the tensors again. The result
//! equals the composed update bit for bit (`brasa_kernels::optim`).
//!
//! ```
//! use brasa_tensor::{fused_adam_, AdamOptions, AdamParam, DType, Tensor};
//! let p = Tensor::ones([3], DType::F32)?;
//! let g = Tensor::from_vec(vec![0.5f32, -0.5, 0.0], [3])?;
//! let (m, v) = (p.zeros_like()?, p.zeros_like()?);
//! let options = AdamOptions { decoupled: true, weight_decay: 1e-2, ..AdamOptions::default() };
//! fused_adam_(&[AdamParam::new(&p, &g, &m, &v, 1)], options)?;
//! let after = p.to_vec::<f32>()?;
//! // AdamW: decay by lr·wd, then about lr against the gradient's sign.
//! assert!((after[0] - (0.99999 - 1e-3)).abs() < 1e-6 && (after[2] - 0.99999).abs() < 1e-7);
//! # Ok::<(), brasa_tensor::TensorError>(())
//! ```

use crate::backend::{ops_for, AdamUpdate};
use crate::error::{Result, TensorError};
use crate::ops::common::{by_device, expect_float};
use crate::tensor::Tensor;
use brasa_kernels::optim::AdamCoefficients;

const OP: &str = "fused_adam_";

/// One parameter of [`fused_adam_`]: the tensor, its gradient and its
/// optimizer state (contiguous, the parameter's shape, dtype and device; the
/// gradient may be any layout), and the step number this update makes (1 for
/// the first).
#[derive(Clone, Copy, Debug)]
pub struct AdamParam<'a> {
    /// The parameter, updated in place.
    pub param: &'a Tensor,
    /// Its gradient.
    pub grad: &'a Tensor,
    /// The first moment, updated in place.
    pub exp_avg: &'a Tensor,
    /// The second moment, updated in place.
    pub exp_avg_sq: &'a Tensor,
    /// The running maximum of the second moment (amsgrad only).
    pub max_exp_avg_sq: Option<&'a Tensor>,
    /// The step this update makes, counted per parameter from 1.
    pub step: u64,
}

impl<'a> AdamParam<'a> {
    /// A parameter without amsgrad's buffer.
    pub fn new(param: &'a Tensor, grad: &'a Tensor, exp_avg: &'a Tensor, exp_avg_sq: &'a Tensor, step: u64) -> Self {
        AdamParam { param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq: None, step }
    }
}

/// The hyperparameters of [`fused_adam_`]; the default is PyTorch's
/// `Adam()` (lr 1e-3, betas (0.9, 0.999), eps 1e-8, no weight decay).
/// `decoupled` with a weight decay is AdamW (PyTorch's `AdamW()` default
/// decay is 1e-2).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamOptions {
    /// The learning rate.
    pub lr: f64,
    /// `(β1, β2)`.
    pub betas: (f64, f64),
    /// Added to the denominator.
    pub eps: f64,
    /// L2 penalty, or with `decoupled` AdamW's decay.
    pub weight_decay: f64,
    /// AdamW: decay the parameter (`p ·= 1 − lr·wd`) rather than the gradient.
    pub decoupled: bool,
    /// Divide by the running maximum of the second moment.
    pub amsgrad: bool,
    /// Ascend rather than descend.
    pub maximize: bool,
}

impl Default for AdamOptions {
    fn default() -> Self {
        AdamOptions {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
            amsgrad: false,
            maximize: false,
        }
    }
}

impl AdamOptions {
    /// The coefficients of one parameter's update at `step`.
    fn coefficients(&self, step: u64) -> AdamCoefficients {
        AdamCoefficients {
            decoupled: self.decoupled,
            amsgrad: self.amsgrad,
            maximize: self.maximize,
            ..AdamCoefficients::for_step(self.lr, self.betas, self.eps, self.weight_decay, step)
        }
    }
}

fn check_param(index: usize, p: &AdamParam<'_>, amsgrad: bool) -> Result<()> {
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
            Some(problem) => Err(TensorError::invalid(OP, format!("parameter {index}: {what} has {problem}"))),
            None => Ok(()),
        }
    };
    named("grad", p.grad)?;
    named("exp_avg", p.exp_avg)?;
    named("exp_avg_sq", p.exp_avg_sq)?;
    match (p.max_exp_avg_sq, amsgrad) {
        (Some(max), true) => named("max_exp_avg_sq", max)?,
        (None, true) => {
            return Err(TensorError::invalid(OP, format!("parameter {index}: amsgrad needs max_exp_avg_sq")));
        }
        _ => {}
    }
    let written = [Some(p.param), Some(p.exp_avg), Some(p.exp_avg_sq), p.max_exp_avg_sq.filter(|_| amsgrad)];
    if written.into_iter().flatten().any(|t| !t.is_contiguous()) {
        return Err(TensorError::invalid(
            OP,
            format!("parameter {index}: the parameter and its state must be contiguous (updated in place)"),
        ));
    }
    if p.step == 0 {
        return Err(TensorError::invalid(OP, format!("parameter {index}: steps count from 1, got 0")));
    }
    Ok(())
}

/// Adam (or AdamW with `options.decoupled`) on every parameter of `params`
/// in place, each parameter in one pass over its memory. Every parameter is
/// checked before any is written: shapes, dtypes and devices of its
/// gradient and state must match it, and the written tensors must be
/// contiguous. Parameters may live on different devices and have different
/// float dtypes.
pub fn fused_adam_(params: &[AdamParam<'_>], options: AdamOptions) -> Result<()> {
    let _range = brasa_profile::record_op(OP, &[]);
    for (index, p) in params.iter().enumerate() {
        check_param(index, p, options.amsgrad)?;
    }
    let mut updates = Vec::with_capacity(params.len());
    for p in params {
        let mut state = vec![p.exp_avg, p.exp_avg_sq];
        state.extend(p.max_exp_avg_sq.filter(|_| options.amsgrad));
        updates.push(AdamUpdate {
            param: p.param,
            grad: p.grad.contiguous()?,
            state,
            coefficients: options.coefficients(p.step),
        });
    }
    // One call per device, in the order the devices first appear.
    for (device, on_device) in by_device(&updates, |u| u.param.device()) {
        ops_for(device)?.adam_step(&on_device)?;
        // As the composed in-place ops do: autograd compares versions to
        // catch a tensor it saved being changed under it.
        for u in on_device {
            u.param.storage().bump_version();
            for state in &u.state {
                state.storage().bump_version();
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Device};

    /// The composed update (brasa-nn's before fusion), with Tensor ops.
    fn composed(p: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor, o: AdamOptions, t: u64) {
        let c = o.coefficients(t);
        if o.decoupled && o.weight_decay != 0.0 {
            p.mul_scalar_(1.0 - o.lr * o.weight_decay).unwrap();
        }
        m.lerp_(g, 1.0 - o.betas.0).unwrap();
        v.mul_scalar_(o.betas.1).unwrap();
        v.addcmul_(1.0 - o.betas.1, g, g).unwrap();
        let denom = v.sqrt().unwrap();
        denom.affine_(c.inv_bias_correction2_sqrt, o.eps).unwrap();
        p.addcdiv_(-c.step_size, m, &denom).unwrap();
    }

    #[test]
    fn the_update_bumps_the_versions_of_what_it_writes() {
        // Autograd compares versions to catch a saved tensor changed in
        // place: the fused update counts as a write, as the composed ops do.
        let p = Tensor::ones([4], DType::F32).unwrap();
        let g = Tensor::ones([4], DType::F32).unwrap();
        let (m, v) = (p.zeros_like().unwrap(), p.zeros_like().unwrap());
        let before = [p.version(), g.version(), m.version(), v.version()];
        let param = AdamParam { param: &p, grad: &g, exp_avg: &m, exp_avg_sq: &v, max_exp_avg_sq: None, step: 1 };
        fused_adam_(&[param], AdamOptions::default()).unwrap();
        assert!(p.version() > before[0] && m.version() > before[2] && v.version() > before[3]);
        assert_eq!(g.version(), before[1], "the gradient is only read");
    }

    #[test]
    fn equals_the_composed_update_on_many_parameters_and_dtypes() {
        let options = AdamOptions { decoupled: true, weight_decay: 1e-2, ..AdamOptions::default() };
        for dtype in [DType::F32, DType::BF16, DType::F64] {
            // One large parameter (split into parallel chunks), two tiny
            // ones, and thirty small ones that together go to the threads a
            // parameter at a time; two-dim gradients arrive transposed.
            let mut shapes: Vec<&[usize]> = vec![&[400, 400], &[7], &[3, 4]];
            shapes.extend(std::iter::repeat_n(&[70usize, 70][..], 30));
            let n = shapes.len();
            let params: Vec<Tensor> =
                shapes.iter().map(|s| Tensor::randn(*s, DType::F32).unwrap().to_dtype(dtype).unwrap()).collect();
            let copies: Vec<Tensor> = params
                .iter()
                .map(|p| {
                    let copy = p.zeros_like().unwrap();
                    copy.copy_(p).unwrap();
                    copy
                })
                .collect();
            let state = |ps: &[Tensor]| {
                ps.iter().map(|p| (p.zeros_like().unwrap(), p.zeros_like().unwrap())).collect::<Vec<_>>()
            };
            let (fused_state, composed_state) = (state(&params), state(&copies));
            for t in 1..=3 {
                let grads: Vec<Tensor> = shapes
                    .iter()
                    .map(|s| {
                        // Two-dim gradients arrive transposed (not contiguous).
                        let mut r: Vec<usize> = s.to_vec();
                        r.reverse();
                        let g = Tensor::randn(r, DType::F32).unwrap().to_dtype(dtype).unwrap();
                        if s.len() == 2 {
                            g.t().unwrap()
                        } else {
                            g
                        }
                    })
                    .collect();
                let list: Vec<AdamParam<'_>> = (0..n)
                    .map(|i| AdamParam::new(&params[i], &grads[i], &fused_state[i].0, &fused_state[i].1, t))
                    .collect();
                fused_adam_(&list, options).unwrap();
                for i in 0..n {
                    composed(
                        &copies[i],
                        &grads[i].contiguous().unwrap(),
                        &composed_state[i].0,
                        &composed_state[i].1,
                        options,
                        t,
                    );
                }
            }
            for i in 0..n {
                assert_eq!(
                    params[i].to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
                    copies[i].to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
                    "{dtype} parameter {i}"
                );
            }
        }
    }

    #[test]
    fn bad_lists_are_refused_before_anything_is_written() {
        let p = Tensor::ones([4], DType::F32).unwrap();
        let good = (p.zeros_like().unwrap(), p.zeros_like().unwrap(), p.zeros_like().unwrap());
        let q = Tensor::ones([4], DType::F32).unwrap();
        let short = Tensor::zeros([3], DType::F32).unwrap();
        let list = [AdamParam::new(&p, &good.0, &good.1, &good.2, 1), AdamParam::new(&q, &short, &good.1, &good.2, 1)];
        // Each refusal is an `Invalid` naming the op; the message names the
        // parameter and what is wrong with it (the variant carries no more).
        let refused = |list: &[AdamParam<'_>], options: AdamOptions| {
            let error = fused_adam_(list, options).unwrap_err();
            assert!(matches!(error, TensorError::Invalid { op: "fused_adam_", .. }), "{error:?}");
            error.to_string()
        };
        let error = refused(&list, AdamOptions::default());
        assert!(error.contains("parameter 1: grad has shape [3], the parameter [4]"), "{error}");
        assert_eq!(p.to_vec::<f32>().unwrap(), [1.0; 4], "parameter 0 was not written");
        let error = refused(
            &[AdamParam::new(&p, &good.0, &good.1, &good.2, 1)],
            AdamOptions { amsgrad: true, ..AdamOptions::default() },
        );
        assert!(error.contains("amsgrad needs max_exp_avg_sq"), "{error}");
        let half = Tensor::zeros([4], DType::BF16).unwrap();
        let error = refused(&[AdamParam::new(&p, &good.0, &half, &good.2, 1)], AdamOptions::default());
        assert!(error.contains("exp_avg has dtype bf16, the parameter f32"), "{error}");
        let wide = Tensor::zeros([4, 2], DType::F32).unwrap();
        let strided = wide.narrow(1, 0, 1).unwrap().reshape(&[4]).unwrap();
        if !strided.is_contiguous() {
            let error = refused(&[AdamParam::new(&strided, &good.0, &good.1, &good.2, 1)], AdamOptions::default());
            assert!(error.contains("must be contiguous"), "{error}");
        }
        // The moments may not share the parameter's memory.
        let error = refused(&[AdamParam::new(&p, &good.0, &p, &good.2, 1)], AdamOptions::default());
        assert!(error.contains("share one storage"), "{error}");
        assert_eq!(Device::CPU, p.device());
    }
}
