//! Pooling on CUDA: max pooling (values and flat in-plane indices) and
//! average pooling, forward and backward, one thread per output (forward)
//! or input (average backward) element. Max pooling's backward is a
//! `scatter_add_` of the gradient at the indices into zeros, so windows that
//! chose one position add up as on the host.

use super::elementwise::finish;
use super::{address, grid_for, output_address, suffix, CudaOps};
use crate::backend::PoolPlan;
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::Shape;
use crate::storage::UninitTensor;
use crate::tensor::Tensor;
use brasa_kernels::cuda_ptx::Pool2d;
use cudarc::driver::{DeviceRepr, PushKernelArg};

/// [`Pool2d`] as a kernel argument (by value, 80 bytes).
#[repr(transparent)]
struct Pool2dArg(Pool2d);

// SAFETY: `Pool2d` is `#[repr(C)]` plain data matching the ABI's C struct
// (its size and offsets are tested in brasa-kernels).
unsafe impl DeviceRepr for Pool2dArg {}

fn geometry(plan: &PoolPlan) -> Pool2dArg {
    let ((in_h, in_w), (out_h, out_w)) = (plan.geometry.input(), plan.geometry.output());
    let i = |v: usize| v as i64;
    Pool2dArg(Pool2d {
        in_h: i(in_h),
        in_w: i(in_w),
        k_h: i(plan.kernel.0),
        k_w: i(plan.kernel.1),
        stride_h: i(plan.stride.0),
        stride_w: i(plan.stride.1),
        pad_h: i(plan.padding.0),
        pad_w: i(plan.padding.1),
        out_h: i(out_h),
        out_w: i(out_w),
    })
}

/// `(planes, channels, [sn, sc, sh, sw])` of a `[N, C, H, W]` or `[C, H, W]` view.
fn planes(x: &Tensor) -> (i64, i64, [i64; 4]) {
    let (d, s) = (x.dims(), x.strides());
    if x.rank() == 3 {
        (d[0] as i64, d[0] as i64, [0, s[0] as i64, s[1] as i64, s[2] as i64])
    } else {
        ((d[0] * d[1]) as i64, d[1] as i64, [s[0] as i64, s[1] as i64, s[2] as i64, s[3] as i64])
    }
}

pub(super) fn max_pool2d(backend: &CudaOps, input: &Tensor, plan: &PoolPlan) -> Result<(Tensor, Tensor)> {
    const OP: &str = "max_pool2d";
    let shape = plan.output_shape();
    let values = UninitTensor::new(shape.clone(), input.dtype(), backend.device)?;
    let indices = UninitTensor::new(shape.clone(), DType::I64, backend.device)?;
    if shape.numel() > 0 {
        let kernel = format!("max_pool2d_{}", suffix(input.dtype()));
        let f = backend.function(OP, "pool", &kernel)?;
        let stream = backend.current_stream()?;
        let g = geometry(plan);
        let (planes, channels, [sn, sc, sh, sw]) = planes(input);
        let (src, out, idx) = (address(OP, input)?, output_address(OP, &values)?, output_address(OP, &indices)?);
        let span = backend.launch_span(&kernel);
        // SAFETY: `input` is a view of live device memory described by its
        // strides; both outputs hold one element per pooled position; the
        // parameters are the ABI's `(Pool2d, i64 planes, i64 channels,
        // const T*, i64 sn, i64 sc, i64 sh, i64 sw, T*, i64*)`.
        unsafe {
            stream
                .launch_builder(&f)
                .arg(&g)
                .arg(&planes)
                .arg(&channels)
                .arg(&src)
                .arg(&sn)
                .arg(&sc)
                .arg(&sh)
                .arg(&sw)
                .arg(&out)
                .arg(&idx)
                .launch(grid_for(shape.numel()))
        }
        .map_err(|e| backend.call_error(OP, format!("launching {kernel}"), e))?;
        drop(span);
    }
    Ok((finish(values), finish(indices)))
}

pub(super) fn max_pool2d_backward(
    _backend: &CudaOps,
    grad: &Tensor,
    indices: &Tensor,
    input_shape: &Shape,
) -> Result<Tensor> {
    let rank = input_shape.rank();
    let dims = input_shape.dims();
    let plane_in = dims[rank - 2] * dims[rank - 1];
    let planes: usize = dims[..rank - 2].iter().product();
    let plane_out = grad.dims()[rank - 2] * grad.dims()[rank - 1];
    let as2 = |t: &Tensor, per_plane: usize| t.reshape(&[planes as isize, per_plane as isize]);
    let grad_in = Tensor::zeros_on([planes, plane_in], grad.dtype(), grad.device())?;
    grad_in.scatter_add_(1, &as2(indices, plane_out)?, &as2(grad, plane_out)?)?;
    let shape: Vec<isize> = dims.iter().map(|&d| d as isize).collect();
    grad_in.reshape(&shape)
}

pub(super) fn avg_pool2d(
    backend: &CudaOps,
    input: &Tensor,
    plan: &PoolPlan,
    count_include_pad: bool,
) -> Result<Tensor> {
    const OP: &str = "avg_pool2d";
    let shape = plan.output_shape();
    let out = UninitTensor::new(shape.clone(), input.dtype(), backend.device)?;
    if shape.numel() > 0 {
        let kernel = format!("avg_pool2d_{}", suffix(input.dtype()));
        let f = backend.function(OP, "pool", &kernel)?;
        let stream = backend.current_stream()?;
        let g = geometry(plan);
        let (planes, channels, [sn, sc, sh, sw]) = planes(input);
        let (src, dst) = (address(OP, input)?, output_address(OP, &out)?);
        let include = i32::from(count_include_pad);
        let span = backend.launch_span(&kernel);
        // SAFETY: as for max pooling; the parameters are the ABI's
        // `(Pool2d, i64 planes, i64 channels, const T*, i64 sn, i64 sc, i64
        // sh, i64 sw, T*, int count_include_pad)`.
        unsafe {
            stream
                .launch_builder(&f)
                .arg(&g)
                .arg(&planes)
                .arg(&channels)
                .arg(&src)
                .arg(&sn)
                .arg(&sc)
                .arg(&sh)
                .arg(&sw)
                .arg(&dst)
                .arg(&include)
                .launch(grid_for(shape.numel()))
        }
        .map_err(|e| backend.call_error(OP, format!("launching {kernel}"), e))?;
        drop(span);
    }
    Ok(finish(out))
}

pub(super) fn avg_pool2d_backward(
    backend: &CudaOps,
    grad: &Tensor,
    plan: &PoolPlan,
    count_include_pad: bool,
) -> Result<Tensor> {
    const OP: &str = "avg_pool2d_backward";
    let grad = grad.contiguous()?;
    let shape = plan.input_shape();
    let out = UninitTensor::new(shape.clone(), grad.dtype(), backend.device)?;
    if shape.numel() > 0 {
        let kernel = format!("avg_pool2d_backward_{}", suffix(grad.dtype()));
        let f = backend.function(OP, "pool", &kernel)?;
        let stream = backend.current_stream()?;
        let g = geometry(plan);
        let planes = plan.lead.iter().product::<usize>() as i64;
        let (src, dst) = (address(OP, &grad)?, output_address(OP, &out)?);
        let include = i32::from(count_include_pad);
        let span = backend.launch_span(&kernel);
        // SAFETY: `grad` is contiguous with the pooled shape and `out` a new
        // contiguous input-shaped tensor the kernel writes entirely; the
        // parameters are the ABI's `(Pool2d, i64 planes, const T*, T*, int)`.
        unsafe {
            stream
                .launch_builder(&f)
                .arg(&g)
                .arg(&planes)
                .arg(&src)
                .arg(&dst)
                .arg(&include)
                .launch(grid_for(shape.numel()))
        }
        .map_err(|e| backend.call_error(OP, format!("launching {kernel}"), e))?;
        drop(span);
    }
    Ok(finish(out))
}
