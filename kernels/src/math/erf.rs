//! The error function, `erf` and `erfc` in f64 (the elementwise kernels'
//! `erf`, `erfc` and exact GELU in [`Float`](crate::scalar::Float) are built
//! on them).
//!
//! `erf` and `erfc` are fdlibm's (`s_erf.c`): rational approximations on
//! four intervals, each within 1 ulp in f64. The f32 versions evaluate the
//! f64 ones and round once, so they are correctly rounded but for rare ties.

// fdlibm's coefficients are kept digit for digit as published.
#![allow(clippy::excessive_precision)]

// ----- erf / erfc -----------------------------------------------------------
//
// origin: FreeBSD /usr/src/lib/msun/src/s_erf.c
// ====================================================
// Copyright (C) 1993 by Sun Microsystems, Inc. All rights reserved.
//
// Developed at SunPro, a Sun Microsystems, Inc. business.
// Permission to use, copy, modify, and distribute this
// software is freely granted, provided that this notice
// is preserved.
// ====================================================
//
// Method (|x| intervals):
//   [0, 0.84375]:     erf(x) = x + x * R(x^2), R = P/Q odd rational, |error| < 2^-57.90
//   [0.84375, 1.25]:  erf(x) = c + P1(s)/Q1(s), s = |x| - 1, c = 0.84506291151 (24 bits)
//   [1.25, 1/0.35]:   erfc(x) = exp(-x^2 - 0.5625 + R1(z)/S1(z)) / x, z = 1/x^2
//   [1/0.35, 28]:     erfc(x) = exp(-x^2 - 0.5625 + R2(z)/S2(z)) / x
//   beyond:           erf = ±1, erfc underflows to 0 (or is 2 for x < 0)
// exp(-x^2) is computed as exp(-s^2) * exp((s - x)(s + x)) with s = x with its
// low 32 bits cleared, so that s^2 is exact.

const ERX: f64 = 8.450_629_115_104_675_292_97e-01;
const EFX8: f64 = 1.027_033_336_764_100_690_53e+00;
const PP: [f64; 5] = [
    1.283_791_670_955_125_585_61e-01,
    -3.250_421_072_470_014_993_70e-01,
    -2.848_174_957_559_851_047_66e-02,
    -5.770_270_296_489_441_591_57e-03,
    -2.376_301_665_665_016_260_84e-05,
];
const QQ: [f64; 5] = [
    3.979_172_239_591_553_528_19e-01,
    6.502_224_998_876_729_444_85e-02,
    5.081_306_281_875_765_627_76e-03,
    1.324_947_380_043_216_445_26e-04,
    -3.960_228_278_775_368_123_20e-06,
];
const PA: [f64; 7] = [
    -2.362_118_560_752_659_440_77e-03,
    4.148_561_186_837_483_316_66e-01,
    -3.722_078_760_357_013_238_47e-01,
    3.183_466_199_011_617_536_74e-01,
    -1.108_946_942_823_966_774_76e-01,
    3.547_830_432_561_823_593_71e-02,
    -2.166_375_594_868_790_843_00e-03,
];
const QA: [f64; 6] = [
    1.064_208_804_008_442_282_86e-01,
    5.403_979_177_021_710_489_37e-01,
    7.182_865_441_419_626_628_68e-02,
    1.261_712_198_087_616_421_12e-01,
    1.363_708_391_202_905_073_62e-02,
    1.198_449_984_679_910_741_70e-02,
];
const RA: [f64; 8] = [
    -9.864_944_034_847_148_227_05e-03,
    -6.938_585_727_071_817_643_72e-01,
    -1.055_862_622_532_329_098_14e+01,
    -6.237_533_245_032_600_603_96e+01,
    -1.623_966_694_625_734_703_55e+02,
    -1.846_050_929_067_110_359_94e+02,
    -8.128_743_550_630_659_342_46e+01,
    -9.814_329_344_169_145_485_92e+00,
];
const SA: [f64; 8] = [
    1.965_127_166_743_925_712_92e+01,
    1.376_577_541_435_190_426_00e+02,
    4.345_658_774_752_292_288_21e+02,
    6.453_872_717_332_678_803_36e+02,
    4.290_081_400_275_678_333_86e+02,
    1.086_350_055_417_794_351_34e+02,
    6.570_249_770_319_281_701_35e+00,
    -6.042_441_521_485_809_874_38e-02,
];
const RB: [f64; 7] = [
    -9.864_942_924_700_099_285_97e-03,
    -7.992_832_376_805_230_065_74e-01,
    -1.775_795_491_775_475_198_89e+01,
    -1.606_363_848_558_219_160_62e+02,
    -6.375_664_433_683_896_277_22e+02,
    -1.025_095_131_611_077_249_54e+03,
    -4.835_191_916_086_513_970_19e+02,
];
const SB: [f64; 7] = [
    3.033_806_074_348_245_829_24e+01,
    3.257_925_129_965_739_188_26e+02,
    1.536_729_586_084_436_959_94e+03,
    3.199_858_219_508_595_539_08e+03,
    2.553_050_406_433_164_425_83e+03,
    4.745_285_412_069_553_672_15e+02,
    -2.244_095_244_658_581_833_62e+01,
];

/// `c[0] + z * (c[1] + z * (...))`.
#[inline(always)]
fn horner(z: f64, c: &[f64]) -> f64 {
    c.iter().rev().fold(0.0, |acc, &k| acc * z + k)
}

/// `1 + z * (c[0] + z * (c[1] + ...))`.
#[inline(always)]
fn horner1(z: f64, c: &[f64]) -> f64 {
    1.0 + z * horner(z, c)
}

/// `x + x * R(x^2)` on |x| < 0.84375: the small-argument part of erf minus x.
#[inline]
fn erf_small_correction(x: f64) -> f64 {
    let z = x * x;
    horner(z, &PP) / horner1(z, &QQ)
}

/// `P1(s)/Q1(s)`, s = |x| - 1, on 0.84375 <= |x| < 1.25.
#[inline]
fn erf_near_one(ax: f64) -> f64 {
    let s = ax - 1.0;
    horner(s, &PA) / horner1(s, &QA)
}

/// erfc(|x|) for 1.25 <= |x| < 28, with `ax = |x|`.
#[inline]
fn erfc_tail(ax: f64) -> f64 {
    let s = 1.0 / (ax * ax);
    let (r, big_s) =
        if ax < 1.0 / 0.35 { (horner(s, &RA), horner1(s, &SA)) } else { (horner(s, &RB), horner1(s, &SB)) };
    // z: ax with its low 32 bits cleared, so z * z is exact.
    let z = f64::from_bits(ax.to_bits() & 0xffff_ffff_0000_0000);
    (-z * z - 0.5625).exp() * ((z - ax) * (z + ax) + r / big_s).exp() / ax
}

/// The error function, `2/√π ∫₀ˣ e^(-t²) dt`, within 1 ulp.
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let ax = x.abs();
    let magnitude = if ax < 0.84375 {
        if ax < f64::from_bits(0x3e30_0000_0000_0000) {
            // |x| < 2^-28: erf(x) = 2/√π x to working precision; the scaling avoids underflow.
            return 0.125 * (8.0 * x + EFX8 * x);
        }
        return x + x * erf_small_correction(x);
    } else if ax < 1.25 {
        ERX + erf_near_one(ax)
    } else if ax < 6.0 {
        1.0 - erfc_tail(ax)
    } else {
        1.0
    };
    magnitude.copysign(x)
}

/// The complementary error function `1 - erf(x)`, computed directly so that it
/// keeps its relative accuracy where erf(x) is close to 1 (within 1 ulp).
pub fn erfc(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let ax = x.abs();
    if ax < 0.84375 {
        if ax < f64::from_bits(0x3c70_0000_0000_0000) {
            // |x| < 2^-56
            return 1.0 - x;
        }
        let y = erf_small_correction(x);
        return if x < 0.25 { 1.0 - (x + x * y) } else { 0.5 - (x - 0.5 + x * y) };
    }
    if ax < 1.25 {
        let p = erf_near_one(ax);
        return if x > 0.0 { 1.0 - ERX - p } else { 1.0 + (ERX + p) };
    }
    if ax < 28.0 {
        let tail = erfc_tail(ax);
        return if x > 0.0 { tail } else { 2.0 - tail };
    }
    if x > 0.0 {
        0.0
    } else {
        2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scalar::Float;

    /// erf by the series `2/√π e^(-x²) Σ 2^n x^(2n+1) / (2n+1)!!`, whose terms
    /// are all positive (no cancellation): a reference good to a few ulp.
    fn erf_series(x: f64) -> f64 {
        let mut term = x;
        let mut sum = x;
        let mut n = 0.0;
        while term.abs() > 1e-18 * sum.abs() {
            term *= 2.0 * x * x / (2.0 * n + 3.0);
            sum += term;
            n += 1.0;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt() * (-x * x).exp()
    }

    /// erfc by Lentz's continued fraction, for x >= 3.
    fn erfc_continued_fraction(x: f64) -> f64 {
        // erfc(x) = exp(-x²)/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + 2/(x + ...)))))
        let mut f = x;
        let mut c = x;
        let mut d = 0.0;
        for k in 1..200 {
            let a = k as f64 / 2.0;
            d = x + a * d;
            d = 1.0 / d;
            c = x + a / c;
            let delta = c * d;
            f *= delta;
            if (delta - 1.0).abs() < 1e-17 {
                break;
            }
        }
        (-x * x).exp() / std::f64::consts::PI.sqrt() / f
    }

    #[test]
    fn erf_matches_its_series_and_erfc_its_continued_fraction() {
        for i in -3000..=3000 {
            let x = i as f64 / 1000.0;
            let want = erf_series(x);
            // The series itself carries a few ulp of rounding per term.
            assert!((erf(x) - want).abs() <= 1e-14 * want.abs(), "erf({x}) = {} vs {want}", erf(x));
            assert!((erfc(x) - (1.0 - want)).abs() <= 1e-14, "erfc({x})");
        }
        for i in 0..=250 {
            let x = 3.0 + i as f64 * 0.1;
            let want = erfc_continued_fraction(x);
            let got = erfc(x);
            // The reference's exp(-x²) is off by up to ~x² ulp.
            let tolerance = (1e-14 + 4.0 * x * x * f64::EPSILON) * want;
            assert!((got - want).abs() <= tolerance, "erfc({x}) = {got:e} vs {want:e}");
            assert!((erfc(-x) - (2.0 - want)).abs() <= 4e-16 * 2.0, "erfc(-{x})");
        }
    }

    /// Values from mpmath at 40 digits, rounded to f64: within 2 ulp.
    #[test]
    fn erf_and_erfc_match_high_precision_values() {
        let erf_table = [
            (0.1, 0.1124629160182849),
            (0.5, 0.5204998778130465),
            (0.9, 0.7969082124228322),
            (1.0, 0.8427007929497149),
            (1.2, 0.9103139782296353),
            (2.0, 0.9953222650189527),
            (-2.234, -0.9984188020875654),
            (3.0, 0.9999779095030014),
            (5.0, 0.9999999999984626),
            (-0.7, -0.6778011938374184),
        ];
        for (x, want) in erf_table {
            assert!((erf(x) - want).abs() <= 2.0 * f64::EPSILON * want.abs(), "erf({x}) = {} vs {want}", erf(x));
        }
        let erfc_table = [
            (0.3, 0.6713732405408726),
            (1.0, 0.15729920705028513),
            (3.0, 2.209049699858544e-05),
            (5.0, 1.537459794428035e-12),
            (10.0, 2.088487583762545e-45),
            (-1.0, 1.8427007929497148),
        ];
        for (x, want) in erfc_table {
            assert!((erfc(x) - want).abs() <= 2.0 * f64::EPSILON * want.abs(), "erfc({x}) = {} vs {want}", erfc(x));
        }
    }

    #[test]
    fn erf_special_values() {
        assert_eq!(erf(0.0), 0.0);
        assert!(erf(-0.0).is_sign_negative());
        assert_eq!(erf(f64::INFINITY), 1.0);
        assert_eq!(erf(f64::NEG_INFINITY), -1.0);
        assert!(erf(f64::NAN).is_nan());
        assert_eq!(erfc(f64::INFINITY), 0.0);
        assert_eq!(erfc(f64::NEG_INFINITY), 2.0);
        assert!(erfc(f64::NAN).is_nan());
        let tiny = erf(1e-300) / (1e-300 * 2.0 / std::f64::consts::PI.sqrt());
        assert!((tiny - 1.0).abs() < 1e-15);
        assert_eq!(Float::erf(1.0f32), 0.842_700_792_949_714_9_f64 as f32);
    }

    #[test]
    fn gelu_is_x_times_normal_cdf_even_far_in_the_tail() {
        // Φ(-10) ≈ 7.62e-24: computing 1 + erf in f64 would give 0 or garbage.
        // (mpmath; the rounding of x/√2 alone costs ~4e-14 relative here.)
        let want = -7.619853024160526e-23;
        assert!(((-10.0f64).gelu() - want).abs() <= 1e-13 * want.abs());
        assert!(((-10.0f32).gelu() as f64 - want).abs() <= 1e-7 * want.abs());
        assert_eq!(3.0f64.gelu(), 3.0 * 0.5 * erfc(-3.0 / std::f64::consts::SQRT_2));
        assert_eq!(f32::INFINITY.gelu(), f32::INFINITY);
        // -inf * Φ(-inf) = -inf * 0: NaN, as PyTorch's formula gives.
        assert!(f32::NEG_INFINITY.gelu().is_nan());
    }
}
