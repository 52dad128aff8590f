//! Fused optimizer steps: Adam and AdamW in one pass per element, reading
//! the parameter, its gradient and both moments once and writing them once
//! (PyTorch's `fused=True` Adam). Each element replays exactly the sequence
//! of in-place tensor ops of the composed update (`brasa-nn`'s
//! `Adam::update`: `mul_scalar_`, `lerp_`, `addcmul_`, `sqrt_`, `affine_`,
//! `addcdiv_`), each intermediate rounded to the element type where that
//! update stores it, so the fused and the composed steps agree bit for bit —
//! as the CUDA kernel `adam_step_<T>` (`kernels/cuda/optim.cu`) does.
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

fn check(what: &str, len: usize, n: usize) -> Result<()> {
    if len == n {
        Ok(())
    } else {
        Err(KernelError::ShapeMismatch { detail: format!("adam_step: {what} has {len} elements, the parameter {n}") })
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
    check("grad", grad.len(), n)?;
    check("exp_avg", exp_avg.len(), n)?;
    check("exp_avg_sq", exp_avg_sq.len(), n)?;
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
            check("max_exp_avg_sq", max.len(), n)?;
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
}
