//! [`BatchNorm1d`] and [`BatchNorm2d`]: batch normalisation over the
//! channel dim, PyTorch's `nn.BatchNorm1d` / `nn.BatchNorm2d` — parameters
//! `weight` (ones) and `bias` (zeros), buffers `running_mean` (zeros),
//! `running_var` (ones) and `num_batches_tracked` (an `i64` scalar), under
//! PyTorch's names, so state dicts move between the two.
//!
//! In training mode a layer normalises with the batch's statistics and
//! updates the running ones in place; in evaluation mode
//! ([`crate::ModuleExt::eval`]) it normalises with the running statistics.
//! The arithmetic is [`crate::functional::batch_norm`].

use crate::error::{NnError, Result};
use crate::flags::{KeepFloat32, Training};
use crate::functional;
use crate::module::Module;
use brasa_autograd::Var;
use brasa_tensor::{DType, Device, Tensor};

/// How a batch-norm layer is built; the default is PyTorch's (`eps` 1e-5,
/// `momentum` 0.1, affine, tracking running statistics) in f32.
///
/// ```
/// use brasa_nn::BatchNormConfig;
/// let config = BatchNormConfig::new().momentum(None).eps(1e-3).affine(false);
/// assert_eq!((config.momentum, config.eps, config.affine, config.track_running_stats), (None, 1e-3, false, true));
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchNormConfig {
    /// Added to the variance before its square root.
    pub eps: f64,
    /// The weight of the batch in the running statistics' update
    /// (`running = (1 - momentum) · running + momentum · batch`); `None`
    /// for a cumulative average over every batch seen (`momentum =
    /// 1 / num_batches_tracked`).
    pub momentum: Option<f64>,
    /// Whether the layer has a learned `weight` and `bias`.
    pub affine: bool,
    /// Whether the layer keeps running statistics (without them it
    /// normalises with the batch's statistics in evaluation mode too).
    pub track_running_stats: bool,
    /// The dtype of the parameters and running statistics.
    pub dtype: DType,
}

impl Default for BatchNormConfig {
    fn default() -> BatchNormConfig {
        BatchNormConfig { eps: 1e-5, momentum: Some(0.1), affine: true, track_running_stats: true, dtype: DType::F32 }
    }
}

impl BatchNormConfig {
    /// PyTorch's defaults (see [`BatchNormConfig`]).
    pub fn new() -> BatchNormConfig {
        BatchNormConfig::default()
    }

    /// With this `eps`.
    pub fn eps(self, eps: f64) -> BatchNormConfig {
        BatchNormConfig { eps, ..self }
    }

    /// With this momentum (`None`: cumulative average).
    pub fn momentum(self, momentum: Option<f64>) -> BatchNormConfig {
        BatchNormConfig { momentum, ..self }
    }

    /// With or without `weight` and `bias`.
    pub fn affine(self, affine: bool) -> BatchNormConfig {
        BatchNormConfig { affine, ..self }
    }

    /// With or without running statistics.
    pub fn track_running_stats(self, track: bool) -> BatchNormConfig {
        BatchNormConfig { track_running_stats: track, ..self }
    }

    /// With parameters and running statistics in `dtype`.
    pub fn dtype(self, dtype: DType) -> BatchNormConfig {
        BatchNormConfig { dtype, ..self }
    }
}

/// The parameters and buffers of a new layer, in PyTorch's initial state.
struct Initial {
    weight: Option<Var>,
    bias: Option<Var>,
    running_mean: Option<Tensor>,
    running_var: Option<Tensor>,
    num_batches_tracked: Option<Tensor>,
}

fn initial(layer: &'static str, num_features: usize, config: &BatchNormConfig, device: Device) -> Result<Initial> {
    if num_features == 0 {
        return Err(NnError::invalid(layer, "num_features must be positive, got 0"));
    }
    if !config.eps.is_finite() || config.eps < 0.0 {
        return Err(NnError::invalid(layer, format!("eps must be finite and non-negative, got {}", config.eps)));
    }
    if let Some(m) = config.momentum {
        if !(0.0..=1.0).contains(&m) {
            return Err(NnError::invalid(layer, format!("momentum must be in [0, 1], got {m}")));
        }
    }
    if !config.dtype.is_float() {
        return Err(NnError::invalid(layer, format!("parameters must be floating point, got {}", config.dtype)));
    }
    let (shape, dtype) = ([num_features], config.dtype);
    let (weight, bias) = if config.affine {
        (
            Some(Var::param(Tensor::ones_on(shape, dtype, device)?)?),
            Some(Var::param(Tensor::zeros_on(shape, dtype, device)?)?),
        )
    } else {
        (None, None)
    };
    let (running_mean, running_var, num_batches_tracked) = if config.track_running_stats {
        (
            Some(Tensor::zeros_on(shape, dtype, device)?),
            Some(Tensor::ones_on(shape, dtype, device)?),
            Some(Tensor::scalar_on(0i64, device)?),
        )
    } else {
        (None, None, None)
    };
    Ok(Initial { weight, bias, running_mean, running_var, num_batches_tracked })
}

/// What [`forward`] needs of a layer.
struct Parts<'a> {
    layer: &'static str,
    /// The accepted input ranks and how to write the expected shape.
    ranks: &'static [usize],
    expected: &'static str,
    num_features: usize,
    config: &'a BatchNormConfig,
    training: bool,
    weight: Option<&'a Var>,
    bias: Option<&'a Var>,
    running_mean: Option<&'a Tensor>,
    running_var: Option<&'a Tensor>,
    num_batches_tracked: Option<&'a Tensor>,
}

fn forward(parts: Parts<'_>, input: &Var) -> Result<Var> {
    let (layer, dims, c) = (parts.layer, input.dims(), parts.num_features);
    if !parts.ranks.contains(&dims.len()) {
        return Err(NnError::invalid(
            layer,
            format!("expected an input of shape {} with C = {c}, got {dims:?} (rank {})", parts.expected, dims.len()),
        ));
    }
    if dims[1] != c {
        return Err(NnError::invalid(
            layer,
            format!("expected {c} channels (dim 1), got {} in an input of shape {dims:?}", dims[1]),
        ));
    }
    let batch_stats = parts.training || parts.running_mean.is_none();
    if batch_stats && input.numel() / c <= 1 {
        return Err(NnError::invalid(
            layer,
            format!("expected more than 1 value per channel when training, got input of shape {dims:?}"),
        ));
    }
    let mut momentum = parts.config.momentum.unwrap_or(0.0);
    if parts.training {
        if let Some(count) = parts.num_batches_tracked {
            let _no_grad = brasa_autograd::no_grad();
            count.add_scalar_(1.0)?;
            if parts.config.momentum.is_none() {
                momentum = 1.0 / count.item::<i64>()? as f64;
            }
        }
    }
    functional::batch_norm(
        input,
        parts.running_mean,
        parts.running_var,
        parts.weight,
        parts.bias,
        batch_stats,
        momentum,
        parts.config.eps,
    )
}

/// Defines a batch-norm layer: the struct, its constructors and `forward`.
macro_rules! batch_norm_layer {
    ($(#[$doc:meta])* $name:ident, ranks: $ranks:expr, expected: $expected:literal) => {
        $(#[$doc])*
        #[derive(crate::Parameters, Debug)]
        pub struct $name {
            /// `[num_features]`, ones at first (if affine).
            pub weight: Option<Var>,
            /// `[num_features]`, zeros at first (if affine).
            pub bias: Option<Var>,
            /// `[num_features]`, zeros at first (if tracking running statistics).
            pub running_mean: Option<Tensor>,
            /// `[num_features]`, ones at first (if tracking running statistics).
            pub running_var: Option<Tensor>,
            /// The number of training batches seen, an `i64` scalar (shape `[]`).
            pub num_batches_tracked: Option<Tensor>,
            training: Training,
            /// Parameters, statistics and arithmetic stay in f32 under mixed precision.
            keep_float32: KeepFloat32,
            #[module(skip)]
            num_features: usize,
            #[module(skip)]
            config: BatchNormConfig,
        }

        impl $name {
            /// A layer with PyTorch's defaults (eps 1e-5, momentum 0.1,
            /// affine, tracking running statistics) in f32, in training mode.
            pub fn new(num_features: usize, device: Device) -> Result<$name> {
                $name::with_config(num_features, BatchNormConfig::default(), device)
            }

            /// A layer built as `config` says.
            pub fn with_config(num_features: usize, config: BatchNormConfig, device: Device) -> Result<$name> {
                let init = initial(stringify!($name), num_features, &config, device)?;
                Ok($name {
                    weight: init.weight,
                    bias: init.bias,
                    running_mean: init.running_mean,
                    running_var: init.running_var,
                    num_batches_tracked: init.num_batches_tracked,
                    training: Training::default(),
                    keep_float32: KeepFloat32,
                    num_features,
                    config,
                })
            }

            /// The number of channels, `C`.
            pub fn num_features(&self) -> usize {
                self.num_features
            }

            /// How the layer was built.
            pub fn config(&self) -> &BatchNormConfig {
                &self.config
            }

            /// Sets the running statistics back to zeros (mean), ones
            /// (variance) and 0 batches, in place.
            pub fn reset_running_stats(&self) -> Result<()> {
                if let (Some(mean), Some(var), Some(count)) =
                    (&self.running_mean, &self.running_var, &self.num_batches_tracked)
                {
                    mean.zero_()?;
                    var.fill_(1.0)?;
                    count.zero_()?;
                }
                Ok(())
            }
        }

        impl Module for $name {
            fn forward(&self, input: &Var) -> Result<Var> {
                let parts = Parts {
                    layer: stringify!($name),
                    ranks: $ranks,
                    expected: $expected,
                    num_features: self.num_features,
                    config: &self.config,
                    training: self.training.get(),
                    weight: self.weight.as_ref(),
                    bias: self.bias.as_ref(),
                    running_mean: self.running_mean.as_ref(),
                    running_var: self.running_var.as_ref(),
                    num_batches_tracked: self.num_batches_tracked.as_ref(),
                };
                forward(parts, input)
            }
        }
    };
}

batch_norm_layer!(
    /// Batch normalisation of `[N, C]` or `[N, C, L]` inputs over every dim
    /// but `C`, PyTorch's `nn.BatchNorm1d` (see the module docs).
    ///
    /// ```
    /// use brasa_nn::{BatchNorm1d, Module, ModuleExt};
    /// use brasa_autograd::Var;
    /// use brasa_tensor::{DType, Device, Tensor};
    ///
    /// let bn = BatchNorm1d::new(3, Device::CPU)?;
    /// let y = bn.forward(&Var::new(Tensor::randn([8, 3], DType::F32)?))?;
    /// assert_eq!(y.dims(), &[8, 3]);
    /// let names: Vec<String> = bn.state_dict().names().map(String::from).collect();
    /// assert_eq!(names, ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]);
    /// # Ok::<(), brasa_nn::NnError>(())
    /// ```
    BatchNorm1d,
    ranks: &[2, 3],
    expected: "[N, C] or [N, C, L]"
);

batch_norm_layer!(
    /// Batch normalisation of `[N, C, H, W]` inputs over every dim but `C`,
    /// PyTorch's `nn.BatchNorm2d` (see the module docs).
    ///
    /// ```
    /// use brasa_nn::{BatchNorm2d, Module, ModuleExt};
    /// use brasa_autograd::Var;
    /// use brasa_tensor::{DType, Device, Tensor};
    ///
    /// let mut bn = BatchNorm2d::new(16, Device::CPU)?;
    /// let x = Var::new(Tensor::randn([4, 16, 8, 8], DType::F32)?);
    /// bn.forward(&x)?;                       // batch statistics; running ones updated
    /// assert_eq!(bn.num_batches_tracked.as_ref().unwrap().item::<i64>()?, 1);
    /// bn.eval();
    /// let y = bn.forward(&x)?;               // running statistics
    /// assert_eq!(y.dims(), &[4, 16, 8, 8]);
    /// # Ok::<(), brasa_nn::NnError>(())
    /// ```
    BatchNorm2d,
    ranks: &[4],
    expected: "[N, C, H, W]"
);
