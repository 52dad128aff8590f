//! [`Conv1d`]: 1-d convolution over `[N, C_in, L]` (or unbatched
//! `[C_in, L]`) inputs, PyTorch's `nn.Conv1d` (weight `[out_channels,
//! in_channels / groups, k]`, optional bias), with stride, padding,
//! dilation and groups set through [`Conv1dConfig`].

use crate::error::Result;

use crate::layers::conv_args::{check_input, conv_parameters, ConvArgs};
use crate::module::Module;
use brasa_autograd::Var;
use brasa_tensor::{Conv1dParams, DType, Device};

/// How a [`Conv1d`] is built: stride, padding, dilation, groups, bias and
/// dtype. The default is PyTorch's (stride 1, no padding, dilation 1, one
/// group, with a bias) in f32.
///
/// ```
/// use brasa_nn::Conv1dConfig;
/// use brasa_tensor::DType;
///
/// let config = Conv1dConfig::new().stride(2).padding(1).bias(false).dtype(DType::F64);
/// assert_eq!((config.stride, config.padding, config.bias), (2, 1, false));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv1dConfig {
    /// Step between applications of the kernel.
    pub stride: usize,
    /// Zeros added on each side of the input.
    pub padding: usize,
    /// Spacing between kernel elements.
    pub dilation: usize,
    /// Input and output channels split into this many independent groups.
    pub groups: usize,
    /// Whether the layer adds a learned bias.
    pub bias: bool,
    /// The dtype of the weight and bias.
    pub dtype: DType,
}

impl Default for Conv1dConfig {
    fn default() -> Conv1dConfig {
        Conv1dConfig { stride: 1, padding: 0, dilation: 1, groups: 1, bias: true, dtype: DType::F32 }
    }
}

impl Conv1dConfig {
    /// PyTorch's defaults (see [`Conv1dConfig`]).
    pub fn new() -> Conv1dConfig {
        Conv1dConfig::default()
    }

    /// With this stride.
    pub fn stride(self, stride: usize) -> Conv1dConfig {
        Conv1dConfig { stride, ..self }
    }

    /// With this zero padding on each side.
    pub fn padding(self, padding: usize) -> Conv1dConfig {
        Conv1dConfig { padding, ..self }
    }

    /// With this dilation.
    pub fn dilation(self, dilation: usize) -> Conv1dConfig {
        Conv1dConfig { dilation, ..self }
    }

    /// With this many groups (`in_channels` and `out_channels` must divide by it).
    pub fn groups(self, groups: usize) -> Conv1dConfig {
        Conv1dConfig { groups, ..self }
    }

    /// With or without a bias.
    pub fn bias(self, bias: bool) -> Conv1dConfig {
        Conv1dConfig { bias, ..self }
    }

    /// With parameters in `dtype`.
    pub fn dtype(self, dtype: DType) -> Conv1dConfig {
        Conv1dConfig { dtype, ..self }
    }

    /// The stride, padding, dilation and groups as the op takes them.
    pub fn params(&self) -> Conv1dParams {
        Conv1dParams { stride: self.stride, padding: self.padding, dilation: self.dilation, groups: self.groups }
    }
}

/// A 1-d convolution layer, PyTorch's `nn.Conv1d`: parameters `weight`
/// (`[out_channels, in_channels / groups, k]`) and `bias`
/// (`[out_channels]`, optional), initialised as PyTorch does — the weight
/// from `kaiming_uniform(a = √5)`, i.e. `U(±1/√fan_in)`, and the bias from
/// `U(±1/√fan_in)`, with `fan_in = in_channels / groups · k` — from the
/// seeded generator.
///
/// ```
/// use brasa_nn::{Conv1d, Conv1dConfig, Module};
/// use brasa_autograd::Var;
/// use brasa_tensor::{DType, Device, Tensor};
///
/// let conv = Conv1d::with_config(4, 8, 3, Conv1dConfig::new().padding(1).stride(2), Device::CPU)?;
/// assert_eq!(conv.weight.dims(), &[8, 4, 3]);
/// let y = conv.forward(&Var::new(Tensor::zeros([2, 4, 10], DType::F32)?))?;
/// assert_eq!(y.dims(), &[2, 8, 5]);
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
#[derive(crate::Parameters, Debug)]
pub struct Conv1d {
    /// `[out_channels, in_channels / groups, k]`.
    pub weight: Var,
    /// `[out_channels]`, if the layer has a bias.
    pub bias: Option<Var>,
    /// Stride, padding, dilation and groups.
    pub params: Conv1dParams,
}

impl Conv1d {
    /// An f32 layer with a bias, stride 1 and no padding.
    pub fn new(in_channels: usize, out_channels: usize, kernel: usize, device: Device) -> Result<Conv1d> {
        Conv1d::with_config(in_channels, out_channels, kernel, Conv1dConfig::default(), device)
    }

    /// A layer built as `config` says.
    pub fn with_config(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        config: Conv1dConfig,
        device: Device,
    ) -> Result<Conv1d> {
        let c = config;
        ConvArgs {
            in_channels,
            out_channels,
            kernel: &[kernel],
            stride: &[c.stride],
            dilation: &[c.dilation],
            output_padding: &[],
            groups: c.groups,
            dtype: c.dtype,
        }
        .check("Conv1d")?;
        let shape = [out_channels, in_channels / c.groups, kernel];
        let (weight, bias) = conv_parameters(&shape, out_channels, c.bias, c.dtype, device)?;
        Ok(Conv1d { weight, bias, params: c.params() })
    }

    /// `in_channels`.
    pub fn in_channels(&self) -> usize {
        self.weight.dims()[1] * self.params.groups
    }

    /// `out_channels`.
    pub fn out_channels(&self) -> usize {
        self.weight.dims()[0]
    }

    /// The kernel size.
    pub fn kernel_size(&self) -> usize {
        self.weight.dims()[2]
    }
}

impl Module for Conv1d {
    /// `[N, C_in, L]` to `[N, C_out, L_out]`, with `L_out = (L + 2·padding −
    /// dilation·(k − 1) − 1) / stride + 1`; an unbatched `[C_in, L]` gives
    /// `[C_out, L_out]`.
    fn forward(&self, input: &Var) -> Result<Var> {
        check_input("Conv1d", input.dims(), 1, "L", self.in_channels(), self.weight.dims())?;
        Ok(input.conv1d(&self.weight, self.bias.as_ref(), self.params)?)
    }
}
