//! Activation layers, each a unit struct wrapping the `Var` op of the same
//! name: [`Relu`], [`Gelu`] (exact, with the normal CDF), [`GeluTanh`]
//! (the tanh approximation, `Gelu::tanh()`), [`Silu`], [`Tanh`] and
//! [`Sigmoid`]. PyTorch's `nn.ReLU`, `nn.GELU()`, `nn.GELU('tanh')`,
//! `nn.SiLU`, `nn.Tanh`, `nn.Sigmoid`.

use crate::error::Result;
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
