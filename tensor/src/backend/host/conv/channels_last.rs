//! The host's convolutions in the channels-last memory format (PyTorch's
//! `channels_last`), for operands that ask for it
//! ([`crate::backend::args::channels_last_operands`]): `im2row` unfolds
//! each output pixel's receptive field into a row, a run of channels per
//! tap, and one product per block of images, `rows [N·P, kH·kW·C] ·
//! weightᵀ`, writes the block's channels-last output in place. A
//! channels-last weight (a model after `to_channels_last`) is that product's
//! operand as it lies; another weight is gathered into that order once per
//! call. The input gradient is `dY [N·P, C_out] · weight` folded back by
//! `row2im`, and the weight gradient `dYᵀ · rows`, summed over the images in
//! the accumulator type and returned channels-last, as cuDNN's.
//!
//! A 1x1 kernel with stride 1 and no padding reads the image in place
//! (its pixels are the rows), as the other format's path does.

use super::{
    for_each_block, images_per_product, kernel_error, non_negative, one, options, scratch_vec, strides4,
    sum_over_images, zero, ConvFloat,
};
use crate::backend::args::channels_last_dims;
use crate::backend::{output, ConvPlan};
use crate::error::Result;
use crate::storage::lock_storages;
use crate::tensor::Tensor;
use brasa_kernels::conv::{im2row, row2im};
use brasa_kernels::gemm::{gemm_with, GemmOptions, MatMut, MatRef};
use rayon::prelude::*;

/// `t` dense in the channels-last format: itself when it is, else a copy.
pub(in crate::backend) fn dense_channels_last(t: &Tensor) -> Result<Tensor> {
    if t.is_channels_last() {
        Ok(t.clone())
    } else {
        t.to_channels_last()
    }
}

/// The channels-last result written as row-major `[N, H, W, C]`, seen as
/// the `[N, C, H, W]` it is. With one channel or a 1×1 image that order is
/// also row-major `[N, C, H, W]`: then it gets row-major strides (as
/// PyTorch's result would), which is how autograd and the optimizers tell
/// a gradient laid out as its row-major weight.
pub(in crate::backend) fn as_nchw(t: Tensor) -> Result<Tensor> {
    let [n, h, w, c] = [t.dims()[0], t.dims()[1], t.dims()[2], t.dims()[3]];
    if c == 1 || h * w == 1 {
        // Only a view: the tensor is contiguous.
        return t.view(&[n, c, h, w].map(|d| d as isize));
    }
    t.permute(&[0, 3, 1, 2])
}

/// A weight `[C_out, C_in/g, kH, kW]` as rows in `im2row`'s tap order
/// (`(kh, kw, c)`): where they lie (`data`, first element, row stride).
struct TapMajorWeight<'a, T> {
    data: &'a [T],
    offset: usize,
    row_stride: usize,
}

/// Reads `weight` (non-negative strides) from `w`, its storage's elements:
/// in place when it is channels-last, else gathered into `gathered`.
fn tap_major<'a, T: ConvFloat>(
    weight: &Tensor,
    w: &'a [T],
    gathered: &'a mut Vec<T>,
    k: usize,
) -> Result<TapMajorWeight<'a, T>> {
    if weight.is_channels_last() {
        let c_out = weight.dims()[0];
        let row_stride = if c_out > 1 { weight.strides()[0] as usize } else { k };
        return Ok(TapMajorWeight { data: w, offset: weight.layout().offset(), row_stride });
    }
    let [c_out, c, kw] = [weight.dims()[0], weight.dims()[1], weight.dims()[3]];
    let [s_o, s_c, s_h, s_w] = strides4(weight);
    let base = weight.layout().offset();
    *gathered = scratch_vec("conv2d", c_out * k, T::ZERO)?;
    for (o, taps) in gathered.chunks_exact_mut(k.max(1)).enumerate() {
        for (t, tap) in taps.chunks_exact_mut(c.max(1)).enumerate() {
            let (i, j) = (t / kw, t % kw);
            for (ci, value) in tap.iter_mut().enumerate() {
                *value = w[base + o * s_o + ci * s_c + i * s_h + j * s_w];
            }
        }
    }
    Ok(TapMajorWeight { data: gathered, offset: 0, row_stride: k })
}

impl<T> TapMajorWeight<'_, T> {
    /// Group `g`'s rows, `[C_out/g, K]`.
    fn group(&self, g: usize, cog: usize, k: usize) -> std::result::Result<MatRef<'_, T>, brasa_kernels::KernelError> {
        MatRef::new(self.data, self.offset + g * cog * self.row_stride, [cog, k], [self.row_stride, 1])
    }
}

/// See [`super::conv2d`]: the output channels-last.
pub(super) fn forward<T: ConvFloat>(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    plan: &ConvPlan,
) -> Result<Tensor> {
    const OP: &str = "conv2d";
    let err = kernel_error(OP);
    let input = dense_channels_last(input)?;
    let weight = non_negative(weight)?;
    let geometry = &plan.geometry;
    let (k, p) = (geometry.col_rows(), geometry.col_cols());
    let (cog, cig, c_in, c_out) = (plan.c_out_group(), geometry.channels(), plan.c_in, plan.c_out);
    let (h, w_in) = geometry.input();
    // A dense channels-last image: pixel (h, w) of image n at
    // ((n·H + h)·W + w)·C_in (the strides of size-1 dims say nothing).
    let pixel = c_in;
    let image = h * w_in * c_in;
    let images = images_per_product(plan, k, p);
    let b: Option<Vec<T>> = bias.map(|b| b.to_vec::<T>()).transpose()?;
    let result = output(input.device(), input.dtype(), &channels_last_dims(&plan.output_shape()))?;
    let locks = lock_storages(&[input.storage(), weight.storage()], &[]);
    let (x, w) = (locks.read::<T>(input.storage(), OP)?, locks.read::<T>(weight.storage(), OP)?);
    let mut gathered = Vec::new();
    let w = tap_major(&weight, w, &mut gathered, k)?;
    let x_at = input.layout().offset();
    // SAFETY: every block's rows are set, group by group into its columns:
    // by the product (`beta` zero), or by the bias and then the product
    // adding to it.
    let out = unsafe {
        result.init_with::<T>(OP, |out| {
            let options = options(plan);
            let in_place = geometry.is_pointwise();
            let rows_len = if in_place { 0 } else { k * p * images };
            let scratch = || scratch_vec(OP, rows_len, T::ZERO);
            for_each_block(plan, images, out, scratch, |first, count, out_block, rows| {
                let m = count * p;
                let beta = match &b {
                    Some(b) => {
                        for row in out_block.chunks_exact_mut(c_out) {
                            row.copy_from_slice(b);
                        }
                        one::<T>()
                    }
                    None => zero::<T>(),
                };
                for g in 0..plan.groups {
                    let first_channel = x_at + first * image + g * cig;
                    let a = if in_place {
                        MatRef::new(x, first_channel, [m, cig], [pixel, 1]).map_err(&err)?
                    } else {
                        for n in 0..count {
                            let at = first_channel + n * image;
                            im2row(geometry, x, at, [w_in * pixel, pixel], &mut rows[n * p * k..], k).map_err(&err)?;
                        }
                        MatRef::new(rows, 0, [m, k], [k, 1]).map_err(&err)?
                    };
                    let c = MatMut::new(out_block, g * cog, [m, cog], [c_out, 1]).map_err(&err)?;
                    gemm_with(&options, one::<T>(), a, w.group(g, cog, k).map_err(&err)?.t(), beta, c).map_err(&err)?;
                }
                Ok(())
            })
        })
    }?;
    as_nchw(out)
}

/// See [`super::conv2d_backward_input`]: the input gradient channels-last.
pub(super) fn backward_input<T: ConvFloat>(grad: &Tensor, weight: &Tensor, plan: &ConvPlan) -> Result<Tensor> {
    const OP: &str = "conv2d_backward_input";
    let err = kernel_error(OP);
    let grad = dense_channels_last(grad)?;
    let weight = non_negative(weight)?;
    let geometry = &plan.geometry;
    let (k, p) = (geometry.col_rows(), geometry.col_cols());
    let (cog, cig, c_in, c_out) = (plan.c_out_group(), geometry.channels(), plan.c_in, plan.c_out);
    let (h, w_in) = geometry.input();
    let plane = h * w_in;
    let images = images_per_product(plan, k, p);
    let result = output(grad.device(), grad.dtype(), &channels_last_dims(&plan.input_shape()))?;
    let locks = lock_storages(&[grad.storage(), weight.storage()], &[]);
    let (gy, w) = (locks.read::<T>(grad.storage(), OP)?, locks.read::<T>(weight.storage(), OP)?);
    let mut gathered = Vec::new();
    let w = tap_major(&weight, w, &mut gathered, k)?;
    let gy_at = grad.layout().offset();
    // SAFETY: every image's pixels are set, group by group in their
    // channels: by the product (`beta` zero) or by rounding the fold.
    let out = unsafe {
        result.init_with::<T>(OP, |out| {
            let options = options(plan);
            let in_place = geometry.is_pointwise();
            let per_image = plane * c_in;
            // The rows' gradients and, after them, one image's fold, both in
            // the accumulator type (none without output channels: the
            // gradient is zero).
            let acc_len = if in_place || cog == 0 { 0 } else { k * p * images + plane * cig };
            let scratch = || scratch_vec(OP, acc_len, zero::<T>());
            for_each_block(plan, images, out, scratch, |first, count, out_block, acc| {
                if cog == 0 {
                    out_block.fill(T::ZERO);
                    return Ok(());
                }
                let m = count * p;
                for g in 0..plan.groups {
                    // dY_g [N·P, C_out/g] · W_g [C_out/g, K]
                    let dy =
                        MatRef::new(gy, gy_at + first * p * c_out + g * cog, [m, cog], [c_out, 1]).map_err(&err)?;
                    let wg = w.group(g, cog, k).map_err(&err)?;
                    if in_place {
                        let c = MatMut::new(out_block, g * cig, [m, cig], [c_in, 1]).map_err(&err)?;
                        gemm_with(&options, one::<T>(), dy, wg, zero::<T>(), c).map_err(&err)?;
                        continue;
                    }
                    let (rows, folded) = acc.split_at_mut(k * p * images);
                    let c = MatMut::new(rows, 0, [m, k], [k, 1]).map_err(&err)?;
                    T::gemm_acc(&options, one::<T>(), dy, wg, zero::<T>(), c).map_err(&err)?;
                    for n in 0..count {
                        folded.fill(zero::<T>());
                        row2im(geometry, &rows[n * p * k..], k, folded).map_err(&err)?;
                        let pixels = &mut out_block[n * per_image..(n + 1) * per_image];
                        if plan.groups == 1 {
                            T::from_acc(folded, pixels);
                        } else {
                            for (dst, src) in pixels.chunks_exact_mut(c_in).zip(folded.chunks_exact(cig)) {
                                T::from_acc(src, &mut dst[g * cig..(g + 1) * cig]);
                            }
                        }
                    }
                }
                Ok(())
            })
        })
    }?;
    as_nchw(out)
}

/// See [`super::conv2d_backward_weight`]: the weight gradient
/// channels-last (`[C_out, kH, kW, C_in/g]` in memory, the rows' order).
pub(super) fn backward_weight<T: ConvFloat>(input: &Tensor, grad: &Tensor, plan: &ConvPlan) -> Result<Tensor> {
    const OP: &str = "conv2d_backward_weight";
    let err = kernel_error(OP);
    let input = dense_channels_last(input)?;
    let grad = dense_channels_last(grad)?;
    let geometry = &plan.geometry;
    let (k, p) = (geometry.col_rows(), geometry.col_cols());
    let (cog, cig, c_in, c_out) = (plan.c_out_group(), geometry.channels(), plan.c_in, plan.c_out);
    let (h, w_in) = geometry.input();
    let image = h * w_in * c_in;
    let images = images_per_product(plan, k, p);
    let result = output(input.device(), input.dtype(), &channels_last_dims(&plan.weight_shape()))?;
    let locks = lock_storages(&[input.storage(), grad.storage()], &[]);
    let (x, gy) = (locks.read::<T>(input.storage(), OP)?, locks.read::<T>(grad.storage(), OP)?);
    let (x_at, gy_at) = (input.layout().offset(), grad.layout().offset());
    let in_place = geometry.is_pointwise();
    let rows_len = if in_place { 0 } else { k * p * images };
    // dW_g [C_out/g, K] += dY_gᵀ [C_out/g, N·P] · rows [N·P, K] over the
    // images of `range`, a block at a time, in the accumulator type.
    let accumulate =
        |range: std::ops::Range<usize>, dw: &mut [T::Scalar], rows: &mut Vec<T>, options: &GemmOptions| -> Result<()> {
            let mut first = range.start;
            while first < range.end {
                let count = images.min(range.end - first);
                let m = count * p;
                for g in 0..plan.groups {
                    let dy =
                        MatRef::new(gy, gy_at + first * p * c_out + g * cog, [m, cog], [c_out, 1]).map_err(&err)?;
                    let first_channel = x_at + first * image + g * cig;
                    let a = if in_place {
                        MatRef::new(x, first_channel, [m, cig], [c_in, 1]).map_err(&err)?
                    } else {
                        for n in 0..count {
                            let at = first_channel + n * image;
                            im2row(geometry, x, at, [w_in * c_in, c_in], &mut rows[n * p * k..], k).map_err(&err)?;
                        }
                        MatRef::new(rows, 0, [m, k], [k, 1]).map_err(&err)?
                    };
                    let c = MatMut::new(dw, g * cog * k, [cog, k], [k, 1]).map_err(&err)?;
                    T::gemm_acc(options, one::<T>(), dy.t(), a, one::<T>(), c).map_err(&err)?;
                }
                first += count;
            }
            Ok(())
        };
    // SAFETY: every element is set, from the f32 (or f64) sums.
    let out = unsafe {
        result.init_with::<T>(OP, |out| {
            if plan.batch == 0 || out.is_empty() {
                out.fill(T::ZERO);
                return Ok(());
            }
            let scratch = || scratch_vec(OP, rows_len, T::ZERO);
            let sums = sum_over_images::<T, _>(OP, plan, out.len(), scratch, &accumulate)?;
            T::from_acc(&sums, out);
            Ok(())
        })
    }?;
    as_nchw(out)
}

/// See [`super::conv2d_backward_bias`], for a dense channels-last `grad`
/// (`[N·H·W, C]` rows, read in place): each channel's sum over the rows in
/// f64, in eight independent partial sums per channel as the other
/// format's planes are summed.
pub(super) fn backward_bias<T: ConvFloat>(grad: &Tensor) -> Result<Tensor> {
    const OP: &str = "conv2d_backward_bias";
    let c = grad.dims()[1];
    let rows = grad.numel().checked_div(c).unwrap_or(0);
    let result = output(grad.device(), grad.dtype(), &crate::shape::Shape::from([c]))?;
    let g = grad.storage().read::<T>(OP)?;
    let g = super::dense_elements(OP, &g, grad)?;
    // SAFETY: each channel's element is set, reading none.
    unsafe {
        result.init_with::<T>(OP, |out| {
            const CHANNELS: usize = 64;
            out.par_chunks_mut(CHANNELS).enumerate().for_each(|(block, sums)| {
                let first = block * CHANNELS;
                let mut acc = [0.0f64; CHANNELS];
                for row in g.chunks_exact(c.max(1)).take(rows) {
                    for (a, &v) in acc.iter_mut().zip(&row[first..first + sums.len()]) {
                        *a += v.widen();
                    }
                }
                for (o, &a) in sums.iter_mut().zip(&acc) {
                    *o = T::from_f64(a);
                }
            });
            Ok(())
        })
    }
}
