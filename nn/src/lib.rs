//! # brasa-nn
//!
//! Neural-network building blocks for brasa, the Rust deep-learning training
//! runtime: the [`Module`] trait with parameters found from a layer's fields
//! (`#[derive(Parameters)]`), the common layers, losses
//! ([`functional`]), optimizers and learning-rate schedulers ([`optim`]),
//! gradient accumulation, state dicts in safetensors that PyTorch can read,
//! a [`data::DataLoader`] with worker threads, prefetch and pinned memory,
//! and whole [`models`] (a GPT language model, a ResNet-18 for 32×32 images).
//!
//! ```
//! use brasa_nn::{functional::cross_entropy, optim::{Optimizer, Sgd, SgdConfig}, Linear, Module, ModuleExt, Relu, Sequential};
//! use brasa_autograd::Var;
//! use brasa_tensor::{DType, Device, Tensor};
//!
//! let dev = Device::CPU;
//! let model = Sequential::new().push(Linear::new(4, 8, dev)?).push(Relu).push(Linear::new(8, 3, dev)?);
//! let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() })?;
//! let x = Var::new(Tensor::randn([16, 4], DType::F32)?);
//! let y = Tensor::from_vec((0..16).map(|i| i % 3).collect::<Vec<i64>>(), [16])?;
//! let loss = cross_entropy(&model.forward(&x)?, &y)?;
//! loss.backward()?;
//! opt.step()?;
//! opt.zero_grad()?;
//! # Ok::<(), brasa_nn::NnError>(())
//! ```
//!
//! ## Cargo features
//!
//! None.

// The derive macro names `::brasa_nn::...`; this lets the crate use it too.
extern crate self as brasa_nn;

mod error;
mod flags;
mod module;
mod scope;
mod state_dict;
mod walk;

pub mod data;
pub mod functional;
pub mod init;
pub mod layers;
pub mod models;
pub mod optim;

pub use brasa_nn_derive::Parameters;
pub use error::{NnError, Result};
pub use flags::{KeepFloat32, Training};
pub use layers::*;
pub use module::{Module, ModuleExt};
pub use scope::{module_scope, ModuleScope};
pub use state_dict::{LoadReport, StateDict};
pub use walk::{Parameters, Visitor, VisitorMut, Walk, WalkMut};
