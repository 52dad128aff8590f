//! What the losses take besides their inputs: how the per-element values
//! are combined ([`Reduction`]) and each loss's keyword arguments, with
//! PyTorch's defaults.

use brasa_tensor::Tensor;

/// How a loss combines its per-element values (PyTorch's `reduction`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Reduction {
    /// The mean (for the class-index losses: weighted by the class weights
    /// of the targets that are not ignored). The default.
    #[default]
    Mean,
    /// The sum.
    Sum,
    /// No reduction: one value per element (per sample and position).
    None,
}

/// Options of [`cross_entropy_with`](super::cross_entropy_with), PyTorch's
/// keyword arguments with their defaults.
#[derive(Clone, Debug)]
pub struct CrossEntropyOptions {
    /// How the per-position losses are combined (default [`Reduction::Mean`]).
    pub reduction: Reduction,
    /// `ε` in `[0, 1]`: the target becomes `(1 − ε)·one_hot + ε/C` (default 0).
    pub label_smoothing: f64,
    /// Targets equal to this contribute nothing, not even to the mean's
    /// denominator (default `Some(-100)`, as in PyTorch; `None` ignores nothing).
    pub ignore_index: Option<i64>,
    /// A weight per class, `[C]`, floating-point (default none: all 1).
    pub weight: Option<Tensor>,
}

impl Default for CrossEntropyOptions {
    fn default() -> CrossEntropyOptions {
        CrossEntropyOptions { reduction: Reduction::Mean, label_smoothing: 0.0, ignore_index: Some(-100), weight: None }
    }
}

/// Options of [`nll_loss_with`](super::nll_loss_with), PyTorch's keyword
/// arguments with their defaults.
#[derive(Clone, Debug)]
pub struct NllLossOptions {
    /// How the per-position losses are combined (default [`Reduction::Mean`]).
    pub reduction: Reduction,
    /// Targets equal to this contribute nothing (default `Some(-100)`).
    pub ignore_index: Option<i64>,
    /// A weight per class, `[C]`, floating-point (default none).
    pub weight: Option<Tensor>,
}

impl Default for NllLossOptions {
    fn default() -> NllLossOptions {
        NllLossOptions { reduction: Reduction::Mean, ignore_index: Some(-100), weight: None }
    }
}

/// Options of
/// [`binary_cross_entropy_with_logits_with`](super::binary_cross_entropy_with_logits_with),
/// PyTorch's keyword arguments with their defaults (no weights, the mean).
#[derive(Clone, Debug, Default)]
pub struct BceWithLogitsOptions {
    /// How the per-element losses are combined.
    pub reduction: Reduction,
    /// A per-element rescaling of the loss (PyTorch's `weight`), broadcast
    /// to the logits' shape; a constant.
    pub weight: Option<Tensor>,
    /// The weight of positive examples (PyTorch's `pos_weight`), broadcast
    /// to the logits' shape (typically `[classes]`); a constant.
    pub pos_weight: Option<Tensor>,
}
