//! Activation layers, each wrapping the `Var` op of the same name:
//! [`Relu`], [`Gelu`] (exact, with the normal CDF), [`GeluTanh`] (the tanh
//! approximation, `Gelu::tanh()`), [`Silu`], [`Tanh`], [`Sigmoid`],
//! [`Mish`], [`Selu`], [`Hardswish`], [`Hardsigmoid`], [`LogSigmoid`] (unit
//! structs), and [`Softplus`], [`Elu`], [`Celu`], [`LeakyRelu`] (with their
//! parameter, PyTorch's default from `Default`). PyTorch's `nn.ReLU`,
//! `nn.GELU()`, `nn.GELU('tanh')`, `nn.SiLU`, `nn.Tanh`, `nn.Sigmoid`,
//! `nn.Mish`, `nn.SELU`, `nn.Hardswish`, `nn.Hardsigmoid`, `nn.LogSigmoid`,
//! `nn.Softplus`, `nn.ELU`, `nn.CELU`, `nn.LeakyReLU`.

use crate::error::{NnError, Result};
use crate::module::Module;
use brasa_autograd::Var;

/// Defines a parameterless activation layer.
macro_rules! activation {
    ($(#[$doc:meta])* $name:ident, $op:ident) => {
        $(#[$doc])*
        #[derive(crate::Parameters, Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name;

        impl Module for $name {
            fn forward(&self, input: &Var) -> Result<Var> {
                Ok(input.$op()?)
            }
        }
    };
}

activation!(
    /// `max(x, 0)`.
    ///
    /// ```
    /// use brasa_nn::{Module, Relu};
    /// use brasa_autograd::Var;
    /// use brasa_tensor::Tensor;
    ///
    /// let y = Relu.forward(&Var::new(Tensor::from_vec(vec![-1.0f32, 2.0], [2])?))?;
    /// assert_eq!(y.tensor().to_vec::<f32>()?, [0.0, 2.0]);
    /// # Ok::<(), brasa_nn::NnError>(())
    /// ```
    Relu,
    relu
);
activation!(
    /// `x · Φ(x)` with the exact normal CDF `Φ` (PyTorch's default GELU);
    /// [`Gelu::tanh`] gives the tanh approximation.
    Gelu,
    gelu
);
activation!(
    /// GELU's tanh approximation, `x/2 · (1 + tanh(√(2/π) (x + 0.044715 x³)))`
    /// (PyTorch's `nn.GELU(approximate='tanh')`).
    GeluTanh,
    gelu_tanh
);
activation!(
    /// `x · sigmoid(x)` (also called swish).
    Silu,
    silu
);
activation!(
    /// The hyperbolic tangent.
    Tanh,
    tanh
);
activation!(
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    sigmoid
);

impl Gelu {
    /// The tanh approximation of GELU, a [`GeluTanh`] layer.
    pub fn tanh() -> GeluTanh {
        GeluTanh
    }
}

activation!(
    /// `x · tanh(softplus(x))`.
    Mish,
    mish
);
activation!(
    /// `scale · elu(x, alpha)` with SELU's fixed `alpha ≈ 1.6733` and
    /// `scale ≈ 1.0507`.
    Selu,
    selu
);
activation!(
    /// `x · min(max(x + 3, 0), 6) / 6`.
    Hardswish,
    hardswish
);
activation!(
    /// `min(max(x + 3, 0), 6) / 6`.
    ///
    /// ```
    /// use brasa_nn::{Hardsigmoid, Module};
    /// use brasa_autograd::Var;
    /// use brasa_tensor::Tensor;
    ///
    /// let y = Hardsigmoid.forward(&Var::new(Tensor::from_vec(vec![-4.0f32, 0.0, 4.0], [3])?))?;
    /// assert_eq!(y.tensor().to_vec::<f32>()?, [0.0, 0.5, 1.0]);
    /// # Ok::<(), brasa_nn::NnError>(())
    /// ```
    Hardsigmoid,
    hardsigmoid
);
activation!(
    /// `log(sigmoid(x))`, without overflow.
    LogSigmoid,
    log_sigmoid
);

/// Refuses a NaN or infinite layer parameter.
fn check_finite(what: &'static str, name: &str, value: f64) -> Result<()> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(NnError::invalid(what, format!("{name} must be finite, got {value}")))
    }
}

/// `log(1 + e^(beta·x)) / beta`, and `x` where `beta·x > threshold`
/// (PyTorch's `nn.Softplus`; the default is `beta = 1`, `threshold = 20`).
///
/// ```
/// use brasa_nn::{Module, Softplus};
/// use brasa_autograd::Var;
/// use brasa_tensor::Tensor;
///
/// let layer = Softplus::new(2.0, 10.0)?;
/// let y = layer.forward(&Var::new(Tensor::from_vec(vec![0.0f64, 6.0], [2])?))?.tensor().to_vec::<f64>()?;
/// assert!((y[0] - 2f64.ln() / 2.0).abs() < 1e-15);
/// assert_eq!(y[1], 6.0); // 2 · 6 > 10: linear
/// assert!(Softplus::new(0.0, 20.0).is_err());
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
#[derive(crate::Parameters, Clone, Copy, Debug, PartialEq)]
pub struct Softplus {
    #[module(skip)]
    beta: f64,
    #[module(skip)]
    threshold: f64,
}

impl Softplus {
    /// A layer with this `beta` (finite, non-zero) and `threshold` (not NaN).
    pub fn new(beta: f64, threshold: f64) -> Result<Softplus> {
        check_finite("Softplus", "beta", beta)?;
        if beta == 0.0 {
            return Err(NnError::invalid("Softplus", "beta must be non-zero (the result divides by it), got 0"));
        }
        if threshold.is_nan() {
            return Err(NnError::invalid("Softplus", "threshold must not be NaN"));
        }
        Ok(Softplus { beta, threshold })
    }

    /// `beta`.
    pub fn beta(&self) -> f64 {
        self.beta
    }

    /// `threshold`.
    pub fn threshold(&self) -> f64 {
        self.threshold
    }
}

impl Default for Softplus {
    fn default() -> Softplus {
        Softplus { beta: 1.0, threshold: 20.0 }
    }
}

impl Module for Softplus {
    fn forward(&self, input: &Var) -> Result<Var> {
        Ok(input.softplus(self.beta, self.threshold)?)
    }
}

/// Defines an activation layer with one `f64` parameter.
macro_rules! activation_with {
    ($(#[$doc:meta])* $name:ident, $op:ident, $param:ident = $default:expr, $check:expr) => {
        $(#[$doc])*
        #[derive(crate::Parameters, Clone, Copy, Debug, PartialEq)]
        pub struct $name {
            #[module(skip)]
            $param: f64,
        }

        impl $name {
            #[doc = concat!("A layer with this `", stringify!($param), "`.")]
            pub fn new($param: f64) -> Result<$name> {
                let check: fn(f64) -> Result<()> = $check;
                check($param)?;
                Ok($name { $param })
            }

            #[doc = concat!("`", stringify!($param), "`.")]
            pub fn $param(&self) -> f64 {
                self.$param
            }
        }

        impl Default for $name {
            fn default() -> $name {
                $name { $param: $default }
            }
        }

        impl Module for $name {
            fn forward(&self, input: &Var) -> Result<Var> {
                Ok(input.$op(self.$param)?)
            }
        }
    };
}

activation_with!(
    /// `x` for `x > 0`, else `alpha · (e^x - 1)` (PyTorch's `nn.ELU`,
    /// default `alpha = 1`; any finite `alpha`).
    ///
    /// ```
    /// use brasa_nn::{Elu, Module};
    /// use brasa_autograd::Var;
    /// use brasa_tensor::Tensor;
    ///
    /// let y = Elu::default().forward(&Var::new(Tensor::from_vec(vec![-1.0f64, 2.0], [2])?))?;
    /// assert_eq!(y.tensor().to_vec::<f64>()?[1], 2.0);
    /// # Ok::<(), brasa_nn::NnError>(())
    /// ```
    Elu,
    elu,
    alpha = 1.0,
    |alpha| check_finite("Elu", "alpha", alpha)
);
activation_with!(
    /// `max(0, x) + min(0, alpha · (e^(x/alpha) - 1))` (PyTorch's
    /// `nn.CELU`, default `alpha = 1`; `alpha` finite and non-zero).
    ///
    /// ```
    /// use brasa_nn::{Celu, Module};
    /// use brasa_autograd::Var;
    /// use brasa_tensor::Tensor;
    ///
    /// let y = Celu::new(2.0)?.forward(&Var::new(Tensor::from_vec(vec![3.0f64], [1])?))?;
    /// assert_eq!(y.tensor().to_vec::<f64>()?, [3.0]);
    /// assert!(Celu::new(0.0).is_err());
    /// # Ok::<(), brasa_nn::NnError>(())
    /// ```
    Celu,
    celu,
    alpha = 1.0,
    |alpha| {
        check_finite("Celu", "alpha", alpha)?;
        if alpha == 0.0 {
            return Err(NnError::invalid("Celu", "alpha must be non-zero (x / alpha is taken), got 0"));
        }
        Ok(())
    }
);
activation_with!(
    /// `x` for `x > 0`, else `negative_slope · x` (PyTorch's
    /// `nn.LeakyReLU`, default slope 0.01).
    ///
    /// ```
    /// use brasa_nn::{LeakyRelu, Module};
    /// use brasa_autograd::Var;
    /// use brasa_tensor::Tensor;
    ///
    /// let y = LeakyRelu::new(0.5)?.forward(&Var::new(Tensor::from_vec(vec![-2.0f64, 2.0], [2])?))?;
    /// assert_eq!(y.tensor().to_vec::<f64>()?, [-1.0, 2.0]);
    /// # Ok::<(), brasa_nn::NnError>(())
    /// ```
    LeakyRelu,
    leaky_relu,
    negative_slope = 0.01,
    |slope| check_finite("LeakyRelu", "negative_slope", slope)
);
