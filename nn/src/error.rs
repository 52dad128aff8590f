//! The error every `brasa-nn` operation returns: a tensor or autograd error,
//! or a problem of its own (a state dict that does not fit the model, a file
//! that cannot be read, a bad configuration, a data worker that failed).

use brasa_autograd::AutogradError;
use brasa_tensor::TensorError;

/// Why an `nn` operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NnError {
    /// A tensor operation failed (shapes, dtypes, devices, out of memory).
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// An autograd operation failed.
    #[error(transparent)]
    Autograd(#[from] AutogradError),
    /// A state dict does not fit the model (missing or unexpected names,
    /// wrong shape or dtype), or an optimizer state does not fit the optimizer.
    #[error("state dict: {0}")]
    StateDict(String),
    /// A file could not be read or written, or its contents are not valid.
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// An invalid argument or configuration.
    #[error("{what}: {message}")]
    Invalid {
        /// The layer, loss, optimizer or function that refused it.
        what: &'static str,
        /// What was wrong, with the values seen.
        message: String,
    },
    /// A data-loading worker failed or panicked.
    #[error("data loader: {0}")]
    Data(String),
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
            _ => None,
        }
    }

    /// An [`NnError::File`] for `path`.
    pub fn file(path: impl AsRef<std::path::Path>, message: impl std::fmt::Display) -> NnError {
        NnError::File { path: path.as_ref().display().to_string(), message: message.to_string() }
    }
}
