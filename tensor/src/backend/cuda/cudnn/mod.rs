//! Convolutions on cuDNN (its legacy API, `cudnnConvolution*`), tried
//! before the `im2col` kernels: forward, input gradient and weight gradient
//! of 2-d convolutions with stride, padding, dilation and groups, in f32
//! (no TF32), f64, f16 and bf16 (f32 accumulation). The 1-d and transposed
//! convolutions are built on these three in `ops`, so they come here too.
//!
//! Each entry point answers `Ok(None)` when cuDNN should not or cannot do
//! the work — disabled ([`crate::cudnn::set_enabled`]), not loadable, a
//! dtype or size it does not take, or `CUDNN_STATUS_NOT_SUPPORTED` from
//! every algorithm — and the caller runs `im2col` instead. Any other cuDNN
//! failure is a [`TensorError::DeviceCall`] carrying cuDNN's words.
//!
//! - `api`: the library and its function table, loaded once per process.
//! - `descriptors`: owned descriptors, memory formats.
//! - `algorithms`: heuristics, benchmark search and its cache, workspaces.
//! - `backend_descriptor`, `graph`: the same convolutions through cuDNN's
//!   graph API, a plan per configuration kept for the process
//!   ([`crate::cudnn::set_graph_api`]; the legacy API runs what it cannot).
//!
//! Handles: a small pool per device (cuDNN handles are not to be used by two
//! threads at once); each call takes one, points it at the thread's current
//! stream (`cudnnSetStream`) and gives it back.

mod algorithms;
mod api;
mod backend_descriptor;
mod descriptors;
mod graph;

use super::elementwise::finish;
use super::{address, output_address, CudaOps};
use crate::backend::ConvPlan;
use crate::error::{Result, TensorError};
use crate::shape::Shape;
use crate::storage::UninitTensor;
use crate::tensor::Tensor;
use algorithms::{Direction, Key, Problem};
use api::{Api, CudnnError};
use cudarc::cudnn::sys::{cudaStream_t, cudnnHandle_t};
use descriptors::{check, data_type, ConvDesc, FilterDesc, Format, TensorDesc};
use graph::GraphProblem;
use std::collections::BTreeMap;
use std::ffi::c_int;
use std::sync::{Mutex, Once};

/// Why a cuDNN attempt stopped.
pub(super) enum Failure {
    /// cuDNN does not do this configuration: fall back to `im2col`.
    NotSupported(String),
    /// A cuDNN call failed.
    Call { what: String, error: CudnnError },
    /// Anything else (an allocation, a copy).
    Tensor(TensorError),
}

impl From<TensorError> for Failure {
    fn from(e: TensorError) -> Self {
        Failure::Tensor(e)
    }
}

/// cuDNN's version, loading the library if not yet tried.
pub(crate) fn version() -> Option<usize> {
    api::api().ok().map(|api| api.version)
}

/// Why cuDNN could not be loaded, if it could not.
pub(crate) fn load_error() -> Option<TensorError> {
    api::api().err().cloned()
}

/// How many algorithm choices are remembered (both modes).
pub(crate) fn cached_algorithm_count() -> usize {
    algorithms::cached_count()
}

/// How many graph-API execution plans are kept (one per configuration
/// and direction the graph API planned).
pub(crate) fn cached_graph_plan_count() -> usize {
    graph::plan_count()
}

/// A cuDNN handle (an opaque pointer to cuDNN's per-device state).
struct Handle(cudnnHandle_t);

// SAFETY: a handle may move between threads; it is used by one thread at a
// time (taken out of the pool while used).
unsafe impl Send for Handle {}

/// Idle handles per device; handles live as long as the process, as the
/// CUDA contexts they belong to.
static HANDLES: Mutex<BTreeMap<usize, Vec<Handle>>> = Mutex::new(BTreeMap::new());

/// A handle taken from the pool, returned when dropped.
struct HandleGuard {
    device: usize,
    handle: Option<Handle>,
}

impl HandleGuard {
    fn raw(&self) -> cudnnHandle_t {
        self.handle.as_ref().map_or(std::ptr::null_mut(), |h| h.0)
    }
}

impl Drop for HandleGuard {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            HANDLES.lock().unwrap_or_else(|e| e.into_inner()).entry(self.device).or_default().push(handle);
        }
    }
}

/// A handle for `backend`'s device, pointed at this thread's current stream.
fn handle(api: &'static Api, backend: &CudaOps, op: &'static str) -> std::result::Result<HandleGuard, Failure> {
    let device = backend.device.index();
    // cuDNN works on the thread's current context: the device's.
    backend.context.bind_to_thread().map_err(|e| backend.call_error(op, "making the device's context current", e))?;
    let idle = HANDLES.lock().unwrap_or_else(|e| e.into_inner()).get_mut(&device).and_then(Vec::pop);
    let handle = match idle {
        Some(handle) => handle,
        None => {
            let mut raw = std::ptr::null_mut();
            // SAFETY: `raw` is a valid place for the handle; the device's
            // context is current, so the handle belongs to this device.
            check(api, unsafe { (api.create)(&mut raw) }, "cudnnCreate")?;
            Handle(raw)
        }
    };
    let guard = HandleGuard { device, handle: Some(handle) };
    let stream = backend.current_stream()?;
    // SAFETY: a live handle of this device, used by this thread only; the
    // stream is the device's and outlives the calls queued on it.
    let status = unsafe { (api.set_stream)(guard.raw(), stream.cu_stream() as cudaStream_t) };
    check(api, status, "cudnnSetStream")?;
    Ok(guard)
}

/// cuDNN's library, if convolutions should and can use it; the first
/// time it cannot be loaded, one line on stderr says where it was looked for.
fn usable() -> Option<&'static Api> {
    if !crate::cudnn::enabled() {
        return None;
    }
    match api::api() {
        Ok(api) => Some(api),
        Err(error) => {
            static WARNED: Once = Once::new();
            WARNED.call_once(|| {
                eprintln!("brasa: CUDA convolutions use im2col + cuBLAS, not cuDNN: {error}");
            });
            None
        }
    }
}

/// `dims` as cuDNN's ints, or `None` when a size or the element count is
/// beyond them (cuDNN's legacy API indexes with 32-bit ints).
fn ints(dims: &[usize]) -> Option<[c_int; 4]> {
    let numel = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d))?;
    if numel == 0 || c_int::try_from(numel).is_err() {
        return None;
    }
    let mut out = [0; 4];
    for (o, &d) in out.iter_mut().zip(dims) {
        *o = c_int::try_from(d).ok()?;
    }
    Some(out)
}

fn four(shape: &Shape) -> [usize; 4] {
    let d = shape.dims();
    [d[0], d[1], d[2], d[3]]
}

/// A new `[N, C, H, W]` tensor dense in `format`.
fn new_output(dims: [usize; 4], backend: &CudaOps, dtype: crate::dtype::DType, format: Format) -> Result<UninitTensor> {
    let [n, c, h, w] = dims;
    match format {
        Format::Nchw => UninitTensor::new([n, c, h, w], dtype, backend.device),
        Format::Nhwc => UninitTensor::new([n, h, w, c], dtype, backend.device),
    }
}

/// `out`, written by the call just queued, seen as `[N, C, H, W]`.
fn finish_output(out: UninitTensor, format: Format) -> Result<Tensor> {
    let out = finish(out);
    match format {
        Format::Nchw => Ok(out),
        Format::Nhwc => out.permute(&[0, 3, 1, 2]),
    }
}

/// One call's operands: `a` and `b` are the two inputs of `direction` (x
/// and w, w and dy, x and dy), dense in `format`.
struct Call<'a> {
    op: &'static str,
    backend: &'a CudaOps,
    plan: &'a ConvPlan,
    direction: Direction,
    format: Format,
}

impl Call<'_> {
    /// Runs the call, or says why cuDNN did not.
    fn run(&self, api: &'static Api, inputs: [&Tensor; 2]) -> std::result::Result<Tensor, Failure> {
        let plan = self.plan;
        let dtype = inputs[0].dtype();
        let not_supported = || Failure::NotSupported("a dtype or size cuDNN does not take".into());
        let cudnn_type = data_type(dtype).ok_or_else(not_supported)?;
        let (x_dims, w_dims, y_dims) =
            (four(&plan.input_shape()), four(&plan.weight_shape()), four(&plan.output_shape()));
        let (xi, wi, yi) = (
            ints(&x_dims).ok_or_else(not_supported)?,
            ints(&w_dims).ok_or_else(not_supported)?,
            ints(&y_dims).ok_or_else(not_supported)?,
        );
        let (a, b) = (self.format.dense(inputs[0])?, self.format.dense(inputs[1])?);
        let result_dims = match self.direction {
            Direction::Forward => y_dims,
            Direction::BackwardData => x_dims,
            Direction::BackwardFilter => w_dims,
        };
        let out = new_output(result_dims, self.backend, dtype, self.format)?;
        let out_ptr = output_address(self.op, &out)?;
        let (x_ptr, w_ptr, y_ptr) = match self.direction {
            Direction::Forward => (address(self.op, &a)?, address(self.op, &b)?, out_ptr),
            Direction::BackwardData => (out_ptr, address(self.op, &a)?, address(self.op, &b)?),
            Direction::BackwardFilter => (address(self.op, &a)?, out_ptr, address(self.op, &b)?),
        };
        let handle = handle(api, self.backend, self.op)?;
        let key = Key {
            device: self.backend.device.index(),
            dtype,
            direction: self.direction,
            format: self.format,
            input: x_dims,
            weight: w_dims,
            stride: plan.stride,
            padding: plan.padding,
            dilation: plan.dilation,
            groups: plan.groups,
            deterministic: crate::cudnn::deterministic(),
            benchmark: crate::cudnn::benchmark(),
        };
        if crate::cudnn::graph_api() {
            let problem = GraphProblem {
                api,
                backend: self.backend,
                handle: handle.raw(),
                key: &key,
                output_dims: y_dims,
                pointers: [x_ptr, w_ptr, y_ptr],
            };
            if graph::run(&problem)? {
                return Ok(finish_output(out, self.format)?);
            }
        }
        let x = TensorDesc::new(api, cudnn_type, xi, self.format)?;
        let w = FilterDesc::new(api, cudnn_type, wi, self.format)?;
        let y = TensorDesc::new(api, cudnn_type, yi, self.format)?;
        let conv = ConvDesc::new(api, plan, dtype)?;
        // cuDNN's idea of the output must be brasa's (ConvPlan's formula).
        let mut got = [0 as c_int; 4];
        let [g0, g1, g2, g3] = &mut got;
        // SAFETY: live descriptors; four valid places for the sizes.
        let status = unsafe { (api.get_conv_2d_forward_output_dim)(conv.raw, x.raw, w.raw, g0, g1, g2, g3) };
        check(api, status, "cudnnGetConvolution2dForwardOutputDim")?;
        if got != yi {
            return Err(TensorError::internal(
                self.op,
                format!("cuDNN computes an output of {got:?} where brasa's plan says {yi:?}"),
            )
            .into());
        }
        let problem = Problem {
            api,
            backend: self.backend,
            handle: handle.raw(),
            direction: self.direction,
            dtype,
            x: &x,
            w: &w,
            y: &y,
            conv: &conv,
            x_ptr,
            w_ptr,
            y_ptr,
        };
        problem.run(key)?;
        // The operands (and their dense copies) may be dropped now: their
        // memory is reused only by later work on this stream.
        Ok(finish_output(out, self.format)?)
    }
}

/// Runs `call` on cuDNN: `Ok(None)` to fall back to `im2col`.
fn attempt(call: Call<'_>, inputs: [&Tensor; 2]) -> Result<Option<Tensor>> {
    // Quietly im2col's: dtypes cuDNN has no type for, empty tensors, and
    // tensors past cuDNN's 32-bit element counts.
    let plan = call.plan;
    let sizes_fit =
        [plan.input_shape(), plan.weight_shape(), plan.output_shape()].iter().all(|s| ints(s.dims()).is_some());
    if data_type(inputs[0].dtype()).is_none() || !sizes_fit {
        return Ok(None);
    }
    let Some(api) = usable() else {
        return Ok(None);
    };
    match call.run(api, inputs) {
        Ok(out) => Ok(Some(out)),
        Err(Failure::NotSupported(why)) => {
            // Once per process: a configuration (or an environment: a
            // driver or sub-library cuDNN lacks) that cuDNN turned down.
            static NOTED: Once = Once::new();
            NOTED.call_once(|| eprintln!("brasa: {} on im2col + cuBLAS, cuDNN declined: {why}", call.op));
            Ok(None)
        }
        Err(Failure::Call { what, error }) => Err(call.backend.call_error(call.op, what, error)),
        Err(Failure::Tensor(e)) => Err(e),
    }
}

/// The convolution `[N, C_out, H_out, W_out]` (without bias), in the
/// memory format of the input (channels-last when the input or the weight
/// is), or `None` for `im2col`.
pub(super) fn conv2d(backend: &CudaOps, input: &Tensor, weight: &Tensor, plan: &ConvPlan) -> Result<Option<Tensor>> {
    let format = Format::for_operands(input, weight);
    let call = Call { op: "conv2d", backend, plan, direction: Direction::Forward, format };
    attempt(call, [input, weight])
}

/// The input gradient, in the memory format of `grad` (or of the weight),
/// or `None` for `im2col`.
pub(super) fn conv2d_backward_input(
    backend: &CudaOps,
    grad: &Tensor,
    weight: &Tensor,
    plan: &ConvPlan,
) -> Result<Option<Tensor>> {
    let format = Format::for_operands(grad, weight);
    let call = Call { op: "conv2d_backward_input", backend, plan, direction: Direction::BackwardData, format };
    attempt(call, [weight, grad])
}

/// The weight gradient, channels-last when the input or `grad` is (as
/// PyTorch's: autograd then lays it out as the weight, which is free for a
/// channels-last model's weights), or `None` for `im2col`.
pub(super) fn conv2d_backward_weight(
    backend: &CudaOps,
    input: &Tensor,
    grad: &Tensor,
    plan: &ConvPlan,
) -> Result<Option<Tensor>> {
    let format = Format::for_operands(input, grad);
    let call = Call { op: "conv2d_backward_weight", backend, plan, direction: Direction::BackwardFilter, format };
    attempt(call, [input, grad])
}
