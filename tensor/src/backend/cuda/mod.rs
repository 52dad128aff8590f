//! CUDA devices (feature `cuda`). [`CudaOps`]: brasa's kernels, compiled to
//! PTX by `cargo xtask kernels` and committed in `brasa-kernels` (so building
//! brasa never needs a CUDA compiler), loaded into each device's context
//! once, at its first use, and launched on the device's stream; matrix
//! products on cuBLAS. [`CudaRuntime`]: each device's caching allocator and
//! streams (`device.rs`), copies through the host (`copy.rs`), pinned host
//! memory and the asynchronous copy from it (`pinned.rs`), driver events.
//!
//! Work is queued, not waited for: an op launches its kernel on the thread's
//! current stream of the device ([`crate::Stream::current`]) and returns; the
//! allocator hands a freed block to the next op of the same stream, which
//! runs after the earlier work (PyTorch's stream-ordered caching). Only
//! copies to the host (`to_vec`, `item`, `to(cpu)`) and explicit
//! synchronization wait.
//!
//! While a profiler records, every kernel launch (and cuBLAS call) is timed
//! with a pair of CUDA events on its stream and attributed to the op that
//! launched it (`timing`), resolved only when the profile stops.
//!
//! Kernel names follow the PTX ABI of `brasa-kernels/cuda/ABI.md`:
//! `<family>_<op>_<dtype>` (`unary_exp_f32`, `cast_f32_bf16`).

mod attention;
mod batch_norm;
mod conv;
mod copy;
mod cudnn;
pub(crate) mod device;
mod elementwise;
mod index;
mod matmul;
mod norm;
mod optim;
pub(crate) mod pinned;
mod pool;
mod random;
mod reduce;
mod runtime;
mod strided;
mod timing;
mod update;

pub(crate) use cudnn::{
    cached_algorithm_count as cudnn_cached_algorithm_count, cached_graph_plan_count as cudnn_cached_graph_plan_count,
    load_error as cudnn_load_error, version as cudnn_version,
};
pub(crate) use device::unsupported;
pub(crate) use runtime::CudaRuntime;

use crate::backend::current_stream::current_stream_id;
use crate::backend::{
    read_checked_indices, AdamUpdate, AttentionOperands, BatchNormBackwardElemt, Buffer, CompareOp, ConvPlan,
    DeviceOps, Distribution, Indices, LayerNormBackward, MatmulOperands, PoolPlan, ReduceOp, Sequence, SgdUpdate,
    Update,
};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Result, SharedError, TensorError};
use crate::shape::Shape;
use crate::storage::{Storage, UninitTensor};
use crate::tensor::Tensor;
use brasa_kernels::cuda_ptx::{BLOCK, MODULES};
use brasa_kernels::elementwise::{BinaryOp, UnaryOp};
use brasa_kernels::index::IndexError;
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig};
use cudarc::nvrtc::Ptx;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

static BACKENDS: Mutex<BTreeMap<usize, &'static CudaOps>> = Mutex::new(BTreeMap::new());

/// One CUDA device: its context, the kernels loaded so far, and a cuBLAS
/// handle.
pub(crate) struct CudaOps {
    device: Device,
    context: Arc<CudaContext>,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    functions: Mutex<HashMap<String, CudaFunction>>,
    blas: OnceLock<std::result::Result<Mutex<CudaBlas>, SharedError>>,
    /// CUDA events as the profiler's device markers (see `timing`).
    timer: Arc<dyn brasa_profile::DeviceTimer>,
}

impl CudaOps {
    /// The backend of CUDA device `index`, created at first use (with the
    /// device's caching allocator, which owns the context).
    pub(crate) fn get(index: usize) -> Result<&'static CudaOps> {
        let mut backends = BACKENDS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(backend) = backends.get(&index) {
            return Ok(backend);
        }
        let context = device::allocator(index)?.backend().context().clone();
        let backend = CudaOps {
            device: Device::Cuda(index),
            timer: Arc::new(timing::CudaTimer::new(index, Arc::clone(&context))),
            context,
            modules: Mutex::default(),
            functions: Mutex::default(),
            blas: OnceLock::new(),
        };
        // Backends live as long as the process, as CUDA contexts do.
        let backend: &'static CudaOps = Box::leak(Box::new(backend));
        backends.insert(index, backend);
        Ok(backend)
    }

    /// A failed runtime call of `op`, keeping the runtime's error.
    fn call_error(
        &self,
        op: &'static str,
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> TensorError {
        TensorError::DeviceCall { op, device: self.device, what: what.into(), source: SharedError::new(source) }
    }

    /// The kernel `name` of PTX module `module`, loading the module into this
    /// device's context the first time one of its kernels is asked for.
    fn function(&self, op: &'static str, module: &'static str, name: &str) -> Result<CudaFunction> {
        if let Some(f) = self.functions.lock().unwrap_or_else(|e| e.into_inner()).get(name) {
            return Ok(f.clone());
        }
        let loaded = {
            let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
            match modules.get(module) {
                Some(m) => m.clone(),
                None => {
                    let ptx = MODULES.iter().find(|m| m.name == module).ok_or_else(|| {
                        TensorError::internal(op, format!("no PTX module `{module}` in brasa-kernels"))
                    })?;
                    let loaded = self
                        .context
                        .load_module(Ptx::from_src(ptx.ptx))
                        .map_err(|e| self.call_error(op, format!("loading the PTX module `{module}`"), e))?;
                    modules.insert(module, loaded.clone());
                    loaded
                }
            }
        };
        let function = loaded.load_function(name).map_err(|e| {
            self.call_error(op, format!("finding kernel `{name}` in module `{module}` (no kernel for this dtype?)"), e)
        })?;
        self.functions.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_string(), function.clone());
        Ok(function)
    }

    /// This thread's current stream on this device ([`crate::Stream::current`]):
    /// where ops queue their kernels.
    fn current_stream(&self) -> Result<Arc<CudaStream>> {
        device::stream(self.device.index(), current_stream_id(self.device))
    }

    /// The cuBLAS handle, locked, set to this thread's current stream.
    fn blas(&self, op: &'static str) -> Result<std::sync::MutexGuard<'_, CudaBlas>> {
        let blas = self
            .blas
            .get_or_init(|| CudaBlas::new(self.context.default_stream()).map(Mutex::new).map_err(SharedError::new));
        let blas = blas.as_ref().map_err(|e| TensorError::DeviceCall {
            op,
            device: self.device,
            what: "creating a cuBLAS handle".into(),
            source: e.clone(),
        })?;
        let mut guard = blas.lock().unwrap_or_else(|e| e.into_inner());
        let stream = self.current_stream()?;
        // SAFETY: the handle is used only under this lock, by one product at
        // a time, on the stream the op's other kernels use.
        unsafe { guard.set_stream(stream) }.map_err(|e| self.call_error(op, "setting cuBLAS's stream", e))?;
        Ok(guard)
    }
}

/// A grid-stride launch over `n` items, as the ABI's launch rule says.
fn grid_for(n: usize) -> LaunchConfig {
    let blocks = brasa_kernels::cuda_ptx::grid_for(n as u64);
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 }
}

/// The dtype's part of a kernel name.
fn suffix(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I64 => "i64",
        DType::U8 => "u8",
        DType::Bool => "bool",
    }
}

/// The device address of a storage's first element.
fn storage_address(op: &'static str, storage: &Storage) -> Result<u64> {
    match storage.buffer() {
        Buffer::Cuda(block) => Ok(block.addr() as u64),
        Buffer::Host(_) | Buffer::Meta(_) => {
            Err(TensorError::internal(op, "a tensor of another device reached the CUDA backend"))
        }
    }
}

/// The device address of `t`'s first element (its layout's offset applied).
fn address(op: &'static str, t: &Tensor) -> Result<u64> {
    let offset = t.layout().offset() * t.dtype().size_in_bytes();
    Ok(storage_address(op, t.storage())? + offset as u64)
}

/// The device address of a fresh output's first element.
fn output_address(op: &'static str, out: &UninitTensor) -> Result<u64> {
    match out.buffer() {
        Buffer::Cuda(block) => Ok(block.addr() as u64),
        Buffer::Host(_) | Buffer::Meta(_) => {
            Err(TensorError::internal(op, "an output of another device on the CUDA backend"))
        }
    }
}

impl DeviceOps for CudaOps {
    fn unary(&self, name: &'static str, op: UnaryOp, x: &Tensor) -> Result<Tensor> {
        elementwise::unary(self, name, op, x)
    }

    fn binary(&self, op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        elementwise::binary(self, op, a, b)
    }

    fn compare(&self, name: &'static str, op: CompareOp, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        elementwise::compare(self, name, op, a, b)
    }

    fn compare_scalar(&self, name: &'static str, op: CompareOp, x: &Tensor, value: f64) -> Result<Tensor> {
        elementwise::compare_scalar(self, name, op, x, value)
    }

    fn where_cond(&self, cond: &Tensor, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        elementwise::where_cond(self, cond, on_true, on_false)
    }

    fn cast(&self, x: &Tensor, dtype: DType) -> Result<Tensor> {
        elementwise::cast(self, x, dtype)
    }

    fn copy_into(&self, name: &'static str, dst: &Tensor, src: &Tensor) -> Result<()> {
        elementwise::copy_into(self, name, dst, src)
    }

    fn sequence(&self, name: &'static str, out: UninitTensor, sequence: Sequence) -> Result<Tensor> {
        elementwise::sequence(self, name, out, sequence)
    }

    fn fill(&self, name: &'static str, dst: &Tensor, value: f64) -> Result<()> {
        elementwise::fill(self, name, dst, value)
    }

    fn full(&self, name: &'static str, shape: Shape, dtype: DType, device: Device, value: f64) -> Result<Tensor> {
        // SAFETY: the host never reads device memory; the fill is queued on
        // the device's stream before any later work there can read it.
        let out = unsafe { UninitTensor::new(shape, dtype, device)?.assume_init() };
        elementwise::fill(self, name, &out, value)?;
        Ok(out)
    }

    fn reduce(&self, op: ReduceOp, name: &'static str, x: &Tensor, mask: &[bool], keepdim: bool) -> Result<Tensor> {
        reduce::reduce(self, op, name, x, mask, keepdim)
    }

    fn softmax(&self, name: &'static str, x: &Tensor, n: usize, inner: usize, log: bool) -> Result<Tensor> {
        reduce::softmax(self, name, x, n, inner, log)
    }

    fn supports_fused_attention(&self, dtype: DType, e: usize, ev: usize, _dropout: bool) -> bool {
        attention::supports(dtype, e, ev)
    }

    fn attention_forward(&self, operands: &AttentionOperands<'_>) -> Result<(Tensor, Tensor)> {
        attention::forward(self, operands)
    }

    fn attention_backward(
        &self,
        operands: &AttentionOperands<'_>,
        out: &Tensor,
        lse: &Tensor,
        grad: &Tensor,
    ) -> Result<[Tensor; 3]> {
        attention::backward(self, operands, out, lse, grad)
    }

    fn layer_norm(
        &self,
        x: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        norm::layer_norm(self, x, weight, bias, eps)
    }

    fn layer_norm_backward(&self, args: LayerNormBackward<'_>, needs: [bool; 3]) -> Result<[Option<Tensor>; 3]> {
        norm::layer_norm_backward(self, args, needs)
    }

    fn batch_norm_stats(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        batch_norm::batch_norm_stats(self, x)
    }

    fn batch_norm_elemt(&self, x: &Tensor, mean: &Tensor, scale: &Tensor, shift: &Tensor) -> Result<Tensor> {
        batch_norm::batch_norm_elemt(self, x, mean, scale, shift)
    }

    fn batch_norm_backward_reduce(&self, dy: &Tensor, x: &Tensor, mean: &Tensor) -> Result<(Tensor, Tensor)> {
        batch_norm::batch_norm_backward_reduce(self, dy, x, mean)
    }

    fn batch_norm_backward_elemt(&self, args: BatchNormBackwardElemt<'_>) -> Result<Tensor> {
        batch_norm::batch_norm_backward_elemt(self, args)
    }

    fn adam_step(&self, updates: &[&AdamUpdate<'_>]) -> Result<()> {
        optim::adam_step(self, updates)
    }

    fn sgd_step(&self, updates: &[&SgdUpdate<'_>]) -> Result<()> {
        optim::sgd_step(self, updates)
    }

    fn update(&self, name: &'static str, op: Update, dst: &Tensor, operands: &[&Tensor]) -> Result<()> {
        update::update(self, name, op, dst, operands)
    }

    fn checked_indices(
        &self,
        op: &'static str,
        index: &Tensor,
        size: usize,
        keep: bool,
        error: &dyn Fn(IndexError) -> TensorError,
    ) -> Result<Vec<i64>> {
        if keep || index.numel() == 0 {
            return read_checked_indices(index, size, error);
        }
        index::check_on_device(op, index, size, error)
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
        index::index_select(self, name, x, ids, size, inner, shape)
    }

    fn gather(&self, name: &'static str, x: &Tensor, dim: usize, index: Indices<'_>) -> Result<Tensor> {
        index::gather(self, name, x, dim, index)
    }

    fn scatter_add(
        &self,
        name: &'static str,
        dst: &Tensor,
        dim: usize,
        index: Indices<'_>,
        src: &Tensor,
    ) -> Result<()> {
        index::scatter_add(self, name, dst, dim, index, src)
    }

    fn one_hot(&self, ids: Indices<'_>, num_classes: usize, shape: &Shape) -> Result<Tensor> {
        index::one_hot(self, ids, num_classes, shape)
    }

    fn conv2d(&self, input: &Tensor, weight: &Tensor, bias: Option<&Tensor>, plan: &ConvPlan) -> Result<Tensor> {
        conv::conv2d(self, input, weight, bias, plan)
    }

    fn conv2d_backward_input(&self, grad: &Tensor, weight: &Tensor, plan: &ConvPlan) -> Result<Tensor> {
        conv::conv2d_backward_input(self, grad, weight, plan)
    }

    fn conv2d_backward_weight(&self, input: &Tensor, grad: &Tensor, plan: &ConvPlan) -> Result<Tensor> {
        conv::conv2d_backward_weight(self, input, grad, plan)
    }

    fn conv2d_backward_bias(&self, grad: &Tensor) -> Result<Tensor> {
        crate::backend::im2col::conv2d_backward_bias(grad)
    }

    fn max_pool2d(&self, input: &Tensor, plan: &PoolPlan) -> Result<(Tensor, Tensor)> {
        pool::max_pool2d(self, input, plan)
    }

    fn max_pool2d_backward(&self, grad: &Tensor, indices: &Tensor, input_shape: &Shape) -> Result<Tensor> {
        pool::max_pool2d_backward(self, grad, indices, input_shape)
    }

    fn avg_pool2d(&self, input: &Tensor, plan: &PoolPlan, count_include_pad: bool) -> Result<Tensor> {
        pool::avg_pool2d(self, input, plan, count_include_pad)
    }

    fn avg_pool2d_backward(&self, grad: &Tensor, plan: &PoolPlan, count_include_pad: bool) -> Result<Tensor> {
        pool::avg_pool2d_backward(self, grad, plan, count_include_pad)
    }

    fn concat(&self, tensors: &[&Tensor], d: usize, shape: &Shape) -> Result<Tensor> {
        elementwise::concat(self, tensors, d, shape)
    }

    fn random(
        &self,
        op: &'static str,
        dist: Distribution,
        shape: &Shape,
        dtype: DType,
        // One backend per CUDA device: it is `self.device`.
        _device: Device,
    ) -> Result<Tensor> {
        random::random(self, op, dist, shape, dtype)
    }

    fn matmul(&self, operands: MatmulOperands<'_>) -> Result<Tensor> {
        matmul::matmul(self, operands)
    }
}

#[cfg(test)]
mod tests {
    use super::{attention, suffix};
    use crate::dtype::DType;
    use brasa_kernels::cuda_ptx::module;
    use brasa_kernels::elementwise::{BinaryOp, UnaryOp};

    fn has(module_name: &str, kernel: &str) -> bool {
        module(module_name).is_some_and(|m| m.ptx.contains(&format!(".entry {kernel}(")))
    }

    /// Every kernel name the backend can ask for exists in the committed
    /// PTX: checked offline, so a renamed kernel fails CI, not a GPU run.
    #[test]
    fn every_kernel_the_backend_launches_is_in_the_ptx() {
        let floats = [DType::F32, DType::F64, DType::F16, DType::BF16];
        let ints = [DType::I64, DType::U8];
        let unary_float = [
            UnaryOp::Neg,
            UnaryOp::Abs,
            UnaryOp::Exp,
            UnaryOp::Log,
            UnaryOp::Sqrt,
            UnaryOp::Rsqrt,
            UnaryOp::Sin,
            UnaryOp::Cos,
            UnaryOp::Tanh,
            UnaryOp::Sigmoid,
            UnaryOp::Relu,
            UnaryOp::Gelu,
            UnaryOp::GeluTanh,
            UnaryOp::Silu,
            UnaryOp::Powf(2.0),
            UnaryOp::Clamp { min: 0.0, max: 1.0 },
            UnaryOp::Affine { mul: 2.0, add: 1.0 },
        ];
        let unary_int = [
            UnaryOp::Neg,
            UnaryOp::Abs,
            UnaryOp::Relu,
            UnaryOp::Clamp { min: 0.0, max: 1.0 },
            UnaryOp::Powf(2.0),
            UnaryOp::Affine { mul: 2.0, add: 1.0 },
        ];
        let binary_all = [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::Pow,
            BinaryOp::Maximum,
            BinaryOp::Minimum,
            BinaryOp::ReluBackward,
            BinaryOp::GeluBackward,
            BinaryOp::GeluTanhBackward,
        ];
        let mut missing = Vec::new();
        let mut want = |module_name: &str, kernel: String| {
            if !has(module_name, &kernel) {
                missing.push(kernel);
            }
        };
        for &d in &floats {
            for op in ["mean", "var", "std"] {
                want("reduce", format!("reduce_{op}_{}", suffix(d)));
            }
            want("softmax", format!("softmax_{}", suffix(d)));
            want("conv", format!("im2col_{}", suffix(d)));
            want("random", format!("random_uniform_{}", suffix(d)));
            want("random", format!("random_normal_{}", suffix(d)));
            want("pool", format!("avg_pool2d_{}", suffix(d)));
            want("pool", format!("avg_pool2d_backward_{}", suffix(d)));
            want("conv", format!("col2im_{}", suffix(d)));
            for op in ["log1p", "log_sigmoid"] {
                want("elementwise", format!("unary_{op}_{}", suffix(d)));
            }
            for op in ["binary_add_scaled", "binary_lerp", "ternary_addcmul", "ternary_addcdiv"] {
                want("elementwise", format!("{op}_{}", suffix(d)));
            }
            want("softmax", format!("log_softmax_{}", suffix(d)));
            for op in unary_float {
                want("elementwise", format!("unary_{}_{}", op.name(), suffix(d)));
            }
            for op in binary_all {
                want("elementwise", format!("binary_{}_{}", op.name(), suffix(d)));
            }
        }
        for &d in &ints {
            want("elementwise", format!("binary_add_scaled_{}", suffix(d)));
            for op in unary_int {
                want("elementwise", format!("unary_{}_{}", op.name(), suffix(d)));
            }
            let float_only = [BinaryOp::Div, BinaryOp::GeluBackward, BinaryOp::GeluTanhBackward];
            for op in binary_all.iter().filter(|op| !float_only.contains(op)) {
                want("elementwise", format!("binary_{}_{}", op.name(), suffix(d)));
            }
        }
        for op in [BinaryOp::Add, BinaryOp::Mul, BinaryOp::Maximum, BinaryOp::Minimum] {
            want("elementwise", format!("binary_{}_bool", op.name()));
        }
        for d in DType::ALL {
            for op in ["eq", "ne", "lt", "le", "gt", "ge"] {
                want("elementwise", format!("compare_{op}_{}", suffix(d)));
                want("elementwise", format!("compare_scalar_{op}_{}", suffix(d)));
            }
            want("elementwise", format!("where_{}", suffix(d)));
            if d != DType::Bool {
                want("pool", format!("max_pool2d_{}", suffix(d)));
            }
            for op in ["index_select", "gather", "scatter_add"] {
                want("index", format!("{op}_{}", suffix(d)));
            }
            for op in ["sum", "max", "min", "argmax", "argmin"] {
                want("reduce", format!("reduce_{op}_{}", suffix(d)));
            }
            want("fill", format!("fill_{}", suffix(d)));
            want("random", format!("random_bernoulli_{}", suffix(d)));
            for to in DType::ALL {
                want("cast", format!("cast_{}_{}", suffix(d), suffix(to)));
            }
        }
        want("index", "one_hot".to_string());
        for d in [DType::F16, DType::BF16] {
            for dim in brasa_kernels::cuda_ptx::ATTENTION_HEAD_DIMS {
                // Every width the backend claims picks a compiled kernel.
                assert!(attention::supports(d, dim, dim) && !attention::supports(d, dim + 65, 1));
                want("attention", format!("attention_forward_{}_d{dim}", suffix(d)));
                want("attention", format!("attention_forward_dropout_{}_d{dim}", suffix(d)));
                want("attention", format!("attention_backward_dropout_{}_d{dim}", suffix(d)));
                want("attention", format!("attention_backward_{}_d{dim}", suffix(d)));
            }
            want("attention", format!("attention_delta_{}", suffix(d)));
        }
        assert!(!attention::supports(DType::F32, 64, 64));
        assert!(missing.is_empty(), "kernels missing from the PTX: {missing:?}");
    }
}
