//! [`ConvTranspose1d`]: 1-d transposed convolution over `[N, C_in, L]`
//! (or unbatched `[C_in, L]`) inputs, PyTorch's `nn.ConvTranspose1d`
//! (weight `[in_channels, out_channels / groups, k]`, optional bias), with
//! stride, padding, output padding, dilation and groups set through
//! [`ConvTranspose1dConfig`].

use crate::error::Result;

use crate::layers::conv_args::{check_input, conv_parameters, ConvArgs};
use crate::module::Module;
use brasa_autograd::Var;
use brasa_tensor::{ConvTranspose1dParams, DType, Device};

/// How a [`ConvTranspose1d`] is built: stride, padding, output padding,
/// dilation, groups, bias and dtype. The default is PyTorch's (stride 1, no
/// padding or output padding, dilation 1, one group, with a bias) in f32.
///
/// ```
/// use brasa_nn::ConvTranspose1dConfig;
///
/// let config = ConvTranspose1dConfig::new().stride(2).output_padding(1);
/// assert_eq!((config.stride, config.output_padding, config.bias), (2, 1, true));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvTranspose1dConfig {
    /// Step between the input elements' placements in the output.
    pub stride: usize,
    /// Elements trimmed from each end of the output.
    pub padding: usize,
    /// Elements added at the end of the output (smaller than the stride or
    /// the dilation).
    pub output_padding: usize,
    /// Spacing between kernel elements.
    pub dilation: usize,
    /// Input and output channels split into this many independent groups.
    pub groups: usize,
    /// Whether the layer adds a learned bias.
    pub bias: bool,
    /// The dtype of the weight and bias.
    pub dtype: DType,
}

impl Default for ConvTranspose1dConfig {
    fn default() -> ConvTranspose1dConfig {
        ConvTranspose1dConfig {
            stride: 1,
            padding: 0,
            output_padding: 0,
            dilation: 1,
            groups: 1,
            bias: true,
            dtype: DType::F32,
        }
    }
}

impl ConvTranspose1dConfig {
    /// PyTorch's defaults (see [`ConvTranspose1dConfig`]).
    pub fn new() -> ConvTranspose1dConfig {
        ConvTranspose1dConfig::default()
    }

    /// With this stride.
    pub fn stride(self, stride: usize) -> ConvTranspose1dConfig {
        ConvTranspose1dConfig { stride, ..self }
    }

    /// With this padding.
    pub fn padding(self, padding: usize) -> ConvTranspose1dConfig {
        ConvTranspose1dConfig { padding, ..self }
    }

    /// With this output padding.
    pub fn output_padding(self, output_padding: usize) -> ConvTranspose1dConfig {
        ConvTranspose1dConfig { output_padding, ..self }
    }

    /// With this dilation.
    pub fn dilation(self, dilation: usize) -> ConvTranspose1dConfig {
        ConvTranspose1dConfig { dilation, ..self }
    }

    /// With this many groups (`in_channels` and `out_channels` must divide by it).
    pub fn groups(self, groups: usize) -> ConvTranspose1dConfig {
        ConvTranspose1dConfig { groups, ..self }
    }

    /// With or without a bias.
    pub fn bias(self, bias: bool) -> ConvTranspose1dConfig {
        ConvTranspose1dConfig { bias, ..self }
    }

    /// With parameters in `dtype`.
    pub fn dtype(self, dtype: DType) -> ConvTranspose1dConfig {
        ConvTranspose1dConfig { dtype, ..self }
    }

    /// The stride, padding, output padding, dilation and groups as the op
    /// takes them.
    pub fn params(&self) -> ConvTranspose1dParams {
        ConvTranspose1dParams {
            stride: self.stride,
            padding: self.padding,
            output_padding: self.output_padding,
            dilation: self.dilation,
            groups: self.groups,
        }
    }
}

/// A 1-d transposed convolution layer, PyTorch's `nn.ConvTranspose1d`:
/// parameters `weight` (`[in_channels, out_channels / groups, k]`) and
/// `bias` (`[out_channels]`, optional), initialised as PyTorch does — the
/// weight from `kaiming_uniform(a = √5)`, i.e. `U(±1/√fan_in)`, and the
/// bias from `U(±1/√fan_in)`, with PyTorch's `fan_in` from the weight's
/// second dim: `out_channels / groups · k` — from the seeded generator.
///
/// ```
/// use brasa_nn::{ConvTranspose1d, ConvTranspose1dConfig, Module};
/// use brasa_autograd::Var;
/// use brasa_tensor::{DType, Device, Tensor};
///
/// let config = ConvTranspose1dConfig::new().stride(2).padding(1).output_padding(1);
/// let up = ConvTranspose1d::with_config(8, 4, 3, config, Device::CPU)?;
/// assert_eq!(up.weight.dims(), &[8, 4, 3]);
/// let y = up.forward(&Var::new(Tensor::zeros([2, 8, 10], DType::F32)?))?;
/// assert_eq!(y.dims(), &[2, 4, 20]);
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
#[derive(crate::Parameters, Debug)]
pub struct ConvTranspose1d {
    /// `[in_channels, out_channels / groups, k]`.
    pub weight: Var,
    /// `[out_channels]`, if the layer has a bias.
    pub bias: Option<Var>,
    /// Stride, padding, output padding, dilation and groups.
    pub params: ConvTranspose1dParams,
}

impl ConvTranspose1d {
    /// An f32 layer with a bias, stride 1 and no padding.
    pub fn new(in_channels: usize, out_channels: usize, kernel: usize, device: Device) -> Result<ConvTranspose1d> {
        ConvTranspose1d::with_config(in_channels, out_channels, kernel, ConvTranspose1dConfig::default(), device)
    }

    /// A layer built as `config` says.
    pub fn with_config(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        config: ConvTranspose1dConfig,
        device: Device,
    ) -> Result<ConvTranspose1d> {
        let c = config;
        ConvArgs {
            in_channels,
            out_channels,
            kernel: &[kernel],
            stride: &[c.stride],
            dilation: &[c.dilation],
            output_padding: &[c.output_padding],
            groups: c.groups,
            dtype: c.dtype,
        }
        .check("ConvTranspose1d")?;
        let shape = [in_channels, out_channels / c.groups, kernel];
        let (weight, bias) = conv_parameters(&shape, out_channels, c.bias, c.dtype, device)?;
        Ok(ConvTranspose1d { weight, bias, params: c.params() })
    }

    /// `in_channels`.
    pub fn in_channels(&self) -> usize {
        self.weight.dims()[0]
    }

    /// `out_channels`.
    pub fn out_channels(&self) -> usize {
        self.weight.dims()[1] * self.params.groups
    }

    /// The kernel size.
    pub fn kernel_size(&self) -> usize {
        self.weight.dims()[2]
    }
}

impl Module for ConvTranspose1d {
    /// `[N, C_in, L]` to `[N, C_out, L_out]`, with `L_out = (L − 1)·stride −
    /// 2·padding + dilation·(k − 1) + output_padding + 1`; an unbatched
    /// `[C_in, L]` gives `[C_out, L_out]`.
    fn forward(&self, input: &Var) -> Result<Var> {
        check_input("ConvTranspose1d", input.dims(), 1, "L", self.in_channels(), self.weight.dims())?;
        Ok(input.conv_transpose1d(&self.weight, self.bias.as_ref(), self.params)?)
    }
}
