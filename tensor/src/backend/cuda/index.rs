//! Indexing on CUDA: `index_select` / `embedding`, `gather`, `scatter_add_`
//! (atomics: repeated indices accumulate, in no fixed order for floats) and
//! `one_hot`. The op has checked every index on the host, so the kernels'
//! bad-index flag (`cuda_ptx::NO_BAD_INDEX` until a kernel meets one) is
//! only a guard that keeps a wrong index from touching memory.

use super::elementwise::{finish, full_scalar, StridedArg};
use super::strided::coalesce;
use super::{address, grid_for, output_address, suffix, CudaOps};
use crate::backend::Indices;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::shape::Shape;
use crate::storage::UninitTensor;
use crate::tensor::Tensor;
use brasa_kernels::cuda_ptx::NO_BAD_INDEX;
use cudarc::driver::PushKernelArg;

/// A device `i64` holding [`NO_BAD_INDEX`], for the kernels' flag.
fn bad_index_flag(backend: &CudaOps, name: &'static str) -> Result<Tensor> {
    full_scalar(backend, name, DType::I64, NO_BAD_INDEX as f64)
}

/// `x`'s strides with dim `dim`'s set to 0: the base of each gathered or
/// scattered element, over the index's shape.
fn base_strides(x: &Tensor, dim: usize) -> Vec<isize> {
    let mut strides = x.strides().to_vec();
    if let Some(s) = strides.get_mut(dim) {
        *s = 0;
    }
    strides
}

pub(super) fn index_select(
    backend: &CudaOps,
    name: &'static str,
    x: &Tensor,
    ids: Indices<'_>,
    size: usize,
    inner: usize,
    shape: &Shape,
) -> Result<Tensor> {
    let out = UninitTensor::new(shape.clone(), x.dtype(), backend.device)?;
    let count = ids.tensor.numel();
    let total = shape.numel();
    if total == 0 {
        return Ok(finish(out));
    }
    let outer = total / (count * inner);
    let kernel = format!("index_select_{}", suffix(x.dtype()));
    let f = backend.function(name, "index", &kernel)?;
    let stream = backend.current_stream()?;
    let flag = bad_index_flag(backend, name)?;
    let (src, index, dst, bad) =
        (address(name, x)?, address(name, ids.tensor)?, output_address(name, &out)?, address(name, &flag)?);
    let (outer_, size_, inner_, count_) = (outer as i64, size as i64, inner as i64, count as i64);
    let span = backend.launch_span(&kernel);
    // SAFETY: `x` is a contiguous `[outer, size, inner]` view, the index a
    // contiguous i64 tensor of `count` checked ids, `out` holds
    // `outer · count · inner` elements; the parameters are the ABI's
    // `(i64 outer, i64 size, i64 inner, i64 count, const T*, const i64*, T*, i64*)`.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&outer_)
            .arg(&size_)
            .arg(&inner_)
            .arg(&count_)
            .arg(&src)
            .arg(&index)
            .arg(&dst)
            .arg(&bad)
            .launch(grid_for(total.max(count)))
    }
    .map_err(|e| backend.call_error(name, format!("launching {kernel}"), e))?;
    drop(span);
    Ok(finish(out))
}

pub(super) fn gather(
    backend: &CudaOps,
    name: &'static str,
    x: &Tensor,
    dim: usize,
    index: Indices<'_>,
) -> Result<Tensor> {
    let shape = index.tensor.shape().clone();
    let out = UninitTensor::new(shape.clone(), x.dtype(), backend.device)?;
    if shape.numel() == 0 {
        return Ok(finish(out));
    }
    let contiguous = shape.contiguous_strides();
    let bases = base_strides(x, dim);
    let s = StridedArg(coalesce(name, shape.dims(), &[&contiguous, &bases, index.tensor.strides()])?);
    let kernel = format!("gather_{}", suffix(x.dtype()));
    let f = backend.function(name, "index", &kernel)?;
    let stream = backend.current_stream()?;
    let flag = bad_index_flag(backend, name)?;
    let (src, ids, dst, bad) =
        (address(name, x)?, address(name, index.tensor)?, output_address(name, &out)?, address(name, &flag)?);
    let (size, stride) = (x.dims()[dim] as i64, x.strides()[dim] as i64);
    let span = backend.launch_span(&kernel);
    // SAFETY: `s` walks the index's shape: the contiguous output, `x`'s
    // bases (its strides, 0 along `dim`) and the index; every id is within
    // `0..size` (checked), so `base + id · stride` stays in `x`'s view. The
    // parameters are the ABI's `(Strided, const T*, const i64*, T*, i64 size,
    // i64 stride, i64*)`.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&s)
            .arg(&src)
            .arg(&ids)
            .arg(&dst)
            .arg(&size)
            .arg(&stride)
            .arg(&bad)
            .launch(grid_for(shape.numel()))
    }
    .map_err(|e| backend.call_error(name, format!("launching {kernel}"), e))?;
    drop(span);
    Ok(finish(out))
}

pub(super) fn scatter_add(
    backend: &CudaOps,
    name: &'static str,
    dst: &Tensor,
    dim: usize,
    index: Indices<'_>,
    src: &Tensor,
) -> Result<()> {
    let dims = index.tensor.dims();
    let numel: usize = dims.iter().product();
    if numel == 0 {
        return Ok(());
    }
    let bases = base_strides(dst, dim);
    let s = StridedArg(coalesce(name, dims, &[&bases, index.tensor.strides(), src.strides()])?);
    let kernel = format!("scatter_add_{}", suffix(dst.dtype()));
    let f = backend.function(name, "index", &kernel)?;
    let stream = backend.current_stream()?;
    let flag = bad_index_flag(backend, name)?;
    let (to, ids, from, bad) =
        (address(name, dst)?, address(name, index.tensor)?, address(name, src)?, address(name, &flag)?);
    let (size, stride) = (dst.dims()[dim] as i64, dst.strides()[dim] as i64);
    let span = backend.launch_span(&kernel);
    // SAFETY: `s` walks the index's shape: `dst`'s bases (0 along `dim`),
    // the index and `src` (narrowed to the index's shape, not sharing
    // `dst`'s storage); every id is within `0..size` (checked). The
    // parameters are the ABI's `(Strided, T* dst, const i64*, const T* src,
    // i64 size, i64 stride, i64*)`.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&s)
            .arg(&to)
            .arg(&ids)
            .arg(&from)
            .arg(&size)
            .arg(&stride)
            .arg(&bad)
            .launch(grid_for(numel))
    }
    .map_err(|e| backend.call_error(name, format!("launching {kernel}"), e))?;
    drop(span);
    Ok(())
}

pub(super) fn one_hot(backend: &CudaOps, ids: Indices<'_>, num_classes: usize, shape: &Shape) -> Result<Tensor> {
    const OP: &str = "one_hot";
    let out = UninitTensor::new(shape.clone(), DType::I64, backend.device)?;
    let n = ids.tensor.numel();
    if shape.numel() == 0 {
        return Ok(finish(out));
    }
    let f = backend.function(OP, "index", "one_hot")?;
    let stream = backend.current_stream()?;
    let flag = bad_index_flag(backend, OP)?;
    let (src, dst, bad) = (address(OP, ids.tensor)?, output_address(OP, &out)?, address(OP, &flag)?);
    let (n_, classes) = (n as i64, num_classes as i64);
    let span = backend.launch_span("one_hot");
    // SAFETY: the ids are a contiguous i64 tensor of `n` checked classes and
    // `out` holds `n · num_classes` i64; the parameters are the ABI's
    // `(i64 n, i64 classes, const i64*, i64*, i64*)`.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&n_)
            .arg(&classes)
            .arg(&src)
            .arg(&dst)
            .arg(&bad)
            .launch(grid_for(shape.numel().max(n)))
    }
    .map_err(|e| backend.call_error(OP, "launching one_hot", e))?;
    drop(span);
    Ok(finish(out))
}

/// Checks for `op` on the device that every index of `index` lies in `0..size`: a
/// min/max reduction and two values read back, all of them read only when
/// one is out of range (to name the first bad one through `error`).
pub(super) fn check_on_device(
    op: &'static str,
    index: &Tensor,
    size: usize,
    error: &dyn Fn(brasa_kernels::index::IndexError) -> TensorError,
) -> Result<Vec<i64>> {
    let flat = index.reshape(&[-1])?;
    let (low, high) = (flat.min(&[0], false)?, flat.max(&[0], false)?);
    let bounds = Tensor::stack(&[&low, &high], 0)?.to_vec::<i64>()?;
    if bounds.len() == 2 && bounds[0] >= 0 && (bounds[1] as u64) < size as u64 {
        return Ok(Vec::new());
    }
    // Out of range: read them all to name the first bad one.
    crate::backend::read_checked_indices(index, size, error)?;
    Err(TensorError::internal(op, format!("the device saw indices in {bounds:?} outside 0..{size}")))
}
