//! Values a device writes without reading any: sequences and random draws.

/// A constructor's values (see [`crate::backend::DeviceOps::sequence`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Sequence {
    /// `start + i·step`, computed in f64.
    Arange {
        /// The first value.
        start: f64,
        /// The difference between neighbours.
        step: f64,
    },
    /// Evenly spaced from `start` to `end` inclusive; the first half counts
    /// from `start`, the second back from `end`, so both ends are exact.
    Linspace {
        /// The first value.
        start: f64,
        /// The last value.
        end: f64,
    },
    /// The identity matrix (a 2-d output).
    Eye,
}

impl Sequence {
    /// Element `i` of `n` (for [`Sequence::Eye`] over `cols` columns: 1 on the diagonal).
    pub(crate) fn value(&self, i: usize, n: usize, cols: usize) -> f64 {
        match *self {
            Sequence::Arange { start, step } => start + i as f64 * step,
            Sequence::Linspace { start, end } => {
                let step = (end - start) / n.saturating_sub(1).max(1) as f64;
                match n {
                    1 => start,
                    _ if i < n / 2 => start + step * i as f64,
                    _ => end - step * (n - 1 - i) as f64,
                }
            }
            Sequence::Eye => f64::from(u8::from(i / cols.max(1) == i % cols.max(1))),
        }
    }
}

/// What a random fill draws (from the process-wide counter-based generator).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Distribution {
    /// Uniform in `[low, high)`.
    Uniform {
        /// Inclusive lower bound.
        low: f64,
        /// Exclusive upper bound.
        high: f64,
    },
    /// Normal with this mean and standard deviation.
    Normal {
        /// The mean.
        mean: f64,
        /// The standard deviation.
        std: f64,
    },
    /// 1 with probability `p`, else 0 (any dtype).
    Bernoulli {
        /// The probability of a 1.
        p: f64,
    },
}
