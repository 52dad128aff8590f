//! Choosing and running a cuDNN convolution algorithm.
//!
//! A [`Problem`] is one call's descriptors and device pointers in one
//! [`Direction`]. Its candidates come from cuDNN's heuristics
//! (`cudnnGet*Algorithm_v7`, nothing run) or, in benchmark mode, from
//! timing them all once (`cudnnFind*AlgorithmEx`), remembered per
//! configuration ([`Key`]) for the rest of the process, as PyTorch's
//! `cudnn.benchmark` does. Deterministic mode keeps only algorithms cuDNN
//! marks deterministic, and puts `ALGO_1` (deterministic, little workspace)
//! first for the gradients when cuDNN's heuristics choose.
//!
//! Each candidate is tried in order: its workspace size is asked for and
//! taken from the device's caching allocator (as a temporary); a candidate
//! whose workspace does not fit, or that cuDNN does not support for these
//! operands, gives way to the next.
//!
//! The candidate that ran is remembered with its workspace size, in both
//! modes (the mode is part of the [`Key`]), so a training loop's later calls
//! ask cuDNN nothing but the call itself: cuDNN 9's heuristics query costs
//! host time on every call otherwise (PyTorch caches its choices the same
//! way). When a remembered choice's workspace no longer fits, the search
//! runs again for that call.

use super::api::{AlgoPerf, Api, DETERMINISTIC, STATUS_SUCCESS};
use super::descriptors::{check, default_math, ConvDesc, FilterDesc, Format, TensorDesc};
use super::Failure;
use crate::backend::cuda::{output_address, CudaOps};
use crate::dtype::DType;
use crate::memory::{category_scope, MemoryCategory};
use crate::shape::Shape;
use crate::storage::UninitTensor;
use cudarc::cudnn::sys::{cudnnHandle_t, cudnnMathType_t};
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;

/// Which of the three convolution calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Direction {
    /// `y = conv(x, w)`.
    Forward,
    /// `dx` from `dy` and `w` (also a transposed convolution's forward).
    BackwardData,
    /// `dw` from `x` and `dy`.
    BackwardFilter,
}

impl Direction {
    /// How many algorithms cuDNN has in this direction (its `*_ALGO_COUNT`).
    fn algorithm_count(self) -> u32 {
        match self {
            Direction::Forward => 8,
            Direction::BackwardData => 6,
            Direction::BackwardFilter => 7,
        }
    }
}

/// What a benchmark result is remembered under: everything that changes
/// which algorithm is fastest or allowed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Key {
    pub device: usize,
    pub dtype: DType,
    pub direction: Direction,
    pub format: Format,
    pub input: [usize; 4],
    pub weight: [usize; 4],
    pub stride: (usize, usize),
    pub padding: (usize, usize),
    pub dilation: (usize, usize),
    pub groups: usize,
    pub deterministic: bool,
    /// Chosen by timing (`cudnn::set_benchmark(true)`) or by heuristics.
    pub benchmark: bool,
}

/// An algorithm chosen for a configuration: the record it came with (its
/// math type) and the workspace it asked for.
#[derive(Clone, Copy, Debug)]
struct Choice {
    perf: AlgoPerf,
    workspace: usize,
}

/// The choices made so far, per configuration, for the process.
static CHOSEN: Mutex<Option<HashMap<Key, Choice>>> = Mutex::new(None);

/// How many choices are remembered (both modes).
pub(super) fn cached_count() -> usize {
    CHOSEN.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map_or(0, HashMap::len)
}

fn cached(key: &Key) -> Option<Choice> {
    CHOSEN.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|m| m.get(key).copied())
}

fn remember(key: Key, choice: Choice) {
    CHOSEN.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(HashMap::new).insert(key, choice);
}

/// One convolution call: descriptors and device addresses. `x`, `w`, `y`
/// are the convolution's input, weight and output whatever the direction;
/// the direction's result is the one written (`y`, `x` or `w`).
pub(super) struct Problem<'a> {
    pub api: &'static Api,
    pub backend: &'a CudaOps,
    pub handle: cudnnHandle_t,
    pub direction: Direction,
    pub dtype: DType,
    pub x: &'a TensorDesc,
    pub w: &'a FilterDesc,
    pub y: &'a TensorDesc,
    pub conv: &'a ConvDesc,
    pub x_ptr: u64,
    pub w_ptr: u64,
    pub y_ptr: u64,
}

/// A workspace from the caching allocator (none for 0 bytes), alive until
/// dropped after the call that uses it was queued: stream order keeps the
/// memory from the next user until the call has run.
pub(super) struct Workspace {
    _block: Option<UninitTensor>,
    pub ptr: u64,
    pub bytes: usize,
}

/// `bytes` of workspace from `backend`'s caching allocator on the current
/// stream, counted as temporary memory; `None` when it does not fit.
pub(super) fn workspace(backend: &CudaOps, bytes: usize) -> Result<Option<Workspace>, Failure> {
    if bytes == 0 {
        return Ok(Some(Workspace { _block: None, ptr: 0, bytes: 0 }));
    }
    let _temporary = category_scope(MemoryCategory::Temporary);
    match UninitTensor::new(Shape::from([bytes]), DType::U8, backend.device) {
        Ok(block) => {
            let ptr = output_address("cudnn workspace", &block)?;
            Ok(Some(Workspace { _block: Some(block), ptr, bytes }))
        }
        Err(e) if e.as_out_of_memory().is_some() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

impl Problem<'_> {
    /// Heuristics' candidates, best first (`cudnnGet*Algorithm_v7`).
    fn heuristics(&self) -> Result<Vec<AlgoPerf>, Failure> {
        let mut perfs = [AlgoPerf::default(); 16];
        let mut returned: c_int = 0;
        let (api, h, n, out, p) = (self.api, self.handle, perfs.len() as c_int, &mut returned, perfs.as_mut_ptr());
        // SAFETY: live descriptors; `perfs` holds `n` records of the C
        // layout, of which cuDNN fills `returned`.
        let (status, what) = unsafe {
            match self.direction {
                Direction::Forward => (
                    (api.get_forward_algorithm_v7)(h, self.x.raw, self.w.raw, self.conv.raw, self.y.raw, n, out, p),
                    "cudnnGetConvolutionForwardAlgorithm_v7",
                ),
                Direction::BackwardData => (
                    (api.get_backward_data_algorithm_v7)(
                        h,
                        self.w.raw,
                        self.y.raw,
                        self.conv.raw,
                        self.x.raw,
                        n,
                        out,
                        p,
                    ),
                    "cudnnGetConvolutionBackwardDataAlgorithm_v7",
                ),
                Direction::BackwardFilter => (
                    (api.get_backward_filter_algorithm_v7)(
                        h,
                        self.x.raw,
                        self.y.raw,
                        self.conv.raw,
                        self.w.raw,
                        n,
                        out,
                        p,
                    ),
                    "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
                ),
            }
        };
        check(api, status, what)?;
        let returned = (returned.max(0) as usize).min(perfs.len());
        Ok(perfs[..returned].to_vec())
    }

    /// Every algorithm timed on these operands (`cudnnFind*AlgorithmEx`),
    /// fastest first, with a workspace of `workspace.bytes` at most. Writes
    /// the direction's output (overwritten by the chosen call afterwards).
    fn find(&self, workspace: &Workspace) -> Result<Vec<AlgoPerf>, Failure> {
        let mut perfs = [AlgoPerf::default(); 16];
        let mut returned: c_int = 0;
        let (api, h, n, out, p) = (self.api, self.handle, perfs.len() as c_int, &mut returned, perfs.as_mut_ptr());
        let (x, w, y) = (self.x_ptr as *mut c_void, self.w_ptr as *mut c_void, self.y_ptr as *mut c_void);
        let (ws, bytes) = (workspace.ptr as *mut c_void, workspace.bytes);
        // SAFETY: live descriptors describing the device buffers behind the
        // pointers (inputs read, the direction's output written, all queued
        // on the handle's stream, which is the current one); the workspace
        // holds `bytes`; `perfs` holds `n` records.
        let (status, what) = unsafe {
            match self.direction {
                Direction::Forward => (
                    (api.find_forward_algorithm_ex)(
                        h,
                        self.x.raw,
                        x,
                        self.w.raw,
                        w,
                        self.conv.raw,
                        self.y.raw,
                        y,
                        n,
                        out,
                        p,
                        ws,
                        bytes,
                    ),
                    "cudnnFindConvolutionForwardAlgorithmEx",
                ),
                Direction::BackwardData => (
                    (api.find_backward_data_algorithm_ex)(
                        h,
                        self.w.raw,
                        w,
                        self.y.raw,
                        y,
                        self.conv.raw,
                        self.x.raw,
                        x,
                        n,
                        out,
                        p,
                        ws,
                        bytes,
                    ),
                    "cudnnFindConvolutionBackwardDataAlgorithmEx",
                ),
                Direction::BackwardFilter => (
                    (api.find_backward_filter_algorithm_ex)(
                        h,
                        self.x.raw,
                        x,
                        self.y.raw,
                        y,
                        self.conv.raw,
                        self.w.raw,
                        w,
                        n,
                        out,
                        p,
                        ws,
                        bytes,
                    ),
                    "cudnnFindConvolutionBackwardFilterAlgorithmEx",
                ),
            }
        };
        check(api, status, what)?;
        let returned = (returned.max(0) as usize).min(perfs.len());
        Ok(perfs[..returned].to_vec())
    }

    /// The workspace `algo` needs with the descriptor's current math.
    fn workspace_size(&self, algo: u32) -> Result<usize, Failure> {
        let (api, h) = (self.api, self.handle);
        let mut bytes = 0usize;
        // SAFETY: live descriptors; `bytes` is a valid place for the size.
        let (status, what) = unsafe {
            match self.direction {
                Direction::Forward => (
                    (api.get_forward_workspace_size)(
                        h,
                        self.x.raw,
                        self.w.raw,
                        self.conv.raw,
                        self.y.raw,
                        algo,
                        &mut bytes,
                    ),
                    "cudnnGetConvolutionForwardWorkspaceSize",
                ),
                Direction::BackwardData => (
                    (api.get_backward_data_workspace_size)(
                        h,
                        self.w.raw,
                        self.y.raw,
                        self.conv.raw,
                        self.x.raw,
                        algo,
                        &mut bytes,
                    ),
                    "cudnnGetConvolutionBackwardDataWorkspaceSize",
                ),
                Direction::BackwardFilter => (
                    (api.get_backward_filter_workspace_size)(
                        h,
                        self.x.raw,
                        self.y.raw,
                        self.conv.raw,
                        self.w.raw,
                        algo,
                        &mut bytes,
                    ),
                    "cudnnGetConvolutionBackwardFilterWorkspaceSize",
                ),
            }
        };
        check(api, status, what)?;
        Ok(bytes)
    }

    /// Queues `algo` with `workspace` (alpha 1, beta 0: the output is
    /// overwritten).
    fn execute(&self, algo: u32, workspace: &Workspace) -> Result<(), Failure> {
        let (api, h) = (self.api, self.handle);
        // The profiler's device time of the call (CUDA events around it).
        let _span = self.backend.launch_span(match self.direction {
            Direction::Forward => "cudnnConvolutionForward",
            Direction::BackwardData => "cudnnConvolutionBackwardData",
            Direction::BackwardFilter => "cudnnConvolutionBackwardFilter",
        });
        let (one_f32, zero_f32, one_f64, zero_f64) = (1f32, 0f32, 1f64, 0f64);
        // cuDNN reads alpha and beta as doubles for double data, as floats
        // for the rest.
        let (alpha, beta) = if self.dtype == DType::F64 {
            (&one_f64 as *const f64 as *const c_void, &zero_f64 as *const f64 as *const c_void)
        } else {
            (&one_f32 as *const f32 as *const c_void, &zero_f32 as *const f32 as *const c_void)
        };
        let (x, w, y) = (self.x_ptr as *mut c_void, self.w_ptr as *mut c_void, self.y_ptr as *mut c_void);
        let (ws, bytes) = (workspace.ptr as *mut c_void, workspace.bytes);
        // SAFETY: live descriptors describing the device buffers behind the
        // pointers; the inputs are read and the direction's output written
        // on the handle's stream (the current one), in order with the work
        // that made them; the workspace holds `bytes` and outlives the
        // queued call in stream order; alpha and beta live across the call
        // (cuDNN reads host scalars before returning).
        let (status, what) = unsafe {
            match self.direction {
                Direction::Forward => (
                    (api.forward)(
                        h,
                        alpha,
                        self.x.raw,
                        x,
                        self.w.raw,
                        w,
                        self.conv.raw,
                        algo,
                        ws,
                        bytes,
                        beta,
                        self.y.raw,
                        y,
                    ),
                    "cudnnConvolutionForward",
                ),
                Direction::BackwardData => (
                    (api.backward_data)(
                        h,
                        alpha,
                        self.w.raw,
                        w,
                        self.y.raw,
                        y,
                        self.conv.raw,
                        algo,
                        ws,
                        bytes,
                        beta,
                        self.x.raw,
                        x,
                    ),
                    "cudnnConvolutionBackwardData",
                ),
                Direction::BackwardFilter => (
                    (api.backward_filter)(
                        h,
                        alpha,
                        self.x.raw,
                        x,
                        self.y.raw,
                        y,
                        self.conv.raw,
                        algo,
                        ws,
                        bytes,
                        beta,
                        self.w.raw,
                        w,
                    ),
                    "cudnnConvolutionBackwardFilter",
                ),
            }
        };
        check(api, status, what)
    }

    /// The math `perf` runs with: f32 and f64 keep theirs (f32 never on
    /// TF32 tensor cores); f16 and bf16 take the algorithm's own.
    fn math_for(&self, perf: &AlgoPerf) -> cudnnMathType_t {
        match self.dtype {
            DType::F16 | DType::BF16 => match perf.math_type {
                0 => cudnnMathType_t::CUDNN_DEFAULT_MATH,
                2 => cudnnMathType_t::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
                _ => cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
            },
            dtype => default_math(dtype),
        }
    }

    /// The largest workspace the caching allocator can give among those
    /// the direction's algorithms would use, for a benchmark search.
    fn search_workspace(&self) -> Result<Workspace, Failure> {
        self.conv.set_math(default_math(self.dtype))?;
        let mut sizes: Vec<usize> =
            (0..self.direction.algorithm_count()).filter_map(|algo| self.workspace_size(algo).ok()).collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        sizes.dedup();
        for bytes in sizes {
            if let Some(workspace) = workspace(self.backend, bytes)? {
                return Ok(workspace);
            }
        }
        Ok(Workspace { _block: None, ptr: 0, bytes: 0 })
    }

    /// The candidates in the order to try: timed ones in benchmark mode,
    /// heuristics' otherwise.
    fn candidates(&self, key: &Key) -> Result<Vec<AlgoPerf>, Failure> {
        let deterministic = key.deterministic;
        let allowed = |p: &AlgoPerf| p.status == STATUS_SUCCESS && (!deterministic || p.determinism == DETERMINISTIC);
        if key.benchmark {
            let workspace = self.search_workspace()?;
            let found = self.find(&workspace)?;
            return Ok(found.into_iter().filter(allowed).collect());
        }
        self.conv.set_math(default_math(self.dtype))?;
        let mut candidates = Vec::new();
        if deterministic && self.direction != Direction::Forward {
            // PyTorch's choice for deterministic gradients without a search.
            candidates.push(AlgoPerf {
                algo: 1,
                determinism: DETERMINISTIC,
                math_type: default_math(self.dtype) as u32,
                ..AlgoPerf::default()
            });
        }
        for perf in self.heuristics()?.into_iter().filter(allowed) {
            if !candidates.iter().any(|c| c.algo == perf.algo && c.math_type == perf.math_type) {
                candidates.push(perf);
            }
        }
        Ok(candidates)
    }

    /// Chooses an algorithm and queues the call; [`Failure::NotSupported`]
    /// when no candidate could run (the caller falls back to im2col).
    pub(super) fn run(&self, key: Key) -> Result<(), Failure> {
        if let Some(choice) = cached(&key) {
            self.conv.set_math(self.math_for(&choice.perf))?;
            if let Some(workspace) = workspace(self.backend, choice.workspace)? {
                return self.execute(choice.perf.algo, &workspace);
            }
            // Its workspace does not fit now: search again for this call,
            // keeping the remembered choice for later ones.
            return self.search(&key, false);
        }
        self.search(&key, true)
    }

    /// Tries the candidates in order, remembering the one that ran when
    /// `remember_it`.
    fn search(&self, key: &Key, remember_it: bool) -> Result<(), Failure> {
        let candidates = self.candidates(key)?;
        let mut skipped = Vec::new();
        for perf in candidates {
            self.conv.set_math(self.math_for(&perf))?;
            let bytes = match self.workspace_size(perf.algo) {
                Ok(bytes) => bytes,
                Err(Failure::NotSupported(why)) => {
                    skipped.push(format!("algorithm {}: {why}", perf.algo));
                    continue;
                }
                Err(e) => return Err(e),
            };
            let Some(workspace) = workspace(self.backend, bytes)? else {
                skipped.push(format!("algorithm {}: {bytes} bytes of workspace do not fit", perf.algo));
                continue;
            };
            match self.execute(perf.algo, &workspace) {
                Ok(()) => {
                    if remember_it {
                        remember(key.clone(), Choice { perf, workspace: bytes });
                    }
                    return Ok(());
                }
                Err(Failure::NotSupported(why)) => skipped.push(format!("algorithm {}: {why}", perf.algo)),
                Err(e) => return Err(e),
            }
        }
        Err(Failure::NotSupported(format!("no cuDNN algorithm ran ({})", skipped.join("; "))))
    }
}
