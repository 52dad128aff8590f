//! Conversions between f32 and bf16 that loops can vectorise, shared by the
//! GEMM (widening while packing, rounding on write-back) and by
//! `brasa-tensor`'s dtype conversions.
//!
//! ```
//! use brasa_kernels::convert::{narrow_bf16_slice, widen_bf16_slice};
//! use half::bf16;
//!
//! let x = [1.0f32, 1.00390625, -0.0, f32::INFINITY];   // 1 + 2^-8 is a tie: rounds to even (1.0)
//! let mut h = [bf16::ZERO; 4];
//! narrow_bf16_slice(&x, &mut h);
//! let mut back = [0.0f32; 4];
//! widen_bf16_slice(&h, &mut back);
//! assert_eq!(back, [1.0, 1.0, -0.0, f32::INFINITY]);
//! ```

use crate::widest::{on_widest, WideLoop};
use half::bf16;

/// bf16 → f32, exactly: a bf16 is the top half of an f32's bits, so this is
/// a shift (NaNs keep their payload; `bf16::to_f32` also sets the quiet
/// bit). Always inlined, so loops over it vectorise.
#[inline(always)]
pub fn bf16_to_f32(value: bf16) -> f32 {
    f32::from_bits(u32::from(value.to_bits()) << 16)
}

/// bf16 → f32 over slices of the same length (the shorter one bounds it).
/// Compiled for AVX-512 and AVX2 too and picked at run time: the baseline
/// build widens 4 lanes at a time (a bf16 block of batch norm's passes spent
/// as long widening as computing).
pub fn widen_bf16_slice(src: &[bf16], dst: &mut [f32]) {
    on_widest(Widen { src, dst });
}

/// [`widen_bf16_portable`] as a loop [`on_widest`] compiles per instruction set.
struct Widen<'a> {
    src: &'a [bf16],
    dst: &'a mut [f32],
}

impl WideLoop for Widen<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        widen_bf16_portable(self.src, self.dst);
    }
}

/// [`widen_bf16_slice`] without the run-time dispatch.
#[inline(always)]
pub fn widen_bf16_portable(src: &[bf16], dst: &mut [f32]) {
    for (out, &value) in dst.iter_mut().zip(src) {
        *out = bf16_to_f32(value);
    }
}

/// f32 → bf16 over slices of the same length (the shorter one bounds it).
/// The baseline x86-64 build leaves this loop scalar (its select and 32 →
/// 16-bit narrowing do not map onto SSE2), so on x86-64 the same loop is also
/// compiled for AVX-512 and AVX2 and picked at run time: about 4x faster.
pub fn narrow_bf16_slice(src: &[f32], dst: &mut [bf16]) {
    on_widest(Narrow { src, dst });
}

/// [`narrow_bf16_portable`] as a loop [`on_widest`] compiles per instruction set.
struct Narrow<'a> {
    src: &'a [f32],
    dst: &'a mut [bf16],
}

impl WideLoop for Narrow<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        narrow_bf16_portable(self.src, self.dst);
    }
}

/// f32 -> bf16, rounded to nearest, ties to even; NaN stays NaN with its top
/// payload bits and the quiet bit set. Bit for bit `bf16::from_f32`, but
/// inlined and without branches, so that loops over it vectorise.
#[inline(always)]
pub fn f32_to_bf16(value: f32) -> bf16 {
    let x = value.to_bits();
    // Adding 0x7fff plus the bit that becomes the last kept one carries into
    // the kept half exactly when the dropped half is above 0x8000, or is
    // 0x8000 and the kept half is odd. Finite values round up to infinity at
    // most, which is the right answer; only NaNs, handled apart, can wrap.
    let rounded = x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16;
    let is_nan = x & 0x7fff_ffff > 0x7f80_0000;
    bf16::from_bits(if is_nan { (x >> 16) | 0x0040 } else { rounded } as u16)
}

/// [`narrow_bf16_slice`] without the run-time dispatch.
#[inline(always)]
pub fn narrow_bf16_portable(src: &[f32], dst: &mut [bf16]) {
    for (out, &value) in dst.iter_mut().zip(src) {
        *out = f32_to_bf16(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_data::xorshift;

    #[test]
    fn rounding_is_bit_for_bit_halfs() {
        // Scattered bit patterns (every exponent, NaNs, infinities,
        // subnormals, ties) and the ties and near-ties around 1.
        let scattered = xorshift(1).take(200_000).map(|s| s as u32);
        let near_one = (0..=0x1_0000u32).map(|low| 0x3f80_0000 | low);
        for bits in scattered.chain(near_one).chain([0x7f80_0000, 0xff80_0000, 0x7f7f_ffff, 0x0000_8000, 0x8000_0001]) {
            let x = f32::from_bits(bits);
            assert_eq!(f32_to_bf16(x).to_bits(), bf16::from_f32(x).to_bits(), "{bits:#010x}");
        }
    }

    #[test]
    fn every_bf16_widens_and_rounds_back_to_itself() {
        let all: Vec<bf16> = (0..=0xffffu16).map(bf16::from_bits).collect();
        let mut wide = vec![0.0f32; all.len()];
        widen_bf16_slice(&all, &mut wide);
        let mut portable = vec![0.0f32; all.len()];
        widen_bf16_portable(&all, &mut portable);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&wide), bits(&portable), "the dispatched widening is the shift");
        let mut back = vec![bf16::ZERO; all.len()];
        narrow_bf16_slice(&wide, &mut back);
        for (h, b) in all.iter().zip(&back) {
            // NaNs come back quiet (bit 0x0040 set), as `bf16::from_f32` makes them.
            let want = if h.is_nan() { h.to_bits() | 0x0040 } else { h.to_bits() };
            assert_eq!(b.to_bits(), want);
        }
    }
}
