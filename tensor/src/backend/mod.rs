//! The device seam: every op is written once, above a narrow per-device
//! kernel interface ([`Backend`]), and each device implements that interface.
//!
//! An op in `crate::ops` does the part that is the same on every device:
//! checking operands (devices, dtypes, shapes), PyTorch's dtype promotion,
//! broadcasting (stride-0 views, never copies), choosing the dtype it computes
//! in, and the errors a user sees. It then asks the operands' device for its
//! backend ([`for_device`]) and hands it operands that are ready: one device,
//! the compute dtype, one shape. The backend only executes: it allocates the
//! output on its device, walks the strided operands and runs the kernel.
//! Adding a device means implementing [`Backend`]; no op changes.
//! (The models are candle's `BackendStorage` and burn's backend traits.)
//!
//! - [`host::HostBackend`]: the host and logical host devices; the loops of
//!   `brasa-kernels`, on rayon's threads for large tensors.
//! - `cuda::CudaBackend` (feature `cuda`): kernels compiled to PTX by `cargo
//!   xtask kernels` (committed in `brasa-kernels`), launched on the device's
//!   current stream, and cuBLAS for matrix products.
//!
//! Every op runs through the seam, random fills included. Constructors that
//! build sequences (`arange`, `linspace`, `eye`) compute on the host and
//! copy to a CUDA device; direct byte access (`host_bytes`) is host-only by
//! design.
//!
//! ```
//! use brasa_tensor::{DType, Tensor};
//!
//! // The same call runs on whichever device holds the operands.
//! let x = Tensor::arange(0.0, 4.0, 1.0, DType::F32)?;
//! let y = (x.exp()? + &x)?;
//! assert_eq!(y.dtype(), DType::F32);
//! # Ok::<(), brasa_tensor::TensorError>(())
//! ```

use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::attention::AttentionOperands;
use crate::ops::conv::ConvPlan;
use crate::ops::fused_adam::AdamUpdate;
use crate::ops::fused_sgd::SgdUpdate;
use crate::ops::pool::PoolPlan;
use crate::shape::Shape;
use crate::storage::UninitTensor;
use crate::tensor::Tensor;
use brasa_kernels::elementwise::{BinaryOp, UnaryOp};

#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub(crate) mod host;
pub(crate) mod meta;

/// An elementwise comparison (its result is a bool tensor).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CompareOp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

impl CompareOp {
    /// The op's name, also the kernel-name part (`"lt"`).
    pub(crate) fn kernel_name(self) -> &'static str {
        match self {
            CompareOp::Eq => "eq",
            CompareOp::Ne => "ne",
            CompareOp::Lt => "lt",
            CompareOp::Le => "le",
            CompareOp::Gt => "gt",
            CompareOp::Ge => "ge",
        }
    }
}

/// A reduction over some dims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReduceOp {
    /// The sum (in the accumulator dtype).
    Sum,
    /// The mean (floats).
    Mean,
    /// The variance `Σ(x − mean)² / max(N − correction, 0)`, or its square
    /// root (floats).
    Var {
        /// Subtracted from the element count (1: Bessel's correction).
        correction: usize,
        /// The standard deviation instead.
        sqrt: bool,
    },
    /// The largest element (NaN wins).
    Max,
    /// The smallest element (NaN wins).
    Min,
    /// The first position of the largest element (or of the first NaN).
    ArgMax,
    /// The first position of the smallest element (or of the first NaN).
    ArgMin,
}

/// An in-place update of a tensor `dst`, with its operands (see
/// [`Backend::update`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Update {
    /// `dst = op(dst)`: floats every [`UnaryOp`]; integers `Neg`, `Abs`,
    /// `Relu`, `Clamp` and `Affine` with integral factors (wrapping).
    Unary(UnaryOp),
    /// `dst = ln(1 + dst)`, in f64 per element (floats).
    Log1p,
    /// `dst = log(sigmoid(dst))` as `min(x, 0) − log1p(e^−|x|)`, in f64 (floats).
    LogSigmoid,
    /// `dst = op(dst, x)`: `Add`, `Sub`, `Mul`, `Div` (floats), `Maximum`,
    /// `Minimum`; integers wrap, bool add/max are or, mul/min and.
    Binary(BinaryOp),
    /// `dst += alpha · x` (integers: integral `alpha`, wrapping).
    AddScaled(f64),
    /// `dst += weight · (end − dst)` (floats).
    Lerp(f64),
    /// `dst += value · a · b` (floats).
    Addcmul(f64),
    /// `dst += value · a / b` (floats).
    Addcdiv(f64),
}

/// Validated `i64` indices (every one within `0..size` of the indexed dim,
/// checked by the op so errors name the offending index and its position):
/// the tensor, on the operands' device, and for host tensors its values.
pub(crate) struct Indices<'a> {
    /// The values, row-major, read to the host for host tensors. Empty for
    /// device tensors, which are checked on the device and read there from
    /// `tensor` (copying them out would cost a transfer per op).
    pub values: &'a [i64],
    /// The index tensor (`i64`, on the operands' device).
    pub tensor: &'a Tensor,
}

/// A constructor's values (see [`Backend::sequence`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Sequence {
    /// `start + i·step`, computed in f64.
    Arange {
        /// The first value.
        start: f64,
        /// The difference between neighbours.
        step: f64,
    },
    /// Evenly spaced from `start` to `end` inclusive; the first half counts
    /// from `start`, the second back from `end`, so both ends are exact.
    Linspace {
        /// The first value.
        start: f64,
        /// The last value.
        end: f64,
    },
    /// The identity matrix (a 2-d output).
    Eye,
}

impl Sequence {
    /// Element `i` of `n` (for [`Sequence::Eye`] over `cols` columns: 1 on the diagonal).
    pub(crate) fn value(&self, i: usize, n: usize, cols: usize) -> f64 {
        match *self {
            Sequence::Arange { start, step } => start + i as f64 * step,
            Sequence::Linspace { start, end } => {
                let step = (end - start) / n.saturating_sub(1).max(1) as f64;
                match n {
                    1 => start,
                    _ if i < n / 2 => start + step * i as f64,
                    _ => end - step * (n - 1 - i) as f64,
                }
            }
            Sequence::Eye => f64::from(u8::from(i / cols.max(1) == i % cols.max(1))),
        }
    }
}

/// What a random fill draws (from the process-wide counter-based generator).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Distribution {
    /// Uniform in `[low, high)`.
    Uniform {
        /// Inclusive lower bound.
        low: f64,
        /// Exclusive upper bound.
        high: f64,
    },
    /// Normal with this mean and standard deviation.
    Normal {
        /// The mean.
        mean: f64,
        /// The standard deviation.
        std: f64,
    },
    /// 1 with probability `p`, else 0 (any dtype).
    Bernoulli {
        /// The probability of a 1.
        p: f64,
    },
}

/// A matrix product as the backend sees it, after PyTorch's shape rules:
/// `a` is a view of shape `[batch.., m, k]` and `b` of `[batch.., k, n]`,
/// both with non-negative strides (batch dims broadcast by stride 0, so one
/// operand may be shared by every batch entry), and the output is a new
/// contiguous `[batch.., m, n]`. Row and column strides are arbitrary; the
/// backend chooses between transposition flags, strided batches and copies.
pub(crate) struct MatmulOperands<'a> {
    /// `[batch.., m, k]`.
    pub a: &'a Tensor,
    /// `[batch.., k, n]`.
    pub b: &'a Tensor,
    /// The broadcast batch dims.
    pub batch: &'a [usize],
    /// Rows of each product.
    pub m: usize,
    /// Columns of each product.
    pub n: usize,
    /// The summed dimension.
    pub k: usize,
}

/// The operands of [`Backend::layer_norm_backward`], all contiguous and of
/// one compute dtype (f32 or f64).
pub(crate) struct LayerNormBackward<'a> {
    /// The output's gradient, `[rows, width]`.
    pub grad: &'a Tensor,
    /// The input, `[rows, width]`.
    pub x: &'a Tensor,
    /// Each row's mean, `[rows]`, as the forward returned it.
    pub mean: &'a Tensor,
    /// Each row's `1/√(var + eps)`, `[rows]`.
    pub rstd: &'a Tensor,
    /// The affine weight, `[width]`, if the forward had one.
    pub weight: Option<&'a Tensor>,
}

/// The operands of [`Backend::batch_norm_backward_elemt`]: `dy` and `x`
/// contiguous `[N, C, S]` of one float dtype, the rest contiguous `[C]` in
/// its compute dtype (f64 for f64, f32 otherwise).
pub(crate) struct BatchNormBackwardElemt<'a> {
    /// The output's gradient.
    pub dy: &'a Tensor,
    /// The forward's input.
    pub x: &'a Tensor,
    /// Each channel's mean.
    pub mean: &'a Tensor,
    /// `invstd · weight` per channel.
    pub scale: &'a Tensor,
    /// `Σdy / M` per channel (0 with running statistics).
    pub mean_dy: &'a Tensor,
    /// `invstd² · Σdy(x − mean) / M` per channel (0 with running statistics).
    pub k: &'a Tensor,
}

/// What one device does for the ops above the seam. Every method receives
/// operands that are already checked: on this backend's device, of the dtype
/// the op computes in, and (for elementwise methods) of one common shape,
/// possibly through broadcast (stride-0) views. Outputs are new contiguous
/// tensors on that device unless the method writes into `dst`.
///
/// `op` strings name the user-facing op in errors and profiler ranges.
pub(crate) trait Backend: Sync {
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

    /// The gradients of [`Backend::layer_norm`] asked for by `needs` (input,
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
    /// the process-wide generator's stream ([`crate::construct::reserve_draws`]),
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

    /// [`Backend::matmul`] of f16 or bf16 operands with an f32 result: the
    /// f32 sums, never rounded to the operands' dtype. By default both
    /// operands are widened and multiplied in f32, which gives the same
    /// sums (every product of two half values is exact in f32); a backend
    /// with a mixed-precision kernel (the host's bf16 dot-product and AMX
    /// kernels) reads the half operands as they are.
    fn matmul_into_f32(&self, operands: MatmulOperands<'_>) -> Result<Tensor> {
        let (a, b) = (operands.a.to_dtype(DType::F32)?, operands.b.to_dtype(DType::F32)?);
        self.matmul(MatmulOperands { a: &a, b: &b, ..operands })
    }

    /// Whether [`Backend::attention_forward`] runs fused attention for
    /// operands of `dtype` with query/key width `e` and value width `ev`.
    /// No fused kernel by default: the caller composes the attention.
    fn supports_fused_attention(&self, dtype: DType, e: usize, ev: usize) -> bool {
        let _ = (dtype, e, ev);
        false
    }

    /// Fused attention (see [`crate::FusedAttention`]) of operands for which
    /// [`Backend::supports_fused_attention`] holds: the output (contiguous
    /// `[n, h, L, Ev]`, the operands' dtype) and each row's log-sum-exp
    /// (contiguous `[n, h, L]`, f32).
    fn attention_forward(&self, operands: &AttentionOperands<'_>) -> Result<(Tensor, Tensor)> {
        let _ = operands;
        Err(crate::error::TensorError::invalid(
            "fused_attention",
            "internal error: this device has no fused attention (supports_fused_attention is false)",
        ))
    }

    /// The gradients of q, k and v (contiguous `[n, h, .., ..]`, the
    /// operands' dtype) from [`Backend::attention_forward`]'s `out` and
    /// `lse` and the output's contiguous gradient `grad`.
    fn attention_backward(
        &self,
        operands: &AttentionOperands<'_>,
        out: &Tensor,
        lse: &Tensor,
        grad: &Tensor,
    ) -> Result<[Tensor; 3]> {
        let _ = (operands, out, lse, grad);
        Err(crate::error::TensorError::invalid(
            "fused_attention_backward",
            "internal error: this device has no fused attention (supports_fused_attention is false)",
        ))
    }

    /// Whether [`Backend::matmul_into_f32`] reads half operands as they are
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
    for_device(dst.device())?.update(name, op, dst, operands)?;
    dst.storage().bump_version();
    Ok(())
}

/// The backend of `device`.
pub(crate) fn for_device(device: Device) -> Result<&'static dyn Backend> {
    match device {
        Device::Cpu(_) => Ok(&host::HostBackend),
        #[cfg(feature = "cuda")]
        Device::Cuda(index) => Ok(cuda::CudaBackend::get(index)?),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => Err(crate::error::TensorError::Device(format!(
            "{device}: brasa-tensor was built without the `cuda` feature"
        ))),
        Device::Meta(_) => Ok(meta::backend_for(device)?),
    }
}
