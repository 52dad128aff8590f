//! The [`Module`] trait and [`ModuleExt`]: everything PyTorch's `nn.Module`
//! offers on a whole model (parameters, named parameters, train/eval, moving
//! to a device or dtype, state dicts), written once as walks over the fields
//! ([`Parameters`], in `walk.rs`).
//!
//! A custom layer is a struct with `#[derive(Parameters)]` and a `forward`:
//!
//! ```
//! use brasa_nn::{Linear, Module, ModuleExt, Parameters, Result};
//! use brasa_autograd::Var;
//! use brasa_tensor::{DType, Device, Tensor};
//!
//! #[derive(Parameters)]
//! struct Residual {
//!     inner: Linear,
//!     gate: Var, // a Var field is a parameter; a Tensor field a buffer
//! }
//!
//! impl Module for Residual {
//!     fn forward(&self, x: &Var) -> Result<Var> {
//!         Ok(x.add(&self.inner.forward(x)?.mul(&self.gate)?)?)
//!     }
//! }
//!
//! let block = Residual { inner: Linear::new(4, 4, Device::CPU)?, gate: Var::param(Tensor::ones([1], DType::F32)?)? };
//! let names: Vec<String> = block.named_parameters().into_iter().map(|(name, _)| name).collect();
//! assert_eq!(names, ["inner.weight", "inner.bias", "gate"]);
//! # Ok::<(), brasa_nn::NnError>(())
//! ```

use crate::error::Result;
use crate::flags::Training;
use crate::state_dict::{LoadReport, StateDict};
use crate::walk::{Parameters, Visitor, VisitorMut, Walk, WalkMut};
use brasa_autograd::Var;
use brasa_tensor::{DType, Device, Tensor};
use std::path::Path;

/// A differentiable layer or model: `forward` from one input.
pub trait Module: Parameters + Send + Sync {
    /// Computes the output, recording the graph when grad mode is on.
    fn forward(&self, input: &Var) -> Result<Var>;

    /// The layer's type name without its path (`Linear`), shown in profiler
    /// ranges (see [`crate::module_scope`]).
    fn type_name(&self) -> &'static str {
        crate::scope::short_type_name(std::any::type_name::<Self>())
    }
}

/// Whole-model operations for every [`Parameters`] type (and so every
/// [`Module`]), including `dyn Module`.
pub trait ModuleExt: Parameters {
    /// The parameters in field order, each once (a parameter shared by two
    /// layers appears under its first name).
    fn parameters(&self) -> Vec<Var> {
        self.named_parameters().into_iter().map(|(_, var)| var).collect()
    }

    /// The parameters with their dotted names (`0.weight`, `encoder.bias`).
    fn named_parameters(&self) -> Vec<(String, Var)> {
        #[derive(Default)]
        struct Collect(Vec<(String, Var)>);
        impl Visitor for Collect {
            fn param(&mut self, path: &str, param: &Var) {
                if !self.0.iter().any(|(_, seen)| seen.same_var(param)) {
                    self.0.push((path.to_string(), param.clone()));
                }
            }
        }
        let mut collect = Collect::default();
        self.visit(&mut Walk::new(&mut collect));
        collect.0
    }

    /// The buffers (running statistics and the like) with their dotted names.
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        #[derive(Default)]
        struct Collect(Vec<(String, Tensor)>);
        impl Visitor for Collect {
            fn buffer(&mut self, path: &str, buffer: &Tensor) {
                self.0.push((path.to_string(), buffer.clone()));
            }
        }
        let mut collect = Collect::default();
        self.visit(&mut Walk::new(&mut collect));
        collect.0
    }

    /// The number of parameter elements.
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(Var::numel).sum()
    }

    /// Parameters and buffers by dotted name, sharing storage with the model
    /// (PyTorch's `state_dict()`; save it with [`StateDict::save`]).
    fn state_dict(&self) -> StateDict {
        // One walk, so names come in PyTorch's order: each layer's parameters
        // and buffers together (`1.weight, 1.bias, 1.running_mean, ...`).
        #[derive(Default)]
        struct Collect(StateDict, Vec<Var>);
        impl Visitor for Collect {
            fn param(&mut self, path: &str, param: &Var) {
                if !self.1.iter().any(|seen| seen.same_var(param)) {
                    self.1.push(param.clone());
                    self.0.insert(path, param.tensor().clone());
                }
            }
            fn buffer(&mut self, path: &str, buffer: &Tensor) {
                self.0.insert(path, buffer.clone());
            }
        }
        let mut collect = Collect::default();
        self.visit(&mut Walk::new(&mut collect));
        collect.0
    }

    /// Copies `dict` into the model's parameters and buffers in place.
    /// `strict`: a missing or unexpected name, or a tensor of another shape or
    /// dtype, is an error naming it (nothing is copied then). Not strict: what
    /// fits is copied and the rest is reported.
    fn load_state_dict(&self, dict: &StateDict, strict: bool) -> Result<LoadReport> {
        crate::state_dict::load_into(&self.state_dict(), dict, strict)
    }

    /// Writes the state dict to a safetensors file.
    fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        self.state_dict().save(path)
    }

    /// Loads a safetensors file written by [`ModuleExt::save`] (or by PyTorch's
    /// `safetensors.torch.save_file` for the same model), strictly.
    fn load(&self, path: impl AsRef<Path>) -> Result<LoadReport> {
        self.load_state_dict(&StateDict::load(path)?, true)
    }

    /// Sets every layer's train/eval flag.
    fn set_training(&mut self, training: bool) {
        struct SetMode(bool);
        impl VisitorMut for SetMode {
            fn training(&mut self, _path: &str, flag: &mut Training) -> Result<()> {
                flag.set(self.0);
                Ok(())
            }
        }
        // Setting a flag cannot fail.
        let _ = self.visit_mut(&mut WalkMut::new(&mut SetMode(training)));
    }

    /// Training mode (dropout active, batch norm on batch statistics).
    fn train(&mut self) {
        self.set_training(true);
    }

    /// Evaluation mode (dropout off, batch norm on running statistics).
    fn eval(&mut self) {
        self.set_training(false);
    }

    /// True unless some layer is in evaluation mode.
    fn is_training(&self) -> bool {
        struct AnyEval(bool);
        impl Visitor for AnyEval {
            fn training(&mut self, _path: &str, flag: &Training) {
                self.0 |= !flag.get();
            }
        }
        let mut any_eval = AnyEval(false);
        self.visit(&mut Walk::new(&mut any_eval));
        !any_eval.0
    }

    /// Moves every parameter and buffer to `device` (gradients are dropped).
    /// Do this before creating the optimizer: it holds the old parameters.
    fn to_device(&mut self, device: Device) -> Result<()> {
        self.visit_mut(&mut WalkMut::new(&mut Convert { device: Some(device), ..Convert::default() }))
    }

    /// Lays every 4-d parameter and buffer out channels-last (PyTorch's
    /// `model.to(memory_format=torch.channels_last)`): convolution weights
    /// then match channels-last batches, so cuDNN runs without converting
    /// the filter on every call, and gradients and optimizer state follow
    /// the weights' layout. Values, shapes and names are unchanged, and so
    /// are tensors of other ranks. Do this before creating the optimizer:
    /// it holds the old parameters.
    ///
    /// ```
    /// use brasa_nn::layers::Conv2d;
    /// use brasa_nn::ModuleExt;
    /// use brasa_tensor::Device;
    /// let mut conv = Conv2d::new(3, 8, 3, Device::CPU)?;
    /// conv.to_channels_last()?;
    /// let weight = &conv.named_parameters()[0].1;
    /// assert!(weight.tensor().is_channels_last() && !weight.tensor().is_contiguous());
    /// # Ok::<(), brasa_nn::NnError>(())
    /// ```
    fn to_channels_last(&mut self) -> Result<()> {
        self.visit_mut(&mut WalkMut::new(&mut Convert { channels_last: true, ..Convert::default() }))
    }

    /// Converts every floating-point parameter and buffer to `dtype`
    /// (integer buffers such as counters are left as they are). `dtype`
    /// must be a floating-point type: an integer or bool model would keep
    /// parameters that require grad but can have no gradient, so another
    /// dtype is an error and nothing is converted (PyTorch: "nn.Module.to
    /// only accepts floating point or complex dtypes").
    fn to_dtype(&mut self, dtype: DType) -> Result<()> {
        if !dtype.is_float() {
            return Err(crate::NnError::invalid(
                "to_dtype",
                format!("a module converts only to floating-point dtypes, got {dtype}"),
            ));
        }
        self.visit_mut(&mut WalkMut::new(&mut Convert { dtype: Some(dtype), ..Convert::default() }))
    }

    /// Drops every parameter's gradient (PyTorch's `zero_grad(set_to_none=True)`).
    fn zero_grad(&self) -> Result<()> {
        for param in self.parameters() {
            param.zero_grad(true)?;
        }
        Ok(())
    }

    /// Freezes (`false`) or unfreezes every parameter.
    fn requires_grad_(&self, requires_grad: bool) -> Result<()> {
        for param in self.parameters() {
            param.requires_grad_(requires_grad)?;
        }
        Ok(())
    }
}

impl<T: Parameters + ?Sized> ModuleExt for T {}

/// Moves, converts and/or lays out parameters and buffers.
#[derive(Default)]
struct Convert {
    device: Option<Device>,
    dtype: Option<DType>,
    /// 4-d tensors channels-last.
    channels_last: bool,
}

impl Convert {
    fn convert(&self, tensor: &Tensor) -> Result<Option<Tensor>> {
        let mut out = None;
        if let Some(dtype) = self.dtype {
            if tensor.dtype().is_float() && tensor.dtype() != dtype {
                out = Some(tensor.to_dtype(dtype)?);
            }
        }
        if let Some(device) = self.device {
            let current = out.as_ref().unwrap_or(tensor);
            if current.device() != device {
                out = Some(current.to(device)?);
            }
        }
        if self.channels_last {
            let current = out.as_ref().unwrap_or(tensor);
            if current.rank() == 4 && !current.is_channels_last() {
                out = Some(current.to_channels_last()?);
            }
        }
        Ok(out)
    }
}

impl VisitorMut for Convert {
    fn param(&mut self, _path: &str, param: &mut Var) -> Result<()> {
        if let Some(tensor) = self.convert(param.tensor())? {
            *param = Var::from_tensor(tensor, param.requires_grad())?;
        }
        Ok(())
    }

    fn buffer(&mut self, _path: &str, buffer: &mut Tensor) -> Result<()> {
        if let Some(tensor) = self.convert(buffer)? {
            *buffer = tensor;
        }
        Ok(())
    }
}
