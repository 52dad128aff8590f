//! Convolutions as matrix products over columns ("im2col"), written once
//! above the two kernels a device supplies ([`ColumnKernels`]: unfolding an
//! image into columns, folding columns back): the CUDA backend's path where
//! cuDNN is absent or declines, and what a meta device imitating a CUDA
//! device allocates for it (its kernels allocate and compute nothing), so
//! the two cannot drift apart.
//!
//! - forward: `W_g [C_out/g, K] · col_g [N, K, P]` → `[N, C_out/g, P]`;
//! - input gradient: `W_gᵀ · dY_g` → columns, folded back by `col2im`;
//! - weight gradient: `dY_g · col_gᵀ` summed over the batch;
//!
//! one group at a time, the whole batch per product, the groups joined.
//! `K = C_in/g · kH · kW` and `P = H_out · W_out`.

use crate::backend::ConvPlan;
use crate::error::{Result, TensorError};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// The two kernels of a device's im2col convolutions.
pub(crate) trait ColumnKernels {
    /// The columns `[N, K, P]` of group `group` of `input` (any strides).
    fn im2col(&self, op: &'static str, input: &Tensor, group: usize, plan: &ConvPlan) -> Result<Tensor>;
    /// The image `[N, C_in/g, H, W]` folded from columns `[N, K, P]` (contiguous).
    fn col2im(&self, op: &'static str, col: &Tensor, plan: &ConvPlan) -> Result<Tensor>;
}

/// `values` as the `&[isize]` that `reshape` takes.
fn dims(values: &[usize]) -> Vec<isize> {
    values.iter().map(|&v| v as isize).collect()
}

/// Adds `bias` (`[C_out]`) to every position of `out` (`[N, C_out, H, W]`), in place.
pub(crate) fn add_bias(out: &Tensor, bias: Option<&Tensor>, c_out: usize) -> Result<()> {
    if let Some(bias) = bias {
        out.add_(&bias.reshape(&dims(&[1, c_out, 1, 1]))?)?;
    }
    Ok(())
}

/// Puts each group's result into one tensor of `shape` along `dim` (the one
/// group's result as it is when there is one).
fn join_groups(parts: Vec<Tensor>, dim: usize, shape: Shape, like: &Tensor) -> Result<Tensor> {
    if parts.len() == 1 {
        return parts.into_iter().next().ok_or_else(|| TensorError::invalid("conv2d", "no group"));
    }
    let joined = Tensor::zeros_on(shape, like.dtype(), like.device())?;
    let mut start = 0;
    for part in &parts {
        let len = part.dims()[dim];
        joined.narrow(dim, start, len)?.copy_(part)?;
        start += len;
    }
    Ok(joined)
}

/// The convolution `[N, C_out, H_out, W_out]`, bias added.
pub(crate) fn conv2d(
    kernels: &impl ColumnKernels,
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    plan: &ConvPlan,
) -> Result<Tensor> {
    const OP: &str = "conv2d";
    let (cog, k, p) = (plan.c_out_group(), plan.geometry.col_rows(), plan.geometry.col_cols());
    let (oh, ow) = plan.geometry.output();
    let w = weight.contiguous()?.reshape(&dims(&[plan.c_out, k]))?;
    let mut parts = Vec::with_capacity(plan.groups);
    for g in 0..plan.groups {
        let col = kernels.im2col(OP, input, g, plan)?;
        parts.push(w.narrow(0, g * cog, cog)?.matmul(&col)?);
    }
    let out = join_groups(parts, 1, Shape::from([plan.batch, plan.c_out, p]), input)?;
    let out = out.reshape(&dims(&[plan.batch, plan.c_out, oh, ow]))?;
    add_bias(&out, bias, plan.c_out)?;
    Ok(out)
}

/// The input gradient `[N, C_in, H, W]`: per group the columns
/// `W_gᵀ · dY_g`, folded back while they are alive; the groups joined.
pub(crate) fn conv2d_backward_input(
    kernels: &impl ColumnKernels,
    grad: &Tensor,
    weight: &Tensor,
    plan: &ConvPlan,
) -> Result<Tensor> {
    const OP: &str = "conv2d_backward_input";
    let (cog, k, p) = (plan.c_out_group(), plan.geometry.col_rows(), plan.geometry.col_cols());
    let w = weight.contiguous()?.reshape(&dims(&[plan.c_out, k]))?;
    let dy = grad.contiguous()?.reshape(&dims(&[plan.batch, plan.c_out, p]))?;
    let mut parts = Vec::with_capacity(plan.groups);
    for g in 0..plan.groups {
        let wt = w.narrow(0, g * cog, cog)?.t()?;
        let col = wt.matmul(&dy.narrow(1, g * cog, cog)?)?;
        parts.push(kernels.col2im(OP, &col, plan)?);
    }
    let (h, w) = plan.geometry.input();
    join_groups(parts, 1, Shape::from([plan.batch, plan.c_in, h, w]), grad)
}

/// The weight gradient `[C_out, C_in/g, kH, kW]`: per group the columns,
/// the per-image products and their sum over the batch; the groups joined.
pub(crate) fn conv2d_backward_weight(
    kernels: &impl ColumnKernels,
    input: &Tensor,
    grad: &Tensor,
    plan: &ConvPlan,
) -> Result<Tensor> {
    const OP: &str = "conv2d_backward_weight";
    let (cog, k, p) = (plan.c_out_group(), plan.geometry.col_rows(), plan.geometry.col_cols());
    let dy = grad.contiguous()?.reshape(&dims(&[plan.batch, plan.c_out, p]))?;
    let mut parts = Vec::with_capacity(plan.groups);
    for g in 0..plan.groups {
        let col = kernels.im2col(OP, input, g, plan)?;
        let per_image = dy.narrow(1, g * cog, cog)?.matmul(&col.transpose(1, 2)?)?;
        parts.push(per_image.sum(&[0], false)?);
    }
    let dw = join_groups(parts, 0, Shape::from([plan.c_out, k]), input)?;
    let (kh, kw) = plan.geometry.kernel();
    dw.reshape(&dims(&[plan.c_out, plan.geometry.channels(), kh, kw]))
}

/// The bias gradient: a sum over dims 0, 2 and 3.
pub(crate) fn conv2d_backward_bias(grad: &Tensor) -> Result<Tensor> {
    grad.sum(&[0, 2, 3], false)
}
