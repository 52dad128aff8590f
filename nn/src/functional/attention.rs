//! Scaled dot-product attention, PyTorch's
//! `F.scaled_dot_product_attention`: the memory-efficient, block-by-block
//! [`brasa_autograd::Var::scaled_dot_product_attention`] under its
//! functional name.
//!
//! ```
//! use brasa_nn::functional::{scaled_dot_product_attention, SdpaOptions};
//! use brasa_autograd::Var;
//! use brasa_tensor::{DType, Tensor};
//!
//! let q = Var::new(Tensor::randn([2, 4, 16, 8], DType::F32)?);
//! let out = scaled_dot_product_attention(&q, &q, &q, &SdpaOptions::new().causal(true))?;
//! assert_eq!(out.dims(), &[2, 4, 16, 8]);
//! # Ok::<(), brasa_nn::NnError>(())
//! ```

use crate::error::Result;
use brasa_autograd::Var;

pub use brasa_autograd::SdpaOptions;

/// `softmax(query·keyᵀ·scale + mask)·value` over the last two dims, with the
/// masks, dropout and scale of `options`, computed without the whole score
/// matrix (see [`Var::scaled_dot_product_attention`]).
pub fn scaled_dot_product_attention(query: &Var, key: &Var, value: &Var, options: &SdpaOptions) -> Result<Var> {
    Ok(query.scaled_dot_product_attention(key, value, options)?)
}
