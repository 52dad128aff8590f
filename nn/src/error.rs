//! The error every `brasa-nn` operation returns: a tensor or autograd error,
//! or a problem of its own (a state dict that does not fit the model, a file
//! that cannot be read, a bad configuration, a data worker that failed).

use brasa_autograd::AutogradError;
use brasa_tensor::{SharedError, TensorError};

/// Why an `nn` operation failed.
///
/// The error from below is kept whole: tensor and autograd errors as they
/// are, and foreign ones (an I/O error, a safetensors error, an error of a
/// crate above such as `brasa-amp`) as the [`std::error::Error::source`] of
/// [`NnError::File`], [`NnError::Safetensors`], [`NnError::Io`] and
/// [`NnError::External`], where `downcast_ref` finds them.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum NnError {
    /// A tensor operation failed (shapes, dtypes, devices, out of memory).
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// An autograd operation failed.
    #[error(transparent)]
    Autograd(#[from] AutogradError),
    /// A state dict does not fit the model (missing or unexpected names,
    /// wrong shape or dtype), or an optimizer state does not fit the
    /// optimizer (what is wrong, with the names and values seen).
    #[error("state dict: {0}")]
    StateDict(String),
    /// Encoding or decoding safetensors failed; the safetensors error
    /// (`safetensors::SafeTensorError`) is the source.
    #[error("state dict: {context}: {source}")]
    Safetensors {
        /// What was being done (`"not valid safetensors"`, `"encoding"`, a tensor's name).
        context: String,
        /// The safetensors error.
        #[source]
        source: SharedError,
    },
    /// A file could not be read or written, or its contents are not valid.
    /// When a lower error says why (an I/O error, a decoding error), it is
    /// the source.
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: String,
        /// What went wrong (with the source's text, when there is a source).
        message: String,
        /// The error that made it fail, if one did.
        #[source]
        source: Option<SharedError>,
    },
    /// An invalid argument or configuration.
    #[error("{what}: {message}")]
    Invalid {
        /// The layer, loss, optimizer or function that refused it.
        what: &'static str,
        /// What was wrong, with the values seen.
        message: String,
    },
    /// A data-loading worker failed or panicked (what happened).
    #[error("data loader: {0}")]
    Data(String),
    /// A system call failed (a thread that could not be started, say); the
    /// [`std::io::Error`] is the source.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The I/O error.
        #[source]
        source: SharedError,
    },
    /// [`AutoMicroBatch`](crate::optim::AutoMicroBatch) could not finish
    /// a step: out of memory with one row per micro-batch (that error is
    /// the source), another rank's failure, or a rank with fewer rows than
    /// the micro-batches the ranks agreed on.
    #[error("automatic micro-batching: {message}")]
    MicroBatch {
        /// What happened, with the split.
        message: String,
        /// The error this rank met, if it met one.
        #[source]
        source: Option<Box<NnError>>,
    },
    /// An error of a crate above this one, met inside an `nn` API (a
    /// `brasa-amp` misuse inside an optimizer step, say); the error is the
    /// source, whole.
    #[error("{0}")]
    External(#[source] SharedError),
}

/// `Result` with [`NnError`].
pub type Result<T> = std::result::Result<T, NnError>;

impl NnError {
    /// An [`NnError::Invalid`] for `what`.
    pub fn invalid(what: &'static str, message: impl Into<String>) -> NnError {
        NnError::Invalid { what, message: message.into() }
    }

    /// The allocator's out-of-memory report, if this error is (or wraps) an
    /// out of memory: from a tensor or autograd operation a layer, loss or
    /// optimizer ran (see [`AutogradError::as_out_of_memory`]).
    pub fn as_out_of_memory(&self) -> Option<&brasa_alloc::OutOfMemory> {
        match self {
            NnError::Tensor(error) => error.as_out_of_memory(),
            NnError::Autograd(error) => error.as_out_of_memory(),
            NnError::MicroBatch { source: Some(inner), .. } => inner.as_out_of_memory(),
            NnError::External(inner) | NnError::File { source: Some(inner), .. } => {
                brasa_alloc::find_out_of_memory(inner.as_error())
            }
            _ => None,
        }
    }

    /// An [`NnError::File`] for `path` with no lower error: the contents are
    /// not valid, say.
    pub fn file(path: impl AsRef<std::path::Path>, message: impl std::fmt::Display) -> NnError {
        NnError::File { path: path.as_ref().display().to_string(), message: message.to_string(), source: None }
    }

    /// An [`NnError::File`] for `path` that failed with `source` (an I/O
    /// error, a decoding error), kept as the source. The message is
    /// `"{context}: {source}"`, or the source's text when `context` is empty.
    pub fn file_error(
        path: impl AsRef<std::path::Path>,
        context: &str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> NnError {
        let message = if context.is_empty() { source.to_string() } else { format!("{context}: {source}") };
        NnError::File { path: path.as_ref().display().to_string(), message, source: Some(SharedError::new(source)) }
    }

    /// An [`NnError::Safetensors`] with `context`.
    pub(crate) fn safetensors(context: impl Into<String>, source: safetensors::SafeTensorError) -> NnError {
        NnError::Safetensors { context: context.into(), source: SharedError::new(source) }
    }

    /// An [`NnError::External`] carrying `error` whole.
    pub fn external(error: impl std::error::Error + Send + Sync + 'static) -> NnError {
        NnError::External(SharedError::new(error))
    }
}
