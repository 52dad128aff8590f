//! The ops half of the seam: [`DeviceOps`], what a device computes.

use super::args::{
    AdamUpdate, AttentionOperands, BatchNormBackwardElemt, CompareOp, ConvPlan, Distribution, Indices,
    LayerNormBackward, MatmulOperands, PoolPlan, ReduceOp, Sequence, SgdUpdate, Update,
};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::shape::Shape;
use crate::storage::UninitTensor;
use crate::tensor::Tensor;
use brasa_kernels::elementwise::{BinaryOp, UnaryOp};
use brasa_kernels::index::IndexError;

/// What one device computes for the ops above the seam. Every method receives
/// operands that are already checked: on this backend's device, of the dtype
/// the op computes in, and (for elementwise methods) of one common shape,
/// possibly through broadcast (stride-0) views. Outputs are new contiguous
/// tensors on that device unless the method writes into `dst`.
///
/// `op` strings name the user-facing op in errors and profiler ranges.
pub(crate) trait DeviceOps: Sync {
    /// `op(x)` for every element, in `x`'s dtype (floats: every [`UnaryOp`];
    /// integers: `Neg`, `Abs`, `Relu`, `Clamp`, `Powf` with an integral
    /// non-negative exponent and `Affine` with integral factors, wrapping).
    fn unary(&self, name: &'static str, op: UnaryOp, x: &Tensor) -> Result<Tensor>;

    /// `op(a, b)` for every pair; `a` and `b` have one shape and dtype.
    fn binary(&self, op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor>;

    /// `a op b` for every pair as a bool tensor; one shape and dtype.
    fn compare(&self, name: &'static str, op: CompareOp, a: &Tensor, b: &Tensor) -> Result<Tensor>;

    /// `x op value` for every element as a bool tensor: float tensors compare
    /// with `value` rounded to their dtype; integer and bool tensors compare
    /// exactly (as i64 for an integral `value` within i64, else as f64).
    fn compare_scalar(&self, name: &'static str, op: CompareOp, x: &Tensor, value: f64) -> Result<Tensor>;

    /// `cond ? on_true : on_false` elementwise; `cond` is bool, the others
    /// share a dtype; all three have one shape.
    fn where_cond(&self, cond: &Tensor, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor>;

    /// A contiguous copy of `x` converted to `dtype`, on this device.
    fn cast(&self, x: &Tensor, dtype: DType) -> Result<Tensor>;

    /// `dst[i] = src[i]`: same shape and dtype, distinct storages, `dst`
    /// checked writable (no element shared by two indices). Does not bump
    /// the version (the caller does).
    fn copy_into(&self, name: &'static str, dst: &Tensor, src: &Tensor) -> Result<()>;

    /// Sets every element of the view `dst` to `value`, which its dtype holds
    /// exactly (checked by the caller). Broadcast views are allowed.
    fn fill(&self, name: &'static str, dst: &Tensor, value: f64) -> Result<()>;

    /// A new contiguous tensor of `shape` and `dtype` on `device` with every
    /// element `value`, which the dtype holds exactly (checked by the
    /// caller, who also converted it as the dtype stores it).
    fn full(&self, name: &'static str, shape: Shape, dtype: DType, device: Device, value: f64) -> Result<Tensor>;

    /// Writes `sequence` into the new contiguous `out` (1-d for arange and
    /// linspace, 2-d for eye), each element computed in f64 and converted
    /// as `WithDType::from_f64` does; the values' range for integer dtypes
    /// is checked by the caller.
    fn sequence(&self, name: &'static str, out: UninitTensor, sequence: Sequence) -> Result<Tensor>;

    /// `op` over the dims of `x` where `mask` is true (every reduced dim
    /// non-empty for max, min and the positions), into a new tensor of the
    /// kept dims (reduced ones as 1 with `keepdim`): sums, means and
    /// variances in the accumulator dtype (f32 for f16/bf16/f32, f64, i64 for
    /// integers and bool), max and min in `x`'s dtype, positions (row-major
    /// within the reduced dims) in i64. The mean or variance of nothing is NaN.
    fn reduce(&self, op: ReduceOp, name: &'static str, x: &Tensor, mask: &[bool], keepdim: bool) -> Result<Tensor>;

    /// Softmax (or log-softmax with `log`) of a contiguous float tensor `x`
    /// seen as `[outer, n, inner]`, over the middle dim; f16 and bf16 in f32.
    fn softmax(&self, name: &'static str, x: &Tensor, n: usize, inner: usize, log: bool) -> Result<Tensor>;

    /// Layer normalisation of each row of `x` (contiguous `[rows, width]`, f32
    /// or f64) with the optional affine `weight` and `bias` (contiguous
    /// `[width]`, `x`'s dtype): the output (`x`'s shape) and each row's mean
    /// and `1/√(var + eps)` (`[rows]`, biased variance).
    fn layer_norm(
        &self,
        x: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)>;

    /// The gradients of [`DeviceOps::layer_norm`] asked for by `needs` (input,
    /// weight, bias): `[rows, width]`, `[width]`, `[width]` in the operands'
    /// dtype. The weight's gradient is `None` when there is no weight.
    fn layer_norm_backward(&self, args: LayerNormBackward<'_>, needs: [bool; 3]) -> Result<[Option<Tensor>; 3]>;

    /// Batch normalisation's statistics: per channel of `x` (contiguous
    /// `[N, C, S]`, any float dtype) its mean and biased variance, `[C]` in
    /// the compute dtype (f64 for f64, f32 otherwise).
    fn batch_norm_stats(&self, x: &Tensor) -> Result<(Tensor, Tensor)>;

    /// `y = (x − mean) · scale + shift` per channel of `x` (contiguous
    /// `[N, C, S]`), in `x`'s dtype, computed in the compute dtype of the
    /// `[C]` operands.
    fn batch_norm_elemt(&self, x: &Tensor, mean: &Tensor, scale: &Tensor, shift: &Tensor) -> Result<Tensor>;

    /// Per channel, `Σ dy` and `Σ dy · (x − mean)` (`[C]`, compute dtype),
    /// for `dy` and `x` contiguous `[N, C, S]` of one dtype.
    fn batch_norm_backward_reduce(&self, dy: &Tensor, x: &Tensor, mean: &Tensor) -> Result<(Tensor, Tensor)>;

    /// The input's gradient `scale · (dy − mean_dy − (x − mean) · k)` per
    /// channel, in `dy`'s dtype.
    fn batch_norm_backward_elemt(&self, args: BatchNormBackwardElemt<'_>) -> Result<Tensor>;

    /// Adam's update of each parameter in place, in one pass over its
    /// memory: parameter, gradient and state all contiguous, of one shape
    /// and float dtype per update, on this device.
    fn adam_step(&self, updates: &[&AdamUpdate<'_>]) -> Result<()>;

    /// SGD's update of each parameter (and its momentum buffer, present
    /// exactly when the coefficients have momentum) in place, in one pass
    /// over its memory: parameter, gradient and buffer all contiguous, of
    /// one shape and float dtype per update, on this device; the gradient
    /// shares no storage with what is written.
    fn sgd_step(&self, updates: &[&SgdUpdate<'_>]) -> Result<()>;

    /// Updates `dst` in place (see [`Update`] for each op's operands, which
    /// have `dst`'s shape and dtype and do not share its storage, except a
    /// `Binary` operand that is `dst`'s own view). The caller checked that
    /// `dst` is writable and bumps its version ([`run_update`]). Allocates
    /// nothing.
    fn update(&self, name: &'static str, op: Update, dst: &Tensor, operands: &[&Tensor]) -> Result<()>;

    /// Checks for `op` that every index of the `i64` tensor `index` (on this
    /// device) lies in `0..size`, `error` turning a bad one into its error, and
    /// returns them in row-major order when the host needs them: always for
    /// host tensors, and with `keep` on every device. Otherwise a device may
    /// check them where they are and return nothing (its kernels read
    /// [`Indices::tensor`]); a device without values assumes them valid.
    fn checked_indices(
        &self,
        op: &'static str,
        index: &Tensor,
        size: usize,
        keep: bool,
        error: &dyn Fn(IndexError) -> TensorError,
    ) -> Result<Vec<i64>>;

    /// `out[o, j, i] = x[o, ids[j], i]` for a contiguous `x` seen as
    /// `[outer, size, inner]` (`index_select`, `embedding`); the output has
    /// `shape` (`outer · ids · inner` elements).
    fn index_select(
        &self,
        name: &'static str,
        x: &Tensor,
        ids: Indices<'_>,
        size: usize,
        inner: usize,
        shape: &Shape,
    ) -> Result<Tensor>;

    /// PyTorch's `gather` along `dim`: an output of the index's shape with
    /// `out[p] = x[p with coordinate dim = index[p]]`; `x` and the index
    /// have one rank, the index fits `x` in every other dim.
    fn gather(&self, name: &'static str, x: &Tensor, dim: usize, index: Indices<'_>) -> Result<Tensor>;

    /// PyTorch's `scatter_add_` along `dim`: `dst[p with coordinate dim =
    /// index[p]] += src[p]` over the index's shape (repeats accumulate);
    /// `src` (already narrowed to the index's shape) does not share `dst`'s
    /// storage. The caller checks `dst` writable and bumps its version.
    fn scatter_add(&self, name: &'static str, dst: &Tensor, dim: usize, index: Indices<'_>, src: &Tensor)
        -> Result<()>;

    /// One-hot rows (`i64`) of `num_classes` for the ids.
    fn one_hot(&self, ids: Indices<'_>, num_classes: usize, shape: &Shape) -> Result<Tensor>;

    /// 2-d convolution of a float `input` `[N, C_in, H, W]` with `weight`
    /// (and `bias` `[C_out]`), all of one dtype, as `plan` describes.
    fn conv2d(&self, input: &Tensor, weight: &Tensor, bias: Option<&Tensor>, plan: &ConvPlan) -> Result<Tensor>;

    /// The convolution's gradient with respect to its input, from the
    /// output gradient `grad` and the weight.
    fn conv2d_backward_input(&self, grad: &Tensor, weight: &Tensor, plan: &ConvPlan) -> Result<Tensor>;

    /// The convolution's gradient with respect to its weight, from the input
    /// and the output gradient `grad`.
    fn conv2d_backward_weight(&self, input: &Tensor, grad: &Tensor, plan: &ConvPlan) -> Result<Tensor>;

    /// The bias gradient: the 4-d `grad` summed over dims 0, 2 and 3, in its dtype.
    fn conv2d_backward_bias(&self, grad: &Tensor) -> Result<Tensor>;

    /// Max pooling of `input` (`[N, C, H, W]` or `[C, H, W]`, float, i64 or
    /// u8): the maxima and their flat in-plane indices (i64).
    fn max_pool2d(&self, input: &Tensor, plan: &PoolPlan) -> Result<(Tensor, Tensor)>;

    /// Max pooling's input gradient of `input_shape`: the contiguous float
    /// `grad` routed to the contiguous `indices` of each plane, summed where
    /// several windows chose one position, zero elsewhere.
    fn max_pool2d_backward(&self, grad: &Tensor, indices: &Tensor, input_shape: &Shape) -> Result<Tensor>;

    /// Average pooling of a float `input`.
    fn avg_pool2d(&self, input: &Tensor, plan: &PoolPlan, count_include_pad: bool) -> Result<Tensor>;

    /// Average pooling's input gradient from the output gradient `grad`.
    fn avg_pool2d_backward(&self, grad: &Tensor, plan: &PoolPlan, count_include_pad: bool) -> Result<Tensor>;

    /// The non-empty list `tensors` (one dtype, shapes equal but along `d`)
    /// joined along dim `d` into a new tensor of `shape`.
    fn concat(&self, tensors: &[&Tensor], d: usize, shape: &Shape) -> Result<Tensor>;

    /// A new tensor of `shape` and `dtype` on `device` drawn from `dist`
    /// (arguments checked by the caller): the fill reserves its elements of
    /// the process-wide generator's stream ([`crate::default_generator::reserve_draws`]),
    /// element `i` being stream element `offset + i`, so every device draws
    /// the same numbers for the same seed (up to the last bits of the normal
    /// distribution's `log` and `cos`).
    fn random(
        &self,
        op: &'static str,
        dist: Distribution,
        shape: &Shape,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor>;

    /// `a · b` per batch entry (see [`MatmulOperands`]), both of one float
    /// dtype; f16 and bf16 accumulate in f32.
    fn matmul(&self, operands: MatmulOperands<'_>) -> Result<Tensor>;

    /// [`DeviceOps::matmul`] of f16 or bf16 operands with an f32 result: the
    /// f32 sums, never rounded to the operands' dtype. By default both
    /// operands are widened and multiplied in f32, which gives the same
    /// sums (every product of two half values is exact in f32); a backend
    /// with a mixed-precision kernel (the host's bf16 dot-product and AMX
    /// kernels) reads the half operands as they are.
    fn matmul_into_f32(&self, operands: MatmulOperands<'_>) -> Result<Tensor> {
        let (a, b) = (operands.a.to_dtype(DType::F32)?, operands.b.to_dtype(DType::F32)?);
        self.matmul(MatmulOperands { a: &a, b: &b, ..operands })
    }

    /// Whether [`DeviceOps::attention_forward`] runs fused attention for
    /// operands of `dtype` with query/key width `e` and value width `ev`,
    /// with dropout or without. No fused kernel by default: the caller
    /// composes the attention.
    fn supports_fused_attention(&self, dtype: DType, e: usize, ev: usize, dropout: bool) -> bool {
        let _ = (dtype, e, ev, dropout);
        false
    }

    /// Fused attention (see [`crate::FusedAttention`]) of operands for which
    /// [`DeviceOps::supports_fused_attention`] holds: the output (contiguous
    /// `[n, h, L, Ev]`, the operands' dtype) and each row's log-sum-exp
    /// (contiguous `[n, h, L]`: f32, or f64 for f64 operands).
    fn attention_forward(&self, operands: &AttentionOperands<'_>) -> Result<(Tensor, Tensor)> {
        let _ = operands;
        Err(TensorError::internal(
            "fused_attention",
            "this device has no fused attention (supports_fused_attention is false)",
        ))
    }

    /// The gradients of q, k and v (contiguous `[n, h, .., ..]`, the
    /// operands' dtype) from [`DeviceOps::attention_forward`]'s `out` and
    /// `lse` and the output's contiguous gradient `grad`.
    fn attention_backward(
        &self,
        operands: &AttentionOperands<'_>,
        out: &Tensor,
        lse: &Tensor,
        grad: &Tensor,
    ) -> Result<[Tensor; 3]> {
        let _ = (operands, out, lse, grad);
        Err(TensorError::internal(
            "fused_attention_backward",
            "this device has no fused attention (supports_fused_attention is false)",
        ))
    }

    /// Whether [`DeviceOps::matmul_into_f32`] reads half operands as they are
    /// (see [`crate::Device::multiplies_half_into_f32`]); false for the
    /// widening default.
    fn multiplies_half_into_f32(&self) -> bool {
        false
    }
}

/// Runs `op` on `dst` by its device: checks that `dst` may be written (no
/// element shared by two indices), updates it, and bumps its storage's
/// version (autograd's check for tensors changed after they were saved).
pub(crate) fn run_update(name: &'static str, op: Update, dst: &Tensor, operands: &[&Tensor]) -> Result<()> {
    let _range = brasa_profile::record_op(name, &[dst.dims()]);
    dst.check_writable(name)?;
    super::ops_for(dst.device())?.update(name, op, dst, operands)?;
    dst.storage().bump_version();
    Ok(())
}

/// A fresh contiguous output tensor of `shape` on `device` ([`Tensor::uninit`]:
/// its size is checked here): the backend must write every element before
/// handing it out.
pub(crate) fn output(device: Device, dtype: DType, shape: &Shape) -> Result<UninitTensor> {
    Tensor::uninit(shape.clone(), dtype, device)
}
