//! The scalar traits the elementwise and reduction kernels share, one
//! hierarchy with one implementation per type:
//!
//! - [`Accumulator`]: what sums add in — `f32`, `f64`, `i64`.
//! - [`Float`]: the floating-point accumulators (`f32`, `f64`), with the math
//!   the elementwise ops, means, variances and softmax compute with.
//! - [`ReduceElement`]: a type stored in memory and widened to its
//!   accumulator — `f32`, `f64`, `f16`, `bf16` (in `f32`), `i64`, `u8` and
//!   `bool` (in `i64`).
//! - [`FloatElement`]: a stored type whose accumulator is a [`Float`] (`f32`,
//!   `f64`, `f16`, `bf16`); every such [`ReduceElement`] is one.
//!
//! Kernels widen a block of [`BLOCK`] elements at a time into a stack buffer
//! (or use the block as it is when no widening is needed), so the inner loops
//! run on plain `f32`/`f64`/`i64` slices that the compiler vectorises.

use crate::math::{erf, erfc, exp_f32, exp_shifted_f32, gelu_backward_f32, gelu_f32, gelu_tanh_backward_f32};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use std::f64::consts::FRAC_1_SQRT_2;
use std::fmt::Debug;
use std::ops::{Add, Div, Mul, Neg, Sub};

/// Elements widened and processed at once by the block kernels: small
/// enough for a stack buffer in L1, large enough to amortise the loop setup.
pub const BLOCK: usize = 256;

/// A type reductions accumulate in: `f32`, `f64` or `i64`.
pub trait Accumulator: Copy + Send + Sync + PartialOrd + Debug + 'static {
    /// The additive identity.
    const ZERO: Self;
    /// `self + other`; integers wrap on overflow, as PyTorch's do.
    fn add(self, other: Self) -> Self;
    /// `self` added `count` times: `self * count`, in one rounding for
    /// floats; wrapping for integers, like the repeated sum.
    fn times(self, count: usize) -> Self;
    /// Whether the value is a NaN (never, for integers).
    fn is_nan(self) -> bool;
}

macro_rules! float_accumulator {
    ($($t:ty),*) => {$(
        impl Accumulator for $t {
            const ZERO: Self = 0.0;
            #[inline(always)]
            fn add(self, other: Self) -> Self {
                self + other
            }
            #[inline(always)]
            fn times(self, count: usize) -> Self {
                self * count as $t
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
        }
    )*};
}
float_accumulator!(f32, f64);

impl Accumulator for i64 {
    const ZERO: Self = 0;
    #[inline(always)]
    fn add(self, other: Self) -> Self {
        self.wrapping_add(other)
    }
    #[inline(always)]
    fn times(self, count: usize) -> Self {
        // Modulo 2^64 this is the repeated wrapping sum, whatever `count`.
        self.wrapping_mul(count as i64)
    }
    #[inline(always)]
    fn is_nan(self) -> bool {
        false
    }
}

/// A floating-point type the kernels compute in (`f32` or `f64`): the
/// elementwise ops, and what means, variances and softmax accumulate in.
pub trait Float:
    Accumulator + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self> + Div<Output = Self> + Neg<Output = Self>
{
    /// 1.
    const ONE: Self;
    /// 0.5.
    const HALF: Self;
    /// Negative infinity, the identity of `max`.
    const NEG_INFINITY: Self;
    /// A quiet NaN.
    const NAN: Self;
    /// The nearest value to `value`.
    fn from_f64(value: f64) -> Self;
    /// The value, exactly.
    fn to_f64(self) -> f64;
    /// |x|.
    fn abs(self) -> Self;
    /// e^x (libm's).
    fn exp(self) -> Self;
    /// e^x for loops that must vectorise: for `f32`,
    /// [`exp_f32`] (within 2 ulp); for `f64`, libm's.
    fn fast_exp(self) -> Self;
    /// Natural logarithm.
    fn ln(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// Sine.
    fn sin(self) -> Self;
    /// Cosine.
    fn cos(self) -> Self;
    /// Hyperbolic tangent.
    fn tanh(self) -> Self;
    /// `self` to the power `exponent`.
    fn powf(self, exponent: Self) -> Self;
    /// The error function.
    fn erf(self) -> Self;
    /// `1 - erf(x)`, accurate where erf is close to 1.
    fn erfc(self) -> Self;
    /// `x * Φ(x)` with Φ the standard normal CDF (exact GELU), accurate for
    /// large negative `x` too. For `f32` the scalar form is correctly rounded
    /// (but for rare ties); the slice form [`Float::gelu_slice`] is the fast one.
    fn gelu(self) -> Self;
    /// `grad * (Φ(x) + x φ(x))`: GELU's derivative at `x` times the incoming
    /// gradient (PyTorch's `gelu_backward`), NaN at `x = ±inf` as there.
    /// Computed in f64 and rounded once for `f32`.
    fn gelu_backward(grad: Self, x: Self) -> Self;
    /// `out[i] = x[i].gelu()` over the common length. For `f32`, the
    /// vectorised [`gelu_f32`](crate::elementwise::gelu_f32) (within a few
    /// ulp, not correctly rounded).
    fn gelu_slice(x: &[Self], out: &mut [Self]) {
        gelu_each(x, out);
    }
    /// `out[i] = gelu_backward(grad[i], x[i])` over the common length; for
    /// `f32` the vectorised
    /// [`gelu_backward_f32`](crate::elementwise::gelu_backward_f32).
    fn gelu_backward_slice(grad: &[Self], x: &[Self], out: &mut [Self]) {
        gelu_backward_each(grad, x, out);
    }
    /// `out[i] = gelu_tanh_backward(grad[i], x[i])` over the common length;
    /// for `f32` the vectorised
    /// [`gelu_tanh_backward_f32`](crate::elementwise::gelu_tanh_backward_f32).
    fn gelu_tanh_backward_slice(grad: &[Self], x: &[Self], out: &mut [Self]) {
        gelu_tanh_backward_each(grad, x, out);
    }
    /// `out[i] = fast_exp(x[i] - shift)` for the common length, on the widest
    /// vectors this CPU has (for `f32`).
    fn exp_shifted(x: &[Self], shift: Self, out: &mut [Self]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = (v - shift).fast_exp();
        }
    }
}

/// GELU's tanh approximation.
#[inline(always)]
pub fn gelu_tanh<T: Float>(x: T) -> T {
    let k = T::from_f64(0.797_884_560_802_865_4); // √(2/π)
    let c = T::from_f64(0.044_715);
    T::HALF * x * (T::ONE + (k * (x + c * x * x * x)).tanh())
}

/// `grad` times the derivative of [`gelu_tanh`] at `x`. With
/// `u = √(2/π)(x + 0.044715 x³)` the derivative is
/// `(1 + tanh u)/2 + x/2 (1 - tanh² u) u'`; it is computed from
/// `e = e^(-2|u|) <= 1` as `σ(2u) + 2x σ(2|u|) σ(-2|u|) u'`, so that neither
/// term cancels (`1 + tanh u` for very negative `u`) or overflows. NaN at
/// `x = ±inf` (`inf · 0`), as PyTorch's formula gives.
#[inline(always)]
pub fn gelu_tanh_backward<T: Float>(grad: T, x: T) -> T {
    let k = T::from_f64(0.797_884_560_802_865_4); // √(2/π)
    let kc = T::from_f64(0.797_884_560_802_865_4 * 0.044_715);
    let kc3 = T::from_f64(3.0 * 0.797_884_560_802_865_4 * 0.044_715);
    let x2 = x * x;
    let u = x * (k + kc * x2);
    let du = k + kc3 * x2;
    let e = (-(u.abs() + u.abs())).exp();
    let big = T::ONE / (T::ONE + e);
    let small = e * big;
    let sigma = if u < <T as Accumulator>::ZERO { small } else { big };
    grad * (sigma + x * (big * small) * (du + du))
}

/// The scalar loops of [`Float`]'s GELU slice methods: their default
/// bodies, and `f32`'s path on the CPUs its vectorised kernels do not serve
/// (x86-64 without AVX2 + FMA).
fn gelu_each<F: Float>(x: &[F], out: &mut [F]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v.gelu();
    }
}

/// See [`gelu_each`].
fn gelu_backward_each<F: Float>(grad: &[F], x: &[F], out: &mut [F]) {
    for ((o, &g), &v) in out.iter_mut().zip(grad).zip(x) {
        *o = F::gelu_backward(g, v);
    }
}

/// See [`gelu_each`].
fn gelu_tanh_backward_each<F: Float>(grad: &[F], x: &[F], out: &mut [F]) {
    for ((o, &g), &v) in out.iter_mut().zip(grad).zip(x) {
        *o = gelu_tanh_backward(g, v);
    }
}

/// Trait methods `fn name(self) -> Self` that are the type's inherent method
/// of the same name.
macro_rules! inherent {
    ($t:ty: $($name:ident),*) => {$(
        #[inline(always)]
        fn $name(self) -> Self {
            <$t>::$name(self)
        }
    )*};
}

/// Trait methods `fn name(self) -> Self` computed by a given function.
macro_rules! computed_by {
    ($t:ty: $($name:ident = $f:expr),*) => {$(
        #[inline(always)]
        fn $name(self) -> Self {
            let f: fn($t) -> $t = $f;
            f(self)
        }
    )*};
}

macro_rules! impl_float {
    (
        $t:ty, fast_exp: $fast_exp:expr, erf: $erf:expr, erfc: $erfc:expr, gelu: $gelu:expr,
        gelu_backward: $gelu_backward:expr
        $(, exp_shifted: $exp_shifted:expr, gelu_slices: ($gelu_slice:expr, $gelu_backward_slice:expr, $gelu_tanh_backward_slice:expr))?
    ) => {
        impl Float for $t {
            const ONE: Self = 1.0;
            const HALF: Self = 0.5;
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            const NAN: Self = <$t>::NAN;
            #[inline(always)]
            fn from_f64(value: f64) -> Self {
                value as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            inherent!($t: abs, exp, ln, sqrt, sin, cos, tanh);
            #[inline(always)]
            fn powf(self, exponent: Self) -> Self {
                <$t>::powf(self, exponent)
            }
            computed_by!($t: fast_exp = $fast_exp, erf = $erf, erfc = $erfc, gelu = $gelu);
            #[inline(always)]
            fn gelu_backward(grad: Self, x: Self) -> Self {
                let f: fn($t, $t) -> $t = $gelu_backward;
                f(grad, x)
            }
            $(
                fn exp_shifted(x: &[Self], shift: Self, out: &mut [Self]) {
                    $exp_shifted(x, shift, out)
                }
                fn gelu_slice(x: &[Self], out: &mut [Self]) {
                    $gelu_slice(x, out)
                }
                fn gelu_backward_slice(grad: &[Self], x: &[Self], out: &mut [Self]) {
                    $gelu_backward_slice(grad, x, out)
                }
                fn gelu_tanh_backward_slice(grad: &[Self], x: &[Self], out: &mut [Self]) {
                    $gelu_tanh_backward_slice(grad, x, out)
                }
            )?
        }
    };
}

/// `1/√(2π)`, the normal density at 0.
const INV_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

/// GELU's derivative `Φ(x) + x φ(x)` in f64.
fn gelu_derivative_f64(x: f64) -> f64 {
    0.5 * erfc(-x * FRAC_1_SQRT_2) + x * ((-0.5 * x * x).exp() * INV_SQRT_2PI)
}

impl_float!(
    f64,
    fast_exp: f64::exp,
    erf: erf,
    erfc: erfc,
    gelu: |x| 0.5 * x * erfc(-x * FRAC_1_SQRT_2),
    gelu_backward: |grad, x| grad * gelu_derivative_f64(x)
);
// f32's erf family evaluates the f64 one and rounds once; its fast
// exponential and its GELU slices are the vectorised ones (with the scalar
// loops where the GELU kernels do not run).
impl_float!(
    f32,
    fast_exp: exp_f32,
    erf: |x| erf(f64::from(x)) as f32,
    erfc: |x| erfc(f64::from(x)) as f32,
    gelu: |x| {
        let x = f64::from(x);
        (0.5 * x * erfc(-x * FRAC_1_SQRT_2)) as f32
    },
    gelu_backward: |grad, x| (f64::from(grad) * gelu_derivative_f64(f64::from(x))) as f32,
    exp_shifted: exp_shifted_f32,
    gelu_slices: (
        |x, out| gelu_f32(x, out, gelu_each::<f32>),
        |grad, x, out| gelu_backward_f32(grad, x, out, gelu_backward_each::<f32>),
        |grad, x, out| gelu_tanh_backward_f32(grad, x, out, gelu_tanh_backward_each::<f32>)
    )
);

/// An element type the kernels accept: `f32`, `f64`, `f16`, `bf16`, `i64`,
/// `u8` and `bool`.
pub trait ReduceElement: Copy + Send + Sync + PartialOrd + Debug + 'static {
    /// What this type computes and sums in (`f32` for the half types, `i64`
    /// for integers and `bool`).
    type Acc: Accumulator;
    /// Widens one element (exact).
    fn to_acc(self) -> Self::Acc;
    /// Narrows an accumulator back: rounds to nearest for floats, wraps for
    /// integers, "not zero" for `bool`. Exact for any value `to_acc` made.
    fn from_acc(acc: Self::Acc) -> Self;
    /// The block (at most [`BLOCK`] elements) widened: the block itself when
    /// the type is its own accumulator, else converted into `buf`.
    fn widen<'a>(block: &'a [Self], buf: &'a mut [Self::Acc; BLOCK]) -> &'a [Self::Acc];
    /// Widens `src` into `dst` (the shorter bounds it), as
    /// [`ReduceElement::to_acc`] element by element; vectorised for the half
    /// types.
    #[inline]
    fn widen_into(src: &[Self], dst: &mut [Self::Acc]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s.to_acc();
        }
    }
    /// Narrows a block of accumulators into `out` (the shorter bounds it),
    /// as [`ReduceElement::from_acc`] element by element; vectorised for the
    /// half types, whose element-wise rounding does not vectorise.
    #[inline]
    fn narrow_block(acc: &[Self::Acc], out: &mut [Self]) {
        for (o, &a) in out.iter_mut().zip(acc) {
            *o = Self::from_acc(a);
        }
    }
}

macro_rules! identity_element {
    ($($t:ty),*) => {$(
        impl ReduceElement for $t {
            type Acc = $t;
            #[inline(always)]
            fn to_acc(self) -> $t {
                self
            }
            #[inline(always)]
            fn from_acc(acc: $t) -> Self {
                acc
            }
            #[inline(always)]
            fn widen<'a>(block: &'a [Self], _buf: &'a mut [$t; BLOCK]) -> &'a [$t] {
                block
            }
            #[inline]
            fn widen_into(src: &[$t], dst: &mut [$t]) {
                let len = src.len().min(dst.len());
                dst[..len].copy_from_slice(&src[..len]);
            }
            #[inline]
            fn narrow_block(acc: &[$t], out: &mut [$t]) {
                let len = acc.len().min(out.len());
                out[..len].copy_from_slice(&acc[..len]);
            }
        }
    )*};
}
identity_element!(f32, f64, i64);

macro_rules! half_element {
    ($($t:ty => $to_f32:expr, $from_f32:expr, $widen:expr, $narrow:expr);*) => {$(
        impl ReduceElement for $t {
            type Acc = f32;
            #[inline(always)]
            fn to_acc(self) -> f32 {
                let to_f32: fn($t) -> f32 = $to_f32;
                to_f32(self)
            }
            #[inline(always)]
            fn from_acc(acc: f32) -> Self {
                let from_f32: fn(f32) -> $t = $from_f32;
                from_f32(acc)
            }
            #[inline]
            fn widen<'a>(block: &'a [Self], buf: &'a mut [f32; BLOCK]) -> &'a [f32] {
                let len = block.len().min(BLOCK);
                let (src, dst) = (&block[..len], &mut buf[..len]);
                Self::widen_into(src, dst);
                dst
            }
            #[inline]
            fn widen_into(src: &[$t], dst: &mut [f32]) {
                let len = src.len().min(dst.len());
                let widen: fn(&[$t], &mut [f32]) = $widen;
                widen(&src[..len], &mut dst[..len]);
            }
            #[inline]
            fn narrow_block(acc: &[f32], out: &mut [Self]) {
                let len = acc.len().min(out.len());
                let narrow: fn(&[f32], &mut [$t]) = $narrow;
                narrow(&acc[..len], &mut out[..len]);
            }
        }
    )*};
}
// bf16 converts with `convert`'s branchless pair, as its slices do: widening
// is the shift PyTorch's bf16 -> float is (a signalling NaN stays one until
// arithmetic quiets it; `bf16::to_f32` quiets it at once), rounding is bit
// for bit `bf16::from_f32` without its data-dependent round-up branch. A
// scatter of bf16 sums, as max pooling's backward does, ran 1.6x faster.
half_element!(
    f16 => f16::to_f32, f16::from_f32,
        |src, dst| src.convert_to_f32_slice(dst), |src, dst| dst.convert_from_f32_slice(src);
    bf16 => crate::convert::bf16_to_f32, crate::convert::f32_to_bf16,
        crate::convert::widen_bf16_slice, crate::convert::narrow_bf16_slice
);

/// Small integer types summed in `i64`; `$narrow` maps an accumulator back.
macro_rules! small_int_element {
    ($($t:ty => $narrow:expr),*) => {$(
        impl ReduceElement for $t {
            type Acc = i64;
            #[inline(always)]
            fn to_acc(self) -> i64 {
                i64::from(self)
            }
            #[inline(always)]
            fn from_acc(acc: i64) -> Self {
                let narrow: fn(i64) -> $t = $narrow;
                narrow(acc)
            }
            #[inline]
            fn widen<'a>(block: &'a [Self], buf: &'a mut [i64; BLOCK]) -> &'a [i64] {
                let len = block.len().min(BLOCK);
                for (d, &s) in buf.iter_mut().zip(&block[..len]) {
                    *d = i64::from(s);
                }
                &buf[..len]
            }
        }
    )*};
}
small_int_element!(u8 => |acc| acc as u8, bool => |acc| acc != 0);

/// An element type stored in memory and computed in a [`Float`]: f32 and f64
/// are computed as themselves, f16 and bf16 in f32 (rounded once on store).
/// Every [`ReduceElement`] whose accumulator is a [`Float`] is one.
pub trait FloatElement: ReduceElement {
    /// The type arithmetic happens in (the accumulator).
    type Compute: Float;
    /// Widens to the compute type (exact).
    fn load(self) -> Self::Compute;
    /// Rounds a computed value to this type.
    fn store(value: Self::Compute) -> Self;
    /// [`FloatElement::load`] over a slice (the shorter bounds it), vectorised
    /// for the half types.
    fn load_slice(src: &[Self], dst: &mut [Self::Compute]);
    /// [`FloatElement::store`] over a slice (the shorter bounds it),
    /// vectorised for the half types.
    fn store_slice(src: &[Self::Compute], dst: &mut [Self]);
}

impl<T: ReduceElement> FloatElement for T
where
    T::Acc: Float,
{
    type Compute = T::Acc;
    #[inline(always)]
    fn load(self) -> T::Acc {
        self.to_acc()
    }
    #[inline(always)]
    fn store(value: T::Acc) -> Self {
        T::from_acc(value)
    }
    #[inline]
    fn load_slice(src: &[Self], dst: &mut [T::Acc]) {
        T::widen_into(src, dst);
    }
    #[inline]
    fn store_slice(src: &[T::Acc], dst: &mut [Self]) {
        T::narrow_block(src, dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_is_the_repeated_sum() {
        assert_eq!(1.5f32.times(4), 6.0);
        assert_eq!(0.25f64.times(3), 0.75);
        assert_eq!(7i64.times(3), 21);
        // Wraps like adding i64::MAX twice.
        assert_eq!(i64::MAX.times(2), i64::MAX.wrapping_add(i64::MAX));
        assert!(f32::NAN.times(2).is_nan());
    }

    #[test]
    fn elements_round_trip_through_their_accumulator() {
        assert_eq!(f16::from_acc(f16::from_f32(1.5).to_acc()), f16::from_f32(1.5));
        assert_eq!(bf16::from_f32(-2.0).load(), -2.0f32);
        assert_eq!(<bf16 as FloatElement>::store(0.5), bf16::from_f32(0.5));
        assert_eq!(u8::from_acc(300), 44);
        assert!(bool::from_acc(2) && !bool::from_acc(0));
        let mut buf = [0i64; BLOCK];
        assert_eq!(<bool as ReduceElement>::widen(&[true, false, true], &mut buf), [1, 0, 1]);
        let mut buf = [0f32; BLOCK];
        let halves = [f16::from_f32(0.5), f16::from_f32(-1.0)];
        assert_eq!(f16::widen(&halves, &mut buf), [0.5, -1.0]);
    }

    #[test]
    fn fast_exp_is_the_vectorisable_one_for_f32_and_libm_for_f64() {
        assert_eq!(1.0f32.fast_exp(), exp_f32(1.0));
        assert_eq!(Float::exp(1.0f32), 1.0f32.exp());
        assert_eq!(1.0f64.fast_exp(), 1.0f64.exp());
        let mut out = [0.0f32; 3];
        f32::exp_shifted(&[1.0, 2.0, 3.0], 1.0, &mut out);
        assert_eq!(out, [1.0, exp_f32(1.0), exp_f32(2.0)]);
    }
}
