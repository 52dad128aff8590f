//! The meta device: every op allocates what the imitated device's ops
//! would allocate, in the same order and for as long, and computes nothing
//! ([`MetaOps`]); memory comes from a real caching allocator over a virtual
//! backend and holds no values ([`MetaRuntime`]).
//!
//! A meta device ([`MetaDevice`]) imitates a [`crate::MemoryTarget`]: its storages
//! come from a real caching allocator over a virtual backend (addresses, no
//! memory), so a training step run on it reaches the target's peak
//! allocated and peak reserved bytes without touching any memory. That is
//! what [`crate::memory::plan`] runs.
//!
//! For a host target the allocations follow the host backend
//! (`backend/host/`) op by op: outputs, and the temporaries it makes through
//! the allocator (contiguous copies of operands a kernel cannot walk, the
//! reduced copy of a permuted reduction, f32 staging of half-precision
//! pooling and random draws), and its fused attention (f32 and f64 without
//! dropout: the output and the log-sum-exp in the operands' dtype, then
//! the three gradients). Kernel scratch the host keeps on the heap (GEMM
//! packing, im2col panels, attention's blocks of scores) is not device
//! memory and is not counted, on the meta device as on the host. The tests in
//! `tests/meta_device.rs` check, op by op, that the allocator's statistics on
//! a meta device equal the host's.
//!
//! For a CUDA target the same sequences are used except where the CUDA
//! backend differs; those ops follow `backend/cuda/` instead (`cuda.rs`
//! here), with the sizing rules shared through `backend/args` where the
//! CUDA backend decides from shapes:
//!
//! - reductions: the output of the result's shape first, a contiguous copy
//!   of the source when its reduced dims cannot be walked in place
//!   ([`crate::backend::args::reduce_layout`]), and the partial sums of a
//!   split reduction over few long columns
//!   ([`crate::backend::args::column_chunks`]), freed in the CUDA order;
//! - convolutions: the im2col path, per group the column matrix `[N, K, P]`
//!   (or `col2im`'s image), the cuBLAS products and the batch sum, the
//!   groups joined, the bias added in place;
//! - pooling without f32 staging of half precision, the max-pool gradient
//!   as zeros and a `scatter_add_`, random draws straight into their dtype;
//! - the 0-d `i64` bad-index flag of gathers, scatters, `index_select` and
//!   `one_hot`, and the device bounds reduction that checks indices;
//! - the 0-d value a fill of a strided view copies from;
//! - matrix products copy each operand whose matrices have neither
//!   contiguous rows nor contiguous columns, or whose batch does not step
//!   evenly, after the output (cuBLAS reads the others as they lie), and
//!   free the copies after the product;
//! - matrix products of half operands into f32 widen both operands first;
//!   fused attention (f16/bf16, head widths up to 128) allocates its
//!   output, log-sum-exp, f32 query gradient and row deltas.
//!
//! Layer norm (outputs, statistics, and the zeroed `[width]` parameter
//! gradients the CUDA kernel adds into), batch norm, softmax and the
//! optimizers' fused steps allocate the same on both backends.
//!
//! **cuDNN is not modelled.** The CUDA backend runs convolutions on cuDNN
//! when the library is loaded and enabled; cuDNN's workspace comes from the
//! caching allocator with a size that depends on the algorithm the library
//! picks on the GPU at run time, and operands whose memory format differs
//! are copied dense. None of that can be known without the library and a
//! GPU, so a plan for a CUDA target models the im2col path's buffers (what
//! a GPU run allocates with `crate::cudnn::set_enabled(false)` or without
//! cuDNN), not cuDNN's workspaces, and while cuDNN is switched on it counts
//! each convolution call so planned in the plan's assumptions
//! ([`PlanAssumption`]).
//!
//! Data-dependent behaviour is explicit: reading values (`to_vec`, `item`,
//! host bytes) is an error naming the op; index bounds are assumed valid
//! (they cannot be checked without values).

mod cuda;
mod device;
mod runtime;

pub(crate) use device::{meta_state, MetaState};
pub use device::{FailedAllocation, LiveTensor, MetaDevice, PlanAssumption};
pub(crate) use runtime::MetaRuntime;

use crate::backend::args::{channels_last_dims, channels_last_operands};
use crate::backend::host::{conv as host_conv, pool as host_pool, reduce as host_reduce};
use crate::backend::im2col;
use crate::backend::target::TargetKind;
use crate::backend::{
    AdamUpdate, AttentionOperands, BatchNormBackwardElemt, CompareOp, ConvPlan, DeviceOps, Distribution, Indices,
    LayerNormBackward, MatmulOperands, PoolPlan, ReduceOp, Sequence, SgdUpdate, Update,
};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::shape::Shape;
use crate::storage::UninitTensor;
use crate::tensor::Tensor;
use brasa_alloc::{Allocation, MemoryCategory, StreamId, VirtualBackend};
use brasa_kernels::elementwise::{BinaryOp, UnaryOp};
use brasa_kernels::index::IndexError;
use std::cell::Cell;
use std::sync::Arc;

/// The head widths CUDA's fused attention kernels are compiled for.
const CUDA_ATTENTION_HEAD_DIMS: [usize; 2] = [64, 128];

thread_local! {
    /// The op whose allocations the ledger is recording on this thread.
    static CURRENT_OP: Cell<&'static str> = const { Cell::new("") };
}

/// Names the op that allocates on this thread until the guard drops
/// (nested scopes restore the outer name).
pub(crate) struct OpScope {
    outer: &'static str,
}

pub(crate) fn op_scope(name: &'static str) -> OpScope {
    OpScope { outer: CURRENT_OP.with(|op| op.replace(name)) }
}

impl Drop for OpScope {
    fn drop(&mut self) {
        CURRENT_OP.with(|op| op.set(self.outer));
    }
}

fn current_op() -> &'static str {
    let op = CURRENT_OP.with(Cell::get);
    if op.is_empty() {
        "(constructor)"
    } else {
        op
    }
}

/// A meta storage's memory: an accounted block of the meta device's
/// allocator and its entry in the device's ledger.
pub(crate) struct MetaBuffer {
    // Declared first so it drops first: the ledger forgets the tensor as
    // the block goes back to the cache.
    entry: LedgerEntry,
    block: Allocation<VirtualBackend>,
}

struct LedgerEntry {
    state: Arc<MetaState>,
    id: u64,
    block_bytes: usize,
}

impl Drop for LedgerEntry {
    fn drop(&mut self) {
        self.state.forget(self.id, self.block_bytes);
    }
}

impl MetaBuffer {
    /// `bytes` for `dtype` elements on meta device `device`, counted under `category`.
    pub(crate) fn allocate(device: Device, dtype: DType, bytes: usize, category: MemoryCategory) -> Result<MetaBuffer> {
        let state = meta_state(device)?;
        let block = match state.allocator.allocate_as(bytes, StreamId::DEFAULT, category) {
            Ok(block) => block,
            Err(error) => {
                state.note_failure(FailedAllocation {
                    op: current_op().to_string(),
                    requested: bytes,
                    category,
                    allocated: state.allocator.allocated_bytes(),
                    reserved: state.allocator.reserved_bytes(),
                    message: error.to_string(),
                });
                return Err(error.into());
            }
        };
        let block_bytes = if bytes == 0 { 0 } else { block.block_size() };
        let tensor =
            LiveTensor { bytes, block_bytes, dtype: dtype.to_string(), op: current_op().to_string(), category };
        let id = state.record(tensor, block_bytes);
        Ok(MetaBuffer { entry: LedgerEntry { state, id, block_bytes }, block })
    }

    pub(crate) fn record_stream(&self, stream: StreamId) {
        self.block.record_stream(stream);
    }

    pub(crate) fn category(&self) -> MemoryCategory {
        self.block.category()
    }

    pub(crate) fn set_category(&self, category: MemoryCategory) {
        self.block.set_category(category);
        self.entry.state.recategorize(self.entry.id, category);
    }
}

/// The error for reading the values of a tensor on a meta device.
pub(crate) fn no_values(op: &'static str, device: Device) -> TensorError {
    TensorError::invalid(
        op,
        format!(
            "the tensor is on {device}, a meta device: it has a shape, a dtype and accounted memory but no values \
             (plans run the step without data; anything that reads values, such as item() or to_vec(), \
             cannot run there)"
        ),
    )
}

/// The ops of meta devices imitating `kind`.
pub(crate) struct MetaOps {
    kind: TargetKind,
}

static HOST_IMITATION: MetaOps = MetaOps { kind: TargetKind::Host };
static CUDA_IMITATION: MetaOps = MetaOps { kind: TargetKind::Cuda };

/// The ops of meta device `device`.
pub(crate) fn ops_for(device: Device) -> Result<&'static MetaOps> {
    Ok(match meta_state(device)?.target.kind() {
        TargetKind::Host => &HOST_IMITATION,
        TargetKind::Cuda => &CUDA_IMITATION,
    })
}

/// A planned channels-last result of `[N, C, H, W]` `shape`, in `like`'s
/// device and dtype, laid out as the host's channels-last convolutions
/// return theirs ([`host_conv::as_nchw`]).
fn planned_channels_last(op: &'static str, like: &Tensor, shape: &Shape) -> Result<Tensor> {
    host_conv::as_nchw(planned(op, like.device(), like.dtype(), channels_last_dims(shape))?)
}

/// A new tensor of `shape` and `dtype` on `device`, accounted, never written.
fn planned(op: &'static str, device: Device, dtype: DType, shape: impl Into<Shape>) -> Result<Tensor> {
    UninitTensor::new(shape, dtype, device)?.planned(op)
}

/// A new tensor shaped like `like`.
fn planned_like(op: &'static str, like: &Tensor, dtype: DType) -> Result<Tensor> {
    UninitTensor::like(like, dtype, like.device())?.planned(op)
}

/// The dtype a reduction's result has (see [`DeviceOps::reduce`]).
fn reduced_dtype(op: ReduceOp, dtype: DType) -> DType {
    match op {
        ReduceOp::Max | ReduceOp::Min => dtype,
        ReduceOp::ArgMax | ReduceOp::ArgMin => DType::I64,
        ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Var { .. } => match dtype {
            DType::F64 => DType::F64,
            DType::F32 | DType::F16 | DType::BF16 => DType::F32,
            _ => DType::I64,
        },
    }
}

/// Batch normalisation's per-channel compute dtype.
fn channel_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

impl MetaOps {
    /// A batch-norm reduction's two `[C]` results; for a CUDA target then
    /// the temporary of partial results the CUDA backend folds a
    /// `[rows, C, 1]` input through, freed at once (`cuda.rs`).
    fn batch_norm_reduction(&self, op: &'static str, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let (c, dtype) = (x.dims()[1], channel_dtype(x.dtype()));
        let outputs = (planned(op, x.device(), dtype, [c])?, planned(op, x.device(), dtype, [c])?);
        if self.kind == TargetKind::Cuda {
            cuda::batch_norm_partials(op, x, dtype)?;
        }
        Ok(outputs)
    }
}

impl DeviceOps for MetaOps {
    fn unary(&self, name: &'static str, _op: UnaryOp, x: &Tensor) -> Result<Tensor> {
        let _op = op_scope(name);
        planned_like(name, x, x.dtype())
    }

    fn binary(&self, op: BinaryOp, a: &Tensor, _b: &Tensor) -> Result<Tensor> {
        let name = op.name();
        let _op = op_scope(name);
        planned_like(name, a, a.dtype())
    }

    fn compare(&self, name: &'static str, _op: CompareOp, a: &Tensor, _b: &Tensor) -> Result<Tensor> {
        let _op = op_scope(name);
        planned_like(name, a, DType::Bool)
    }

    fn compare_scalar(&self, name: &'static str, _op: CompareOp, x: &Tensor, _value: f64) -> Result<Tensor> {
        let _op = op_scope(name);
        planned_like(name, x, DType::Bool)
    }

    fn where_cond(&self, cond: &Tensor, on_true: &Tensor, _on_false: &Tensor) -> Result<Tensor> {
        let _op = op_scope("where");
        planned_like("where", cond, on_true.dtype())
    }

    fn cast(&self, x: &Tensor, dtype: DType) -> Result<Tensor> {
        let _op = op_scope("copy");
        planned_like("copy", x, dtype)
    }

    fn copy_into(&self, _name: &'static str, _dst: &Tensor, _src: &Tensor) -> Result<()> {
        Ok(())
    }

    fn fill(&self, name: &'static str, dst: &Tensor, _value: f64) -> Result<()> {
        if self.kind == TargetKind::Cuda {
            let _op = op_scope(name);
            return cuda::fill(name, dst);
        }
        Ok(())
    }

    fn full(&self, name: &'static str, shape: Shape, dtype: DType, device: Device, _value: f64) -> Result<Tensor> {
        let _op = op_scope(name);
        planned(name, device, dtype, shape)
    }

    fn sequence(&self, name: &'static str, out: UninitTensor, _sequence: Sequence) -> Result<Tensor> {
        out.planned(name)
    }

    fn reduce(&self, op: ReduceOp, name: &'static str, x: &Tensor, mask: &[bool], keepdim: bool) -> Result<Tensor> {
        let _op = op_scope(name);
        if self.kind == TargetKind::Cuda {
            return cuda::reduce(op, name, x, mask, keepdim);
        }
        // The host's walk: maybe a copy with the reduced dims last, the
        // result of the computed shape, maybe expanded into a copy.
        let (source, computed_shape, out_shape) = host_reduce::allocations(name, x, mask, keepdim)?;
        let computed = planned(name, x.device(), reduced_dtype(op, x.dtype()), computed_shape.clone())?;
        drop(source);
        if computed_shape == out_shape {
            return Ok(computed);
        }
        computed.expand(out_shape)?.contiguous()
    }

    fn softmax(&self, name: &'static str, x: &Tensor, _n: usize, _inner: usize, _log: bool) -> Result<Tensor> {
        let _op = op_scope(name);
        planned_like(name, x, x.dtype())
    }

    fn layer_norm(
        &self,
        x: &Tensor,
        _weight: Option<&Tensor>,
        _bias: Option<&Tensor>,
        _eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        const OP: &str = "layer_norm";
        let _op = op_scope(OP);
        let rows = x.dims()[0];
        let out = planned_like(OP, x, x.dtype())?;
        let mean = planned(OP, x.device(), x.dtype(), [rows])?;
        let rstd = planned(OP, x.device(), x.dtype(), [rows])?;
        Ok((out, mean, rstd))
    }

    fn layer_norm_backward(&self, args: LayerNormBackward<'_>, needs: [bool; 3]) -> Result<[Option<Tensor>; 3]> {
        const OP: &str = "layer_norm_backward";
        let _op = op_scope(OP);
        let x = args.x;
        let width = x.dims()[1];
        let dx = if needs[0] { Some(planned_like(OP, x, x.dtype())?) } else { None };
        let dw =
            if needs[1] && args.weight.is_some() { Some(planned(OP, x.device(), x.dtype(), [width])?) } else { None };
        let db = if needs[2] { Some(planned(OP, x.device(), x.dtype(), [width])?) } else { None };
        Ok([dx, dw, db])
    }

    fn batch_norm_stats(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        const OP: &str = "batch_norm_stats";
        let _op = op_scope(OP);
        self.batch_norm_reduction(OP, x)
    }

    fn batch_norm_elemt(&self, x: &Tensor, _mean: &Tensor, _scale: &Tensor, _shift: &Tensor) -> Result<Tensor> {
        let _op = op_scope("batch_norm_elemt");
        planned_like("batch_norm_elemt", x, x.dtype())
    }

    fn batch_norm_backward_reduce(&self, _dy: &Tensor, x: &Tensor, _mean: &Tensor) -> Result<(Tensor, Tensor)> {
        const OP: &str = "batch_norm_backward_reduce";
        let _op = op_scope(OP);
        self.batch_norm_reduction(OP, x)
    }

    fn batch_norm_backward_elemt(&self, args: BatchNormBackwardElemt<'_>) -> Result<Tensor> {
        let _op = op_scope("batch_norm_backward_elemt");
        planned_like("batch_norm_backward_elemt", args.dy, args.dy.dtype())
    }

    fn adam_step(&self, _updates: &[&AdamUpdate<'_>]) -> Result<()> {
        Ok(())
    }

    fn sgd_step(&self, _updates: &[&SgdUpdate<'_>]) -> Result<()> {
        Ok(())
    }

    fn update(&self, _name: &'static str, _op: Update, _dst: &Tensor, _operands: &[&Tensor]) -> Result<()> {
        Ok(())
    }

    /// No values to check (a plan assumes the indices are in range); what
    /// the imitated device allocates to check them (a CUDA device's bounds
    /// reduction) is allocated.
    fn checked_indices(
        &self,
        _op: &'static str,
        index: &Tensor,
        _size: usize,
        keep: bool,
        _error: &dyn Fn(IndexError) -> TensorError,
    ) -> Result<Vec<i64>> {
        if self.kind == TargetKind::Cuda && !keep && index.numel() > 0 {
            let flat = index.reshape(&[-1])?;
            let (low, high) = (flat.min(&[0], false)?, flat.max(&[0], false)?);
            drop(Tensor::stack(&[&low, &high], 0)?);
        }
        Ok(Vec::new())
    }

    fn index_select(
        &self,
        name: &'static str,
        x: &Tensor,
        _ids: Indices<'_>,
        _size: usize,
        _inner: usize,
        shape: &Shape,
    ) -> Result<Tensor> {
        let _op = op_scope(name);
        let out = planned(name, x.device(), x.dtype(), shape.clone())?;
        if self.kind == TargetKind::Cuda && shape.numel() > 0 {
            cuda::bad_index_flag(name, x.device())?;
        }
        Ok(out)
    }

    fn gather(&self, name: &'static str, x: &Tensor, _dim: usize, index: Indices<'_>) -> Result<Tensor> {
        let _op = op_scope(name);
        let out = planned(name, x.device(), x.dtype(), index.tensor.shape().clone())?;
        if self.kind == TargetKind::Cuda && index.tensor.numel() > 0 {
            cuda::bad_index_flag(name, x.device())?;
        }
        Ok(out)
    }

    fn scatter_add(
        &self,
        name: &'static str,
        dst: &Tensor,
        _dim: usize,
        index: Indices<'_>,
        _src: &Tensor,
    ) -> Result<()> {
        if self.kind == TargetKind::Cuda && index.tensor.numel() > 0 {
            let _op = op_scope(name);
            cuda::bad_index_flag(name, dst.device())?;
        }
        Ok(())
    }

    fn one_hot(&self, ids: Indices<'_>, _num_classes: usize, shape: &Shape) -> Result<Tensor> {
        let _op = op_scope("one_hot");
        let out = planned("one_hot", ids.tensor.device(), DType::I64, shape.clone())?;
        if self.kind == TargetKind::Cuda && shape.numel() > 0 {
            cuda::bad_index_flag("one_hot", ids.tensor.device())?;
        }
        Ok(out)
    }

    fn conv2d(&self, input: &Tensor, weight: &Tensor, bias: Option<&Tensor>, plan: &ConvPlan) -> Result<Tensor> {
        const OP: &str = "conv2d";
        let _op = op_scope(OP);
        if self.kind == TargetKind::Cuda {
            cuda::assume_im2col(OP, input.device())?;
            return im2col::conv2d(&cuda::PlannedColumns, input, weight, bias, plan);
        }
        if channels_last_operands(input, weight) {
            let input = host_conv::dense_channels_last(input)?;
            let weight = host_conv::non_negative(weight)?;
            let out = planned_channels_last(OP, &input, &plan.output_shape());
            drop((input, weight));
            return out;
        }
        let input = host_conv::non_negative(input)?;
        let (weight, _, _) = host_conv::matrix_view(weight, 0)?;
        let out = planned(OP, input.device(), input.dtype(), plan.output_shape())?;
        drop((input, weight));
        Ok(out)
    }

    fn conv2d_backward_input(&self, grad: &Tensor, weight: &Tensor, plan: &ConvPlan) -> Result<Tensor> {
        const OP: &str = "conv2d_backward_input";
        let _op = op_scope(OP);
        if self.kind == TargetKind::Cuda {
            cuda::assume_im2col(OP, grad.device())?;
            return im2col::conv2d_backward_input(&cuda::PlannedColumns, grad, weight, plan);
        }
        if channels_last_operands(grad, weight) {
            let grad = host_conv::dense_channels_last(grad)?;
            let weight = host_conv::non_negative(weight)?;
            let out = planned_channels_last(OP, &grad, &plan.input_shape());
            drop((grad, weight));
            return out;
        }
        let (grad, _, _) = host_conv::matrix_view(grad, 1)?;
        let (weight, _, _) = host_conv::matrix_view(weight, 0)?;
        let out = planned(OP, grad.device(), grad.dtype(), plan.input_shape())?;
        drop((grad, weight));
        Ok(out)
    }

    fn conv2d_backward_weight(&self, input: &Tensor, grad: &Tensor, plan: &ConvPlan) -> Result<Tensor> {
        const OP: &str = "conv2d_backward_weight";
        let _op = op_scope(OP);
        if self.kind == TargetKind::Cuda {
            cuda::assume_im2col(OP, input.device())?;
            return im2col::conv2d_backward_weight(&cuda::PlannedColumns, input, grad, plan);
        }
        if channels_last_operands(input, grad) {
            let input = host_conv::dense_channels_last(input)?;
            let grad = host_conv::dense_channels_last(grad)?;
            let out = planned_channels_last(OP, &input, &plan.weight_shape());
            drop((input, grad));
            return out;
        }
        let input = host_conv::non_negative(input)?;
        let (grad, _, _) = host_conv::matrix_view(grad, 1)?;
        let out = planned(OP, input.device(), input.dtype(), plan.weight_shape())?;
        drop((input, grad));
        Ok(out)
    }

    fn conv2d_backward_bias(&self, grad: &Tensor) -> Result<Tensor> {
        const OP: &str = "conv2d_backward_bias";
        let _op = op_scope(OP);
        if self.kind == TargetKind::Cuda {
            return im2col::conv2d_backward_bias(grad);
        }
        if grad.is_strictly_channels_last() {
            // The host reads a channels-last gradient in place.
            return planned(OP, grad.device(), grad.dtype(), [grad.dims()[1]]);
        }
        let dense = grad.contiguous()?;
        let out = planned(OP, grad.device(), grad.dtype(), [grad.dims()[1]])?;
        drop(dense);
        Ok(out)
    }

    fn max_pool2d(&self, input: &Tensor, plan: &PoolPlan) -> Result<(Tensor, Tensor)> {
        const OP: &str = "max_pool2d";
        let _op = op_scope(OP);
        if self.kind == TargetKind::Cuda {
            return cuda::max_pool2d(input, plan);
        }
        let input = host_pool::non_negative(input)?;
        let shape = plan.output_shape();
        let values = planned(OP, input.device(), input.dtype(), shape.clone())?;
        let indices = planned(OP, input.device(), DType::I64, shape)?;
        Ok((values, indices))
    }

    fn max_pool2d_backward(&self, grad: &Tensor, indices: &Tensor, input_shape: &Shape) -> Result<Tensor> {
        let _op = op_scope("max_pool2d_backward");
        if self.kind == TargetKind::Cuda {
            return cuda::max_pool2d_backward(grad, indices, input_shape);
        }
        planned("max_pool2d_backward", grad.device(), grad.dtype(), input_shape.clone())
    }

    fn avg_pool2d(&self, input: &Tensor, plan: &PoolPlan, _count_include_pad: bool) -> Result<Tensor> {
        const OP: &str = "avg_pool2d";
        let _op = op_scope(OP);
        if self.kind == TargetKind::Cuda {
            return cuda::avg_pool2d(input, plan);
        }
        let forward = |input: &Tensor| -> Result<Tensor> {
            let input = host_pool::non_negative(input)?;
            planned(OP, input.device(), input.dtype(), plan.output_shape())
        };
        match input.dtype() {
            DType::F64 | DType::F32 => forward(input),
            other => forward(&input.to_dtype(DType::F32)?)?.to_dtype(other),
        }
    }

    fn avg_pool2d_backward(&self, grad: &Tensor, plan: &PoolPlan, _count_include_pad: bool) -> Result<Tensor> {
        const OP: &str = "avg_pool2d_backward";
        let _op = op_scope(OP);
        if self.kind == TargetKind::Cuda {
            return cuda::avg_pool2d_backward(grad, plan);
        }
        let backward = |grad: &Tensor| -> Result<Tensor> {
            let grad = grad.contiguous()?;
            planned(OP, grad.device(), grad.dtype(), plan.input_shape())
        };
        match grad.dtype() {
            DType::F64 | DType::F32 => backward(grad),
            other => backward(&grad.to_dtype(DType::F32)?)?.to_dtype(other),
        }
    }

    fn concat(&self, tensors: &[&Tensor], _d: usize, shape: &Shape) -> Result<Tensor> {
        let _op = op_scope("cat");
        planned("cat", tensors[0].device(), tensors[0].dtype(), shape.clone())
    }

    fn random(
        &self,
        op: &'static str,
        dist: Distribution,
        shape: &Shape,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        let _op = op_scope(op);
        if self.kind == TargetKind::Cuda {
            return cuda::random(op, shape, dtype, device);
        }
        if let Distribution::Bernoulli { .. } = dist {
            return planned(op, device, dtype, shape.clone());
        }
        // Drawn in f32 (f64 for f64), then converted, as the host does.
        let draw_dtype = if dtype == DType::F64 { DType::F64 } else { DType::F32 };
        planned(op, device, draw_dtype, shape.clone())?.to_dtype(dtype)
    }

    fn matmul(&self, operands: MatmulOperands<'_>) -> Result<Tensor> {
        let _op = op_scope("matmul");
        if self.kind == TargetKind::Cuda {
            return cuda::matmul(operands);
        }
        let mut dims = operands.batch.to_vec();
        dims.extend([operands.m, operands.n]);
        planned("matmul", operands.a.device(), operands.a.dtype(), dims)
    }

    fn matmul_into_f32(&self, operands: MatmulOperands<'_>) -> Result<Tensor> {
        match self.kind {
            TargetKind::Host => {
                let _op = op_scope("matmul");
                let mut dims = operands.batch.to_vec();
                dims.extend([operands.m, operands.n]);
                planned("matmul", operands.a.device(), DType::F32, dims)
            }
            // The trait's default: both operands widened first.
            TargetKind::Cuda => {
                let (a, b) = (operands.a.to_dtype(DType::F32)?, operands.b.to_dtype(DType::F32)?);
                self.matmul(MatmulOperands { a: &a, b: &b, ..operands })
            }
        }
    }

    fn supports_fused_attention(&self, dtype: DType, e: usize, ev: usize, dropout: bool) -> bool {
        match self.kind {
            TargetKind::Cuda => {
                matches!(dtype, DType::F16 | DType::BF16)
                    && e > 0
                    && ev > 0
                    && CUDA_ATTENTION_HEAD_DIMS.iter().any(|&d| e.max(ev) <= d)
            }
            TargetKind::Host => crate::backend::host::supports_fused_attention(dtype, e, ev, dropout),
        }
    }

    fn attention_forward(&self, a: &AttentionOperands<'_>) -> Result<(Tensor, Tensor)> {
        const OP: &str = "fused_attention";
        let _op = op_scope(OP);
        let (qd, vd) = (a.q.dims(), a.v.dims());
        let (n, h, l, ev) = (qd[0], qd[1], qd[2], vd[3]);
        let out = planned(OP, a.q.device(), a.q.dtype(), [n, h, l, ev])?;
        // The host keeps the log-sum-exp in the operands' dtype (f32 or f64).
        let lse_dtype = if self.kind == TargetKind::Host { a.q.dtype() } else { DType::F32 };
        let lse = planned(OP, a.q.device(), lse_dtype, [n, h, l])?;
        Ok((out, lse))
    }

    fn attention_backward(
        &self,
        a: &AttentionOperands<'_>,
        _out: &Tensor,
        _lse: &Tensor,
        _grad: &Tensor,
    ) -> Result<[Tensor; 3]> {
        const OP: &str = "fused_attention_backward";
        let _op = op_scope(OP);
        let (qd, kd, vd) = (a.q.dims(), a.k.dims(), a.v.dims());
        let (n, h, l, s, e, ev) = (qd[0], qd[1], qd[2], kd[2], qd[3], vd[3]);
        let (device, dtype) = (a.q.device(), a.q.dtype());
        if self.kind == TargetKind::Host {
            // The three gradients, nothing else (`host/attention.rs`).
            let dq = planned(OP, device, dtype, [n, h, l, e])?;
            let dk = planned(OP, device, dtype, [n, h, s, e])?;
            let dv = planned(OP, device, dtype, [n, h, s, ev])?;
            return Ok([dq, dk, dv]);
        }
        let dq = Tensor::zeros_on([n, h, l, e], DType::F32, device)?;
        let dk = planned(OP, device, dtype, [n, h, s, e])?;
        let dv = planned(OP, device, dtype, [n, h, s, ev])?;
        if n * h == 0 || s == 0 {
            return Ok([dq.to_dtype(dtype)?, dk, dv]);
        }
        let delta = planned(OP, device, DType::F32, [n * h * l])?;
        let dq = dq.to_dtype(dtype)?;
        drop(delta);
        Ok([dq, dk, dv])
    }

    fn multiplies_half_into_f32(&self) -> bool {
        self.kind == TargetKind::Host
    }
}
