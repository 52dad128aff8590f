//! Convolutions on CUDA: on cuDNN when it is loaded and enabled (see
//! `cudnn`, which answers `None` when it does not take a convolution), and
//! otherwise the im2col composition of `backend::im2col` over this file's
//! `im2col` and `col2im` kernels, its products on cuBLAS (through
//! [`Tensor::matmul`], so the transposes are cuBLAS flags). The column
//! matrix of the whole batch is allocated at once from the device's caching
//! allocator (a wide padding makes it large; an out-of-memory is the usual
//! error). The bias gradient is `backend::im2col::conv2d_backward_bias`.

use super::cudnn;
use super::elementwise::finish;
use super::{address, grid_for, output_address, suffix, CudaOps};
use crate::backend::im2col::{self, ColumnKernels};
use crate::backend::ConvPlan;
use crate::error::Result;
use crate::shape::Shape;
use crate::storage::UninitTensor;
use crate::tensor::Tensor;
use brasa_kernels::cuda_ptx::Conv2d;
use cudarc::driver::{DeviceRepr, PushKernelArg};

/// [`Conv2d`] as a kernel argument (by value, 104 bytes).
#[repr(transparent)]
struct Conv2dArg(Conv2d);

// SAFETY: `Conv2d` is `#[repr(C)]` plain data matching the ABI's C struct
// (its size and offsets are tested in brasa-kernels).
unsafe impl DeviceRepr for Conv2dArg {}

/// One group's geometry as the kernels take it.
fn geometry(plan: &ConvPlan) -> Conv2dArg {
    let g = &plan.geometry;
    let p = plan;
    let ((in_h, in_w), (k_h, k_w), (out_h, out_w)) = (g.input(), g.kernel(), g.output());
    let i = |v: usize| v as i64;
    Conv2dArg(Conv2d {
        channels: i(g.channels()),
        in_h: i(in_h),
        in_w: i(in_w),
        k_h: i(k_h),
        k_w: i(k_w),
        stride_h: i(p.stride.0),
        stride_w: i(p.stride.1),
        pad_h: i(p.padding.0),
        pad_w: i(p.padding.1),
        dil_h: i(p.dilation.0),
        dil_w: i(p.dilation.1),
        out_h: i(out_h),
        out_w: i(out_w),
    })
}

/// The columns `[N, K, P]` of group `group` of `input` (any strides).
fn im2col(backend: &CudaOps, name: &'static str, input: &Tensor, group: usize, plan: &ConvPlan) -> Result<Tensor> {
    let channels = plan.geometry.channels();
    let x = input.narrow(1, group * channels, channels)?;
    let (k, p) = (plan.geometry.col_rows(), plan.geometry.col_cols());
    let shape = Shape::from([plan.batch, k, p]);
    let out = UninitTensor::new(shape.clone(), input.dtype(), backend.device)?;
    if shape.numel() == 0 {
        return Ok(finish(out));
    }
    let kernel = format!("im2col_{}", suffix(input.dtype()));
    let f = backend.function(name, "conv", &kernel)?;
    let stream = backend.current_stream()?;
    let g = geometry(plan);
    let batch = plan.batch as i64;
    let s = x.strides();
    let (sn, sc, sh, sw) = (s[0] as i64, s[1] as i64, s[2] as i64, s[3] as i64);
    let (src, dst) = (address(name, &x)?, output_address(name, &out)?);
    let span = backend.launch_span(&kernel);
    // SAFETY: `x` is a 4-d view of live device memory described by its
    // strides; `out` holds `N · K · P` elements; the parameters are the ABI's
    // `(Conv2d, i64 batch, const T*, i64 sn, i64 sc, i64 sh, i64 sw, T*)`.
    unsafe {
        stream
            .launch_builder(&f)
            .arg(&g)
            .arg(&batch)
            .arg(&src)
            .arg(&sn)
            .arg(&sc)
            .arg(&sh)
            .arg(&sw)
            .arg(&dst)
            .launch(grid_for(shape.numel()))
    }
    .map_err(|e| backend.call_error(name, format!("launching {kernel}"), e))?;
    drop(span);
    Ok(finish(out))
}

/// The image `[N, C_in/g, H, W]` folded from columns `[N, K, P]` (contiguous).
fn col2im(backend: &CudaOps, name: &'static str, col: &Tensor, plan: &ConvPlan) -> Result<Tensor> {
    let (h, w) = plan.geometry.input();
    let shape = Shape::from([plan.batch, plan.geometry.channels(), h, w]);
    let out = UninitTensor::new(shape.clone(), col.dtype(), backend.device)?;
    if shape.numel() == 0 {
        return Ok(finish(out));
    }
    let kernel = format!("col2im_{}", suffix(col.dtype()));
    let f = backend.function(name, "conv", &kernel)?;
    let stream = backend.current_stream()?;
    let g = geometry(plan);
    let batch = plan.batch as i64;
    let (src, dst) = (address(name, col)?, output_address(name, &out)?);
    let span = backend.launch_span(&kernel);
    // SAFETY: `col` is a contiguous `[N, K, P]` tensor and `out` a new
    // contiguous image the kernel overwrites entirely; the parameters are the
    // ABI's `(Conv2d, i64 batch, const T*, T*)`.
    unsafe { stream.launch_builder(&f).arg(&g).arg(&batch).arg(&src).arg(&dst).launch(grid_for(shape.numel())) }
        .map_err(|e| backend.call_error(name, format!("launching {kernel}"), e))?;
    drop(span);
    Ok(finish(out))
}

impl ColumnKernels for CudaOps {
    fn im2col(&self, op: &'static str, input: &Tensor, group: usize, plan: &ConvPlan) -> Result<Tensor> {
        im2col(self, op, input, group, plan)
    }

    fn col2im(&self, op: &'static str, col: &Tensor, plan: &ConvPlan) -> Result<Tensor> {
        col2im(self, op, col, plan)
    }
}

pub(super) fn conv2d(
    backend: &CudaOps,
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    plan: &ConvPlan,
) -> Result<Tensor> {
    match cudnn::conv2d(backend, input, weight, plan)? {
        Some(out) => {
            im2col::add_bias(&out, bias, plan.c_out)?;
            Ok(out)
        }
        None => im2col::conv2d(backend, input, weight, bias, plan),
    }
}

pub(super) fn conv2d_backward_input(
    backend: &CudaOps,
    grad: &Tensor,
    weight: &Tensor,
    plan: &ConvPlan,
) -> Result<Tensor> {
    match cudnn::conv2d_backward_input(backend, grad, weight, plan)? {
        Some(dx) => Ok(dx),
        None => im2col::conv2d_backward_input(backend, grad, weight, plan),
    }
}

pub(super) fn conv2d_backward_weight(
    backend: &CudaOps,
    input: &Tensor,
    grad: &Tensor,
    plan: &ConvPlan,
) -> Result<Tensor> {
    match cudnn::conv2d_backward_weight(backend, input, grad, plan)? {
        Some(dw) => Ok(dw),
        None => im2col::conv2d_backward_weight(backend, input, grad, plan),
    }
}
