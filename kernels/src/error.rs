//! The error type of this crate: every bad input is an `Err`, never a panic.

use crate::scratch::ScratchError;
use std::fmt;

/// What went wrong in a kernel call. The message names the operand and the
/// numbers involved so that a caller can see which view was malformed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KernelError {
    /// A view reaches past the end of its slice.
    OutOfBounds {
        /// Which operand (`"a"`, `"b"`, `"c"`, ...).
        operand: &'static str,
        /// One past the largest element index the view touches.
        required: usize,
        /// Length of the slice it was given.
        len: usize,
    },
    /// Index arithmetic of a view overflows `usize`.
    Overflow {
        /// Which operand.
        operand: &'static str,
    },
    /// Two operands' shapes do not fit together.
    ShapeMismatch {
        /// Human-readable description, e.g. `"a is 3x4 but b is 5x2"`.
        detail: String,
    },
    /// An output view whose elements alias each other (a stride of 0, or
    /// strides that interleave); writing it would be a data race.
    OverlappingOutput {
        /// Which operand.
        operand: &'static str,
        /// The extents and strides that overlap.
        detail: String,
    },
    /// A micro-kernel was requested that this CPU cannot run.
    UnsupportedKernel {
        /// Name of the kernel.
        kernel: &'static str,
    },
    /// A blocking parameter is zero.
    InvalidBlocking {
        /// Human-readable description.
        detail: String,
    },
    /// A work buffer sized by the operands (an f32 workspace for a narrow
    /// C, a column reduction's pairwise rows, ...) that cannot be allocated;
    /// the [`ScratchError`] says how many bytes. Also the error's `source`.
    Scratch(ScratchError),
}

impl From<ScratchError> for KernelError {
    fn from(error: ScratchError) -> Self {
        KernelError::Scratch(error)
    }
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelError::OutOfBounds { operand, required, len } => {
                write!(f, "operand {operand}: view needs a slice of at least {required} elements, got {len}")
            }
            KernelError::Overflow { operand } => {
                write!(f, "operand {operand}: view index arithmetic overflows usize")
            }
            KernelError::ShapeMismatch { detail } => write!(f, "shape mismatch: {detail}"),
            KernelError::OverlappingOutput { operand, detail } => write!(
                f,
                "operand {operand}: output elements overlap ({detail}); an output view needs distinct elements"
            ),
            KernelError::UnsupportedKernel { kernel } => {
                write!(f, "micro-kernel {kernel} is not supported by this CPU")
            }
            KernelError::InvalidBlocking { detail } => write!(f, "invalid blocking: {detail}"),
            KernelError::Scratch(error) => fmt::Display::fmt(error, f),
        }
    }
}

impl std::error::Error for KernelError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            KernelError::Scratch(error) => Some(error),
            _ => None,
        }
    }
}

/// Result alias used throughout the crate.
pub type Result<T> = std::result::Result<T, KernelError>;
