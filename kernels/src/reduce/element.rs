//! The element types the reduction kernels accept and the accumulator types
//! they compute in.
//!
//! Every element type widens into an [`Accumulator`]: floats into `f32`
//! (`f16`, `bf16`, `f32`) or `f64`, integers and `bool` into `i64`. Kernels
//! widen a block of [`BLOCK`] elements at a time into a stack buffer (or use
//! the block as it is when no widening is needed), so the inner loops run on
//! plain `f32`/`f64`/`i64` slices that the compiler vectorises.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use std::fmt::Debug;

/// Elements widened and processed at once by the block kernels: small
/// enough for a stack buffer in L1, large enough to amortise the loop setup.
pub const BLOCK: usize = 256;

/// A type reductions accumulate in: `f32`, `f64` or `i64`.
pub trait Accumulator: Copy + Send + Sync + PartialOrd + Debug + 'static {
    /// The additive identity.
    const ZERO: Self;
    /// `self + other`; integers wrap on overflow, as PyTorch's do.
    fn add(self, other: Self) -> Self;
    /// Whether the value is a NaN (never, for integers).
    fn is_nan(self) -> bool;
}

impl Accumulator for f32 {
    const ZERO: Self = 0.0;
    #[inline(always)]
    fn add(self, other: Self) -> Self {
        self + other
    }
    #[inline(always)]
    fn is_nan(self) -> bool {
        self.is_nan()
    }
}

impl Accumulator for f64 {
    const ZERO: Self = 0.0;
    #[inline(always)]
    fn add(self, other: Self) -> Self {
        self + other
    }
    #[inline(always)]
    fn is_nan(self) -> bool {
        self.is_nan()
    }
}

impl Accumulator for i64 {
    const ZERO: Self = 0;
    #[inline(always)]
    fn add(self, other: Self) -> Self {
        self.wrapping_add(other)
    }
    #[inline(always)]
    fn is_nan(self) -> bool {
        false
    }
}

/// A floating-point accumulator (`f32` or `f64`): what means, variances and
/// softmax compute in.
pub trait FloatAccumulator:
    Accumulator
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Add<Output = Self>
{
    /// Negative infinity, the identity of `max`.
    const NEG_INFINITY: Self;
    /// A quiet NaN.
    const NAN: Self;
    /// One.
    const ONE: Self;
    /// The nearest value to `value`.
    fn from_f64(value: f64) -> Self;
    /// The value as an f64 (exact).
    fn to_f64(self) -> f64;
    /// `e^self` (for `f32`, [`exp_f32`](super::exp_f32): within 2 ulp).
    fn exp(self) -> Self;
    /// The natural logarithm.
    fn ln(self) -> Self;
    /// The square root.
    fn sqrt(self) -> Self;
    /// `out[i] = e^(x[i] - shift)` for the common length, on the widest
    /// vectors this CPU has (for `f32`).
    fn exp_shifted(x: &[Self], shift: Self, out: &mut [Self]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = (v - shift).exp();
        }
    }
}

macro_rules! float_accumulator {
    ($t:ty, $exp:expr $(, $exp_shifted:expr)?) => {
        impl FloatAccumulator for $t {
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            const NAN: Self = <$t>::NAN;
            const ONE: Self = 1.0;
            #[inline(always)]
            fn from_f64(value: f64) -> Self {
                value as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn exp(self) -> Self {
                $exp(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            $(
                fn exp_shifted(x: &[Self], shift: Self, out: &mut [Self]) {
                    $exp_shifted(x, shift, out)
                }
            )?
        }
    };
}
// f32's exponential is the vectorisable one (within 2 ulp); f64 keeps libm's.
float_accumulator!(f32, super::softmax::exp_f32, super::softmax::exp_shifted_f32);
float_accumulator!(f64, f64::exp);

/// An element type the reduction kernels accept: `f32`, `f64`, `f16`,
/// `bf16`, `i64`, `u8` and `bool`.
pub trait ReduceElement: Copy + Send + Sync + PartialOrd + Debug + 'static {
    /// What sums of this type accumulate in (`f32` for the half types, `i64`
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
}

macro_rules! identity_element {
    ($t:ty) => {
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
        }
    };
}
identity_element!(f32);
identity_element!(f64);
identity_element!(i64);

macro_rules! half_element {
    ($t:ty) => {
        impl ReduceElement for $t {
            type Acc = f32;
            #[inline(always)]
            fn to_acc(self) -> f32 {
                self.to_f32()
            }
            #[inline(always)]
            fn from_acc(acc: f32) -> Self {
                <$t>::from_f32(acc)
            }
            #[inline]
            fn widen<'a>(block: &'a [Self], buf: &'a mut [f32; BLOCK]) -> &'a [f32] {
                let len = block.len().min(BLOCK);
                let (src, dst) = (&block[..len], &mut buf[..len]);
                src.convert_to_f32_slice(dst);
                dst
            }
        }
    };
}
half_element!(f16);
half_element!(bf16);

impl ReduceElement for u8 {
    type Acc = i64;
    #[inline(always)]
    fn to_acc(self) -> i64 {
        i64::from(self)
    }
    #[inline(always)]
    fn from_acc(acc: i64) -> Self {
        acc as u8
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

impl ReduceElement for bool {
    type Acc = i64;
    #[inline(always)]
    fn to_acc(self) -> i64 {
        i64::from(self)
    }
    #[inline(always)]
    fn from_acc(acc: i64) -> Self {
        acc != 0
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
