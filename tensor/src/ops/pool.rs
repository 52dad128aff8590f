//! 2-d pooling: [`Tensor::max_pool2d`] (values and PyTorch's flat indices)
//! and [`Tensor::avg_pool2d`], with their backward passes; the `_with`
//! variants take a [`Pool2dParams`], which adds PyTorch's `ceil_mode`.
//! Inputs are `[N, C, H, W]` or unbatched `[C, H, W]`. The windows are checked here
//! ([`PoolPlan`]); the device pools the `H x W` planes
//! ([`crate::backend::DeviceOps::max_pool2d`] and the others; on the host,
//! planes split over threads, read in place whatever their strides).

use crate::backend::{ops_for, PoolPlan};
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::ops::common::{expect_dtype, expect_float, same_device};
use crate::shape::Shape;
use crate::tensor::Tensor;
use brasa_kernels::pool::Pool2dGeometry;
use brasa_kernels::KernelError;

/// The window of a 2-d pooling: kernel, stride and padding, each (height,
/// width), and whether output sizes round up (PyTorch's `ceil_mode`).
///
/// With `ceil_mode` the output has `ceil((H + 2p - k) / s) + 1` rows (not
/// `floor`), less one if the last window would start in the right padding;
/// a last window running past the padded input is clipped (for average
/// pooling with `count_include_pad`, its divisor counts the padding it
/// covers but not what lies beyond).
///
/// ```
/// # use brasa_tensor::{Pool2dParams, Tensor};
/// let x = Tensor::from_vec((1..=5).map(|v| v as f32).collect(), [1, 1, 5])?;
/// let p = Pool2dParams::new((1, 2)).with_ceil_mode(true);
/// assert_eq!(x.avg_pool2d_with(p, true)?.to_vec::<f32>()?, [1.5, 3.5, 5.0]);
/// assert_eq!(x.avg_pool2d((1, 2), (1, 2), (0, 0), true)?.to_vec::<f32>()?, [1.5, 3.5]);
/// # Ok::<(), brasa_tensor::TensorError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2dParams {
    /// Window size, (height, width).
    pub kernel: (usize, usize),
    /// Step between windows, (height, width).
    pub stride: (usize, usize),
    /// Implicit padding on each side, (height, width); at most half the kernel.
    pub padding: (usize, usize),
    /// Round output sizes up rather than down.
    pub ceil_mode: bool,
}

impl Pool2dParams {
    /// `kernel` windows with stride = kernel (PyTorch's default), no
    /// padding, output sizes rounded down.
    pub fn new(kernel: (usize, usize)) -> Self {
        Pool2dParams { kernel, stride: kernel, padding: (0, 0), ceil_mode: false }
    }

    /// With this stride, (height, width).
    pub fn with_stride(self, stride: (usize, usize)) -> Self {
        Pool2dParams { stride, ..self }
    }

    /// With this padding, (height, width).
    pub fn with_padding(self, padding: (usize, usize)) -> Self {
        Pool2dParams { padding, ..self }
    }

    /// Rounding output sizes up (`true`) or down (`false`, the default).
    pub fn with_ceil_mode(self, ceil_mode: bool) -> Self {
        Pool2dParams { ceil_mode, ..self }
    }

    /// The parameters of the positional pooling functions: output sizes
    /// rounded down.
    fn floor(kernel: (usize, usize), stride: (usize, usize), padding: (usize, usize)) -> Self {
        Pool2dParams { kernel, stride, padding, ceil_mode: false }
    }
}

/// The pooling of an input of shape `input` as the devices see it (its
/// planes, their geometry, the window), or the error `op` reports.
fn pool_plan(op: &'static str, input: &[usize], params: Pool2dParams) -> Result<PoolPlan> {
    let Pool2dParams { kernel, stride, padding, ceil_mode } = params;
    if !(3..=4).contains(&input.len()) {
        return Err(TensorError::shape(
            op,
            format!("expected a 4-d input [N, C, H, W] or a 3-d input [C, H, W], got shape {input:?}"),
        ));
    }
    let (lead, plane) = input.split_at(input.len() - 2);
    let geometry =
        Pool2dGeometry::with_ceil_mode((plane[0], plane[1]), kernel, stride, padding, ceil_mode).map_err(|e| {
            let detail = match e {
                KernelError::ShapeMismatch { detail } => detail,
                other => other.to_string(),
            };
            // Named only when set, so the messages of the positional
            // functions stay as they were.
            let ceil = if ceil_mode { ", ceil_mode" } else { "" };
            TensorError::invalid(
                op,
                format!(
                    "input {input:?} with kernel {kernel:?}, stride {stride:?}, padding {padding:?}{ceil}: {detail}"
                ),
            )
        })?;
    // The kernels divide by a window's size: it must be countable.
    let window = kernel
        .0
        .checked_mul(kernel.1)
        .ok_or_else(|| TensorError::invalid(op, format!("kernel {kernel:?} has more elements than a usize counts")))?;
    Ok(PoolPlan { lead: lead.to_vec(), geometry, window, kernel, stride, padding })
}

/// Errors unless a gradient has the pooled shape of `input_shape`.
fn expect_pooled_shape(op: &'static str, grad: &Tensor, plan: &PoolPlan) -> Result<()> {
    let expected = plan.output_shape();
    if grad.dims() != expected.dims() {
        return Err(TensorError::shape(
            op,
            format!(
                "grad_output has shape {:?} but pooling an input of shape {:?} gives {:?}",
                grad.dims(),
                plan.input_shape().dims(),
                expected.dims()
            ),
        ));
    }
    Ok(())
}

impl Tensor {
    /// Max pooling over `kernel` windows moved by `stride` over this
    /// `[N, C, H, W]` (or `[C, H, W]`) input padded by `padding` (padded
    /// positions never win); pairs are (height, width).
    ///
    /// Returns the maxima and, as i64, the flat index `h·W + w` of each
    /// maximum in its input plane (PyTorch's `return_indices=True`). Ties go
    /// to the first maximum in row-major order; NaN wins over any number.
    /// Kernel and stride must be positive and padding at most half the
    /// kernel. Supports the float dtypes, i64 and u8.
    ///
    /// ```
    /// # use brasa_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![1f32, 5.0, 2.0, 0.0, 3.0, 4.0, 9.0, 8.0], [1, 2, 4])?;
    /// let (values, indices) = x.max_pool2d((2, 2), (2, 2), (0, 0))?;
    /// assert_eq!(values.to_vec::<f32>()?, [5.0, 9.0]);
    /// assert_eq!(indices.to_vec::<i64>()?, [1, 6]);
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn max_pool2d(
        &self,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
    ) -> Result<(Tensor, Tensor)> {
        self.max_pool2d_with(Pool2dParams::floor(kernel, stride, padding))
    }

    /// [`Tensor::max_pool2d`] with its window given as [`Pool2dParams`],
    /// which can round output sizes up (`ceil_mode`). The indices are as
    /// [`Tensor::max_pool2d`]'s, and [`Tensor::max_pool2d_backward`] takes
    /// them unchanged.
    pub fn max_pool2d_with(&self, params: Pool2dParams) -> Result<(Tensor, Tensor)> {
        const OP: &str = "max_pool2d";
        let _range = brasa_profile::record_op(OP, &[self.dims()]);
        if self.dtype() == DType::Bool {
            return Err(TensorError::invalid(OP, "needs a numeric tensor (float, i64 or u8), got bool"));
        }
        let plan = pool_plan(OP, self.dims(), params)?;
        ops_for(self.device())?.max_pool2d(self, &plan)
    }

    /// The gradient of [`Tensor::max_pool2d`] with respect to its input: this
    /// output gradient is routed to the positions `indices` (as returned by
    /// the forward pass) name in each plane of an input of `input_shape`;
    /// every other position gets zero, and a position that was the maximum
    /// of several windows gets the sum of their gradients.
    pub fn max_pool2d_backward(&self, indices: &Tensor, input_shape: impl Into<Shape>) -> Result<Tensor> {
        const OP: &str = "max_pool2d_backward";
        let _range = brasa_profile::record_op(OP, &[self.dims()]);
        let input_shape = input_shape.into();
        same_device(OP, &[self, indices])?;
        expect_float(OP, self)?;
        expect_dtype(OP, indices, DType::I64)?;
        if indices.dims() != self.dims() {
            return Err(TensorError::shape(
                OP,
                format!("indices have shape {:?} but grad_output has shape {:?}", indices.dims(), self.dims()),
            ));
        }
        let input = input_shape.dims();
        let compatible = input.len() == self.rank()
            && (3..=4).contains(&input.len())
            && input[..input.len() - 2] == self.dims()[..self.rank() - 2];
        if !compatible || input[input.len() - 2..].contains(&0) {
            return Err(TensorError::shape(
                OP,
                format!(
                    "input shape {input:?} does not fit grad_output {:?}: expected [N, C, H, W] or [C, H, W] with \
                     the gradient's leading dims and H, W > 0",
                    self.dims()
                ),
            ));
        }
        let (grad, indices) = (self.contiguous()?, indices.contiguous()?);
        ops_for(self.device())?.max_pool2d_backward(&grad, &indices, &input_shape)
    }

    /// Average pooling over `kernel` windows moved by `stride` over this
    /// `[N, C, H, W]` (or `[C, H, W]`) float input padded with zeros by
    /// `padding`; pairs are (height, width). With `count_include_pad` (the
    /// PyTorch default) every window divides by `kH·kW`; without it, by the
    /// number of input elements it covers. f16 and bf16 are computed in f32.
    pub fn avg_pool2d(
        &self,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
        count_include_pad: bool,
    ) -> Result<Tensor> {
        self.avg_pool2d_with(Pool2dParams::floor(kernel, stride, padding), count_include_pad)
    }

    /// [`Tensor::avg_pool2d`] with its window given as [`Pool2dParams`],
    /// which can round output sizes up (`ceil_mode`). A window clipped by
    /// `ceil_mode` divides, with `count_include_pad`, by the part of it
    /// inside the padded input (PyTorch's rule); without, by the input
    /// elements it covers.
    pub fn avg_pool2d_with(&self, params: Pool2dParams, count_include_pad: bool) -> Result<Tensor> {
        const OP: &str = "avg_pool2d";
        let _range = brasa_profile::record_op(OP, &[self.dims()]);
        expect_float(OP, self)?;
        let plan = pool_plan(OP, self.dims(), params)?;
        ops_for(self.device())?.avg_pool2d(self, &plan, count_include_pad)
    }

    /// The gradient of [`Tensor::avg_pool2d`] with respect to its input of
    /// `input_shape`, given this output gradient and the forward pass's
    /// kernel, stride, padding and `count_include_pad`.
    pub fn avg_pool2d_backward(
        &self,
        input_shape: impl Into<Shape>,
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
        count_include_pad: bool,
    ) -> Result<Tensor> {
        self.avg_pool2d_backward_with(input_shape, Pool2dParams::floor(kernel, stride, padding), count_include_pad)
    }

    /// The gradient of [`Tensor::avg_pool2d_with`] with respect to its input
    /// of `input_shape`, given this output gradient and the forward pass's
    /// `params` and `count_include_pad`.
    pub fn avg_pool2d_backward_with(
        &self,
        input_shape: impl Into<Shape>,
        params: Pool2dParams,
        count_include_pad: bool,
    ) -> Result<Tensor> {
        const OP: &str = "avg_pool2d_backward";
        let _range = brasa_profile::record_op(OP, &[self.dims()]);
        let input_shape = input_shape.into();
        expect_float(OP, self)?;
        let plan = pool_plan(OP, input_shape.dims(), params)?;
        expect_pooled_shape(OP, self, &plan)?;
        ops_for(self.device())?.avg_pool2d_backward(self, &plan, count_include_pad)
    }
}

#[cfg(test)]
mod tests {
    use crate::{DType, Device, Tensor, TensorError};

    #[test]
    fn pooling_by_hand() {
        let x = Tensor::from_vec_on((0..16).map(|v| v as f32).collect(), [1, 1, 4, 4], Device::CPU).unwrap();
        let (v, i) = x.max_pool2d((2, 2), (2, 2), (0, 0)).unwrap();
        assert_eq!(v.to_vec::<f32>().unwrap(), [5.0, 7.0, 13.0, 15.0]);
        assert_eq!(i.to_vec::<i64>().unwrap(), [5, 7, 13, 15]);
        let g = Tensor::ones_on([1, 1, 2, 2], DType::F32, Device::CPU).unwrap();
        let gx = g.max_pool2d_backward(&i, [1, 1, 4, 4]).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(gx.iter().sum::<f32>(), 4.0);
        assert_eq!((gx[5], gx[7], gx[13], gx[15]), (1.0, 1.0, 1.0, 1.0));
        let a = x.avg_pool2d((2, 2), (2, 2), (0, 0), true).unwrap();
        assert_eq!(a.to_vec::<f32>().unwrap(), [2.5, 4.5, 10.5, 12.5]);
        let ga = g.avg_pool2d_backward([1, 1, 4, 4], (2, 2), (2, 2), (0, 0), true).unwrap();
        assert_eq!(ga.to_vec::<f32>().unwrap(), [0.25; 16]);
    }

    #[test]
    fn bad_parameters_are_errors_naming_them() {
        let x = Tensor::zeros_on([1, 1, 5, 5], DType::F32, Device::CPU).unwrap();
        assert_eq!(
            x.max_pool2d((3, 3), (1, 1), (2, 0)).unwrap_err().to_string(),
            "max_pool2d: input [1, 1, 5, 5] with kernel (3, 3), stride (1, 1), padding (2, 0): height: padding 2 \
             must be at most half the kernel size 3 (1)"
        );
        for (error, named) in [
            (x.avg_pool2d((0, 3), (1, 1), (0, 0), true).unwrap_err(), "kernel 0"),
            (x.avg_pool2d((3, 3), (1, 0), (0, 0), true).unwrap_err(), "stride 0"),
        ] {
            assert!(matches!(error, TensorError::Invalid { op: "avg_pool2d", .. }), "{error:?}");
            assert!(error.to_string().contains(named), "{error}");
        }
        let v = Tensor::zeros_on([5, 5], DType::F32, Device::CPU).unwrap();
        let error = v.max_pool2d((2, 2), (2, 2), (0, 0)).unwrap_err();
        assert!(matches!(error, TensorError::Shape { op: "max_pool2d", .. }), "{error:?}");
        assert!(error.to_string().contains("got shape [5, 5]"), "{error}");
    }
}
