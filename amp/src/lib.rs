//! # brasa-amp
//!
//! Mixed precision for brasa, the Rust deep-learning training runtime, with
//! PyTorch's `torch.amp` as the yardstick:
//!
//! - [`autocast`]: a scoped, thread-local, nestable region in which matrix
//!   products, linear layers and convolutions compute in f16 or bf16 while
//!   softmax, exp/log, pow, sums and means, losses and norms compute in f32
//!   ([`Policy`]: PyTorch's CUDA and CPU lists, overridable per operation).
//!   Backward runs each operation in the dtype its forward used; parameter
//!   casts are cached for the region. [`autocast_disabled`] turns it off
//!   inside.
//! - [`GradScaler`]: dynamic loss scaling with PyTorch's defaults and rule
//!   (65536, ×2 every 2000 clean steps, ×0.5 on inf/NaN, steps with
//!   non-finite gradients skipped), `unscale_` for clipping, state dicts.
//! - [`to_half`] / [`to_bf16`]: a half-precision model whose batch-norm and
//!   layer-norm layers stay in f32, with f32 [`MasterWeights`] to train.
//!
//! It sits above `brasa-autograd`: operations ask the precision hook
//! (`brasa_autograd::autocast_inputs`) that [`autocast`] installs; neither
//! `brasa-tensor` nor `brasa-autograd` knows this crate. f16/bf16 sums and
//! means in `brasa-tensor` accumulate in f32 whether or not autocast is on.
//!
//! ```
//! use brasa_amp::{autocast, GradScaler};
//! use brasa_nn::{functional::cross_entropy, optim::{Optimizer, Sgd, SgdConfig}, Linear, Module, ModuleExt, Relu, Sequential};
//! use brasa_autograd::Var;
//! use brasa_tensor::{DType, Device, Tensor};
//!
//! let dev = Device::CPU;
//! let model = Sequential::new().push(Linear::new(16, 32, dev)?).push(Relu).push(Linear::new(32, 4, dev)?);
//! let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() })?;
//! let mut scaler = GradScaler::new();
//! let x = Var::new(Tensor::randn([8, 16], DType::F32)?);
//! let y = Tensor::from_vec(vec![0i64, 1, 2, 3, 0, 1, 2, 3], [8])?;
//! let loss = {
//!     let _amp = autocast(DType::F16);
//!     let logits = model.forward(&x)?;          // f16: linear layers run low
//!     assert_eq!(logits.dtype(), DType::F16);
//!     cross_entropy(&logits, &y)?               // f32: losses run in f32
//! };
//! scaler.scale(&loss)?.backward()?;             // f16 backward where forward was f16
//! scaler.step(&mut opt)?;                       // skipped on inf/NaN
//! scaler.update()?;
//! opt.zero_grad()?;
//! # Ok::<(), brasa_amp::AmpError>(())
//! ```
//!
//! ## Cargo features
//!
//! None.

mod autocast;
mod convert;
mod error;
mod policy;
mod scaler;
mod stage;

pub use autocast::{
    autocast, autocast_disabled, autocast_dtype, autocast_policy, cached_casts, clear_autocast_cache,
    is_autocast_enabled, Autocast, AutocastGuard,
};
pub use convert::{to_bf16, to_half, to_low_precision, MasterOptimizer, MasterWeights};
pub use error::{AmpError, Result};
pub use policy::{
    Category, Policy, BRASA_FLOAT32, CPU_FLOAT32, CPU_LOWER, CPU_PROMOTE, CUDA_FLOAT32, CUDA_LOWER, CUDA_PROMOTE,
};
pub use scaler::{GradScaler, GradScalerConfig};
pub use stage::OptimizerStage;
