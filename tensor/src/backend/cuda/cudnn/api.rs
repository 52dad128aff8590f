//! cuDNN's legacy convolution API and its graph API, resolved from the
//! library at run time into a table of function pointers ([`Api`]), once
//! per process.
//!
//! cudarc's own cuDNN loader panics when the library is missing and only
//! tries names built from the CUDA version, so the library is found by
//! [`crate::cuda_library::load_shared_library`] and only cudarc's *types*
//! (handles, descriptors, the enums brasa passes in) are used. What cuDNN
//! hands back (statuses, algorithm numbers in its performance records) is
//! read as plain integers: a Rust enum holding a value a newer cuDNN added
//! would be undefined behaviour.
//!
//! A machine may hold cuDNN twice (a system copy and the one in PyTorch's
//! wheel, `nvidia/cudnn/lib`); the wheel's is tried first, so brasa runs
//! the cuDNN PyTorch runs: on an H200 the same convolutions ran 0.36×
//! PyTorch's speed on the system's cuDNN 9.14 and 0.54× on the wheel's 9.19
//! (2026-11-28). Choosing by version instead would mean loading both, and
//! cuDNN 9 loads its sub-libraries by name, so the first copy's would stay
//! and be handed to the second.

use crate::cuda_library::{load_shared_library, SharedLibrary};
use crate::error::{Result, TensorError};
use cudarc::cudnn::sys::{
    cudaStream_t, cudnnConvolutionDescriptor_t, cudnnConvolutionMode_t, cudnnDataType_t, cudnnFilterDescriptor_t,
    cudnnHandle_t, cudnnMathType_t, cudnnTensorDescriptor_t, cudnnTensorFormat_t,
};
use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

/// The environment variable naming cuDNN's library file or its directory.
pub(crate) const CUDNN_PATH_ENV: &str = "BRASA_CUDNN_PATH";

/// A `cudnnStatus_t` as returned (0 is `CUDNN_STATUS_SUCCESS`).
pub(crate) type Status = u32;

pub(crate) const STATUS_SUCCESS: Status = 0;
/// `CUDNN_STATUS_NOT_SUPPORTED` (cuDNN 9 numbers statuses by category: 3000).
pub(crate) const STATUS_NOT_SUPPORTED: Status = 3000;
/// cuDNN 8's `CUDNN_STATUS_NOT_SUPPORTED`.
const STATUS_NOT_SUPPORTED_V8: Status = 9;

/// Whether `status` says the configuration is not supported (as opposed to
/// a failure): cuDNN 9 also reports sub-codes of 3000 (3001, 3002, ...).
pub(crate) fn is_not_supported(status: Status) -> bool {
    status == STATUS_NOT_SUPPORTED_V8 || (STATUS_NOT_SUPPORTED..STATUS_NOT_SUPPORTED + 1000).contains(&status)
}

/// One algorithm's record from `cudnnGet*Algorithm_v7` or `cudnnFind*Ex`
/// (`cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t`, which share this
/// layout), with the enums as integers.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct AlgoPerf {
    pub algo: u32,
    pub status: Status,
    pub time: f32,
    pub memory: usize,
    pub determinism: u32,
    pub math_type: u32,
    pub reserved: [c_int; 3],
}

/// `CUDNN_DETERMINISTIC`.
pub(crate) const DETERMINISTIC: u32 = 1;

type Create<T> = unsafe extern "C" fn(*mut T) -> Status;
type Destroy<T> = unsafe extern "C" fn(T) -> Status;
type T = cudnnTensorDescriptor_t;
type F = cudnnFilterDescriptor_t;
type C = cudnnConvolutionDescriptor_t;
type H = cudnnHandle_t;

/// The cuDNN functions brasa calls, resolved from the loaded library (which
/// this table keeps loaded). Signatures as in `cudnn_graph.h` and
/// `cudnn_cnn.h` of cuDNN 9 (unchanged since cuDNN 7).
pub(crate) struct Api {
    pub library: SharedLibrary,
    pub version: usize,
    pub get_version: unsafe extern "C" fn() -> usize,
    pub get_error_string: unsafe extern "C" fn(Status) -> *const c_char,
    pub create: Create<H>,
    pub set_stream: unsafe extern "C" fn(H, cudaStream_t) -> Status,
    pub create_tensor: Create<T>,
    pub destroy_tensor: Destroy<T>,
    pub set_tensor_nd: unsafe extern "C" fn(T, cudnnDataType_t, c_int, *const c_int, *const c_int) -> Status,
    pub create_filter: Create<F>,
    pub destroy_filter: Destroy<F>,
    pub set_filter_4d:
        unsafe extern "C" fn(F, cudnnDataType_t, cudnnTensorFormat_t, c_int, c_int, c_int, c_int) -> Status,
    pub create_conv: Create<C>,
    pub destroy_conv: Destroy<C>,
    #[allow(clippy::type_complexity)]
    pub set_conv_2d: unsafe extern "C" fn(
        C,
        c_int,
        c_int,
        c_int,
        c_int,
        c_int,
        c_int,
        cudnnConvolutionMode_t,
        cudnnDataType_t,
    ) -> Status,
    pub set_conv_group_count: unsafe extern "C" fn(C, c_int) -> Status,
    pub set_conv_math_type: unsafe extern "C" fn(C, cudnnMathType_t) -> Status,
    pub get_conv_2d_forward_output_dim:
        unsafe extern "C" fn(C, T, F, *mut c_int, *mut c_int, *mut c_int, *mut c_int) -> Status,
    pub get_forward_algorithm_v7: unsafe extern "C" fn(H, T, F, C, T, c_int, *mut c_int, *mut AlgoPerf) -> Status,
    pub get_backward_data_algorithm_v7: unsafe extern "C" fn(H, F, T, C, T, c_int, *mut c_int, *mut AlgoPerf) -> Status,
    pub get_backward_filter_algorithm_v7:
        unsafe extern "C" fn(H, T, T, C, F, c_int, *mut c_int, *mut AlgoPerf) -> Status,
    #[allow(clippy::type_complexity)]
    pub find_forward_algorithm_ex: unsafe extern "C" fn(
        H,
        T,
        *const c_void,
        F,
        *const c_void,
        C,
        T,
        *mut c_void,
        c_int,
        *mut c_int,
        *mut AlgoPerf,
        *mut c_void,
        usize,
    ) -> Status,
    #[allow(clippy::type_complexity)]
    pub find_backward_data_algorithm_ex: unsafe extern "C" fn(
        H,
        F,
        *const c_void,
        T,
        *const c_void,
        C,
        T,
        *mut c_void,
        c_int,
        *mut c_int,
        *mut AlgoPerf,
        *mut c_void,
        usize,
    ) -> Status,
    #[allow(clippy::type_complexity)]
    pub find_backward_filter_algorithm_ex: unsafe extern "C" fn(
        H,
        T,
        *const c_void,
        T,
        *const c_void,
        C,
        F,
        *mut c_void,
        c_int,
        *mut c_int,
        *mut AlgoPerf,
        *mut c_void,
        usize,
    ) -> Status,
    pub get_forward_workspace_size: unsafe extern "C" fn(H, T, F, C, T, u32, *mut usize) -> Status,
    pub get_backward_data_workspace_size: unsafe extern "C" fn(H, F, T, C, T, u32, *mut usize) -> Status,
    pub get_backward_filter_workspace_size: unsafe extern "C" fn(H, T, T, C, F, u32, *mut usize) -> Status,
    #[allow(clippy::type_complexity)]
    pub forward: unsafe extern "C" fn(
        H,
        *const c_void,
        T,
        *const c_void,
        F,
        *const c_void,
        C,
        u32,
        *mut c_void,
        usize,
        *const c_void,
        T,
        *mut c_void,
    ) -> Status,
    #[allow(clippy::type_complexity)]
    pub backward_data: unsafe extern "C" fn(
        H,
        *const c_void,
        F,
        *const c_void,
        T,
        *const c_void,
        C,
        u32,
        *mut c_void,
        usize,
        *const c_void,
        T,
        *mut c_void,
    ) -> Status,
    #[allow(clippy::type_complexity)]
    pub backward_filter: unsafe extern "C" fn(
        H,
        *const c_void,
        T,
        *const c_void,
        T,
        *const c_void,
        C,
        u32,
        *mut c_void,
        usize,
        *const c_void,
        F,
        *mut c_void,
    ) -> Status,
    /// The graph (backend) API, when the library has it (cuDNN 8 and 9 do).
    pub graph: Option<GraphFns>,
}

/// An opaque `cudnnBackendDescriptor_t`.
pub(crate) type BackendDescriptor = *mut c_void;

/// cuDNN's graph API (`cudnn_graph.h`): descriptors made, given attributes
/// and finalized, then executed. Its enums (descriptor kinds, attribute
/// names and types) are passed as the `u32`s of `super::backend_descriptor`.
pub(crate) struct GraphFns {
    pub create_descriptor: unsafe extern "C" fn(u32, *mut BackendDescriptor) -> Status,
    pub destroy_descriptor: unsafe extern "C" fn(BackendDescriptor) -> Status,
    pub set_attribute: unsafe extern "C" fn(BackendDescriptor, u32, u32, i64, *const c_void) -> Status,
    pub get_attribute: unsafe extern "C" fn(BackendDescriptor, u32, u32, i64, *mut i64, *mut c_void) -> Status,
    pub finalize: unsafe extern "C" fn(BackendDescriptor) -> Status,
    pub execute: unsafe extern "C" fn(H, BackendDescriptor, BackendDescriptor) -> Status,
}

static API: OnceLock<std::result::Result<Api, TensorError>> = OnceLock::new();

/// The process's cuDNN, loaded at the first call; the load's error (the
/// places searched, or a missing symbol) on every call when it failed.
pub(crate) fn api() -> std::result::Result<&'static Api, &'static TensorError> {
    API.get_or_init(load).as_ref()
}

/// Resolves `name` from `library` as a function pointer of type `P`.
///
/// # Safety
///
/// `P` must be the function's true signature.
unsafe fn symbol<P: Copy>(library: &SharedLibrary, name: &str) -> Result<P> {
    // SAFETY: the caller vouches for the signature; the pointer stays valid
    // while `library` is loaded, and `Api` keeps it loaded as long as it is.
    match unsafe { library.library.get::<P>(name) } {
        Ok(symbol) => Ok(*symbol),
        Err(e) => Err(TensorError::Device(format!(
            "cuDNN at {} has no function {name} ({e}); brasa needs cuDNN 8 or 9",
            library.path.display()
        ))),
    }
}

fn load() -> std::result::Result<Api, TensorError> {
    let library = load_shared_library(
        "cuDNN",
        CUDNN_PATH_ENV,
        &["libcudnn.so.9", "libcudnn.so", "libcudnn.so.8"],
        &["nvidia/cudnn/lib"],
    )?;
    let l = &library;
    // SAFETY: every type below is the C signature of the cuDNN function of
    // that name (cudnn_graph.h, cudnn_cnn.h), with enums passed in as
    // cudarc's `#[repr(u32)]` enums or `u32` and statuses returned as `u32`,
    // which C's `int`-sized enums match.
    let api = unsafe {
        Api {
            get_version: symbol(l, "cudnnGetVersion")?,
            get_error_string: symbol(l, "cudnnGetErrorString")?,
            create: symbol(l, "cudnnCreate")?,
            set_stream: symbol(l, "cudnnSetStream")?,
            create_tensor: symbol(l, "cudnnCreateTensorDescriptor")?,
            destroy_tensor: symbol(l, "cudnnDestroyTensorDescriptor")?,
            set_tensor_nd: symbol(l, "cudnnSetTensorNdDescriptor")?,
            create_filter: symbol(l, "cudnnCreateFilterDescriptor")?,
            destroy_filter: symbol(l, "cudnnDestroyFilterDescriptor")?,
            set_filter_4d: symbol(l, "cudnnSetFilter4dDescriptor")?,
            create_conv: symbol(l, "cudnnCreateConvolutionDescriptor")?,
            destroy_conv: symbol(l, "cudnnDestroyConvolutionDescriptor")?,
            set_conv_2d: symbol(l, "cudnnSetConvolution2dDescriptor")?,
            set_conv_group_count: symbol(l, "cudnnSetConvolutionGroupCount")?,
            set_conv_math_type: symbol(l, "cudnnSetConvolutionMathType")?,
            get_conv_2d_forward_output_dim: symbol(l, "cudnnGetConvolution2dForwardOutputDim")?,
            get_forward_algorithm_v7: symbol(l, "cudnnGetConvolutionForwardAlgorithm_v7")?,
            get_backward_data_algorithm_v7: symbol(l, "cudnnGetConvolutionBackwardDataAlgorithm_v7")?,
            get_backward_filter_algorithm_v7: symbol(l, "cudnnGetConvolutionBackwardFilterAlgorithm_v7")?,
            find_forward_algorithm_ex: symbol(l, "cudnnFindConvolutionForwardAlgorithmEx")?,
            find_backward_data_algorithm_ex: symbol(l, "cudnnFindConvolutionBackwardDataAlgorithmEx")?,
            find_backward_filter_algorithm_ex: symbol(l, "cudnnFindConvolutionBackwardFilterAlgorithmEx")?,
            get_forward_workspace_size: symbol(l, "cudnnGetConvolutionForwardWorkspaceSize")?,
            get_backward_data_workspace_size: symbol(l, "cudnnGetConvolutionBackwardDataWorkspaceSize")?,
            get_backward_filter_workspace_size: symbol(l, "cudnnGetConvolutionBackwardFilterWorkspaceSize")?,
            forward: symbol(l, "cudnnConvolutionForward")?,
            backward_data: symbol(l, "cudnnConvolutionBackwardData")?,
            backward_filter: symbol(l, "cudnnConvolutionBackwardFilter")?,
            graph: load_graph(l),
            version: 0,
            library,
        }
    };
    // SAFETY: `cudnnGetVersion` takes nothing and only reads a constant.
    let version = unsafe { (api.get_version)() };
    if version < 8000 {
        return Err(TensorError::Device(format!(
            "cuDNN at {} is version {version}; brasa needs cuDNN 8 or 9",
            api.library.path.display()
        )));
    }
    Ok(Api { version, ..api })
}

/// The graph API's functions, or `None` if the library lacks one.
fn load_graph(l: &SharedLibrary) -> Option<GraphFns> {
    // SAFETY: each type is the C signature of the function of that name in
    // cudnn_graph.h (enums as `u32`, descriptors and handles as pointers,
    // `int64_t` as `i64`).
    unsafe {
        Some(GraphFns {
            create_descriptor: symbol(l, "cudnnBackendCreateDescriptor").ok()?,
            destroy_descriptor: symbol(l, "cudnnBackendDestroyDescriptor").ok()?,
            set_attribute: symbol(l, "cudnnBackendSetAttribute").ok()?,
            get_attribute: symbol(l, "cudnnBackendGetAttribute").ok()?,
            finalize: symbol(l, "cudnnBackendFinalize").ok()?,
            execute: symbol(l, "cudnnBackendExecute").ok()?,
        })
    }
}

impl Api {
    /// cuDNN's words for `status` (`cudnnGetErrorString`), with its number.
    pub(crate) fn error_string(&self, status: Status) -> String {
        // SAFETY: cudnnGetErrorString returns a static NUL-terminated string
        // for any status (an "unknown" one for values it does not know).
        let text = unsafe {
            let p = (self.get_error_string)(status);
            if p.is_null() {
                String::new()
            } else {
                std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        format!("{text} (status {status})")
    }
}

/// A cuDNN call that failed, as a [`TensorError::DeviceCall`]'s source.
#[derive(Debug, Clone, thiserror::Error)]
#[error("cuDNN: {message}")]
pub(crate) struct CudnnError {
    /// The `cudnnStatus_t`.
    pub status: Status,
    /// `cudnnGetErrorString`'s words, with the number.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::cudnn::sys::{
        cudnnConvolutionBwdDataAlgoPerfStruct, cudnnConvolutionBwdFilterAlgoPerfStruct,
        cudnnConvolutionFwdAlgoPerfStruct,
    };
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn algo_perf_has_the_c_layout() {
        // The same layout as the bindings' three records (cudnn_cnn.h).
        for (size, align) in [
            (size_of::<cudnnConvolutionFwdAlgoPerfStruct>(), align_of::<cudnnConvolutionFwdAlgoPerfStruct>()),
            (size_of::<cudnnConvolutionBwdDataAlgoPerfStruct>(), align_of::<cudnnConvolutionBwdDataAlgoPerfStruct>()),
            (
                size_of::<cudnnConvolutionBwdFilterAlgoPerfStruct>(),
                align_of::<cudnnConvolutionBwdFilterAlgoPerfStruct>(),
            ),
        ] {
            assert_eq!((size_of::<AlgoPerf>(), align_of::<AlgoPerf>()), (size, align));
        }
        assert_eq!(offset_of!(AlgoPerf, memory), offset_of!(cudnnConvolutionFwdAlgoPerfStruct, memory));
        assert_eq!(offset_of!(AlgoPerf, determinism), offset_of!(cudnnConvolutionFwdAlgoPerfStruct, determinism));
        assert_eq!(offset_of!(AlgoPerf, math_type), offset_of!(cudnnConvolutionFwdAlgoPerfStruct, mathType));
    }

    #[test]
    fn not_supported_statuses_are_told_apart_from_failures() {
        assert!(is_not_supported(STATUS_NOT_SUPPORTED));
        assert!(is_not_supported(3002)); // CUDNN_STATUS_NOT_SUPPORTED_SHAPE
        assert!(is_not_supported(9)); // cuDNN 8
        assert!(!is_not_supported(STATUS_SUCCESS));
        assert!(!is_not_supported(2000)); // CUDNN_STATUS_BAD_PARAM
        assert!(!is_not_supported(4000)); // CUDNN_STATUS_INTERNAL_ERROR
    }
}
