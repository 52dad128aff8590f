//! Counter-based random numbers: [`philox4x32_10`] and a [`Generator`] whose
//! draws are a pure function of `(seed, element index)`.
//!
//! Element `n` of a generator's stream is computed from one Philox block,
//! counter `[n_lo, n_hi, 0, 0]` and key `[seed_lo, seed_hi]`, and takes up to
//! its four words. Nothing is carried from one element to the next, so:
//!
//! - a fill gives the same values however it is split into chunks or threads
//!   (`fill_*_at` fills a chunk as elements `start_index..` of the stream);
//! - the state is just `(seed, offset)`, where `offset` is the index of the
//!   next element to draw; saving and restoring it repeats the draws exactly
//!   (activation checkpointing relies on this to recompute the same dropout
//!   masks);
//! - every fill advances the offset by the number of elements it wrote.
//!
//! Counter words 2 and 3 are always zero here; they are left for independent
//! sub-streams should one generator ever need them.

use std::f64::consts::TAU;

use crate::dtype::WithDType;

const PHILOX_M0: u32 = 0xD251_1F53;
const PHILOX_M1: u32 = 0xCD9E_8D57;
const PHILOX_W0: u32 = 0x9E37_79B9;
const PHILOX_W1: u32 = 0xBB67_AE85;

/// The Philox4x32 bijection with 10 rounds (Salmon et al., "Parallel random
/// numbers: as easy as 1, 2, 3", SC'11), as PyTorch and JAX use it.
// Always inlined: called once per element, and fill loops only vectorise
// across elements when they can see the rounds (about 4x faster).
#[inline(always)]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut ctr = counter;
    let mut key = key;
    for round in 0..10 {
        if round > 0 {
            key[0] = key[0].wrapping_add(PHILOX_W0);
            key[1] = key[1].wrapping_add(PHILOX_W1);
        }
        let product0 = u64::from(PHILOX_M0) * u64::from(ctr[0]);
        let product1 = u64::from(PHILOX_M1) * u64::from(ctr[2]);
        let (hi0, lo0) = ((product0 >> 32) as u32, product0 as u32);
        let (hi1, lo1) = ((product1 >> 32) as u32, product1 as u32);
        ctr = [hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0];
    }
    ctr
}

/// Why a fill was refused. A refused fill writes nothing and does not move
/// the generator's offset.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RngError {
    /// A uniform range that is not finite or has `low > high`.
    #[error("{op}: expected finite low <= high, got low = {low}, high = {high}")]
    InvalidRange {
        /// The fill.
        op: &'static str,
        /// The lower bound given.
        low: f64,
        /// The upper bound given.
        high: f64,
    },
    /// A normal distribution with a non-finite mean or a negative or
    /// non-finite standard deviation.
    #[error("{op}: expected a finite mean and a finite std >= 0, got mean = {mean}, std = {std}")]
    InvalidNormal {
        /// The fill.
        op: &'static str,
        /// The mean given.
        mean: f64,
        /// The standard deviation given.
        std: f64,
    },
    /// A Bernoulli probability outside `[0, 1]`.
    #[error("bernoulli: expected a probability in [0, 1], got {p}")]
    InvalidProbability {
        /// The probability given.
        p: f64,
    },
}

/// A generator's complete state: restoring it repeats every later draw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GeneratorState {
    /// The seed that selects the stream (the Philox key).
    pub seed: u64,
    /// Index of the next element to draw.
    pub offset: u64,
}

/// A Philox4x32-10 stream of random elements, positioned at `offset`.
///
/// Not `Copy`, so that duplicating a stream (and drawing the same numbers
/// twice) is always a visible `clone()` or `state()`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Generator {
    seed: u64,
    offset: u64,
}

impl Generator {
    /// A generator at the start of `seed`'s stream.
    pub fn new(seed: u64) -> Self {
        Generator { seed, offset: 0 }
    }

    /// A generator positioned where `state` says.
    pub fn from_state(state: GeneratorState) -> Self {
        Generator { seed: state.seed, offset: state.offset }
    }

    /// The seed this generator's stream was started from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Index of the next element a fill will draw.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// A snapshot of seed and offset; [`Generator::set_state`] or
    /// [`Generator::from_state`] with it repeats the draws that follow.
    pub fn state(&self) -> GeneratorState {
        GeneratorState { seed: self.seed, offset: self.offset }
    }

    /// Moves this generator to `state`: the next fill draws what a generator
    /// in that state would.
    pub fn set_state(&mut self, state: GeneratorState) {
        self.seed = state.seed;
        self.offset = state.offset;
    }

    /// Claims the next `count` elements of the stream and returns the index of
    /// the first, for filling them in parallel with the `fill_*_at` functions.
    /// (The offset wraps after 2^64 elements.)
    pub fn reserve(&mut self, count: u64) -> u64 {
        let start = self.offset;
        self.offset = self.offset.wrapping_add(count);
        start
    }

    /// The four random words of element `index` of this stream.
    #[inline(always)]
    pub fn block_at(&self, index: u64) -> [u32; 4] {
        philox4x32_10([index as u32, (index >> 32) as u32, 0, 0], [self.seed as u32, (self.seed >> 32) as u32])
    }

    /// Fills `out` with values uniform in `[low, high)` (just `low` when they
    /// are equal), and advances the offset by `out.len()`.
    pub fn fill_uniform_f32(&mut self, out: &mut [f32], low: f32, high: f32) -> Result<(), RngError> {
        check_range("uniform_f32", low.into(), high.into())?;
        let start = self.reserve(out.len() as u64);
        self.fill_uniform_f32_at(out, start, low, high)
    }

    /// Fills `out` as elements `start_index..` of the stream would be filled
    /// by [`Generator::fill_uniform_f32`]; does not move the offset.
    pub fn fill_uniform_f32_at(&self, out: &mut [f32], start_index: u64, low: f32, high: f32) -> Result<(), RngError> {
        check_range("uniform_f32", low.into(), high.into())?;
        let (low64, high64) = (f64::from(low), f64::from(high));
        // Rounding can land exactly on `high`; the interval is half-open.
        // (Computed once so that the loop body stays branch-free.)
        let largest = f32_below(high).max(low);
        for (index, value) in (start_index..).zip(out.iter_mut()) {
            let u = unit_from_u32(self.block_at(index)[0]);
            let scaled = lerp(low64, high64, u) as f32;
            *value = if scaled < high { scaled } else { largest };
        }
        Ok(())
    }

    /// Fills `out` with values uniform in `[low, high)` (just `low` when they
    /// are equal) with 53 random bits each, and advances the offset.
    pub fn fill_uniform_f64(&mut self, out: &mut [f64], low: f64, high: f64) -> Result<(), RngError> {
        check_range("uniform_f64", low, high)?;
        let start = self.reserve(out.len() as u64);
        self.fill_uniform_f64_at(out, start, low, high)
    }

    /// The chunk form of [`Generator::fill_uniform_f64`].
    pub fn fill_uniform_f64_at(&self, out: &mut [f64], start_index: u64, low: f64, high: f64) -> Result<(), RngError> {
        check_range("uniform_f64", low, high)?;
        let largest = f64_below(high).max(low);
        for (index, value) in (start_index..).zip(out.iter_mut()) {
            let [w0, w1, _, _] = self.block_at(index);
            let scaled = lerp(low, high, unit_from_u64(w0, w1));
            *value = if scaled < high { scaled } else { largest };
        }
        Ok(())
    }

    /// Fills `out` with normal values of the given mean and standard deviation
    /// (Box–Muller, computed in f64), and advances the offset.
    pub fn fill_normal_f32(&mut self, out: &mut [f32], mean: f32, std: f32) -> Result<(), RngError> {
        check_normal("normal_f32", mean.into(), std.into())?;
        let start = self.reserve(out.len() as u64);
        self.fill_normal_f32_at(out, start, mean, std)
    }

    /// The chunk form of [`Generator::fill_normal_f32`].
    pub fn fill_normal_f32_at(&self, out: &mut [f32], start_index: u64, mean: f32, std: f32) -> Result<(), RngError> {
        check_normal("normal_f32", mean.into(), std.into())?;
        let (mean, std) = (f64::from(mean), f64::from(std));
        for (index, value) in (start_index..).zip(out.iter_mut()) {
            let [w0, w1, _, _] = self.block_at(index);
            // 1 - u lies in (0, 1], so the logarithm is finite.
            let z = box_muller(1.0 - unit_from_u32(w0), unit_from_u32(w1));
            *value = (mean + std * z) as f32;
        }
        Ok(())
    }

    /// Fills `out` with normal values (Box–Muller from two 53-bit uniforms),
    /// and advances the offset.
    pub fn fill_normal_f64(&mut self, out: &mut [f64], mean: f64, std: f64) -> Result<(), RngError> {
        check_normal("normal_f64", mean, std)?;
        let start = self.reserve(out.len() as u64);
        self.fill_normal_f64_at(out, start, mean, std)
    }

    /// The chunk form of [`Generator::fill_normal_f64`].
    pub fn fill_normal_f64_at(&self, out: &mut [f64], start_index: u64, mean: f64, std: f64) -> Result<(), RngError> {
        check_normal("normal_f64", mean, std)?;
        for (index, value) in (start_index..).zip(out.iter_mut()) {
            let [w0, w1, w2, w3] = self.block_at(index);
            let z = box_muller(1.0 - unit_from_u64(w0, w1), unit_from_u64(w2, w3));
            *value = mean + std * z;
        }
        Ok(())
    }

    /// Fills `out` with ones with probability `p` and zeros otherwise (true
    /// and false for bool) — a dropout keep-mask is `fill_bernoulli(mask,
    /// 1.0 - drop_rate)` — and advances the offset.
    pub fn fill_bernoulli<T: WithDType>(&mut self, out: &mut [T], p: f64) -> Result<(), RngError> {
        check_probability(p)?;
        let start = self.reserve(out.len() as u64);
        self.fill_bernoulli_at(out, start, p)
    }

    /// The chunk form of [`Generator::fill_bernoulli`].
    pub fn fill_bernoulli_at<T: WithDType>(&self, out: &mut [T], start_index: u64, p: f64) -> Result<(), RngError> {
        check_probability(p)?;
        // One when the 53-bit uniform u = bits / 2^53 is below p, tested on
        // the integer bits (p * 2^53 is exact): integer compares vectorise.
        // Since u < 1, p = 1 always draws one and p = 0 never does.
        let threshold = (p * UNIT_53_SCALE).ceil() as u64;
        for (index, value) in (start_index..).zip(out.iter_mut()) {
            let [w0, w1, _, _] = self.block_at(index);
            *value = if random_53_bits(w0, w1) < threshold { T::ONE } else { T::ZERO };
        }
        Ok(())
    }
}

fn check_range(op: &'static str, low: f64, high: f64) -> Result<(), RngError> {
    if low.is_finite() && high.is_finite() && low <= high {
        Ok(())
    } else {
        Err(RngError::InvalidRange { op, low, high })
    }
}

fn check_normal(op: &'static str, mean: f64, std: f64) -> Result<(), RngError> {
    if mean.is_finite() && std.is_finite() && std >= 0.0 {
        Ok(())
    } else {
        Err(RngError::InvalidNormal { op, mean, std })
    }
}

fn check_probability(p: f64) -> Result<(), RngError> {
    if (0.0..=1.0).contains(&p) {
        Ok(())
    } else {
        Err(RngError::InvalidProbability { p })
    }
}

/// A uniform value in `[0, 1)` from 32 random bits, exact in f64.
#[inline]
fn unit_from_u32(word: u32) -> f64 {
    f64::from(word) * (1.0 / 4_294_967_296.0)
}

/// 2^53: the number of distinct 53-bit uniforms.
const UNIT_53_SCALE: f64 = 9_007_199_254_740_992.0;

/// The top 53 of 64 random bits.
#[inline]
fn random_53_bits(high: u32, low: u32) -> u64 {
    ((u64::from(high) << 32) | u64::from(low)) >> 11
}

/// A uniform value in `[0, 1)` with 53 random bits (all an f64 holds).
#[inline]
fn unit_from_u64(high: u32, low: u32) -> f64 {
    // Below 2^53, so the signed conversion (cheaper than unsigned) is exact.
    random_53_bits(high, low) as i64 as f64 * (1.0 / UNIT_53_SCALE)
}

/// `low + (high - low) * t` written so that it cannot overflow to infinity
/// for finite ends.
#[inline]
fn lerp(low: f64, high: f64, t: f64) -> f64 {
    low * (1.0 - t) + high * t
}

/// One standard normal value from `u1` in `(0, 1]` and `u2` in `[0, 1)`.
#[inline]
fn box_muller(u1: f64, u2: f64) -> f64 {
    (-2.0 * u1.ln()).sqrt() * (TAU * u2).cos()
}

/// The largest f32 below a finite `x`.
fn f32_below(x: f32) -> f32 {
    if x == 0.0 {
        -f32::from_bits(1)
    } else if x > 0.0 {
        f32::from_bits(x.to_bits() - 1)
    } else {
        f32::from_bits(x.to_bits() + 1)
    }
}

/// The largest f64 below a finite `x`.
fn f64_below(x: f64) -> f64 {
    if x == 0.0 {
        -f64::from_bits(1)
    } else if x > 0.0 {
        f64::from_bits(x.to_bits() - 1)
    } else {
        f64::from_bits(x.to_bits() + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;
    use proptest::prelude::*;

    #[test]
    fn philox_known_answers() {
        // Random123's kat_vectors, "philox4x32 10" lines: counter, key, result.
        let cases = [
            ([0u32; 4], [0u32; 2], [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]),
            ([u32::MAX; 4], [u32::MAX; 2], [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]),
            (
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0],
                [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1],
            ),
        ];
        for (counter, key, expected) in cases {
            assert_eq!(philox4x32_10(counter, key), expected, "counter {counter:x?}");
        }
    }

    #[test]
    fn block_at_uses_index_as_counter_and_seed_as_key() {
        let generator = Generator::new(0x299f_31d0_a409_3822);
        let index = 0x85a3_08d3_243f_6a88;
        let expected = philox4x32_10([0x243f_6a88, 0x85a3_08d3, 0, 0], [0xa409_3822, 0x299f_31d0]);
        assert_eq!(generator.block_at(index), expected);
    }

    #[test]
    fn fills_advance_the_offset_and_continue_the_stream() {
        let mut generator = Generator::new(7);
        let mut first = [0f32; 5];
        let mut second = [0f32; 3];
        generator.fill_uniform_f32(&mut first, 0.0, 1.0).unwrap();
        assert_eq!(generator.offset(), 5);
        generator.fill_uniform_f32(&mut second, 0.0, 1.0).unwrap();
        assert_eq!(generator.offset(), 8);

        let mut whole = [0f32; 8];
        Generator::new(7).fill_uniform_f32(&mut whole, 0.0, 1.0).unwrap();
        assert_eq!(&whole[..5], &first);
        assert_eq!(&whole[5..], &second);
        assert_ne!(first[0], first[1]);
    }

    #[test]
    fn restoring_the_state_repeats_the_draws() {
        let mut generator = Generator::new(1234);
        let mut warmup = [0f64; 17];
        generator.fill_normal_f64(&mut warmup, 0.0, 1.0).unwrap();
        let saved = generator.state();
        let mut mask = [false; 64];
        let mut noise = [0f32; 10];
        generator.fill_bernoulli(&mut mask, 0.5).unwrap();
        generator.fill_normal_f32(&mut noise, 0.0, 2.0).unwrap();

        generator.set_state(saved);
        let mut mask_again = [false; 64];
        let mut noise_again = [0f32; 10];
        generator.fill_bernoulli(&mut mask_again, 0.5).unwrap();
        generator.fill_normal_f32(&mut noise_again, 0.0, 2.0).unwrap();
        assert_eq!(mask, mask_again);
        assert_eq!(noise, noise_again);
        assert_eq!(Generator::from_state(saved).state(), saved);
        assert!(mask.contains(&true) && mask.contains(&false));
    }

    #[test]
    fn seeds_give_different_streams() {
        let mut a = [0f32; 16];
        let mut b = [0f32; 16];
        Generator::new(1).fill_uniform_f32(&mut a, 0.0, 1.0).unwrap();
        Generator::new(2).fill_uniform_f32(&mut b, 0.0, 1.0).unwrap();
        assert!(a.iter().zip(&b).all(|(x, y)| x != y));
    }

    #[test]
    fn invalid_arguments_are_refused_without_drawing() {
        let mut generator = Generator::new(0);
        let mut out = [0f32; 4];
        let error = generator.fill_uniform_f32(&mut out, 1.0, 0.0).unwrap_err();
        assert_eq!(error, RngError::InvalidRange { op: "uniform_f32", low: 1.0, high: 0.0 });
        assert_eq!(error.to_string(), "uniform_f32: expected finite low <= high, got low = 1, high = 0");
        let error = generator.fill_uniform_f32(&mut out, 0.0, f32::INFINITY).unwrap_err();
        assert!(matches!(error, RngError::InvalidRange { op: "uniform_f32", .. }), "{error:?}");
        let error = generator.fill_normal_f32(&mut out, 0.0, -1.0).unwrap_err();
        assert_eq!(error, RngError::InvalidNormal { op: "normal_f32", mean: 0.0, std: -1.0 });
        assert_eq!(
            error.to_string(),
            "normal_f32: expected a finite mean and a finite std >= 0, got mean = 0, std = -1"
        );
        let error = generator.fill_normal_f64(&mut [0.0], f64::NAN, 1.0).unwrap_err();
        assert!(matches!(error, RngError::InvalidNormal { op: "normal_f64", .. }), "{error:?}");
        let error = generator.fill_bernoulli(&mut out, 1.5).unwrap_err();
        assert_eq!(error, RngError::InvalidProbability { p: 1.5 });
        assert_eq!(error.to_string(), "bernoulli: expected a probability in [0, 1], got 1.5");
        let error = generator.fill_bernoulli(&mut out, f64::NAN).unwrap_err();
        assert!(matches!(error, RngError::InvalidProbability { p } if p.is_nan()), "{error:?}");
        assert_eq!(generator.offset(), 0);
        assert_eq!(out, [0.0; 4]);
    }

    #[test]
    fn uniform_stays_in_its_half_open_interval() {
        let mut generator = Generator::new(3);
        // One ulp wide: half the draws would round up to `high`.
        let (low, high) = (1.0f32, f32::from_bits(1.0f32.to_bits() + 1));
        let mut out = vec![0f32; 1000];
        generator.fill_uniform_f32(&mut out, low, high).unwrap();
        assert!(out.iter().all(|&x| x == low));

        let mut wide = vec![0f64; 1000];
        generator.fill_uniform_f64(&mut wide, -f64::MAX, f64::MAX).unwrap();
        assert!(wide.iter().all(|x| x.is_finite()));
        assert!(wide.iter().any(|&x| x < -1e300) && wide.iter().any(|&x| x > 1e300));

        let mut point = [9f32; 3];
        generator.fill_uniform_f32(&mut point, -2.0, -2.0).unwrap();
        assert_eq!(point, [-2.0; 3]);

        let mut neg = vec![0f32; 1000];
        generator.fill_uniform_f32(&mut neg, -3.0, -1.0).unwrap();
        assert!(neg.iter().all(|&x| (-3.0..-1.0).contains(&x)));
    }

    fn mean_and_variance(values: impl Iterator<Item = f64>) -> (f64, f64) {
        let values: Vec<f64> = values.collect();
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let variance = values.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        (mean, variance)
    }

    // The tolerances below are about six standard errors: a correct generator
    // fails them with negligible probability, a biased one does not pass.
    const SAMPLES: usize = 200_000;

    #[test]
    fn uniform_moments() {
        let mut generator = Generator::new(42);
        let mut out = vec![0f32; SAMPLES];
        generator.fill_uniform_f32(&mut out, 2.0, 6.0).unwrap();
        assert!(out.iter().all(|&x| (2.0..6.0).contains(&x)));
        let (mean, variance) = mean_and_variance(out.iter().map(|&x| f64::from(x)));
        // Uniform on [2, 6): mean 4, variance 16/12, sd of the mean ~0.0026.
        assert!((mean - 4.0).abs() < 0.016, "mean {mean}");
        assert!((variance - 16.0 / 12.0).abs() < 0.012, "variance {variance}");

        let mut out = vec![0f64; SAMPLES];
        generator.fill_uniform_f64(&mut out, 0.0, 1.0).unwrap();
        let (mean, variance) = mean_and_variance(out.iter().copied());
        assert!((mean - 0.5).abs() < 0.004, "mean {mean}");
        assert!((variance - 1.0 / 12.0).abs() < 0.0008, "variance {variance}");
    }

    #[test]
    fn normal_moments() {
        let mut generator = Generator::new(43);
        let mut out = vec![0f32; SAMPLES];
        generator.fill_normal_f32(&mut out, 1.5, 2.0).unwrap();
        let (mean, variance) = mean_and_variance(out.iter().map(|&x| f64::from(x)));
        // sd of the mean 2/sqrt(n) ~0.0045; sd of the sample sd ~0.0032.
        assert!((mean - 1.5).abs() < 0.027, "mean {mean}");
        assert!((variance.sqrt() - 2.0).abs() < 0.02, "std {}", variance.sqrt());
        let within_one_sd = out.iter().filter(|&&x| (x - 1.5).abs() < 2.0).count();
        let fraction = within_one_sd as f64 / SAMPLES as f64;
        assert!((fraction - 0.6827).abs() < 0.007, "fraction within 1 sd {fraction}");

        let mut out = vec![0f64; SAMPLES];
        generator.fill_normal_f64(&mut out, -3.0, 0.5).unwrap();
        let (mean, variance) = mean_and_variance(out.iter().copied());
        assert!((mean + 3.0).abs() < 0.007, "mean {mean}");
        assert!((variance.sqrt() - 0.5).abs() < 0.005, "std {}", variance.sqrt());
        assert!(out.iter().all(|x| x.is_finite()));
    }

    #[test]
    fn bernoulli_frequency_and_edges() {
        let mut generator = Generator::new(44);
        let mut mask = vec![0f32; SAMPLES];
        generator.fill_bernoulli(&mut mask, 0.3).unwrap();
        assert!(mask.iter().all(|&x| x == 0.0 || x == 1.0));
        let fraction = mask.iter().sum::<f32>() as f64 / SAMPLES as f64;
        // sd ~0.001
        assert!((fraction - 0.3).abs() < 0.006, "fraction {fraction}");

        let mut ones = vec![bf16::ZERO; 1000];
        generator.fill_bernoulli(&mut ones, 1.0).unwrap();
        assert!(ones.iter().all(|&x| x == bf16::ONE));
        let mut zeros = vec![7u8; 1000];
        generator.fill_bernoulli(&mut zeros, 0.0).unwrap();
        assert!(zeros.iter().all(|&x| x == 0));
    }

    /// Split points for `len` elements from raw random numbers.
    fn chunk_bounds(len: usize, raw: &[usize]) -> Vec<usize> {
        let mut bounds: Vec<usize> = raw.iter().map(|r| r % (len + 1)).collect();
        bounds.push(0);
        bounds.push(len);
        bounds.sort_unstable();
        bounds
    }

    proptest! {
        #[test]
        fn chunked_fills_equal_one_fill(
            seed: u64,
            offset in any::<u64>().prop_map(|o| o >> 1),
            len in 0usize..300,
            raw in proptest::collection::vec(any::<usize>(), 0..6),
        ) {
            let mut single = Generator::from_state(GeneratorState { seed, offset });
            let mut uniform = vec![0f32; len];
            let mut uniform64 = vec![0f64; len];
            let mut normal = vec![0f32; len];
            let mut normal64 = vec![0f64; len];
            let mut mask = vec![false; len];
            single.fill_uniform_f32(&mut uniform, -1.0, 3.0).unwrap();
            single.fill_uniform_f64(&mut uniform64, 0.0, 1.0).unwrap();
            single.fill_normal_f32(&mut normal, 0.0, 1.0).unwrap();
            single.fill_normal_f64(&mut normal64, 5.0, 0.1).unwrap();
            single.fill_bernoulli(&mut mask, 0.25).unwrap();

            // The same draws, claimed up front and filled chunk by chunk in
            // reverse order, as threads finishing in any order would.
            let mut chunked = Generator::from_state(GeneratorState { seed, offset });
            let bases: Vec<u64> = (0..5).map(|_| chunked.reserve(len as u64)).collect();
            prop_assert_eq!(chunked.state(), single.state());
            let bounds = chunk_bounds(len, &raw);
            let mut got = (vec![0f32; len], vec![0f64; len], vec![0f32; len], vec![0f64; len], vec![false; len]);
            for pair in bounds.windows(2).rev() {
                let (a, b) = (pair[0], pair[1]);
                let at = a as u64;
                chunked.fill_uniform_f32_at(&mut got.0[a..b], bases[0] + at, -1.0, 3.0).unwrap();
                chunked.fill_uniform_f64_at(&mut got.1[a..b], bases[1] + at, 0.0, 1.0).unwrap();
                chunked.fill_normal_f32_at(&mut got.2[a..b], bases[2] + at, 0.0, 1.0).unwrap();
                chunked.fill_normal_f64_at(&mut got.3[a..b], bases[3] + at, 5.0, 0.1).unwrap();
                chunked.fill_bernoulli_at(&mut got.4[a..b], bases[4] + at, 0.25).unwrap();
            }
            prop_assert_eq!(got.0, uniform);
            prop_assert_eq!(got.1, uniform64);
            prop_assert_eq!(got.2, normal);
            prop_assert_eq!(got.3, normal64);
            prop_assert_eq!(got.4, mask);
        }
    }
}
