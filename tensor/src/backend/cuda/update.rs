//! In-place updates on CUDA (`add_`, `addcmul_`, `sqrt_`, ...): the
//! elementwise kernels with the output aliasing the first input (`dst`
//! itself, same strides, which the ABI allows), so nothing is allocated.

use super::elementwise::{unary_parameters, StridedArg};
use super::strided::coalesce;
use super::{address, grid_for, suffix, CudaOps};
use crate::backend::Update;
use crate::error::Result;
use crate::tensor::Tensor;
use cudarc::driver::PushKernelArg;

/// See [`crate::backend::DeviceOps::update`].
pub(super) fn update(
    backend: &CudaOps,
    name: &'static str,
    op: Update,
    dst: &Tensor,
    operands: &[&Tensor],
) -> Result<()> {
    if dst.numel() == 0 {
        return Ok(());
    }
    let t = suffix(dst.dtype());
    // (kernel, scalars after the pointers, inputs after `dst`)
    let (kernel, scalars, inputs): (String, Vec<f64>, usize) = match op {
        Update::Unary(u) => {
            let (p0, p1) = unary_parameters(u);
            (format!("unary_{}_{t}", u.name()), vec![p0, p1], 0)
        }
        Update::Log1p => (format!("unary_log1p_{t}"), vec![0.0, 0.0], 0),
        Update::LogSigmoid => (format!("unary_log_sigmoid_{t}"), vec![0.0, 0.0], 0),
        Update::Binary(b) => (format!("binary_{}_{t}", b.name()), vec![], 1),
        Update::AddScaled(alpha) => (format!("binary_add_scaled_{t}"), vec![alpha], 1),
        Update::Lerp(weight) => (format!("binary_lerp_{t}"), vec![weight], 1),
        Update::Addcmul(value) => (format!("ternary_addcmul_{t}"), vec![value], 2),
        Update::Addcdiv(value) => (format!("ternary_addcdiv_{t}"), vec![value], 2),
    };
    let others = operands
        .get(..inputs)
        .ok_or_else(|| crate::error::TensorError::internal(name, format!("{kernel} needs {inputs} operand(s)")))?;
    // Operand 0 is the output (dst), then the inputs: dst itself, then the others.
    let mut strides: Vec<&[isize]> = vec![dst.layout().strides(), dst.layout().strides()];
    strides.extend(others.iter().map(|t| t.layout().strides()));
    let s = StridedArg(coalesce(name, dst.dims(), &strides)?);
    let f = backend.function(name, "elementwise", &kernel)?;
    let stream = backend.current_stream()?;
    let at = address(name, dst)?;
    let pointers = others.iter().map(|t| address(name, t)).collect::<Result<Vec<u64>>>()?;
    let mut launch = stream.launch_builder(&f);
    launch.arg(&s).arg(&at);
    for p in &pointers {
        launch.arg(p);
    }
    launch.arg(&at);
    for v in &scalars {
        launch.arg(v);
    }
    let span = backend.launch_span(&kernel);
    // SAFETY: `s` describes `dst`'s view (written and read with the same
    // strides, which the ABI allows) and each operand's view, all within
    // their storages; operands do not overlap `dst` otherwise (the op copies
    // a sharing operand first). The parameters are the ABI's `(Strided,
    // const T* dst, [const T* operands..], T* dst, [double scalars..])`.
    unsafe { launch.launch(grid_for(dst.numel())) }
        .map_err(|e| backend.call_error(name, format!("launching {kernel}"), e))?;
    drop(span);
    Ok(())
}
