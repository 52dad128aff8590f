//! 2-d transposed convolution (PyTorch's `conv_transpose2d`, sometimes
//! called a "deconvolution"): [`Tensor::conv_transpose2d`] and its
//! gradients [`Tensor::conv_transpose2d_backward_input`] and
//! [`Tensor::conv_transpose2d_backward_weight`], with stride, padding,
//! output padding, dilation and groups ([`ConvTranspose2dParams`]).
//!
//! A transposed convolution is the adjoint of a convolution: its forward
//! pass is a convolution's input gradient, its input gradient is a
//! convolution, and its weight gradient is a convolution's weight gradient
//! with the roles of input and output exchanged. So it is written entirely
//! with the convolution's ops ([`Tensor::conv2d`],
//! [`Tensor::conv2d_backward_input`], [`Tensor::conv2d_backward_weight`])
//! and runs on every device with no kernel of its own.
//!
//! Output padding needs care: the convolution that maps the transposed
//! output `H_out` back to the input height gives
//! `H + ⌊output_padding / stride⌋` rows, so an output padding of at least
//! the stride (PyTorch allows it while it is below the dilation) is handled
//! by appending `⌊output_padding / stride⌋` rows of zeros to the input,
//! which contribute nothing and make the two shapes agree.

use crate::error::{Result, TensorError};
use crate::ops::common::{expect_dtype, expect_float, same_device};
use crate::ops::conv::Conv2dParams;
use crate::shape::Shape;
use crate::tensor::Tensor;

/// Stride, padding, output padding, dilation and groups of a 2-d transposed
/// convolution, as PyTorch's `conv_transpose2d` takes them.
///
/// `padding` trims rows and columns from each side of the full output;
/// `output_padding` adds rows and columns on the bottom and right, to pick
/// one of the several output sizes that a strided convolution maps to the
/// same input size. It must be smaller than the stride or the dilation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvTranspose2dParams {
    /// Step between the input pixels' placements in the output, (height, width).
    pub stride: (usize, usize),
    /// Rows and columns trimmed from each side of the output, (height, width).
    pub padding: (usize, usize),
    /// Rows and columns added to the bottom and right of the output, (height, width).
    pub output_padding: (usize, usize),
    /// Spacing between kernel elements, (height, width).
    pub dilation: (usize, usize),
    /// Input and output channels split into this many independent groups.
    pub groups: usize,
}

impl Default for ConvTranspose2dParams {
    fn default() -> Self {
        ConvTranspose2dParams { stride: (1, 1), padding: (0, 0), output_padding: (0, 0), dilation: (1, 1), groups: 1 }
    }
}

impl ConvTranspose2dParams {
    /// The default parameters (stride 1, no padding or output padding,
    /// dilation 1, one group).
    pub fn new() -> Self {
        Self::default()
    }

    /// With this stride, (height, width).
    pub fn with_stride(self, stride: (usize, usize)) -> Self {
        ConvTranspose2dParams { stride, ..self }
    }

    /// With this padding, (height, width).
    pub fn with_padding(self, padding: (usize, usize)) -> Self {
        ConvTranspose2dParams { padding, ..self }
    }

    /// With this output padding, (height, width).
    pub fn with_output_padding(self, output_padding: (usize, usize)) -> Self {
        ConvTranspose2dParams { output_padding, ..self }
    }

    /// With this dilation, (height, width).
    pub fn with_dilation(self, dilation: (usize, usize)) -> Self {
        ConvTranspose2dParams { dilation, ..self }
    }

    /// With this many groups.
    pub fn with_groups(self, groups: usize) -> Self {
        ConvTranspose2dParams { groups, ..self }
    }

    /// The output `[N, C_out, H_out, W_out]` of a transposed convolution of
    /// an input `[N, C_in, H, W]` with a weight `[C_in, C_out / groups, kH,
    /// kW]`, with `H_out = (H − 1)·stride − 2·padding + dilation·(kH − 1) +
    /// output_padding + 1` (likewise for the width), or an error saying why
    /// the shapes and parameters do not fit.
    ///
    /// ```
    /// # use brasa_tensor::ConvTranspose2dParams;
    /// let p = ConvTranspose2dParams::new().with_stride((2, 2)).with_padding((1, 1)).with_output_padding((1, 0));
    /// assert_eq!(p.output_shape(&[1, 4, 5, 5], &[4, 3, 3, 3])?.dims(), &[1, 3, 10, 9]);
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn output_shape(&self, input: &[usize], weight: &[usize]) -> Result<Shape> {
        Ok(TransposePlan::new("conv_transpose2d", input, weight, *self)?.output)
    }

    /// The convolution whose input gradient this transposed convolution is
    /// (the same stride, padding, dilation and groups).
    fn conv(&self) -> Conv2dParams {
        Conv2dParams { stride: self.stride, padding: self.padding, dilation: self.dilation, groups: self.groups }
    }
}

/// The checked sizes of one transposed convolution.
#[derive(Clone, Debug)]
struct TransposePlan {
    /// The adjoint convolution's parameters.
    conv: Conv2dParams,
    /// Zero rows and columns appended to the input (`⌊output_padding /
    /// stride⌋`), so that the adjoint convolution maps the output back to
    /// exactly the (padded) input.
    extra: (usize, usize),
    /// `[N, C_in, H, W]` as given.
    input: Shape,
    /// `[N, C_out, H_out, W_out]`.
    output: Shape,
}

impl TransposePlan {
    fn new(op: &'static str, input: &[usize], weight: &[usize], params: ConvTranspose2dParams) -> Result<Self> {
        let &[batch, c_in, h, w] = input else {
            return Err(TensorError::shape(op, format!("expected a 4-d input [N, C_in, H, W], got shape {input:?}")));
        };
        let &[w_in, c_out_group, kh, kw] = weight else {
            return Err(TensorError::shape(
                op,
                format!("expected a 4-d weight [C_in, C_out / groups, kH, kW], got shape {weight:?}"),
            ));
        };
        let groups = params.groups;
        if groups == 0 {
            return Err(TensorError::invalid(op, "groups must be positive, got 0"));
        }
        if w_in != c_in {
            return Err(TensorError::shape(
                op,
                format!("input {input:?} has {c_in} channels but weight {weight:?} expects {w_in} (its first dim)"),
            ));
        }
        if c_in % groups != 0 {
            return Err(TensorError::shape(
                op,
                format!("input {input:?} has {c_in} channels, which groups = {groups} does not divide"),
            ));
        }
        let c_out = c_out_group
            .checked_mul(groups)
            .ok_or_else(|| TensorError::shape(op, format!("weight {weight:?} x groups {groups} overflows usize")))?;
        let p = params;
        let height = extent(op, "height", h, kh, p.stride.0, p.padding.0, p.output_padding.0, p.dilation.0)?;
        let width = extent(op, "width", w, kw, p.stride.1, p.padding.1, p.output_padding.1, p.dilation.1)?;
        Ok(TransposePlan {
            conv: params.conv(),
            extra: (p.output_padding.0 / p.stride.0, p.output_padding.1 / p.stride.1),
            input: Shape::from([batch, c_in, h, w]),
            output: Shape::from([batch, c_out, height, width]),
        })
    }

    /// The input with [`TransposePlan::extra`] zero rows and columns
    /// appended (the input itself when there are none).
    fn pad_input(&self, input: &Tensor) -> Result<Tensor> {
        if self.extra == (0, 0) {
            return Ok(input.clone());
        }
        let d = input.dims();
        let (h, w) = (d[2], d[3]);
        let padded = Tensor::zeros_on([d[0], d[1], h + self.extra.0, w + self.extra.1], input.dtype(), input.device())?;
        padded.narrow(2, 0, h)?.narrow(3, 0, w)?.copy_(input)?;
        Ok(padded)
    }

    /// Errors unless `grad` has the transposed convolution's output shape.
    fn expect_grad(&self, op: &'static str, grad: &Tensor, weight: &[usize]) -> Result<()> {
        if grad.dims() != self.output.dims() {
            return Err(TensorError::shape(
                op,
                format!(
                    "grad_output has shape {:?} but input {:?} and weight {weight:?} give an output of shape {:?}",
                    grad.dims(),
                    self.input.dims(),
                    self.output.dims()
                ),
            ));
        }
        Ok(())
    }
}

/// One output extent, `(input − 1)·stride − 2·padding + dilation·(kernel −
/// 1) + output_padding + 1`, after checking the parameters as PyTorch does.
#[allow(clippy::too_many_arguments)] // one axis's sizes, named as PyTorch names them
fn extent(
    op: &'static str,
    axis: &str,
    input: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    output_padding: usize,
    dilation: usize,
) -> Result<usize> {
    if kernel == 0 || stride == 0 || dilation == 0 {
        return Err(TensorError::invalid(
            op,
            format!("{axis}: kernel {kernel}, stride {stride} and dilation {dilation} must all be positive"),
        ));
    }
    if output_padding >= stride && output_padding >= dilation {
        return Err(TensorError::invalid(
            op,
            format!(
                "{axis}: output_padding ({output_padding}) must be smaller than either stride ({stride}) or \
                 dilation ({dilation})"
            ),
        ));
    }
    if input == 0 {
        return Err(TensorError::shape(op, format!("{axis}: the input is empty (size 0)")));
    }
    let too_big = || TensorError::shape(op, format!("{axis}: sizes overflow usize"));
    let full = (input - 1)
        .checked_mul(stride)
        .and_then(|x| (kernel - 1).checked_mul(dilation).and_then(|y| x.checked_add(y)))
        .and_then(|x| x.checked_add(output_padding + 1))
        .ok_or_else(too_big)?;
    let trimmed = padding.checked_mul(2).ok_or_else(too_big)?;
    if full <= trimmed {
        return Err(TensorError::shape(
            op,
            format!(
                "{axis}: padding {padding} on each side trims the whole output: (input {input} − 1) x stride \
                 {stride} + dilation {dilation} x (kernel {kernel} − 1) + output_padding {output_padding} + 1 = \
                 {full} is not more than 2 x {padding}"
            ),
        ));
    }
    Ok(full - trimmed)
}

impl Tensor {
    /// 2-d transposed convolution (PyTorch's `conv_transpose2d`) of this
    /// input `[N, C_in, H, W]` (or an unbatched `[C_in, H, W]`) with
    /// `weight` `[C_in, C_out / groups, kH, kW]`, plus `bias` `[C_out]` if
    /// given: each input pixel scatters its weighted kernel into the output,
    /// `out[n, g·C_out/groups + o, i·sH − pH + a·dH, j·sW − pW + b·dW] +=
    /// x[n, c, i, j] · weight[c, o, a, b]` for the input channels `c` of
    /// group `g`.
    ///
    /// The output is `[N, C_out, H_out, W_out]` with `H_out = (H −
    /// 1)·stride − 2·padding + dilation·(kH − 1) + output_padding + 1`
    /// (likewise for the width). All operands share one floating-point dtype
    /// and one device.
    ///
    /// ```
    /// # use brasa_tensor::{ConvTranspose2dParams, DType, Tensor};
    /// // Stride 2 spreads the 2x2 input over a 4x4 output: the kernel of
    /// // ones copies each input pixel into its own 2x2 block.
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [1, 1, 2, 2])?;
    /// let w = Tensor::ones([1, 1, 2, 2], DType::F32)?;
    /// let y = x.conv_transpose2d(&w, None, ConvTranspose2dParams::new().with_stride((2, 2)))?;
    /// assert_eq!(y.dims(), &[1, 1, 4, 4]);
    /// assert_eq!(y.to_vec::<f32>()?[..4], [1.0, 1.0, 2.0, 2.0]);
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn conv_transpose2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        params: ConvTranspose2dParams,
    ) -> Result<Tensor> {
        const OP: &str = "conv_transpose2d";
        let _range = brasa_profile::record_op(OP, &[self.dims(), weight.dims()]);
        if self.rank() == 3 {
            return self.unsqueeze(0)?.conv_transpose2d(weight, bias, params)?.squeeze(0);
        }
        let mut operands = vec![self, weight];
        operands.extend(bias);
        same_device(OP, &operands)?;
        expect_float(OP, self)?;
        expect_dtype(OP, weight, self.dtype())?;
        let plan = TransposePlan::new(OP, self.dims(), weight.dims(), params)?;
        let c_out = plan.output.dims()[1];
        if let Some(bias) = bias {
            expect_dtype(OP, bias, self.dtype())?;
            if bias.dims() != [c_out] {
                return Err(TensorError::shape(
                    OP,
                    format!("expected a bias of shape [{c_out}] (C_out), got {:?}", bias.dims()),
                ));
            }
        }
        let input = plan.pad_input(self)?;
        let out = input.conv2d_backward_input(weight, plan.output.clone(), plan.conv)?;
        if let Some(bias) = bias {
            out.add_(&bias.reshape(&[1, -1, 1, 1])?)?;
        }
        Ok(out)
    }

    /// The gradient of [`Tensor::conv_transpose2d`] with respect to its
    /// input, given this gradient of its output `[N, C_out, H_out, W_out]`,
    /// the weight, and the input's shape `[N, C_in, H, W]`: the convolution
    /// of the output gradient with the same weight and parameters.
    pub fn conv_transpose2d_backward_input(
        &self,
        weight: &Tensor,
        input_shape: impl Into<Shape>,
        params: ConvTranspose2dParams,
    ) -> Result<Tensor> {
        const OP: &str = "conv_transpose2d_backward_input";
        let _range = brasa_profile::record_op(OP, &[self.dims(), weight.dims()]);
        let input_shape = input_shape.into();
        same_device(OP, &[self, weight])?;
        expect_float(OP, self)?;
        expect_dtype(OP, weight, self.dtype())?;
        let plan = TransposePlan::new(OP, input_shape.dims(), weight.dims(), params)?;
        plan.expect_grad(OP, self, weight.dims())?;
        let grad = self.conv2d(weight, None, plan.conv)?;
        if plan.extra == (0, 0) {
            return Ok(grad);
        }
        // The rows and columns past the input are the gradient of the zeros
        // appended to it: dropped.
        let d = input_shape.dims();
        grad.narrow(2, 0, d[2])?.narrow(3, 0, d[3])?.contiguous()
    }

    /// The gradient of [`Tensor::conv_transpose2d`] with respect to its
    /// weight, with `self` the transposed convolution's input `[N, C_in, H,
    /// W]`, `grad_output` the gradient of its output, and the weight's shape
    /// `[C_in, C_out / groups, kH, kW]`: a convolution's weight gradient in
    /// which the output gradient plays the convolution's input and this
    /// input plays its output gradient.
    ///
    /// The bias's gradient is the output gradient summed over N, H_out and
    /// W_out, [`Tensor::conv2d_backward_bias`].
    pub fn conv_transpose2d_backward_weight(
        &self,
        grad_output: &Tensor,
        weight_shape: impl Into<Shape>,
        params: ConvTranspose2dParams,
    ) -> Result<Tensor> {
        const OP: &str = "conv_transpose2d_backward_weight";
        let _range = brasa_profile::record_op(OP, &[self.dims(), grad_output.dims()]);
        let weight_shape = weight_shape.into();
        same_device(OP, &[self, grad_output])?;
        expect_float(OP, self)?;
        expect_dtype(OP, grad_output, self.dtype())?;
        let plan = TransposePlan::new(OP, self.dims(), weight_shape.dims(), params)?;
        plan.expect_grad(OP, grad_output, weight_shape.dims())?;
        let input = plan.pad_input(self)?;
        grad_output.conv2d_backward_weight(&input, weight_shape, plan.conv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Device};

    #[test]
    fn output_shapes_follow_pytorch() {
        let p = ConvTranspose2dParams::new()
            .with_stride((2, 3))
            .with_padding((1, 0))
            .with_output_padding((1, 2))
            .with_dilation((1, 2))
            .with_groups(2);
        assert_eq!(
            p,
            ConvTranspose2dParams {
                stride: (2, 3),
                padding: (1, 0),
                output_padding: (1, 2),
                dilation: (1, 2),
                groups: 2
            }
        );
        // H: (4-1)*2 - 2 + 1*(3-1) + 1 + 1 = 8; W: (5-1)*3 - 0 + 2*(2-1) + 2 + 1 = 17.
        assert_eq!(p.output_shape(&[3, 4, 4, 5], &[4, 3, 3, 2]).unwrap().dims(), &[3, 6, 8, 17]);
    }

    #[test]
    fn output_padding_beyond_stride_but_below_dilation() {
        // Stride 1, dilation 3, output padding 2 (allowed: below the
        // dilation): with no padding the last two columns get no input
        // pixel, only the bias.
        let x = Tensor::from_vec_on(vec![1.0f64, 2.0], [1, 1, 1, 2], Device::CPU).unwrap();
        let w = Tensor::ones_on([1, 1, 1, 2], DType::F64, Device::CPU).unwrap();
        let b = Tensor::from_vec_on(vec![0.5f64], [1], Device::CPU).unwrap();
        let p = ConvTranspose2dParams::new().with_dilation((1, 3)).with_output_padding((0, 2));
        let y = x.conv_transpose2d(&w, Some(&b), p).unwrap();
        // Width (2-1) + 3*(2-1) + 2 + 1 = 7: x at 0, 1 and again at 3, 4.
        assert_eq!(y.to_vec::<f64>().unwrap(), [1.5, 2.5, 0.5, 1.5, 2.5, 0.5, 0.5]);
    }
}
