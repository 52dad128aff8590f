//! 2-d convolution and its gradients: [`Tensor::conv2d`],
//! [`Tensor::conv2d_backward_input`], [`Tensor::conv2d_backward_weight`] and
//! [`Tensor::conv2d_backward_bias`], with stride, padding, dilation and
//! groups ([`Conv2dParams`]).
//!
//! Each image (and group) is one matrix product: `im2col` unfolds the input's
//! receptive fields into a `[C_in·kH·kW, H_out·W_out]` matrix that the weight,
//! seen as `[C_out, C_in·kH·kW]`, multiplies; the input gradient multiplies by
//! the transposed weight and folds the columns back (`col2im`); the weight
//! gradient multiplies the output gradient by the transposed columns. The
//! shapes are checked here ([`ConvPlan`]); the device runs the products
//! ([`crate::backend::DeviceOps::conv2d`] and its gradients).

use crate::backend::{ops_for, ConvPlan};
use crate::error::{Result, TensorError};
use crate::ops::common::{expect_dtype, expect_float, expect_rank, same_device};
use crate::shape::Shape;
use crate::tensor::Tensor;
use brasa_kernels::conv::Conv2dGeometry;
use brasa_kernels::KernelError;

/// Stride, padding, dilation and groups of a 2-d convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dParams {
    /// Step between applications of the kernel, (height, width).
    pub stride: (usize, usize),
    /// Zeros added on each side, (height, width).
    pub padding: (usize, usize),
    /// Spacing between kernel elements, (height, width).
    pub dilation: (usize, usize),
    /// Input and output channels split into this many independent groups.
    pub groups: usize,
}

impl Default for Conv2dParams {
    fn default() -> Self {
        Conv2dParams { stride: (1, 1), padding: (0, 0), dilation: (1, 1), groups: 1 }
    }
}

impl Conv2dParams {
    /// The default parameters (stride 1, no padding, dilation 1, one group).
    pub fn new() -> Self {
        Self::default()
    }

    /// With this stride, (height, width).
    pub fn with_stride(self, stride: (usize, usize)) -> Self {
        Conv2dParams { stride, ..self }
    }

    /// With this padding, (height, width).
    pub fn with_padding(self, padding: (usize, usize)) -> Self {
        Conv2dParams { padding, ..self }
    }

    /// With this dilation, (height, width).
    pub fn with_dilation(self, dilation: (usize, usize)) -> Self {
        Conv2dParams { dilation, ..self }
    }

    /// With this many groups.
    pub fn with_groups(self, groups: usize) -> Self {
        Conv2dParams { groups, ..self }
    }

    /// The output `[N, C_out, H_out, W_out]` of a convolution of an input of
    /// shape `[N, C_in, H, W]` with a weight of shape `[C_out, C_in / groups,
    /// kH, kW]`, or an error saying why the shapes and parameters do not fit.
    pub fn output_shape(&self, input: &[usize], weight: &[usize]) -> Result<Shape> {
        let plan = conv_plan("conv2d", input, weight, *self)?;
        Ok(plan.output_shape())
    }
}

/// The checked sizes of one convolution of an `input` by a `weight` of
/// these shapes, as the devices see them, or the error `op` reports.
fn conv_plan(op: &'static str, input: &[usize], weight: &[usize], params: Conv2dParams) -> Result<ConvPlan> {
    let &[batch, c_in, h, w] = input else {
        return Err(TensorError::shape(op, format!("expected a 4-d input [N, C_in, H, W], got shape {input:?}")));
    };
    let &[c_out, c_per_group, kh, kw] = weight else {
        return Err(TensorError::shape(
            op,
            format!("expected a 4-d weight [C_out, C_in / groups, kH, kW], got shape {weight:?}"),
        ));
    };
    let groups = params.groups;
    if groups == 0 {
        return Err(TensorError::invalid(op, "groups must be positive, got 0"));
    }
    if c_out % groups != 0 {
        return Err(TensorError::shape(
            op,
            format!("weight {weight:?} has {c_out} output channels, which groups = {groups} does not divide"),
        ));
    }
    if c_per_group.checked_mul(groups) != Some(c_in) {
        return Err(TensorError::shape(
            op,
            format!(
                "input {input:?} has {c_in} channels but weight {weight:?} with groups = {groups} expects \
                 {c_per_group} x {groups} = {}",
                c_per_group.saturating_mul(groups)
            ),
        ));
    }
    let geometry = Conv2dGeometry::new(c_per_group, (h, w), (kh, kw), params.stride, params.padding, params.dilation)
        .map_err(|e| {
        let detail = match e {
            KernelError::ShapeMismatch { detail } => detail,
            other => other.to_string(),
        };
        TensorError::shape(
            op,
            format!(
                "input {input:?} and weight {weight:?} with stride {:?}, padding {:?}, dilation {:?}: {detail}",
                params.stride, params.padding, params.dilation
            ),
        )
    })?;
    Ok(ConvPlan {
        batch,
        c_in,
        c_out,
        groups,
        geometry,
        stride: params.stride,
        padding: params.padding,
        dilation: params.dilation,
    })
}

impl Tensor {
    /// 2-d convolution (PyTorch's `conv2d`, a cross-correlation) of this
    /// input `[N, C_in, H, W]` (or an unbatched `[C_in, H, W]`) with `weight`
    /// `[C_out, C_in / groups, kH, kW]`, plus `bias` `[C_out]` if given.
    ///
    /// The output is `[N, C_out, H_out, W_out]` with
    /// `H_out = (H + 2·padding − dilation·(kH − 1) − 1) / stride + 1` (and
    /// likewise for the width). All operands share one floating-point dtype
    /// and one device.
    ///
    /// ```
    /// # use brasa_tensor::{Conv2dParams, DType, Tensor};
    /// let x = Tensor::ones([1, 2, 5, 5], DType::F32)?;
    /// let w = Tensor::ones([3, 2, 3, 3], DType::F32)?;
    /// let y = x.conv2d(&w, None, Conv2dParams::default().with_padding((1, 1)))?;
    /// assert_eq!(y.dims(), &[1, 3, 5, 5]);
    /// assert_eq!(y.to_vec::<f32>()?[6], 18.0); // an interior pixel: 2 channels x 9 taps
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn conv2d(&self, weight: &Tensor, bias: Option<&Tensor>, params: Conv2dParams) -> Result<Tensor> {
        const OP: &str = "conv2d";
        let _range = brasa_profile::record_op(OP, &[self.dims(), weight.dims()]);
        if self.rank() == 3 {
            return self.unsqueeze(0)?.conv2d(weight, bias, params)?.squeeze(0);
        }
        let mut operands = vec![self, weight];
        operands.extend(bias);
        same_device(OP, &operands)?;
        expect_float(OP, self)?;
        expect_dtype(OP, weight, self.dtype())?;
        let plan = conv_plan(OP, self.dims(), weight.dims(), params)?;
        if let Some(bias) = bias {
            expect_dtype(OP, bias, self.dtype())?;
            if bias.dims() != [plan.c_out] {
                return Err(TensorError::shape(
                    OP,
                    format!("expected a bias of shape [{}] (C_out), got {:?}", plan.c_out, bias.dims()),
                ));
            }
        }
        ops_for(self.device())?.conv2d(self, weight, bias, &plan)
    }

    /// The gradient of [`Tensor::conv2d`] with respect to its input, given
    /// this gradient of its output `[N, C_out, H_out, W_out]`, the weight,
    /// and the input's shape `[N, C_in, H, W]` (needed because a stride
    /// greater than 1 maps several input sizes to one output size).
    pub fn conv2d_backward_input(
        &self,
        weight: &Tensor,
        input_shape: impl Into<Shape>,
        params: Conv2dParams,
    ) -> Result<Tensor> {
        const OP: &str = "conv2d_backward_input";
        let _range = brasa_profile::record_op(OP, &[self.dims(), weight.dims()]);
        let input_shape = input_shape.into();
        same_device(OP, &[self, weight])?;
        expect_float(OP, self)?;
        expect_dtype(OP, weight, self.dtype())?;
        let plan = conv_plan(OP, input_shape.dims(), weight.dims(), params)?;
        expect_grad_shape(OP, self, &plan)?;
        ops_for(self.device())?.conv2d_backward_input(self, weight, &plan)
    }

    /// The gradient of [`Tensor::conv2d`] with respect to its weight, with
    /// `self` the convolution's input `[N, C_in, H, W]`, `grad_output` the
    /// gradient of its output, and the weight's shape
    /// `[C_out, C_in / groups, kH, kW]`. Its layout is the device's choice:
    /// channels-last from cuDNN for channels-last operands (as PyTorch's),
    /// row-major elsewhere; autograd gives a weight its gradient in the
    /// weight's own layout.
    pub fn conv2d_backward_weight(
        &self,
        grad_output: &Tensor,
        weight_shape: impl Into<Shape>,
        params: Conv2dParams,
    ) -> Result<Tensor> {
        const OP: &str = "conv2d_backward_weight";
        let _range = brasa_profile::record_op(OP, &[self.dims(), grad_output.dims()]);
        let weight_shape = weight_shape.into();
        same_device(OP, &[self, grad_output])?;
        expect_float(OP, self)?;
        expect_dtype(OP, grad_output, self.dtype())?;
        let plan = conv_plan(OP, self.dims(), weight_shape.dims(), params)?;
        expect_grad_shape(OP, grad_output, &plan)?;
        ops_for(self.device())?.conv2d_backward_weight(self, grad_output, &plan)
    }

    /// The gradient of [`Tensor::conv2d`] with respect to its bias: this
    /// output gradient `[N, C_out, H_out, W_out]` summed over N, H_out and
    /// W_out (accumulated in f64), a `[C_out]` tensor of the same dtype.
    pub fn conv2d_backward_bias(&self) -> Result<Tensor> {
        const OP: &str = "conv2d_backward_bias";
        expect_float(OP, self)?;
        expect_rank(OP, self, 4)?;
        ops_for(self.device())?.conv2d_backward_bias(self)
    }
}

/// Errors unless `grad` has the convolution's output shape.
fn expect_grad_shape(op: &'static str, grad: &Tensor, plan: &ConvPlan) -> Result<()> {
    let expected = plan.output_shape();
    if grad.dims() != expected.dims() {
        return Err(TensorError::shape(
            op,
            format!(
                "grad_output has shape {:?} but input {:?} and weight {:?} give an output of shape {:?}",
                grad.dims(),
                plan.input_shape().dims(),
                plan.weight_shape().dims(),
                expected.dims()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Device};

    #[test]
    fn params_builders_and_output_shape() {
        let p = Conv2dParams::new().with_stride((2, 1)).with_padding((1, 0)).with_dilation((1, 2)).with_groups(2);
        assert_eq!(p, Conv2dParams { stride: (2, 1), padding: (1, 0), dilation: (1, 2), groups: 2 });
        assert_eq!(p.output_shape(&[3, 4, 7, 9], &[6, 2, 3, 3]).unwrap().dims(), &[3, 6, 4, 5]);
        let err = p.output_shape(&[3, 4, 7, 9], &[6, 4, 3, 3]).unwrap_err();
        assert!(matches!(err, TensorError::Shape { op: "conv2d", .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "conv2d: input [3, 4, 7, 9] has 4 channels but weight [6, 4, 3, 3] with groups = 2 expects 4 x 2 = 8"
        );
    }

    #[test]
    fn small_convolution_by_hand() {
        // One 3x3 image, a 2x2 kernel of ones: sums of 2x2 windows, plus bias 1.
        let x = Tensor::from_vec_on((1..=9).map(|v| v as f64).collect(), [1, 1, 3, 3], Device::CPU).unwrap();
        let w = Tensor::ones_on([1, 1, 2, 2], DType::F64, Device::CPU).unwrap();
        let b = Tensor::ones_on([1], DType::F64, Device::CPU).unwrap();
        let y = x.conv2d(&w, Some(&b), Conv2dParams::default()).unwrap();
        assert_eq!(y.to_vec::<f64>().unwrap(), [13.0, 17.0, 25.0, 29.0]);
        let gy = Tensor::ones_on([1, 1, 2, 2], DType::F64, Device::CPU).unwrap();
        let gx = gy.conv2d_backward_input(&w, [1, 1, 3, 3], Conv2dParams::default()).unwrap();
        assert_eq!(gx.to_vec::<f64>().unwrap(), [1.0, 2.0, 1.0, 2.0, 4.0, 2.0, 1.0, 2.0, 1.0]);
        let gw = x.conv2d_backward_weight(&gy, [1, 1, 2, 2], Conv2dParams::default()).unwrap();
        assert_eq!(gw.to_vec::<f64>().unwrap(), [12.0, 16.0, 24.0, 28.0]);
        assert_eq!(gy.conv2d_backward_bias().unwrap().to_vec::<f64>().unwrap(), [4.0]);
    }
}
