//! The named floating-point ops ([`UnaryOp`], [`BinaryOp`]) and the fused
//! update loops optimizers use (`axpy`, `addcmul`, `addcdiv`), for every
//! [`FloatElement`].
//!
//! Each entry point matches on the op once, outside the loop, and hands a
//! closure to one of the generic loops, so every op gets its own
//! monomorphized (and, where the op allows, vectorised) loop.

use super::strided::{map1, map2, update0, update1, update2, Strided, StridedMut};
use crate::error::Result;
use crate::scalar::{Accumulator, Float, FloatElement};

/// A one-operand floating-point op.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    /// `-x`.
    Neg,
    /// `|x|`.
    Abs,
    /// `e^x`.
    Exp,
    /// Natural logarithm.
    Log,
    /// Square root.
    Sqrt,
    /// `1 / sqrt(x)`.
    Rsqrt,
    /// Sine.
    Sin,
    /// Cosine.
    Cos,
    /// Hyperbolic tangent.
    Tanh,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// `max(x, 0)`; NaN stays NaN.
    Relu,
    /// `x Φ(x)` with the exact normal CDF (through erfc).
    Gelu,
    /// GELU's tanh approximation, `x/2 (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
    GeluTanh,
    /// `x * sigmoid(x)` (also called swish).
    Silu,
    /// `x^p`; p = 2, 3, 0.5, -0.5, 1, -1, -2 take exact shortcuts, as PyTorch's do.
    Powf(f64),
    /// `min(max(x, min), max)`; NaN stays NaN; pass ±infinity for no bound.
    Clamp {
        /// Lower bound.
        min: f64,
        /// Upper bound.
        max: f64,
    },
    /// `x * mul + add` (one rounding per operation; `add == 0` or `mul == 1`
    /// skip that operation, so `-0.0` and NaN payloads behave as for `x * mul`
    /// or `x + add` alone).
    Affine {
        /// Factor.
        mul: f64,
        /// Addend.
        add: f64,
    },
}

impl UnaryOp {
    /// The op's name in messages (`"exp"`).
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::Gelu => "gelu",
            UnaryOp::GeluTanh => "gelu_tanh",
            UnaryOp::Silu => "silu",
            UnaryOp::Powf(_) => "powf",
            UnaryOp::Clamp { .. } => "clamp",
            UnaryOp::Affine { .. } => "affine",
        }
    }

    /// Whether the op calls a transcendental function per element (tens of
    /// cycles), as opposed to a few arithmetic instructions: callers use it to
    /// pick a smaller threshold for going parallel.
    pub fn is_expensive(self) -> bool {
        match self {
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu | UnaryOp::Clamp { .. } | UnaryOp::Affine { .. } => false,
            UnaryOp::Sqrt | UnaryOp::Rsqrt => false,
            UnaryOp::Powf(p) => !matches!(p, 0.5 | -0.5 | 1.0 | -1.0 | 2.0 | -2.0 | 3.0),
            _ => true,
        }
    }
}

/// A two-operand floating-point op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
    /// `a^b`.
    Pow,
    /// The larger; NaN if either is NaN (PyTorch's `maximum`).
    Maximum,
    /// The smaller; NaN if either is NaN (PyTorch's `minimum`).
    Minimum,
    /// `a` where `b > 0`, else 0: ReLU's backward from the gradient `a` and
    /// the saved output `b` in one pass (PyTorch's `threshold_backward`).
    ReluBackward,
}

impl BinaryOp {
    /// The op's name in messages (`"add"`).
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
            BinaryOp::ReluBackward => "relu_backward",
        }
    }
}

/// The larger of two values, NaN if either is.
#[inline(always)]
pub fn maximum<T: Float>(a: T, b: T) -> T {
    if a > b || a.is_nan() {
        a
    } else {
        b
    }
}

/// The smaller of two values, NaN if either is.
#[inline(always)]
pub fn minimum<T: Float>(a: T, b: T) -> T {
    if a < b || a.is_nan() {
        a
    } else {
        b
    }
}

/// `1 / (1 + e^-x)`.
#[inline(always)]
pub fn sigmoid<T: Float>(x: T) -> T {
    T::ONE / (T::ONE + (-x).exp())
}

/// GELU's tanh approximation.
#[inline(always)]
pub fn gelu_tanh<T: Float>(x: T) -> T {
    let k = T::from_f64(0.797_884_560_802_865_4); // √(2/π)
    let c = T::from_f64(0.044_715);
    T::HALF * x * (T::ONE + (k * (x + c * x * x * x)).tanh())
}

/// Binds `$f` to the scalar function of `$op` computed in `$T`, then evaluates
/// `$body` (one monomorphized body per op).
macro_rules! with_unary_fn {
    ($op:expr, $T:ty, $f:ident => $body:expr) => {{
        match $op {
            UnaryOp::Neg => {
                let $f = |x: $T| -x;
                $body
            }
            UnaryOp::Abs => {
                let $f = |x: $T| x.abs();
                $body
            }
            UnaryOp::Exp => {
                let $f = |x: $T| x.exp();
                $body
            }
            UnaryOp::Log => {
                let $f = |x: $T| x.ln();
                $body
            }
            UnaryOp::Sqrt => {
                let $f = |x: $T| x.sqrt();
                $body
            }
            UnaryOp::Rsqrt => {
                let $f = |x: $T| <$T as Float>::ONE / x.sqrt();
                $body
            }
            UnaryOp::Sin => {
                let $f = |x: $T| x.sin();
                $body
            }
            UnaryOp::Cos => {
                let $f = |x: $T| x.cos();
                $body
            }
            UnaryOp::Tanh => {
                let $f = |x: $T| x.tanh();
                $body
            }
            UnaryOp::Sigmoid => {
                let $f = |x: $T| sigmoid(x);
                $body
            }
            UnaryOp::Relu => {
                // `x < 0` is false for NaN, which passes through.
                let $f = |x: $T| if x < <$T as Accumulator>::ZERO { <$T as Accumulator>::ZERO } else { x };
                $body
            }
            UnaryOp::Gelu => {
                let $f = |x: $T| x.gelu();
                $body
            }
            UnaryOp::GeluTanh => {
                let $f = |x: $T| gelu_tanh(x);
                $body
            }
            UnaryOp::Silu => {
                let $f = |x: $T| x / (<$T as Float>::ONE + (-x).exp());
                $body
            }
            UnaryOp::Powf(p) if p == 2.0 => {
                let $f = |x: $T| x * x;
                $body
            }
            UnaryOp::Powf(p) if p == 3.0 => {
                let $f = |x: $T| x * x * x;
                $body
            }
            UnaryOp::Powf(p) if p == 0.5 => {
                let $f = |x: $T| x.sqrt();
                $body
            }
            UnaryOp::Powf(p) if p == -0.5 => {
                let $f = |x: $T| <$T as Float>::ONE / x.sqrt();
                $body
            }
            UnaryOp::Powf(p) if p == 1.0 => {
                let $f = |x: $T| x;
                $body
            }
            UnaryOp::Powf(p) if p == -1.0 => {
                let $f = |x: $T| <$T as Float>::ONE / x;
                $body
            }
            UnaryOp::Powf(p) if p == -2.0 => {
                let $f = |x: $T| <$T as Float>::ONE / (x * x);
                $body
            }
            UnaryOp::Powf(p) => {
                let p = <$T as Float>::from_f64(p);
                let $f = move |x: $T| x.powf(p);
                $body
            }
            UnaryOp::Clamp { min, max } => {
                let (lo, hi) = (<$T as Float>::from_f64(min), <$T as Float>::from_f64(max));
                let $f = move |x: $T| {
                    let y = if x < lo { lo } else { x };
                    if y > hi {
                        hi
                    } else {
                        y
                    }
                };
                $body
            }
            UnaryOp::Affine { mul, add } if add == 0.0 => {
                let m = <$T as Float>::from_f64(mul);
                let $f = move |x: $T| x * m;
                $body
            }
            UnaryOp::Affine { mul, add } if mul == 1.0 => {
                let a = <$T as Float>::from_f64(add);
                let $f = move |x: $T| x + a;
                $body
            }
            UnaryOp::Affine { mul, add } => {
                let (m, a) = (<$T as Float>::from_f64(mul), <$T as Float>::from_f64(add));
                let $f = move |x: $T| x * m + a;
                $body
            }
        }
    }};
}

macro_rules! with_binary_fn {
    ($op:expr, $T:ty, $f:ident => $body:expr) => {{
        match $op {
            BinaryOp::Add => {
                let $f = |a: $T, b: $T| a + b;
                $body
            }
            BinaryOp::Sub => {
                let $f = |a: $T, b: $T| a - b;
                $body
            }
            BinaryOp::Mul => {
                let $f = |a: $T, b: $T| a * b;
                $body
            }
            BinaryOp::Div => {
                let $f = |a: $T, b: $T| a / b;
                $body
            }
            BinaryOp::Pow => {
                let $f = |a: $T, b: $T| a.powf(b);
                $body
            }
            BinaryOp::Maximum => {
                let $f = |a: $T, b: $T| maximum(a, b);
                $body
            }
            BinaryOp::Minimum => {
                let $f = |a: $T, b: $T| minimum(a, b);
                $body
            }
            BinaryOp::ReluBackward => {
                let zero = <$T as Float>::from_f64(0.0);
                let $f = move |a: $T, b: $T| if b > zero { a } else { zero };
                $body
            }
        }
    }};
}

/// `dst[i] = op(src[i])`.
///
/// ```
/// use brasa_kernels::elementwise::{unary, Strided, UnaryOp};
/// let x = [-1.0f32, 0.0, 2.0];
/// let mut y = [0.0f32; 3];
/// unary(UnaryOp::Relu, Strided::contiguous(&x), &mut y)?;
/// assert_eq!(y, [0.0, 0.0, 2.0]);
/// # Ok::<(), brasa_kernels::KernelError>(())
/// ```
pub fn unary<T: FloatElement>(op: UnaryOp, src: Strided<'_, T>, dst: &mut [T]) -> Result<()> {
    with_unary_fn!(op, T::Compute, f => map1(src, dst, |x: T| T::store(f(x.load()))))
}

/// `dst[i] = op(dst[i])`, in place.
pub fn unary_update<T: FloatElement + Copy>(op: UnaryOp, dst: StridedMut<'_, T>) -> Result<()> {
    with_unary_fn!(op, T::Compute, f => update0(dst, |x: T| T::store(f(x.load()))))
}

/// `dst[i] = op(a[i], b[i])`.
///
/// ```
/// use brasa_kernels::elementwise::{binary, BinaryOp, Strided};
/// let a = [1.0f64, 2.0, 3.0];
/// let b = [10.0f64];
/// let mut c = [0.0f64; 3];
/// binary(BinaryOp::Add, Strided::contiguous(&a), Strided::broadcast(&b, 0), &mut c)?;
/// assert_eq!(c, [11.0, 12.0, 13.0]);
/// # Ok::<(), brasa_kernels::KernelError>(())
/// ```
pub fn binary<T: FloatElement>(op: BinaryOp, a: Strided<'_, T>, b: Strided<'_, T>, dst: &mut [T]) -> Result<()> {
    with_binary_fn!(op, T::Compute, f => map2(a, b, dst, |x: T, y: T| T::store(f(x.load(), y.load()))))
}

/// `dst[i] = op(dst[i], rhs[i])`, in place (`x += y` and friends).
pub fn binary_update<T: FloatElement>(op: BinaryOp, dst: StridedMut<'_, T>, rhs: Strided<'_, T>) -> Result<()> {
    with_binary_fn!(op, T::Compute, f => update1(dst, rhs, |d: T, x: T| T::store(f(d.load(), x.load()))))
}

/// `dst[i] = op(dst[i], dst[i])`, in place: `x += x` when the right-hand side
/// is the destination itself (each element meets only itself, so no copy).
pub fn binary_update_self<T: FloatElement>(op: BinaryOp, dst: StridedMut<'_, T>) -> Result<()> {
    with_binary_fn!(op, T::Compute, f => update0(dst, |d: T| {
        let v = d.load();
        T::store(f(v, v))
    }))
}

/// `y[i] += alpha * x[i]` (BLAS axpy), computed in `T::Compute`.
pub fn axpy<T: FloatElement>(alpha: f64, x: Strided<'_, T>, y: StridedMut<'_, T>) -> Result<()> {
    let alpha = <T::Compute as Float>::from_f64(alpha);
    update1(y, x, |d: T, x: T| T::store(d.load() + alpha * x.load()))
}

/// `y[i] += value * a[i] * b[i]` (PyTorch's `addcmul_`; Adam's second moment).
pub fn addcmul<T: FloatElement>(value: f64, a: Strided<'_, T>, b: Strided<'_, T>, y: StridedMut<'_, T>) -> Result<()> {
    let value = <T::Compute as Float>::from_f64(value);
    update2(y, a, b, |d: T, a: T, b: T| T::store(d.load() + value * a.load() * b.load()))
}

/// `y[i] += value * a[i] / b[i]` (PyTorch's `addcdiv_`; Adam's step).
pub fn addcdiv<T: FloatElement>(value: f64, a: Strided<'_, T>, b: Strided<'_, T>, y: StridedMut<'_, T>) -> Result<()> {
    let value = <T::Compute as Float>::from_f64(value);
    update2(y, a, b, |d: T, a: T, b: T| T::store(d.load() + value * (a.load() / b.load())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    const ALL_UNARY: [UnaryOp; 17] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Gelu,
        UnaryOp::GeluTanh,
        UnaryOp::Silu,
        UnaryOp::Powf(1.7),
        UnaryOp::Clamp { min: -0.5, max: 0.75 },
        UnaryOp::Affine { mul: 2.5, add: -1.0 },
    ];

    /// The op on one f64, written out independently of the kernels.
    fn reference(op: UnaryOp, x: f64) -> f64 {
        match op {
            UnaryOp::Neg => -x,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Rsqrt => 1.0 / x.sqrt(),
            UnaryOp::Sin => x.sin(),
            UnaryOp::Cos => x.cos(),
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            UnaryOp::Relu => x.max(0.0),
            UnaryOp::Gelu => x * 0.5 * (1.0 + super::super::math::erf(x / 2f64.sqrt())),
            UnaryOp::GeluTanh => {
                0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
            }
            UnaryOp::Silu => x / (1.0 + (-x).exp()),
            UnaryOp::Powf(p) => x.powf(p),
            UnaryOp::Clamp { min, max } => x.max(min).min(max),
            UnaryOp::Affine { mul, add } => x * mul + add,
        }
    }

    fn inputs() -> Vec<f64> {
        (0..64).map(|i| 0.05 + i as f64 * 0.093 - if i % 2 == 0 { 3.0 } else { 0.0 }).collect()
    }

    #[test]
    fn unary_ops_match_the_reference_in_every_float_type() {
        for op in ALL_UNARY {
            let xs: Vec<f64> = inputs()
                .into_iter()
                .map(|x| {
                    if matches!(op, UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Powf(_)) {
                        x.abs()
                    } else {
                        x
                    }
                })
                .collect();
            let want: Vec<f64> = xs.iter().map(|&x| reference(op, x)).collect();
            let mut out64 = vec![0.0f64; xs.len()];
            unary(op, Strided::contiguous(&xs), &mut out64).unwrap();
            let x32: Vec<f32> = xs.iter().map(|&x| x as f32).collect();
            let mut out32 = vec![0.0f32; xs.len()];
            unary(op, Strided::contiguous(&x32), &mut out32).unwrap();
            let xh: Vec<bf16> = xs.iter().map(|&x| bf16::from_f64(x)).collect();
            let mut outh = vec![bf16::ZERO; xs.len()];
            unary(op, Strided::new(&xh, 0, 1), &mut outh).unwrap();
            for i in 0..xs.len() {
                let w = want[i];
                assert!(
                    (out64[i] - w).abs() <= 1e-14 * w.abs().max(1.0),
                    "{op:?} f64 at {}: {} vs {w}",
                    xs[i],
                    out64[i]
                );
                let w32 = reference(op, f64::from(x32[i]));
                assert!((f64::from(out32[i]) - w32).abs() <= 2e-6 * w32.abs().max(1.0), "{op:?} f32 at {}", xs[i]);
                let wh = reference(op, xh[i].to_f64());
                assert!((outh[i].to_f64() - wh).abs() <= 1e-2 * wh.abs().max(1.0), "{op:?} bf16 at {}", xs[i]);
            }
        }
    }

    #[test]
    fn nan_passes_through_relu_clamp_and_the_extrema() {
        let x = [f32::NAN, -1.0, 2.0];
        let mut y = [0.0f32; 3];
        unary(UnaryOp::Relu, Strided::contiguous(&x), &mut y).unwrap();
        assert!(y[0].is_nan() && y[1] == 0.0 && y[2] == 2.0);
        unary(UnaryOp::Clamp { min: 0.0, max: 1.0 }, Strided::contiguous(&x), &mut y).unwrap();
        assert!(y[0].is_nan() && y[1] == 0.0 && y[2] == 1.0);
        // PyTorch: min > max gives max everywhere.
        unary(UnaryOp::Clamp { min: 3.0, max: 1.0 }, Strided::contiguous(&x[1..]), &mut y[1..]).unwrap();
        assert_eq!(y[1..], [1.0, 1.0]);
        binary(BinaryOp::Maximum, Strided::contiguous(&x), Strided::broadcast(&x, 1), &mut y).unwrap();
        assert!(y[0].is_nan() && y[1] == -1.0 && y[2] == 2.0);
        binary(BinaryOp::Minimum, Strided::broadcast(&x, 2), Strided::contiguous(&x), &mut y).unwrap();
        assert!(y[0].is_nan() && y[1] == -1.0 && y[2] == 2.0);
        // -0.0 * 1 keeps its sign (no `+ 0.0` when the addend is zero).
        let z = [-0.0f64];
        let mut w = [1.0f64];
        unary(UnaryOp::Affine { mul: 1.0, add: 0.0 }, Strided::contiguous(&z), &mut w).unwrap();
        assert!(w[0] == 0.0 && w[0].is_sign_negative());
    }

    #[test]
    fn binary_ops_and_fused_updates_round_halves_once() {
        let a = [f16::from_f32(1.5), f16::from_f32(-2.0), f16::from_f32(0.25)];
        let b = [f16::from_f32(2.0), f16::from_f32(3.0), f16::from_f32(4.0)];
        let mut c = [f16::ZERO; 3];
        for (op, want) in [
            (BinaryOp::Add, [3.5, 1.0, 4.25]),
            (BinaryOp::Sub, [-0.5, -5.0, -3.75]),
            (BinaryOp::Mul, [3.0, -6.0, 1.0]),
            (BinaryOp::Div, [0.75, -2.0 / 3.0, 0.0625]),
            (BinaryOp::Pow, [2.25, -8.0, 0.25f32.powf(4.0)]),
            (BinaryOp::Maximum, [2.0, 3.0, 4.0]),
            (BinaryOp::Minimum, [1.5, -2.0, 0.25]),
            (BinaryOp::ReluBackward, [1.5, -2.0, 0.25]),
        ] {
            binary(op, Strided::contiguous(&a), Strided::contiguous(&b), &mut c).unwrap();
            let want = want.map(f16::from_f32);
            assert_eq!(c, want, "{}", op.name());
        }
        let mut y = [1.0f32, 2.0, 3.0];
        axpy(2.0, Strided::contiguous(&[1.0f32, 1.0, 1.0]), StridedMut::contiguous(&mut y)).unwrap();
        assert_eq!(y, [3.0, 4.0, 5.0]);
        addcmul(0.5, Strided::contiguous(&[2.0f32, 4.0, 6.0]), Strided::broadcast(&[3.0f32], 0), (&mut y[..]).into())
            .unwrap();
        assert_eq!(y, [6.0, 10.0, 14.0]);
        addcdiv(-1.0, Strided::contiguous(&[2.0f32, 4.0, 6.0]), Strided::broadcast(&[2.0f32], 0), (&mut y[..]).into())
            .unwrap();
        assert_eq!(y, [5.0, 8.0, 11.0]);
        binary_update(BinaryOp::Mul, StridedMut::new(&mut y, 2, -1, 3), Strided::contiguous(&[1.0, 10.0, 100.0]))
            .unwrap();
        assert_eq!(y, [500.0, 80.0, 11.0]);
        unary_update(UnaryOp::Neg, StridedMut::contiguous(&mut y)).unwrap();
        assert_eq!(y, [-500.0, -80.0, -11.0]);
        binary_update_self(BinaryOp::Mul, StridedMut::new(&mut y, 1, 1, 2)).unwrap();
        assert_eq!(y, [-500.0, 6400.0, 121.0]);
        assert!(UnaryOp::Exp.is_expensive() && !UnaryOp::Powf(2.0).is_expensive() && UnaryOp::Powf(2.5).is_expensive());
        assert_eq!(UnaryOp::GeluTanh.name(), "gelu_tanh");
    }
}
