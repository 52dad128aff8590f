//! Batch, layer and group normalisation (PyTorch's `F.batch_norm`,
//! `F.layer_norm` and `F.group_norm`). Batch and layer norm are each one
//! custom autograd [`Function`]: the forward
//! normalises on tensors and saves only the input and the per-channel (or
//! per-row) mean and inverse standard deviation; the backward is the closed
//! form, so a normalisation costs a few passes over memory and one saved
//! input rather than a graph of a dozen elementwise ops. Layer norm runs on
//! the device's fused kernels (`Tensor::native_layer_norm` and its
//! backward): one pass per row each way; batch norm on its fused
//! per-channel passes (`Tensor::batch_norm_stats`, `batch_norm_elemt` and
//! the two backward passes), which read a half-precision input as it is.
//!
//! f16 and bf16 inputs are normalised in f32 and the output converted back,
//! and their `weight` and `bias` may be f32 (a half-precision model keeps its
//! norms in f32: `brasa_amp::to_half`). They ask the precision hook first
//! (`brasa_autograd::autocast_inputs`, as `batch_norm`, `layer_norm` and
//! `group_norm`), so under `brasa_amp::autocast` they take and return f32
//! where its policy says so (batch norm on the host follows its input: a
//! half input is normalised in f32 here and saved as it is).
//! Group norm is layer norm of each group's slice followed by a per-channel
//! affine transform, so it reuses layer norm's closed-form backward.
//!
//! ```
//! use brasa_nn::functional::{batch_norm, layer_norm};
//! use brasa_autograd::Var;
//! use brasa_tensor::{DType, Tensor};
//!
//! let x = Var::new(Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], [2, 2])?);
//! // Batch statistics per column: means (2, 3), biased variances (1, 1).
//! let y = batch_norm(&x, None, None, None, None, true, 0.1, 0.0)?;
//! assert_eq!(y.tensor().to_vec::<f64>()?, [-1.0, -1.0, 1.0, 1.0]);
//! // Per-row statistics over the last dim.
//! let z = layer_norm(&x, &[2], None, None, 0.0)?;
//! assert_eq!(z.tensor().to_vec::<f64>()?, [-1.0, 1.0, -1.0, 1.0]);
//! # Ok::<(), brasa_nn::NnError>(())
//! ```

use crate::error::{NnError, Result};
use brasa_autograd::{apply, autocast_inputs, op_names, Function, FunctionCtx, Var};
use brasa_tensor::{DType, Tensor};

/// The dtype a normalisation computes in for inputs of `dtype`.
fn compute_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        other => other,
    }
}

/// A new tensor with `t`'s values in `dtype` and `shape` (never a view of `t`,
/// so later in-place updates of `t` cannot change it).
fn fresh_copy(t: &Tensor, dtype: DType, shape: &[usize]) -> Result<Tensor> {
    let copy = Tensor::zeros_on(shape, dtype, t.device())?;
    copy.copy_(&t.reshape(&to_isize(shape))?)?;
    Ok(copy)
}

/// The optional `weight` and `bias` back from the casts of those present.
fn split_params(cast: &[Var], has_weight: bool, has_bias: bool) -> (Option<&Var>, Option<&Var>) {
    let weight = if has_weight { cast.first() } else { None };
    let bias = if has_bias { cast.get(has_weight as usize) } else { None };
    (weight, bias)
}

fn to_isize(dims: &[usize]) -> Vec<isize> {
    dims.iter().map(|&d| d as isize).collect()
}

/// Checks that an optional per-channel tensor has `channels` elements.
fn check_per_channel(what: &str, dims: Option<&[usize]>, channels: usize, input: &[usize]) -> Result<()> {
    match dims {
        Some(d) if d.iter().product::<usize>() != channels || d.len() != 1 => Err(NnError::invalid(
            "batch_norm",
            format!("{what} must have shape [{channels}] for an input of shape {input:?}, got {d:?}"),
        )),
        _ => Ok(()),
    }
}

/// Batch normalisation over dim 1 of `input` (`[N, C]`, `[N, C, L]`,
/// `[N, C, H, W]`, ...): `y = (x - mean) / √(var + eps) · weight + bias`,
/// PyTorch's `F.batch_norm`.
///
/// `training`: the mean and the biased variance are those of this batch
/// (over every dim but 1), and `running_mean` / `running_var`, when given,
/// are updated in place: `running = (1 - momentum) · running + momentum ·
/// batch`, with the unbiased variance for `running_var`. Otherwise the
/// running statistics are used (and must be given). `weight` and `bias`
/// (`[C]`) are optional. The gradient flows to `input`, `weight` and `bias`.
#[allow(clippy::too_many_arguments)] // PyTorch's signature, in its order.
pub fn batch_norm(
    input: &Var,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Var>,
    bias: Option<&Var>,
    training: bool,
    momentum: f64,
    eps: f64,
) -> Result<Var> {
    let params: Vec<&Var> = [input].into_iter().chain(weight).chain(bias).collect();
    if let Some(c) = autocast_inputs(op_names::BATCH_NORM, &params)? {
        let (weight, bias) = split_params(&c[1..], weight.is_some(), bias.is_some());
        return batch_norm(&c[0], running_mean, running_var, weight, bias, training, momentum, eps);
    }
    let dims = input.dims().to_vec();
    if dims.len() < 2 {
        return Err(NnError::invalid(
            "batch_norm",
            format!("expected an input of shape [N, C, ...] (rank 2 or more), got {dims:?}"),
        ));
    }
    if !input.dtype().is_float() {
        return Err(NnError::invalid("batch_norm", format!("expected a floating-point input, got {}", input.dtype())));
    }
    let channels = dims[1];
    check_per_channel("running_mean", running_mean.map(|t| t.dims()), channels, &dims)?;
    check_per_channel("running_var", running_var.map(|t| t.dims()), channels, &dims)?;
    check_per_channel("weight", weight.map(|t| t.dims()), channels, &dims)?;
    check_per_channel("bias", bias.map(|t| t.dims()), channels, &dims)?;
    if running_mean.is_some() != running_var.is_some() {
        return Err(NnError::invalid("batch_norm", "give both running_mean and running_var, or neither"));
    }
    if !eps.is_finite() || eps < 0.0 {
        return Err(NnError::invalid("batch_norm", format!("eps must be finite and non-negative, got {eps}")));
    }

    let dtype = compute_dtype(input.dtype());
    let (mean, invstd) = if training {
        let per_channel = input.numel() / channels.max(1);
        if per_channel <= 1 {
            return Err(NnError::invalid(
                "batch_norm",
                format!("expected more than 1 value per channel when training, got input of shape {dims:?}"),
            ));
        }
        // One fused pass per statistic, on the input as it is (a bf16
        // activation is read as bf16, never widened into a copy).
        let (mean, var) = input.tensor().batch_norm_stats()?;
        if let (Some(running_mean), Some(running_var)) = (running_mean, running_var) {
            let _no_grad = brasa_autograd::no_grad();
            let unbiased = var.mul_scalar(per_channel as f64 / (per_channel - 1) as f64)?;
            running_mean.lerp_(&mean.to_dtype(running_mean.dtype())?, momentum)?;
            running_var.lerp_(&unbiased.to_dtype(running_var.dtype())?, momentum)?;
        }
        let invstd = var.add_scalar(eps)?.rsqrt()?;
        (mean, invstd)
    } else {
        let (Some(running_mean), Some(running_var)) = (running_mean, running_var) else {
            return Err(NnError::invalid(
                "batch_norm",
                "evaluation mode (training = false) needs running_mean and running_var",
            ));
        };
        // Copies: the running statistics may be updated in place before backward.
        let mean = fresh_copy(running_mean, dtype, &[channels])?;
        let invstd = running_var.reshape(&[channels as isize])?.to_dtype(dtype)?.add_scalar(eps)?.rsqrt()?;
        (mean, invstd)
    };

    let mut inputs = vec![input];
    inputs.extend(weight);
    inputs.extend(bias);
    let function =
        BatchNormFn { mean, invstd, batch_stats: training, has_weight: weight.is_some(), has_bias: bias.is_some() };
    Ok(apply(function, &inputs)?)
}

/// The normalisation of [`batch_norm`] with its statistics already known,
/// on the fused per-channel passes of `brasa_tensor`
/// (`Tensor::batch_norm_elemt` forward; `batch_norm_backward_reduce` and
/// `batch_norm_backward_elemt` backward): two passes over memory each way.
struct BatchNormFn {
    /// `[C]`, in the compute dtype.
    mean: Tensor,
    /// `1 / √(var + eps)`, `[C]`.
    invstd: Tensor,
    /// The statistics are the batch's (so they depend on the input).
    batch_stats: bool,
    has_weight: bool,
    has_bias: bool,
}

impl Function for BatchNormFn {
    fn name(&self) -> &'static str {
        "batch_norm"
    }

    fn forward(&mut self, ctx: &mut FunctionCtx, inputs: &[Tensor]) -> brasa_autograd::Result<Tensor> {
        let x = &inputs[0];
        let weight = if self.has_weight { Some(&inputs[1]) } else { None };
        let bias = if self.has_bias { Some(&inputs[1 + self.has_weight as usize]) } else { None };
        let out = x.batch_norm_elemt(&self.mean, &self.invstd, weight, bias)?;
        ctx.save_for_backward(x);
        ctx.save_for_backward(&self.mean);
        ctx.save_for_backward(&self.invstd);
        if let Some(w) = weight {
            ctx.save_for_backward(w);
        }
        Ok(out)
    }

    fn backward(
        &mut self,
        saved: &[Tensor],
        grad_output: &Tensor,
        needs: &[bool],
    ) -> brasa_autograd::Result<Vec<Option<Tensor>>> {
        let (x, mean, invstd) = (&saved[0], &saved[1], &saved[2]);
        let weight = if self.has_weight { Some(&saved[3]) } else { None };
        let bias_index = 1 + self.has_weight as usize;
        let needs_weight = self.has_weight && needs[1];
        let needs_bias = self.has_bias && needs[bias_index];
        // With running statistics dx is a per-channel scaling of dy: the
        // sums are needed only for the parameters' gradients.
        let input_sums = self.batch_stats && needs[0];
        let sums = if input_sums || needs_weight || needs_bias {
            Some(grad_output.batch_norm_backward_reduce(x, mean)?)
        } else {
            None
        };
        let mut grads = Vec::with_capacity(needs.len());
        grads.push(if !needs[0] {
            None
        } else if let (true, Some((sum_dy, sum_dy_xmu))) = (self.batch_stats, &sums) {
            Some(grad_output.batch_norm_backward_elemt(x, mean, invstd, weight, sum_dy, sum_dy_xmu)?)
        } else {
            // dx = dy · invstd · w: the forward's pass on dy, centred at 0.
            let zero = Tensor::zeros_on(mean.dims(), mean.dtype(), mean.device())?;
            let dx = grad_output.batch_norm_elemt(&zero, invstd, weight, None)?;
            Some(if dx.dtype() == x.dtype() { dx } else { dx.to_dtype(x.dtype())? })
        });
        if self.has_weight {
            // dw = Σ dy · x̂ = invstd · Σ dy (x − mean).
            let dw = match (&sums, needs_weight) {
                (Some((_, sum_dy_xmu)), true) => Some(sum_dy_xmu.mul(invstd)?),
                _ => None,
            };
            grads.push(dw);
        }
        if self.has_bias {
            grads.push(if needs_bias { sums.map(|(sum_dy, _)| sum_dy) } else { None });
        }
        Ok(grads)
    }
}

/// Layer normalisation over the trailing dims `normalized_shape` of
/// `input`: each slice of those dims is normalised by its own mean and
/// biased variance, `y = (x - mean) / √(var + eps) · weight + bias`, with
/// optional `weight` and `bias` of shape `normalized_shape` (PyTorch's
/// `F.layer_norm`). The gradient flows to `input`, `weight` and `bias`.
pub fn layer_norm(
    input: &Var,
    normalized_shape: &[usize],
    weight: Option<&Var>,
    bias: Option<&Var>,
    eps: f64,
) -> Result<Var> {
    let params: Vec<&Var> = [input].into_iter().chain(weight).chain(bias).collect();
    if let Some(c) = autocast_inputs(op_names::LAYER_NORM, &params)? {
        let (weight, bias) = split_params(&c[1..], weight.is_some(), bias.is_some());
        return layer_norm(&c[0], normalized_shape, weight, bias, eps);
    }
    let dims = input.dims();
    let k = normalized_shape.len();
    if k == 0 || k > dims.len() || dims[dims.len() - k..] != *normalized_shape {
        return Err(NnError::invalid(
            "layer_norm",
            format!(
                "normalized_shape {normalized_shape:?} must be non-empty and match the trailing dims of the input, got input of shape {dims:?}"
            ),
        ));
    }
    if !input.dtype().is_float() {
        return Err(NnError::invalid("layer_norm", format!("expected a floating-point input, got {}", input.dtype())));
    }
    for (what, param) in [("weight", weight), ("bias", bias)] {
        if let Some(param) = param {
            if param.dims() != normalized_shape {
                return Err(NnError::invalid(
                    "layer_norm",
                    format!("{what} must have shape {normalized_shape:?}, got {:?}", param.dims()),
                ));
            }
        }
    }
    if !eps.is_finite() || eps < 0.0 {
        return Err(NnError::invalid("layer_norm", format!("eps must be finite and non-negative, got {eps}")));
    }
    let mut inputs = vec![input];
    inputs.extend(weight);
    inputs.extend(bias);
    let function =
        LayerNormFn { shape: normalized_shape.to_vec(), eps, has_weight: weight.is_some(), has_bias: bias.is_some() };
    Ok(apply(function, &inputs)?)
}

/// The layer normalisation of [`layer_norm`]: one fused pass per direction
/// ([`Tensor::native_layer_norm`] and its backward), saving the input, the
/// per-row mean and `1/√(var + eps)`, and the weight.
struct LayerNormFn {
    /// `normalized_shape`, the shape of the weight and bias.
    shape: Vec<usize>,
    eps: f64,
    has_weight: bool,
    has_bias: bool,
}

impl Function for LayerNormFn {
    fn name(&self) -> &'static str {
        "layer_norm"
    }

    fn forward(&mut self, ctx: &mut FunctionCtx, inputs: &[Tensor]) -> brasa_autograd::Result<Tensor> {
        let x = &inputs[0];
        let weight = self.has_weight.then(|| &inputs[1]);
        let bias = self.has_bias.then(|| &inputs[1 + self.has_weight as usize]);
        let (out, mean, rstd) = x.native_layer_norm(&self.shape, weight, bias, self.eps)?;
        ctx.save_for_backward(x);
        ctx.save_for_backward(&mean);
        ctx.save_for_backward(&rstd);
        if let Some(weight) = weight {
            ctx.save_for_backward(weight);
        }
        Ok(out)
    }

    fn backward(
        &mut self,
        saved: &[Tensor],
        grad_output: &Tensor,
        needs: &[bool],
    ) -> brasa_autograd::Result<Vec<Option<Tensor>>> {
        let (input, mean, rstd) = (&saved[0], &saved[1], &saved[2]);
        let weight = self.has_weight.then(|| &saved[3]);
        let bias_at = 1 + self.has_weight as usize;
        let mask = [needs[0], self.has_weight && needs[1], self.has_bias && needs[bias_at]];
        let (dx, dw, db) = grad_output.native_layer_norm_backward(input, &self.shape, mean, rstd, weight, mask)?;
        let mut grads = vec![dx];
        if self.has_weight {
            grads.push(dw);
        }
        if self.has_bias {
            grads.push(db);
        }
        Ok(grads)
    }
}

/// Group normalisation (PyTorch's `F.group_norm`): the channels (dim 1) of
/// `input` (`[N, C, *]`) are split into `num_groups` groups of `C /
/// num_groups` consecutive channels, and each sample's group is normalised
/// by its own mean and biased variance, `y = (x - mean) / √(var + eps)`,
/// then scaled by `weight` and shifted by `bias` per channel (both
/// optional, `[C]`). `C` must be divisible by `num_groups`. The gradient
/// flows to `input`, `weight` and `bias`.
///
/// ```
/// use brasa_nn::functional::group_norm;
/// use brasa_autograd::Var;
/// use brasa_tensor::Tensor;
///
/// // One sample, 4 channels of 1 value, 2 groups: (1, 3) and (5, 9).
/// let x = Var::new(Tensor::from_vec(vec![1.0f64, 3.0, 5.0, 9.0], [1, 4, 1])?);
/// let y = group_norm(&x, 2, None, None, 0.0)?;
/// assert_eq!(y.tensor().to_vec::<f64>()?, [-1.0, 1.0, -1.0, 1.0]);
/// assert!(group_norm(&x, 3, None, None, 1e-5).is_err()); // 4 channels, 3 groups
/// # Ok::<(), brasa_nn::NnError>(())
/// ```
pub fn group_norm(input: &Var, num_groups: usize, weight: Option<&Var>, bias: Option<&Var>, eps: f64) -> Result<Var> {
    const OP: &str = op_names::GROUP_NORM;
    let params: Vec<&Var> = [input].into_iter().chain(weight).chain(bias).collect();
    if let Some(c) = autocast_inputs(OP, &params)? {
        let (weight, bias) = split_params(&c[1..], weight.is_some(), bias.is_some());
        return group_norm(&c[0], num_groups, weight, bias, eps);
    }
    let dims = input.dims().to_vec();
    if dims.len() < 2 {
        return Err(NnError::invalid(
            OP,
            format!("expected an input of shape [N, C, ...] (rank 2 or more), got {dims:?}"),
        ));
    }
    let channels = dims[1];
    if num_groups == 0 || !channels.is_multiple_of(num_groups) {
        return Err(NnError::invalid(
            OP,
            format!(
                "the number of channels ({channels}, dim 1 of the input of shape {dims:?}) must be divisible by \
                 num_groups ({num_groups})"
            ),
        ));
    }
    if !input.dtype().is_float() {
        return Err(NnError::invalid(OP, format!("expected a floating-point input, got {}", input.dtype())));
    }
    for (what, param) in [("weight", weight), ("bias", bias)] {
        if let Some(param) = param {
            if param.dims() != [channels] {
                return Err(NnError::invalid(
                    OP,
                    format!(
                        "{what} must have shape [{channels}] for an input of shape {dims:?}, got {:?}",
                        param.dims()
                    ),
                ));
            }
        }
    }
    if !eps.is_finite() || eps < 0.0 {
        return Err(NnError::invalid(OP, format!("eps must be finite and non-negative, got {eps}")));
    }
    // Each group is a row of [N, G, (C/G)·spatial] in memory order, so layer
    // norm over the last dim normalises it; f16/bf16 go through f32 so that
    // the affine step, too, is computed in f32.
    let dtype = compute_dtype(input.dtype());
    let x = if dtype == input.dtype() { input.clone() } else { input.to_dtype(dtype)? };
    let width = (channels / num_groups) * dims[2..].iter().product::<usize>();
    let rows = x.reshape(&[dims[0] as isize, num_groups as isize, width as isize])?;
    let mut y = layer_norm(&rows, &[width], None, None, eps)?.reshape(&to_isize(&dims))?;
    // `[1, C, 1, ...]`: per-channel parameters broadcast against the input.
    let mut channel_shape = vec![1isize; dims.len()];
    channel_shape[1] = channels as isize;
    if let Some(weight) = weight {
        y = y.mul(&weight.reshape(&channel_shape)?)?;
    }
    if let Some(bias) = bias {
        y = y.add(&bias.reshape(&channel_shape)?)?;
    }
    if y.dtype() != input.dtype() {
        y = y.to_dtype(input.dtype())?;
    }
    Ok(y)
}
