//! What the last synchronised backward did: how much was reduced, how much
//! of it overlapped with backward, and how long the tail wait took.

use std::time::Duration;

/// The last synchronised step of a [`DistributedDataParallel`](super::DistributedDataParallel).
#[derive(Clone, Debug, Default)]
pub struct DdpStats {
    /// Buckets reduced.
    pub buckets: usize,
    /// Gradient bytes all-reduced.
    pub total_bytes: usize,
    /// Of those, bytes whose all-reduce was launched while backward still
    /// had gradients to compute.
    pub overlapped_bytes: usize,
    /// From the first gradient ready to the end of backward's graph.
    pub backward: Duration,
    /// Waiting for the all-reduces after backward's graph ended.
    pub wait_after_backward: Duration,
}

impl DdpStats {
    /// `overlapped_bytes / total_bytes` (0 when nothing was reduced).
    pub fn overlap(&self) -> f64 {
        if self.total_bytes == 0 {
            0.0
        } else {
            self.overlapped_bytes as f64 / self.total_bytes as f64
        }
    }
}
