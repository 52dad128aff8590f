//! The error every `brasa-amp` operation returns: a tensor, autograd or nn
//! error from the operations it runs, or a misuse of its own (a
//! [`crate::GradScaler`] called out of order, FP16 gradients to unscale, a
//! configuration or state dict that does not fit).

use crate::stage::OptimizerStage;
use brasa_autograd::AutogradError;
use brasa_nn::NnError;
use brasa_tensor::{ErrorBox, TensorError};

/// Why a mixed-precision operation failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum AmpError {
    /// A tensor operation failed (shapes, dtypes, devices, out of memory).
    #[error(transparent)]
    Tensor(#[from] TensorError),
    /// An autograd operation failed.
    #[error(transparent)]
    Autograd(#[from] AutogradError),
    /// A layer, loss or optimizer failed.
    #[error(transparent)]
    Nn(#[from] NnError),
    /// A [`crate::GradScaler`] method was called in an order PyTorch's
    /// `GradScaler` refuses too (per optimizer: `READY → UNSCALED →
    /// STEPPED`, back to `READY` at `update()`).
    #[error("GradScaler::{call}: {message} (this optimizer is {stage})")]
    ScalerOrder {
        /// The method that refused (`unscale_`, `step`, `update`).
        call: &'static str,
        /// What was wrong, in PyTorch's words.
        message: &'static str,
        /// The optimizer's stage when it was called.
        stage: OptimizerStage,
    },
    /// `unscale_` found an f16 gradient: unscaled f16 gradients lose the
    /// small values loss scaling exists to keep. Train f16 models with f32
    /// master weights ([`crate::to_half`]).
    #[error(
        "GradScaler::unscale_: attempting to unscale FP16 gradients (parameter {index} of the optimizer); \
         keep f32 master weights (brasa_amp::to_half) and give those to the optimizer"
    )]
    Fp16Gradients {
        /// The parameter's index in the optimizer.
        index: usize,
    },
    /// An invalid argument or configuration.
    #[error("{what}: {message}")]
    Invalid {
        /// The function or type that refused it.
        what: &'static str,
        /// What was wrong, with the values seen.
        message: String,
    },
    /// A [`crate::GradScaler`] state dict that does not fit (missing entry,
    /// wrong value, empty dict from a disabled scaler).
    #[error("GradScaler state dict: {0}")]
    StateDict(String),
    /// A [`crate::GradScaler`] state dict whose values the scaler's own
    /// checks refuse (a growth factor below 1, a scale that is not finite);
    /// the refusal is the source.
    #[error("GradScaler state dict: {source}")]
    StateDictValue {
        /// The check that refused a value.
        #[source]
        source: ErrorBox<AmpError>,
    },
}

/// `Result` with [`AmpError`].
pub type Result<T> = std::result::Result<T, AmpError>;

impl AmpError {
    /// The allocator's out-of-memory report, if this error is (or wraps) an
    /// out of memory from the tensor, autograd or nn operations it ran.
    pub fn as_out_of_memory(&self) -> Option<&brasa_alloc::OutOfMemory> {
        match self {
            AmpError::Tensor(error) => error.as_out_of_memory(),
            AmpError::Autograd(error) => error.as_out_of_memory(),
            AmpError::Nn(error) => error.as_out_of_memory(),
            AmpError::StateDictValue { source } => source.as_out_of_memory(),
            _ => None,
        }
    }

    /// An [`AmpError::Invalid`] for `what`.
    pub fn invalid(what: &'static str, message: impl Into<String>) -> AmpError {
        AmpError::Invalid { what, message: message.into() }
    }
}

/// A `brasa-amp` error inside an optimizer or another `brasa-nn` API:
/// tensor, autograd and nn errors keep their kind, misuses become
/// [`NnError::External`] with the `AmpError` whole as the source.
impl From<AmpError> for NnError {
    fn from(error: AmpError) -> NnError {
        match error {
            AmpError::Tensor(e) => NnError::Tensor(e),
            AmpError::Autograd(e) => NnError::Autograd(e),
            AmpError::Nn(e) => e,
            other => NnError::external(other),
        }
    }
}
