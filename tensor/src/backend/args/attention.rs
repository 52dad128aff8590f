//! Fused attention's operands, as the devices that have the kernels take them.

use crate::tensor::Tensor;

/// Where a fused attention's dropout decisions come from: the Philox stream
/// `(seed, offset)` it reserved, replayed by the backward.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct DropoutDraws {
    pub keep_prob: f64,
    pub seed: u64,
    pub offset: u64,
}

/// The operands as a backend's fused kernels take them: `q` `[n, h, L, E]`,
/// `k` `[n, h, S, E]`, `v` `[n, h, S, Ev]` views with a contiguous last dim,
/// of one dtype the backend supports, and the mask as an additive
/// `[n, h, L, S]` view (f32, f64 for f64 operands; stride 0 where it
/// broadcasts).
pub(crate) struct AttentionOperands<'a> {
    pub q: &'a Tensor,
    pub k: &'a Tensor,
    pub v: &'a Tensor,
    pub mask: Option<&'a Tensor>,
    pub scale: f64,
    pub causal: bool,
    pub dropout: Option<DropoutDraws>,
}
