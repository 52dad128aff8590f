//! A branch-free `f32` exponential that loops vectorise ([`exp_f32`]), and
//! `x - shift` exponentiated over a slice on the widest vectors this CPU has
//! ([`exp_shifted_f32`], softmax's inner loop).

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in two so that `n * LN2_HI` is exact for the `n` that occur.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 * 2^23: adding it rounds an f32 of magnitude < 2^22 to an integer,
/// which then sits in the low mantissa bits.
const ROUNDER: f32 = 12_582_912.0;
/// Below this (e^x < 2^-124.8) the result is flushed to 0, which keeps the
/// exponent arithmetic in the normal range.
const EXP_MIN: f32 = -86.5;
/// Above this `e^x` overflows f32.
const EXP_MAX: f32 = 88.722_84;

/// `e^x` for `f32`, within 2 ulp of the exact value, written without
/// branches or calls so that loops over it vectorise (Cephes' `expf`
/// polynomial after the usual `x = n ln 2 + r` reduction). Results below
/// `2.6e-38` (x < -86.5) are flushed to 0; x > 88.72 gives infinity; NaN stays NaN.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    // `clamp` keeps a NaN.
    let clamped = x.clamp(EXP_MIN, EXP_MAX);
    let shifted = clamped * LOG2E + ROUNDER;
    let n = shifted - ROUNDER;
    let r = clamped - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    // 2^(n-1) from the integer in `shifted`'s low bits (n - 1 + 127 = n + 126),
    // times 2: n can be 128, whose 2^n is not an f32 but 2^127 * 2 * y is.
    let biased = shifted.to_bits().wrapping_sub(ROUNDER.to_bits()).wrapping_add(126);
    let result = y * f32::from_bits(biased << 23) * 2.0;
    if x > EXP_MAX {
        f32::INFINITY
    } else if x < EXP_MIN {
        0.0
    } else {
        result
    }
}

/// The body of [`exp_shifted_f32`], inlined into each instruction-set variant.
#[inline(always)]
fn exp_shifted_body(x: &[f32], shift: f32, out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = exp_f32(v - shift);
    }
}

/// [`exp_shifted_body`] compiled for AVX-512 (16 lanes).
///
/// # Safety
/// The CPU supports AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn exp_shifted_avx512(x: &[f32], shift: f32, out: &mut [f32]) {
    exp_shifted_body(x, shift, out)
}

/// [`exp_shifted_body`] compiled for AVX2 + FMA (8 lanes).
///
/// # Safety
/// The CPU supports AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_shifted_avx2(x: &[f32], shift: f32, out: &mut [f32]) {
    exp_shifted_body(x, shift, out)
}

/// `out[i] = exp_f32(x[i] - shift)` over the common length, on the widest
/// vectors this CPU has (picked at run time).
pub fn exp_shifted_f32(x: &[f32], shift: f32, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        let features = crate::cpu_features::cpu_features();
        if features.avx512f {
            // SAFETY: AVX-512F was detected on this CPU.
            return unsafe { exp_shifted_avx512(x, shift, out) };
        }
        if features.has_avx2_fma() {
            // SAFETY: AVX2 and FMA were detected on this CPU.
            return unsafe { exp_shifted_avx2(x, shift, out) };
        }
    }
    exp_shifted_body(x, shift, out)
}
