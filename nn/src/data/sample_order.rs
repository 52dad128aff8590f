//! The order in which a [`DataLoader`](super::DataLoader) reads samples:
//! `0..N`, or a permutation fixed by a seed and the epoch, the same on
//! every platform and for any number of workers (PyTorch's samplers).
//!
//! A dataset of up to 2²⁰ samples has its permutation drawn once per epoch
//! (Fisher–Yates, 8 bytes a sample); a larger one is a keyed bijection
//! evaluated per position, with no memory at all.
//!
//! ```
//! use brasa_nn::data::{permutation, SampleOrder};
//! let order = SampleOrder::shuffled(10, 7);
//! assert_eq!(order.range(0, 10), permutation(10, 7));
//! assert_eq!(SampleOrder::sequential(3).range(0, 3), [0, 1, 2]);
//! ```

use std::sync::Arc;

/// Datasets up to this many samples have their shuffle drawn by
/// Fisher–Yates into a vector once per epoch; larger ones use the lazy
/// [`FeistelPermutation`].
const MATERIALIZED_SHUFFLE: usize = 1 << 20;

/// SplitMix64: a small, well-mixed generator whose output is the same on
/// every platform, so a seed means the same order everywhere.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (`bound > 0`), without modulo bias (Lemire's method).
    fn below(&mut self, bound: u64) -> u64 {
        let threshold = bound.wrapping_neg() % bound;
        loop {
            let product = u128::from(self.next_u64()) * u128::from(bound);
            if (product as u64) >= threshold {
                return (product >> 64) as u64;
            }
        }
    }
}

/// A random permutation of `0..n` determined by `seed` alone: the same on
/// every run, machine and thread count (Fisher–Yates with SplitMix64).
pub fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = SplitMix64(seed);
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

/// The seed of epoch `epoch`'s shuffle: the loader's seed and the epoch mixed,
/// so neighbouring seeds and epochs give unrelated orders.
pub(super) fn epoch_seed(seed: u64, epoch: u64) -> u64 {
    SplitMix64(seed ^ SplitMix64(epoch).next_u64()).next_u64()
}

/// A random permutation of `0..n` evaluated one position at a time, without
/// storing it: a balanced Feistel network over the smallest `2^(2k) >= n`
/// with a SplitMix64 round function keyed by the seed, walked until it lands
/// below `n` (cycle walking keeps it a bijection of `0..n`; fewer than four
/// steps on average as the domain is less than `4n`).
#[derive(Clone, Copy, Debug)]
struct FeistelPermutation {
    n: u64,
    /// Bits of each half of the domain.
    half_bits: u32,
    keys: [u64; FeistelPermutation::ROUNDS],
}

impl FeistelPermutation {
    const ROUNDS: usize = 6;

    fn new(n: usize, seed: u64) -> FeistelPermutation {
        let n = n as u64;
        let bits = (64 - n.saturating_sub(1).leading_zeros()).max(2);
        let half_bits = bits.div_ceil(2);
        let mut rng = SplitMix64(seed);
        let keys = std::array::from_fn(|_| rng.next_u64());
        FeistelPermutation { n, half_bits, keys }
    }

    fn round(&self, value: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut left, mut right) = (value >> self.half_bits, value & mask);
        for key in self.keys {
            let mixed = SplitMix64(right ^ key).next_u64() & mask;
            (left, right) = (right, left ^ mixed);
        }
        (left << self.half_bits) | right
    }

    /// The sample at `position` (`position < n`).
    fn get(&self, position: usize) -> usize {
        let mut value = self.round(position as u64);
        while value >= self.n {
            value = self.round(value);
        }
        value as usize
    }
}

/// The order in which an epoch visits the samples (see the module docs):
/// `0..N`, or a seeded permutation of it. Computed per position, so it costs
/// no memory for sequential or very large datasets.
#[derive(Clone, Debug)]
pub struct SampleOrder {
    len: usize,
    kind: OrderKind,
}

#[derive(Clone, Debug)]
enum OrderKind {
    Sequential,
    Drawn(Arc<[usize]>),
    Lazy(FeistelPermutation),
}

impl SampleOrder {
    /// `0..len`.
    pub fn sequential(len: usize) -> SampleOrder {
        SampleOrder { len, kind: OrderKind::Sequential }
    }

    /// A permutation of `0..len` determined by `seed` alone: [`permutation`]
    /// up to 2²⁰ samples, a lazily evaluated one above.
    pub fn shuffled(len: usize, seed: u64) -> SampleOrder {
        SampleOrder::shuffled_with_threshold(len, seed, MATERIALIZED_SHUFFLE)
    }

    fn shuffled_with_threshold(len: usize, seed: u64, materialized: usize) -> SampleOrder {
        let kind = if len <= materialized {
            OrderKind::Drawn(permutation(len, seed).into())
        } else {
            OrderKind::Lazy(FeistelPermutation::new(len, seed))
        };
        SampleOrder { len, kind }
    }

    /// The number of samples.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The sample visited at `position`, if `position < len`.
    pub fn get(&self, position: usize) -> Option<usize> {
        if position >= self.len {
            return None;
        }
        Some(match &self.kind {
            OrderKind::Sequential => position,
            OrderKind::Drawn(order) => order[position],
            OrderKind::Lazy(permutation) => permutation.get(position),
        })
    }

    /// The samples of positions `start..end` (clamped to the length).
    pub fn range(&self, start: usize, end: usize) -> Vec<usize> {
        let end = end.min(self.len);
        let start = start.min(end);
        match &self.kind {
            OrderKind::Sequential => (start..end).collect(),
            OrderKind::Drawn(order) => order[start..end].to_vec(),
            OrderKind::Lazy(permutation) => (start..end).map(|p| permutation.get(p)).collect(),
        }
    }

    /// The samples in order.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.len).map(|p| self.get(p).unwrap_or(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutations_are_seeded_and_complete() {
        let a = permutation(1000, 5);
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        assert_eq!(a, permutation(1000, 5));
        assert_ne!(a, permutation(1000, 6));
        assert!(permutation(0, 1).is_empty());
        assert_eq!(permutation(1, 1), [0]);
    }

    #[test]
    fn lazy_permutations_are_seeded_bijections() {
        for n in [1usize, 2, 3, 17, 1000, 4097] {
            let order = SampleOrder::shuffled_with_threshold(n, 9, 0);
            assert!(matches!(order.kind, OrderKind::Lazy(_)));
            let mut seen: Vec<usize> = order.iter().collect();
            assert_eq!(seen, order.range(0, n));
            seen.sort();
            assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n = {n}");
        }
        let (a, b) =
            (SampleOrder::shuffled_with_threshold(1000, 9, 0), SampleOrder::shuffled_with_threshold(1000, 10, 0));
        assert_ne!(a.range(0, 1000), b.range(0, 1000));
        assert_ne!(a.range(0, 1000), (0..1000).collect::<Vec<_>>());
        // Small datasets keep the drawn permutation.
        assert_eq!(SampleOrder::shuffled(1000, 5).range(0, 1000), permutation(1000, 5));
        assert_eq!(SampleOrder::sequential(3).get(3), None);
    }

    #[test]
    fn epoch_seeds_differ() {
        assert_ne!(epoch_seed(0, 0), epoch_seed(0, 1));
        assert_ne!(epoch_seed(0, 1), epoch_seed(1, 0));
    }

    #[test]
    fn bounded_draws_are_roughly_uniform() {
        let mut rng = SplitMix64(42);
        let mut counts = [0usize; 3];
        for _ in 0..30_000 {
            counts[rng.below(3) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| (9_000..11_000).contains(&c)), "{counts:?}");
    }
}
