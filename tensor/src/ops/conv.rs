//! 2-d convolution and its gradients: [`Tensor::conv2d`],
//! [`Tensor::conv2d_backward_input`], [`Tensor::conv2d_backward_weight`] and
//! [`Tensor::conv2d_backward_bias`], with stride, padding, dilation and
//! groups ([`Conv2dParams`]).
//!
//! Each image (and group) is one matrix product: `im2col` unfolds the input's
//! receptive fields into a `[C_in·kH·kW, H_out·W_out]` matrix that the weight,
//! seen as `[C_out, C_in·kH·kW]`, multiplies; the input gradient multiplies by
//! the transposed weight and folds the columns back (`col2im`); the weight
//! gradient multiplies the output gradient by the transposed columns. A 1x1
//! kernel with stride 1 and no padding skips the unfolding: the image is the
//! matrix. Batches are split over threads by image, each image's product on
//! one thread, unless there are fewer images than threads. f16 and bf16 are
//! computed in f32.

use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::ops::common::{expect_dtype, expect_float, expect_rank, output, same_device};
use crate::ops::matmul::{gemm_error, merged_stride};
use crate::shape::Shape;
use crate::storage::lock_storages;
use crate::tensor::Tensor;
use brasa_kernels::conv::{col2im, im2col, Conv2dGeometry};
use brasa_kernels::gemm::{gemm_with, GemmElement, GemmOptions, MatMut, MatRef, Parallelism};
use brasa_kernels::scratch::try_vec;
use brasa_kernels::KernelError;
use rayon::prelude::*;
use std::ops::AddAssign;

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
        let plan = ConvPlan::new("conv2d", input, weight, *self)?;
        Ok(plan.output_shape())
    }
}

/// The checked sizes of one convolution.
#[derive(Clone, Copy, Debug)]
struct ConvPlan {
    batch: usize,
    c_in: usize,
    c_out: usize,
    groups: usize,
    geometry: Conv2dGeometry,
}

impl ConvPlan {
    fn new(op: &'static str, input: &[usize], weight: &[usize], params: Conv2dParams) -> Result<Self> {
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
        let geometry =
            Conv2dGeometry::new(c_per_group, (h, w), (kh, kw), params.stride, params.padding, params.dilation)
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
        Ok(ConvPlan { batch, c_in, c_out, groups, geometry })
    }

    fn output_shape(&self) -> Shape {
        let (h, w) = self.geometry.output();
        Shape::from([self.batch, self.c_out, h, w])
    }

    fn input_shape(&self) -> Shape {
        let (h, w) = self.geometry.input();
        Shape::from([self.batch, self.c_in, h, w])
    }

    fn weight_shape(&self) -> Shape {
        let (kh, kw) = self.geometry.kernel();
        Shape::from([self.c_out, self.geometry.channels(), kh, kw])
    }

    /// Output channels per group.
    fn c_out_group(&self) -> usize {
        self.c_out / self.groups
    }

    /// Whether images go to threads one by one (each product on one thread)
    /// rather than one after another (each product on all threads).
    fn split_by_image(&self) -> bool {
        let threads = rayon::current_num_threads();
        threads > 1 && self.batch >= threads
    }

    fn options(&self) -> GemmOptions {
        let parallelism = if self.split_by_image() { Parallelism::Sequential } else { Parallelism::Auto };
        GemmOptions { parallelism, ..GemmOptions::default() }
    }
}

/// The element types the loops run in; f16 and bf16 go through f32.
trait ConvFloat: GemmElement<Scalar = Self> + WithDType + AddAssign {}
impl ConvFloat for f32 {}
impl ConvFloat for f64 {}

/// `t` itself when all strides are non-negative, else a contiguous copy.
fn non_negative(t: &Tensor) -> Result<Tensor> {
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
fn matrix_view(t: &Tensor, row_dim: usize) -> Result<(Tensor, usize, usize)> {
    let t = non_negative(t)?;
    let s = strides4(&t);
    if let Some(cols) = merged_stride(&t.dims()[row_dim + 1..], &s[row_dim + 1..]) {
        return Ok((t, s[row_dim], cols));
    }
    let t = t.contiguous()?;
    let s = strides4(&t);
    Ok((t, s[row_dim], 1))
}

/// Converts f16/bf16 operands to f32, runs `f`, converts the result back.
fn in_compute_dtype(tensors: &[&Tensor], f: impl FnOnce(&[Tensor]) -> Result<Tensor>) -> Result<Tensor> {
    let dtype = tensors.first().map_or(DType::F32, |t| t.dtype());
    match dtype {
        DType::F16 | DType::BF16 => {
            let wide = tensors.iter().map(|t| t.to_dtype(DType::F32)).collect::<Result<Vec<_>>>()?;
            f(&wide)?.to_dtype(dtype)
        }
        _ => f(&tensors.iter().map(|t| (*t).clone()).collect::<Vec<_>>()),
    }
}

fn kernel_error(op: &'static str) -> impl Fn(KernelError) -> TensorError {
    move |e| gemm_error(op, e)
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
        let plan = ConvPlan::new(OP, self.dims(), weight.dims(), params)?;
        if let Some(bias) = bias {
            expect_dtype(OP, bias, self.dtype())?;
            if bias.dims() != [plan.c_out] {
                return Err(TensorError::shape(
                    OP,
                    format!("expected a bias of shape [{}] (C_out), got {:?}", plan.c_out, bias.dims()),
                ));
            }
        }
        in_compute_dtype(&operands, |t| {
            let bias = t.get(2);
            match t[0].dtype() {
                DType::F64 => forward::<f64>(&t[0], &t[1], bias, &plan),
                _ => forward::<f32>(&t[0], &t[1], bias, &plan),
            }
        })
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
        let plan = ConvPlan::new(OP, input_shape.dims(), weight.dims(), params)?;
        expect_grad_shape(OP, self, &plan)?;
        in_compute_dtype(&[self, weight], |t| match t[0].dtype() {
            DType::F64 => backward_input::<f64>(&t[0], &t[1], &plan),
            _ => backward_input::<f32>(&t[0], &t[1], &plan),
        })
    }

    /// The gradient of [`Tensor::conv2d`] with respect to its weight, with
    /// `self` the convolution's input `[N, C_in, H, W]`, `grad_output` the
    /// gradient of its output, and the weight's shape
    /// `[C_out, C_in / groups, kH, kW]`.
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
        let plan = ConvPlan::new(OP, self.dims(), weight_shape.dims(), params)?;
        expect_grad_shape(OP, grad_output, &plan)?;
        in_compute_dtype(&[self, grad_output], |t| match t[0].dtype() {
            DType::F64 => backward_weight::<f64>(&t[0], &t[1], &plan),
            _ => backward_weight::<f32>(&t[0], &t[1], &plan),
        })
    }

    /// The gradient of [`Tensor::conv2d`] with respect to its bias: this
    /// output gradient `[N, C_out, H_out, W_out]` summed over N, H_out and
    /// W_out (accumulated in f64), a `[C_out]` tensor of the same dtype.
    pub fn conv2d_backward_bias(&self) -> Result<Tensor> {
        const OP: &str = "conv2d_backward_bias";
        expect_float(OP, self)?;
        expect_rank(OP, self, 4)?;
        let grad = self.contiguous()?;
        let [n, c, h, w] = [grad.dims()[0], grad.dims()[1], grad.dims()[2], grad.dims()[3]];
        let plane = h * w;
        // Empty planes sum to zero: skip the batch, which an expanded view
        // can make huge (2^40 images of nothing would never finish).
        let n = if plane == 0 { 0 } else { n };
        let result = output(self.device(), self.dtype(), &Shape::from([c]))?;
        crate::dispatch::dispatch_dtype!(self.dtype(), T => {
            let g = grad.storage().read::<T>(OP)?;
            let g = dense_elements(OP, &g, &grad)?;
            // SAFETY: each channel's element is set, reading none.
            unsafe {
                result.init_with::<T>(OP, |out| {
                    out.par_iter_mut().enumerate().for_each(|(channel, o)| {
                        let mut sum = 0.0f64;
                        for image in 0..n {
                            let start = (image * c + channel) * plane;
                            sum += g[start..start + plane].iter().map(|v| v.to_f64()).sum::<f64>();
                        }
                        *o = T::from_f64(sum);
                    });
                    Ok(())
                })
            }
        })
    }
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

/// Runs `f(image, chunk, scratch)` for every image's chunk of `out`, on
/// threads by image or one after another as `plan` says, each thread with a
/// scratch buffer of `scratch_len` elements.
///
/// The column matrix can be far larger than the input and the output (a
/// wide padding or an expanded input makes `C_in·kH·kW × H_out·W_out`
/// huge while both fit), so it is allocated fallibly: an error naming `op`
/// and the bytes, not an abort.
fn for_each_image<T: Send + Default + Clone>(
    op: &'static str,
    plan: &ConvPlan,
    out: &mut [T],
    scratch_len: usize,
    f: impl Fn(usize, &mut [T], &mut Vec<T>) -> Result<()> + Sync + Send,
) -> Result<()> {
    if plan.batch == 0 || out.is_empty() {
        return Ok(());
    }
    let per_image = out.len() / plan.batch;
    let scratch = || try_vec(scratch_len, T::default()).map_err(|e| TensorError::scratch(op, e));
    if plan.split_by_image() {
        out.par_chunks_mut(per_image).enumerate().try_for_each_init(scratch, |col, (n, chunk)| match col {
            Ok(col) => f(n, chunk, col),
            Err(e) => Err(e.clone()),
        })
    } else {
        let mut col = scratch()?;
        out.chunks_mut(per_image).enumerate().try_for_each(|(n, chunk)| f(n, chunk, &mut col))
    }
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
    // Read before the locks are taken: `to_vec` takes its own.
    let b: Option<Vec<T>> = bias.map(|b| b.to_vec::<T>()).transpose()?;
    let shape = plan.output_shape();
    let result = output(input.device(), input.dtype(), &shape)?;
    let locks = lock_storages(&[input.storage(), weight.storage()], &[]);
    let (x, w) = (locks.read::<T>(input.storage(), OP)?, locks.read::<T>(weight.storage(), OP)?);
    // SAFETY: every image's block of the output is set: by the product
    // (`beta` zero) or by the bias and then the product adding to it; the
    // groups' rows tile the block.
    unsafe {
        result.init_with::<T>(OP, |out| {
            let options = plan.options();
            let scratch = if pointwise.is_some() { 0 } else { geometry.col_len() };
            for_each_image(OP, plan, out, scratch, |n, out_n, col| {
                let beta = match &b {
                    Some(b) => {
                        for (row, &value) in out_n.chunks_exact_mut(p.max(1)).zip(b) {
                            row.fill(value);
                        }
                        T::ONE
                    }
                    None => T::ZERO,
                };
                for g in 0..plan.groups {
                    let x_off = input.layout().offset() + n * s_n + g * cig * s_c;
                    let a = MatRef::new(w, weight.layout().offset() + g * cog * w_row, [cog, k], [w_row, w_col])
                        .map_err(&err)?;
                    let c = MatMut::new(out_n, g * cog * p, [cog, p], [p, 1]).map_err(&err)?;
                    let cols = match pointwise {
                        Some(hw) => MatRef::new(x, x_off, [cig, p], [s_c, hw]).map_err(&err)?,
                        None => {
                            im2col(geometry, x, x_off, [s_c, s_h, s_w], col).map_err(&err)?;
                            MatRef::row_major(col, k, p).map_err(&err)?
                        }
                    };
                    gemm_with(&options, T::ONE, a, cols, beta, c).map_err(&err)?;
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
    let shape = plan.input_shape();
    let result = output(grad.device(), grad.dtype(), &shape)?;
    let locks = lock_storages(&[grad.storage(), weight.storage()], &[]);
    let (gy, w) = (locks.read::<T>(grad.storage(), OP)?, locks.read::<T>(weight.storage(), OP)?);
    // SAFETY: every image's block of the output is set, group by group:
    // by the product (`beta` zero) or zeroed and then summed into by `col2im`.
    unsafe {
        result.init_with::<T>(OP, |out| {
            let options = plan.options();
            let pointwise = geometry.is_pointwise();
            // Without output channels the gradient is zero and needs no
            // column buffer (which an empty grad_output's huge planes would
            // make huge).
            let scratch = if pointwise || cog == 0 { 0 } else { geometry.col_len() };
            for_each_image(OP, plan, out, scratch, |n, out_n, col| {
                if cog == 0 {
                    out_n.fill(T::ZERO);
                    return Ok(());
                }
                for g in 0..plan.groups {
                    // W_gᵀ [K, C_out/g] · dY_g [C_out/g, P]
                    let wt = MatRef::new(w, weight.layout().offset() + g * cog * w_row, [cog, k], [w_row, w_col])
                        .map_err(&err)?
                        .t();
                    let dy =
                        MatRef::new(gy, grad.layout().offset() + n * g_n + g * cog * g_row, [cog, p], [g_row, g_col])
                            .map_err(&err)?;
                    let region = &mut out_n[g * image..(g + 1) * image];
                    if pointwise {
                        let c = MatMut::row_major(region, k, h * w_in).map_err(&err)?;
                        gemm_with(&options, T::ONE, wt, dy, T::ZERO, c).map_err(&err)?;
                    } else {
                        let c = MatMut::row_major(col, k, p).map_err(&err)?;
                        gemm_with(&options, T::ONE, wt, dy, T::ZERO, c).map_err(&err)?;
                        region.fill(T::ZERO);
                        col2im(geometry, col, region).map_err(&err)?;
                    }
                }
                Ok(())
            })
        })
    }
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
    let shape = plan.weight_shape();
    let result = output(input.device(), input.dtype(), &shape)?;
    let locks = lock_storages(&[input.storage(), grad.storage()], &[]);
    let (x, gy) = (locks.read::<T>(input.storage(), OP)?, locks.read::<T>(grad.storage(), OP)?);
    // SAFETY: the output is zeroed first, then only added to.
    unsafe {
        result.init_with::<T>(OP, |out| {
            // dW_g += dY_g [C_out/g, P] · colᵀ [P, K] over the images in `images`.
            let accumulate =
                |images: std::ops::Range<usize>, dw: &mut [T], col: &mut [T], options: &GemmOptions| -> Result<()> {
                    for n in images {
                        for g in 0..plan.groups {
                            let x_off = input.layout().offset() + n * s_n + g * cig * s_c;
                            let dy = MatRef::new(
                                gy,
                                grad.layout().offset() + n * g_n + g * cog * g_row,
                                [cog, p],
                                [g_row, g_col],
                            )
                            .map_err(&err)?;
                            let cols = match pointwise {
                                Some(hw) => MatRef::new(x, x_off, [cig, p], [s_c, hw]).map_err(&err)?,
                                None => {
                                    im2col(geometry, x, x_off, [s_c, s_h, s_w], col).map_err(&err)?;
                                    MatRef::row_major(col, k, p).map_err(&err)?
                                }
                            };
                            let c = MatMut::new(dw, g * cog * k, [cog, k], [k, 1]).map_err(&err)?;
                            gemm_with(options, T::ONE, dy, cols.t(), T::ONE, c).map_err(&err)?;
                        }
                    }
                    Ok(())
                };
            out.fill(T::ZERO);
            // No images or no weights: the gradient is that zero, and needs
            // no column buffer (which an empty grad_output's huge planes
            // would make huge).
            if plan.batch == 0 || out.is_empty() {
                return Ok(());
            }
            let scratch = if pointwise.is_some() { 0 } else { geometry.col_len() };
            if plan.split_by_image() {
                // Each thread sums a share of the images into its own partial
                // gradient; the partials are added at the end.
                let threads = rayon::current_num_threads().min(plan.batch);
                let per = plan.batch.div_ceil(threads);
                let sequential = GemmOptions { parallelism: Parallelism::Sequential, ..GemmOptions::default() };
                let partials = (0..threads)
                    .into_par_iter()
                    .map(|t| {
                        let mut dw = try_vec(out.len(), T::ZERO).map_err(|e| TensorError::scratch(OP, e))?;
                        let mut col = try_vec(scratch, T::ZERO).map_err(|e| TensorError::scratch(OP, e))?;
                        accumulate(t * per..((t + 1) * per).min(plan.batch), &mut dw, &mut col, &sequential)?;
                        Ok(dw)
                    })
                    .collect::<Result<Vec<_>>>()?;
                for partial in partials {
                    for (o, v) in out.iter_mut().zip(partial) {
                        *o += v;
                    }
                }
            } else {
                let mut col = try_vec(scratch, T::ZERO).map_err(|e| TensorError::scratch(OP, e))?;
                accumulate(0..plan.batch, out, &mut col, &GemmOptions::default())?;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;

    #[test]
    fn params_builders_and_output_shape() {
        let p = Conv2dParams::new().with_stride((2, 1)).with_padding((1, 0)).with_dilation((1, 2)).with_groups(2);
        assert_eq!(p, Conv2dParams { stride: (2, 1), padding: (1, 0), dilation: (1, 2), groups: 2 });
        assert_eq!(p.output_shape(&[3, 4, 7, 9], &[6, 2, 3, 3]).unwrap().dims(), &[3, 6, 4, 5]);
        let err = p.output_shape(&[3, 4, 7, 9], &[6, 4, 3, 3]).unwrap_err().to_string();
        assert_eq!(
            err,
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
