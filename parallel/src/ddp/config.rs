//! How [`DistributedDataParallel`](super::DistributedDataParallel) buckets,
//! checks and compresses.

use super::buckets::{BUCKET_CAP_BYTES, FIRST_BUCKET_BYTES};

/// What goes on the wire for gradient all-reduces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    /// Gradients in their own dtype.
    #[default]
    None,
    /// Divided by the world size, narrowed to bf16, summed, widened back
    /// (PyTorch's `bf16_compress_hook`): half the bytes, about 3 significant
    /// digits per gradient.
    Bf16,
}

/// ZeRO sharding (Rajbhandari et al., SC20) on top of DDP's buckets: each
/// rank owns 1/N of every bucket, padded to a multiple of the world size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroStage {
    /// Stage 1: optimizer state sharded; gradients all-reduced whole.
    One,
    /// Stage 2: optimizer state and gradients sharded; each bucket's
    /// gradients are reduce-scattered to their owners during backward and
    /// the full gradient buffers are released when backward ends.
    Two,
}

/// Settings of [`DistributedDataParallel`](super::DistributedDataParallel),
/// with PyTorch's defaults.
#[derive(Clone, Debug)]
pub struct DdpConfig {
    /// Limit of the first bucket (its all-reduce starts earliest). 1 MiB.
    pub first_bucket_bytes: usize,
    /// Limit of every later bucket (`bucket_cap_mb`). 25 MiB.
    pub bucket_cap_bytes: usize,
    /// Accept parameters that get no gradient in a step (they are found
    /// from the autograd graph after each forward and reduced as they
    /// are). Off: such a parameter is an error naming it.
    pub find_unused_parameters: bool,
    /// Broadcast buffers (batch-norm statistics) from rank 0 before every
    /// forward.
    pub broadcast_buffers: bool,
    /// Rebuild the buckets once, after the first step, from the order
    /// gradients actually became ready (rank 0's order).
    pub rebuild_buckets: bool,
    /// What the all-reduce sends.
    pub compression: Compression,
    /// Shard optimizer state (and gradients) across ranks: parameters move
    /// into flat per-bucket buffers (the module's parameters become views
    /// of them) and a [`ZeroOptimizer`](crate::ZeroOptimizer) updates this
    /// rank's shard. Buckets are not rebuilt when sharding (parameters live
    /// in them). `None`: plain DDP.
    pub zero: Option<ZeroStage>,
}

impl Default for DdpConfig {
    fn default() -> DdpConfig {
        DdpConfig {
            first_bucket_bytes: FIRST_BUCKET_BYTES,
            bucket_cap_bytes: BUCKET_CAP_BYTES,
            find_unused_parameters: false,
            broadcast_buffers: true,
            rebuild_buckets: true,
            compression: Compression::None,
            zero: None,
        }
    }
}
