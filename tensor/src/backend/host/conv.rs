//! The host's convolutions: each image (and group) is one matrix product.
//! `im2col` unfolds the input's receptive fields into columns and the
//! weight multiplies them (a 1x1 kernel reads the image in place); the input
//! gradient multiplies by the transposed weight and folds the columns back
//! (`col2im`); the weight gradient sums the products over images. Images go
//! to threads one by one when there are enough of them, else each product
//! uses every thread.
//!
//! f16 and bf16 stay in their dtype end to end: the columns are unfolded in
//! it and the products read it (bf16 with AVX512-BF16 dot products where
//! the CPU has them), accumulating in f32. What is summed beyond one
//! product (the folded input gradient, the weight gradient over images) is
//! summed in f32 and rounded once.
//!
//! Operands that ask for the channels-last memory format
//! ([`channels_last_operands`], PyTorch's rule) go to [`channels_last`]: rows
//! per output pixel instead of columns, and channels-last results.

mod channels_last;

pub(in crate::backend) use channels_last::{as_nchw, dense_channels_last};

use super::matmul::gemm_error;
use crate::backend::args::channels_last_operands;
use crate::backend::merged_stride;
use crate::backend::output;
use crate::backend::ConvPlan;
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::shape::Shape;
use crate::storage::lock_storages;
use crate::tensor::Tensor;
use brasa_kernels::conv::{col2im_with_row_stride, im2col_with_row_stride};
use brasa_kernels::gemm::{gemm_into_f32_with, gemm_with, GemmElement, GemmOptions, MatMut, MatRef, Parallelism};
use brasa_kernels::scratch::try_vec;
use brasa_kernels::KernelError;
use half::{bf16, f16, slice::HalfFloatSliceExt};
use rayon::prelude::*;
use std::ops::AddAssign;

/// Whether images go to threads one by one (each product on one thread)
/// rather than one after another (each product on all threads).
fn split_by_image(plan: &ConvPlan) -> bool {
    let threads = rayon::current_num_threads();
    threads > 1 && plan.batch >= threads
}

fn options(plan: &ConvPlan) -> GemmOptions {
    let parallelism = if split_by_image(plan) { Parallelism::Sequential } else { Parallelism::Auto };
    GemmOptions { parallelism, ..GemmOptions::default() }
}

/// The type sums are kept in: f32, or f64 for f64 (a product's `Scalar`).
trait Accumulator: GemmElement<Scalar = Self> + WithDType + AddAssign {}
impl Accumulator for f32 {}
impl Accumulator for f64 {}

/// The element types the loops run in, each with the type its sums are
/// kept in ([`Accumulator`]: f32 for f32, f16 and bf16; f64 for f64).
trait ConvFloat: GemmElement<Scalar: Accumulator> + WithDType {
    /// `C = alpha·A·B + beta·C` with C in the accumulator type.
    fn gemm_acc(
        options: &GemmOptions,
        alpha: Self::Scalar,
        a: MatRef<'_, Self>,
        b: MatRef<'_, Self>,
        beta: Self::Scalar,
        c: MatMut<'_, Self::Scalar>,
    ) -> std::result::Result<(), KernelError>;

    /// Rounds accumulated values into this type (a copy when they are it).
    fn from_acc(src: &[Self::Scalar], dst: &mut [Self]);

    /// The value as an f64, exactly; cheap enough for loops to vectorise.
    fn widen(self) -> f64;
}

impl ConvFloat for f32 {
    fn gemm_acc(
        options: &GemmOptions,
        alpha: f32,
        a: MatRef<'_, f32>,
        b: MatRef<'_, f32>,
        beta: f32,
        c: MatMut<'_, f32>,
    ) -> std::result::Result<(), KernelError> {
        gemm_with(options, alpha, a, b, beta, c)
    }
    fn from_acc(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    #[inline(always)]
    fn widen(self) -> f64 {
        f64::from(self)
    }
}

impl ConvFloat for f64 {
    fn gemm_acc(
        options: &GemmOptions,
        alpha: f64,
        a: MatRef<'_, f64>,
        b: MatRef<'_, f64>,
        beta: f64,
        c: MatMut<'_, f64>,
    ) -> std::result::Result<(), KernelError> {
        gemm_with(options, alpha, a, b, beta, c)
    }
    fn from_acc(src: &[f64], dst: &mut [f64]) {
        dst.copy_from_slice(src);
    }
    #[inline(always)]
    fn widen(self) -> f64 {
        self
    }
}

impl ConvFloat for bf16 {
    fn gemm_acc(
        options: &GemmOptions,
        alpha: f32,
        a: MatRef<'_, bf16>,
        b: MatRef<'_, bf16>,
        beta: f32,
        c: MatMut<'_, f32>,
    ) -> std::result::Result<(), KernelError> {
        gemm_into_f32_with(options, alpha, a, b, beta, c)
    }
    fn from_acc(src: &[f32], dst: &mut [bf16]) {
        brasa_kernels::convert::narrow_bf16_slice(src, dst);
    }
    #[inline(always)]
    fn widen(self) -> f64 {
        f64::from(brasa_kernels::convert::bf16_to_f32(self))
    }
}

impl ConvFloat for f16 {
    fn gemm_acc(
        options: &GemmOptions,
        alpha: f32,
        a: MatRef<'_, f16>,
        b: MatRef<'_, f16>,
        beta: f32,
        c: MatMut<'_, f32>,
    ) -> std::result::Result<(), KernelError> {
        gemm_into_f32_with(options, alpha, a, b, beta, c)
    }
    fn from_acc(src: &[f32], dst: &mut [f16]) {
        dst.convert_from_f32_slice(src);
    }
    #[inline(always)]
    fn widen(self) -> f64 {
        f64::from(self.to_f32())
    }
}

/// One for the products' scalars.
fn one<T: ConvFloat>() -> T::Scalar {
    <T::Scalar as WithDType>::ONE
}

/// Zero for the products' scalars.
fn zero<T: ConvFloat>() -> T::Scalar {
    <T::Scalar as WithDType>::ZERO
}

/// `t` itself when all strides are non-negative, else a contiguous copy.
pub(in crate::backend) fn non_negative(t: &Tensor) -> Result<Tensor> {
    if t.strides().iter().all(|&s| s >= 0) {
        Ok(t.clone())
    } else {
        t.contiguous()
    }
}

fn strides4(t: &Tensor) -> [usize; 4] {
    let s = t.strides();
    // Rank 4 and non-negative: checked by the callers.
    [s[0] as usize, s[1] as usize, s[2] as usize, s[3] as usize]
}

/// A 4-d tensor seen as matrices: dim `row_dim` gives the rows and the dims
/// after it merge into the columns (the weight as `[C_out, C_in·kH·kW]` with
/// `row_dim` 0; an image's planes as `[C, H·W]` with `row_dim` 1). Returns
/// the tensor (a contiguous copy when its strides allow no such view), the
/// row stride and the column stride.
pub(in crate::backend) fn matrix_view(t: &Tensor, row_dim: usize) -> Result<(Tensor, usize, usize)> {
    let t = non_negative(t)?;
    let s = strides4(&t);
    if let Some(cols) = merged_stride(&t.dims()[row_dim + 1..], &s[row_dim + 1..]) {
        return Ok((t, s[row_dim], cols));
    }
    let t = t.contiguous()?;
    let s = strides4(&t);
    Ok((t, s[row_dim], 1))
}

fn kernel_error(op: &'static str) -> impl Fn(KernelError) -> TensorError {
    move |e| gemm_error(op, e)
}

/// Runs `$body` with `$T` the element type of the floating-point `$dtype`.
macro_rules! dispatch_conv {
    ($op:expr, $dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                $body
            }
            DType::BF16 => {
                type $T = bf16;
                $body
            }
            DType::F16 => {
                type $T = f16;
                $body
            }
            other => Err(TensorError::invalid($op, format!("needs a floating-point tensor, got {other}"))),
        }
    };
}

/// See [`crate::backend::DeviceOps::conv2d`].
pub(super) fn conv2d(input: &Tensor, weight: &Tensor, bias: Option<&Tensor>, plan: &ConvPlan) -> Result<Tensor> {
    if channels_last_operands(input, weight) {
        return dispatch_conv!("conv2d", input.dtype(), T => channels_last::forward::<T>(input, weight, bias, plan));
    }
    dispatch_conv!("conv2d", input.dtype(), T => forward::<T>(input, weight, bias, plan))
}

/// See [`crate::backend::DeviceOps::conv2d_backward_input`].
pub(super) fn conv2d_backward_input(grad: &Tensor, weight: &Tensor, plan: &ConvPlan) -> Result<Tensor> {
    if channels_last_operands(grad, weight) {
        return dispatch_conv!("conv2d_backward_input", grad.dtype(), T => channels_last::backward_input::<T>(grad, weight, plan));
    }
    dispatch_conv!("conv2d_backward_input", grad.dtype(), T => backward_input::<T>(grad, weight, plan))
}

/// See [`crate::backend::DeviceOps::conv2d_backward_weight`].
pub(super) fn conv2d_backward_weight(input: &Tensor, grad: &Tensor, plan: &ConvPlan) -> Result<Tensor> {
    if channels_last_operands(input, grad) {
        return dispatch_conv!("conv2d_backward_weight", input.dtype(), T => channels_last::backward_weight::<T>(input, grad, plan));
    }
    dispatch_conv!("conv2d_backward_weight", input.dtype(), T => backward_weight::<T>(input, grad, plan))
}

/// See [`crate::backend::DeviceOps::conv2d_backward_bias`]: sums accumulated
/// in f64.
pub(super) fn conv2d_backward_bias(grad: &Tensor) -> Result<Tensor> {
    const OP: &str = "conv2d_backward_bias";
    dispatch_conv!(OP, grad.dtype(), T => backward_bias::<T>(grad))
}

fn backward_bias<T: ConvFloat>(grad_output: &Tensor) -> Result<Tensor> {
    const OP: &str = "conv2d_backward_bias";
    if grad_output.is_strictly_channels_last() {
        return channels_last::backward_bias::<T>(grad_output);
    }
    let grad = grad_output.contiguous()?;
    let [n, c, h, w] = [grad.dims()[0], grad.dims()[1], grad.dims()[2], grad.dims()[3]];
    let plane = h * w;
    // Empty planes sum to zero: skip the batch, which an expanded view
    // can make huge (2^40 images of nothing would never finish).
    let n = if plane == 0 { 0 } else { n };
    let result = output(grad_output.device(), grad_output.dtype(), &Shape::from([c]))?;
    let g = grad.storage().read::<T>(OP)?;
    let g = dense_elements(OP, &g, &grad)?;
    // SAFETY: each channel's element is set, reading none.
    unsafe {
        result.init_with::<T>(OP, |out| {
            out.par_iter_mut().enumerate().for_each(|(channel, o)| {
                let sum: f64 = (0..n)
                    .map(|image| {
                        let start = (image * c + channel) * plane;
                        plane_sum(&g[start..start + plane])
                    })
                    .sum();
                *o = T::from_f64(sum);
            });
            Ok(())
        })
    }
}

/// The f64 sum of a plane, in eight independent partial sums (so that the
/// loop vectorises, where one running sum would wait on every addition).
fn plane_sum<T: ConvFloat>(values: &[T]) -> f64 {
    const LANES: usize = 8;
    let mut lanes = [0.0f64; LANES];
    let chunks = values.chunks_exact(LANES);
    let rest: f64 = chunks.remainder().iter().map(|&v| v.widen()).sum();
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane += v.widen();
        }
    }
    lanes.iter().sum::<f64>() + rest
}

/// The elements of the contiguous tensor `t` within its storage's slice
/// `data` (empty for an empty tensor, whatever its offset).
pub(crate) fn dense_elements<'a, T>(op: &'static str, data: &'a [T], t: &Tensor) -> Result<&'a [T]> {
    if t.numel() == 0 {
        return Ok(&[]);
    }
    let start = t.layout().offset();
    data.get(start..start + t.numel()).ok_or_else(|| {
        TensorError::invalid(
            op,
            format!(
                "a tensor of shape {:?} at offset {start} overruns its storage of {} elements",
                t.dims(),
                data.len()
            ),
        )
    })
}

/// How many images one product covers. Each product packs the weight
/// whole (and the AMX tiles are 32 columns wide), so with few output
/// pixels per image — the 4×4 planes of a ResNet's last stage — a product
/// per image repacks the weight for a sliver of work. Images side by side
/// in one column matrix give products of about `TARGET_COLUMNS` columns,
/// while every thread keeps a block of its own and the columns stay within
/// `MAX_COLUMN_ELEMENTS`.
fn images_per_product(plan: &ConvPlan, k: usize, p: usize) -> usize {
    const TARGET_COLUMNS: usize = 512;
    const MAX_COLUMN_ELEMENTS: usize = 1 << 22;
    if p == 0 || k == 0 || plan.batch <= 1 {
        return 1;
    }
    let threads = rayon::current_num_threads().max(1);
    let every_thread_busy = (plan.batch / threads).max(1);
    let budget = (MAX_COLUMN_ELEMENTS / k.saturating_mul(p)).max(1);
    TARGET_COLUMNS.div_ceil(p).min(every_thread_busy).min(budget).max(1)
}

/// A buffer of `len` elements for `op`'s scratch (fallible: an error naming
/// `op` and the bytes, not an abort).
fn scratch_vec<T: Clone>(op: &'static str, len: usize, value: T) -> Result<Vec<T>> {
    try_vec(len, value).map_err(|e| TensorError::scratch(op, e))
}

/// Runs `f(first image, images, chunk, scratch)` for every block of up to
/// `images` images of `out`, on threads by block or one after another as
/// `plan` says, each thread with the scratch `scratch` makes.
///
/// The column matrix can be far larger than the input and the output (a
/// wide padding or an expanded input makes `C_in·kH·kW × H_out·W_out`
/// huge while both fit), so scratch is allocated fallibly.
fn for_each_block<T: Send, S: Send>(
    plan: &ConvPlan,
    images: usize,
    out: &mut [T],
    scratch: impl Fn() -> Result<S> + Sync + Send,
    f: impl Fn(usize, usize, &mut [T], &mut S) -> Result<()> + Sync + Send,
) -> Result<()> {
    if plan.batch == 0 || out.is_empty() {
        return Ok(());
    }
    let per_image = out.len() / plan.batch;
    let per_block = per_image * images.max(1);
    let run = |(block, chunk): (usize, &mut [T]), s: &mut S| f(block * images, chunk.len() / per_image, chunk, s);
    if split_by_image(plan) {
        out.par_chunks_mut(per_block).enumerate().try_for_each_init(&scratch, |s, item| match s {
            Ok(s) => run(item, s),
            Err(e) => Err(e.clone()),
        })
    } else {
        let mut s = scratch()?;
        out.chunks_mut(per_block).enumerate().try_for_each(|item| run(item, &mut s))
    }
}

/// Where the output gradient's `[C_out/g, P]` block of group `g` lies for
/// the images `first..first + count` side by side: in place where the
/// images' columns follow one another evenly (always for one image; a
/// channels-last gradient's images too), else gathered into `gathered`.
fn grad_block<'a, T: Copy>(
    op: &'static str,
    gy: &'a [T],
    gathered: &'a mut [T],
    at: usize,
    [g_n, g_row, g_col]: [usize; 3],
    [first, count, g, cog, p]: [usize; 5],
) -> Result<MatRef<'a, T>> {
    let err = kernel_error(op);
    let width = count * p;
    let start = at + first * g_n + g * cog * g_row;
    if count == 1 || g_n == p * g_col {
        return MatRef::new(gy, start, [cog, width], [g_row, g_col]).map_err(&err);
    }
    for r in 0..cog {
        for b in 0..count {
            let src = start + b * g_n + r * g_row;
            let dst = &mut gathered[r * width + b * p..r * width + (b + 1) * p];
            if g_col == 1 {
                dst.copy_from_slice(&gy[src..src + p]);
            } else {
                for (j, d) in dst.iter_mut().enumerate() {
                    *d = gy[src + j * g_col];
                }
            }
        }
    }
    MatRef::new(gathered, 0, [cog, width], [width, 1]).map_err(&err)
}

fn forward<T: ConvFloat>(input: &Tensor, weight: &Tensor, bias: Option<&Tensor>, plan: &ConvPlan) -> Result<Tensor> {
    const OP: &str = "conv2d";
    let err = kernel_error(OP);
    let input = non_negative(input)?;
    let (weight, w_row, w_col) = matrix_view(weight, 0)?;
    let geometry = &plan.geometry;
    let (k, p) = (geometry.col_rows(), geometry.col_cols());
    let cog = plan.c_out_group();
    let cig = geometry.channels();
    let [s_n, s_c, s_h, s_w] = strides4(&input);
    // The image as a [C, H·W] matrix, when it is one (a 1x1 kernel).
    let pointwise = if geometry.is_pointwise() { merged_stride(&input.dims()[2..], &[s_h, s_w]) } else { None };
    let images = images_per_product(plan, k, p);
    // Read before the locks are taken: `to_vec` takes its own.
    let b: Option<Vec<T>> = bias.map(|b| b.to_vec::<T>()).transpose()?;
    let shape = plan.output_shape();
    let result = output(input.device(), input.dtype(), &shape)?;
    let locks = lock_storages(&[input.storage(), weight.storage()], &[]);
    let (x, w) = (locks.read::<T>(input.storage(), OP)?, locks.read::<T>(weight.storage(), OP)?);
    // The rows of group `g` in `rows` ([C_out/g, width]) set to the bias
    // (the product then adds to them) or left for the product to set.
    let bias_rows = |rows: &mut [T], g: usize, width: usize| match &b {
        Some(b) => {
            for (row, &value) in rows.chunks_exact_mut(width.max(1)).zip(&b[g * cog..]) {
                row.fill(value);
            }
            one::<T>()
        }
        None => zero::<T>(),
    };
    // SAFETY: every block's part of the output is set, group by group: by
    // the product (`beta` zero) or by the bias and then the product adding
    // to it, written in place for one image or copied from the product of
    // several; the groups' rows tile each image.
    unsafe {
        result.init_with::<T>(OP, |out| {
            let options = options(plan);
            let per_image = out.len() / plan.batch.max(1);
            let col_len = if pointwise.is_some() && images == 1 { 0 } else { k * p * images };
            let product_len = if images > 1 { cog * p * images } else { 0 };
            let scratch = || Ok((scratch_vec(OP, col_len, T::ZERO)?, scratch_vec(OP, product_len, T::ZERO)?));
            for_each_block(plan, images, out, scratch, |first, count, out_block, (col, product)| {
                let width = count * p;
                for g in 0..plan.groups {
                    let a = MatRef::new(w, weight.layout().offset() + g * cog * w_row, [cog, k], [w_row, w_col])
                        .map_err(&err)?;
                    let x_off = |n: usize| input.layout().offset() + n * s_n + g * cig * s_c;
                    let cols = match pointwise {
                        Some(hw) if count == 1 => MatRef::new(x, x_off(first), [cig, p], [s_c, hw]).map_err(&err)?,
                        _ => {
                            for b in 0..count {
                                let block = &mut col[b * p..];
                                im2col_with_row_stride(geometry, x, x_off(first + b), [s_c, s_h, s_w], block, width)
                                    .map_err(&err)?;
                            }
                            MatRef::new(col, 0, [k, width], [width, 1]).map_err(&err)?
                        }
                    };
                    if count == 1 {
                        let rows = &mut out_block[g * cog * p..(g + 1) * cog * p];
                        let beta = bias_rows(rows, g, p);
                        let c = MatMut::row_major(rows, cog, p).map_err(&err)?;
                        gemm_with(&options, one::<T>(), a, cols, beta, c).map_err(&err)?;
                        continue;
                    }
                    let product = &mut product[..cog * width];
                    let beta = bias_rows(product, g, width);
                    let c = MatMut::row_major(product, cog, width).map_err(&err)?;
                    gemm_with(&options, one::<T>(), a, cols, beta, c).map_err(&err)?;
                    for (r, row) in product.chunks_exact(width).enumerate() {
                        for (b, pixels) in row.chunks_exact(p).enumerate() {
                            let at = b * per_image + (g * cog + r) * p;
                            out_block[at..at + p].copy_from_slice(pixels);
                        }
                    }
                }
                Ok(())
            })
        })
    }
}

fn backward_input<T: ConvFloat>(grad: &Tensor, weight: &Tensor, plan: &ConvPlan) -> Result<Tensor> {
    const OP: &str = "conv2d_backward_input";
    let err = kernel_error(OP);
    let (grad, g_row, g_col) = matrix_view(grad, 1)?;
    let (weight, w_row, w_col) = matrix_view(weight, 0)?;
    let geometry = &plan.geometry;
    let (k, p) = (geometry.col_rows(), geometry.col_cols());
    let cog = plan.c_out_group();
    let image = geometry.image_len();
    let (h, w_in) = geometry.input();
    let g_n = strides4(&grad)[0];
    let images = images_per_product(plan, k, p);
    let shape = plan.input_shape();
    let result = output(grad.device(), grad.dtype(), &shape)?;
    let locks = lock_storages(&[grad.storage(), weight.storage()], &[]);
    let (gy, w) = (locks.read::<T>(grad.storage(), OP)?, locks.read::<T>(weight.storage(), OP)?);
    // SAFETY: every image's block of the output is set, group by group:
    // by the product (`beta` zero) or by rounding the folded columns.
    unsafe {
        result.init_with::<T>(OP, |out| {
            let options = options(plan);
            let pointwise = geometry.is_pointwise();
            let per_image = out.len() / plan.batch.max(1);
            // Without output channels the gradient is zero and needs no
            // column buffer (which an empty grad_output's huge planes would
            // make huge). The scratch holds the columns and, after them,
            // the image they fold into, both in the accumulator type; and
            // the gradient's blocks gathered side by side where they are
            // not so already.
            let col_len = k * p * images;
            let acc_len = if (pointwise && images == 1) || cog == 0 { 0 } else { col_len + image };
            let gather_len = if images > 1 && g_n != p * g_col && cog > 0 { cog * p * images } else { 0 };
            let scratch = || Ok((scratch_vec(OP, acc_len, zero::<T>())?, scratch_vec(OP, gather_len, T::ZERO)?));
            for_each_block(plan, images, out, scratch, |first, count, out_block, (acc, gathered)| {
                if cog == 0 {
                    out_block.fill(T::ZERO);
                    return Ok(());
                }
                let width = count * p;
                for g in 0..plan.groups {
                    // W_gᵀ [K, C_out/g] · dY_g [C_out/g, P per image]
                    let wt = MatRef::new(w, weight.layout().offset() + g * cog * w_row, [cog, k], [w_row, w_col])
                        .map_err(&err)?
                        .t();
                    let dy = grad_block(
                        OP,
                        gy,
                        gathered,
                        grad.layout().offset(),
                        [g_n, g_row, g_col],
                        [first, count, g, cog, p],
                    )?;
                    if pointwise && count == 1 {
                        let region = &mut out_block[g * image..(g + 1) * image];
                        let c = MatMut::row_major(region, k, h * w_in).map_err(&err)?;
                        gemm_with(&options, one::<T>(), wt, dy, zero::<T>(), c).map_err(&err)?;
                        continue;
                    }
                    let (col, folded) = acc.split_at_mut(col_len);
                    let c = MatMut::new(col, 0, [k, width], [width, 1]).map_err(&err)?;
                    T::gemm_acc(&options, one::<T>(), wt, dy, zero::<T>(), c).map_err(&err)?;
                    for b in 0..count {
                        folded.fill(zero::<T>());
                        col2im_with_row_stride(geometry, &col[b * p..], width, folded).map_err(&err)?;
                        let at = b * per_image + g * image;
                        T::from_acc(folded, &mut out_block[at..at + image]);
                    }
                }
                Ok(())
            })
        })
    }
}

/// The weight gradient's sums (`len` of them, in the accumulator type)
/// over all images: `accumulate(images, sums, scratch, options)` adds a
/// range of images' products into `sums`. With images split over threads,
/// each thread sums a share of them into its own partial gradient (with
/// its own `scratch()`), and the partials are added in order.
fn sum_over_images<T: ConvFloat, S>(
    op: &'static str,
    plan: &ConvPlan,
    len: usize,
    scratch: impl Fn() -> Result<S> + Sync,
    accumulate: impl Fn(std::ops::Range<usize>, &mut [T::Scalar], &mut S, &GemmOptions) -> Result<()> + Sync,
) -> Result<Vec<T::Scalar>> {
    if !split_by_image(plan) {
        let mut sums = scratch_vec(op, len, zero::<T>())?;
        accumulate(0..plan.batch, &mut sums, &mut scratch()?, &GemmOptions::default())?;
        return Ok(sums);
    }
    let threads = rayon::current_num_threads().min(plan.batch);
    let per = plan.batch.div_ceil(threads);
    let sequential = GemmOptions { parallelism: Parallelism::Sequential, ..GemmOptions::default() };
    let partials = (0..threads)
        .into_par_iter()
        .map(|t| {
            let mut dw = scratch_vec(op, len, zero::<T>())?;
            let range = (t * per).min(plan.batch)..((t + 1) * per).min(plan.batch);
            accumulate(range, &mut dw, &mut scratch()?, &sequential)?;
            Ok(dw)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut partials = partials.into_iter();
    let mut sums = partials.next().unwrap_or_default();
    for partial in partials {
        for (o, v) in sums.iter_mut().zip(partial) {
            *o += v;
        }
    }
    Ok(sums)
}

fn backward_weight<T: ConvFloat>(input: &Tensor, grad: &Tensor, plan: &ConvPlan) -> Result<Tensor> {
    const OP: &str = "conv2d_backward_weight";
    let err = kernel_error(OP);
    let input = non_negative(input)?;
    let (grad, g_row, g_col) = matrix_view(grad, 1)?;
    let geometry = &plan.geometry;
    let (k, p) = (geometry.col_rows(), geometry.col_cols());
    let cog = plan.c_out_group();
    let cig = geometry.channels();
    let [s_n, s_c, s_h, s_w] = strides4(&input);
    let g_n = strides4(&grad)[0];
    let pointwise = if geometry.is_pointwise() { merged_stride(&input.dims()[2..], &[s_h, s_w]) } else { None };
    let images = images_per_product(plan, k, p);
    let shape = plan.weight_shape();
    let result = output(input.device(), input.dtype(), &shape)?;
    let locks = lock_storages(&[input.storage(), grad.storage()], &[]);
    let (x, gy) = (locks.read::<T>(input.storage(), OP)?, locks.read::<T>(grad.storage(), OP)?);
    // SAFETY: every element is set, from the f32 (or f64) sums.
    unsafe {
        result.init_with::<T>(OP, |out| {
            // dW_g += dY_g [C_out/g, P per image] · colᵀ [P per image, K]
            // over the images in `range`, a block of `images` at a time,
            // summed in the accumulator type.
            let accumulate = |range: std::ops::Range<usize>,
                              dw: &mut [T::Scalar],
                              col: &mut [T],
                              gathered: &mut [T],
                              options: &GemmOptions|
             -> Result<()> {
                let mut first = range.start;
                while first < range.end {
                    let count = images.min(range.end - first);
                    let width = count * p;
                    for g in 0..plan.groups {
                        let x_off = |n: usize| input.layout().offset() + n * s_n + g * cig * s_c;
                        let dy = grad_block(
                            OP,
                            gy,
                            gathered,
                            grad.layout().offset(),
                            [g_n, g_row, g_col],
                            [first, count, g, cog, p],
                        )?;
                        let cols = match pointwise {
                            Some(hw) if count == 1 => {
                                MatRef::new(x, x_off(first), [cig, p], [s_c, hw]).map_err(&err)?
                            }
                            _ => {
                                for b in 0..count {
                                    let block = &mut col[b * p..];
                                    im2col_with_row_stride(
                                        geometry,
                                        x,
                                        x_off(first + b),
                                        [s_c, s_h, s_w],
                                        block,
                                        width,
                                    )
                                    .map_err(&err)?;
                                }
                                MatRef::new(col, 0, [k, width], [width, 1]).map_err(&err)?
                            }
                        };
                        let c = MatMut::new(dw, g * cog * k, [cog, k], [k, 1]).map_err(&err)?;
                        T::gemm_acc(options, one::<T>(), dy, cols.t(), one::<T>(), c).map_err(&err)?;
                    }
                    first += count;
                }
                Ok(())
            };
            // No images or no weights: the gradient is zero, and needs no
            // column buffer (which an empty grad_output's huge planes
            // would make huge).
            if plan.batch == 0 || out.is_empty() {
                out.fill(T::ZERO);
                return Ok(());
            }
            let col_len = if pointwise.is_some() && images == 1 { 0 } else { k * p * images };
            let gather_len = if images > 1 && g_n != p * g_col { cog * p * images } else { 0 };
            let scratch = || Ok((scratch_vec(OP, col_len, T::ZERO)?, scratch_vec(OP, gather_len, T::ZERO)?));
            let sums = sum_over_images::<T, _>(OP, plan, out.len(), scratch, |range, dw, (col, gathered), options| {
                accumulate(range, dw, col, gathered, options)
            })?;
            T::from_acc(&sums, out);
            Ok(())
        })
    }
}
