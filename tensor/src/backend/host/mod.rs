//! The host backend: the host itself and the logical host devices
//! (`Device::Cpu(n)`), whose memory the process can read directly.

mod copy;
mod elementwise;
mod index;
mod matmul;
mod reduce;
mod softmax;
mod update;

pub(crate) use reduce::PARALLEL_MIN_WORK;

use crate::backend::{Backend, CompareOp, Indices, MatmulOperands, ReduceOp, Update};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::shape::Shape;
use crate::tensor::Tensor;
use brasa_kernels::elementwise::{BinaryOp, UnaryOp};

/// A contiguous copy of host tensor `x` on host device `device`, converted
/// to `dtype`.
pub(crate) fn convert_into_device(x: &Tensor, device: Device, dtype: DType) -> Result<Tensor> {
    copy::cast(x, device, dtype)
}

/// The kernels of `brasa-kernels` on host memory.
pub(crate) struct HostBackend;

impl Backend for HostBackend {
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

    fn reduce(&self, op: ReduceOp, name: &'static str, x: &Tensor, mask: &[bool], keepdim: bool) -> Result<Tensor> {
        reduce::reduce(op, name, x, mask, keepdim)
    }

    fn softmax(&self, name: &'static str, x: &Tensor, n: usize, inner: usize, log: bool) -> Result<Tensor> {
        softmax::softmax(name, x, n, inner, log)
    }

    fn update(&self, name: &'static str, op: Update, dst: &Tensor, operands: &[&Tensor]) -> Result<()> {
        update::update(name, op, dst, operands)
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

    fn matmul(&self, operands: MatmulOperands<'_>) -> Result<Tensor> {
        matmul::matmul(operands)
    }
}
