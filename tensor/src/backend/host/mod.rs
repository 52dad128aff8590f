//! The host: the process itself and the logical host devices (`cpu:n`),
//! whose memory the process reads directly. [`HostOps`] runs the loops of
//! `brasa-kernels` on the strided drivers of `strided.rs`; [`HostRuntime`]
//! allocates from each device's caching allocator (`devices.rs`).

mod attention;
mod batch_norm;
mod concat;
pub(in crate::backend) mod conv;
mod copy;
pub(crate) mod devices;
mod elementwise;
mod index;
mod integer;
mod matmul;
mod norm;
mod optim;
pub(in crate::backend) mod pool;
mod random;
pub(in crate::backend) mod reduce;
mod runtime;
mod softmax;
mod strided;
mod update;

pub(crate) use attention::supports as supports_fused_attention;
pub(crate) use conv::dense_elements;
pub(crate) use reduce::PARALLEL_MIN_WORK;
pub(crate) use runtime::HostRuntime;

use crate::backend::{
    read_checked_indices, AdamUpdate, AttentionOperands, BatchNormBackwardElemt, CompareOp, ConvPlan, DeviceOps,
    Distribution, Indices, LayerNormBackward, MatmulOperands, PoolPlan, ReduceOp, Sequence, SgdUpdate, Update,
};
use crate::device::Device;
use crate::dispatch::dispatch_dtype;
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::shape::Shape;
use crate::storage::UninitTensor;
use crate::tensor::Tensor;
use brasa_kernels::elementwise::{BinaryOp, UnaryOp};
use brasa_kernels::index::IndexError;

/// The kernels of `brasa-kernels` on host memory.
pub(crate) struct HostOps;

impl DeviceOps for HostOps {
    fn unary(&self, name: &'static str, op: UnaryOp, x: &Tensor) -> Result<Tensor> {
        elementwise::unary_op(name, op, x)
    }

    fn binary(&self, op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        elementwise::binary_op(op, a, b)
    }

    fn compare(&self, name: &'static str, op: CompareOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        elementwise::compare_op(name, op, a, b)
    }

    fn compare_scalar(&self, name: &'static str, op: CompareOp, x: &Tensor, value: f64) -> Result<Tensor> {
        elementwise::compare_scalar_op(name, op, x, value)
    }

    fn where_cond(&self, cond: &Tensor, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        elementwise::where_op(cond, on_true, on_false)
    }

    fn cast(&self, x: &Tensor, dtype: DType) -> Result<Tensor> {
        copy::cast(x, x.device(), dtype)
    }

    fn copy_into(&self, name: &'static str, dst: &Tensor, src: &Tensor) -> Result<()> {
        copy::copy_into(name, dst, src)
    }

    fn fill(&self, name: &'static str, dst: &Tensor, value: f64) -> Result<()> {
        copy::fill(name, dst, value)
    }

    fn full(&self, name: &'static str, shape: Shape, dtype: DType, device: Device, value: f64) -> Result<Tensor> {
        let out = UninitTensor::new(shape, dtype, device)?;
        if value.to_bits() == 0 {
            // +0.0: all-zero bytes are 0, 0.0 or false in every dtype.
            return out.zeros(name);
        }
        dispatch_dtype!(dtype, T => out.fill(name, T::from_f64(value)))
    }

    fn sequence(&self, name: &'static str, out: UninitTensor, sequence: Sequence) -> Result<Tensor> {
        let (n, cols) = (out.numel(), out.dims().last().copied().unwrap_or(1));
        dispatch_dtype!(out.dtype(), T => out.init_from_fn::<T>(name, |i| T::from_f64(sequence.value(i, n, cols))))
    }

    fn reduce(&self, op: ReduceOp, name: &'static str, x: &Tensor, mask: &[bool], keepdim: bool) -> Result<Tensor> {
        reduce::reduce(op, name, x, mask, keepdim)
    }

    fn softmax(&self, name: &'static str, x: &Tensor, n: usize, inner: usize, log: bool) -> Result<Tensor> {
        softmax::softmax(name, x, n, inner, log)
    }

    fn layer_norm(
        &self,
        x: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        norm::layer_norm(x, weight, bias, eps)
    }

    fn layer_norm_backward(&self, args: LayerNormBackward<'_>, needs: [bool; 3]) -> Result<[Option<Tensor>; 3]> {
        norm::layer_norm_backward(args, needs)
    }

    fn supports_fused_attention(&self, dtype: DType, e: usize, ev: usize, dropout: bool) -> bool {
        attention::supports(dtype, e, ev, dropout)
    }

    fn attention_forward(&self, operands: &AttentionOperands<'_>) -> Result<(Tensor, Tensor)> {
        attention::forward(operands)
    }

    fn attention_backward(
        &self,
        operands: &AttentionOperands<'_>,
        out: &Tensor,
        lse: &Tensor,
        grad: &Tensor,
    ) -> Result<[Tensor; 3]> {
        attention::backward(operands, out, lse, grad)
    }

    fn batch_norm_stats(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        batch_norm::batch_norm_stats(x)
    }

    fn batch_norm_elemt(&self, x: &Tensor, mean: &Tensor, scale: &Tensor, shift: &Tensor) -> Result<Tensor> {
        batch_norm::batch_norm_elemt(x, mean, scale, shift)
    }

    fn batch_norm_backward_reduce(&self, dy: &Tensor, x: &Tensor, mean: &Tensor) -> Result<(Tensor, Tensor)> {
        batch_norm::batch_norm_backward_reduce(dy, x, mean)
    }

    fn batch_norm_backward_elemt(&self, args: BatchNormBackwardElemt<'_>) -> Result<Tensor> {
        batch_norm::batch_norm_backward_elemt(args)
    }

    fn adam_step(&self, updates: &[&AdamUpdate<'_>]) -> Result<()> {
        optim::adam_step(updates)
    }

    fn sgd_step(&self, updates: &[&SgdUpdate<'_>]) -> Result<()> {
        optim::sgd_step(updates)
    }

    fn update(&self, name: &'static str, op: Update, dst: &Tensor, operands: &[&Tensor]) -> Result<()> {
        update::update(name, op, dst, operands)
    }

    fn checked_indices(
        &self,
        _op: &'static str,
        index: &Tensor,
        size: usize,
        _keep: bool,
        error: &dyn Fn(IndexError) -> TensorError,
    ) -> Result<Vec<i64>> {
        read_checked_indices(index, size, error)
    }

    fn index_select(
        &self,
        name: &'static str,
        x: &Tensor,
        ids: Indices<'_>,
        size: usize,
        inner: usize,
        shape: &Shape,
    ) -> Result<Tensor> {
        index::index_select(name, x, ids, size, inner, shape)
    }

    fn gather(&self, name: &'static str, x: &Tensor, dim: usize, index: Indices<'_>) -> Result<Tensor> {
        index::gather(name, x, dim, index)
    }

    fn scatter_add(
        &self,
        name: &'static str,
        dst: &Tensor,
        dim: usize,
        index: Indices<'_>,
        src: &Tensor,
    ) -> Result<()> {
        index::scatter_add(name, dst, dim, index, src)
    }

    fn one_hot(&self, ids: Indices<'_>, num_classes: usize, shape: &Shape) -> Result<Tensor> {
        index::one_hot(ids, num_classes, shape)
    }

    fn conv2d(&self, input: &Tensor, weight: &Tensor, bias: Option<&Tensor>, plan: &ConvPlan) -> Result<Tensor> {
        conv::conv2d(input, weight, bias, plan)
    }

    fn conv2d_backward_input(&self, grad: &Tensor, weight: &Tensor, plan: &ConvPlan) -> Result<Tensor> {
        conv::conv2d_backward_input(grad, weight, plan)
    }

    fn conv2d_backward_weight(&self, input: &Tensor, grad: &Tensor, plan: &ConvPlan) -> Result<Tensor> {
        conv::conv2d_backward_weight(input, grad, plan)
    }

    fn conv2d_backward_bias(&self, grad: &Tensor) -> Result<Tensor> {
        conv::conv2d_backward_bias(grad)
    }

    fn max_pool2d(&self, input: &Tensor, plan: &PoolPlan) -> Result<(Tensor, Tensor)> {
        pool::max_pool2d(input, plan)
    }

    fn max_pool2d_backward(&self, grad: &Tensor, indices: &Tensor, input_shape: &Shape) -> Result<Tensor> {
        pool::max_pool2d_backward(grad, indices, input_shape)
    }

    fn avg_pool2d(&self, input: &Tensor, plan: &PoolPlan, count_include_pad: bool) -> Result<Tensor> {
        pool::avg_pool2d(input, plan, count_include_pad)
    }

    fn avg_pool2d_backward(&self, grad: &Tensor, plan: &PoolPlan, count_include_pad: bool) -> Result<Tensor> {
        pool::avg_pool2d_backward(grad, plan, count_include_pad)
    }

    fn concat(&self, tensors: &[&Tensor], d: usize, shape: &Shape) -> Result<Tensor> {
        concat::concat(tensors, d, shape)
    }

    fn random(
        &self,
        op: &'static str,
        dist: Distribution,
        shape: &Shape,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        random::random(op, dist, shape, dtype, device)
    }

    fn matmul(&self, operands: MatmulOperands<'_>) -> Result<Tensor> {
        matmul::matmul(operands)
    }

    fn matmul_into_f32(&self, operands: MatmulOperands<'_>) -> Result<Tensor> {
        matmul::matmul_into_f32(operands)
    }

    fn multiplies_half_into_f32(&self) -> bool {
        true
    }
}
