//! Element types: [`DType`], the Rust types that carry them ([`WithDType`]),
//! casts between any two of them, and the promotion rule for mixed-dtype ops.

use std::any::TypeId;
use std::fmt;
use std::str::FromStr;

use brasa_kernels::convert::{bf16_to_f32, f32_to_bf16, narrow_bf16_slice, widen_bf16_slice};
use half::{bf16, f16};

/// The element type of a tensor.
///
/// The variants are declared in promotion order (see [`DType::promote`]), so
/// `Ord` sorts them from the narrowest category to the widest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// Booleans, one byte each (0 or 1).
    Bool,
    /// Unsigned 8-bit integers.
    U8,
    /// Signed 64-bit integers.
    I64,
    /// IEEE 754 half precision (`half::f16`).
    F16,
    /// bfloat16: f32's exponent range with an 8-bit mantissa (`half::bf16`).
    BF16,
    /// IEEE 754 single precision.
    F32,
    /// IEEE 754 double precision.
    F64,
}

/// Why a dtype operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DTypeError {
    /// A dtype name that is none of brasa's (the name given).
    #[error("unknown dtype {0:?}: expected one of bool, u8, i64, f16, bf16, f32, f64")]
    UnknownName(String),
    /// `convert_slice` between slices of different lengths.
    #[error("convert_slice: source has {src_len} elements but destination has {dst_len}")]
    LengthMismatch {
        /// Elements in the source.
        src_len: usize,
        /// Elements in the destination.
        dst_len: usize,
    },
}

impl DType {
    /// Every dtype, in promotion order.
    pub const ALL: [DType; 7] = [DType::Bool, DType::U8, DType::I64, DType::F16, DType::BF16, DType::F32, DType::F64];

    /// Bytes one element occupies in storage.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::Bool | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// The short lowercase name used in messages and file formats (`"f32"`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// True for the floating-point dtypes (f16, bf16, f32, f64).
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// True for the integer dtypes (u8, i64). `Bool` is neither integral nor
    /// float: it is its own, lowest, promotion category.
    pub const fn is_integral(self) -> bool {
        matches!(self, DType::U8 | DType::I64)
    }

    /// True for `Bool`.
    pub const fn is_bool(self) -> bool {
        matches!(self, DType::Bool)
    }

    /// Whether a scalar can be stored in this dtype without overflow, by
    /// PyTorch's rule for scalars put into a tensor (c10's `checked_convert`,
    /// behind `full`, `fill_` and `new_full`):
    ///
    /// - bool takes anything (non-zero, NaN included, is true);
    /// - float dtypes take NaN, the infinities, and finite values up to their
    ///   largest finite value (`1e6` does not fit f16, `1e39` not f32);
    /// - integer dtypes take finite values whose integer part they hold; the
    ///   fraction is dropped (`1.9` becomes 1). Into u8, an integral value
    ///   from -255 to -1 wraps as two's complement (`-1` becomes 255), as
    ///   PyTorch does with a Python `int`; a negative fraction does not fit,
    ///   as a Python `float` does not (an `f64` with no fractional part stands
    ///   for an `int`, as everywhere in brasa's scalar rules).
    pub fn can_hold(self, value: f64) -> bool {
        /// 2^63: i64 holds `-2^63..2^63` (NaN is in no range).
        const I64_BOUND: f64 = 9_223_372_036_854_775_808.0;
        let within = |max: f64| !value.is_finite() || value.abs() <= max;
        match self {
            DType::Bool | DType::F64 => true,
            DType::F32 => within(f64::from(f32::MAX)),
            DType::F16 => within(f16::MAX.to_f64()),
            DType::BF16 => within(bf16::MAX.to_f64()),
            DType::I64 => (-I64_BOUND..I64_BOUND).contains(&value),
            DType::U8 if value.fract() == 0.0 => (-255.0..=255.0).contains(&value),
            DType::U8 => (0.0..=255.0).contains(&value),
        }
    }

    /// The dtype a binary op on `a` and `b` computes in, following PyTorch's
    /// rule for two tensors of the same dimension category:
    ///
    /// - categories are ordered `bool < integral < floating`; the result takes
    ///   the higher category, and within it the operand of that category
    ///   (`i64 + f16 → f16`, `bool + u8 → u8`);
    /// - among integers the wider one wins (`u8 + i64 → i64`);
    /// - among floats the wider one wins, except that f16 and bf16, neither of
    ///   which can represent the other, meet at f32.
    ///
    /// The rule is a lattice join, so it is commutative, associative and
    /// idempotent; reducing a list of dtypes in any order gives one answer.
    /// PyTorch's extra rule for zero-dimensional tensors and Python scalars
    /// (which do not lift the category's width) is the op layer's business.
    pub const fn promote(a: DType, b: DType) -> DType {
        use DType::*;
        match (a, b) {
            (F16, BF16) | (BF16, F16) => F32,
            // Otherwise the declaration order is the promotion order.
            _ => {
                if (a as u8) >= (b as u8) {
                    a
                } else {
                    b
                }
            }
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = DTypeError;

    /// Parses the names [`DType::name`] returns.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DType::ALL.into_iter().find(|dtype| dtype.name() == s).ok_or_else(|| DTypeError::UnknownName(s.to_string()))
    }
}

/// A Rust type that stores elements of one [`DType`], with casts to and from
/// every other such type.
///
/// Casts follow Rust's `as` (which is also what PyTorch does on the CPU):
/// float → integer truncates toward zero and saturates (NaN → 0); integer →
/// narrower integer wraps (`300 as u8 == 44`); anything → bool is "not zero"
/// (NaN → true); bool → number is 0 or 1; float → narrower float and integer →
/// float round to nearest, ties to even, with a single rounding.
pub trait WithDType: Copy + Send + Sync + PartialEq + PartialOrd + fmt::Debug + Default + 'static {
    /// The dtype this type stores.
    const DTYPE: DType;
    /// Zero (`false` for bool).
    const ZERO: Self;
    /// One (`true` for bool).
    const ONE: Self;

    /// The value as an f64: exact for every type except i64 beyond ±2^53.
    fn to_f64(self) -> f64;
    /// Rounds or truncates an f64 into this type, by the rules above.
    fn from_f64(value: f64) -> Self;
    /// The value as an i64: floats truncate toward zero and saturate.
    fn to_i64(self) -> i64;
    /// Converts an i64: integers wrap, floats round to nearest.
    fn from_i64(value: i64) -> Self;

    /// Converts to another element type by the rules above.
    #[inline]
    fn cast<D: WithDType>(self) -> D {
        if let Some(value) = half_f32_cast(self) {
            return value;
        }
        // Floats travel through f64, which holds every f16/bf16/f32 exactly;
        // integers and bools travel through i64, which holds u8/bool exactly
        // and keeps i64 → i64 lossless.
        if Self::DTYPE.is_float() {
            D::from_f64(self.to_f64())
        } else {
            D::from_i64(self.to_i64())
        }
    }

    /// The value as an f32, rounded once.
    #[inline]
    fn to_f32(self) -> f32 {
        self.cast()
    }

    /// Converts an f32 by the rules above.
    #[inline]
    fn from_f32(value: f32) -> Self {
        Self::from_f64(f64::from(value))
    }
}

impl WithDType for f32 {
    const DTYPE: DType = DType::F32;
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    #[inline]
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    #[inline]
    fn from_f64(value: f64) -> Self {
        value as f32
    }
    #[inline]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline]
    fn from_i64(value: i64) -> Self {
        value as f32
    }
}

impl WithDType for f64 {
    const DTYPE: DType = DType::F64;
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    #[inline]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline]
    fn from_f64(value: f64) -> Self {
        value
    }
    #[inline]
    fn to_i64(self) -> i64 {
        self as i64
    }
    #[inline]
    fn from_i64(value: i64) -> Self {
        value as f64
    }
}

impl WithDType for f16 {
    const DTYPE: DType = DType::F16;
    const ZERO: Self = f16::ZERO;
    const ONE: Self = f16::ONE;
    #[inline]
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    #[inline]
    fn from_f64(value: f64) -> Self {
        // `half`'s own f64 conversion drops the low mantissa bits before
        // rounding, which can round the wrong way; its f32 one is exact.
        f16::from_f32(f64_to_f32_round_to_odd(value))
    }
    #[inline]
    fn to_i64(self) -> i64 {
        f16::to_f32(self) as i64
    }
    #[inline]
    fn from_i64(value: i64) -> Self {
        // `as f32` is exact up to 2^24, and every i64 beyond f16's largest
        // finite value (65504) rounds to infinity either way: one rounding.
        f16::from_f32(value as f32)
    }
}

impl WithDType for bf16 {
    const DTYPE: DType = DType::BF16;
    const ZERO: Self = bf16::ZERO;
    const ONE: Self = bf16::ONE;
    #[inline]
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    #[inline]
    fn from_f64(value: f64) -> Self {
        // See f16::from_f64.
        bf16::from_f32(f64_to_f32_round_to_odd(value))
    }
    #[inline]
    fn to_i64(self) -> i64 {
        bf16::to_f32(self) as i64
    }
    #[inline]
    fn from_i64(value: i64) -> Self {
        // Rounding i64 → f32 → bf16 to nearest twice can land on the wrong
        // side of a tie; rounding to odd first makes the second rounding exact.
        bf16::from_f32(i64_to_f32_round_to_odd(value))
    }
}

impl WithDType for i64 {
    const DTYPE: DType = DType::I64;
    const ZERO: Self = 0;
    const ONE: Self = 1;
    #[inline]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline]
    fn from_f64(value: f64) -> Self {
        value as i64
    }
    #[inline]
    fn to_i64(self) -> i64 {
        self
    }
    #[inline]
    fn from_i64(value: i64) -> Self {
        value
    }
}

impl WithDType for u8 {
    const DTYPE: DType = DType::U8;
    const ZERO: Self = 0;
    const ONE: Self = 1;
    #[inline]
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    #[inline]
    fn from_f64(value: f64) -> Self {
        value as u8
    }
    #[inline]
    fn to_i64(self) -> i64 {
        i64::from(self)
    }
    #[inline]
    fn from_i64(value: i64) -> Self {
        value as u8
    }
}

impl WithDType for bool {
    const DTYPE: DType = DType::Bool;
    const ZERO: Self = false;
    const ONE: Self = true;
    #[inline]
    fn to_f64(self) -> f64 {
        f64::from(u8::from(self))
    }
    #[inline]
    fn from_f64(value: f64) -> Self {
        value != 0.0
    }
    #[inline]
    fn to_i64(self) -> i64 {
        i64::from(self)
    }
    #[inline]
    fn from_i64(value: i64) -> Self {
        value != 0
    }
}

/// Whether a scalar acts as an integer (Python `int`) rather than a float in
/// the op's dtype rule: finite with no fractional part.
pub(crate) fn is_integral_value(value: f64) -> bool {
    value.is_finite() && value.fract() == 0.0
}

/// `value` as an f32 rounded to odd: truncated toward zero, then the lowest
/// mantissa bit set when the truncation was inexact. A later round-to-nearest
/// to a format with at least two fewer mantissa bits (f16, bf16) is then
/// exactly the single rounding of `value`.
fn f64_to_f32_round_to_odd(value: f64) -> f32 {
    let nearest = value as f32;
    if f64::from(nearest) == value || value.is_nan() {
        return nearest;
    }
    let mut bits = nearest.to_bits();
    // Moving the magnitude one ulp toward zero is a decrement of the bits,
    // whatever the sign; f32::MAX stands in for an overflow to infinity.
    if f64::from(nearest).abs() > value.abs() {
        bits -= 1;
    }
    f32::from_bits(bits | 1)
}

/// [`f64_to_f32_round_to_odd`] for integers, which f64 may not hold exactly.
fn i64_to_f32_round_to_odd(value: i64) -> f32 {
    let nearest = value as f32;
    // f32 values up to 2^64 are integers that fit i128 exactly.
    let nearest_exact = nearest as i128;
    let wanted = i128::from(value);
    if nearest_exact == wanted {
        return nearest;
    }
    let mut bits = nearest.to_bits();
    // Moving the magnitude one ulp toward zero is a decrement of the bits,
    // whatever the sign.
    if nearest_exact.abs() > wanted.abs() {
        bits -= 1;
    }
    f32::from_bits(bits | 1)
}

/// `value` as a `B`, when `A` is `B`.
#[inline(always)]
fn same_type<A: Copy + 'static, B: Copy + 'static>(value: A) -> Option<B> {
    // SAFETY: A and B are the same type.
    (TypeId::of::<A>() == TypeId::of::<B>()).then(|| unsafe { std::mem::transmute_copy(&value) })
}

/// `slice` as a `[B]`, when `A` is `B`.
#[inline(always)]
fn same_slice<A: 'static, B: 'static>(slice: &[A]) -> Option<&[B]> {
    // SAFETY: A and B are the same type.
    (TypeId::of::<A>() == TypeId::of::<B>()).then(|| unsafe { &*(slice as *const [A] as *const [B]) })
}

/// `slice` as a `[B]`, when `A` is `B`.
#[inline(always)]
fn same_slice_mut<A: 'static, B: 'static>(slice: &mut [A]) -> Option<&mut [B]> {
    // SAFETY: A and B are the same type.
    (TypeId::of::<A>() == TypeId::of::<B>()).then(|| unsafe { &mut *(slice as *mut [A] as *mut [B]) })
}

/// The casts between f32 and f16 or bf16, done directly: the general path
/// through f64 gives the same values (the f32 is exact in f64 and is rounded
/// once) but is several times slower, and these casts are the mixed-precision
/// hot path.
#[inline(always)]
fn half_f32_cast<S: WithDType, D: WithDType>(value: S) -> Option<D> {
    match (S::DTYPE, D::DTYPE) {
        (DType::BF16, DType::F32) => same_type(bf16_to_f32(same_type(value)?)),
        (DType::F32, DType::BF16) => same_type(f32_to_bf16(same_type(value)?)),
        (DType::F16, DType::F32) => same_type(same_type::<S, f16>(value)?.to_f32()),
        (DType::F32, DType::F16) => same_type(f16::from_f32(same_type(value)?)),
        _ => None,
    }
}

/// The slice conversions between f32 and f16 or bf16, when `S` and `D` are
/// such a pair; returns whether it converted. f16 goes through `half`'s slice
/// conversions, which use the F16C instructions when the CPU has them.
fn convert_half_f32_slice<S: WithDType, D: WithDType>(src: &[S], dst: &mut [D]) -> bool {
    use half::slice::HalfFloatSliceExt;
    match (S::DTYPE, D::DTYPE) {
        (DType::BF16, DType::F32) => same_slice(src).zip(same_slice_mut(dst)).map(|(s, d)| widen_bf16_slice(s, d)),
        (DType::F32, DType::BF16) => same_slice(src).zip(same_slice_mut(dst)).map(|(s, d)| narrow_bf16_slice(s, d)),
        (DType::F16, DType::F32) => {
            same_slice::<S, f16>(src).zip(same_slice_mut(dst)).map(|(s, d)| s.convert_to_f32_slice(d))
        }
        (DType::F32, DType::F16) => {
            same_slice(src).zip(same_slice_mut::<D, f16>(dst)).map(|(s, d)| d.convert_from_f32_slice(s))
        }
        _ => None,
    }
    .is_some()
}

/// Casts every element of `src` into `dst` by [`WithDType::cast`].
///
/// Fails, writing nothing, when the lengths differ.
pub fn convert_slice<S: WithDType, D: WithDType>(src: &[S], dst: &mut [D]) -> Result<(), DTypeError> {
    if src.len() != dst.len() {
        return Err(DTypeError::LengthMismatch { src_len: src.len(), dst_len: dst.len() });
    }
    if convert_half_f32_slice(src, dst) {
        return Ok(());
    }
    for (out, &value) in dst.iter_mut().zip(src) {
        *out = value.cast();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_dtype() -> impl Strategy<Value = DType> {
        proptest::sample::select(DType::ALL.to_vec())
    }

    #[test]
    fn sizes_names_and_categories() {
        let table = [
            (DType::Bool, 1, "bool", false, false),
            (DType::U8, 1, "u8", false, true),
            (DType::I64, 8, "i64", false, true),
            (DType::F16, 2, "f16", true, false),
            (DType::BF16, 2, "bf16", true, false),
            (DType::F32, 4, "f32", true, false),
            (DType::F64, 8, "f64", true, false),
        ];
        for (dtype, size, name, float, integral) in table {
            assert_eq!(dtype.size_in_bytes(), size);
            assert_eq!(dtype.name(), name);
            assert_eq!(dtype.to_string(), name);
            assert_eq!(name.parse::<DType>(), Ok(dtype));
            assert_eq!(dtype.is_float(), float, "{dtype}");
            assert_eq!(dtype.is_integral(), integral, "{dtype}");
        }
        assert_eq!("f8".parse::<DType>(), Err(DTypeError::UnknownName("f8".into())));
    }

    #[test]
    fn rust_types_map_to_their_dtype_and_size() {
        fn check<T: WithDType>() {
            assert_eq!(std::mem::size_of::<T>(), T::DTYPE.size_in_bytes());
        }
        check::<f32>();
        check::<f64>();
        check::<f16>();
        check::<bf16>();
        check::<i64>();
        check::<u8>();
        check::<bool>();
        assert_eq!(<bf16 as WithDType>::DTYPE, DType::BF16);
    }

    /// f32 bit patterns around every rounding case (zeros, subnormals, ties
    /// with even and odd kept halves, the largest finite values, infinities,
    /// NaNs) and a sweep of the whole range.
    fn f32_probes() -> Vec<f32> {
        let lows = [0, 1, 0x7fff, 0x8000, 0x8001, 0xffff, 0x1000, 0x2000, 0x3000];
        let highs = (0..=0xffffu32).step_by(13).chain([0, 1, 0x7f7f, 0x7f80, 0x7f81, 0x7fc0, 0x477f, 0x3880, 0x3380]);
        let mut bits: Vec<u32> = highs.flat_map(|h| lows.map(move |l| (h << 16) | l)).collect();
        bits.extend((0..100_000u32).map(|i| i.wrapping_mul(0x9e37_79b9)));
        bits.into_iter().flat_map(|b| [b, b | 0x8000_0000]).map(f32::from_bits).collect()
    }

    #[test]
    fn half_float_slice_conversions_match_half() {
        let xs = f32_probes();
        for len in (0..40).chain([1001, xs.len()]) {
            let src = &xs[..len];
            let mut b = vec![bf16::ZERO; len];
            convert_slice(src, &mut b).unwrap();
            let mut h = vec![f16::ZERO; len];
            convert_slice(src, &mut h).unwrap();
            for (i, &x) in src.iter().enumerate() {
                assert_eq!(b[i].to_bits(), bf16::from_f32(x).to_bits(), "bf16 of {x:e}");
                assert_eq!(b[i].to_bits(), x.cast::<bf16>().to_bits(), "bf16 cast of {x:e}");
                assert_eq!(h[i].to_bits(), f16::from_f32(x).to_bits(), "f16 of {x:e}");
                assert_eq!(h[i].to_bits(), x.cast::<f16>().to_bits(), "f16 cast of {x:e}");
            }
            let mut wide = vec![0.0f32; len];
            convert_slice(&b, &mut wide).unwrap();
            for (&w, &v) in wide.iter().zip(&b) {
                // bf16 widening is exact, payload and all.
                assert_eq!(w.to_bits(), u32::from(v.to_bits()) << 16);
                assert_eq!(w.to_bits(), v.cast::<f32>().to_bits());
            }
            convert_slice(&h, &mut wide).unwrap();
            for (&w, &v) in wide.iter().zip(&h) {
                assert!(w == v.to_f32() || w.is_nan() && v.is_nan(), "{v}");
                assert!(w.to_bits() == v.cast::<f32>().to_bits() || w.is_nan() && v.is_nan(), "{v}");
            }
        }
    }

    #[test]
    fn half_float_fast_casts_agree_with_the_f64_path() {
        for x in f32_probes().into_iter().filter(|x| !x.is_nan()) {
            // The general path: through f64, rounded once.
            assert_eq!(x.cast::<bf16>(), <bf16 as WithDType>::from_f64(f64::from(x)), "{x:e}");
            assert_eq!(x.cast::<f16>(), <f16 as WithDType>::from_f64(f64::from(x)), "{x:e}");
            assert_eq!(x.cast::<bf16>().cast::<f32>(), x.cast::<bf16>().to_f64() as f32);
            assert_eq!(x.cast::<f16>().cast::<f32>(), x.cast::<f16>().to_f64() as f32);
        }
    }

    #[test]
    fn promotion_follows_pytorch() {
        use DType::*;
        let cases = [
            (Bool, Bool, Bool),
            (Bool, U8, U8),
            (U8, I64, I64),
            (Bool, I64, I64),
            (I64, F16, F16),
            (U8, BF16, BF16),
            (Bool, F32, F32),
            (F16, BF16, F32),
            (F16, F32, F32),
            (BF16, F64, F64),
            (F32, F64, F64),
            (I64, F64, F64),
        ];
        for (a, b, expected) in cases {
            assert_eq!(DType::promote(a, b), expected, "{a} with {b}");
            assert_eq!(DType::promote(b, a), expected, "{b} with {a}");
        }
    }

    #[test]
    fn casts_follow_rust_as() {
        assert_eq!((-2.7f32).cast::<i64>(), -2);
        assert_eq!(2.7f64.cast::<u8>(), 2);
        assert_eq!((-5.0f32).cast::<u8>(), 0, "saturates below");
        assert_eq!(1e9f32.cast::<u8>(), 255, "saturates above");
        assert_eq!(f32::NAN.cast::<i64>(), 0);
        assert_eq!(300i64.cast::<u8>(), 44, "integers wrap");
        assert_eq!((-1i64).cast::<u8>(), 255);
        assert!(f32::NAN.cast::<bool>(), "NaN is not zero");
        assert!(!(-0.0f64).cast::<bool>());
        assert!(0.25f32.cast::<bool>());
        assert!(256i64.cast::<bool>(), "bool tests the value, not its low byte");
        assert_eq!(true.cast::<f32>(), 1.0);
        assert_eq!(false.cast::<bf16>(), bf16::ZERO);
        assert_eq!(true.cast::<i64>(), 1);
        assert_eq!(200u8.cast::<i64>(), 200);
        assert_eq!(f16::from_f32(1.5).cast::<f64>(), 1.5);
        assert_eq!(1e6f32.cast::<f16>(), f16::INFINITY);
        assert_eq!(100_000i64.cast::<f16>(), f16::INFINITY);
        assert_eq!(65_504i64.cast::<f16>(), f16::MAX);
        assert_eq!(i64::MAX.cast::<i64>(), i64::MAX, "i64 → i64 is lossless");
        assert_eq!((1i64 << 53) + 1, ((1i64 << 53) + 1).cast::<i64>());
    }

    #[test]
    fn which_scalars_each_dtype_holds() {
        use DType::*;
        let fits = [
            (Bool, f64::NAN),
            (Bool, 1e300),
            (F64, f64::MAX),
            (F32, f64::from(f32::MAX)),
            (F32, f64::NEG_INFINITY),
            (F16, 65504.0),
            (F16, f64::NAN),
            (BF16, -3.0e38),
            (I64, -9_223_372_036_854_775_808.0),
            (I64, 1.9),
            (I64, -0.5),
            (U8, -255.0),
            (U8, 255.0),
            (U8, 0.5),
        ];
        for (dtype, value) in fits {
            assert!(dtype.can_hold(value), "{value} into {dtype}");
        }
        let overflows = [
            (F32, 1e39),
            (F16, 65505.0),
            (BF16, 4e38),
            (I64, 9_223_372_036_854_775_808.0),
            (I64, f64::NAN),
            (I64, f64::INFINITY),
            (U8, 256.0),
            (U8, -256.0),
            (U8, -0.5),
            (U8, 255.5),
            (U8, f64::NEG_INFINITY),
        ];
        for (dtype, value) in overflows {
            assert!(!dtype.can_hold(value), "{value} into {dtype}");
        }
    }

    #[test]
    fn i64_to_bf16_rounds_once() {
        // 2^60 + 2^52 + 1 lies just above the halfway point between two bf16
        // values; rounding through f32 or f64 first would make it a tie and
        // round it down to 2^60.
        let value = (1i64 << 60) + (1i64 << 52) + 1;
        let expected = bf16::from_f64((1u64 << 60) as f64 + (1u64 << 53) as f64);
        assert_eq!(value.cast::<bf16>(), expected);
        assert_eq!((-value).cast::<bf16>(), -expected);
        assert_eq!(((1i64 << 60) + (1i64 << 52)).cast::<bf16>(), bf16::from_f64((1u64 << 60) as f64));
        assert_eq!(3i64.cast::<bf16>(), bf16::from_f32(3.0));
    }

    #[test]
    fn f64_to_half_formats_round_once() {
        // Just above a bf16 halfway point by less than f32 can hold: rounding
        // through f32 to nearest would make it a tie and round down to 1.
        let x = 1.0 + 2f64.powi(-8) + 2f64.powi(-30);
        assert_eq!(x.cast::<bf16>(), bf16::from_f64(1.0 + 2f64.powi(-7)));
        let x = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(x.cast::<f16>(), f16::from_f64(1.0 + 2f64.powi(-10)));
        assert_eq!((-x).cast::<f16>(), -f16::from_f64(1.0 + 2f64.powi(-10)));
        assert_eq!(1e300f64.cast::<bf16>(), bf16::INFINITY);
        assert_eq!((-1e300f64).cast::<f16>(), f16::NEG_INFINITY);
        assert_eq!(65519.0f64.cast::<f16>(), f16::MAX);
        assert_eq!(65520.0f64.cast::<f16>(), f16::INFINITY);
        assert_eq!(1e-300f64.cast::<f16>(), f16::ZERO);
        assert!(f64::NAN.cast::<bf16>().is_nan());
        assert_eq!(f64::NEG_INFINITY.cast::<f16>(), f16::NEG_INFINITY);
    }

    #[test]
    fn convert_slice_casts_each_element_and_checks_lengths() {
        let src = [0.0f32, -1.5, 2.5, 300.0];
        let mut dst = [0u8; 4];
        convert_slice(&src, &mut dst).unwrap();
        assert_eq!(dst, [0, 0, 2, 255]);

        let mut halves = [f16::ZERO; 4];
        convert_slice(&src, &mut halves).unwrap();
        assert_eq!(halves[1], f16::from_f32(-1.5));

        let mut short = [0i64; 3];
        assert_eq!(convert_slice(&src, &mut short), Err(DTypeError::LengthMismatch { src_len: 4, dst_len: 3 }));
        assert_eq!(short, [0; 3]);
    }

    /// Exact rounding reference: the nearest bf16 to an integer, ties to even,
    /// found by comparing integer distances.
    fn nearest_bf16_reference(value: i64) -> bf16 {
        let below = bf16::from_f32(value as f32);
        let candidates =
            [below, bf16::from_bits(below.to_bits().wrapping_add(1)), bf16::from_bits(below.to_bits().wrapping_sub(1))];
        let finite: Vec<bf16> = candidates.into_iter().filter(|c| c.is_finite()).collect();
        let distance = |c: bf16| (c.to_f64() as i128 - i128::from(value)).unsigned_abs();
        let best = finite.iter().map(|&c| distance(c)).min().unwrap();
        let mut ties: Vec<bf16> = finite.into_iter().filter(|&c| distance(c) == best).collect();
        ties.sort_by_key(|c| c.to_bits() & 1);
        ties[0]
    }

    /// Exact rounding reference for a format with few significand bits: find
    /// the neighbours around `x` by stepping bit patterns, then compare `x`
    /// with their midpoint, which f64 holds exactly.
    fn nearest_reference<H: WithDType>(x: f64, to_bits: fn(H) -> u16, from_bits: fn(u16) -> H) -> H {
        let magnitude = x.abs();
        let mut below = H::from_f64(magnitude);
        while below.to_f64() > magnitude {
            below = from_bits(to_bits(below) - 1);
        }
        let mut above = from_bits(to_bits(below) + 1);
        while above.to_f64() <= magnitude {
            below = above;
            above = from_bits(to_bits(below) + 1);
        }
        // Past the largest finite value the "next" pattern is infinity; its
        // rounding midpoint is half an ulp above the largest value.
        let above_value = if above.to_f64().is_infinite() {
            2.0 * below.to_f64() - from_bits(to_bits(below) - 1).to_f64()
        } else {
            above.to_f64()
        };
        let midpoint = (below.to_f64() + above_value) / 2.0;
        let nearest = if magnitude < midpoint || (magnitude == midpoint && to_bits(below).is_multiple_of(2)) {
            below
        } else {
            above
        };
        if x < 0.0 {
            H::from_f64(-nearest.to_f64())
        } else {
            nearest
        }
    }

    /// Where to put a test value between two neighbouring 16-bit floats.
    #[derive(Clone, Debug)]
    struct Probe {
        /// Bit pattern of the lower neighbour (positive, finite).
        bits: u16,
        /// Some f64 ulps from the exact midpoint, or `None` for anywhere.
        nudge: Option<i64>,
        fraction: f64,
        negative: bool,
    }

    fn probe(max_bits: u16) -> impl Strategy<Value = Probe> {
        (1u16..max_bits, proptest::option::of(-4i64..=4), 0.0f64..1.0, any::<bool>())
            .prop_map(|(bits, nudge, fraction, negative)| Probe { bits, nudge, fraction, negative })
    }

    impl Probe {
        fn value(&self, low: f64, high: f64) -> f64 {
            let x = match self.nudge {
                Some(nudge) => {
                    let midpoint = (low + high) / 2.0;
                    f64::from_bits((midpoint.to_bits() as i64 + nudge) as u64)
                }
                None => low + (high - low) * self.fraction,
            };
            if self.negative {
                -x
            } else {
                x
            }
        }
    }

    proptest! {
        #[test]
        fn f64_to_f16_and_bf16_round_once(half in probe(0x7bff), brain in probe(0x7f7f)) {
            let x = half.value(
                f16::from_bits(half.bits).to_f64(),
                f16::from_bits(half.bits + 1).to_f64(),
            );
            prop_assert_eq!(x.cast::<f16>(), nearest_reference(x, f16::to_bits, f16::from_bits));
            let x = brain.value(
                bf16::from_bits(brain.bits).to_f64(),
                bf16::from_bits(brain.bits + 1).to_f64(),
            );
            prop_assert_eq!(x.cast::<bf16>(), nearest_reference(x, bf16::to_bits, bf16::from_bits));
        }

        #[test]
        fn promotion_is_a_join(a in any_dtype(), b in any_dtype(), c in any_dtype()) {
            prop_assert_eq!(DType::promote(a, b), DType::promote(b, a));
            prop_assert_eq!(
                DType::promote(DType::promote(a, b), c),
                DType::promote(a, DType::promote(b, c))
            );
            prop_assert_eq!(DType::promote(a, a), a);
            // The result can hold either operand's category.
            let joined = DType::promote(a, b);
            prop_assert_eq!(DType::promote(joined, a), joined);
        }

        #[test]
        fn float_round_trips_are_exact(value in any::<f32>()) {
            prop_assume!(value.is_finite());
            prop_assert_eq!(value.cast::<f64>().cast::<f32>(), value);
            let half = value.cast::<f16>();
            prop_assert_eq!(half.cast::<f32>().cast::<f16>(), half);
            prop_assert_eq!(value.cast::<bf16>(), bf16::from_f32(value));
        }

        #[test]
        fn i64_to_float_rounds_like_a_single_rounding(value in any::<i64>()) {
            prop_assert_eq!(value.cast::<f32>(), value as f32);
            prop_assert_eq!(value.cast::<f64>(), value as f64);
            prop_assert_eq!(value.cast::<bf16>(), nearest_bf16_reference(value));
        }

        #[test]
        fn i64_to_bf16_near_ties(
            shift in 1u32..56,
            significand in 128i64..256,
            delta in -2i64..=2,
            negative: bool,
        ) {
            // Integers a few units from the midpoint between two neighbouring
            // bf16 values (8-bit significands), where double rounding bites.
            let midpoint = (significand << shift) + (1i64 << (shift - 1));
            let value = if negative { -(midpoint + delta) } else { midpoint + delta };
            prop_assert_eq!(value.cast::<bf16>(), nearest_bf16_reference(value));
        }
    }
}
