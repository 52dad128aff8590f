//! [`ConvTranspose2d`]: 2-d transposed convolution over `[N, C_in, H, W]`
//! (or unbatched `[C_in, H, W]`) inputs, PyTorch's `nn.ConvTranspose2d`
//! (weight `[in_channels, out_channels / groups, kH, kW]`, optional bias),
//! with stride, padding, output padding, dilation and groups set through
//! [`ConvTranspose2dConfig`].

use crate::error::Result;

use crate::layers::conv_args::{check_input, conv_parameters, ConvArgs};
use crate::layers::pair::IntoPair;
use crate::module::Module;
use brasa_autograd::Var;
use brasa_tensor::{ConvTranspose2dParams, DType, Device};

/// How a [`ConvTranspose2d`] is built: stride, padding, output padding,
/// dilation, groups, bias and dtype. The default is PyTorch's (stride 1, no
/// padding or output padding, dilation 1, one group, with a bias) in f32;
/// the builder methods take one size for both dims or a `(height, width)`
/// pair.
///
/// ```
/// use brasa_nn::ConvTranspose2dConfig;
///
/// let config = ConvTranspose2dConfig::new().stride(2).padding(1).output_padding((1, 0));
/// assert_eq!((config.stride, config.padding, config.output_padding), ((2, 2), (1, 1), (1, 0)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvTranspose2dConfig {
    /// Step between the input pixels' placements in the output, (height, width).
    pub stride: (usize, usize),
    /// Rows and columns trimmed from each side of the output, (height, width).
    pub padding: (usize, usize),
    /// Rows and columns added to the bottom and right of the output
    /// (smaller than the stride or the dilation), (height, width).
    pub output_padding: (usize, usize),
    /// Spacing between kernel elements, (height, width).
    pub dilation: (usize, usize),
    /// Input and output channels split into this many independent groups.
    pub groups: usize,
    /// Whether the layer adds a learned bias.
    pub bias: bool,
    /// The dtype of the weight and bias.
    pub dtype: DType,
}

impl Default for ConvTranspose2dConfig {
    fn default() -> ConvTranspose2dConfig {
        ConvTranspose2dConfig {
            stride: (1, 1),
            padding: (0, 0),
            output_padding: (0, 0),
            dilation: (1, 1),
            groups: 1,
            bias: true,
            dtype: DType::F32,
        }
    }
}

impl ConvTranspose2dConfig {
    /// PyTorch's defaults (see [`ConvTranspose2dConfig`]).
    pub fn new() -> ConvTranspose2dConfig {
        ConvTranspose2dConfig::default()
    }

    /// With this stride (`2` or `(2, 1)`).
    pub fn stride(self, stride: impl IntoPair) -> ConvTranspose2dConfig {
        ConvTranspose2dConfig { stride: stride.into_pair(), ..self }
    }

    /// With this padding (`1` or `(1, 2)`).
    pub fn padding(self, padding: impl IntoPair) -> ConvTranspose2dConfig {
        ConvTranspose2dConfig { padding: padding.into_pair(), ..self }
    }

    /// With this output padding (`1` or `(1, 0)`).
    pub fn output_padding(self, output_padding: impl IntoPair) -> ConvTranspose2dConfig {
        ConvTranspose2dConfig { output_padding: output_padding.into_pair(), ..self }
    }

    /// With this dilation (`2` or `(2, 1)`).
    pub fn dilation(self, dilation: impl IntoPair) -> ConvTranspose2dConfig {
        ConvTranspose2dConfig { dilation: dilation.into_pair(), ..self }
    }

    /// With this many groups (`in_channels` and `out_channels` must divide by it).
    pub fn groups(self, groups: usize) -> ConvTranspose2dConfig {
        ConvTranspose2dConfig { groups, ..self }
    }

    /// With or without a bias.
    pub fn bias(self, bias: bool) -> ConvTranspose2dConfig {
        ConvTranspose2dConfig { bias, ..self }
    }

    /// With parameters in `dtype`.
    pub fn dtype(self, dtype: DType) -> ConvTranspose2dConfig {
        ConvTranspose2dConfig { dtype, ..self }
    }

    /// The stride, padding, output padding, dilation and groups as the op
    /// takes them.
    pub fn params(&self) -> ConvTranspose2dParams {
        ConvTranspose2dParams {
            stride: self.stride,
            padding: self.padding,
            output_padding: self.output_padding,
            dilation: self.dilation,
            groups: self.groups,
        }
    }
}

/// A 2-d transposed convolution layer, PyTorch's `nn.ConvTranspose2d`:
/// parameters `weight` (`[in_channels, out_channels / groups, kH, kW]`)
/// and `bias` (`[out_channels]`, optional), initialised as PyTorch does —
/// the weight from `kaiming_uniform(a = √5)`, i.e. `U(±1/√fan_in)`, and the
/// bias from `U(±1/√fan_in)`, where PyTorch's `fan_in` is computed from the
/// weight's second dim: `out_channels / groups · kH · kW` — from the seeded
/// generator.
///
/// ```
/// use brasa_nn::{ConvTranspose2d, ConvTranspose2dConfig, Module};
/// use brasa_autograd::Var;
/// use brasa_tensor::{DType, Device, Tensor};
///
/// // The usual 2x upsampling: stride 2, padding 1, output padding 1.
/// let config = ConvTranspose2dConfig::new().stride(2).padding(1).output_padding(1);
/// let up = ConvTranspose2d::with_config(16, 8, 3, config, Device::CPU)?;
/// assert_eq!(up.weight.dims(), &[16, 8, 3, 3]);
/// let y = up.forward(&Var::new(Tensor::zeros([2, 16, 7, 7], DType::F32)?))?;
/// assert_eq!(y.dims(), &[2, 8, 14, 14]);
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
#[derive(crate::Parameters, Debug)]
pub struct ConvTranspose2d {
    /// `[in_channels, out_channels / groups, kH, kW]`.
    pub weight: Var,
    /// `[out_channels]`, if the layer has a bias.
    pub bias: Option<Var>,
    /// Stride, padding, output padding, dilation and groups.
    pub params: ConvTranspose2dParams,
}

impl ConvTranspose2d {
    /// An f32 layer with a bias, stride 1 and no padding; `kernel` is one
    /// size (`3`) or `(kH, kW)`.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: impl IntoPair,
        device: Device,
    ) -> Result<ConvTranspose2d> {
        ConvTranspose2d::with_config(in_channels, out_channels, kernel, ConvTranspose2dConfig::default(), device)
    }

    /// A layer built as `config` says.
    pub fn with_config(
        in_channels: usize,
        out_channels: usize,
        kernel: impl IntoPair,
        config: ConvTranspose2dConfig,
        device: Device,
    ) -> Result<ConvTranspose2d> {
        let (kh, kw) = kernel.into_pair();
        let c = config;
        ConvArgs {
            in_channels,
            out_channels,
            kernel: &[kh, kw],
            stride: &[c.stride.0, c.stride.1],
            dilation: &[c.dilation.0, c.dilation.1],
            output_padding: &[c.output_padding.0, c.output_padding.1],
            groups: c.groups,
            dtype: c.dtype,
        }
        .check("ConvTranspose2d")?;
        let shape = [in_channels, out_channels / c.groups, kh, kw];
        let (weight, bias) = conv_parameters(&shape, out_channels, c.bias, c.dtype, device)?;
        Ok(ConvTranspose2d { weight, bias, params: c.params() })
    }

    /// `in_channels`.
    pub fn in_channels(&self) -> usize {
        self.weight.dims()[0]
    }

    /// `out_channels`.
    pub fn out_channels(&self) -> usize {
        self.weight.dims()[1] * self.params.groups
    }

    /// The kernel size `(kH, kW)`.
    pub fn kernel_size(&self) -> (usize, usize) {
        (self.weight.dims()[2], self.weight.dims()[3])
    }
}

impl Module for ConvTranspose2d {
    /// `[N, C_in, H, W]` to `[N, C_out, H_out, W_out]`, with `H_out = (H −
    /// 1)·stride − 2·padding + dilation·(kH − 1) + output_padding + 1`; an
    /// unbatched `[C_in, H, W]` gives `[C_out, H_out, W_out]`.
    fn forward(&self, input: &Var) -> Result<Var> {
        check_input("ConvTranspose2d", input.dims(), 2, "H, W", self.in_channels(), self.weight.dims())?;
        Ok(input.conv_transpose2d(&self.weight, self.bias.as_ref(), self.params)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brasa_tensor::Tensor;

    #[test]
    fn unbatched_input_and_groups() -> Result<()> {
        let config = ConvTranspose2dConfig::new().groups(2).stride((2, 1)).padding((1, 0));
        let conv = ConvTranspose2d::with_config(4, 6, (3, 1), config, Device::CPU)?;
        assert_eq!(conv.weight.dims(), &[4, 3, 3, 1]);
        assert_eq!((conv.in_channels(), conv.out_channels(), conv.kernel_size()), (4, 6, (3, 1)));
        // H: (5-1)*2 - 2 + 2 + 1 = 9; W: 7 - 1 + 0 + 1 = 7.
        let y = conv.forward(&Var::new(Tensor::zeros([4, 5, 7], DType::F32)?))?;
        assert_eq!(y.dims(), &[6, 9, 7]);
        Ok(())
    }
}
