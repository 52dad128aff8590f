//! [`GroupNorm`]: normalisation over groups of channels of each sample,
//! PyTorch's `nn.GroupNorm` (parameters `weight`, ones, and `bias`, zeros,
//! of shape `[num_channels]`, when affine). The arithmetic is
//! [`crate::functional::group_norm`].

use crate::error::{NnError, Result};
use crate::flags::KeepFloat32;
use crate::functional;
use crate::module::Module;
use brasa_autograd::Var;
use brasa_tensor::{DType, Device, Tensor};

/// How a [`GroupNorm`] is built; the default is PyTorch's (`eps` 1e-5, a
/// per-channel affine transform) in f32.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GroupNormConfig {
    /// Added to the variance before its square root.
    pub eps: f64,
    /// Whether the layer has a learned per-channel `weight` and `bias`.
    pub affine: bool,
    /// The dtype of the parameters.
    pub dtype: DType,
}

impl Default for GroupNormConfig {
    fn default() -> GroupNormConfig {
        GroupNormConfig { eps: 1e-5, affine: true, dtype: DType::F32 }
    }
}

impl GroupNormConfig {
    /// PyTorch's defaults (see [`GroupNormConfig`]).
    pub fn new() -> GroupNormConfig {
        GroupNormConfig::default()
    }

    /// With this `eps`.
    pub fn eps(self, eps: f64) -> GroupNormConfig {
        GroupNormConfig { eps, ..self }
    }

    /// With or without `weight` and `bias`.
    pub fn affine(self, affine: bool) -> GroupNormConfig {
        GroupNormConfig { affine, ..self }
    }

    /// With parameters in `dtype`.
    pub fn dtype(self, dtype: DType) -> GroupNormConfig {
        GroupNormConfig { dtype, ..self }
    }
}

/// Group normalisation of `[N, C, *]` inputs: the `C` channels are split
/// into `num_groups` groups of consecutive channels, each sample's group is
/// normalised by its mean and biased variance, then each channel is scaled
/// by `weight` and shifted by `bias`. Unlike batch norm it has no running
/// statistics and behaves the same in training and evaluation.
///
/// ```
/// use brasa_nn::{GroupNorm, Module, ModuleExt};
/// use brasa_autograd::Var;
/// use brasa_tensor::{DType, Device, Tensor};
///
/// let norm = GroupNorm::new(4, 32, Device::CPU)?;
/// let y = norm.forward(&Var::new(Tensor::randn([2, 32, 8, 8], DType::F32)?))?;
/// assert_eq!(y.dims(), &[2, 32, 8, 8]);
/// assert_eq!(norm.num_parameters(), 64);
/// assert!(GroupNorm::new(5, 32, Device::CPU).is_err()); // 32 channels, 5 groups
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
#[derive(crate::Parameters, Debug)]
pub struct GroupNorm {
    /// `[num_channels]`, ones at first (if affine).
    pub weight: Option<Var>,
    /// `[num_channels]`, zeros at first (if affine).
    pub bias: Option<Var>,
    /// Parameters and arithmetic stay in f32 under mixed precision.
    keep_float32: KeepFloat32,
    #[module(skip)]
    num_groups: usize,
    #[module(skip)]
    num_channels: usize,
    #[module(skip)]
    eps: f64,
}

impl GroupNorm {
    /// `num_groups` groups over `num_channels` channels (divisible by it)
    /// with PyTorch's defaults, in f32.
    pub fn new(num_groups: usize, num_channels: usize, device: Device) -> Result<GroupNorm> {
        GroupNorm::with_config(num_groups, num_channels, GroupNormConfig::default(), device)
    }

    /// A layer built as `config` says.
    pub fn with_config(
        num_groups: usize,
        num_channels: usize,
        config: GroupNormConfig,
        device: Device,
    ) -> Result<GroupNorm> {
        if num_groups == 0 || !num_channels.is_multiple_of(num_groups) {
            return Err(NnError::invalid(
                "GroupNorm",
                format!("num_channels ({num_channels}) must be divisible by num_groups ({num_groups})"),
            ));
        }
        if !config.eps.is_finite() || config.eps < 0.0 {
            return Err(NnError::invalid(
                "GroupNorm",
                format!("eps must be finite and non-negative, got {}", config.eps),
            ));
        }
        if !config.dtype.is_float() {
            return Err(NnError::invalid(
                "GroupNorm",
                format!("parameters must be floating point, got {}", config.dtype),
            ));
        }
        let (weight, bias) = if config.affine {
            (
                Some(Var::param(Tensor::ones_on([num_channels], config.dtype, device)?)?),
                Some(Var::param(Tensor::zeros_on([num_channels], config.dtype, device)?)?),
            )
        } else {
            (None, None)
        };
        Ok(GroupNorm { weight, bias, keep_float32: KeepFloat32, num_groups, num_channels, eps: config.eps })
    }

    /// The number of groups.
    pub fn num_groups(&self) -> usize {
        self.num_groups
    }

    /// The number of channels.
    pub fn num_channels(&self) -> usize {
        self.num_channels
    }

    /// `eps`.
    pub fn eps(&self) -> f64 {
        self.eps
    }
}

impl Module for GroupNorm {
    fn forward(&self, input: &Var) -> Result<Var> {
        let dims = input.dims();
        if dims.len() < 2 || dims[1] != self.num_channels {
            return Err(NnError::invalid(
                "GroupNorm",
                format!("expected an input of shape [N, {}, ...], got shape {dims:?}", self.num_channels),
            ));
        }
        functional::group_norm(input, self.num_groups, self.weight.as_ref(), self.bias.as_ref(), self.eps)
    }
}
