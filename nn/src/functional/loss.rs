//! Losses, with PyTorch's formulas and defaults (`torch.nn.functional`):
//! [`cross_entropy`] (class weights, label smoothing, `ignore_index`; class
//! probability targets are in `cross_entropy_probs.rs`),
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
//! hook (`brasa_autograd::autocast_inputs`, under the names
//! `cross_entropy`, `nll_loss`, `mse_loss`, `l1_loss` and
//! `binary_cross_entropy_with_logits`), so under `brasa_amp::autocast` the
//! losses compute in f32 as PyTorch's do.
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

use crate::error::{NnError, Result};
use brasa_autograd::{apply, autocast_inputs, is_grad_enabled, Function, FunctionCtx, Var};
use brasa_tensor::{broadcast_shapes, DType, Device, Tensor};

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

/// Options of [`cross_entropy_with`], PyTorch's keyword arguments with
/// their defaults.
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

/// Options of [`nll_loss_with`], PyTorch's keyword arguments with their defaults.
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

/// Cross entropy between `logits` (`[N, C]`, `[N, C, d1, ...]` or `[C]`,
/// unnormalised) and class indices `target` (`i64`, `[N]`, `[N, d1, ...]`
/// or `[]`), averaged over the targets, with PyTorch's defaults (`-100` is
/// ignored); or class probabilities of the logits' shape (a floating-point
/// `target`, see [`crate::functional::cross_entropy_probs`]). See
/// [`cross_entropy_with`].
pub fn cross_entropy(logits: &Var, target: &Tensor) -> Result<Var> {
    cross_entropy_with(logits, target, &CrossEntropyOptions::default())
}

/// Cross entropy with options, exactly as PyTorch's `F.cross_entropy` with
/// class-index targets. Per position `n` with target `y` (weights `w`, all 1
/// without `weight`; `ε` the label smoothing; `C` classes):
///
/// `loss_n = −(1 − ε)·w_y·log p_y − (ε/C)·Σ_c w_c·log p_c`, 0 where `y` is ignored;
///
/// `Mean` divides the sum by `Σ_n w_{y_n}` over the positions not ignored
/// (NaN when there are none, as in PyTorch). Errors name the problem: a
/// target out of `0..C`, shapes that do not fit, a non-float `logits`, a
/// non-`i64` target.
///
/// A floating-point `target` holds class probabilities instead (of the
/// logits' shape), as in PyTorch: see [`crate::functional::cross_entropy_probs`],
/// which this calls with the target as a constant.
pub fn cross_entropy_with(logits: &Var, target: &Tensor, options: &CrossEntropyOptions) -> Result<Var> {
    const WHAT: &str = "cross_entropy";
    if target.dtype().is_float() {
        return crate::functional::cross_entropy_probs(logits, &Var::new(target.clone()), options);
    }
    if let Some(c) = autocast_inputs(WHAT, &[logits])? {
        return cross_entropy_with(&c[0], target, options);
    }
    let epsilon = options.label_smoothing;
    if !(0.0..=1.0).contains(&epsilon) {
        return Err(NnError::invalid(WHAT, format!("label_smoothing must be in [0, 1], got {epsilon}")));
    }
    if logits.rank() == 1 {
        return unbatched(WHAT, logits, target, options.reduction, |x, t| cross_entropy_with(x, t, options));
    }
    let targets = Targets::new(WHAT, logits.tensor(), target, options.weight.as_ref(), options.ignore_index)?;
    let dtype = logits.dtype();
    let classes = targets.classes as f64;
    let keep = epsilon * targets.weight_sum / classes;
    // Forward coefficients: the picked log-probability's and the smoothing sum's.
    let pick: Vec<f64> = targets.class_weight.iter().map(|w| (1.0 - epsilon) * w).collect();
    let smooth: Vec<f64> = targets.counted.iter().map(|&c| if c { epsilon / classes } else { 0.0 }).collect();
    let smoothing = match (epsilon > 0.0, &options.weight) {
        (false, _) => Smoothing::Off,
        (true, None) => Smoothing::Uniform,
        (true, Some(_)) => Smoothing::Weighted,
    };
    let weight_view = match (&smoothing, &options.weight) {
        (Smoothing::Weighted, Some(w)) => Some(class_view(w, logits.rank(), dtype)?),
        _ => None,
    };
    let backward = if is_grad_enabled() && logits.requires_grad() {
        // dL/dx = G·(A·softmax − B·one_hot − S·w) with G the output's gradient.
        let scale = targets.scale(options.reduction);
        let a: Vec<f64> =
            pick.iter().zip(&targets.counted).map(|(b, &c)| if c { scale * (b + keep) } else { 0.0 }).collect();
        let mut tensors = vec![targets.per_position(a, dtype)?];
        if !matches!(smoothing, Smoothing::Off) {
            tensors.push(targets.per_position(pick.iter().map(|b| scale * b).collect(), dtype)?);
            tensors.push(targets.per_position(smooth.iter().map(|s| scale * s).collect(), dtype)?);
        }
        tensors.extend(weight_view.clone());
        Some(tensors)
    } else {
        None
    };
    let function = CrossEntropy {
        reduction: options.reduction,
        smoothing,
        inverse_total: 1.0 / targets.total_weight,
        pick: Some(targets.per_position(pick, dtype)?),
        smooth: if epsilon > 0.0 { Some(targets.per_position(smooth, dtype)?) } else { None },
        counted: targets.counted_mask()?,
        weight_view,
        index: Some(targets.index),
        backward,
    };
    Ok(apply(function, &[logits])?)
}

/// The negative log-likelihood of class indices `target` under `log_probs`
/// (`[N, C]`, `[N, C, d1, ...]` or `[C]`; usually a log-softmax), averaged,
/// with PyTorch's defaults. See [`nll_loss_with`].
pub fn nll_loss(log_probs: &Var, target: &Tensor) -> Result<Var> {
    nll_loss_with(log_probs, target, &NllLossOptions::default())
}

/// PyTorch's `F.nll_loss`: `loss_n = −w_y·input[n, y]` (0 where `y` is
/// ignored); `Mean` divides the sum by `Σ_n w_{y_n}` over the positions not
/// ignored. Checks as [`cross_entropy_with`] does.
pub fn nll_loss_with(log_probs: &Var, target: &Tensor, options: &NllLossOptions) -> Result<Var> {
    const WHAT: &str = "nll_loss";
    if let Some(c) = autocast_inputs(WHAT, &[log_probs])? {
        return nll_loss_with(&c[0], target, options);
    }
    if log_probs.rank() == 1 {
        return unbatched(WHAT, log_probs, target, options.reduction, |x, t| nll_loss_with(x, t, options));
    }
    let targets = Targets::new(WHAT, log_probs.tensor(), target, options.weight.as_ref(), options.ignore_index)?;
    let dtype = log_probs.dtype();
    let backward = if is_grad_enabled() && log_probs.requires_grad() {
        let scale = targets.scale(options.reduction);
        let a = targets.class_weight.iter().zip(&targets.counted).map(|(w, &c)| if c { scale * w } else { 0.0 });
        Some(targets.per_position(a.collect(), dtype)?)
    } else {
        None
    };
    let function = NllLoss {
        reduction: options.reduction,
        inverse_total: 1.0 / targets.total_weight,
        pick: Some(targets.per_position(targets.class_weight.clone(), dtype)?),
        counted: targets.counted_mask()?,
        index: Some(targets.index),
        backward,
        input_dims: log_probs.dims().to_vec(),
    };
    Ok(apply(function, &[log_probs])?)
}

/// Mean squared error `(input − target)²`, reduced (PyTorch's `F.mse_loss`).
/// Both must have the same shape and dtype (PyTorch only warns about a
/// broadcast here; it is nearly always a bug, so it is an error). Gradients
/// flow to both.
pub fn mse_loss(input: &Var, target: &Var, reduction: Reduction) -> Result<Var> {
    if let Some(c) = autocast_inputs("mse_loss", &[input, target])? {
        return mse_loss(&c[0], &c[1], reduction);
    }
    check_pair("mse_loss", input, target)?;
    let diff = input.sub(target)?;
    reduce(&diff.mul(&diff)?, reduction)
}

/// Mean absolute error `|input − target|`, reduced (PyTorch's `F.l1_loss`;
/// the gradient at 0 is 0). Same checks as [`mse_loss`].
pub fn l1_loss(input: &Var, target: &Var, reduction: Reduction) -> Result<Var> {
    if let Some(c) = autocast_inputs("l1_loss", &[input, target])? {
        return l1_loss(&c[0], &c[1], reduction);
    }
    check_pair("l1_loss", input, target)?;
    reduce(&input.sub(target)?.abs()?, reduction)
}

/// Binary cross entropy on logits (PyTorch's
/// `F.binary_cross_entropy_with_logits`), in the numerically stable form
/// `loss = (1 − t)·x − (1 + (pos_weight − 1)·t)·log σ(x)` with
/// `log σ(x) = min(x, 0) − log1p(e^−|x|)`: no overflow for large `|x|`.
/// `target` (probabilities, the shape and dtype of `logits`) may require
/// grad too; `pos_weight` (the weight of positive examples, broadcast to
/// `logits`, typically `[classes]`) is a constant. For PyTorch's `weight`
/// (a per-element rescaling) see [`binary_cross_entropy_with_logits_with`].
pub fn binary_cross_entropy_with_logits(
    logits: &Var,
    target: &Var,
    reduction: Reduction,
    pos_weight: Option<&Tensor>,
) -> Result<Var> {
    let options = BceWithLogitsOptions { reduction, weight: None, pos_weight: pos_weight.cloned() };
    binary_cross_entropy_with_logits_with(logits, target, &options)
}

/// Options of [`binary_cross_entropy_with_logits_with`], PyTorch's keyword
/// arguments with their defaults (no weights, the mean).
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

/// [`binary_cross_entropy_with_logits`] with PyTorch's `weight` as well as
/// `pos_weight`:
/// `loss = −w·[pos_weight·t·log σ(x) + (1 − t)·log(1 − σ(x))]`, computed
/// in the stable form `w·[(1 − t)·x − (1 + (pos_weight − 1)·t)·log σ(x)]`
/// and then reduced (the mean divides by the number of elements, not by the
/// weights' sum, as in PyTorch). Each weight must be floating-point, on the
/// logits' device and broadcast to their shape; an error says which does not.
///
/// ```
/// use brasa_autograd::Var;
/// use brasa_nn::functional::{binary_cross_entropy_with_logits_with, BceWithLogitsOptions, Reduction};
/// use brasa_tensor::Tensor;
/// let x = Var::param(Tensor::from_vec(vec![0.0f64, 0.0], [2])?)?;
/// let t = Var::new(Tensor::from_vec(vec![1.0f64, 0.0], [2])?);
/// let options = BceWithLogitsOptions {
///     reduction: Reduction::None,
///     weight: Some(Tensor::from_vec(vec![2.0f64, 0.5], [2])?),
///     ..Default::default()
/// };
/// let loss = binary_cross_entropy_with_logits_with(&x, &t, &options)?;
/// let ln2 = std::f64::consts::LN_2;
/// assert_eq!(loss.tensor().to_vec::<f64>()?, [2.0 * ln2, 0.5 * ln2]);
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
pub fn binary_cross_entropy_with_logits_with(
    logits: &Var,
    target: &Var,
    options: &BceWithLogitsOptions,
) -> Result<Var> {
    const WHAT: &str = "binary_cross_entropy_with_logits";
    if let Some(c) = autocast_inputs(WHAT, &[logits, target])? {
        return binary_cross_entropy_with_logits_with(&c[0], &c[1], options);
    }
    check_pair(WHAT, logits, target)?;
    let constant = |name: &str, w: &Tensor| -> Result<Tensor> {
        if !w.dtype().is_float() {
            return Err(NnError::invalid(WHAT, format!("{name} must be floating-point, got {}", w.dtype())));
        }
        if w.device() != logits.device() {
            return Err(NnError::invalid(
                WHAT,
                format!("{name} is on {}, the logits on {}", w.device(), logits.device()),
            ));
        }
        let fits = broadcast_shapes(w.shape(), logits.shape()).is_ok_and(|s| s.dims() == logits.dims());
        if !fits {
            return Err(NnError::invalid(
                WHAT,
                format!("{name} of shape {:?} does not broadcast to the logits' shape {:?}", w.dims(), logits.dims()),
            ));
        }
        Ok(w.to_dtype(logits.dtype())?)
    };
    let pos_weight_minus_one = match &options.pos_weight {
        None => None,
        Some(w) => Some(constant("pos_weight", w)?.add_scalar(-1.0)?),
    };
    let weight = options.weight.as_ref().map(|w| constant("weight", w)).transpose()?;
    let numel = logits.numel();
    let node = BceWithLogits { reduction: options.reduction, numel, pos_weight_minus_one, weight };
    Ok(apply(node, &[logits, target])?)
}

// ----- shared checks and helpers -------------------------------------------------

/// Runs a class-index loss on an unbatched `[C]` input with a `[]` target
/// as a batch of one (PyTorch accepts both).
fn unbatched(
    what: &'static str,
    input: &Var,
    target: &Tensor,
    reduction: Reduction,
    loss: impl FnOnce(&Var, &Tensor) -> Result<Var>,
) -> Result<Var> {
    if target.rank() != 0 {
        return Err(NnError::invalid(
            what,
            format!("an unbatched input of shape {:?} needs a 0-d target, got shape {:?}", input.dims(), target.dims()),
        ));
    }
    let out = loss(&input.unsqueeze(0)?, &target.unsqueeze(0)?)?;
    Ok(if reduction == Reduction::None { out.squeeze(0)? } else { out })
}

/// Same shape, same float dtype, same device.
fn check_pair(what: &'static str, input: &Var, target: &Var) -> Result<()> {
    if !input.dtype().is_float() {
        return Err(NnError::invalid(what, format!("the input must be floating-point, got {}", input.dtype())));
    }
    if input.dtype() != target.dtype() {
        return Err(NnError::invalid(
            what,
            format!("the input is {} but the target {}; convert one of them", input.dtype(), target.dtype()),
        ));
    }
    if input.dims() != target.dims() {
        return Err(NnError::invalid(
            what,
            format!("the input has shape {:?} but the target {:?}; they must match", input.dims(), target.dims()),
        ));
    }
    if input.device() != target.device() {
        return Err(NnError::invalid(
            what,
            format!("the input is on {} but the target on {}", input.device(), target.device()),
        ));
    }
    Ok(())
}

fn reduce(loss: &Var, reduction: Reduction) -> Result<Var> {
    Ok(match reduction {
        Reduction::Mean => loss.mean_all()?,
        Reduction::Sum => loss.sum_all()?,
        Reduction::None => loss.clone(),
    })
}

/// `weight` (`[C]`) as `[1, C, 1, ...]` of `rank` dims in `dtype`.
fn class_view(weight: &Tensor, rank: usize, dtype: DType) -> Result<Tensor> {
    let mut shape = vec![1isize; rank];
    shape[1] = weight.numel() as isize;
    Ok(weight.to_dtype(dtype)?.reshape(&shape)?)
}

/// Class-index targets read and checked once, with what the class-index
/// losses need per position (a position is a sample and its `d1, ...`).
struct Targets {
    /// The indices with ignored ones replaced by 0, `[N, 1, d1, ...]`.
    index: Tensor,
    /// `w[y]` per position (1 without class weights), 0 where ignored.
    class_weight: Vec<f64>,
    /// Whether each position counts (its target is not ignored).
    counted: Vec<bool>,
    /// `Σ_n w[y_n]` over counted positions: the mean's denominator.
    total_weight: f64,
    /// `Σ_c w_c` (`C` without class weights).
    weight_sum: f64,
    /// The number of classes.
    classes: usize,
    /// `[N, 1, d1, ...]`.
    keep_dims: Vec<usize>,
    device: Device,
}

impl Targets {
    fn new(
        what: &'static str,
        input: &Tensor,
        target: &Tensor,
        weight: Option<&Tensor>,
        ignore_index: Option<i64>,
    ) -> Result<Targets> {
        if !input.dtype().is_float() {
            return Err(NnError::invalid(what, format!("the input must be floating-point, got {}", input.dtype())));
        }
        if input.rank() < 2 {
            return Err(NnError::invalid(
                what,
                format!("the input must be [N, C], [N, C, d1, ...] or [C], got shape {:?}", input.dims()),
            ));
        }
        if target.dtype() != DType::I64 {
            return Err(NnError::invalid(
                what,
                format!(
                    "the target must hold class indices as i64, got {} ({})",
                    target.dtype(),
                    if what == "cross_entropy" {
                        "or class probabilities: a floating-point tensor of the input's shape"
                    } else {
                        "class-probability targets are not supported"
                    }
                ),
            ));
        }
        if target.device() != input.device() {
            return Err(NnError::invalid(
                what,
                format!("the input is on {} but the target on {}", input.device(), target.device()),
            ));
        }
        let dims = input.dims();
        let classes = dims[1];
        let mut expected = vec![dims[0]];
        expected.extend_from_slice(&dims[2..]);
        if target.dims() != expected.as_slice() {
            return Err(NnError::invalid(
                what,
                format!(
                    "a target of shape {:?} does not fit an input of shape {:?} (expected target shape {:?})",
                    target.dims(),
                    dims,
                    expected
                ),
            ));
        }
        if classes == 0 {
            return Err(NnError::invalid(what, format!("the input has no classes (shape {dims:?})")));
        }
        let class_weights = match weight {
            None => None,
            Some(w) => {
                if w.dims() != [classes] || !w.dtype().is_float() {
                    return Err(NnError::invalid(
                        what,
                        format!(
                            "weight must be a floating-point tensor of shape [{classes}] (one per class), got {} {:?}",
                            w.dtype(),
                            w.dims()
                        ),
                    ));
                }
                if w.device() != input.device() {
                    return Err(NnError::invalid(
                        what,
                        format!("weight is on {}, the input on {}", w.device(), input.device()),
                    ));
                }
                if w.device().is_meta() {
                    // A memory plan has no values; the weights only scale the loss.
                    Some(vec![1.0; classes])
                } else {
                    Some(w.to_dtype(DType::F64)?.to_vec::<f64>()?)
                }
            }
        };
        let values = if target.device().is_meta() {
            // A memory plan has no target values: it assumes every target is
            // a class in range that counts (none is `ignore_index`), which is
            // what decides the allocations below.
            vec![0; target.numel()]
        } else {
            target.to_vec::<i64>()?
        };
        let mut safe = Vec::with_capacity(values.len());
        let mut class_weight = Vec::with_capacity(values.len());
        let mut counted = Vec::with_capacity(values.len());
        let mut total_weight = 0.0;
        for (position, &t) in values.iter().enumerate() {
            if Some(t) == ignore_index {
                safe.push(0);
                class_weight.push(0.0);
                counted.push(false);
                continue;
            }
            let Some(class) = usize::try_from(t).ok().filter(|&c| c < classes) else {
                return Err(NnError::invalid(
                    what,
                    format!(
                        "target {t} at {:?} is out of range for {classes} classes{}",
                        coordinates(target.dims(), position),
                        match ignore_index {
                            Some(i) => format!(" (and is not the ignore_index {i})"),
                            None => String::new(),
                        }
                    ),
                ));
            };
            let w = class_weights.as_ref().map_or(1.0, |w| w[class]);
            safe.push(t);
            class_weight.push(w);
            counted.push(true);
            total_weight += w;
        }
        let weight_sum = class_weights.as_ref().map_or(classes as f64, |w| w.iter().sum());
        let mut keep_dims = dims.to_vec();
        keep_dims[1] = 1;
        let index = Tensor::from_vec_on(safe, keep_dims.clone(), input.device())?;
        Ok(Targets {
            index,
            class_weight,
            counted,
            total_weight,
            weight_sum,
            classes,
            keep_dims,
            device: input.device(),
        })
    }

    /// The factor a reduction puts on each position's loss.
    fn scale(&self, reduction: Reduction) -> f64 {
        match reduction {
            Reduction::Mean => 1.0 / self.total_weight,
            Reduction::Sum | Reduction::None => 1.0,
        }
    }

    /// Per-position values as a `[N, 1, d1, ...]` tensor of `dtype`.
    fn per_position(&self, values: Vec<f64>, dtype: DType) -> Result<Tensor> {
        Ok(Tensor::from_vec_on(values, self.keep_dims.clone(), self.device)?.to_dtype(dtype)?)
    }

    /// A bool mask of counted positions, or `None` when all count.
    fn counted_mask(&self) -> Result<Option<Tensor>> {
        if self.counted.iter().all(|&c| c) {
            return Ok(None);
        }
        Ok(Some(Tensor::from_vec_on(self.counted.clone(), self.keep_dims.clone(), self.device)?))
    }
}

/// The coordinates of row-major position `flat` in `dims`.
fn coordinates(dims: &[usize], mut flat: usize) -> Vec<usize> {
    let mut at = vec![0; dims.len()];
    for (slot, &size) in at.iter_mut().zip(dims).rev() {
        *slot = flat % size.max(1);
        flat /= size.max(1);
    }
    at
}

/// Finishes a class-index loss from its `[N, 1, d1, ...]` per-position
/// values (with the minus sign still to apply): zeroes ignored positions
/// (their input may be anything, even -inf), then reduces.
fn finish(
    per_position: Tensor,
    counted: Option<&Tensor>,
    reduction: Reduction,
    inverse_total: f64,
) -> brasa_autograd::Result<Tensor> {
    let values = match counted {
        Some(mask) => mask.where_cond(&per_position, &per_position.new_zeros([])?)?,
        None => per_position,
    };
    Ok(match reduction {
        Reduction::None => {
            values.neg_()?;
            values.squeeze(1)?
        }
        Reduction::Sum => values.sum_all()?.neg()?,
        // 0/0 is NaN when nothing counts, as in PyTorch.
        Reduction::Mean => values.sum_all()?.mul_scalar(-inverse_total)?,
    })
}

/// The output gradient as a factor of the `[N, 1, d1, ...]` coefficients.
fn grad_factor(grad: &Tensor, reduction: Reduction) -> brasa_autograd::Result<Tensor> {
    Ok(match reduction {
        Reduction::None => grad.unsqueeze(1)?,
        Reduction::Sum | Reduction::Mean => grad.clone(),
    })
}

fn missing(op: &'static str) -> brasa_autograd::AutogradError {
    brasa_autograd::AutogradError::Invalid { op, message: "internal error: forward ran twice".into() }
}

// ----- cross entropy -------------------------------------------------------------

/// How the label smoothing term enters the gradient.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Smoothing {
    /// `ε = 0`.
    Off,
    /// `ε > 0`, no class weights: `− S·1`.
    Uniform,
    /// `ε > 0` with class weights: `− S·w`.
    Weighted,
}

/// The cross-entropy node. The tensors are moved into the forward, which
/// saves the backward's through the context (so they are released after
/// backward, as every op's are).
struct CrossEntropy {
    reduction: Reduction,
    smoothing: Smoothing,
    /// `1 / Σ w[y]`, for the mean.
    inverse_total: f64,
    /// `(1 − ε)·w[y]` per position.
    pick: Option<Tensor>,
    /// `ε/C` per counted position (with label smoothing).
    smooth: Option<Tensor>,
    counted: Option<Tensor>,
    /// The class weights as `[1, C, 1, ...]` (weighted smoothing only).
    weight_view: Option<Tensor>,
    index: Option<Tensor>,
    /// `[A, B, S, w]` (`[A]` without smoothing), scaled for the reduction;
    /// `None` when no gradient is needed.
    backward: Option<Vec<Tensor>>,
}

impl Function for CrossEntropy {
    fn name(&self) -> &'static str {
        "cross_entropy"
    }

    fn forward(&mut self, ctx: &mut FunctionCtx, inputs: &[Tensor]) -> brasa_autograd::Result<Tensor> {
        let logits = &inputs[0];
        let index = self.index.take().ok_or_else(|| missing("cross_entropy"))?;
        let pick = self.pick.take().ok_or_else(|| missing("cross_entropy"))?;
        let log_probs = logits.log_softmax(1)?;
        let per_position = log_probs.gather(1, &index)?;
        per_position.mul_(&pick)?;
        if let Some(smooth) = self.smooth.take() {
            let total = match &self.weight_view {
                Some(w) => log_probs.mul(w)?.sum(&[1], true)?,
                None => log_probs.sum(&[1], true)?,
            };
            per_position.addcmul_(1.0, &total, &smooth)?;
        }
        drop(log_probs);
        if let Some(backward) = self.backward.take() {
            ctx.save_for_backward(logits);
            ctx.save_for_backward(&index);
            backward.iter().for_each(|t| ctx.save_for_backward(t));
        }
        self.weight_view = None;
        finish(per_position, self.counted.take().as_ref(), self.reduction, self.inverse_total)
    }

    fn backward(
        &mut self,
        saved: &[Tensor],
        grad: &Tensor,
        needs: &[bool],
    ) -> brasa_autograd::Result<Vec<Option<Tensor>>> {
        if !needs.first().copied().unwrap_or(false) {
            return Ok(vec![None]);
        }
        let (logits, index, a) = (&saved[0], &saved[1], &saved[2]);
        let factor = grad_factor(grad, self.reduction)?;
        let out = logits.softmax(1)?;
        let scaled = a.mul(&factor)?;
        out.mul_(&scaled)?;
        if self.smoothing == Smoothing::Off {
            // B = A: subtract it at the target.
            scaled.neg_()?;
            out.scatter_add_(1, index, &scaled)?;
        } else {
            let at_target = saved[3].mul(&factor)?;
            at_target.neg_()?;
            out.scatter_add_(1, index, &at_target)?;
            let spread = saved[4].mul(&factor)?;
            match self.smoothing {
                Smoothing::Weighted => out.addcmul_(-1.0, &spread, &saved[5])?,
                _ => out.sub_(&spread)?,
            }
        }
        Ok(vec![Some(out)])
    }
}

// ----- negative log-likelihood ---------------------------------------------------

/// The NLL node: saves only the indices and one coefficient per position
/// (its gradient is a scatter into zeros, which needs no input values).
struct NllLoss {
    reduction: Reduction,
    inverse_total: f64,
    /// `w[y]` per position.
    pick: Option<Tensor>,
    counted: Option<Tensor>,
    index: Option<Tensor>,
    /// `w[y]` scaled for the reduction, when a gradient is needed.
    backward: Option<Tensor>,
    input_dims: Vec<usize>,
}

impl Function for NllLoss {
    fn name(&self) -> &'static str {
        "nll_loss"
    }

    fn forward(&mut self, ctx: &mut FunctionCtx, inputs: &[Tensor]) -> brasa_autograd::Result<Tensor> {
        let index = self.index.take().ok_or_else(|| missing("nll_loss"))?;
        let pick = self.pick.take().ok_or_else(|| missing("nll_loss"))?;
        let per_position = inputs[0].gather(1, &index)?;
        per_position.mul_(&pick)?;
        if let Some(backward) = self.backward.take() {
            ctx.save_for_backward(&index);
            ctx.save_for_backward(&backward);
        }
        finish(per_position, self.counted.take().as_ref(), self.reduction, self.inverse_total)
    }

    fn backward(
        &mut self,
        saved: &[Tensor],
        grad: &Tensor,
        needs: &[bool],
    ) -> brasa_autograd::Result<Vec<Option<Tensor>>> {
        if !needs.first().copied().unwrap_or(false) {
            return Ok(vec![None]);
        }
        let (index, a) = (&saved[0], &saved[1]);
        let scaled = a.mul(&grad_factor(grad, self.reduction)?)?;
        scaled.neg_()?;
        let out = scaled.new_zeros(self.input_dims.clone())?;
        out.scatter_add_(1, index, &scaled)?;
        Ok(vec![Some(out)])
    }
}

// ----- binary cross entropy with logits ------------------------------------------

/// The BCE-with-logits node: saves the logits and targets it was given.
struct BceWithLogits {
    reduction: Reduction,
    numel: usize,
    /// `pos_weight − 1`, in the logits' dtype.
    pos_weight_minus_one: Option<Tensor>,
    /// The per-element `weight`, in the logits' dtype: it scales the loss
    /// and so both gradients.
    weight: Option<Tensor>,
}

impl Function for BceWithLogits {
    fn name(&self) -> &'static str {
        "binary_cross_entropy_with_logits"
    }

    fn forward(&mut self, ctx: &mut FunctionCtx, inputs: &[Tensor]) -> brasa_autograd::Result<Tensor> {
        let (x, t) = (&inputs[0], &inputs[1]);
        let log_sigmoid = x.affine(1.0, 0.0)?;
        log_sigmoid.log_sigmoid_()?;
        // (1 − t)·x − (1 + (pw − 1)·t)·log σ(x)
        let loss = t.affine(-1.0, 1.0)?;
        loss.mul_(x)?;
        match &self.pos_weight_minus_one {
            Some(pw1) => {
                let log_weight = t.mul(pw1)?;
                log_weight.add_scalar_(1.0)?;
                loss.addcmul_(-1.0, &log_weight, &log_sigmoid)?;
            }
            None => loss.sub_(&log_sigmoid)?,
        }
        if let Some(w) = &self.weight {
            loss.mul_(w)?;
        }
        ctx.save_for_backward(x);
        ctx.save_for_backward(t);
        Ok(match self.reduction {
            Reduction::None => loss,
            Reduction::Sum => loss.sum_all()?,
            Reduction::Mean => loss.mean_all()?,
        })
    }

    fn backward(
        &mut self,
        saved: &[Tensor],
        grad: &Tensor,
        needs: &[bool],
    ) -> brasa_autograd::Result<Vec<Option<Tensor>>> {
        let (x, t) = (&saved[0], &saved[1]);
        let factor = match self.reduction {
            Reduction::Mean => grad.mul_scalar(1.0 / self.numel as f64)?,
            Reduction::Sum | Reduction::None => grad.clone(),
        };
        // The weight scales every element's loss, so both gradients too.
        let factor = match &self.weight {
            Some(w) => factor.mul(w)?,
            None => factor,
        };
        let grad_x = if needs.first().copied().unwrap_or(false) {
            let g = match &self.pos_weight_minus_one {
                // σ(x) − t
                None => {
                    let g = x.sigmoid()?;
                    g.sub_(t)?;
                    g
                }
                // (1 − t) − (1 + (pw − 1)·t)·σ(−x)
                Some(pw1) => {
                    let log_weight = t.mul(pw1)?;
                    log_weight.add_scalar_(1.0)?;
                    let g = x.neg()?;
                    g.sigmoid_()?;
                    g.mul_(&log_weight)?;
                    g.affine_(-1.0, 1.0)?;
                    g.sub_(t)?;
                    g
                }
            };
            g.mul_(&factor)?;
            Some(g)
        } else {
            None
        };
        let grad_t = if needs.get(1).copied().unwrap_or(false) {
            // −x − (pw − 1)·log σ(x)
            let g = match &self.pos_weight_minus_one {
                None => x.neg()?,
                Some(pw1) => {
                    let g = x.affine(1.0, 0.0)?;
                    g.log_sigmoid_()?;
                    let g = g.mul(pw1)?;
                    g.add_(x)?;
                    g.neg_()?;
                    g
                }
            };
            g.mul_(&factor)?;
            Some(g)
        } else {
            None
        };
        Ok(vec![grad_x, grad_t])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinates_unravel_row_major() {
        assert_eq!(coordinates(&[2, 3], 4), [1, 1]);
        assert_eq!(coordinates(&[4], 3), [3]);
    }

    #[test]
    fn cross_entropy_saves_the_logits_and_small_tensors_only() -> Result<()> {
        let logits = Var::param(Tensor::randn([64, 100], DType::F32)?)?;
        let target = Tensor::from_vec((0..64).map(|i| i % 100).collect::<Vec<i64>>(), [64])?;
        let loss = cross_entropy(&logits, &target)?;
        let stats = loss.graph_stats();
        // The logits (shared with the input, 64·100·4 bytes) plus index and one
        // coefficient per sample: no log-softmax buffer is kept.
        assert!(stats.saved_bytes <= 64 * 100 * 4 + 64 * 8 + 64 * 4 + 2048, "{stats:?}");
        Ok(())
    }

    #[test]
    fn no_graph_and_no_backward_coefficients_without_grad() -> Result<()> {
        let logits = Var::new(Tensor::randn([4, 3], DType::F32)?);
        let target = Tensor::from_vec(vec![0i64, 1, 2, 0], [4])?;
        let loss = cross_entropy(&logits, &target)?;
        assert!(!loss.requires_grad());
        Ok(())
    }
}
