//! Elementwise kernels on CUDA: unary, binary, comparisons, `where_cond`,
//! casts and strided copies, fills. Each op coalesces its operands' dims
//! ([`super::strided::coalesce`]), allocates a contiguous output from the
//! device's caching allocator, and queues one kernel on the device's stream.

use super::strided::coalesce;
use super::{address, grid_for, output_address, suffix, CudaOps};
use crate::backend::{CompareOp, Sequence};
use crate::dispatch::dispatch_dtype;
use crate::dtype::{DType, WithDType};
use crate::error::Result;
use crate::shape::Shape;
use crate::storage::UninitTensor;
use crate::tensor::Tensor;
use brasa_kernels::cuda_ptx::Strided;
use brasa_kernels::elementwise::{BinaryOp, UnaryOp};
use cudarc::driver::{DeviceRepr, PushKernelArg};

/// [`Strided`] as a kernel argument (passed by value, 336 bytes).
#[repr(transparent)]
pub(super) struct StridedArg(pub(super) Strided);

// SAFETY: `Strided` is `#[repr(C)]` plain data whose layout matches the
// ABI's C struct (asserted by tests on both sides).
unsafe impl DeviceRepr for StridedArg {}

/// A fresh contiguous output of `shape` on the backend's device.
fn output(backend: &CudaOps, shape: &Shape, dtype: DType) -> Result<UninitTensor> {
    UninitTensor::new(shape.clone(), dtype, backend.device)
}

/// `out` (written by the kernel just queued) as a tensor.
pub(super) fn finish(out: UninitTensor) -> Tensor {
    // SAFETY: every caller queued a kernel that writes each element of `out`
    // before any later work on this stream can read it (stream order); the
    // host never reads device memory directly.
    unsafe { out.assume_init() }
}

/// The scalar parameters `p0, p1` of a unary kernel.
pub(super) fn unary_parameters(op: UnaryOp) -> (f64, f64) {
    match op {
        UnaryOp::Powf(exponent) => (exponent, 0.0),
        UnaryOp::Clamp { min, max } => (min, max),
        UnaryOp::Affine { mul, add } => (mul, add),
        _ => (0.0, 0.0),
    }
}

pub(super) fn unary(backend: &CudaOps, name: &'static str, op: UnaryOp, x: &Tensor) -> Result<Tensor> {
    let _range = brasa_profile::record_op(name, &[x.dims()]);
    let out = output(backend, x.shape(), x.dtype())?;
    if x.numel() > 0 {
        let contiguous = x.shape().contiguous_strides();
        let s = StridedArg(coalesce(name, x.dims(), &[&contiguous, x.layout().strides()])?);
        let kernel = format!("unary_{}_{}", op.name(), suffix(x.dtype()));
        let f = backend.function(name, "elementwise", &kernel)?;
        let stream = backend.current_stream()?;
        let (src, dst) = (address(name, x)?, output_address(name, &out)?);
        let (p0, p1) = unary_parameters(op);
        let span = backend.launch_span(&kernel);
        // SAFETY: `s` describes `x`'s view (within its storage) and the
        // contiguous output of the same element count; the kernel's
        // parameters are the ABI's `(Strided, const T*, T*, double, double)`.
        unsafe { stream.launch_builder(&f).arg(&s).arg(&src).arg(&dst).arg(&p0).arg(&p1).launch(grid_for(x.numel())) }
            .map_err(|e| backend.call_error(name, format!("launching {kernel}"), e))?;
        drop(span);
    }
    Ok(finish(out))
}

/// Queues `kernel(s, inputs.., out)` for a contiguous output of `inputs[0]`'s
/// shape; the inputs share that shape.
fn launch_elementwise(
    backend: &CudaOps,
    name: &'static str,
    module: &'static str,
    kernel: &str,
    inputs: &[&Tensor],
    out_dtype: DType,
) -> Result<Tensor> {
    let first = inputs[0];
    let out = output(backend, first.shape(), out_dtype)?;
    if first.numel() > 0 {
        let contiguous = first.shape().contiguous_strides();
        let mut strides: Vec<&[isize]> = vec![&contiguous];
        strides.extend(inputs.iter().map(|t| t.layout().strides()));
        let s = StridedArg(coalesce(name, first.dims(), &strides)?);
        let f = backend.function(name, module, kernel)?;
        let stream = backend.current_stream()?;
        let pointers = inputs.iter().map(|t| address(name, t)).collect::<Result<Vec<u64>>>()?;
        let dst = output_address(name, &out)?;
        let mut launch = stream.launch_builder(&f);
        launch.arg(&s);
        for p in &pointers {
            launch.arg(p);
        }
        launch.arg(&dst);
        let span = backend.launch_span(kernel);
        // SAFETY: `s` describes every input's view (within its storage) and
        // the contiguous output; the parameters are the ABI's
        // `(Strided, const A*, [const B*, [const C*,]] D*)`.
        unsafe { launch.launch(grid_for(first.numel())) }
            .map_err(|e| backend.call_error(name, format!("launching {kernel}"), e))?;
        drop(span);
    }
    Ok(finish(out))
}

pub(super) fn binary(backend: &CudaOps, op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let name = op.name();
    let _range = brasa_profile::record_op(name, &[a.dims(), b.dims()]);
    let kernel = format!("binary_{name}_{}", suffix(a.dtype()));
    launch_elementwise(backend, name, "elementwise", &kernel, &[a, b], a.dtype())
}

pub(super) fn compare(backend: &CudaOps, name: &'static str, op: CompareOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let _range = brasa_profile::record_op(name, &[a.dims(), b.dims()]);
    let kernel = format!("compare_{}_{}", op.kernel_name(), suffix(a.dtype()));
    launch_elementwise(backend, name, "elementwise", &kernel, &[a, b], DType::Bool)
}

/// `x op value` (see [`crate::backend::DeviceOps::compare_scalar`]; the
/// kernel applies the host's rule for the scalar's type).
pub(super) fn compare_scalar(
    backend: &CudaOps,
    name: &'static str,
    op: CompareOp,
    x: &Tensor,
    value: f64,
) -> Result<Tensor> {
    let _range = brasa_profile::record_op(name, &[x.dims()]);
    let out = output(backend, x.shape(), DType::Bool)?;
    if x.numel() > 0 {
        let contiguous = x.shape().contiguous_strides();
        let s = StridedArg(coalesce(name, x.dims(), &[&contiguous, x.layout().strides()])?);
        let kernel = format!("compare_scalar_{}_{}", op.kernel_name(), suffix(x.dtype()));
        let f = backend.function(name, "elementwise", &kernel)?;
        let stream = backend.current_stream()?;
        let (src, dst) = (address(name, x)?, output_address(name, &out)?);
        let span = backend.launch_span(&kernel);
        // SAFETY: `s` describes `x`'s view and the contiguous bool output;
        // the parameters are the ABI's `(Strided, const T*, double, unsigned char*)`.
        unsafe { stream.launch_builder(&f).arg(&s).arg(&src).arg(&value).arg(&dst).launch(grid_for(x.numel())) }
            .map_err(|e| backend.call_error(name, format!("launching {kernel}"), e))?;
        drop(span);
    }
    Ok(finish(out))
}

pub(super) fn where_cond(backend: &CudaOps, cond: &Tensor, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
    let name = "where_cond";
    let _range = brasa_profile::record_op(name, &[cond.dims()]);
    let kernel = format!("where_{}", suffix(on_true.dtype()));
    launch_elementwise(backend, name, "elementwise", &kernel, &[cond, on_true, on_false], on_true.dtype())
}

pub(super) fn cast(backend: &CudaOps, x: &Tensor, dtype: DType) -> Result<Tensor> {
    let kernel = format!("cast_{}_{}", suffix(x.dtype()), suffix(dtype));
    launch_elementwise(backend, "copy", "cast", &kernel, &[x], dtype)
}

pub(super) fn copy_into(backend: &CudaOps, name: &'static str, dst: &Tensor, src: &Tensor) -> Result<()> {
    if dst.numel() == 0 {
        return Ok(());
    }
    let kernel = format!("cast_{0}_{0}", suffix(dst.dtype()));
    let s = StridedArg(coalesce(name, dst.dims(), &[dst.layout().strides(), src.layout().strides()])?);
    let f = backend.function(name, "cast", &kernel)?;
    let stream = backend.current_stream()?;
    let (from, to) = (address(name, src)?, address(name, dst)?);
    let span = backend.launch_span(&kernel);
    // SAFETY: `s` describes both views within their storages; they do not
    // overlap (the op copies a sharing source first), and `dst` has no
    // element reachable from two indices (checked writable by the op).
    unsafe { stream.launch_builder(&f).arg(&s).arg(&from).arg(&to).launch(grid_for(dst.numel())) }
        .map_err(|e| backend.call_error(name, format!("launching {kernel}"), e))?;
    drop(span);
    Ok(())
}

/// A 0-d tensor holding `value` (converted as the host converts scalars).
pub(super) fn full_scalar(backend: &CudaOps, name: &'static str, dtype: DType, value: f64) -> Result<Tensor> {
    let out = output(backend, &Shape::scalar(), dtype)?;
    let dst = output_address(name, &out)?;
    dispatch_dtype!(dtype, T => launch_fill::<T>(backend, name, dtype, 1, T::from_f64(value), dst))?;
    Ok(finish(out))
}

/// Queues `fill_<T>(n, value, out)` on `n` contiguous elements at `dst`.
pub(super) fn launch_fill<T: WithDType>(
    backend: &CudaOps,
    name: &'static str,
    dtype: DType,
    n: usize,
    value: T,
    dst: u64,
) -> Result<()> {
    let kernel = format!("fill_{}", suffix(dtype));
    let f = backend.function(name, "fill", &kernel)?;
    let stream = backend.current_stream()?;
    let count = n as i64;
    let value = KernelScalar(value);
    let span = backend.launch_span(&kernel);
    // SAFETY: `dst` holds `n` elements of `T`; the parameters are the ABI's
    // `(long long n, T value, T* out)`.
    unsafe { stream.launch_builder(&f).arg(&count).arg(&value).arg(&dst).launch(grid_for(n)) }
        .map_err(|e| backend.call_error(name, format!("launching {kernel}"), e))?;
    drop(span);
    Ok(())
}

/// See [`crate::backend::DeviceOps::sequence`]: one launch of the fill
/// family's `arange_*`, `linspace_*` or `eye_*` kernel.
pub(super) fn sequence(backend: &CudaOps, name: &'static str, out: UninitTensor, sequence: Sequence) -> Result<Tensor> {
    let _range = brasa_profile::record_op(name, &[out.dims()]);
    let dtype = out.dtype();
    // SAFETY: the kernel below writes every element before any later work on
    // this stream can read it; the host never reads device memory.
    let out = unsafe { out.assume_init() };
    let n = out.numel();
    if n == 0 {
        return Ok(out);
    }
    let at = address(name, &out)?;
    let count = n as i64;
    let (family, kernel) = match sequence {
        Sequence::Arange { .. } => ("fill", format!("arange_{}", suffix(dtype))),
        Sequence::Linspace { .. } => ("fill", format!("linspace_{}", suffix(dtype))),
        Sequence::Eye => ("fill", format!("eye_{}", suffix(dtype))),
    };
    let f = backend.function(name, family, &kernel)?;
    let stream = backend.current_stream()?;
    let mut builder = stream.launch_builder(&f);
    // The ABI's parameters: `(long long n, double start, double step|end, T* out)`
    // for arange and linspace, `(long long rows, long long cols, T* out)` for eye.
    let (a, b, rows, cols);
    match sequence {
        Sequence::Arange { start, step } => {
            (a, b) = (start, step);
            builder.arg(&count).arg(&a).arg(&b).arg(&at);
        }
        Sequence::Linspace { start, end } => {
            (a, b) = (start, end);
            builder.arg(&count).arg(&a).arg(&b).arg(&at);
        }
        Sequence::Eye => {
            let last = out.dims().last().copied().unwrap_or(1).max(1);
            (rows, cols) = ((n / last) as i64, last as i64);
            builder.arg(&rows).arg(&cols).arg(&at);
        }
    }
    let span = backend.launch_span(&kernel);
    // SAFETY: `at` holds `n` contiguous elements of `dtype`; the arguments
    // are the ABI's for this kernel (see above).
    unsafe { builder.launch(grid_for(n)) }.map_err(|e| backend.call_error(name, format!("launching {kernel}"), e))?;
    drop(span);
    Ok(out)
}

/// An element passed by value to a kernel (bool as one byte 0/1, f16 and
/// bf16 as their 2 bytes: the ABI's types).
#[repr(transparent)]
struct KernelScalar<T>(T);

// SAFETY: every `WithDType` type is plain data whose bytes are the C type of
// its dtype in the ABI (bool is one byte holding 0 or 1).
unsafe impl<T: WithDType> DeviceRepr for KernelScalar<T> {}

pub(super) fn fill(backend: &CudaOps, name: &'static str, dst: &Tensor, value: f64) -> Result<()> {
    let _range = brasa_profile::record_op(name, &[dst.dims()]);
    // Broadcast dims repeat their element: fill each one once.
    let view = dst.with_layout(dst.layout().without_broadcast_dims());
    if view.numel() == 0 {
        return Ok(());
    }
    if view.is_contiguous() {
        let at = address(name, &view)?;
        return dispatch_dtype!(dst.dtype(), T =>
            launch_fill::<T>(backend, name, dst.dtype(), view.numel(), T::from_f64(value), at));
    }
    // A strided view: copy a broadcast 0-d tensor into it.
    let scalar = full_scalar(backend, name, dst.dtype(), value)?.broadcast_as(view.shape().clone())?;
    copy_into(backend, name, &view, &scalar)
}

/// See [`crate::backend::DeviceOps::concat`]: each input copied (strided copy
/// kernel) into the block of a new output it fills.
pub(super) fn concat(backend: &CudaOps, tensors: &[&Tensor], d: usize, shape: &Shape) -> Result<Tensor> {
    let dtype = tensors.first().map_or(DType::F32, |t| t.dtype());
    let out = finish(output(backend, shape, dtype)?);
    let mut start = 0;
    for t in tensors {
        let len = t.dims()[d];
        if t.numel() > 0 {
            copy_into(backend, "cat", &out.narrow(d, start, len)?, t)?;
        }
        start += len;
    }
    // Every element was written: the inputs tile the output along `d`.
    Ok(out)
}
