//! Fields that a walk over a model reports besides its parameters and
//! buffers: the train/eval flag ([`Training`]) and the marker of layers that
//! stay in f32 under mixed precision ([`KeepFloat32`]).

/// Whether a layer is in training mode (dropout active, batch norm using
/// batch statistics). Layers start in training mode, as in PyTorch;
/// [`ModuleExt::train`](crate::ModuleExt::train) and
/// [`ModuleExt::eval`](crate::ModuleExt::eval) set every flag of a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Training(bool);

impl Training {
    /// A flag in the given mode.
    pub const fn new(training: bool) -> Training {
        Training(training)
    }

    /// True in training mode.
    pub const fn get(self) -> bool {
        self.0
    }

    /// Sets the mode.
    pub fn set(&mut self, training: bool) {
        self.0 = training;
    }
}

impl Default for Training {
    fn default() -> Training {
        Training(true)
    }
}

/// A marker field for layers whose parameters and arithmetic must stay in
/// f32 under mixed precision (batch norm, layer norm: their statistics lose
/// too much in f16/bf16). It holds nothing and costs nothing; a walk reports
/// it ([`crate::Visitor::keep_float32`]) with the path of the layer that
/// holds it, so a converter such as `brasa_amp::to_half` can leave that
/// layer's parameters and buffers in f32.
/// [`ModuleExt::to_dtype`](crate::ModuleExt::to_dtype) ignores it (it is the
/// explicit, PyTorch `.half()`-like conversion of everything).
///
/// ```
/// use brasa_nn::{KeepFloat32, Linear, Parameters, Visitor, Walk};
/// use brasa_tensor::Device;
///
/// #[derive(Parameters)]
/// struct ScaleNorm {
///     proj: Linear,
///     keep_float32: KeepFloat32,
/// }
///
/// struct Kept(Vec<String>);
/// impl Visitor for Kept {
///     fn keep_float32(&mut self, module_path: &str) {
///         self.0.push(module_path.to_string());
///     }
/// }
/// let layer = ScaleNorm { proj: Linear::new(2, 2, Device::CPU)?, keep_float32: KeepFloat32 };
/// let mut kept = Kept(Vec::new());
/// layer.visit(&mut Walk::new(&mut kept));
/// assert_eq!(kept.0, [""]); // the root layer itself
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct KeepFloat32;
