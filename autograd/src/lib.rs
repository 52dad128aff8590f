//! # brasa-autograd
//!
//! Reverse-mode automatic differentiation for brasa, the Rust deep-learning
//! training runtime, over `brasa-tensor`. A [`Var`] is a tensor plus
//! `requires_grad`, an accumulated gradient and the node that produced it;
//! operations on `Var`s record a graph when grad mode is on ([`no_grad`]
//! turns it off) and [`Var::backward`] walks it back, accumulating into the
//! leaves' `.grad` and releasing each node's saved tensors as soon as its
//! backward ran, so memory falls during backward as it does in PyTorch.
//!
//! ```
//! use brasa_autograd::{live_nodes, Var};
//! use brasa_tensor::{DType, Tensor};
//!
//! let w = Var::param(Tensor::randn([4, 3], DType::F32)?)?;   // a leaf that requires grad
//! let x = Var::new(Tensor::ones([2, 4], DType::F32)?);       // an input
//! let loss = x.matmul(&w)?.relu()?.mean_all()?;
//! let mut running_loss = 0.0;
//! running_loss += loss.item()?;                              // a number, not a graph
//! loss.backward()?;                                          // saved tensors released as it goes
//! assert_eq!(w.grad().unwrap().dims(), &[4, 3]);
//! assert_eq!(loss.graph_stats().saved_bytes, 0);
//! # let _ = (running_loss, live_nodes());
//! # Ok::<(), brasa_autograd::AutogradError>(())
//! ```
//!
//! Also here: [`grad`] for gradients without touching `.grad`, hooks
//! ([`Var::register_hook`], [`Var::register_post_accumulate_grad_hook`],
//! [`Var::retain_grad`]), custom operations through [`Function`],
//! [`gradcheck`] against finite differences, gradient checkpointing
//! ([`checkpoint`], [`checkpoint_sequential`]), saved-tensor hooks
//! ([`saved_tensors_hooks`]) and activation offload to host memory built on
//! them ([`save_on_host`]), and live-graph introspection
//! ([`live_nodes`], [`saved_tensor_bytes`], [`Var::graph_stats`]). A tensor
//! saved for backward and then changed in place makes backward an error that
//! names the operation, never a wrong gradient.
//!
//! ## Cargo features
//!
//! None.

mod backward;
mod callbacks;
mod checkpoint;
mod error;
mod function;
mod grad_mode;
mod gradcheck;
mod graph;
mod hooks;
mod introspect;
mod offload;
pub mod op_names;
mod ops;
mod precision;
mod saved;
mod saved_hooks;
mod var;
mod view_region;

pub use backward::grad;
pub use callbacks::{in_backward, queue_callback};
pub use checkpoint::{checkpoint, checkpoint_sequential, Layer};
pub use error::{AutogradError, Result, SavedTensorHookStage};
pub use function::{apply, Function, FunctionCtx};
pub use grad_mode::{enable_grad, is_grad_enabled, no_grad, set_grad_enabled, GradModeGuard};
pub use gradcheck::gradcheck;
pub use graph::BackwardCtx;
pub use introspect::{leaves_reached, live_nodes, saved_tensor_bytes, GraphStats};
pub use offload::{save_on_host, save_on_host_with, OffloadOptions};
pub use ops::SdpaOptions;
pub use precision::{autocast_inputs, autocast_tensors, precision_hook, set_precision_hook, PrecisionHook};
pub use saved_hooks::{
    install_saved_tensor_hooks, saved_tensors_hooks, Packed, SavedTensorHooks, SavedTensorsHooksGuard,
};
pub use var::{Var, WeakVar};
