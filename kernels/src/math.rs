//! Math on plain `f32` and `f64`, below the scalar traits
//! ([`Float`](crate::scalar::Float) and the others) that the elementwise and
//! reduction kernels compute through: the error function, a vectorisable
//! `f32` exponential, and the vectorised `f32` GELU kernels. Nothing here
//! knows those traits: `scalar` implements them for `f32` and `f64` on top
//! of these functions, and `elementwise` and `reduce` re-export them.

mod erf;
mod exp;
mod gelu;

pub use erf::{erf, erfc};
pub use exp::{exp_f32, exp_shifted_f32};
pub use gelu::{gelu_backward_f32, gelu_f32, gelu_tanh_backward_f32, MAX_ULP_ERROR};
