//! The error every autograd operation returns: a tensor error, or a problem
//! with the graph itself (released, modified in place, nothing to
//! differentiate, a checkpoint that recomputed something else).

use brasa_tensor::{DType, Device, SharedError, TensorError};

/// Why an autograd operation failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum AutogradError {
    /// A tensor operation failed (shapes, dtypes, devices, out of memory).
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// Backward reached a node whose saved tensors were already released.
    #[error(
        "trying to backward through the graph a second time: the tensors saved by {op} were released after the \
         first backward; call backward_opts(None, true) (retain_graph) on the first call if you need to run \
         backward twice, or recompute the forward pass"
    )]
    GraphReleased {
        /// The operation whose node was released.
        op: &'static str,
    },
    /// A tensor saved for backward was changed in place after it was saved.
    #[error(
        "a tensor saved by {op} was modified in place after it was saved (version {version}, expected {expected}); \
         clone it before modifying, or modify it only after backward has run"
    )]
    ModifiedInPlace {
        /// The operation that saved the tensor.
        op: &'static str,
        /// The storage's version now.
        version: u64,
        /// The version at save time.
        expected: u64,
    },
    /// Backward from something that does not require grad.
    #[error("{0}")]
    NoGraph(String),
    /// A checkpointed function recomputed a different result.
    #[error("checkpoint: recomputation does not match the forward pass: {0}")]
    CheckpointMismatch(String),
    /// Finite differences and backward disagree.
    #[error(
        "gradcheck: gradient of input {input} at flat index {index} is {analytic} by backward but {numeric} by \
         finite differences"
    )]
    GradcheckFailed {
        /// Which input.
        input: usize,
        /// Which element (row-major).
        index: usize,
        /// The value backward gave.
        analytic: f64,
        /// The finite-difference estimate.
        numeric: f64,
    },
    /// A hook or a queued callback written in another crate failed with an
    /// error of its own (a data-parallel all-reduce that timed out, say);
    /// `std::error::Error::source` gives it back for downcasting.
    #[error("{0}")]
    External(#[source] SharedError),
    /// `requires_grad` asked of a tensor that cannot have a gradient
    /// (PyTorch: "only Tensors of floating point dtype can require gradients").
    #[error("{op}: only tensors of floating-point dtype can require gradients, got {dtype}")]
    RequiresGradDtype {
        /// The call that refused it.
        op: &'static str,
        /// The tensor's dtype.
        dtype: DType,
    },
    /// A gradient whose shape is not the shape of the tensor it is for
    /// (a hook that returned another shape, `set_grad` with another shape).
    #[error("{op}: {context} a gradient of shape {got:?} for a tensor of shape {expected:?}")]
    GradShape {
        /// The operation or call that saw it.
        op: &'static str,
        /// Where the gradient came from ("the hook returned", "was given").
        context: &'static str,
        /// The gradient's shape.
        got: Vec<usize>,
        /// The tensor's shape.
        expected: Vec<usize>,
    },
    /// A gradient on another device than the tensor it is for.
    #[error("{op}: {context} a gradient on {got} for a tensor on {expected}")]
    GradDevice {
        /// The operation or call that saw it.
        op: &'static str,
        /// Where the gradient came from.
        context: &'static str,
        /// The gradient's device.
        got: Device,
        /// The tensor's device.
        expected: Device,
    },
    /// A gradient of another dtype than the tensor it is for, where it is
    /// not converted (PyTorch refuses it in `.grad =` and from hooks).
    #[error("{op}: {context} a gradient of dtype {got} for a tensor of dtype {expected}")]
    GradDtype {
        /// The operation or call that saw it.
        op: &'static str,
        /// Where the gradient came from.
        context: &'static str,
        /// The gradient's dtype.
        got: DType,
        /// The tensor's dtype.
        expected: DType,
    },
    /// A saved-tensor hook failed (see [`crate::saved_tensors_hooks`]): its
    /// own error, or an unpack that gave back another shape, dtype or
    /// device than the saved tensor's.
    #[error("{op}: the saved-tensor {stage} hook failed: {source}")]
    SavedTensorHook {
        /// The operation that saved the tensor.
        op: &'static str,
        /// Which hook.
        stage: SavedTensorHookStage,
        /// Why.
        source: Box<AutogradError>,
    },
    /// Any other invalid argument.
    #[error("{op}: {message}")]
    Invalid {
        /// The operation.
        op: &'static str,
        /// What was wrong.
        message: String,
    },
}

impl AutogradError {
    /// An [`AutogradError::External`] carrying `error` with its structure.
    pub fn external(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        AutogradError::External(SharedError::new(error))
    }

    /// The allocator's out-of-memory report, if this error is (or wraps) an
    /// out of memory: from a tensor operation, or from an error of another
    /// crate carried by [`AutogradError::External`] (a data-parallel hook's
    /// error, say), found through its `source()` chain with
    /// [`brasa_alloc::find_out_of_memory`]. Gives the device and the bytes
    /// requested; see `examples/oom_recovery.rs` of the `brasa` crate for
    /// "empty the cache, halve the batch, retry".
    pub fn as_out_of_memory(&self) -> Option<&brasa_alloc::OutOfMemory> {
        match self {
            AutogradError::Tensor(error) => error.as_out_of_memory(),
            AutogradError::External(inner) => brasa_alloc::find_out_of_memory(inner.as_error()),
            // Offloading hooks allocate: host memory when packing, device
            // memory when unpacking.
            AutogradError::SavedTensorHook { source, .. } => source.as_out_of_memory(),
            _ => None,
        }
    }

    /// The error inside an [`AutogradError::External`], if it is an `E`.
    pub fn downcast_external<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            AutogradError::External(inner) => inner.downcast_ref::<E>(),
            _ => None,
        }
    }

    /// An [`AutogradError::Invalid`] for `op` (for custom [`crate::Function`]s too).
    pub fn invalid(op: &'static str, message: impl Into<String>) -> Self {
        AutogradError::Invalid { op, message: message.into() }
    }
}

/// Which saved-tensor hook an [`AutogradError::SavedTensorHook`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SavedTensorHookStage {
    /// `pack`, when the operation saved the tensor (forward).
    Pack,
    /// `unpack`, when backward needed it back.
    Unpack,
}

impl std::fmt::Display for SavedTensorHookStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SavedTensorHookStage::Pack => "pack",
            SavedTensorHookStage::Unpack => "unpack",
        })
    }
}

/// `Result` with [`AutogradError`].
pub type Result<T> = std::result::Result<T, AutogradError>;
