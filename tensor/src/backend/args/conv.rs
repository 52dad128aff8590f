//! A convolution's checked sizes, as the devices see them.

use crate::shape::Shape;
use crate::tensor::Tensor;
use brasa_kernels::conv::Conv2dGeometry;

/// Whether a convolution of `a` with `b` (input and weight, or the two
/// operands of a gradient) runs channels-last and returns a channels-last
/// result — PyTorch's rule (`suggest_memory_format` of either): when
/// either is channels-last and not also row-major (a tensor with one
/// channel or a 1×1 image is both, and then says nothing). The host and
/// cuDNN follow it.
pub(crate) fn channels_last_operands(a: &Tensor, b: &Tensor) -> bool {
    a.is_strictly_channels_last() || b.is_strictly_channels_last()
}

/// `[N, C, H, W]` as the channels-last buffer's row-major `[N, H, W, C]`.
pub(crate) fn channels_last_dims(shape: &Shape) -> Shape {
    let d = shape.dims();
    Shape::from([d[0], d[2], d[3], d[1]])
}

/// The checked sizes of one convolution (built by `crate::ops::conv`,
/// which checks them).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConvPlan {
    /// Images.
    pub batch: usize,
    /// Input channels (all groups).
    pub c_in: usize,
    /// Output channels (all groups).
    pub c_out: usize,
    /// Channel groups.
    pub groups: usize,
    /// One group's geometry (its `channels` are `c_in / groups`).
    pub geometry: Conv2dGeometry,
    /// Step between applications of the kernel, (height, width), as given
    /// (the CUDA kernels take stride, padding and dilation whole; the host's
    /// geometry carries them inside).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub stride: (usize, usize),
    /// Zeros added on each side, (height, width).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub padding: (usize, usize),
    /// Spacing between kernel elements, (height, width).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub dilation: (usize, usize),
}

impl ConvPlan {
    /// `[N, C_out, H_out, W_out]`.
    pub(crate) fn output_shape(&self) -> Shape {
        let (h, w) = self.geometry.output();
        Shape::from([self.batch, self.c_out, h, w])
    }

    /// `[N, C_in, H, W]`.
    pub(crate) fn input_shape(&self) -> Shape {
        let (h, w) = self.geometry.input();
        Shape::from([self.batch, self.c_in, h, w])
    }

    /// `[C_out, C_in / groups, kH, kW]`.
    pub(crate) fn weight_shape(&self) -> Shape {
        let (kh, kw) = self.geometry.kernel();
        Shape::from([self.c_out, self.geometry.channels(), kh, kw])
    }

    /// Output channels per group.
    pub(crate) fn c_out_group(&self) -> usize {
        self.c_out / self.groups
    }
}
