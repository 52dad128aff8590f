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
//! Op families not yet behind the seam (reductions, indexing, convolution,
//! pooling, softmax, random fills, in-place arithmetic) still run on host
//! storage only and return an error naming the op for a CUDA tensor.
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
use crate::tensor::Tensor;
use brasa_kernels::elementwise::{BinaryOp, UnaryOp};

#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub(crate) mod host;

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

    /// `a · b` per batch entry (see [`MatmulOperands`]), both of one float
    /// dtype; f16 and bf16 accumulate in f32.
    fn matmul(&self, operands: MatmulOperands<'_>) -> Result<Tensor>;
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
    }
}
