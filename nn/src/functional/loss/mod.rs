//! Losses, with PyTorch's formulas and defaults (`torch.nn.functional`):
//! [`cross_entropy`] (class weights, label smoothing, `ignore_index`, and
//! class-probability targets through [`cross_entropy_probs`]),
//! [`nll_loss`], [`mse_loss`], [`l1_loss`] and
//! [`binary_cross_entropy_with_logits`].
//!
//! Cross entropy runs on every training step, so it is one autograd node
//! rather than a chain of ops: its forward computes the log-softmax once
//! (freed before it returns) and saves only the logits it was given (no new
//! memory), the class indices and a few per-position coefficients; its
//! backward makes the gradient in one softmax buffer and finishes it in
//! place: `(softmax − smoothed one-hot) · weight · grad`. `nll_loss` and the
//! binary cross entropy are single nodes likewise; the regression losses are
//! short compositions of `Var` ops.
//!
//! Every loss takes part in mixed precision: it first asks the precision
//! hook (`brasa_autograd::autocast_inputs`, under the names of
//! `brasa_autograd::op_names`: `cross_entropy`, `nll_loss`, `mse_loss`,
//! `l1_loss` and `binary_cross_entropy_with_logits`), so under
//! `brasa_amp::autocast` the losses compute in f32 as PyTorch's do.
//!
//! One file per concept: `options.rs` (what every loss takes: [`Reduction`]
//! and PyTorch's keyword arguments), `targets.rs` (checking a target against
//! its input; the class-index targets and per-position values that cross
//! entropy and NLL share), then one file per loss: `cross_entropy.rs`,
//! `cross_entropy_probs.rs`, `nll.rs`, `regression.rs` (MSE and L1) and
//! `bce.rs`.
//!
//! ```
//! use brasa_nn::functional::{cross_entropy, cross_entropy_with, CrossEntropyOptions, Reduction};
//! use brasa_autograd::Var;
//! use brasa_tensor::{Device, Tensor};
//!
//! let logits = Var::param(Tensor::from_vec(vec![2.0f32, 0.0, 0.0, 0.0, 1.0, 0.0], [2, 3])?)?;
//! let target = Tensor::from_vec(vec![0i64, 1], [2])?;
//! let loss = cross_entropy(&logits, &target)?;
//! loss.backward()?;
//! assert_eq!(logits.grad().unwrap().dims(), &[2, 3]);
//!
//! // Per-sample losses, with label smoothing; -100 marks padding (PyTorch's default ignore_index).
//! let padded = Tensor::from_vec(vec![0i64, -100], [2])?;
//! let options = CrossEntropyOptions { reduction: Reduction::None, label_smoothing: 0.1, ..Default::default() };
//! let per_sample = cross_entropy_with(&logits, &padded, &options)?;
//! assert_eq!(per_sample.tensor().to_vec::<f32>()?[1], 0.0);
//! # Ok::<(), brasa_nn::NnError>(())
//! ```

mod bce;
mod cross_entropy;
mod cross_entropy_probs;
mod nll;
mod options;
mod regression;
mod targets;

pub use bce::{binary_cross_entropy_with_logits, binary_cross_entropy_with_logits_with};
pub use cross_entropy::{cross_entropy, cross_entropy_with};
pub use cross_entropy_probs::cross_entropy_probs;
pub use nll::{nll_loss, nll_loss_with};
pub use options::{BceWithLogitsOptions, CrossEntropyOptions, NllLossOptions, Reduction};
pub use regression::{l1_loss, mse_loss};
