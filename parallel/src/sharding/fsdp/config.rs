//! How [`FullyShardedDataParallel`](super::FullyShardedDataParallel)
//! gathers, frees, prefetches and reduces.

use brasa_tensor::DType;

/// Mixed precision of a sharded model (PyTorch's `MixedPrecisionPolicy`):
/// the shards stay in their own dtype (the f32 master copy the optimizer
/// updates); gathered parameters are cast to `param_dtype` for forward and
/// backward; gradients are reduced across ranks in `reduce_dtype` and land
/// on the shards in their dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MixedPrecision {
    /// The dtype of gathered parameters, so of forward and backward (bf16).
    pub param_dtype: DType,
    /// The dtype gradients are summed in across ranks (f32).
    pub reduce_dtype: DType,
}

impl MixedPrecision {
    /// Parameters gathered in bf16, gradients reduced in f32.
    pub fn bf16() -> MixedPrecision {
        MixedPrecision { param_dtype: DType::BF16, reduce_dtype: DType::F32 }
    }
}

/// Settings of [`FullyShardedDataParallel`](super::FullyShardedDataParallel),
/// with FSDP's defaults.
#[derive(Clone, Debug)]
pub struct FsdpConfig {
    /// Free each unit's gathered parameters when its forward ends, and
    /// gather them again for its backward (ZeRO-3). On by default. Off:
    /// they stay gathered from forward until the unit's gradients are
    /// complete (fewer all-gathers, ZeRO-2's parameter memory during the
    /// step). The last unit is never freed after forward when a backward
    /// follows: its backward comes first.
    pub reshard_after_forward: bool,
    /// Start the next unit's all-gather while the current unit computes,
    /// in forward (the next unit in order) and in backward (the next one
    /// in the order recorded in the first backward). On by default.
    pub prefetch: bool,
    /// Gathered parameters and gradient reduction in other dtypes.
    /// `None`: everything in the parameters' dtype.
    pub mixed_precision: Option<MixedPrecision>,
    /// Run every unit under an activation checkpoint: its activations are
    /// recomputed in backward, its parameters gathered again for that.
    pub checkpoint: bool,
}

impl Default for FsdpConfig {
    fn default() -> FsdpConfig {
        FsdpConfig { reshard_after_forward: true, prefetch: true, mixed_precision: None, checkpoint: false }
    }
}
