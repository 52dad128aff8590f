//! Integer element arithmetic as PyTorch does it: two's-complement
//! wrapping, and integer powers.

use crate::dtype::WithDType;

/// Integer arithmetic as PyTorch does it: two's-complement wrapping.
pub(crate) trait IntElement: WithDType + Ord {
    fn wrapping_add(self, other: Self) -> Self;
    fn wrapping_sub(self, other: Self) -> Self;
    fn wrapping_mul(self, other: Self) -> Self;
    fn wrapping_abs(self) -> Self;
    /// `self^exponent`, wrapping; a negative exponent gives the truncated
    /// quotient `1 / self^|exponent|` (0 unless self is ±1; 0 for 0), as
    /// PyTorch's integer `pow` of two tensors does. At most 64 squarings,
    /// whatever the exponent (`i64::MIN` included).
    fn int_pow(self, exponent: Self) -> Self;
}

macro_rules! impl_int_element {
    ($t:ty, $negative:expr) => {
        impl IntElement for $t {
            #[inline(always)]
            fn wrapping_add(self, other: Self) -> Self {
                <$t>::wrapping_add(self, other)
            }
            #[inline(always)]
            fn wrapping_sub(self, other: Self) -> Self {
                <$t>::wrapping_sub(self, other)
            }
            #[inline(always)]
            fn wrapping_mul(self, other: Self) -> Self {
                <$t>::wrapping_mul(self, other)
            }
            #[inline(always)]
            fn wrapping_abs(self) -> Self {
                let negative: fn($t) -> bool = $negative;
                if negative(self) {
                    <$t>::wrapping_neg(self)
                } else {
                    self
                }
            }
            #[inline]
            fn int_pow(self, exponent: Self) -> Self {
                let negative: fn($t) -> bool = $negative;
                if negative(exponent) {
                    // Only the parity of the exponent matters for -1; negating
                    // it instead would leave i64::MIN negative, forever.
                    return match self.to_i64() {
                        1 => 1 as $t,
                        -1 if exponent.to_i64() & 1 == 0 => 1 as $t,
                        -1 => self,
                        _ => 0 as $t,
                    };
                }
                let (mut base, mut e, mut acc) = (self, exponent.to_i64() as u64, 1 as $t);
                while e > 0 {
                    if e & 1 == 1 {
                        acc = acc.wrapping_mul(base);
                    }
                    base = base.wrapping_mul(base);
                    e >>= 1;
                }
                acc
            }
        }
    };
}

impl_int_element!(i64, |x| x < 0);
impl_int_element!(u8, |_| false);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_powers_and_wrapping() {
        assert_eq!(3i64.int_pow(4), 81);
        assert_eq!(2u8.int_pow(9), 0, "wraps");
        assert_eq!((-1i64).int_pow(-3), -1);
        assert_eq!((-1i64).int_pow(-4), 1);
        assert_eq!((-1i64).int_pow(i64::MIN), 1, "even, and returns");
        assert_eq!((-1i64).int_pow(i64::MAX), -1);
        assert_eq!(2i64.int_pow(i64::MIN), 0);
        assert_eq!(0i64.int_pow(-1), 0);
        assert_eq!(1i64.int_pow(i64::MIN), 1);
        assert_eq!(2i64.int_pow(-1), 0);
        assert_eq!(3i64.int_pow(64), 3i64.wrapping_pow(64), "wraps");
        assert_eq!(i64::MIN.wrapping_abs(), i64::MIN);
    }
}
