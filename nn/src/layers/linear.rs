//! [`Linear`]: `y = x Wᵀ + b`, PyTorch's `nn.Linear` (weight `[out, in]`).

use crate::error::Result;
use crate::init;
use crate::module::Module;
use brasa_autograd::Var;
use brasa_tensor::{DType, Device};

/// A fully connected layer: `y = x Wᵀ + b` over the last dimension.
///
/// ```
/// use brasa_nn::{Linear, Module};
/// use brasa_autograd::Var;
/// use brasa_tensor::{DType, Device, Tensor};
///
/// let fc = Linear::new(784, 10, Device::CPU)?;
/// let y = fc.forward(&Var::new(Tensor::zeros([32, 784], DType::F32)?))?;
/// assert_eq!(y.dims(), &[32, 10]);
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
///
/// Cloning gives a handle on the same parameters (a `Var` is shared, not
/// copied).
#[derive(crate::Parameters, Clone)]
pub struct Linear {
    /// `[out_features, in_features]`.
    pub weight: Var,
    /// `[out_features]`, if the layer has a bias.
    pub bias: Option<Var>,
}

impl Linear {
    /// An f32 layer with a bias, initialised as PyTorch does (weight and bias
    /// from `U(±1/√in_features)`).
    pub fn new(in_features: usize, out_features: usize, device: Device) -> Result<Linear> {
        Linear::with_options(in_features, out_features, true, DType::F32, device)
    }

    /// A layer with or without a bias, in `dtype`.
    pub fn with_options(
        in_features: usize,
        out_features: usize,
        bias: bool,
        dtype: DType,
        device: Device,
    ) -> Result<Linear> {
        let weight = init::kaiming_uniform(&[out_features, in_features], 5f64.sqrt(), dtype, device)?;
        let bias = if bias {
            let bound = 1.0 / (in_features.max(1) as f64).sqrt();
            Some(Var::param(init::uniform(&[out_features], bound, dtype, device)?)?)
        } else {
            None
        };
        Ok(Linear { weight: Var::param(weight)?, bias })
    }

    /// `in_features`.
    pub fn in_features(&self) -> usize {
        self.weight.dims()[1]
    }

    /// `out_features`.
    pub fn out_features(&self) -> usize {
        self.weight.dims()[0]
    }
}

impl Module for Linear {
    fn forward(&self, input: &Var) -> Result<Var> {
        Ok(input.linear(&self.weight, self.bias.as_ref())?)
    }
}
