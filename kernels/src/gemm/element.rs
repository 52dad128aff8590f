//! Element types: what the kernels compute in, and what they read from.
//!
//! The micro-kernels compute in [`Compute`] types (f32, f64). Operands may be
//! stored in a narrower [`PackSource`] type (f16, bf16) and are widened while
//! they are packed, so the inner loop never converts.

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
        // bf16 is the top half of an f32: widening is a shift.
        f32::from_bits((self.to_bits() as u32) << 16)
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
}
