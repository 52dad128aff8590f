//! The error every tensor operation returns: what was asked, what came, and why
//! it cannot be done.

use crate::device::Device;
use crate::dtype::{DType, DTypeError};
use crate::layout::LayoutError;
use crate::rng::RngError;
use brasa_alloc::AllocError;

/// Why a tensor operation failed.
#[derive(Debug, Clone, thiserror::Error)]
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
    /// Shapes that do not fit together.
    #[error("{op}: {message}")]
    Shape {
        /// The operation.
        op: &'static str,
        /// Expected versus given shapes.
        message: String,
    },
    /// A device that does not exist or cannot be used.
    #[error("{0}")]
    Device(String),
    /// Any other invalid argument.
    #[error("{op}: {message}")]
    Invalid {
        /// The operation.
        op: &'static str,
        /// What was wrong.
        message: String,
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

/// `Result` with [`TensorError`].
pub type Result<T> = std::result::Result<T, TensorError>;
