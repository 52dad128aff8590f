//! What the last step (forward and backward) of a sharded model moved, how
//! much of it overlapped computation, and how the backward order behaved.

use std::time::Duration;

/// The last finished step of a
/// [`FullyShardedDataParallel`](super::FullyShardedDataParallel): from the
/// first forward after the previous backward to the end of this backward.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FsdpStats {
    /// All-gathers of parameters (forward and backward).
    pub all_gathers: usize,
    /// Bytes those all-gathers produced (every rank's shards).
    pub all_gather_bytes: usize,
    /// Of those, bytes gathered ahead of use (prefetched while another unit
    /// computed).
    pub prefetched_bytes: usize,
    /// Reduce-scatters of gradients.
    pub reduce_scatters: usize,
    /// Bytes those reduce-scatters read (every rank's gradients).
    pub reduce_scatter_bytes: usize,
    /// Of those, bytes whose reduce-scatter started while backward still
    /// had another unit's gradients to compute.
    pub overlapped_reduce_bytes: usize,
    /// Time computation stood waiting for collectives.
    pub waited: Duration,
    /// Backward passes whose order of units differed from the order
    /// recorded in the first one (the prefetch then follows the new order).
    pub order_changes: usize,
    /// The last such change, in words.
    pub last_order_change: Option<String>,
}

impl FsdpStats {
    /// The share of all-gather and reduce-scatter bytes that overlapped
    /// computation (0 when nothing moved).
    pub fn overlap(&self) -> f64 {
        let total = self.all_gather_bytes + self.reduce_scatter_bytes;
        if total == 0 {
            0.0
        } else {
            (self.prefetched_bytes + self.overlapped_reduce_bytes) as f64 / total as f64
        }
    }
}
