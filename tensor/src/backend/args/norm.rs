//! Normalisation operands: the gradients' inputs of layer and batch norm.

use crate::tensor::Tensor;

/// The operands of [`crate::backend::DeviceOps::layer_norm_backward`], all
/// contiguous and of one compute dtype (f32 or f64).
pub(crate) struct LayerNormBackward<'a> {
    /// The output's gradient, `[rows, width]`.
    pub grad: &'a Tensor,
    /// The input, `[rows, width]`.
    pub x: &'a Tensor,
    /// Each row's mean, `[rows]`, as the forward returned it.
    pub mean: &'a Tensor,
    /// Each row's `1/√(var + eps)`, `[rows]`.
    pub rstd: &'a Tensor,
    /// The affine weight, `[width]`, if the forward had one.
    pub weight: Option<&'a Tensor>,
}

/// The operands of [`crate::backend::DeviceOps::batch_norm_backward_elemt`]:
/// `dy` and `x` contiguous `[N, C, S]` of one float dtype, the rest
/// contiguous `[C]` in its compute dtype (f64 for f64, f32 otherwise).
pub(crate) struct BatchNormBackwardElemt<'a> {
    /// The output's gradient.
    pub dy: &'a Tensor,
    /// The forward's input.
    pub x: &'a Tensor,
    /// Each channel's mean.
    pub mean: &'a Tensor,
    /// `invstd · weight` per channel.
    pub scale: &'a Tensor,
    /// `Σdy / M` per channel (0 with running statistics).
    pub mean_dy: &'a Tensor,
    /// `invstd² · Σdy(x − mean) / M` per channel (0 with running statistics).
    pub k: &'a Tensor,
}
