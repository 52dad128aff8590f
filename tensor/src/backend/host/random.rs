//! The host's random fills: the counter-based generator drawn in parallel
//! chunks straight into the tensor's storage (f32 for the half types, then
//! converted), each chunk at its own stream position.

use crate::backend::Distribution;
use crate::default_generator::reserve_draws;
use crate::device::Device;
use crate::dispatch::dispatch_dtype;
use crate::dtype::DType;
use crate::error::Result;
use crate::rng::{Generator, RngError};
use crate::shape::Shape;
use crate::tensor::Tensor;
use rayon::prelude::*;

/// Elements one parallel task draws.
const RNG_CHUNK: usize = 1 << 16;

/// Fills `out` in parallel chunks from a freshly reserved range of the generator.
fn parallel_fill<T: Send>(
    out: &mut [T],
    fill: impl Fn(&Generator, &mut [T], u64) -> std::result::Result<(), RngError> + Sync,
) -> Result<()> {
    let generator = reserve_draws(out.len());
    let base = generator.offset();
    out.par_chunks_mut(RNG_CHUNK)
        .enumerate()
        .try_for_each(|(i, chunk)| fill(&generator, chunk, base + (i * RNG_CHUNK) as u64))?;
    Ok(())
}

/// See [`crate::backend::DeviceOps::random`].
pub(super) fn random(
    op: &'static str,
    dist: Distribution,
    shape: &Shape,
    dtype: DType,
    device: Device,
) -> Result<Tensor> {
    if let Distribution::Bernoulli { p } = dist {
        // Drawn straight into the tensor: the values are 0 and 1 in any dtype.
        let out = Tensor::uninit(shape.clone(), dtype, device)?;
        return dispatch_dtype!(dtype, T => {
            // SAFETY: `parallel_fill` hands every chunk of the slice to
            // `fill_bernoulli_at`, which writes each element of its chunk and reads none.
            unsafe { out.init_with::<T>(op, |out| parallel_fill(out, |g, out, at| g.fill_bernoulli_at(out, at, p))) }
        });
    }
    // Drawn into the tensor's own storage (f32 for the half types), so the
    // allocator, not a Vec, answers for the size.
    let draw_dtype = if dtype == DType::F64 { DType::F64 } else { DType::F32 };
    let values = Tensor::uninit(shape.clone(), draw_dtype, device)?;
    // `parallel_fill` hands every chunk of the slice to the generator's
    // fill, which writes each element of its chunk and reads none.
    let values = match (draw_dtype, dist) {
        // SAFETY: as just said.
        (DType::F64, Distribution::Uniform { low, high }) => unsafe {
            values.init_with::<f64>(op, |out| parallel_fill(out, |g, o, at| g.fill_uniform_f64_at(o, at, low, high)))
        }?,
        // SAFETY: as just said.
        (DType::F64, Distribution::Normal { mean, std }) => unsafe {
            values.init_with::<f64>(op, |out| parallel_fill(out, |g, o, at| g.fill_normal_f64_at(o, at, mean, std)))
        }?,
        // SAFETY: as just said.
        (_, Distribution::Uniform { low, high }) => unsafe {
            values.init_with::<f32>(op, |out| {
                parallel_fill(out, |g, o, at| g.fill_uniform_f32_at(o, at, low as f32, high as f32))
            })
        }?,
        // SAFETY: as just said.
        (_, Distribution::Normal { mean, std }) => unsafe {
            values.init_with::<f32>(op, |out| {
                parallel_fill(out, |g, o, at| g.fill_normal_f32_at(o, at, mean as f32, std as f32))
            })
        }?,
        (_, Distribution::Bernoulli { .. }) => {
            return Err(crate::error::TensorError::internal(op, "Bernoulli draws take the path above"))
        }
    };
    values.to_dtype(dtype)
}
