//! [`Sequential`]: layers run one after another, PyTorch's
//! `nn.Sequential`; its children are named `0`, `1`, ... so parameter names
//! (`0.weight`, `2.bias`) match PyTorch's and state dicts move between them.

use crate::error::{NnError, Result};
use crate::module::Module;
use crate::scope::module_scope;
use crate::walk::Parameters;
use crate::walk::{Walk, WalkMut};
use brasa_autograd::Var;
use std::ops::Index;

/// A chain of layers: `forward` feeds each layer's output to the next.
///
/// ```
/// use brasa_nn::{BatchNorm2d, Conv2d, Flatten, Linear, MaxPool2d, Module, ModuleExt, Relu, Sequential};
/// use brasa_autograd::Var;
/// use brasa_tensor::{DType, Device, Tensor};
///
/// let dev = Device::CPU;
/// let model = Sequential::new()
///     .push(Conv2d::new(1, 8, 3, dev)?)
///     .push(BatchNorm2d::new(8, dev)?)
///     .push(Relu)
///     .push(MaxPool2d::new(2)?)
///     .push(Flatten::new())
///     .push(Linear::new(8 * 13 * 13, 10, dev)?);
/// assert_eq!(model.len(), 6);
/// let y = model.forward(&Var::new(Tensor::zeros([4, 1, 28, 28], DType::F32)?))?;
/// assert_eq!(y.dims(), &[4, 10]);
/// let names: Vec<String> = model.named_parameters().into_iter().map(|(name, _)| name).collect();
/// assert_eq!(names, ["0.weight", "0.bias", "1.weight", "1.bias", "5.weight", "5.bias"]);
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    /// An empty chain (its `forward` returns the input).
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// This chain with `layer` appended (a builder step).
    pub fn push(mut self, layer: impl Module + 'static) -> Sequential {
        self.layers.push(Box::new(layer));
        self
    }

    /// Appends a boxed layer in place.
    pub fn append(&mut self, layer: Box<dyn Module>) {
        self.layers.push(layer);
    }

    /// The layers, in order, taken out of the chain (to wrap or shard each
    /// on its own, as fully sharded data parallelism does with its units).
    pub fn into_layers(self) -> Vec<Box<dyn Module>> {
        self.layers
    }

    /// The number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// True when there are no layers.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Layer `index`, if there is one.
    pub fn get(&self, index: usize) -> Option<&dyn Module> {
        self.layers.get(index).map(|layer| &**layer)
    }

    /// Layer `index` for changing it, if there is one.
    pub fn get_mut(&mut self, index: usize) -> Option<&mut (dyn Module + 'static)> {
        self.layers.get_mut(index).map(|layer| &mut **layer)
    }

    /// The layers in order.
    pub fn iter(&self) -> impl Iterator<Item = &dyn Module> {
        self.layers.iter().map(|layer| &**layer)
    }

    /// Runs layers `range` only (for example the feature extractor of a
    /// classifier); an out-of-range `range` is an error.
    pub fn forward_range(&self, input: &Var, range: std::ops::Range<usize>) -> Result<Var> {
        let layers = self.layers.get(range.clone()).ok_or_else(|| {
            NnError::invalid("Sequential", format!("layers {range:?} out of range for {} layers", self.layers.len()))
        })?;
        let mut x = input.clone();
        for (index, layer) in layers.iter().enumerate() {
            let _scope = module_scope(range.start + index, layer.type_name());
            x = layer.forward(&x)?;
        }
        Ok(x)
    }
}

impl Index<usize> for Sequential {
    type Output = dyn Module;

    /// Layer `index`; panics when out of range, like a slice (use
    /// [`Sequential::get`] for an `Option`).
    fn index(&self, index: usize) -> &(dyn Module + 'static) {
        &*self.layers[index]
    }
}

impl std::fmt::Debug for Sequential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sequential({} layers)", self.layers.len())
    }
}

/// Children are named by position, as in PyTorch.
impl Parameters for Sequential {
    fn visit(&self, walk: &mut Walk<'_>) {
        for (index, layer) in self.layers.iter().enumerate() {
            walk.field(&index.to_string(), &**layer);
        }
    }

    fn visit_mut(&mut self, walk: &mut WalkMut<'_>) -> Result<()> {
        for (index, layer) in self.layers.iter_mut().enumerate() {
            walk.field(&index.to_string(), &mut **layer)?;
        }
        Ok(())
    }
}

impl Module for Sequential {
    fn forward(&self, input: &Var) -> Result<Var> {
        self.forward_range(input, 0..self.layers.len())
    }
}
