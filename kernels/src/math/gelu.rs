//! Vectorised f32 GELU: the exact (erf) forward `x·Φ(x)` and the two
//! backwards, `grad·(Φ(x) + x·φ(x))` and the tanh approximation's, each one
//! branch-free pass over a slice on the widest vectors this CPU has.
//!
//! Why not the scalar path: [`Float::gelu`](crate::scalar::Float::gelu) for
//! f32 evaluates fdlibm's f64 `erfc` (four intervals, branches, divisions)
//! per element and is correctly rounded, but nothing in it vectorises, and a
//! transformer's feed-forward block spends milliseconds there. Here every
//! element takes the same straight-line path of multiplies, fused
//! multiply-adds, one division and a few selects, which the compiler turns
//! into 16-lane (AVX-512) or 8-lane (AVX2 + FMA) code; the variant is picked
//! at run time like [`exp_shifted_f32`](crate::reduce::exp_shifted_f32).
//!
//! # Method
//! With `a = |x|`, everything comes from `q = Φ(-a)`, the normal tail:
//! `Φ(x) = q` for `x < 0` and `1 - q` otherwise (no cancellation: `q <= 1/2`).
//! The tail is written as `q = e^(-a²/2) · E(a)` where `E(a) = Φ(-a) e^(a²/2)`
//! (the scaled complementary error function) is smooth and slowly varying on
//! `[0, ∞)`, behaving like `1/(a√(2π))`. It is `t` times a degree-11
//! polynomial in `t - 1/4`, `t = 1/(1 + a/2)` (relative error 3.6e-9 on
//! `[0, 14.5]`, Chebyshev fit). Three details took the sweep's largest
//! error from 4.9 to 3.3 ulp:
//! - `e^(-a²/2)` keeps the low part of `a²` (from an FMA), so the far tail,
//!   where `a²/2` is ~100, loses nothing to the rounding of the square; and
//!   its `1 + (e^r - 1)` is multiplied in unrounded.
//! - `t` is rounded twice (`1 + a/2`, then the division), and E amplifies
//!   that error up to 1.6x: both residuals are known exactly (Fast2Sum, and
//!   an FMA for the division), so a first-order correction removes them.
//! - `E = t · p` is kept as the exact product `hi + lo`, so the chain
//!   `E (1 + e^r - 1) 2^64` rounds once where it matters.
//!
//! The result is within [`MAX_ULP_ERROR`] ulp of the exact value (the tests
//! sweep the whole range against the f64 path).
//!
//! Below `x ≈ -14.36` the true GELU is smaller than half the least
//! subnormal, so the result is `-0.0` (the tail is evaluated up to 14.5 and
//! cut off past it; `-inf` gives NaN, `-inf · 0`, as PyTorch's and the
//! scalar path do). Between, the result is subnormal or tiny: the tail is
//! computed scaled by 2^64 and scaled back by the last multiply, so it is
//! rounded once, like any other result.
//!
//! The code uses `mul_add` (one rounding). The AVX-512 and AVX2 variants
//! compile it to FMA instructions; elsewhere it is the portable body, which
//! gives the same bits (a fused multiply-add is exact-then-rounded on every
//! target). On x86-64 without FMA, `mul_add` would be a library call per
//! operation, so those CPUs keep the scalar path: each kernel takes it as its
//! `fallback` (the [`Float`](crate::scalar::Float) implementation for `f32`
//! passes its scalar loops), as this module sits below the scalar traits.

// The fitted coefficients are kept as printed by the fit.
#![allow(clippy::excessive_precision)]

/// The largest error, in ulp of the exact value, of
/// [`gelu_f32`](crate::elementwise::gelu_f32) (and of
/// [`gelu_backward_f32`](crate::elementwise::gelu_backward_f32)'s
/// derivative, in ulp of its larger term) over the f32 inputs the tests
/// sweep: the measured maxima are 3.28 and 2.25 ulp.
pub const MAX_ULP_ERROR: f64 = 3.5;

/// Past `|x| = TAIL_END`, `|x| Φ(-|x|) < 2^-150`: GELU of a negative `x`
/// rounds to -0, and Φ of a positive one to 1. The tail formulas are fitted
/// up to here.
const TAIL_END: f32 = 14.5;

/// The tail is carried scaled by 2^64 so that a result in the subnormal
/// range is rounded once, by the final multiply with [`UNSCALE`].
const SCALE_EXPONENT: u32 = 64;
/// 2^-64.
const UNSCALE: f32 = f32::from_bits((127 - SCALE_EXPONENT) << 23);

/// `E(a) / t` for `t = 1/(1 + a/2)`, as a polynomial in `s = t - 1/4`
/// (coefficients of `s^11, s^10, ..., s^0`; Chebyshev fit on `t ∈ [1/8.25, 1]`,
/// i.e. `a ∈ [0, 14.5]`, relative error 3.6e-9). Why shifted by 1/4: in
/// powers of `t` itself the coefficients reach 3.7 with alternating signs
/// (for values of 0.2 to 0.5), and their rounding to f32 alone would cost
/// ulps; and `t - 1/4` is exact for every `t >= 1/8` (both are multiples of
/// the result's ulp), so the shift adds no rounding, unlike a scaling onto
/// `[-1, 1]`.
const TAIL_POLY: [f32; 12] = [
    0.06667595356702805,
    -0.2593642473220825,
    0.38531315326690674,
    -0.20246978104114532,
    -0.11438054591417313,
    0.16901518404483795,
    0.04817626625299454,
    -0.13997384905815125,
    -0.06929077953100204,
    0.14766950905323029,
    0.27762946486473083,
    0.2591172456741333,
];
/// The shift of the polynomial's variable, `s = t - TAIL_SHIFT`.
const TAIL_SHIFT: f32 = 0.25;

/// `1/√(2π)`, the normal density at 0.
const INV_SQRT_2PI: f32 = 0.3989422917366028;

/// `√(2/π)` and `√(2/π) · 0.044715` (and three times it): the tanh
/// approximation's `u = √(2/π) (x + 0.044715 x³)` and its derivative.
const TANH_K: f32 = 0.7978845834732056;
const TANH_KC: f32 = 0.035677406936883926;
const TANH_KC3: f32 = 0.10703222453594208;

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 as the nearest f32 and the remainder: with FMA, `y - n ln 2` is then
/// exact to well below an ulp of the reduced argument.
const LN2_HI: f32 = 0.6931471824645996;
const LN2_LO: f32 = -1.9046542121259336e-09;
/// 1.5 · 2^23: adding it rounds an f32 below 2^22 in magnitude to an
/// integer, which then sits in the low mantissa bits.
const ROUNDER: f32 = 12_582_912.0;
/// `e^r = 1 + r + r² p(r)` on `|r| <= ln2/2` (Cephes' `expf` polynomial).
const EXP_POLY: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];

/// `e^(y + y_lo)` as `(2^(n + bias - 127), e^r - 1)`: the caller multiplies
/// `1 + (e^r - 1)` into its other factor with one fused multiply-add, which
/// saves the rounding of `1 + ...`. It keeps `n + bias` (with
/// `n = round(y / ln 2)`) within 1..=254, and `|y_lo|` tiny. The range
/// reduction `r = y - n ln 2 + y_lo` rounds once, at the end.
#[inline(always)]
fn exp_split(y: f32, y_lo: f32, bias: u32) -> (f32, f32) {
    let z = y.mul_add(LOG2E, ROUNDER);
    let n = z - ROUNDER;
    // `y - n LN2_HI` is exact (both are multiples of y's ulp or of 2^-24,
    // and the difference is below 0.35); the small terms are added together
    // so that `r` is rounded once.
    let r = n.mul_add(-LN2_HI, y) + n.mul_add(-LN2_LO, y_lo);
    let mut p = EXP_POLY[0];
    for &c in &EXP_POLY[1..] {
        p = p.mul_add(r, c);
    }
    // `z`'s low bits hold n (two's complement around ROUNDER, whose low 9
    // bits are 0); shifting into the exponent field drops everything else.
    let scale = f32::from_bits(z.to_bits().wrapping_add(bias) << 23);
    (scale, (r * r).mul_add(p, r))
}

/// `Φ(-a)` and `φ(a)` for `a` in `[0, TAIL_END]`, in parts:
/// `2^64 e^(-a²/2) = scale · (1 + expm1)` and `E(a) = Φ(-a) e^(a²/2)` as an
/// unevaluated sum `e_hi + e_lo`, so that `2^64 Φ(-a)` is
/// `scale · (1 + expm1) · (e_hi + e_lo)` (see [`Tail::times`]) and
/// `2^64 φ(a) = scale · (1 + expm1) / √(2π)`.
struct Tail {
    scale: f32,
    expm1: f32,
    e_hi: f32,
    e_lo: f32,
}

impl Tail {
    /// `scale · (1 + expm1) · (v_hi + v_lo)` with one rounding that matters
    /// (the last add; the others fall on terms below an ulp of the result).
    #[inline(always)]
    fn times(&self, v_hi: f32, v_lo: f32) -> f32 {
        let v = v_hi + v_lo;
        (v_hi + self.expm1.mul_add(v, v_lo)) * self.scale
    }
}

#[inline(always)]
fn tail(a: f32) -> Tail {
    // a² = h + l exactly; e^(-a²/2) = e^(-h/2 - l/2). `-h/2` is exact.
    let h = a * a;
    let l = a.mul_add(a, -h);
    let (scale, expm1) = exp_split(-0.5 * h, -0.5 * l, 127 + SCALE_EXPONENT);
    // t = 1/d with d = 1 + a/2 = d + d_lo exactly (Fast2Sum, larger first).
    let half = 0.5 * a;
    let d = half + 1.0;
    let (big, small) = if half > 1.0 { (half, 1.0) } else { (1.0, half) };
    let d_lo = (big - d) + small;
    let t = 1.0 / d;
    let s = t - TAIL_SHIFT;
    let mut p = TAIL_POLY[0];
    for &c in &TAIL_POLY[1..] {
        p = p.mul_add(s, c);
    }
    // E = t p, kept as the exact product hi + lo.
    let e_hi = t * p;
    let product_lo = t.mul_add(p, -e_hi);
    // `t` is off from 1/(d + d_lo) by the relative `err = 1 - t (d + d_lo)`
    // (an FMA gives the division's residual exactly). Unchecked, that error
    // reaches E amplified up to 1.6x. First-order correction, with
    // dE/d(ln t) = (1/√(2π) - a E) (1 + a/2) / (1/2) (from E' = a E - 1/√(2π)):
    let err = t.mul_add(-d_lo, t.mul_add(-d, 1.0));
    let slope = a.mul_add(-e_hi, INV_SQRT_2PI);
    let e_lo = (err * (d + d)).mul_add(slope, product_lo);
    Tail { scale, expm1, e_hi, e_lo }
}

/// `|x|` clamped to `TAIL_END` (NaN becomes `TAIL_END`: the caller's final
/// multiply by `x` makes the result NaN again), so the tail stays finite.
#[inline(always)]
fn clamped_magnitude(x: f32) -> (f32, f32) {
    let a = x.abs();
    #[allow(clippy::manual_clamp)] // `min` would add NaN handling the select does not need
    let clamped = if a < TAIL_END { a } else { TAIL_END };
    (a, clamped)
}

/// Exact GELU of one value, `x Φ(x)`, within [`MAX_ULP_ERROR`] ulp.
#[inline(always)]
fn gelu_one(x: f32) -> f32 {
    let (a, clamped) = clamped_magnitude(x);
    let tail = tail(clamped);
    // 2^64 Φ(-|x|), 0 past the end of the tail.
    let q = if a > TAIL_END { 0.0 } else { tail.times(tail.e_hi, tail.e_lo) };
    let negative = (x * q) * UNSCALE;
    let positive = x * q.mul_add(-UNSCALE, 1.0);
    if x < 0.0 {
        negative
    } else {
        positive
    }
}

/// `grad · (Φ(x) + x φ(x))`, GELU's derivative times the incoming gradient.
/// NaN at `x = ±inf` (`±inf · 0`), as PyTorch's `gelu_backward` gives.
#[inline(always)]
fn gelu_backward_one(grad: f32, x: f32) -> f32 {
    let (a, clamped) = clamped_magnitude(x);
    let tail = tail(clamped);
    // 2^64 (Φ(-a) - a φ(a)) = 2^64 e^(-a²/2) (E(a) - a/√(2π)).
    let v = clamped.mul_add(-INV_SQRT_2PI, tail.e_hi);
    let w = if a > TAIL_END { 0.0 } else { tail.times(v, tail.e_lo) };
    // x < 0: Φ(x) + x φ(x) = Φ(-a) - a φ(a); x >= 0: 1 - (Φ(-a) - a φ(a)).
    let derivative = if x < 0.0 { w * UNSCALE } else { w.mul_add(-UNSCALE, 1.0) };
    // 0 for finite x, NaN for ±inf and NaN (one instruction, no select).
    #[allow(clippy::eq_op)]
    let nan_unless_finite = x - x;
    grad * (derivative + nan_unless_finite)
}

/// The derivative of GELU's tanh approximation times `grad`. With
/// `u = √(2/π)(x + 0.044715 x³)`: `(1 + tanh u)/2 + x/2 (1 - tanh² u) u'`,
/// written with `σ(±2|u|)` from one `e^(-2|u|) <= 1` so that neither term
/// cancels or overflows: `(1 + tanh u)/2 = σ(2u)` and
/// `(1 - tanh² u)/4 = σ(2|u|) σ(-2|u|)`.
#[inline(always)]
fn gelu_tanh_backward_one(grad: f32, x: f32) -> f32 {
    let x2 = x * x;
    let u = x * TANH_KC.mul_add(x2, TANH_K);
    let du = TANH_KC3.mul_add(x2, TANH_K);
    let m = -2.0 * u.abs();
    // e^m underflows f32 below -103; from -87 on it is flushed to 0 (the
    // terms it feeds are then below 2^-125 relative to the others).
    #[allow(clippy::manual_clamp)]
    let clamped = if m > -87.0 { m } else { -87.0 };
    let (scale, expm1) = exp_split(clamped, 0.0, 127);
    let e = if m < -87.0 { 0.0 } else { expm1.mul_add(scale, scale) };
    let big = 1.0 / (1.0 + e); // σ(2|u|)
    let small = e * big; // σ(-2|u|)
    let sigma = if u < 0.0 { small } else { big };
    grad * (x * (big * small)).mul_add(2.0 * du, sigma)
}

/// The portable bodies, inlined into each instruction-set variant.
#[inline(always)]
fn gelu_body(x: &[f32], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = gelu_one(v);
    }
}

#[inline(always)]
fn gelu_backward_body(grad: &[f32], x: &[f32], out: &mut [f32]) {
    for ((o, &g), &v) in out.iter_mut().zip(grad).zip(x) {
        *o = gelu_backward_one(g, v);
    }
}

#[inline(always)]
fn gelu_tanh_backward_body(grad: &[f32], x: &[f32], out: &mut [f32]) {
    for ((o, &g), &v) in out.iter_mut().zip(grad).zip(x) {
        *o = gelu_tanh_backward_one(g, v);
    }
}

/// The instruction-set variants of one body and the function that picks one
/// at run time; the function's last argument, `fallback`, runs instead on
/// x86-64 CPUs without AVX2 + FMA.
macro_rules! dispatched {
    (
        $(#[$doc:meta])*
        pub fn $name:ident($($arg:ident: $ty:ty),*) = $body:ident,
        avx512: $avx512:ident, avx2: $avx2:ident
    ) => {
        /// The body compiled for AVX-512 (16 lanes).
        ///
        /// # Safety
        /// The CPU supports AVX-512F.
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx512f")]
        unsafe fn $avx512($($arg: $ty),*) {
            $body($($arg),*)
        }

        /// The body compiled for AVX2 + FMA (8 lanes).
        ///
        /// # Safety
        /// The CPU supports AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn $avx2($($arg: $ty),*) {
            $body($($arg),*)
        }

        $(#[$doc])*
        pub fn $name($($arg: $ty,)* fallback: impl FnOnce($($ty),*)) {
            #[cfg(target_arch = "x86_64")]
            {
                let features = crate::cpu_features::cpu_features();
                if features.avx512f {
                    // SAFETY: AVX-512F was detected on this CPU.
                    return unsafe { $avx512($($arg),*) };
                }
                if features.has_avx2_fma() {
                    // SAFETY: AVX2 and FMA were detected on this CPU.
                    return unsafe { $avx2($($arg),*) };
                }
                fallback($($arg),*)
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                let _ = fallback;
                $body($($arg),*)
            }
        }
    };
}

dispatched! {
    /// `out[i] = gelu(x[i])` (exact GELU, within [`MAX_ULP_ERROR`] ulp) over
    /// the common length.
    pub fn gelu_f32(x: &[f32], out: &mut [f32]) = gelu_body,
    avx512: gelu_avx512, avx2: gelu_avx2
}

dispatched! {
    /// `out[i] = grad[i] · (Φ(x[i]) + x[i] φ(x[i]))` over the common length
    /// (PyTorch's `gelu_backward`).
    pub fn gelu_backward_f32(grad: &[f32], x: &[f32], out: &mut [f32]) = gelu_backward_body,
    avx512: gelu_backward_avx512, avx2: gelu_backward_avx2
}

dispatched! {
    /// `out[i] = grad[i] · gelu_tanh'(x[i])` over the common length (PyTorch's
    /// `gelu_backward(approximate='tanh')`).
    pub fn gelu_tanh_backward_f32(grad: &[f32], x: &[f32], out: &mut [f32]) = gelu_tanh_backward_body,
    avx512: gelu_tanh_backward_avx512, avx2: gelu_tanh_backward_avx2
}

#[cfg(test)]
mod tests {
    use super::*;
    // The public entry points (these kernels with the scalar path as their
    // fallback), in place of the glob's.
    use crate::elementwise::{erfc, gelu_backward_f32, gelu_f32, gelu_tanh_backward, gelu_tanh_backward_f32};
    use crate::scalar::Float;

    /// The spacing of f32 values at the magnitude of `w` (the least
    /// subnormal's below the normal range): one ulp of an f32 result that
    /// should be `w`.
    fn ulp(w: f64) -> f64 {
        let m = w.abs();
        if m < f64::from(f32::MIN_POSITIVE) {
            return 2f64.powi(-149);
        }
        2f64.powi(m.log2().floor() as i32 - 23)
    }

    /// Every `step`-th f32 bit pattern from 0 up to `top` (inclusive of 0),
    /// with both signs.
    fn sweep(from: f32, to: f32, step: u32) -> impl Iterator<Item = f32> {
        (from.to_bits()..=to.to_bits()).step_by(step as usize).flat_map(|b| [f32::from_bits(b), -f32::from_bits(b)])
    }

    /// The inputs of the accuracy sweeps: every 97th f32 in [-10, 10] (every
    /// 997th in unoptimised builds, which are ~30x slower), every 7th of the
    /// tails out to ±15 where GELU underflows, and a sparse sweep out to
    /// ±f32::MAX.
    fn inputs() -> impl Iterator<Item = f32> {
        let step = if cfg!(debug_assertions) { 997 } else { 97 };
        let tail = if cfg!(debug_assertions) { 71 } else { 7 };
        sweep(0.0, 10.0, step).chain(sweep(10.0, 15.0, tail)).chain(sweep(15.0, f32::MAX, 9973))
    }

    /// Runs `kernel` over `xs` in slices of odd lengths (so the vector loops'
    /// remainders are exercised too).
    fn run(xs: &[f32], kernel: impl Fn(&[f32], &mut [f32])) -> Vec<f32> {
        let mut out = vec![0.0f32; xs.len()];
        for (x, o) in xs.chunks(1001).zip(out.chunks_mut(1001)) {
            kernel(x, o);
        }
        out
    }

    /// The largest `|got - want| / ulp(scale(x))` over the inputs, and where.
    fn max_error(
        xs: &[f32],
        got: &[f32],
        want: impl Fn(f64) -> f64,
        scale: impl Fn(f64) -> f64,
    ) -> (f64, f32, f32, f64) {
        let mut worst = (0.0, 0.0f32, 0.0f32, 0.0);
        for (&x, &g) in xs.iter().zip(got) {
            let w = want(f64::from(x));
            let err = (f64::from(g) - w).abs() / ulp(scale(f64::from(x)));
            assert!(!err.is_nan(), "x = {x:e}: got {g:e}, want {w:e}");
            if err > worst.0 {
                worst = (err, x, g, w);
            }
        }
        worst
    }

    #[test]
    fn gelu_is_within_a_few_ulp_of_the_exact_value_everywhere() {
        let xs: Vec<f32> = inputs().collect();
        let got = run(&xs, gelu_f32);
        let (err, x, g, w) = max_error(&xs, &got, |x| x.gelu(), |x| x.gelu());
        eprintln!("gelu_f32: max error {err:.3} ulp at x = {x:e} ({g:e} vs {w:e}) over {} inputs", xs.len());
        assert!(err <= MAX_ULP_ERROR, "gelu({x:e}) = {g:e}, exact {w:e}: {err:.2} ulp");
    }

    /// GELU's derivative crosses zero near x = -0.75: there no formula in f32
    /// keeps relative accuracy, so errors are in ulp of the larger of the two
    /// terms `Φ(x)` and `|x φ(x)|` (the sum's condition). Elsewhere that is
    /// within a factor ~3 of the result.
    fn derivative_scale(x: f64) -> f64 {
        let cdf = 0.5 * erfc(-x / std::f64::consts::SQRT_2);
        let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
        cdf.max((x * pdf).abs())
    }

    #[test]
    fn gelu_backward_is_within_a_few_ulp_of_the_exact_derivative() {
        let xs: Vec<f32> = inputs().filter(|x| x.is_finite()).collect();
        let ones = vec![1.0f32; xs.len()];
        let got = run(&xs, |x, o| {
            let n = x.len();
            gelu_backward_f32(&ones[..n], x, o)
        });
        let (err, x, g, w) = max_error(&xs, &got, |x| f64::gelu_backward(1.0, x), derivative_scale);
        eprintln!("gelu_backward_f32: max error {err:.3} ulp at x = {x:e} ({g:e} vs {w:e})");
        assert!(err <= MAX_ULP_ERROR, "gelu'({x:e}) = {g:e}, exact {w:e}: {err:.2} ulp");
        // The gradient multiplies in with one more rounding.
        let grads: Vec<f32> = (0..xs.len()).map(|i| (i % 17) as f32 * -0.37 + 2.5).collect();
        let mut scaled = vec![0.0f32; xs.len()];
        gelu_backward_f32(&grads, &xs, &mut scaled);
        for ((&x, &g), (&s, &d)) in xs.iter().zip(&grads).zip(scaled.iter().zip(&got)) {
            assert_eq!(s, g * d, "grad {g} at x = {x:e}");
        }
    }

    /// The tanh approximation's derivative, against the same formula in f64.
    /// It has no canonical exact value to be within ulps of: computing
    /// `u = √(2/π)(x + 0.044715 x³)` in f32 (as PyTorch does) moves
    /// `σ(2u) ≈ e^(2u)` by `2|u|` times u's relative error for very negative
    /// `u`, and results below 2^-116 (x < -9.98) are flushed to 0 (PyTorch's
    /// f32 formula gives 0 from x ≈ -4.5 on, where tanh rounds to -1). So the
    /// bound is `4 (1 + 2|u|)` ulp of the larger term, plus 2^-116.
    #[test]
    fn gelu_tanh_backward_matches_the_f64_formula() {
        let xs: Vec<f32> = inputs().filter(|x| x.is_finite() && x.abs() < 1e12).collect();
        let ones = vec![1.0f32; xs.len()];
        let got = run(&xs, |x, o| {
            let n = x.len();
            gelu_tanh_backward_f32(&ones[..n], x, o)
        });
        let mut worst = (0.0f64, 0.0f32);
        for (&x, &g) in xs.iter().zip(&got) {
            let x64 = f64::from(x);
            let want = gelu_tanh_backward(1.0, x64);
            let u = 0.797_884_560_802_865_4 * (x64 + 0.044_715 * x64 * x64 * x64);
            let e = (-2.0 * u.abs()).exp();
            let (big, small) = (1.0 / (1.0 + e), e / (1.0 + e));
            let sigma = if u < 0.0 { small } else { big };
            let du = 0.797_884_560_802_865_4 * (1.0 + 3.0 * 0.044_715 * x64 * x64);
            let larger_term = sigma.max((2.0 * x64 * big * small * du).abs());
            let tolerance = 4.0 * (1.0 + 2.0 * u.abs()) * ulp(larger_term) + 2f64.powi(-116);
            let ratio = (f64::from(g) - want).abs() / tolerance;
            assert!(ratio <= 1.0, "gelu_tanh'({x:e}) = {g:e}, f64 {want:e}");
            if ratio > worst.0 {
                worst = (ratio, x);
            }
        }
        eprintln!("gelu_tanh_backward_f32: max error {:.3} of the tolerance at x = {:e}", worst.0, worst.1);
    }

    #[test]
    fn special_values_behave_as_the_scalar_path_and_pytorch() {
        let specials = [0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::MAX, -f32::MAX, 1e-45, -1e-45];
        let mut out = [0.0f32; 9];
        gelu_f32(&specials, &mut out);
        assert!(out[0] == 0.0 && out[0].is_sign_positive());
        assert!(out[1] == 0.0 && out[1].is_sign_negative(), "gelu(-0) = -0");
        assert_eq!(out[2], f32::INFINITY);
        assert!(out[3].is_nan(), "gelu(-inf) = -inf · 0 = NaN, as PyTorch's");
        assert!(out[4].is_nan());
        assert_eq!(out[5], f32::MAX);
        assert!(out[6] == 0.0 && out[6].is_sign_negative());
        assert_eq!((out[7], out[8]), (0.0, -0.0), "half the least subnormal rounds to 0");
        for (x, y) in specials.iter().zip(&out) {
            let scalar = x.gelu();
            assert!(scalar.to_bits() == y.to_bits() || (scalar.is_nan() && y.is_nan()), "gelu({x}): {y} vs {scalar}");
        }
        // Where GELU underflows: the subnormal results, then -0.
        let mut tail = [0.0f32; 4];
        gelu_f32(&[-13.5, -14.0, -14.4, -20.0], &mut tail);
        assert!(tail[0] < 0.0 && tail[0] > -f32::MIN_POSITIVE, "{}", tail[0]);
        assert!(tail[1] < 0.0 && tail[1] > tail[0], "{}", tail[1]);
        assert!(tail[2] == 0.0 && tail[2].is_sign_negative() && tail[3].to_bits() == (-0.0f32).to_bits());

        let mut grad = [0.0f32; 9];
        gelu_backward_f32(&[1.0; 9], &specials, &mut grad);
        assert_eq!(grad[0], 0.5);
        assert_eq!(grad[1], 0.5);
        assert!(grad[2].is_nan() && grad[3].is_nan() && grad[4].is_nan(), "{grad:?}");
        assert_eq!((grad[5], grad[6]), (1.0, 0.0));
        let scalar: Vec<f32> = specials.iter().map(|&x| f32::gelu_backward(1.0, x)).collect();
        assert!(scalar[2].is_nan() && scalar[3].is_nan() && scalar[4].is_nan(), "{scalar:?}");
        // A NaN gradient stays NaN.
        gelu_backward_f32(&[f32::NAN], &[1.0], &mut grad[..1]);
        assert!(grad[0].is_nan());

        gelu_tanh_backward_f32(&[1.0; 9], &specials, &mut grad);
        assert_eq!((grad[0], grad[1]), (0.5, 0.5));
        assert!(grad[2].is_nan() && grad[3].is_nan() && grad[4].is_nan(), "{grad:?}");
        assert!(gelu_tanh_backward(1.0f64, f64::INFINITY).is_nan());
        gelu_tanh_backward_f32(&[1.0, 1.0], &[30.0, -30.0], &mut grad[..2]);
        assert_eq!((grad[0], grad[1]), (1.0, 0.0));
    }

    /// The AVX-512, AVX2 and portable bodies compute the same operations
    /// with the same roundings (`mul_add` is fused everywhere), so they agree
    /// bit for bit.
    #[test]
    fn every_instruction_set_variant_gives_the_same_bits() {
        let xs: Vec<f32> = sweep(0.0, 16.0, 100_003).chain([f32::NAN, f32::INFINITY, -1e30, 1e-40]).collect();
        let gs: Vec<f32> = xs.iter().map(|x| 1.5 - x.abs().min(3.0)).collect();
        let mut portable = vec![0.0f32; xs.len()];
        let mut variant = vec![0.0f32; xs.len()];
        let same = |a: &[f32], b: &[f32], what: &str| {
            for (i, (p, q)) in a.iter().zip(b).enumerate() {
                assert!(p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()), "{what} at {}: {p} vs {q}", xs[i]);
            }
        };
        #[cfg(target_arch = "x86_64")]
        let features = crate::cpu_features::cpu_features();
        gelu_body(&xs, &mut portable);
        #[cfg(target_arch = "x86_64")]
        {
            if features.avx512f {
                // SAFETY: AVX-512F was detected.
                unsafe { gelu_avx512(&xs, &mut variant) };
                same(&portable, &variant, "gelu avx512");
            }
            if features.has_avx2_fma() {
                // SAFETY: AVX2 and FMA were detected.
                unsafe { gelu_avx2(&xs, &mut variant) };
                same(&portable, &variant, "gelu avx2");
            }
        }
        gelu_backward_body(&gs, &xs, &mut portable);
        #[cfg(target_arch = "x86_64")]
        {
            if features.avx512f {
                // SAFETY: AVX-512F was detected.
                unsafe { gelu_backward_avx512(&gs, &xs, &mut variant) };
                same(&portable, &variant, "gelu_backward avx512");
            }
            if features.has_avx2_fma() {
                // SAFETY: AVX2 and FMA were detected.
                unsafe { gelu_backward_avx2(&gs, &xs, &mut variant) };
                same(&portable, &variant, "gelu_backward avx2");
            }
        }
        gelu_tanh_backward_body(&gs, &xs, &mut portable);
        #[cfg(target_arch = "x86_64")]
        {
            if features.avx512f {
                // SAFETY: AVX-512F was detected.
                unsafe { gelu_tanh_backward_avx512(&gs, &xs, &mut variant) };
                same(&portable, &variant, "gelu_tanh_backward avx512");
            }
            if features.has_avx2_fma() {
                // SAFETY: AVX2 and FMA were detected.
                unsafe { gelu_tanh_backward_avx2(&gs, &xs, &mut variant) };
                same(&portable, &variant, "gelu_tanh_backward avx2");
            }
        }
    }
}
