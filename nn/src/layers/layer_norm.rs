//! [`LayerNorm`]: normalisation over the trailing dims of each sample,
//! PyTorch's `nn.LayerNorm` (parameters `weight`, ones, and `bias`, zeros,
//! of shape `normalized_shape`). The arithmetic is
//! [`crate::functional::layer_norm`].

use crate::error::{NnError, Result};
use crate::flags::KeepFloat32;
use crate::functional;
use crate::module::Module;
use brasa_autograd::Var;
use brasa_tensor::{DType, Device, Shape, Tensor};

/// How a [`LayerNorm`] is built; the default is PyTorch's (`eps` 1e-5, an
/// elementwise affine transform with a bias) in f32.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerNormConfig {
    /// Added to the variance before its square root.
    pub eps: f64,
    /// Whether the layer has a learned `weight` (and `bias`, see below).
    pub elementwise_affine: bool,
    /// Whether an affine layer also has a `bias`.
    pub bias: bool,
    /// The dtype of the parameters.
    pub dtype: DType,
}

impl Default for LayerNormConfig {
    fn default() -> LayerNormConfig {
        LayerNormConfig { eps: 1e-5, elementwise_affine: true, bias: true, dtype: DType::F32 }
    }
}

impl LayerNormConfig {
    /// PyTorch's defaults (see [`LayerNormConfig`]).
    pub fn new() -> LayerNormConfig {
        LayerNormConfig::default()
    }

    /// With this `eps`.
    pub fn eps(self, eps: f64) -> LayerNormConfig {
        LayerNormConfig { eps, ..self }
    }

    /// With or without `weight` and `bias`.
    pub fn elementwise_affine(self, affine: bool) -> LayerNormConfig {
        LayerNormConfig { elementwise_affine: affine, ..self }
    }

    /// With or without `bias` (when affine).
    pub fn bias(self, bias: bool) -> LayerNormConfig {
        LayerNormConfig { bias, ..self }
    }

    /// With parameters in `dtype`.
    pub fn dtype(self, dtype: DType) -> LayerNormConfig {
        LayerNormConfig { dtype, ..self }
    }
}

/// Layer normalisation over the trailing dims `normalized_shape`: each
/// sample is normalised by the mean and biased variance of those dims, then
/// scaled by `weight` and shifted by `bias`.
///
/// ```
/// use brasa_nn::{LayerNorm, Module, ModuleExt};
/// use brasa_autograd::Var;
/// use brasa_tensor::{DType, Device, Tensor};
///
/// let norm = LayerNorm::new([64], Device::CPU)?;
/// let y = norm.forward(&Var::new(Tensor::randn([2, 10, 64], DType::F32)?))?;
/// assert_eq!(y.dims(), &[2, 10, 64]);
/// assert_eq!(norm.num_parameters(), 128);
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
///
/// Cloning gives a handle on the same parameters (a `Var` is shared, not
/// copied).
#[derive(crate::Parameters, Clone, Debug)]
pub struct LayerNorm {
    /// `normalized_shape`, ones at first (if elementwise affine).
    pub weight: Option<Var>,
    /// `normalized_shape`, zeros at first (if elementwise affine with a bias).
    pub bias: Option<Var>,
    /// Parameters and arithmetic stay in f32 under mixed precision.
    keep_float32: KeepFloat32,
    #[module(skip)]
    normalized_shape: Vec<usize>,
    #[module(skip)]
    eps: f64,
}

impl LayerNorm {
    /// A layer over the trailing dims `normalized_shape` (`[512]`,
    /// `[8, 8]`) with PyTorch's defaults, in f32.
    pub fn new(normalized_shape: impl Into<Shape>, device: Device) -> Result<LayerNorm> {
        LayerNorm::with_config(normalized_shape, LayerNormConfig::default(), device)
    }

    /// A layer built as `config` says.
    pub fn with_config(
        normalized_shape: impl Into<Shape>,
        config: LayerNormConfig,
        device: Device,
    ) -> Result<LayerNorm> {
        let normalized_shape = normalized_shape.into().dims().to_vec();
        if normalized_shape.is_empty() || normalized_shape.contains(&0) {
            return Err(NnError::invalid(
                "LayerNorm",
                format!("normalized_shape must be non-empty with positive sizes, got {normalized_shape:?}"),
            ));
        }
        if !config.eps.is_finite() || config.eps < 0.0 {
            return Err(NnError::invalid(
                "LayerNorm",
                format!("eps must be finite and non-negative, got {}", config.eps),
            ));
        }
        if !config.dtype.is_float() {
            return Err(NnError::invalid(
                "LayerNorm",
                format!("parameters must be floating point, got {}", config.dtype),
            ));
        }
        let (weight, bias) = if config.elementwise_affine {
            let weight = Var::param(Tensor::ones_on(normalized_shape.as_slice(), config.dtype, device)?)?;
            let bias = if config.bias {
                Some(Var::param(Tensor::zeros_on(normalized_shape.as_slice(), config.dtype, device)?)?)
            } else {
                None
            };
            (Some(weight), bias)
        } else {
            (None, None)
        };
        Ok(LayerNorm { weight, bias, keep_float32: KeepFloat32, normalized_shape, eps: config.eps })
    }

    /// The normalised trailing dims.
    pub fn normalized_shape(&self) -> &[usize] {
        &self.normalized_shape
    }

    /// `eps`.
    pub fn eps(&self) -> f64 {
        self.eps
    }
}

impl Module for LayerNorm {
    fn forward(&self, input: &Var) -> Result<Var> {
        let (dims, shape) = (input.dims(), self.normalized_shape.as_slice());
        if dims.len() < shape.len() || dims[dims.len() - shape.len()..] != *shape {
            return Err(NnError::invalid(
                "LayerNorm",
                format!("expected an input whose trailing dims are {shape:?}, got shape {dims:?}"),
            ));
        }
        functional::layer_norm(input, shape, self.weight.as_ref(), self.bias.as_ref(), self.eps)
    }
}
