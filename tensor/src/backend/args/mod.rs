//! What the ops hand a device ([`super::DeviceOps`]): the kinds of
//! elementwise, reduction and fill work, and the checked operands and plans
//! of the ops whose shape rules live above the seam. Each file is one
//! concept; none imports another, and none reaches up into `crate::ops`
//! (the ops build these, the devices read them).

mod attention;
mod conv;
mod elementwise;
mod fill;
mod indices;
mod matmul;
mod norm;
mod optim;
mod pool;
mod reduce;

pub(crate) use attention::{AttentionOperands, DropoutDraws};
pub(crate) use conv::{channels_last_dims, channels_last_operands, ConvPlan};
pub(crate) use elementwise::{CompareOp, Update};
pub(crate) use fill::{Distribution, Sequence};
pub(crate) use indices::{read_checked_indices, Indices};
pub(crate) use matmul::{blas_operand, merged_stride, MatmulOperands};
#[cfg(feature = "cuda")]
pub(crate) use matmul::{BlasMatrix, BlasOperand};
#[cfg(feature = "cuda")]
pub(crate) use norm::RowPieces;
pub(crate) use norm::{batch_norm_row_pieces, BatchNormBackwardElemt, LayerNormBackward};
pub(crate) use optim::{AdamUpdate, SgdUpdate};
pub(crate) use pool::PoolPlan;
pub(crate) use reduce::{column_chunks, out_dims, reduce_layout, ReduceLayout, ReduceOp};
