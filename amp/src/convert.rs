//! Half-precision models: [`to_half`] and [`to_bf16`] convert a model's
//! parameters and buffers to f16 / bf16, except those of layers that hold a
//! [`brasa_nn::KeepFloat32`] marker (batch norm, layer norm), which stay in
//! f32 — parameters, running statistics and arithmetic — unlike PyTorch's
//! `.half()` (pytorch/pytorch#88929). The norm functions take the half
//! input with f32 parameters, compute in f32 and return the input's dtype.
//!
//! Training in half keeps f32 **master weights**: the converted function
//! returns [`MasterWeights`], the f32 copy of every trainable parameter
//! (the original `Var` itself when it was f32). Give
//! [`MasterWeights::parameters`] to the optimizer and wrap it in a
//! [`MasterOptimizer`]: backward hands each half parameter's gradient to
//! its master (in f32, accumulated there), the optimizer updates the
//! masters, and the half parameters are refreshed from them after each
//! step. Small updates are not lost to f16 rounding, and
//! [`crate::GradScaler::unscale_`] sees f32 gradients.
//!
//! Converting again is safe: a half parameter that already has a master
//! keeps it (a second [`to_half`] returns the same masters, connected as
//! before, like PyTorch's idempotent `.half()`), and [`to_bf16`] after
//! [`to_half`] hands the new bf16 parameters' gradients to the existing
//! masters.
//!
//! ```
//! use brasa_amp::{to_half, GradScaler, MasterOptimizer};
//! use brasa_nn::{functional::cross_entropy, optim::{Optimizer, Sgd, SgdConfig}, LayerNorm, Linear, Module, ModuleExt, Relu, Sequential};
//! use brasa_autograd::Var;
//! use brasa_tensor::{DType, Device, Tensor};
//!
//! let dev = Device::CPU;
//! let mut model = Sequential::new().push(Linear::new(8, 16, dev)?).push(LayerNorm::new([16], dev)?).push(Relu).push(Linear::new(16, 3, dev)?);
//! let masters = to_half(&mut model)?;
//! let dtypes: Vec<DType> = model.parameters().iter().map(|p| p.dtype()).collect();
//! assert_eq!(dtypes, [DType::F16, DType::F16, DType::F32, DType::F32, DType::F16, DType::F16]);
//!
//! let sgd = Sgd::new(masters.parameters(), SgdConfig { lr: 0.1, ..Default::default() })?;
//! let mut opt = MasterOptimizer::new(masters, sgd)?;
//! let mut scaler = GradScaler::new();
//! let x = Var::new(Tensor::randn([4, 8], DType::F32)?.to_dtype(DType::F16)?);
//! let y = Tensor::from_vec(vec![0i64, 1, 2, 1], [4])?;
//! let loss = cross_entropy(&model.forward(&x)?.to_dtype(DType::F32)?, &y)?;
//! scaler.scale(&loss)?.backward()?;
//! scaler.step(&mut opt)?;                 // f32 gradients on the masters
//! scaler.update()?;
//! opt.zero_grad()?;
//! # Ok::<(), brasa_amp::AmpError>(())
//! ```

use crate::error::{AmpError, Result};
use brasa_autograd::{no_grad, Var, WeakVar};
use brasa_nn::optim::Optimizer;
use brasa_nn::{Parameters, StateDict, Visitor, VisitorMut, Walk, WalkMut};
use brasa_tensor::{DType, Tensor};

/// Converts `model` to f16, keeping the parameters, buffers and arithmetic
/// of layers marked [`brasa_nn::KeepFloat32`] in f32, and returns the f32
/// master weights to train (see the module docs).
pub fn to_half<M: Parameters + ?Sized>(model: &mut M) -> Result<MasterWeights> {
    to_low_precision(model, DType::F16)
}

/// [`to_half`] with bf16.
pub fn to_bf16<M: Parameters + ?Sized>(model: &mut M) -> Result<MasterWeights> {
    to_low_precision(model, DType::BF16)
}

/// [`to_half`] / [`to_bf16`] for `dtype` (f16 or bf16).
pub fn to_low_precision<M: Parameters + ?Sized>(model: &mut M, dtype: DType) -> Result<MasterWeights> {
    if !matches!(dtype, DType::F16 | DType::BF16) {
        return Err(AmpError::invalid("to_low_precision", format!("converts to f16 or bf16, got {dtype}")));
    }
    // The marker may come after the parameters in a layer's fields: find
    // every kept layer first.
    let mut kept = KeptLayers(Vec::new());
    model.visit(&mut Walk::new(&mut kept));
    let mut convert = Convert { dtype, kept: kept.0, seen: Vec::new(), pairs: Vec::new() };
    model.visit_mut(&mut WalkMut::new(&mut convert))?;
    Ok(MasterWeights { pairs: convert.pairs })
}

/// Every half parameter made by a conversion, with the master its gradients
/// go to (both weak: the parameter's hook keeps the master alive as long
/// as the parameter lives).
static MASTERS: std::sync::Mutex<Vec<(WeakVar, WeakVar)>> = std::sync::Mutex::new(Vec::new());

fn masters() -> std::sync::MutexGuard<'static, Vec<(WeakVar, WeakVar)>> {
    MASTERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The master a previous conversion gave `param`, if it has one.
fn master_of(param: &Var) -> Option<Var> {
    let mut registry = masters();
    registry.retain(|(half, _)| half.upgrade().is_some());
    registry.iter().find(|(half, _)| half.is(param)).and_then(|(_, master)| master.upgrade())
}

/// The paths of the layers that hold a `KeepFloat32` marker.
struct KeptLayers(Vec<String>);

impl Visitor for KeptLayers {
    fn keep_float32(&mut self, module_path: &str) {
        self.0.push(module_path.to_string());
    }
}

struct Convert {
    dtype: DType,
    kept: Vec<String>,
    /// (original, model parameter) for every parameter seen, so a parameter
    /// shared by two layers is converted once.
    seen: Vec<(Var, Var)>,
    /// (original, model parameter, master) for each trainable one.
    pairs: Vec<(Var, Var, Var)>,
}

impl Convert {
    fn is_kept(&self, path: &str) -> bool {
        self.kept.iter().any(|layer| {
            layer.is_empty()
                || path.strip_prefix(layer.as_str()).is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
        })
    }

    /// The dtype a floating-point tensor at `path` becomes, if it changes:
    /// kept layers go (back) to f32 from a half type, the rest to the
    /// target half type.
    fn target(&self, path: &str, dtype: DType) -> Option<DType> {
        if !dtype.is_float() {
            return None;
        }
        let target = if self.is_kept(path) {
            if !is_half(dtype) {
                return None;
            }
            DType::F32
        } else {
            self.dtype
        };
        (dtype != target).then_some(target)
    }
}

fn is_half(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
}

impl VisitorMut for Convert {
    fn param(&mut self, path: &str, param: &mut Var) -> brasa_nn::Result<()> {
        // A parameter shared by two layers is converted once.
        if let Some((_, model)) = self.seen.iter().find(|(original, _)| original.same_var(param)) {
            *param = model.clone();
            return Ok(());
        }
        let original = param.clone();
        let requires_grad = param.requires_grad();
        let model = match self.target(path, param.dtype()) {
            Some(target) => Var::from_tensor(param.tensor().to_dtype(target)?, requires_grad)?,
            None => param.clone(),
        };
        if requires_grad {
            let master = if !is_half(model.dtype()) {
                // Kept in f32 (or f64): its own master.
                model.clone()
            } else if let Some(existing) = master_of(&original) {
                // Converted before: its master stays the master (a second
                // master would never see a gradient, the first hook takes it).
                existing
            } else if original.dtype() == DType::F32 {
                // The original f32 parameter becomes the master: an optimizer
                // built on it before the conversion still trains the model.
                original.clone()
            } else {
                Var::param(original.tensor().to_dtype(DType::F32)?)?
            };
            let connected = master_of(&model).is_some_and(|m| m.same_var(&master));
            if !master.same_var(&model) && !connected {
                let to = master.clone();
                model.register_post_accumulate_grad_hook(move |half| hand_grad_to_master(half, &to))?;
                masters().push((model.downgrade(), master.downgrade()));
            }
            self.pairs.push((original.clone(), model.clone(), master));
        }
        self.seen.push((original, model.clone()));
        *param = model;
        Ok(())
    }

    fn buffer(&mut self, path: &str, buffer: &mut Tensor) -> brasa_nn::Result<()> {
        if let Some(target) = self.target(path, buffer.dtype()) {
            *buffer = buffer.to_dtype(target)?;
        }
        Ok(())
    }
}

/// Moves the gradient just accumulated into a half parameter to its f32
/// master, adding it there (micro-batches accumulate in f32).
fn hand_grad_to_master(half: &Var, master: &Var) -> brasa_autograd::Result<()> {
    let Some(grad) = half.grad() else { return Ok(()) };
    half.set_grad(None)?;
    match master.grad() {
        Some(existing) => existing.add_(&grad)?,
        None => master.set_grad(Some(grad.to_dtype(DType::F32)?))?,
    }
    Ok(())
}

/// The f32 master weights of a model converted by [`to_half`] /
/// [`to_bf16`]: one per trainable parameter, paired with the model's.
#[derive(Clone, Debug)]
pub struct MasterWeights {
    /// (original parameter, model parameter, master).
    pairs: Vec<(Var, Var, Var)>,
}

impl MasterWeights {
    /// The f32 masters, in the model's parameter order: what the optimizer
    /// updates. A parameter kept in f32 is its own master.
    pub fn parameters(&self) -> Vec<Var> {
        self.pairs.iter().map(|(_, _, master)| master.clone()).collect()
    }

    /// The model's parameters (half, or f32 where kept), in the same order.
    pub fn model_parameters(&self) -> Vec<Var> {
        self.pairs.iter().map(|(_, model, _)| model.clone()).collect()
    }

    /// The number of trainable parameters.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// True when the model has no trainable parameter.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// Copies every master into its half parameter, in place (the model's
    /// `Var`s stay the same, so nothing else needs to be told).
    pub fn copy_to_model(&self) -> Result<()> {
        let _no_grad = no_grad();
        for (_, model, master) in &self.pairs {
            if !model.same_var(master) {
                model.tensor().copy_(master.tensor())?;
            }
        }
        Ok(())
    }

    /// Copies the model's (half) values into the masters, in place (after
    /// loading a state dict into the converted model, say).
    pub fn copy_from_model(&self) -> Result<()> {
        let _no_grad = no_grad();
        for (_, model, master) in &self.pairs {
            if !model.same_var(master) {
                master.tensor().copy_(model.tensor())?;
            }
        }
        Ok(())
    }
}

/// An optimizer over f32 master weights: steps the masters, then copies
/// them into the half model. Everything else (learning rate, state dict)
/// is the inner optimizer's.
pub struct MasterOptimizer<O: Optimizer> {
    masters: MasterWeights,
    inner: O,
}

impl<O: Optimizer> MasterOptimizer<O> {
    /// Wraps `inner`, which must have been built on `masters.parameters()`
    /// (an optimizer of the half parameters would see no gradients: they
    /// move to the masters during backward).
    pub fn new(masters: MasterWeights, inner: O) -> Result<MasterOptimizer<O>> {
        let foreign = inner.params().iter().position(|p| !masters.pairs.iter().any(|(_, _, m)| m.same_var(p)));
        if let Some(index) = foreign {
            return Err(AmpError::invalid(
                "MasterOptimizer::new",
                format!(
                    "parameter {index} of the optimizer is not a master weight; build it on MasterWeights::parameters()"
                ),
            ));
        }
        Ok(MasterOptimizer { masters, inner })
    }

    /// The master weights.
    pub fn masters(&self) -> &MasterWeights {
        &self.masters
    }

    /// The wrapped optimizer.
    pub fn inner(&self) -> &O {
        &self.inner
    }

    /// The wrapped optimizer, mutably.
    pub fn inner_mut(&mut self) -> &mut O {
        &mut self.inner
    }

    /// The masters and the wrapped optimizer.
    pub fn into_parts(self) -> (MasterWeights, O) {
        (self.masters, self.inner)
    }
}

impl<O: Optimizer> Optimizer for MasterOptimizer<O> {
    fn step(&mut self) -> brasa_nn::Result<()> {
        self.inner.step()?;
        self.masters.copy_to_model()?;
        Ok(())
    }

    fn zero_grad_with(&mut self, set_to_none: bool) -> brasa_nn::Result<()> {
        self.inner.zero_grad_with(set_to_none)?;
        for (_, model, master) in &self.masters.pairs {
            if !model.same_var(master) {
                model.zero_grad(true)?;
            }
        }
        Ok(())
    }

    fn lr(&self) -> f64 {
        self.inner.lr()
    }

    fn set_lr(&mut self, lr: f64) -> brasa_nn::Result<()> {
        self.inner.set_lr(lr)
    }

    fn params(&self) -> &[Var] {
        self.inner.params()
    }

    fn state_dict(&self) -> brasa_nn::Result<StateDict> {
        self.inner.state_dict()
    }

    fn load_state_dict(&mut self, state: &StateDict) -> brasa_nn::Result<()> {
        self.inner.load_state_dict(state)
    }
}
