//! Fused optimizer steps: SGD (with momentum) and Adam/AdamW in one pass
//! per element, reading the parameter, its gradient and its state once and
//! writing them once (PyTorch's `fused=True` SGD and Adam). Each element
//! replays exactly the sequence of in-place tensor ops of the composed
//! update (`brasa-nn`'s `Sgd::update`: `affine`, `mul_scalar_`,
//! `add_scaled_`; `Adam::update`: `mul_scalar_`, `lerp_`, `addcmul_`,
//! `sqrt_`, `affine_`, `addcdiv_`), each intermediate rounded to the element
//! type where that update stores it, so the fused and the composed steps
//! agree bit for bit — as the CUDA kernels `sgd_step_<T>` and `adam_step_<T>`
//! (`kernels/cuda/optim.cu`) do.
//!
//! ```
//! use brasa_kernels::optim::{adam_step, AdamCoefficients};
//! let c = AdamCoefficients::for_step(1e-3, (0.9, 0.999), 1e-8, 0.0, 1);
//! let (mut p, mut m, mut v) = ([1.0f32; 2], [0.0f32; 2], [0.0f32; 2]);
//! adam_step(&c, &mut p, &[0.5, -0.5], &mut m, &mut v, None)?;
//! // The first Adam step moves each parameter by about lr against its gradient's sign.
//! assert!((p[0] - 0.999).abs() < 1e-6 && (p[1] - 1.001).abs() < 1e-6);
//! # Ok::<(), brasa_kernels::KernelError>(())
//! ```
//!
//! ```
//! use brasa_kernels::optim::{sgd_step, SgdCoefficients};
//! let c = SgdCoefficients { lr: 0.5, momentum: 0.9, first_step: true, ..SgdCoefficients::default() };
//! let (mut p, mut buf) = ([1.0f32; 2], [0.0f32; 2]);
//! sgd_step(&c, &mut p, &[0.5, -0.5], Some(&mut buf))?;
//! // The first momentum step starts the buffer at the gradient.
//! assert_eq!((p, buf), ([0.75, 1.25], [0.5, -0.5]));
//! # Ok::<(), brasa_kernels::KernelError>(())
//! ```

use crate::elementwise::maximum;
use crate::error::{KernelError, Result};
use crate::scalar::{Float, FloatElement};

/// Everything one parameter's Adam step needs besides its tensors.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamCoefficients {
    /// The learning rate.
    pub lr: f64,
    /// `β1`, the first moment's decay.
    pub beta1: f64,
    /// `β2`, the second moment's decay.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
    /// L2 penalty (Adam) or decoupled decay (AdamW).
    pub weight_decay: f64,
    /// `lr / (1 − β1^t)`.
    pub step_size: f64,
    /// `1 / √(1 − β2^t)`.
    pub inv_bias_correction2_sqrt: f64,
    /// AdamW's decoupled weight decay (`p ·= 1 − lr·wd`) rather than L2.
    pub decoupled: bool,
    /// Use the running maximum of the second moment.
    pub amsgrad: bool,
    /// Ascend rather than descend.
    pub maximize: bool,
}

impl AdamCoefficients {
    /// Plain Adam's coefficients at step `t` (1 for the first), the bias
    /// corrections computed in f64 as PyTorch computes them in Python floats.
    pub fn for_step(lr: f64, (beta1, beta2): (f64, f64), eps: f64, weight_decay: f64, t: u64) -> AdamCoefficients {
        let t = t as f64;
        let bias_correction1 = 1.0 - beta1.powf(t);
        let bias_correction2_sqrt = (1.0 - beta2.powf(t)).powf(0.5);
        AdamCoefficients {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            step_size: lr / bias_correction1,
            inv_bias_correction2_sqrt: 1.0 / bias_correction2_sqrt,
            decoupled: false,
            amsgrad: false,
            maximize: false,
        }
    }
}

fn check(kernel: &str, what: &str, len: usize, n: usize) -> Result<()> {
    if len == n {
        Ok(())
    } else {
        Err(KernelError::ShapeMismatch { detail: format!("{kernel}: {what} has {len} elements, the parameter {n}") })
    }
}

/// One Adam (or AdamW) step of `param` from `grad`, updating the moments
/// `exp_avg` and `exp_avg_sq` (and `max_exp_avg_sq`, needed with amsgrad)
/// in place; every slice has the parameter's length.
pub fn adam_step<T: FloatElement>(
    c: &AdamCoefficients,
    param: &mut [T],
    grad: &[T],
    exp_avg: &mut [T],
    exp_avg_sq: &mut [T],
    max_exp_avg_sq: Option<&mut [T]>,
) -> Result<()> {
    let n = param.len();
    check("adam_step", "grad", grad.len(), n)?;
    check("adam_step", "exp_avg", exp_avg.len(), n)?;
    check("adam_step", "exp_avg_sq", exp_avg_sq.len(), n)?;
    let from = <T::Compute as Float>::from_f64;
    let l2 = !c.decoupled && c.weight_decay != 0.0;
    let decay = from(1.0 - c.lr * c.weight_decay);
    let wd = from(c.weight_decay);
    let w1 = from(1.0 - c.beta1);
    let b2 = from(c.beta2);
    let w2 = from(1.0 - c.beta2);
    let (denom_mul, denom_add) = (from(c.inv_bias_correction2_sqrt), from(c.eps));
    let neg_step = from(-c.step_size);
    let max = match (c.amsgrad, max_exp_avg_sq) {
        (true, Some(max)) => {
            check("adam_step", "max_exp_avg_sq", max.len(), n)?;
            Some(max)
        }
        (true, None) => {
            return Err(KernelError::ShapeMismatch { detail: "adam_step: amsgrad needs max_exp_avg_sq".into() })
        }
        (false, _) => None,
    };
    // One element's update; the flags are the same for every element, so
    // the compiler hoists their tests out of the zipped loops below.
    let element = |p: &mut T, g: T, m: &mut T, v: &mut T, max: Option<&mut T>| {
        let mut pv = *p;
        if c.decoupled && c.weight_decay != 0.0 {
            pv = T::store(pv.load() * decay);
        }
        let mut g = g;
        if c.maximize {
            g = T::store(-g.load());
        }
        if l2 {
            g = T::store(g.load() + wd * pv.load());
        }
        let m_old = m.load();
        let m_new = T::store(m_old + w1 * (g.load() - m_old));
        *m = m_new;
        let v_new = T::store(v.load() * b2);
        let v_new = T::store(v_new.load() + w2 * g.load() * g.load());
        *v = v_new;
        let second = match max {
            Some(x) => {
                let s = T::store(maximum(x.load(), v_new.load()));
                *x = s;
                s
            }
            None => v_new,
        };
        let root = T::store(second.load().sqrt());
        let d = if c.eps == 0.0 {
            root.load() * denom_mul
        } else if c.inv_bias_correction2_sqrt == 1.0 {
            root.load() + denom_add
        } else {
            root.load() * denom_mul + denom_add
        };
        let denom = T::store(d);
        *p = T::store(pv.load() + neg_step * (m_new.load() / denom.load()));
    };
    let moments = param.iter_mut().zip(grad).zip(exp_avg.iter_mut()).zip(exp_avg_sq.iter_mut());
    match max {
        Some(max) => {
            for ((((p, &g), m), v), x) in moments.zip(max.iter_mut()) {
                element(p, g, m, v, Some(x));
            }
        }
        None => {
            for (((p, &g), m), v) in moments {
                element(p, g, m, v, None);
            }
        }
    }
    Ok(())
}

/// Everything one parameter's SGD step needs besides its tensors. The
/// default is plain SGD (no momentum) at PyTorch's default learning rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdCoefficients {
    /// The learning rate.
    pub lr: f64,
    /// The momentum factor; 0 is plain SGD, without a buffer.
    pub momentum: f64,
    /// The dampening of the momentum's new term.
    pub dampening: f64,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// Ascend rather than descend.
    pub maximize: bool,
    /// The parameter's first step with momentum: the buffer is created as
    /// `±g (+ wd·p)` (PyTorch's `buf = clone(d)`, no dampening), so it is
    /// written without being read.
    pub first_step: bool,
}

impl Default for SgdCoefficients {
    fn default() -> Self {
        SgdCoefficients {
            lr: 1e-3,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
            maximize: false,
            first_step: false,
        }
    }
}

/// One SGD step of `param` from `grad`, updating `momentum_buffer` in place
/// (needed when `c.momentum != 0`, unused otherwise); every slice has the
/// parameter's length. With `d = ±g + wd·p`:
///
/// ```text
/// momentum = 0:  p = (1 − lr·wd)·p ∓ lr·g
/// first step:    buf = ±g, buf += wd·p
/// later steps:   buf = momentum·buf, buf += ±(1 − dampening)·g, buf += (1 − dampening)·wd·p
/// nesterov:      p = (1 − lr·wd)·p, p −= ±lr·g, p −= lr·momentum·buf
/// otherwise:     p −= lr·buf
/// ```
///
/// each line one in-place op of `brasa-nn`'s `Sgd::update` (its scalars
/// computed in f64 as that update computes them), rounded to `T` after each.
pub fn sgd_step<T: FloatElement>(
    c: &SgdCoefficients,
    param: &mut [T],
    grad: &[T],
    momentum_buffer: Option<&mut [T]>,
) -> Result<()> {
    let n = param.len();
    check("sgd_step", "grad", grad.len(), n)?;
    let from = <T::Compute as Float>::from_f64;
    let sign = if c.maximize { -1.0 } else { 1.0 };
    let decayed = c.weight_decay != 0.0;
    // The scalars exactly as the composed update passes them to its ops.
    let decay = from(1.0 - c.lr * c.weight_decay);
    let neg_lr_sign = from(-c.lr * sign);
    // `mul_scalar_(m)` and `affine(m, 0)` store `x·m`; `add_scaled_(a, y)` stores `x + a·y`.
    let scale = |x: T, m: T::Compute| T::store(x.load() * m);
    let axpy = |x: T, a: T::Compute, y: T| T::store(x.load() + a * y.load());
    if c.momentum == 0.0 {
        for (p, &g) in param.iter_mut().zip(grad) {
            let pv = if decayed { scale(*p, decay) } else { *p };
            *p = axpy(pv, neg_lr_sign, g);
        }
        return Ok(());
    }
    let Some(buffer) = momentum_buffer else {
        return Err(KernelError::ShapeMismatch { detail: "sgd_step: momentum needs momentum_buffer".into() });
    };
    check("sgd_step", "momentum_buffer", buffer.len(), n)?;
    let sign_c = from(sign);
    let wd = from(c.weight_decay);
    let momentum = from(c.momentum);
    let grad_share = from(sign * (1.0 - c.dampening));
    let wd_share = from((1.0 - c.dampening) * c.weight_decay);
    let neg_lr_momentum = from(-c.lr * c.momentum);
    let neg_lr = from(-c.lr);
    // The flags are the same for every element, so the compiler hoists
    // their tests out of the zipped loop.
    for ((p, &g), b) in param.iter_mut().zip(grad).zip(buffer.iter_mut()) {
        let pv = *p;
        let bv = if c.first_step {
            let bv = scale(g, sign_c);
            if decayed {
                axpy(bv, wd, pv)
            } else {
                bv
            }
        } else {
            let bv = axpy(scale(*b, momentum), grad_share, g);
            if decayed {
                axpy(bv, wd_share, pv)
            } else {
                bv
            }
        };
        *b = bv;
        *p = if c.nesterov {
            // The buffer above took the parameter before its decay, as the
            // composed update decays it only after the buffer's ops.
            let q = if decayed { scale(pv, decay) } else { pv };
            axpy(axpy(q, neg_lr_sign, g), neg_lr_momentum, bv)
        } else {
            axpy(pv, neg_lr, bv)
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    /// The composed update of `brasa-nn`, op by op over whole slices, each
    /// op rounding to `T` where the tensor op stores.
    fn composed<T: FloatElement>(
        c: &AdamCoefficients,
        p: &mut [T],
        g: &[T],
        m: &mut [T],
        v: &mut [T],
        max: Option<&mut [T]>,
    ) {
        let from = <T::Compute as Float>::from_f64;
        if c.decoupled && c.weight_decay != 0.0 {
            p.iter_mut().for_each(|x| *x = T::store(x.load() * from(1.0 - c.lr * c.weight_decay)));
        }
        let mut eff: Vec<T> = g.to_vec();
        if c.maximize {
            eff.iter_mut().for_each(|x| *x = T::store(-x.load()));
        }
        if !c.decoupled && c.weight_decay != 0.0 {
            eff.iter_mut().zip(p.iter()).for_each(|(e, &p)| *e = T::store(e.load() + from(c.weight_decay) * p.load()));
        }
        m.iter_mut()
            .zip(&eff)
            .for_each(|(m, &e)| *m = T::store(m.load() + from(1.0 - c.beta1) * (e.load() - m.load())));
        v.iter_mut().for_each(|v| *v = T::store(v.load() * from(c.beta2)));
        v.iter_mut().zip(&eff).for_each(|(v, &e)| *v = T::store(v.load() + from(1.0 - c.beta2) * e.load() * e.load()));
        let second: Vec<T> = match max {
            Some(max) => {
                max.iter_mut().zip(v.iter()).for_each(|(x, &v)| *x = T::store(maximum(x.load(), v.load())));
                max.to_vec()
            }
            None => v.to_vec(),
        };
        let denom: Vec<T> = second
            .iter()
            .map(|&s| T::store(s.load().sqrt()))
            .map(|r| T::store(r.load() * from(c.inv_bias_correction2_sqrt) + from(c.eps)))
            .collect();
        for i in 0..p.len() {
            p[i] = T::store(p[i].load() + from(-c.step_size) * (m[i].load() / denom[i].load()));
        }
    }

    fn run<T: FloatElement + PartialEq + std::fmt::Debug>(to: fn(f64) -> T) {
        let n = 37;
        for (decoupled, amsgrad, maximize, wd) in
            [(false, false, false, 0.0), (true, false, false, 0.01), (false, true, true, 0.1), (true, true, false, 0.5)]
        {
            let base: Vec<T> = (0..n).map(|i| to((i as f64 - 18.0) / 7.0)).collect();
            let (mut p1, mut m1, mut v1, mut x1) = (base.clone(), vec![to(0.0); n], vec![to(0.0); n], vec![to(0.0); n]);
            let (mut p2, mut m2, mut v2, mut x2) = (p1.clone(), m1.clone(), v1.clone(), x1.clone());
            for t in 1..=4 {
                let g: Vec<T> = (0..n).map(|i| to(((i * 7 + t as usize * 3) % 11) as f64 / 5.0 - 1.0)).collect();
                let mut c = AdamCoefficients::for_step(1e-2, (0.9, 0.999), 1e-8, wd, t);
                (c.decoupled, c.amsgrad, c.maximize) = (decoupled, amsgrad, maximize);
                adam_step(&c, &mut p1, &g, &mut m1, &mut v1, amsgrad.then_some(&mut x1[..])).unwrap();
                composed(&c, &mut p2, &g, &mut m2, &mut v2, amsgrad.then_some(&mut x2[..]));
            }
            assert_eq!(p1, p2, "decoupled {decoupled} amsgrad {amsgrad} maximize {maximize}");
            assert_eq!((m1, v1), (m2, v2));
            assert_ne!(p1, base, "the step moved the parameters");
        }
    }

    #[test]
    fn fused_equals_the_composed_ops_bit_for_bit() {
        run::<f32>(|x| x as f32);
        run::<f64>(|x| x);
        run::<bf16>(bf16::from_f64);
    }

    #[test]
    fn lengths_and_amsgrad_buffer_are_checked() {
        let c = AdamCoefficients::for_step(1e-3, (0.9, 0.999), 1e-8, 0.0, 1);
        let (mut p, mut m, mut v) = ([0.0f32; 3], [0.0f32; 3], [0.0f32; 2]);
        let error = adam_step(&c, &mut p, &[0.0; 3], &mut m, &mut v, None).unwrap_err().to_string();
        assert!(error.contains("exp_avg_sq has 2 elements, the parameter 3"), "{error}");
        let amsgrad = AdamCoefficients { amsgrad: true, ..c };
        let mut v = [0.0f32; 3];
        assert!(adam_step(&amsgrad, &mut p, &[0.0; 3], &mut m, &mut v, None).is_err());
    }
    /// The composed SGD update of `brasa-nn` (`Sgd::update`), op by op over
    /// whole slices, each op rounding to `T` where the tensor op stores.
    fn composed_sgd<T: FloatElement>(c: &SgdCoefficients, p: &mut [T], g: &[T], buf: &mut Vec<T>) {
        let from = <T::Compute as Float>::from_f64;
        let (lr, wd) = (c.lr, c.weight_decay);
        let sign = if c.maximize { -1.0 } else { 1.0 };
        let mul_scalar_ = |x: &mut [T], m: f64| x.iter_mut().for_each(|x| *x = T::store(x.load() * from(m)));
        let add_scaled_ = |x: &mut [T], a: f64, y: &[T]| {
            x.iter_mut().zip(y).for_each(|(x, y)| *x = T::store(x.load() + from(a) * y.load()))
        };
        if c.momentum == 0.0 {
            if wd != 0.0 {
                mul_scalar_(p, 1.0 - lr * wd);
            }
            add_scaled_(p, -lr * sign, g);
            return;
        }
        if c.first_step {
            // grad.affine(sign, 0.0): a new tensor.
            *buf = g.iter().map(|x| T::store(x.load() * from(sign))).collect();
            if wd != 0.0 {
                add_scaled_(buf, wd, p);
            }
        } else {
            mul_scalar_(buf, c.momentum);
            add_scaled_(buf, sign * (1.0 - c.dampening), g);
            if wd != 0.0 {
                add_scaled_(buf, (1.0 - c.dampening) * wd, p);
            }
        }
        if c.nesterov {
            if wd != 0.0 {
                mul_scalar_(p, 1.0 - lr * wd);
            }
            add_scaled_(p, -lr * sign, g);
            add_scaled_(p, -lr * c.momentum, buf);
        } else {
            add_scaled_(p, -lr, buf);
        }
    }

    /// Every option `brasa-nn`'s `SgdConfig` has, alone and together.
    fn sgd_configs() -> Vec<SgdCoefficients> {
        let c = |lr, momentum, dampening, weight_decay, nesterov, maximize| SgdCoefficients {
            lr,
            momentum,
            dampening,
            weight_decay,
            nesterov,
            maximize,
            first_step: false,
        };
        vec![
            c(0.1, 0.0, 0.0, 0.0, false, false),
            c(0.1, 0.0, 0.0, 0.01, false, true),
            c(0.05, 0.9, 0.0, 0.0, false, false),
            c(0.05, 0.9, 0.3, 0.02, false, false),
            c(0.05, 0.8, 0.0, 0.0, true, false),
            c(0.05, 0.8, 0.0, 0.1, true, true),
            c(0.03, 0.7, 0.1, 0.1, false, true),
        ]
    }

    fn run_sgd<T: FloatElement + PartialEq + std::fmt::Debug>(to: fn(f64) -> T) {
        let n = 37;
        for config in sgd_configs() {
            let base: Vec<T> = (0..n).map(|i| to((i as f64 - 18.0) / 7.0)).collect();
            let (mut p1, mut b1) = (base.clone(), vec![to(0.0); n]);
            let (mut p2, mut b2) = (base.clone(), Vec::new());
            for t in 1..=4usize {
                let g: Vec<T> = (0..n).map(|i| to(((i * 7 + t * 3) % 11) as f64 / 5.0 - 1.0)).collect();
                let c = SgdCoefficients { first_step: t == 1, ..config };
                sgd_step(&c, &mut p1, &g, Some(&mut b1)).unwrap();
                composed_sgd(&c, &mut p2, &g, &mut b2);
            }
            assert_eq!(p1, p2, "{config:?}");
            if config.momentum != 0.0 {
                assert_eq!(b1, b2, "{config:?}");
            } else {
                assert_eq!(b1, vec![to(0.0); n], "without momentum the buffer is not touched");
            }
            assert_ne!(p1, base, "the step moved the parameters");
        }
    }

    #[test]
    fn fused_sgd_equals_the_composed_ops_bit_for_bit() {
        run_sgd::<f32>(|x| x as f32);
        run_sgd::<f64>(|x| x);
        run_sgd::<bf16>(bf16::from_f64);
    }

    #[test]
    fn sgd_first_step_writes_the_buffer_without_reading_it() {
        // A first step over a buffer of NaN (uninitialised memory, say) gives
        // the same as over zeros: `buf = ±g + wd·p` ignores the old values.
        let c = SgdCoefficients {
            lr: 0.5,
            momentum: 0.9,
            weight_decay: 0.25,
            maximize: true,
            first_step: true,
            ..SgdCoefficients::default()
        };
        let (mut p, mut buf) = ([2.0f64, -4.0], [f64::NAN; 2]);
        sgd_step(&c, &mut p, &[1.0, 0.5], Some(&mut buf)).unwrap();
        // buf = −g + 0.25·p; p −= 0.5·buf.
        assert_eq!(buf, [-0.5, -1.5]);
        assert_eq!(p, [2.25, -3.25]);
        // The second step reads it: buf = 0.9·buf − g + 0.25·p.
        let c = SgdCoefficients { first_step: false, ..c };
        sgd_step(&c, &mut p, &[1.0, 0.5], Some(&mut buf)).unwrap();
        assert_eq!(buf, [0.9 * -0.5 - 1.0 + 0.25 * 2.25, 0.9 * -1.5 - 0.5 + 0.25 * -3.25]);
    }

    #[test]
    fn sgd_lengths_and_momentum_buffer_are_checked() {
        let plain = SgdCoefficients::default();
        let mut p = [1.0f32; 3];
        let error = sgd_step(&plain, &mut p, &[0.0; 2], None).unwrap_err().to_string();
        assert!(error.contains("sgd_step: grad has 2 elements, the parameter 3"), "{error}");
        // Plain SGD needs no buffer.
        sgd_step(&plain, &mut p, &[1.0; 3], None).unwrap();
        assert_eq!(p, [1.0 - 1e-3; 3]);
        let momentum = SgdCoefficients { momentum: 0.9, ..plain };
        let error = sgd_step(&momentum, &mut p, &[0.0; 3], None).unwrap_err().to_string();
        assert!(error.contains("momentum needs momentum_buffer"), "{error}");
        let error = sgd_step(&momentum, &mut p, &[0.0; 3], Some(&mut [0.0; 4])).unwrap_err().to_string();
        assert!(error.contains("momentum_buffer has 4 elements, the parameter 3"), "{error}");
        assert_eq!(p, [1.0 - 1e-3; 3], "refused steps wrote nothing");
    }
}
