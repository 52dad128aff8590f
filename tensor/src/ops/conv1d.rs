//! 1-d convolutions over `[N, C, L]`: [`Tensor::conv1d`] ([`Conv1dParams`])
//! and [`Tensor::conv_transpose1d`] ([`ConvTranspose1dParams`]), PyTorch's
//! `conv1d` and `conv_transpose1d`.
//!
//! Each is its 2-d counterpart over a height of 1: the input is viewed as
//! `[N, C, 1, L]` and the weight as `[.., .., 1, k]` (views, no copy), with
//! stride 1, no padding and dilation 1 along the unit height. The gradients
//! are therefore the 2-d ones on the same views (see
//! [`Conv1dParams::as_2d`]).

use crate::error::{Result, TensorError};
use crate::ops::conv::Conv2dParams;
use crate::ops::conv_transpose::ConvTranspose2dParams;
use crate::tensor::Tensor;

/// Stride, padding, dilation and groups of a 1-d convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv1dParams {
    /// Step between applications of the kernel.
    pub stride: usize,
    /// Zeros added on each side.
    pub padding: usize,
    /// Spacing between kernel elements.
    pub dilation: usize,
    /// Input and output channels split into this many independent groups.
    pub groups: usize,
}

impl Default for Conv1dParams {
    fn default() -> Self {
        Conv1dParams { stride: 1, padding: 0, dilation: 1, groups: 1 }
    }
}

impl Conv1dParams {
    /// The default parameters (stride 1, no padding, dilation 1, one group).
    pub fn new() -> Self {
        Self::default()
    }

    /// With this stride.
    pub fn with_stride(self, stride: usize) -> Self {
        Conv1dParams { stride, ..self }
    }

    /// With this padding.
    pub fn with_padding(self, padding: usize) -> Self {
        Conv1dParams { padding, ..self }
    }

    /// With this dilation.
    pub fn with_dilation(self, dilation: usize) -> Self {
        Conv1dParams { dilation, ..self }
    }

    /// With this many groups.
    pub fn with_groups(self, groups: usize) -> Self {
        Conv1dParams { groups, ..self }
    }

    /// The same convolution over `[N, C, 1, L]`: these values along the
    /// width, the identity (stride 1, no padding, dilation 1) along the height.
    pub fn as_2d(&self) -> Conv2dParams {
        Conv2dParams {
            stride: (1, self.stride),
            padding: (0, self.padding),
            dilation: (1, self.dilation),
            groups: self.groups,
        }
    }
}

/// Stride, padding, output padding, dilation and groups of a 1-d transposed
/// convolution (see [`ConvTranspose2dParams`] for their meaning).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvTranspose1dParams {
    /// Step between the input elements' placements in the output.
    pub stride: usize,
    /// Elements trimmed from each end of the output.
    pub padding: usize,
    /// Elements added at the end of the output (smaller than the stride or
    /// the dilation).
    pub output_padding: usize,
    /// Spacing between kernel elements.
    pub dilation: usize,
    /// Input and output channels split into this many independent groups.
    pub groups: usize,
}

impl Default for ConvTranspose1dParams {
    fn default() -> Self {
        ConvTranspose1dParams { stride: 1, padding: 0, output_padding: 0, dilation: 1, groups: 1 }
    }
}

impl ConvTranspose1dParams {
    /// The default parameters (stride 1, no padding or output padding,
    /// dilation 1, one group).
    pub fn new() -> Self {
        Self::default()
    }

    /// With this stride.
    pub fn with_stride(self, stride: usize) -> Self {
        ConvTranspose1dParams { stride, ..self }
    }

    /// With this padding.
    pub fn with_padding(self, padding: usize) -> Self {
        ConvTranspose1dParams { padding, ..self }
    }

    /// With this output padding.
    pub fn with_output_padding(self, output_padding: usize) -> Self {
        ConvTranspose1dParams { output_padding, ..self }
    }

    /// With this dilation.
    pub fn with_dilation(self, dilation: usize) -> Self {
        ConvTranspose1dParams { dilation, ..self }
    }

    /// With this many groups.
    pub fn with_groups(self, groups: usize) -> Self {
        ConvTranspose1dParams { groups, ..self }
    }

    /// The same transposed convolution over `[N, C, 1, L]`: these values
    /// along the width, the identity along the height.
    pub fn as_2d(&self) -> ConvTranspose2dParams {
        ConvTranspose2dParams {
            stride: (1, self.stride),
            padding: (0, self.padding),
            output_padding: (0, self.output_padding),
            dilation: (1, self.dilation),
            groups: self.groups,
        }
    }
}

/// Errors unless `t` is `[N, C, L]` (or, for an input, the unbatched `[C, L]`
/// handled before this check): `what` names the operand and its dims.
fn expect_3d(op: &'static str, t: &Tensor, what: &str) -> Result<()> {
    if t.rank() != 3 {
        return Err(TensorError::shape(op, format!("expected a 3-d {what}, got shape {:?}", t.dims())));
    }
    Ok(())
}

/// Renames an error of the 2-d op that runs a 1-d one: the message stays
/// (it names the `[N, C, 1, L]` views), the op is the 1-d one.
fn as_1d(op: &'static str) -> impl Fn(TensorError) -> TensorError {
    move |e| match e {
        TensorError::Shape { message, .. } => {
            TensorError::shape(op, format!("{message} (as a 2-d convolution over a height of 1)"))
        }
        TensorError::Invalid { message, .. } => TensorError::invalid(op, message),
        other => other,
    }
}

impl Tensor {
    /// 1-d convolution (PyTorch's `conv1d`, a cross-correlation) of this
    /// input `[N, C_in, L]` (or an unbatched `[C_in, L]`) with `weight`
    /// `[C_out, C_in / groups, k]`, plus `bias` `[C_out]` if given.
    ///
    /// The output is `[N, C_out, L_out]` with `L_out = (L + 2·padding −
    /// dilation·(k − 1) − 1) / stride + 1`.
    ///
    /// ```
    /// # use brasa_tensor::{Conv1dParams, DType, Tensor};
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [1, 1, 4])?;
    /// let w = Tensor::from_vec(vec![1.0f32, -1.0], [1, 1, 2])?;
    /// let y = x.conv1d(&w, None, Conv1dParams::new())?;
    /// assert_eq!(y.to_vec::<f32>()?, [-1.0, -1.0, -1.0]);
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn conv1d(&self, weight: &Tensor, bias: Option<&Tensor>, params: Conv1dParams) -> Result<Tensor> {
        const OP: &str = "conv1d";
        if self.rank() == 2 {
            return self.unsqueeze(0)?.conv1d(weight, bias, params)?.squeeze(0);
        }
        expect_3d(OP, self, "input [N, C_in, L]")?;
        expect_3d(OP, weight, "weight [C_out, C_in / groups, k]")?;
        let out = self.unsqueeze(2)?.conv2d(&weight.unsqueeze(2)?, bias, params.as_2d()).map_err(as_1d(OP))?;
        out.squeeze(2)
    }

    /// 1-d transposed convolution (PyTorch's `conv_transpose1d`) of this
    /// input `[N, C_in, L]` (or an unbatched `[C_in, L]`) with `weight`
    /// `[C_in, C_out / groups, k]`, plus `bias` `[C_out]` if given.
    ///
    /// The output is `[N, C_out, L_out]` with `L_out = (L − 1)·stride −
    /// 2·padding + dilation·(k − 1) + output_padding + 1`.
    ///
    /// ```
    /// # use brasa_tensor::{ConvTranspose1dParams, Tensor};
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], [1, 1, 2])?;
    /// let w = Tensor::from_vec(vec![1.0f32, 10.0], [1, 1, 2])?;
    /// let y = x.conv_transpose1d(&w, None, ConvTranspose1dParams::new().with_stride(3))?;
    /// assert_eq!(y.to_vec::<f32>()?, [1.0, 10.0, 0.0, 2.0, 20.0]);
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn conv_transpose1d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        params: ConvTranspose1dParams,
    ) -> Result<Tensor> {
        const OP: &str = "conv_transpose1d";
        if self.rank() == 2 {
            return self.unsqueeze(0)?.conv_transpose1d(weight, bias, params)?.squeeze(0);
        }
        expect_3d(OP, self, "input [N, C_in, L]")?;
        expect_3d(OP, weight, "weight [C_in, C_out / groups, k]")?;
        let out =
            self.unsqueeze(2)?.conv_transpose2d(&weight.unsqueeze(2)?, bias, params.as_2d()).map_err(as_1d(OP))?;
        out.squeeze(2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_map_to_a_unit_height() {
        let p = Conv1dParams::new().with_stride(2).with_padding(1).with_dilation(3).with_groups(2);
        assert_eq!(p.as_2d(), Conv2dParams { stride: (1, 2), padding: (0, 1), dilation: (1, 3), groups: 2 });
        let t = ConvTranspose1dParams::new().with_stride(2).with_padding(1).with_output_padding(1).with_dilation(3);
        assert_eq!(
            t.as_2d(),
            ConvTranspose2dParams {
                stride: (1, 2),
                padding: (0, 1),
                output_padding: (0, 1),
                dilation: (1, 3),
                groups: 1
            }
        );
    }
}
