//! cuDNN settings, PyTorch's `torch.backends.cudnn`: whether CUDA
//! convolutions use cuDNN ([`set_enabled`]), whether they search for the
//! fastest algorithm per shape ([`set_benchmark`]), and whether they keep to
//! bit-reproducible algorithms ([`set_deterministic`]).
//!
//! With the `cuda` feature, 2-d convolutions on CUDA devices (and the 1-d and
//! transposed ones, which are built on them) run on cuDNN when its library
//! is found at run time (`libcudnn.so.9`: `$BRASA_CUDNN_PATH` alone when
//! set, else a Python wheel's `nvidia/cudnn/lib` (the copy PyTorch loads),
//! the system loader, `$CUDA_HOME/lib64`; see
//! [`crate::cuda_library::load_shared_library`]). Without it, or when cuDNN
//! does not support a configuration, they use brasa's own `im2col` kernels
//! and cuBLAS, and the first convolution that could not use cuDNN says so
//! in one line on stderr.
//!
//! - f32 runs without TF32 (`CUDNN_FMA_MATH`): results match the host's to
//!   about 1e-5 relative. f16 and bf16 accumulate in f32 on tensor cores.
//! - NCHW-contiguous and channels-last ([`crate::Tensor::to_channels_last`])
//!   tensors go in as they lie; the output keeps the input's memory format
//!   (the weight gradient too: autograd then lays a weight's `.grad` out as
//!   the weight). A convolution runs channels-last when its input or its
//!   weight is, so a row-major weight under channels-last batches is copied
//!   on every call: convert the model too (`ModuleExt::to_channels_last` in
//!   `brasa-nn`). Other strides are copied to a dense layout first.
//! - Workspaces come from the device's caching allocator on the current
//!   stream, counted as [`crate::memory::MemoryCategory::Temporary`].
//! - In benchmark mode the first convolution of each configuration (device,
//!   dtype, shapes, memory format, stride, padding, dilation, groups,
//!   direction, determinism) times cuDNN's algorithms and remembers the
//!   fastest for the rest of the process; otherwise cuDNN's heuristics pick,
//!   once per configuration too (their choice is remembered, so later calls
//!   ask cuDNN nothing but the convolution itself).
//!
//! - [`set_graph_api`] (or `BRASA_CUDNN_API=graph`) sends them through
//!   cuDNN's graph API instead of the legacy one: a plan per configuration,
//!   chosen once and kept, then one call per convolution.
//!
//! Every setting is process-wide, as PyTorch's are; without the `cuda`
//! feature they are kept but change nothing, [`is_available`] is false and
//! [`version`] is `None`.
//!
//! ```
//! use brasa_tensor::cudnn;
//!
//! cudnn::set_benchmark(true);          // time the algorithms once per shape
//! cudnn::set_deterministic(true);      // bit-identical gradients run to run
//! assert!(cudnn::benchmark() && cudnn::deterministic());
//! if let Some(v) = cudnn::version() {
//!     println!("cuDNN {}.{}.{}", v / 10000, v / 100 % 100, v % 100);
//! }
//! cudnn::set_benchmark(false);
//! cudnn::set_deterministic(false);
//! ```

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// The environment variable choosing cuDNN's API: `graph` or `legacy`.
pub const CUDNN_API_ENV: &str = "BRASA_CUDNN_API";

static ENABLED: AtomicBool = AtomicBool::new(true);
/// 0 until read from [`CUDNN_API_ENV`], then 1 (legacy) or 2 (graph).
static GRAPH_API: AtomicU8 = AtomicU8::new(0);
static BENCHMARK: AtomicBool = AtomicBool::new(false);
static DETERMINISTIC: AtomicBool = AtomicBool::new(false);

/// Uses cuDNN for CUDA convolutions when it is available (`true`, the
/// default), or always brasa's `im2col` kernels (`false`).
pub fn set_enabled(enabled: bool) {
    ENABLED.store(enabled, Ordering::Relaxed);
}

/// Whether CUDA convolutions may use cuDNN ([`set_enabled`]).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Times cuDNN's algorithms on the first convolution of each configuration
/// and keeps the fastest (PyTorch's `cudnn.benchmark`; off by default, when
/// cuDNN's heuristics choose without running anything).
pub fn set_benchmark(benchmark: bool) {
    BENCHMARK.store(benchmark, Ordering::Relaxed);
}

/// Whether benchmark mode is on ([`set_benchmark`]).
pub fn benchmark() -> bool {
    BENCHMARK.load(Ordering::Relaxed)
}

/// Keeps convolutions to algorithms whose results are bit-identical from
/// run to run (PyTorch's `cudnn.deterministic`): the gradients avoid
/// algorithms that add with atomics (`CUDNN_CONVOLUTION_BWD_DATA_ALGO_1` and
/// `CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1` first). Off by default.
pub fn set_deterministic(deterministic: bool) {
    DETERMINISTIC.store(deterministic, Ordering::Relaxed);
}

/// Whether deterministic mode is on ([`set_deterministic`]).
pub fn deterministic() -> bool {
    DETERMINISTIC.load(Ordering::Relaxed)
}

/// Sends convolutions through cuDNN's graph API (`true`: an execution plan
/// built once per configuration and kept, then one `cudnnBackendExecute`
/// per call, as PyTorch's default "v8 API") or its legacy API (`false`,
/// the default: `cudnnConvolutionForward` and the like, given their
/// descriptors on every call). A configuration the graph API cannot plan
/// runs on the legacy API. The default comes from `BRASA_CUDNN_API`
/// (`graph` or `legacy`) when set; the legacy API stays the default until
/// the graph path has been measured on a GPU.
pub fn set_graph_api(graph: bool) {
    GRAPH_API.store(if graph { 2 } else { 1 }, Ordering::Relaxed);
}

/// Whether convolutions go through cuDNN's graph API ([`set_graph_api`]).
pub fn graph_api() -> bool {
    match GRAPH_API.load(Ordering::Relaxed) {
        0 => {
            let graph = match std::env::var(CUDNN_API_ENV) {
                Ok(value) if value.eq_ignore_ascii_case("graph") => true,
                Ok(value) if value.eq_ignore_ascii_case("legacy") || value.is_empty() => false,
                Ok(value) => {
                    eprintln!("brasa: {CUDNN_API_ENV}={value:?} is neither `graph` nor `legacy`; using the legacy API");
                    false
                }
                Err(_) => false,
            };
            // A concurrent `set_graph_api` wins over the environment.
            let _ = GRAPH_API.compare_exchange(0, if graph { 2 } else { 1 }, Ordering::Relaxed, Ordering::Relaxed);
            GRAPH_API.load(Ordering::Relaxed) == 2
        }
        state => state == 2,
    }
}

/// Whether cuDNN's library can be loaded (tried once, at the first call
/// that needs it); always false without the `cuda` feature.
pub fn is_available() -> bool {
    version().is_some()
}

/// cuDNN's version as `cudnnGetVersion` reports it (`91900` for 9.19.0), or
/// `None` when the library cannot be loaded or the `cuda` feature is off.
pub fn version() -> Option<usize> {
    #[cfg(feature = "cuda")]
    {
        crate::backend::cuda::cudnn_version()
    }
    #[cfg(not(feature = "cuda"))]
    {
        None
    }
}

/// Why cuDNN cannot be loaded: the error that lists every place searched,
/// or `None` when it loads (or the `cuda` feature is off, when it is never
/// looked for).
pub fn load_error() -> Option<crate::TensorError> {
    #[cfg(feature = "cuda")]
    {
        crate::backend::cuda::cudnn_load_error()
    }
    #[cfg(not(feature = "cuda"))]
    {
        None
    }
}

/// How many algorithm choices are remembered so far (one per configuration,
/// direction and mode: heuristics' and benchmark mode's); for tests and
/// diagnostics.
#[doc(hidden)]
pub fn cached_algorithm_count() -> usize {
    #[cfg(feature = "cuda")]
    {
        crate::backend::cuda::cudnn_cached_algorithm_count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

/// How many execution plans the graph API keeps so far (one per
/// configuration and direction it planned, [`set_graph_api`]); for tests
/// and diagnostics.
#[doc(hidden)]
pub fn cached_graph_plan_count() -> usize {
    #[cfg(feature = "cuda")]
    {
        crate::backend::cuda::cudnn_cached_graph_plan_count()
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip() {
        // The settings are process-wide: restore them for the other tests.
        let (e, b, d, g) = (enabled(), benchmark(), deterministic(), graph_api());
        set_enabled(false);
        set_benchmark(true);
        set_deterministic(true);
        set_graph_api(!g);
        assert!(!enabled() && benchmark() && deterministic() && graph_api() != g);
        set_enabled(e);
        set_benchmark(b);
        set_deterministic(d);
        set_graph_api(g);
        assert_eq!((enabled(), benchmark(), deterministic(), graph_api()), (e, b, d, g));
    }

    #[test]
    fn availability_version_and_load_error_agree() {
        // cuDNN is present on GPU machines and absent on the others: either
        // way the three answers must tell the same story.
        match version() {
            Some(v) => {
                assert!(is_available());
                assert!(v >= 8000, "cuDNN {v} is older than 8.0");
                assert!(load_error().is_none());
            }
            None => {
                assert!(!is_available());
                assert_eq!((cached_algorithm_count(), cached_graph_plan_count()), (0, 0));
                #[cfg(feature = "cuda")]
                assert!(matches!(load_error(), Some(crate::TensorError::LibraryNotFound { .. })), "{:?}", load_error());
                #[cfg(not(feature = "cuda"))]
                assert!(load_error().is_none());
            }
        }
    }
}
