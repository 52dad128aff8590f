//! [`Conv2d`]: 2-d convolution over `[N, C_in, H, W]` (or unbatched
//! `[C_in, H, W]`) inputs, PyTorch's `nn.Conv2d` (weight
//! `[out_channels, in_channels / groups, kH, kW]`, optional bias), with
//! stride, padding, dilation and groups set through [`Conv2dConfig`].

use crate::error::{NnError, Result};

use crate::layers::conv_args::conv_parameters;
use crate::layers::pair::IntoPair;
use crate::module::Module;
use brasa_autograd::Var;
use brasa_tensor::{Conv2dParams, DType, Device};

/// How a [`Conv2d`] is built: stride, padding, dilation, groups, bias and
/// dtype. The default is PyTorch's (stride 1, no padding, dilation 1, one
/// group, with a bias) in f32; the builder methods take one size for both
/// dims or a `(height, width)` pair.
///
/// ```
/// use brasa_nn::Conv2dConfig;
/// use brasa_tensor::DType;
///
/// let config = Conv2dConfig::new().stride(2).padding((1, 2)).bias(false).dtype(DType::F64);
/// assert_eq!((config.stride, config.padding, config.bias), ((2, 2), (1, 2), false));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dConfig {
    /// Step between applications of the kernel, (height, width).
    pub stride: (usize, usize),
    /// Zeros added on each side of the input, (height, width).
    pub padding: (usize, usize),
    /// Spacing between kernel elements, (height, width).
    pub dilation: (usize, usize),
    /// Input and output channels split into this many independent groups.
    pub groups: usize,
    /// Whether the layer adds a learned bias.
    pub bias: bool,
    /// The dtype of the weight and bias.
    pub dtype: DType,
}

impl Default for Conv2dConfig {
    fn default() -> Conv2dConfig {
        Conv2dConfig { stride: (1, 1), padding: (0, 0), dilation: (1, 1), groups: 1, bias: true, dtype: DType::F32 }
    }
}

impl Conv2dConfig {
    /// PyTorch's defaults (see [`Conv2dConfig`]).
    pub fn new() -> Conv2dConfig {
        Conv2dConfig::default()
    }

    /// With this stride (`2` or `(2, 1)`).
    pub fn stride(self, stride: impl IntoPair) -> Conv2dConfig {
        Conv2dConfig { stride: stride.into_pair(), ..self }
    }

    /// With this zero padding on each side (`1` or `(1, 2)`).
    pub fn padding(self, padding: impl IntoPair) -> Conv2dConfig {
        Conv2dConfig { padding: padding.into_pair(), ..self }
    }

    /// With this dilation (`2` or `(2, 1)`).
    pub fn dilation(self, dilation: impl IntoPair) -> Conv2dConfig {
        Conv2dConfig { dilation: dilation.into_pair(), ..self }
    }

    /// With this many groups (`in_channels` and `out_channels` must divide by it).
    pub fn groups(self, groups: usize) -> Conv2dConfig {
        Conv2dConfig { groups, ..self }
    }

    /// With or without a bias.
    pub fn bias(self, bias: bool) -> Conv2dConfig {
        Conv2dConfig { bias, ..self }
    }

    /// With parameters in `dtype`.
    pub fn dtype(self, dtype: DType) -> Conv2dConfig {
        Conv2dConfig { dtype, ..self }
    }

    /// The stride, padding, dilation and groups as the convolution op takes them.
    pub fn params(&self) -> Conv2dParams {
        Conv2dParams { stride: self.stride, padding: self.padding, dilation: self.dilation, groups: self.groups }
    }
}

/// A 2-d convolution layer, PyTorch's `nn.Conv2d`: parameters `weight`
/// (`[out_channels, in_channels / groups, kH, kW]`) and `bias`
/// (`[out_channels]`, optional), initialised as PyTorch does — the weight
/// from `kaiming_uniform(a = √5)`, i.e. `U(±1/√fan_in)`, and the bias from
/// `U(±1/√fan_in)`, with `fan_in = in_channels / groups · kH · kW` — from
/// the seeded generator.
///
/// ```
/// use brasa_nn::{Conv2d, Conv2dConfig, Module};
/// use brasa_autograd::Var;
/// use brasa_tensor::{DType, Device, Tensor};
///
/// let conv = Conv2d::with_config(3, 16, 3, Conv2dConfig::new().padding(1).stride(2), Device::CPU)?;
/// assert_eq!(conv.weight.dims(), &[16, 3, 3, 3]);
/// let y = conv.forward(&Var::new(Tensor::zeros([8, 3, 32, 32], DType::F32)?))?;
/// assert_eq!(y.dims(), &[8, 16, 16, 16]);
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
#[derive(crate::Parameters, Debug)]
pub struct Conv2d {
    /// `[out_channels, in_channels / groups, kH, kW]`.
    pub weight: Var,
    /// `[out_channels]`, if the layer has a bias.
    pub bias: Option<Var>,
    /// Stride, padding, dilation and groups.
    pub params: Conv2dParams,
    #[module(skip)]
    in_channels: usize,
}

impl Conv2d {
    /// An f32 layer with a bias, stride 1 and no padding; `kernel` is one
    /// size (`3`) or `(kH, kW)`.
    pub fn new(in_channels: usize, out_channels: usize, kernel: impl IntoPair, device: Device) -> Result<Conv2d> {
        Conv2d::with_config(in_channels, out_channels, kernel, Conv2dConfig::default(), device)
    }

    /// A layer built as `config` says.
    pub fn with_config(
        in_channels: usize,
        out_channels: usize,
        kernel: impl IntoPair,
        config: Conv2dConfig,
        device: Device,
    ) -> Result<Conv2d> {
        let (kh, kw) = kernel.into_pair();
        let groups = config.groups;
        if in_channels == 0 || out_channels == 0 {
            return Err(NnError::invalid(
                "Conv2d",
                format!("in_channels and out_channels must be positive, got {in_channels} and {out_channels}"),
            ));
        }
        if kh == 0 || kw == 0 {
            return Err(NnError::invalid("Conv2d", format!("kernel size must be positive, got ({kh}, {kw})")));
        }
        let (stride, dilation) = (config.stride, config.dilation);
        if stride.0 == 0 || stride.1 == 0 || dilation.0 == 0 || dilation.1 == 0 {
            return Err(NnError::invalid(
                "Conv2d",
                format!("stride and dilation must be positive, got stride {stride:?} and dilation {dilation:?}"),
            ));
        }
        if groups == 0 || !in_channels.is_multiple_of(groups) || !out_channels.is_multiple_of(groups) {
            return Err(NnError::invalid(
                "Conv2d",
                format!(
                    "in_channels ({in_channels}) and out_channels ({out_channels}) must both be divisible by groups ({groups})"
                ),
            ));
        }
        if !config.dtype.is_float() {
            return Err(NnError::invalid("Conv2d", format!("parameters must be floating point, got {}", config.dtype)));
        }
        let shape = [out_channels, in_channels / groups, kh, kw];
        let (weight, bias) = conv_parameters(&shape, out_channels, config.bias, config.dtype, device)?;
        Ok(Conv2d { weight, bias, params: config.params(), in_channels })
    }

    /// `in_channels`.
    pub fn in_channels(&self) -> usize {
        self.in_channels
    }

    /// `out_channels`.
    pub fn out_channels(&self) -> usize {
        self.weight.dims()[0]
    }

    /// The kernel size `(kH, kW)`.
    pub fn kernel_size(&self) -> (usize, usize) {
        (self.weight.dims()[2], self.weight.dims()[3])
    }
}

impl Module for Conv2d {
    /// `[N, C_in, H, W]` to `[N, C_out, H_out, W_out]`; an unbatched
    /// `[C_in, H, W]` gives `[C_out, H_out, W_out]`.
    fn forward(&self, input: &Var) -> Result<Var> {
        let dims = input.dims();
        let channels = match dims.len() {
            3 => dims[0],
            4 => dims[1],
            _ => {
                return Err(NnError::invalid(
                    "Conv2d",
                    format!(
                        "expected an input of shape [N, {c}, H, W] or [{c}, H, W], got {dims:?} (rank {})",
                        dims.len(),
                        c = self.in_channels
                    ),
                ))
            }
        };
        if channels != self.in_channels {
            return Err(NnError::invalid(
                "Conv2d",
                format!(
                    "expected {} input channels, got {channels} in an input of shape {dims:?} (weight {:?})",
                    self.in_channels,
                    self.weight.dims()
                ),
            ));
        }
        if dims.len() == 3 {
            let batched = input.unsqueeze(0usize)?;
            return Ok(batched.conv2d(&self.weight, self.bias.as_ref(), self.params)?.squeeze(0usize)?);
        }
        Ok(input.conv2d(&self.weight, self.bias.as_ref(), self.params)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brasa_tensor::Tensor;

    #[test]
    fn unbatched_input_and_groups() -> Result<()> {
        let conv = Conv2d::with_config(4, 6, (3, 1), Conv2dConfig::new().groups(2).padding((1, 0)), Device::CPU)?;
        assert_eq!(conv.weight.dims(), &[6, 2, 3, 1]);
        assert_eq!(conv.kernel_size(), (3, 1));
        let y = conv.forward(&Var::new(Tensor::zeros([4, 5, 7], DType::F32)?))?;
        assert_eq!(y.dims(), &[6, 5, 7]);
        Ok(())
    }

    #[test]
    fn refuses_bad_configurations() {
        assert!(Conv2d::with_config(3, 4, 3, Conv2dConfig::new().groups(2), Device::CPU).is_err());
        assert!(Conv2d::with_config(4, 4, 3, Conv2dConfig::new().stride(0), Device::CPU).is_err());
        assert!(Conv2d::new(4, 4, (0, 3), Device::CPU).is_err());
        assert!(Conv2d::with_config(4, 4, 3, Conv2dConfig::new().dtype(DType::I64), Device::CPU).is_err());
    }
}
