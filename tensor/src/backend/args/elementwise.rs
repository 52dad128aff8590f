//! Elementwise work a device runs: comparisons and in-place updates.

use brasa_kernels::elementwise::{BinaryOp, UnaryOp};

/// An elementwise comparison (its result is a bool tensor).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CompareOp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

impl CompareOp {
    /// The op's name, also the kernel-name part (`"lt"`).
    pub(crate) fn kernel_name(self) -> &'static str {
        match self {
            CompareOp::Eq => "eq",
            CompareOp::Ne => "ne",
            CompareOp::Lt => "lt",
            CompareOp::Le => "le",
            CompareOp::Gt => "gt",
            CompareOp::Ge => "ge",
        }
    }
}

/// An in-place update of a tensor `dst`, with its operands (see
/// [`crate::backend::DeviceOps::update`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Update {
    /// `dst = op(dst)`: floats every [`UnaryOp`]; integers `Neg`, `Abs`,
    /// `Relu`, `Clamp` and `Affine` with integral factors (wrapping).
    Unary(UnaryOp),
    /// `dst = ln(1 + dst)`, in f64 per element (floats).
    Log1p,
    /// `dst = log(sigmoid(dst))` as `min(x, 0) − log1p(e^−|x|)`, in f64 (floats).
    LogSigmoid,
    /// `dst = op(dst, x)`: `Add`, `Sub`, `Mul`, `Div` (floats), `Maximum`,
    /// `Minimum`; integers wrap, bool add/max are or, mul/min and.
    Binary(BinaryOp),
    /// `dst += alpha · x` (integers: integral `alpha`, wrapping).
    AddScaled(f64),
    /// `dst += weight · (end − dst)` (floats).
    Lerp(f64),
    /// `dst += value · a · b` (floats).
    Addcmul(f64),
    /// `dst += value · a / b` (floats).
    Addcdiv(f64),
}
