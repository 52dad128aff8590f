//! Element types: what the kernels compute in, what they read from, and what
//! the packed panels hold.
//!
//! The micro-kernels accumulate in [`Compute`] types (f32, f64). Operands may
//! be stored in a narrower [`PackSource`] type (f16, bf16) and are widened
//! while they are packed, so the inner loop never converts. On CPUs with
//! AVX512-BF16, bf16 operands instead stay bf16 and are packed as
//! [`Bf16Pair`]s, two consecutive depth elements per 32-bit lane, which is
//! what the dot-product instruction reads.

use half::{bf16, f16, slice::HalfFloatSliceExt};
use std::ops::{Add, Mul};

/// A type the micro-kernels accumulate in.
pub(crate) trait Compute:
    Copy + Send + Sync + PartialEq + Default + 'static + Add<Output = Self> + Mul<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
}

impl Compute for f32 {
    const ZERO: f32 = 0.0;
    const ONE: f32 = 1.0;
}

impl Compute for f64 {
    const ZERO: f64 = 0.0;
    const ONE: f64 = 1.0;
}

/// What the packing buffers hold and the micro-kernels read.
///
/// # Safety
/// Every bit pattern, all zeros included, is a valid value: the cached
/// packing buffers are zero-initialised and reused across element types.
pub(crate) unsafe trait Packed: Copy + Send + Sync + 'static {
    /// Consecutive depth (k) elements of the source held by one packed
    /// element.
    const DEPTH: usize;
    /// How many times the f32 kernel's flops per second its kernel reaches,
    /// rounded: a product's flops divided by this is its f32-equivalent work,
    /// which decides whether it is worth several threads
    /// ([`super::parallel_worth`]).
    const SPEED_VS_F32: usize = 1;
}

// SAFETY: plain floats; every bit pattern is a value.
unsafe impl Packed for f32 {
    const DEPTH: usize = 1;
}

// SAFETY: as for f32.
unsafe impl Packed for f64 {
    const DEPTH: usize = 1;
}

/// Two bf16 values of consecutive depth indices `p` (low half) and `p + 1`
/// (high half): the lane layout of `VDPBF16PS`, which multiplies the pairs
/// of A and B lane by lane and adds both products to an f32 accumulator.
/// A missing `p + 1` (odd depth) is +0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(transparent)]
pub(crate) struct Bf16Pair(pub u32);

impl Bf16Pair {
    #[inline(always)]
    pub fn new(lo: bf16, hi: bf16) -> Bf16Pair {
        Bf16Pair(u32::from(lo.to_bits()) | u32::from(hi.to_bits()) << 16)
    }
}

// SAFETY: a plain `u32`; every bit pattern is a value.
unsafe impl Packed for Bf16Pair {
    const DEPTH: usize = 2;
    // `VDPBF16PS` does two multiply-adds per f32 lane: 1.8-1.9x the f32
    // kernel at 1024^3 on AMD Zen 4/5 (`gemm_tune`). (Intel's runs at half
    // the FMA rate, but its CPUs with the instruction have AMX.)
    const SPEED_VS_F32: usize = 2;
}

/// A stored element that packing widens to the compute type `T`.
pub(crate) trait PackSource<T: Compute>: Copy + Send + Sync + 'static {
    fn to_compute(self) -> T;

    /// Widens a contiguous run; overridden where a vector conversion exists.
    fn convert_slice(src: &[Self], dst: &mut [T]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s.to_compute();
        }
    }
}

impl PackSource<f32> for f32 {
    #[inline(always)]
    fn to_compute(self) -> f32 {
        self
    }
    fn convert_slice(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
}

impl PackSource<f64> for f64 {
    #[inline(always)]
    fn to_compute(self) -> f64 {
        self
    }
    fn convert_slice(src: &[f64], dst: &mut [f64]) {
        dst.copy_from_slice(src);
    }
}

impl PackSource<f32> for f16 {
    #[inline(always)]
    fn to_compute(self) -> f32 {
        self.to_f32()
    }
    fn convert_slice(src: &[f16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
}

impl PackSource<f32> for bf16 {
    #[inline(always)]
    fn to_compute(self) -> f32 {
        // bf16 is the top half of an f32: widening is a shift (the default
        // `convert_slice` loop over it vectorises).
        f32::from_bits((self.to_bits() as u32) << 16)
    }
}

/// A stored type that f32 results are rounded into once, on write-back.
pub(crate) trait Narrow: PackSource<f32> {
    fn narrow(value: f32) -> Self;

    /// Rounds a contiguous run.
    fn narrow_slice(src: &[f32], dst: &mut [Self]);
}

/// f32 "narrows" to itself: lets a kernel that rounds its f32 accumulators
/// at the store (the AMX tiles) write f32 and half C alike.
impl Narrow for f32 {
    #[inline(always)]
    fn narrow(value: f32) -> f32 {
        value
    }
    fn narrow_slice(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
}

impl Narrow for f16 {
    #[inline(always)]
    fn narrow(value: f32) -> f16 {
        f16::from_f32(value)
    }
    fn narrow_slice(src: &[f32], dst: &mut [f16]) {
        // `half` uses F16C here when the CPU has it.
        dst.convert_from_f32_slice(src);
    }
}

impl Narrow for bf16 {
    #[inline(always)]
    fn narrow(value: f32) -> bf16 {
        crate::convert::f32_to_bf16(value)
    }
    fn narrow_slice(src: &[f32], dst: &mut [bf16]) {
        crate::convert::narrow_bf16_slice(src, dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_widening_is_exact() {
        for x in [0.0f32, 1.5, -2.25, 65504.0, 1e-3] {
            let h = f16::from_f32(x);
            assert_eq!(PackSource::<f32>::to_compute(h), h.to_f32());
            let b = bf16::from_f32(x);
            assert_eq!(PackSource::<f32>::to_compute(b), b.to_f32());
        }
        let src: Vec<bf16> = (0..9).map(|i| bf16::from_f32(i as f32 * 0.5)).collect();
        let mut dst = vec![0.0f32; 9];
        <bf16 as PackSource<f32>>::convert_slice(&src, &mut dst);
        assert_eq!(dst[7], 3.5);
    }

    /// f32 bit patterns around every rounding case: signs, zeros,
    /// subnormals, ties (dropped half 0x8000) with even and odd kept halves,
    /// one either side of a tie, the largest finite values, infinities and
    /// NaNs (quiet, signalling, with payloads), plus a sweep of the whole range.
    fn probe_bits() -> Vec<u32> {
        let mut bits = Vec::new();
        let lows = [0, 1, 0x7fff, 0x8000, 0x8001, 0xffff, 0x4000, 0xc000];
        for high in (0..=0xffffu32).step_by(7).chain([0, 1, 2, 0x7f7f, 0x7f80, 0x7f81, 0x7fc0, 0x7fff, 0x0080]) {
            for sign in [0, 0x8000_0000] {
                for low in lows {
                    bits.push(sign | (high << 16) | low);
                }
            }
        }
        bits.extend((0..200_000u32).map(|i| i.wrapping_mul(0x9e37_79b9)));
        bits
    }

    #[test]
    fn bf16_narrowing_matches_half_bit_for_bit() {
        let src: Vec<f32> = probe_bits().into_iter().map(f32::from_bits).collect();
        let want: Vec<u16> = src.iter().map(|&x| bf16::from_f32(x).to_bits()).collect();
        let scalar: Vec<u16> = src.iter().map(|&x| bf16::narrow(x).to_bits()).collect();
        assert_eq!(scalar, want);
        // Every length up to a few vectors, to cover the vector loops' tails.
        for len in (0..70).chain([src.len()]) {
            let mut dst = vec![bf16::ZERO; len];
            bf16::narrow_slice(&src[..len], &mut dst);
            let got: Vec<u16> = dst.iter().map(|h| h.to_bits()).collect();
            assert_eq!(got, want[..len], "length {len}");
            let mut portable = vec![bf16::ZERO; len];
            crate::convert::narrow_bf16_portable(&src[..len], &mut portable);
            assert!(portable.iter().map(|h| h.to_bits()).eq(got), "length {len}");
        }
    }

    #[test]
    fn f16_narrowing_matches_half() {
        let src: Vec<f32> = probe_bits().into_iter().map(f32::from_bits).collect();
        for len in [0, 1, 3, 7, 8, 9, 17, 31, src.len()] {
            let mut dst = vec![f16::ZERO; len];
            f16::narrow_slice(&src[..len], &mut dst);
            for (i, (&x, h)) in src.iter().zip(&dst).enumerate() {
                assert_eq!(h.to_bits(), f16::narrow(x).to_bits(), "{x:e} at {i}");
                assert_eq!(h.to_bits(), f16::from_f32(x).to_bits(), "{x:e} at {i}");
            }
        }
    }

    #[test]
    fn bf16_widening_is_the_shift_for_every_pattern() {
        let src: Vec<bf16> = (0..=0xffffu16).map(bf16::from_bits).collect();
        for len in [0, 1, 5, 16, 33, src.len()] {
            let mut dst = vec![0.0f32; len];
            <bf16 as PackSource<f32>>::convert_slice(&src[..len], &mut dst);
            for (h, x) in src.iter().zip(&dst) {
                // Exactly the bits shifted up: NaNs keep their payload (and
                // stay signalling), where `bf16::to_f32` sets the quiet bit.
                assert_eq!(x.to_bits(), u32::from(h.to_bits()) << 16);
                assert!(x.to_bits() == h.to_f32().to_bits() || x.is_nan() && h.is_nan());
            }
        }
    }
}
