//! cuDNN's tensor, filter and convolution descriptors as owned values
//! (destroyed when dropped), and the two memory formats brasa hands cuDNN.

use super::api::{Api, CudnnError, Status, STATUS_SUCCESS};
use super::Failure;
use crate::backend::ConvPlan;
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;
use cudarc::cudnn::sys::{
    cudnnConvolutionDescriptor_t, cudnnConvolutionMode_t, cudnnDataType_t, cudnnFilterDescriptor_t, cudnnMathType_t,
    cudnnTensorDescriptor_t, cudnnTensorFormat_t,
};
use std::ffi::c_int;

/// `Ok` for `CUDNN_STATUS_SUCCESS`, otherwise the [`Failure`] for `what`.
pub(super) fn check(api: &Api, status: Status, what: &str) -> std::result::Result<(), Failure> {
    if status == STATUS_SUCCESS {
        return Ok(());
    }
    let error = CudnnError { status, message: api.error_string(status) };
    if super::api::is_not_supported(status) {
        return Err(Failure::NotSupported(format!("{what}: {}", error.message)));
    }
    Err(Failure::Call { what: what.to_string(), error })
}

/// How a 4-d `[N, C, H, W]` tensor lies in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Format {
    /// Row-major `[N, C, H, W]` (PyTorch's `contiguous_format`).
    Nchw,
    /// Row-major `[N, H, W, C]`, seen as `[N, C, H, W]` (`channels_last`).
    Nhwc,
}

impl Format {
    /// The format for a convolution of `a` with `b` (input and weight, or
    /// the two operands of a gradient), PyTorch's rule: channels-last when
    /// either is channels-last and not also NCHW-contiguous (a tensor with
    /// one channel or a 1×1 image is both, and then says nothing).
    pub(super) fn for_operands(a: &Tensor, b: &Tensor) -> Format {
        if crate::backend::args::channels_last_operands(a, b) {
            Format::Nhwc
        } else {
            Format::Nchw
        }
    }

    /// The element strides of a dense `dims` (`[N, C, H, W]`) tensor in this
    /// format, in the `[N, C, H, W]` order cuDNN's descriptors take.
    pub(super) fn strides(self, dims: [c_int; 4]) -> [c_int; 4] {
        let [_, c, h, w] = dims;
        match self {
            Format::Nchw => [c * h * w, h * w, w, 1],
            Format::Nhwc => [h * w * c, 1, w * c, c],
        }
    }

    /// `t` (4-d) dense in this format: itself when it already is, a copy
    /// otherwise.
    pub(super) fn dense(self, t: &Tensor) -> Result<Tensor> {
        match self {
            Format::Nchw => t.contiguous(),
            Format::Nhwc if t.is_channels_last() => Ok(t.clone()),
            Format::Nhwc => t.to_channels_last(),
        }
    }

    fn filter_format(self) -> cudnnTensorFormat_t {
        match self {
            Format::Nchw => cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
            Format::Nhwc => cudnnTensorFormat_t::CUDNN_TENSOR_NHWC,
        }
    }
}

/// cuDNN's data type for `dtype`, if cuDNN convolves it.
pub(super) fn data_type(dtype: DType) -> Option<cudnnDataType_t> {
    match dtype {
        DType::F32 => Some(cudnnDataType_t::CUDNN_DATA_FLOAT),
        DType::F64 => Some(cudnnDataType_t::CUDNN_DATA_DOUBLE),
        DType::F16 => Some(cudnnDataType_t::CUDNN_DATA_HALF),
        DType::BF16 => Some(cudnnDataType_t::CUDNN_DATA_BFLOAT16),
        DType::I64 | DType::U8 | DType::Bool => None,
    }
}

/// The math a convolution of `dtype` starts with: f32 without TF32 (FMA
/// only, so it matches the host), f64 as cuDNN likes, f16 and bf16 on tensor
/// cores.
pub(super) fn default_math(dtype: DType) -> cudnnMathType_t {
    match dtype {
        DType::F32 => cudnnMathType_t::CUDNN_FMA_MATH,
        DType::F16 | DType::BF16 => cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
        _ => cudnnMathType_t::CUDNN_DEFAULT_MATH,
    }
}

/// A `cudnnTensorDescriptor_t`.
pub(super) struct TensorDesc {
    api: &'static Api,
    pub raw: cudnnTensorDescriptor_t,
}

impl TensorDesc {
    /// A 4-d tensor of `dims` (`[N, C, H, W]`) dense in `format`.
    pub(super) fn new(
        api: &'static Api,
        dtype: cudnnDataType_t,
        dims: [c_int; 4],
        format: Format,
    ) -> std::result::Result<TensorDesc, Failure> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid place for the new descriptor.
        check(api, unsafe { (api.create_tensor)(&mut raw) }, "cudnnCreateTensorDescriptor")?;
        let desc = TensorDesc { api, raw };
        let strides = format.strides(dims);
        // SAFETY: `desc.raw` is a live descriptor; both arrays hold 4 ints.
        let status = unsafe { (api.set_tensor_nd)(desc.raw, dtype, 4, dims.as_ptr(), strides.as_ptr()) };
        check(api, status, "cudnnSetTensorNdDescriptor")?;
        Ok(desc)
    }
}

impl Drop for TensorDesc {
    fn drop(&mut self) {
        // SAFETY: created by cudnnCreateTensorDescriptor, destroyed once; a
        // failure here has nothing to report to.
        unsafe { (self.api.destroy_tensor)(self.raw) };
    }
}

/// A `cudnnFilterDescriptor_t`.
pub(super) struct FilterDesc {
    api: &'static Api,
    pub raw: cudnnFilterDescriptor_t,
}

impl FilterDesc {
    /// A weight `[K, C, kH, kW]` dense in `format`.
    pub(super) fn new(
        api: &'static Api,
        dtype: cudnnDataType_t,
        dims: [c_int; 4],
        format: Format,
    ) -> std::result::Result<FilterDesc, Failure> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid place for the new descriptor.
        check(api, unsafe { (api.create_filter)(&mut raw) }, "cudnnCreateFilterDescriptor")?;
        let desc = FilterDesc { api, raw };
        let [k, c, h, w] = dims;
        // SAFETY: `desc.raw` is a live descriptor; the sizes are positive
        // and fit an int (checked by the caller).
        let status = unsafe { (api.set_filter_4d)(desc.raw, dtype, format.filter_format(), k, c, h, w) };
        check(api, status, "cudnnSetFilter4dDescriptor")?;
        Ok(desc)
    }
}

impl Drop for FilterDesc {
    fn drop(&mut self) {
        // SAFETY: created by cudnnCreateFilterDescriptor, destroyed once.
        unsafe { (self.api.destroy_filter)(self.raw) };
    }
}

/// A `cudnnConvolutionDescriptor_t`: cross-correlation (PyTorch's
/// convolution), with the plan's padding, stride, dilation and groups.
pub(super) struct ConvDesc {
    api: &'static Api,
    pub raw: cudnnConvolutionDescriptor_t,
}

impl ConvDesc {
    pub(super) fn new(api: &'static Api, plan: &ConvPlan, dtype: DType) -> std::result::Result<ConvDesc, Failure> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a valid place for the new descriptor.
        check(api, unsafe { (api.create_conv)(&mut raw) }, "cudnnCreateConvolutionDescriptor")?;
        let desc = ConvDesc { api, raw };
        let int = |v: usize| c_int::try_from(v).map_err(|_| Failure::NotSupported(format!("{v} exceeds an int")));
        // f64 accumulates in f64; f32, f16 and bf16 in f32 (PyTorch's choice:
        // a half accumulator loses too much).
        let compute = match dtype {
            DType::F64 => cudnnDataType_t::CUDNN_DATA_DOUBLE,
            _ => cudnnDataType_t::CUDNN_DATA_FLOAT,
        };
        // SAFETY: `desc.raw` is a live descriptor; plain int arguments.
        let status = unsafe {
            (api.set_conv_2d)(
                desc.raw,
                int(plan.padding.0)?,
                int(plan.padding.1)?,
                int(plan.stride.0)?,
                int(plan.stride.1)?,
                int(plan.dilation.0)?,
                int(plan.dilation.1)?,
                cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                compute,
            )
        };
        check(api, status, "cudnnSetConvolution2dDescriptor")?;
        // SAFETY: as above.
        let status = unsafe { (api.set_conv_group_count)(desc.raw, int(plan.groups)?) };
        check(api, status, "cudnnSetConvolutionGroupCount")?;
        desc.set_math(default_math(dtype))?;
        Ok(desc)
    }

    /// Sets the math an algorithm runs with (tensor cores or not).
    pub(super) fn set_math(&self, math: cudnnMathType_t) -> std::result::Result<(), Failure> {
        // SAFETY: `self.raw` is a live descriptor.
        let status = unsafe { (self.api.set_conv_math_type)(self.raw, math) };
        check(self.api, status, "cudnnSetConvolutionMathType")
    }
}

impl Drop for ConvDesc {
    fn drop(&mut self) {
        // SAFETY: created by cudnnCreateConvolutionDescriptor, destroyed once.
        unsafe { (self.api.destroy_conv)(self.raw) };
    }
}
