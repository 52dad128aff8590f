//! The argument checks that the convolution layers share ([`Conv1d`],
//! [`ConvTranspose1d`], [`ConvTranspose2d`]): positive channels, kernel,
//! stride and dilation, groups dividing both channel counts, an output
//! padding below the stride or the dilation (transposed ones), a float
//! dtype; and the input's rank and channel count in `forward`. Each error
//! names the layer and the values given. Also the parameters every
//! convolution layer (`Conv2d` too) initialises the same way.
//!
//! [`Conv1d`]: crate::Conv1d
//! [`ConvTranspose1d`]: crate::ConvTranspose1d
//! [`ConvTranspose2d`]: crate::ConvTranspose2d

use crate::error::{NnError, Result};
use crate::init;
use brasa_autograd::Var;
use brasa_tensor::{DType, Device};

/// A convolution's `weight` of `shape` and optional `bias` of
/// `out_channels`, as PyTorch initialises them: the weight from
/// `kaiming_uniform(a = √5)`, the bias from `U(±1/√fan_in)` with `fan_in`
/// the weight's dim 1 times its kernel (for transposed layers, dim 1 is
/// `out_channels / groups`, as in PyTorch).
pub(crate) fn conv_parameters(
    shape: &[usize],
    out_channels: usize,
    bias: bool,
    dtype: DType,
    device: Device,
) -> Result<(Var, Option<Var>)> {
    let weight = Var::param(init::kaiming_uniform(shape, 5f64.sqrt(), dtype, device)?)?;
    let bias = if bias {
        let (fan_in, _) = init::fans(shape)?;
        let bound = 1.0 / (fan_in as f64).sqrt();
        Some(Var::param(init::uniform(&[out_channels], bound, dtype, device)?)?)
    } else {
        None
    };
    Ok((weight, bias))
}

/// A layer's sizes per spatial dim (one entry for 1-d, two for 2-d).
pub(crate) struct ConvArgs<'a> {
    pub in_channels: usize,
    pub out_channels: usize,
    pub kernel: &'a [usize],
    pub stride: &'a [usize],
    pub dilation: &'a [usize],
    /// Empty for a plain convolution.
    pub output_padding: &'a [usize],
    pub groups: usize,
    pub dtype: DType,
}

impl ConvArgs<'_> {
    /// An error unless the layer `what` can be built from these arguments.
    pub(crate) fn check(&self, what: &'static str) -> Result<()> {
        let (in_channels, out_channels, groups) = (self.in_channels, self.out_channels, self.groups);
        if in_channels == 0 || out_channels == 0 {
            return Err(NnError::invalid(
                what,
                format!("in_channels and out_channels must be positive, got {in_channels} and {out_channels}"),
            ));
        }
        if self.kernel.contains(&0) {
            return Err(NnError::invalid(what, format!("kernel size must be positive, got {:?}", self.kernel)));
        }
        if self.stride.contains(&0) || self.dilation.contains(&0) {
            return Err(NnError::invalid(
                what,
                format!(
                    "stride and dilation must be positive, got stride {:?} and dilation {:?}",
                    self.stride, self.dilation
                ),
            ));
        }
        if groups == 0 || !in_channels.is_multiple_of(groups) || !out_channels.is_multiple_of(groups) {
            return Err(NnError::invalid(
                what,
                format!(
                    "in_channels ({in_channels}) and out_channels ({out_channels}) must both be divisible by groups ({groups})"
                ),
            ));
        }
        let too_big = self
            .output_padding
            .iter()
            .zip(self.stride.iter().zip(self.dilation))
            .any(|(&op, (&s, &d))| op >= s && op >= d);
        if too_big {
            return Err(NnError::invalid(
                what,
                format!(
                    "output_padding {:?} must be smaller than either stride {:?} or dilation {:?} in each dim",
                    self.output_padding, self.stride, self.dilation
                ),
            ));
        }
        if !self.dtype.is_float() {
            return Err(NnError::invalid(what, format!("parameters must be floating point, got {}", self.dtype)));
        }
        Ok(())
    }
}

/// An error unless `dims` is a batched (`spatial + 2` dims) or unbatched
/// (`spatial + 1`) input with `channels` channels; `layout` spells the
/// spatial dims (`"L"`, `"H, W"`) for the message.
pub(crate) fn check_input(
    what: &'static str,
    dims: &[usize],
    spatial: usize,
    layout: &str,
    channels: usize,
    weight: &[usize],
) -> Result<()> {
    let given = if dims.len() == spatial + 2 {
        dims[1]
    } else if dims.len() == spatial + 1 {
        dims[0]
    } else {
        return Err(NnError::invalid(
            what,
            format!(
                "expected an input of shape [N, {channels}, {layout}] or [{channels}, {layout}], got {dims:?} (rank {})",
                dims.len()
            ),
        ));
    };
    if given != channels {
        return Err(NnError::invalid(
            what,
            format!(
                "expected {channels} input channels, got {given} in an input of shape {dims:?} (weight {weight:?})"
            ),
        ));
    }
    Ok(())
}
