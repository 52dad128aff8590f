//! The named floating-point ops ([`UnaryOp`], [`BinaryOp`]) and the fused
//! update loops optimizers use (`axpy`, `addcmul`, `addcdiv`), for every
//! [`FloatElement`].
//!
//! Each entry point matches on the op once, outside the loop, and hands a
//! closure to one of the generic loops, so every op gets its own
//! monomorphized (and, where the op allows, vectorised) loop.

use super::strided::{
    map1, map1_blocks, map2, map2_blocks, update0, update1, update1_blocks, update2, Strided, StridedMut,
};
use crate::error::Result;
use crate::scalar::{gelu_tanh, gelu_tanh_backward, Accumulator, Float, FloatElement};
use crate::widest::{on_widest_if, WideLoop};

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
    /// `a · (Φ(b) + b φ(b))`: exact GELU's backward from the gradient `a` and
    /// the saved input `b` in one pass (PyTorch's `gelu_backward`). NaN where
    /// `b` is ±inf, as there.
    GeluBackward,
    /// `a · d/db gelu_tanh(b)`: the tanh approximation's backward from the
    /// gradient `a` and the saved input `b` in one pass (PyTorch's
    /// `gelu_backward(approximate='tanh')`).
    GeluTanhBackward,
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
            BinaryOp::GeluBackward => "gelu_backward",
            BinaryOp::GeluTanhBackward => "gelu_tanh_backward",
        }
    }

    /// Whether the op calls a transcendental function per element (see
    /// [`UnaryOp::is_expensive`]).
    pub fn is_expensive(self) -> bool {
        matches!(self, BinaryOp::Pow | BinaryOp::GeluBackward | BinaryOp::GeluTanhBackward)
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

/// `out[i] = gelu(x[i])` (exact GELU, within
/// [`MAX_ULP_ERROR`](crate::elementwise::MAX_ULP_ERROR) ulp) over the common
/// length: `f32`'s [`Float::gelu_slice`], branch-free vectorised code but on
/// x86-64 CPUs without AVX2 + FMA, which take the scalar path.
pub fn gelu_f32(x: &[f32], out: &mut [f32]) {
    f32::gelu_slice(x, out);
}

/// `out[i] = grad[i] · (Φ(x[i]) + x[i] φ(x[i]))` over the common length
/// (PyTorch's `gelu_backward`): `f32`'s [`Float::gelu_backward_slice`],
/// vectorised as [`gelu_f32`] is.
pub fn gelu_backward_f32(grad: &[f32], x: &[f32], out: &mut [f32]) {
    f32::gelu_backward_slice(grad, x, out);
}

/// `out[i] = grad[i] · gelu_tanh'(x[i])` over the common length (PyTorch's
/// `gelu_backward(approximate='tanh')`): `f32`'s
/// [`Float::gelu_tanh_backward_slice`], vectorised as [`gelu_f32`] is.
pub fn gelu_tanh_backward_f32(grad: &[f32], x: &[f32], out: &mut [f32]) {
    f32::gelu_tanh_backward_slice(grad, x, out);
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
            BinaryOp::GeluBackward => {
                let $f = |a: $T, b: $T| <$T as Float>::gelu_backward(a, b);
                $body
            }
            BinaryOp::GeluTanhBackward => {
                let $f = |a: $T, b: $T| gelu_tanh_backward(a, b);
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
    if op == UnaryOp::Gelu {
        // A slice kernel: vectorised for f32 (and the half types, which compute in f32).
        return map1_blocks(src, dst, <T::Compute as Float>::gelu_slice);
    }
    on_widest_if(is_half::<T>(), UnaryLoop { op, src, dst })
}

/// The loop of [`unary`]: one element at a time, loaded into the compute
/// type and rounded back. For half types it also runs compiled for
/// AVX-512 or AVX2 ([`on_widest_if`]): the baseline build leaves it scalar (its
/// widening, rounding select and 32 -> 16-bit narrowing do not map onto
/// SSE2): bf16 ReLU of 32K elements 12.3 -> 4.1 µs on one AMD EPYC core
/// (f32: 2.3 µs).
struct UnaryLoop<'a, T> {
    op: UnaryOp,
    src: Strided<'a, T>,
    dst: &'a mut [T],
}

impl<T: FloatElement> WideLoop for UnaryLoop<'_, T> {
    type Output = Result<()>;

    #[inline(always)]
    fn run(self) -> Result<()> {
        let UnaryLoop { op, src, dst } = self;
        with_unary_fn!(op, T::Compute, f => map1(src, dst, |x: T| T::store(f(x.load()))))
    }
}

/// Whether `T` is stored narrower than it computes (f16, bf16): its
/// element-wise loops then also run compiled for AVX-512 or AVX2, and its
/// in-place updates a block at a time, widened and rounded with the
/// vectorised conversions (element by element the conversions keep the
/// baseline loop scalar: a bf16 `add_` of 1M elements 0.50 -> 0.39 ms on
/// one AMD EPYC core).
fn is_half<T: FloatElement>() -> bool {
    size_of::<T>() < size_of::<T::Compute>()
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
    // The GELU backwards are slice kernels, vectorised for f32 and the half types.
    match op {
        BinaryOp::GeluBackward => return map2_blocks(a, b, dst, <T::Compute as Float>::gelu_backward_slice),
        BinaryOp::GeluTanhBackward => return map2_blocks(a, b, dst, <T::Compute as Float>::gelu_tanh_backward_slice),
        _ => {}
    }
    on_widest_if(is_half::<T>(), BinaryLoop { op, a, b, dst })
}

/// The loop of [`binary`] (see [`UnaryLoop`]).
struct BinaryLoop<'a, T> {
    op: BinaryOp,
    a: Strided<'a, T>,
    b: Strided<'a, T>,
    dst: &'a mut [T],
}

impl<T: FloatElement> WideLoop for BinaryLoop<'_, T> {
    type Output = Result<()>;

    #[inline(always)]
    fn run(self) -> Result<()> {
        let BinaryLoop { op, a, b, dst } = self;
        with_binary_fn!(op, T::Compute, f => map2(a, b, dst, |x: T, y: T| T::store(f(x.load(), y.load()))))
    }
}

/// `dst[i] = op(dst[i], rhs[i])`, in place (`x += y` and friends).
pub fn binary_update<T: FloatElement>(op: BinaryOp, dst: StridedMut<'_, T>, rhs: Strided<'_, T>) -> Result<()> {
    if is_half::<T>() {
        return with_binary_fn!(op, T::Compute, f => update1_blocks(dst, rhs, |x, y, z| {
            for ((o, &u), &v) in z.iter_mut().zip(x).zip(y) {
                *o = f(u, v);
            }
        }));
    }
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
            UnaryOp::Gelu => x * 0.5 * (1.0 + crate::math::erf(x / 2f64.sqrt())),
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

    /// The half types' loops compiled for wider vectors (chosen at run time
    /// on this CPU) give the baseline loop's bits for every op, in bf16 and
    /// f16, on values around every rounding case: NaN, infinities, signed
    /// zeros, subnormals, ties, and lengths that end mid-vector, with a
    /// broadcast operand too.
    #[test]
    fn wide_half_loops_equal_the_baseline_bit_for_bit() {
        let specials =
            [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1e-40, -3e-39, 65504.0, 1.0 + 1.0 / 256.0];
        let mut values: Vec<f32> = specials.to_vec();
        values.extend(crate::test_data::xorshift(11).take(1000).map(|r| (r % 20_001) as f32 * 1.1e-3 - 11.0));
        let binaries = [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::Pow,
            BinaryOp::Maximum,
            BinaryOp::Minimum,
            BinaryOp::ReluBackward,
        ];
        fn check<T: FloatElement>(values: &[f32], binaries: &[BinaryOp], make: fn(f32) -> T, bits: fn(T) -> u16) {
            let x: Vec<T> = values.iter().map(|&v| make(v)).collect();
            let y: Vec<T> = values.iter().rev().map(|&v| make(v)).collect();
            for len in [x.len(), 37, 16, 3] {
                let (x, y) = (&x[..len], &y[..len]);
                for op in ALL_UNARY {
                    let (mut wide, mut base) = (vec![x[0]; len], vec![x[0]; len]);
                    unary(op, Strided::contiguous(x), &mut wide).unwrap();
                    UnaryLoop { op, src: Strided::contiguous(x), dst: &mut base }.run().unwrap();
                    let same = wide.iter().zip(&base).all(|(&w, &b)| bits(w) == bits(b));
                    assert!(same, "{op:?} over {len}");
                }
                for &op in binaries {
                    for b_operand in [Strided::contiguous(y), Strided::broadcast(y, 1)] {
                        let (mut wide, mut base) = (vec![x[0]; len], vec![x[0]; len]);
                        binary(op, Strided::contiguous(x), b_operand, &mut wide).unwrap();
                        BinaryLoop { op, a: Strided::contiguous(x), b: b_operand, dst: &mut base }.run().unwrap();
                        let same = wide.iter().zip(&base).all(|(&w, &b)| bits(w) == bits(b));
                        assert!(same, "{} over {len}", op.name());
                    }
                }
            }
        }
        check(&values, &binaries, bf16::from_f32, bf16::to_bits);
        check(&values, &binaries, f16::from_f32, f16::to_bits);
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
        // bf16 updates by blocks (more than one, a broadcast right-hand
        // side) and strided (reversed): each element rounded once, as the
        // element-wise definition.
        let rhs: Vec<bf16> = (0..700).map(|i| bf16::from_f32((i as f32 - 350.0) * 0.173)).collect();
        let start: Vec<bf16> = (0..700).map(|i| bf16::from_f32((i % 37) as f32 * 1.37 - 20.0)).collect();
        for op in [BinaryOp::Add, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Maximum] {
            let f = |d: bf16, x: bf16| match op {
                BinaryOp::Add => bf16::from_f32(d.to_f32() + x.to_f32()),
                BinaryOp::Mul => bf16::from_f32(d.to_f32() * x.to_f32()),
                BinaryOp::Div => bf16::from_f32(d.to_f32() / x.to_f32()),
                _ => bf16::from_f32(d.to_f32().max(x.to_f32())),
            };
            let mut got = start.clone();
            binary_update(op, StridedMut::contiguous(&mut got), Strided::contiguous(&rhs)).unwrap();
            let want: Vec<bf16> = start.iter().zip(&rhs).map(|(&d, &x)| f(d, x)).collect();
            assert_eq!(got, want, "{}", op.name());
            let mut got = start.clone();
            binary_update(op, StridedMut::contiguous(&mut got), Strided::broadcast(&rhs[5..6], 0)).unwrap();
            let want: Vec<bf16> = start.iter().map(|&d| f(d, rhs[5])).collect();
            assert_eq!(got, want, "{} broadcast", op.name());
            let mut got = start.clone();
            binary_update(op, StridedMut::new(&mut got, 699, -1, 700), Strided::contiguous(&rhs)).unwrap();
            let want: Vec<bf16> = start.iter().rev().zip(&rhs).map(|(&d, &x)| f(d, x)).rev().collect();
            assert_eq!(got, want, "{} strided", op.name());
        }
        assert_eq!(UnaryOp::GeluTanh.name(), "gelu_tanh");
    }

    /// Central difference of `f` at `x` (step 1e-5: error ~1e-10 here).
    fn numeric_derivative(f: impl Fn(f64) -> f64, x: f64) -> f64 {
        let h = 1e-5;
        (f(x + h) - f(x - h)) / (2.0 * h)
    }

    #[test]
    fn gelu_backwards_are_the_derivatives_of_the_forwards() {
        for i in -80..=80 {
            let x = i as f64 * 0.1 + 0.013;
            let exact = numeric_derivative(|v| v.gelu(), x);
            assert!((f64::gelu_backward(1.0, x) - exact).abs() <= 1e-9, "gelu'({x})");
            assert_eq!(f64::gelu_backward(-2.0, x), -2.0 * f64::gelu_backward(1.0, x));
            let tanh = numeric_derivative(gelu_tanh, x);
            assert!((gelu_tanh_backward(1.0, x) - tanh).abs() <= 1e-9, "gelu_tanh'({x})");
        }
        assert_eq!(BinaryOp::GeluBackward.name(), "gelu_backward");
        assert_eq!(BinaryOp::GeluTanhBackward.name(), "gelu_tanh_backward");
        assert!(BinaryOp::GeluBackward.is_expensive() && !BinaryOp::ReluBackward.is_expensive());
    }

    /// The GELU ops go through the block loops: contiguous, strided and
    /// broadcast operands, every float type, lengths past a block.
    #[test]
    fn gelu_ops_take_every_operand_form_and_float_type() {
        let n = 600;
        let xs: Vec<f32> = (0..n).map(|i| (i as f32 - 300.0) * 0.037).collect();
        let gs: Vec<f32> = (0..n).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let reversed: Vec<f32> = xs.iter().rev().copied().collect();
        let mut want = vec![0.0f32; n];
        let mut got = vec![0.0f32; n];
        // Forward: the slice kernel itself, whatever the operand's form.
        crate::elementwise::gelu_f32(&xs, &mut want);
        unary(UnaryOp::Gelu, Strided::contiguous(&xs), &mut got).unwrap();
        assert_eq!(got, want);
        unary(UnaryOp::Gelu, Strided::new(&reversed, n - 1, -1), &mut got).unwrap();
        assert_eq!(got, want);
        unary(UnaryOp::Gelu, Strided::broadcast(&xs, 10), &mut got).unwrap();
        assert!(got.iter().all(|&v| v == want[10]));
        // Backward: gradient broadcast, input walked backwards.
        for (op, kernel) in [
            (BinaryOp::GeluBackward, crate::elementwise::gelu_backward_f32 as fn(&[f32], &[f32], &mut [f32])),
            (BinaryOp::GeluTanhBackward, crate::elementwise::gelu_tanh_backward_f32),
        ] {
            kernel(&gs, &xs, &mut want);
            binary(op, Strided::contiguous(&gs), Strided::contiguous(&xs), &mut got).unwrap();
            assert_eq!(got, want, "{op:?}");
            binary(op, Strided::contiguous(&gs), Strided::new(&reversed, n - 1, -1), &mut got).unwrap();
            assert_eq!(got, want, "{op:?} strided");
            kernel(&vec![gs[3]; n], &xs, &mut want);
            binary(op, Strided::broadcast(&gs, 3), Strided::contiguous(&xs), &mut got).unwrap();
            assert_eq!(got, want, "{op:?} broadcast");
            // f64: the scalar formulas, element by element.
            let (g64, x64): (Vec<f64>, Vec<f64>) =
                gs.iter().zip(&xs).map(|(&g, &x)| (f64::from(g), f64::from(x))).unzip();
            let mut out64 = vec![0.0f64; n];
            binary(op, Strided::contiguous(&g64), Strided::contiguous(&x64), &mut out64).unwrap();
            for i in 0..n {
                let w = match op {
                    BinaryOp::GeluBackward => f64::gelu_backward(g64[i], x64[i]),
                    _ => gelu_tanh_backward(g64[i], x64[i]),
                };
                assert_eq!(out64[i], w, "{op:?} f64 at {}", x64[i]);
            }
            // bf16 and f16 compute in f32 and round once on store.
            let xh: Vec<bf16> = xs.iter().map(|&x| bf16::from_f32(x)).collect();
            let gh: Vec<bf16> = gs.iter().map(|&g| bf16::from_f32(g)).collect();
            let mut outh = vec![bf16::ZERO; n];
            binary(op, Strided::contiguous(&gh), Strided::contiguous(&xh), &mut outh).unwrap();
            let (wx, wg): (Vec<f32>, Vec<f32>) = xh.iter().zip(&gh).map(|(x, g)| (x.to_f32(), g.to_f32())).unzip();
            kernel(&wg, &wx, &mut want);
            assert!(outh.iter().zip(&want).all(|(o, w)| *o == bf16::from_f32(*w)), "{op:?} bf16");
            let xf: Vec<f16> = xs.iter().map(|&x| f16::from_f32(x)).collect();
            let mut outf = vec![f16::ZERO; n];
            binary(op, Strided::broadcast(&[f16::ONE], 0), Strided::contiguous(&xf), &mut outf).unwrap();
            let wx: Vec<f32> = xf.iter().map(|x| x.to_f32()).collect();
            kernel(&vec![1.0; n], &wx, &mut want);
            assert!(outf.iter().zip(&want).all(|(o, w)| *o == f16::from_f32(*w)), "{op:?} f16");
        }
        let xh: Vec<f16> = xs.iter().map(|&x| f16::from_f32(x)).collect();
        let mut outh = vec![f16::ZERO; n];
        unary(UnaryOp::Gelu, Strided::contiguous(&xh), &mut outh).unwrap();
        for (o, x) in outh.iter().zip(&xh) {
            let w = x.to_f64().gelu();
            assert!((o.to_f64() - w).abs() <= 1e-3 * w.abs().max(1e-4), "f16 gelu({x}) = {o} vs {w}");
        }
        // An operand that does not fit is an error, as for every other op.
        assert!(unary(UnaryOp::Gelu, Strided::new(&xs, 1, 1), &mut got).is_err());
        assert!(binary(BinaryOp::GeluBackward, Strided::contiguous(&gs), Strided::new(&xs, 5, 1), &mut got).is_err());
    }
}
