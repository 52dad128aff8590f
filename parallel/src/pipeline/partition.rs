//! Splitting a `Sequential` into stages: contiguous ranges of its layers,
//! given by hand ([`Partition::Boundaries`]) or balanced so that the most
//! expensive stage is as cheap as possible, by parameter bytes
//! ([`Partition::ParameterBytes`]) or by measured forward time
//! ([`Partition::ForwardTime`]).
//!
//! ```
//! use brasa_parallel::pipeline::balance;
//!
//! // Layer costs 4, 1, 1, 1, 1 over 2 stages: [4] and [1, 1, 1, 1].
//! assert_eq!(balance(&[4.0, 1.0, 1.0, 1.0, 1.0], 2)?, [0..1, 1..5]);
//! # Ok::<(), brasa_parallel::ParallelError>(())
//! ```

use crate::error::{ParallelError, Result};
use brasa_autograd::{no_grad, Var};
use brasa_nn::{ModuleExt, Sequential};
use brasa_tensor::Tensor;
use std::ops::Range;
use std::time::Instant;

const OP: &str = "Pipeline::new";

/// How a `Sequential` is cut into stages.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Partition {
    /// Stage `i + 1` starts at layer `boundaries[i]` (torch's split points):
    /// `vec![3]` makes two stages, layers `0..3` and `3..len`. Strictly
    /// increasing, each in `1..len`.
    Boundaries(Vec<usize>),
    /// `stages` stages balanced by the bytes of their parameters (layers
    /// without parameters, such as activations, cost nothing and go with
    /// their neighbours).
    ParameterBytes {
        /// How many stages.
        stages: usize,
    },
    /// `stages` stages balanced by each layer's forward time on `sample`
    /// (a batch like the training ones), measured with grad off, the best
    /// of three runs per layer.
    ForwardTime {
        /// How many stages.
        stages: usize,
        /// The input to time the layers with.
        sample: Tensor,
    },
}

impl Partition {
    /// The layer ranges of the stages of `model`.
    pub fn ranges(&self, model: &Sequential) -> Result<Vec<Range<usize>>> {
        let layers = model.len();
        match self {
            Partition::Boundaries(boundaries) => {
                let mut ranges = Vec::with_capacity(boundaries.len() + 1);
                let mut start = 0;
                for &end in boundaries.iter().chain(std::iter::once(&layers)) {
                    if end <= start || end > layers {
                        return Err(ParallelError::invalid(
                            OP,
                            format!(
                                "stage boundaries {boundaries:?} must be strictly increasing and within 1..{layers} \
                                 (the model has {layers} layers; every stage needs at least one)"
                            ),
                        ));
                    }
                    ranges.push(start..end);
                    start = end;
                }
                Ok(ranges)
            }
            Partition::ParameterBytes { stages } => {
                let costs: Vec<f64> = model
                    .iter()
                    .map(|layer| {
                        layer.parameters().iter().map(|p| p.numel() * p.dtype().size_in_bytes()).sum::<usize>()
                    })
                    .map(|bytes| bytes as f64)
                    .collect();
                balance(&costs, *stages)
            }
            Partition::ForwardTime { stages, sample } => balance(&forward_times(model, sample)?, *stages),
        }
    }
}

/// Each layer's forward time on `sample` in seconds (best of three).
fn forward_times(model: &Sequential, sample: &Tensor) -> Result<Vec<f64>> {
    let _no_grad = no_grad();
    let mut x = Var::new(sample.clone());
    let mut times = Vec::with_capacity(model.len());
    for (index, layer) in model.iter().enumerate() {
        let mut best = f64::INFINITY;
        let mut out = None;
        for _ in 0..3 {
            let start = Instant::now();
            let y = layer.forward(&x).map_err(|e| {
                ParallelError::invalid(OP, format!("timing layer {index} ({}) on the sample: {e}", layer.type_name()))
            })?;
            best = best.min(start.elapsed().as_secs_f64());
            out = Some(y);
        }
        times.push(best);
        if let Some(y) = out {
            x = y;
        }
    }
    Ok(times)
}

/// Contiguous ranges of `costs` in `stages` non-empty parts that minimise
/// the largest part's total (ties: the earliest cut), by dynamic
/// programming over the prefix sums.
pub fn balance(costs: &[f64], stages: usize) -> Result<Vec<Range<usize>>> {
    let n = costs.len();
    if stages == 0 || stages > n {
        return Err(ParallelError::invalid(
            OP,
            format!("cannot make {stages} stages of {n} layers (every stage needs at least one layer)"),
        ));
    }
    if let Some(bad) = costs.iter().position(|c| !c.is_finite() || *c < 0.0) {
        return Err(ParallelError::invalid(
            OP,
            format!("layer {bad} has cost {} (must be finite and ≥ 0)", costs[bad]),
        ));
    }
    let prefix: Vec<f64> = std::iter::once(0.0)
        .chain(costs.iter().scan(0.0, |sum, c| {
            *sum += c;
            Some(*sum)
        }))
        .collect();
    let span = |a: usize, b: usize| prefix[b] - prefix[a];
    // best[k][i]: the smallest possible largest part when the first i
    // layers form k parts; cut[k][i]: where the last of those parts starts.
    let mut best = vec![vec![f64::INFINITY; n + 1]; stages + 1];
    let mut cut = vec![vec![0usize; n + 1]; stages + 1];
    best[0][0] = 0.0;
    for k in 1..=stages {
        for i in k..=n {
            for j in (k - 1)..i {
                let value = best[k - 1][j].max(span(j, i));
                if value < best[k][i] {
                    best[k][i] = value;
                    cut[k][i] = j;
                }
            }
        }
    }
    let mut ranges = Vec::with_capacity(stages);
    let mut end = n;
    for k in (1..=stages).rev() {
        let start = cut[k][end];
        ranges.push(start..end);
        end = start;
    }
    ranges.reverse();
    Ok(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balance_minimises_the_largest_stage() {
        assert_eq!(balance(&[1.0; 4], 2).unwrap(), [0..2, 2..4]);
        assert_eq!(balance(&[1.0, 2.0, 3.0, 4.0, 5.0], 3).unwrap(), [0..3, 3..4, 4..5]);
        assert_eq!(balance(&[5.0, 0.0, 5.0, 0.0], 2).unwrap(), [0..1, 1..4]);
        assert_eq!(balance(&[1.0, 1.0, 1.0], 3).unwrap(), [0..1, 1..2, 2..3]);
    }

    #[test]
    fn balance_refuses_impossible_requests() {
        assert!(balance(&[1.0, 1.0], 3).is_err());
        assert!(balance(&[1.0, 1.0], 0).is_err());
        assert!(balance(&[1.0, f64::NAN], 1).is_err());
    }
}
