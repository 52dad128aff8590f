//! Elementwise loops: one output element from the elements at the same index
//! of one, two or three operands, or an in-place update of a destination.
//!
//! Two layers:
//!
//! - Generic loops over any element types with a closure: [`map1`],
//!   [`map2`], [`map3`] write a contiguous output; [`update0`], [`update1`],
//!   [`update2`] update a (possibly strided) destination in place. Operands
//!   are [`Strided`] views of slices (start + stride; stride 0 broadcasts one
//!   element), so a caller walking an n-d tensor hands over one row at a time
//!   without copying. Each loop checks its bounds once and specialises on
//!   the operands' form: contiguous slices are zipped (the compiler
//!   vectorises the closure), a stride-0 operand is held in a register, any
//!   other stride is indexed.
//! - Named floating-point ops on top of them: [`unary`] ([`UnaryOp`]: exp,
//!   log, tanh, sigmoid, GELU, ...), [`binary`] ([`BinaryOp`]), their
//!   in-place forms, and the fused updates optimizers need ([`axpy`],
//!   [`addcmul`], [`addcdiv`]). They work on every [`FloatElement`]: f32 and
//!   f64 compute as themselves, f16 and bf16 in f32 with one rounding on store.
//! - GELU and its backwards ([`BinaryOp::GeluBackward`],
//!   [`BinaryOp::GeluTanhBackward`]) run as slice kernels ([`map1_blocks`],
//!   [`map2_blocks`]): in f32 (so also for f16 and bf16) they are the
//!   branch-free vectorised [`gelu_f32`], [`gelu_backward_f32`] and
//!   [`gelu_tanh_backward_f32`], picked for the CPU at run time.
//!
//! The loops are sequential: callers split large outputs into chunks and run
//! them on rayon's threads (`brasa-tensor` does), since only they know how
//! their rows map to memory.

mod ops;
mod strided;

pub use crate::math::{erf, erfc, MAX_ULP_ERROR};
pub use crate::scalar::{gelu_tanh, gelu_tanh_backward, Float, FloatElement};
pub use ops::{
    addcdiv, addcmul, axpy, binary, binary_update, binary_update_self, gelu_backward_f32, gelu_f32,
    gelu_tanh_backward_f32, maximum, minimum, sigmoid, unary, unary_update, BinaryOp, UnaryOp,
};
pub use strided::{
    map1, map1_blocks, map2, map2_blocks, map3, same_len, update0, update1, update2, Strided, StridedMut,
};
