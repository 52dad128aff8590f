//! The error every tensor operation returns: what was asked, what came, and why
//! it cannot be done.

use crate::device::Device;
use crate::dtype::{DType, DTypeError};
use crate::layout::LayoutError;
use crate::rng::RngError;
use brasa_alloc::AllocError;
use brasa_kernels::index::IndexError;
use brasa_kernels::scratch::ScratchError;
use brasa_kernels::KernelError;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// Why a tensor operation failed.
///
/// Errors from below keep their structure: a layout, kernel, index or
/// allocator error is this error's [`std::error::Error::source`] (or the
/// error itself, for the transparent variants), so a caller can
/// `downcast_ref` it, and [`brasa_alloc::find_out_of_memory`] finds an
/// out-of-memory report through any chain of brasa errors. Shape, dtype and
/// device problems that many ops share have structured variants
/// ([`TensorError::DTypeMismatch`], [`TensorError::UnsupportedDType`],
/// [`TensorError::DeviceMismatch`], [`TensorError::RankMismatch`],
/// [`TensorError::OpLayout`]); the rest name the op and explain in words.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TensorError {
    /// A shape, stride or dimension problem.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// A dtype name or conversion problem.
    #[error(transparent)]
    DType(#[from] DTypeError),
    /// A random-number request that cannot be met.
    #[error(transparent)]
    Rng(#[from] RngError),
    /// Out of memory (or another allocator failure) on a device.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// An operand has the wrong dtype.
    #[error("{op}: expected dtype {expected}, got {got}")]
    DTypeMismatch {
        /// The operation.
        op: &'static str,
        /// What the operation needs.
        expected: DType,
        /// What it was given.
        got: DType,
    },
    /// The operands live on different devices.
    #[error("{op}: operands are on different devices, {lhs} and {rhs}; move one with .to(&device)")]
    DeviceMismatch {
        /// The operation.
        op: &'static str,
        /// The first operand's device.
        lhs: Device,
        /// The other operand's device.
        rhs: Device,
    },
    /// An operand's dtype is not one the operation supports (an integer
    /// tensor given to a float-only op, say).
    #[error("{op}: needs {needs}, got {dtype}{hint}")]
    UnsupportedDType {
        /// The operation.
        op: &'static str,
        /// The dtype given.
        dtype: DType,
        /// What the operation needs, in words (`"a floating-point tensor"`).
        needs: &'static str,
        /// Advice appended to the message (empty, or `"; convert it with to_dtype first"`).
        hint: &'static str,
    },
    /// An operand has the wrong number of dimensions.
    #[error("{op}: expected a {expected}-d tensor, got shape {got:?}")]
    RankMismatch {
        /// The operation.
        op: &'static str,
        /// The rank the operation needs.
        expected: usize,
        /// The operand's shape.
        got: Vec<usize>,
    },
    /// An operation's operands break a shape or layout rule (shapes that do
    /// not broadcast together, say); the [`LayoutError`] is the source, with
    /// the shapes and the dimension.
    #[error("{op}: {source}")]
    OpLayout {
        /// The operation.
        op: &'static str,
        /// What the layout rules say (boxed: a `LayoutError` is as large
        /// as the rest of the enum, and every `Result<Tensor>` carries it).
        #[source]
        source: ErrorBox<LayoutError>,
    },
    /// An index (in an index or id tensor) outside the dimension it
    /// indexes; the kernel's [`IndexError`] is the source, with the flat
    /// position, the index and the size.
    #[error("{op}: {message}")]
    Index {
        /// The operation.
        op: &'static str,
        /// The bad index, where it sits in the index tensor and what it indexes.
        message: String,
        /// The kernel's error.
        #[source]
        source: IndexError,
    },
    /// A compute kernel refused its operands (indices outside a plane, or
    /// views the operation built wrongly: reported as an error, never a
    /// panic); the [`KernelError`] is the source.
    #[error("{op}: {source}")]
    Kernel {
        /// The operation.
        op: &'static str,
        /// The kernel's error.
        #[source]
        source: KernelError,
    },
    /// A work buffer that an operation sizes from its operands' shapes and
    /// arguments (conv2d's im2col column matrix, a half-precision block
    /// widened to f32, the offsets of a reduction's rows, ...) cannot be
    /// allocated: more bytes than a buffer can address, or more than the
    /// host's heap gives. These buffers come from the host heap, not the
    /// caching allocator, so this is not an [`TensorError::Alloc`] report;
    /// the [`ScratchError`] is the source (where a kernel refused the
    /// buffer, the one its [`KernelError::Scratch`] held).
    #[error("{op}: {source}")]
    ScratchTooLarge {
        /// The operation.
        op: &'static str,
        /// The buffer's size (`source.bytes()`) and why it could not be had.
        #[source]
        source: ScratchError,
    },
    /// Shapes that do not fit together.
    #[error("{op}: {message}")]
    Shape {
        /// The operation.
        op: &'static str,
        /// Expected versus given shapes.
        message: String,
    },
    /// A device that does not exist or cannot be used (the reason, naming
    /// the device).
    #[error("{0}")]
    Device(String),
    /// A call into a device's runtime failed: loading kernels, launching
    /// one, a cuBLAS product. The runtime's error is the source.
    #[error("{op}: {what} on {device} failed: {source}")]
    DeviceCall {
        /// The operation.
        op: &'static str,
        /// The device.
        device: Device,
        /// The call that failed (`launching unary_exp_f32`).
        what: String,
        /// The runtime's error (a `cudarc` driver or cuBLAS error).
        #[source]
        source: SharedError,
    },
    /// A shared library (cuDNN, ...) that was looked for and not found or
    /// not loadable: what it is, every place searched (with why each
    /// failed), and the environment variable that points brasa at it.
    #[error(
        "{library} could not be loaded; searched: {}; set {env_var} to the library file or its directory",
        searched.join("; ")
    )]
    LibraryNotFound {
        /// The library (`cuDNN`).
        library: String,
        /// Each place tried, with the loader's reason.
        searched: Vec<String>,
        /// The environment variable naming the library's file or directory.
        env_var: String,
    },
    /// Any other invalid argument.
    #[error("{op}: {message}")]
    Invalid {
        /// The operation.
        op: &'static str,
        /// What was wrong.
        message: String,
    },
    /// A broken internal invariant: a bug in brasa, please report it. An op
    /// built a view outside its storage, a kernel was handed a dtype or an
    /// operand its op should have refused, a device's tensor reached another
    /// device's backend, ... — never a problem with the caller's input (that
    /// is [`TensorError::Invalid`] or one of the structured variants).
    #[error("{op}: internal error: {message} (a bug in brasa, please report it)")]
    Internal {
        /// The operation.
        op: &'static str,
        /// Which invariant broke.
        message: String,
    },
    /// A step run by a memory plan ([`crate::memory::plan`]) failed with an
    /// error other than running out of memory: the step's error is the
    /// source (a value read on the meta device, a shape error, ...).
    #[error("{op}: the step failed on {device} (imitating {target}): {source}")]
    Plan {
        /// The planning call (`memory::plan`, `max_batch_size`).
        op: &'static str,
        /// The meta device the step ran on.
        device: Device,
        /// What the meta device imitated.
        target: String,
        /// The step's error.
        #[source]
        source: SharedError,
    },
    /// A scalar the dtype cannot hold: NaN, an infinity or an out-of-range
    /// value for an integer dtype, a finite value beyond a float dtype's
    /// largest (PyTorch: "value cannot be converted to type uint8_t without
    /// overflow").
    #[error("{op}: value {value} cannot be converted to {dtype} without overflow")]
    ValueOutOfRange {
        /// The operation.
        op: &'static str,
        /// The scalar given.
        value: f64,
        /// The dtype it was to be stored in.
        dtype: DType,
    },
}

impl TensorError {
    pub(crate) fn shape(op: &'static str, message: impl Into<String>) -> Self {
        TensorError::Shape { op, message: message.into() }
    }

    pub(crate) fn invalid(op: &'static str, message: impl Into<String>) -> Self {
        TensorError::Invalid { op, message: message.into() }
    }

    /// A [`TensorError::Internal`]: a broken invariant in `op`, a bug in brasa.
    pub(crate) fn internal(op: &'static str, message: impl Into<String>) -> Self {
        TensorError::Internal { op, message: message.into() }
    }

    /// An [`TensorError::UnsupportedDType`] for a float-only `op` given `dtype`.
    pub(crate) fn not_float(op: &'static str, dtype: DType) -> Self {
        TensorError::UnsupportedDType { op, dtype, needs: "a floating-point tensor", hint: "" }
    }

    /// A [`TensorError::Kernel`] for `op`; a kernel's work buffer that could
    /// not be allocated is a [`TensorError::ScratchTooLarge`] instead.
    pub(crate) fn kernel(op: &'static str, source: KernelError) -> Self {
        match source {
            KernelError::Scratch(source) => TensorError::scratch(op, source),
            source => TensorError::Kernel { op, source },
        }
    }

    /// A [`TensorError::ScratchTooLarge`] for `op`.
    pub(crate) fn scratch(op: &'static str, source: ScratchError) -> Self {
        TensorError::ScratchTooLarge { op, source }
    }

    /// The allocator's out-of-memory report, if this is one: the device's
    /// name and the bytes requested, among others. Every brasa error type has
    /// this method, and [`brasa_alloc::find_out_of_memory`] finds the report
    /// in any error's `source()` chain.
    pub fn as_out_of_memory(&self) -> Option<&brasa_alloc::OutOfMemory> {
        match self {
            TensorError::Alloc(error) => error.as_out_of_memory(),
            _ => None,
        }
    }
}

// Here rather than in device.rs: `TensorError` names devices (`DeviceMismatch`,
// `DeviceCall`, `Plan`), so device.rs sits below this module and only says
// what is wrong with a name (`Device::parse_name`).
impl FromStr for Device {
    type Err = TensorError;

    /// Parses `cpu`, `cpu:3`, `cuda`, `cuda:1`, `meta:2`; anything else is a
    /// [`TensorError::Device`] saying what is wrong.
    fn from_str(text: &str) -> Result<Self> {
        Device::parse_name(text).map_err(TensorError::Device)
    }
}

/// `Result` with [`TensorError`].
pub type Result<T> = std::result::Result<T, TensorError>;

/// An error of any type, shared behind an `Arc` so that the error holding it
/// stays `Clone`: the `#[source]` field of brasa errors that keep a foreign
/// error (an I/O, safetensors or MPI failure, an error from a crate above).
///
/// Unlike an `Arc<dyn Error>` field, whose `source()` would be the `Arc`
/// itself (which `downcast_ref` cannot see through), this one hands the
/// shared error itself to a walk of the [`std::error::Error::source`] chain,
/// so `source().and_then(|e| e.downcast_ref::<std::io::Error>())` finds it.
///
/// ```
/// # use brasa_tensor::SharedError;
/// let shared = SharedError::new(std::io::Error::other("disk gone"));
/// assert_eq!(shared.to_string(), "disk gone");
/// assert!(shared.downcast_ref::<std::io::Error>().is_some());
/// ```
#[derive(Clone)]
pub struct SharedError(Arc<dyn std::error::Error + Send + Sync + 'static>);

impl SharedError {
    /// Shares `error`.
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> SharedError {
        SharedError(Arc::new(error))
    }

    /// Shares an error already behind an `Arc`.
    pub fn from_arc(error: Arc<dyn std::error::Error + Send + Sync + 'static>) -> SharedError {
        SharedError(error)
    }

    /// The shared error, if it is an `E`.
    pub fn downcast_ref<E: std::error::Error + 'static>(&self) -> Option<&E> {
        self.0.downcast_ref::<E>()
    }

    /// The shared error as a trait object (what a `source()` walk starts from).
    pub fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }

    /// The `Arc` holding the error.
    pub fn as_arc(&self) -> &Arc<dyn std::error::Error + Send + Sync + 'static> {
        &self.0
    }
}

impl std::ops::Deref for SharedError {
    type Target = dyn std::error::Error + Send + Sync + 'static;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl fmt::Debug for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

/// A boxed error of a known type, for a `#[source]` field that would
/// otherwise make its enum recursive (a `brasa_parallel::ParallelError`
/// inside another, say).
///
/// Unlike a `Box<E>` field, whose `source()` would be the `Box` itself
/// (which `downcast_ref::<E>` does not see through), this one hands the `E`
/// to a walk of the [`std::error::Error::source`] chain. It dereferences to
/// the `E`.
///
/// ```
/// # use brasa_tensor::ErrorBox;
/// let boxed = ErrorBox::new(std::io::Error::other("disk gone"));
/// assert_eq!(boxed.kind(), std::io::ErrorKind::Other);
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct ErrorBox<E>(Box<E>);

impl<E> ErrorBox<E> {
    /// Boxes `error`.
    pub fn new(error: E) -> ErrorBox<E> {
        ErrorBox(Box::new(error))
    }

    /// The error, unboxed.
    pub fn into_inner(self) -> E {
        *self.0
    }
}

impl<E> From<E> for ErrorBox<E> {
    fn from(error: E) -> ErrorBox<E> {
        ErrorBox::new(error)
    }
}

impl<E> std::ops::Deref for ErrorBox<E> {
    type Target = E;

    fn deref(&self) -> &E {
        &self.0
    }
}

impl<E> AsRef<E> for ErrorBox<E> {
    fn as_ref(&self) -> &E {
        &self.0
    }
}

impl<E: fmt::Debug> fmt::Debug for ErrorBox<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl<E: fmt::Display> fmt::Display for ErrorBox<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}
