//! Targets checked against their input, and what the class-index losses
//! share: [`check_pair`] for losses between two tensors of one shape
//! (regression, binary cross entropy), [`Targets`] for class indices (cross
//! entropy, NLL: ranges, `ignore_index`, class weights, the mean's
//! denominator, per-position coefficients), an unbatched `[C]` input run as
//! a batch of one, and [`finish`] for the reduction of per-position values.

use super::options::Reduction;
use crate::error::{NnError, Result};
use brasa_autograd::{op_names, Var};
use brasa_tensor::{DType, Device, Tensor};

/// Runs a class-index loss on an unbatched `[C]` input with a `[]` target
/// as a batch of one (PyTorch accepts both).
pub(super) fn unbatched(
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
pub(super) fn check_pair(what: &'static str, input: &Var, target: &Var) -> Result<()> {
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

/// Class-index targets read and checked once, with what the class-index
/// losses need per position (a position is a sample and its `d1, ...`).
pub(super) struct Targets {
    /// The indices with ignored ones replaced by 0, `[N, 1, d1, ...]`.
    pub(super) index: Tensor,
    /// `w[y]` per position (1 without class weights), 0 where ignored.
    pub(super) class_weight: Vec<f64>,
    /// Whether each position counts (its target is not ignored).
    pub(super) counted: Vec<bool>,
    /// `Σ_n w[y_n]` over counted positions: the mean's denominator.
    pub(super) total_weight: f64,
    /// `Σ_c w_c` (`C` without class weights).
    pub(super) weight_sum: f64,
    /// The number of classes.
    pub(super) classes: usize,
    /// `[N, 1, d1, ...]`.
    keep_dims: Vec<usize>,
    device: Device,
}

impl Targets {
    pub(super) fn new(
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
                    if what == op_names::CROSS_ENTROPY {
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
    pub(super) fn scale(&self, reduction: Reduction) -> f64 {
        match reduction {
            Reduction::Mean => 1.0 / self.total_weight,
            Reduction::Sum | Reduction::None => 1.0,
        }
    }

    /// Per-position values as a `[N, 1, d1, ...]` tensor of `dtype`.
    pub(super) fn per_position(&self, values: Vec<f64>, dtype: DType) -> Result<Tensor> {
        Ok(Tensor::from_vec_on(values, self.keep_dims.clone(), self.device)?.to_dtype(dtype)?)
    }

    /// A bool mask of counted positions, or `None` when all count.
    pub(super) fn counted_mask(&self) -> Result<Option<Tensor>> {
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
pub(super) fn finish(
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
pub(super) fn grad_factor(grad: &Tensor, reduction: Reduction) -> brasa_autograd::Result<Tensor> {
    Ok(match reduction {
        Reduction::None => grad.unsqueeze(1)?,
        Reduction::Sum | Reduction::Mean => grad.clone(),
    })
}

/// The error of a loss node whose forward ran a second time (its
/// tensors were moved out by the first).
pub(super) fn missing(op: &'static str) -> brasa_autograd::AutogradError {
    brasa_autograd::AutogradError::Invalid { op, message: "internal error: forward ran twice".into() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinates_unravel_row_major() {
        assert_eq!(coordinates(&[2, 3], 4), [1, 1]);
        assert_eq!(coordinates(&[4], 3), [3]);
    }
}
