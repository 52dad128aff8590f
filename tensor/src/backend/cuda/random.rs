//! Random fills on CUDA: the Philox4x32-10 stream of `brasa-kernels`'
//! `random.cu`, element `i` at stream position `offset + i` as on the host,
//! drawn straight in the tensor's dtype (uniform and Bernoulli draws are
//! bit-identical to the host's; normal ones may differ in the last bits of
//! `log` and `cos`).

use super::elementwise::finish;
use super::{grid_for, output_address, suffix, CudaOps};
use crate::backend::Distribution;
use crate::default_generator::reserve_draws;
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::Shape;
use crate::storage::UninitTensor;
use crate::tensor::Tensor;
use cudarc::driver::PushKernelArg;

/// See [`crate::backend::DeviceOps::random`].
pub(super) fn random(
    backend: &CudaOps,
    op: &'static str,
    dist: Distribution,
    shape: &Shape,
    dtype: DType,
) -> Result<Tensor> {
    let out = UninitTensor::new(shape.clone(), dtype, backend.device)?;
    let n = shape.numel();
    if n == 0 {
        return Ok(finish(out));
    }
    let generator = reserve_draws(n);
    let (seed, offset, count) = (generator.seed(), generator.offset(), n as i64);
    let (kernel, params) = match dist {
        Distribution::Uniform { low, high } => (format!("random_uniform_{}", suffix(dtype)), vec![low, high]),
        Distribution::Normal { mean, std } => (format!("random_normal_{}", suffix(dtype)), vec![mean, std]),
        Distribution::Bernoulli { p } => (format!("random_bernoulli_{}", suffix(dtype)), vec![p]),
    };
    let f = backend.function(op, "random", &kernel)?;
    let stream = backend.current_stream()?;
    let dst = output_address(op, &out)?;
    let mut launch = stream.launch_builder(&f);
    launch.arg(&count).arg(&seed).arg(&offset);
    for p in &params {
        launch.arg(p);
    }
    launch.arg(&dst);
    let span = backend.launch_span(&kernel);
    // SAFETY: `out` holds `n` elements of `dtype`; the parameters are the
    // ABI's `(i64 n, u64 seed, u64 offset, double.., T* out)`.
    unsafe { launch.launch(grid_for(n)) }.map_err(|e| backend.call_error(op, format!("launching {kernel}"), e))?;
    drop(span);
    Ok(finish(out))
}
