//! The names brasa's operations pass to the precision hook
//! ([`crate::autocast_inputs`], [`crate::autocast_tensors`]), defined once
//! so that the operations and the autocast policy tables (`brasa_amp::Policy`)
//! use the same constants: a name misspelt on either side would otherwise
//! make the operation silently run in its inputs' dtype ("follow").
//!
//! They are PyTorch's names for the same operations (`torch.amp`'s op
//! reference), so a policy written for PyTorch reads the same here. The
//! operations of this crate ask under the first group; `brasa-nn`'s losses
//! and norms under the second. [`ALL`] lists every one.
//!
//! ```
//! use brasa_autograd::{op_names, PrecisionHook, Var};
//! use brasa_tensor::{DType, Device};
//!
//! /// Matrix products in bf16, everything else untouched.
//! struct Bf16Matmul;
//! impl PrecisionHook for Bf16Matmul {
//!     fn target(&self, op: &str, _inputs: &[DType], _device: Device) -> Option<DType> {
//!         (op == op_names::MATMUL).then_some(DType::BF16)
//!     }
//! }
//! assert!(op_names::ALL.contains(&"matmul"));
//! # let _ = Bf16Matmul;
//! ```

// ----- asked by brasa-autograd's operations ------------------------------------------

/// `Var::matmul`.
pub const MATMUL: &str = "matmul";
/// `Var::linear` (and `brasa_nn::Linear`).
pub const LINEAR: &str = "linear";
/// `Var::addmm`.
pub const ADDMM: &str = "addmm";
/// `Var::baddbmm`.
pub const BADDBMM: &str = "baddbmm";
/// `Var::conv1d` (and `brasa_nn::Conv1d`).
pub const CONV1D: &str = "conv1d";
/// `Var::conv2d` (and `brasa_nn::Conv2d`).
pub const CONV2D: &str = "conv2d";
/// `Var::conv_transpose1d` (and `brasa_nn::ConvTranspose1d`).
pub const CONV_TRANSPOSE1D: &str = "conv_transpose1d";
/// `Var::conv_transpose2d` (and `brasa_nn::ConvTranspose2d`).
pub const CONV_TRANSPOSE2D: &str = "conv_transpose2d";
/// `Var::scaled_dot_product_attention` (and `brasa_nn::MultiheadAttention`).
pub const SCALED_DOT_PRODUCT_ATTENTION: &str = "scaled_dot_product_attention";
/// `Var::softmax`.
pub const SOFTMAX: &str = "softmax";
/// `Var::log_softmax`.
pub const LOG_SOFTMAX: &str = "log_softmax";
/// `Var::softplus`.
pub const SOFTPLUS: &str = "softplus";
/// `Var::exp`.
pub const EXP: &str = "exp";
/// `Var::log`.
pub const LOG: &str = "log";
/// `Var::rsqrt`.
pub const RSQRT: &str = "rsqrt";
/// `Var::pow` and `Var::powf`.
pub const POW: &str = "pow";
/// `Var::sum` and `Var::sum_all`.
pub const SUM: &str = "sum";
/// `Var::mean` and `Var::mean_all`.
pub const MEAN: &str = "mean";
/// `Var::var`.
pub const VAR: &str = "var";
/// `Var::std`.
pub const STD: &str = "std";
/// `Var::cat`.
pub const CAT: &str = "cat";
/// `Var::stack`.
pub const STACK: &str = "stack";

// ----- asked by brasa-nn's losses and norms ------------------------------------------

/// `brasa_nn::functional::cross_entropy` (class indices and probabilities).
pub const CROSS_ENTROPY: &str = "cross_entropy";
/// `brasa_nn::functional::nll_loss`.
pub const NLL_LOSS: &str = "nll_loss";
/// `brasa_nn::functional::mse_loss`.
pub const MSE_LOSS: &str = "mse_loss";
/// `brasa_nn::functional::l1_loss`.
pub const L1_LOSS: &str = "l1_loss";
/// `brasa_nn::functional::binary_cross_entropy_with_logits`.
pub const BINARY_CROSS_ENTROPY_WITH_LOGITS: &str = "binary_cross_entropy_with_logits";
/// `brasa_nn::functional::layer_norm` (and `LayerNorm`).
pub const LAYER_NORM: &str = "layer_norm";
/// `brasa_nn::functional::batch_norm` (and `BatchNorm1d/2d`).
pub const BATCH_NORM: &str = "batch_norm";
/// `brasa_nn::functional::group_norm` (and `GroupNorm`).
pub const GROUP_NORM: &str = "group_norm";

/// Every name above, in the order above.
pub const ALL: &[&str] = &[
    MATMUL,
    LINEAR,
    ADDMM,
    BADDBMM,
    CONV1D,
    CONV2D,
    CONV_TRANSPOSE1D,
    CONV_TRANSPOSE2D,
    SCALED_DOT_PRODUCT_ATTENTION,
    SOFTMAX,
    LOG_SOFTMAX,
    SOFTPLUS,
    EXP,
    LOG,
    RSQRT,
    POW,
    SUM,
    MEAN,
    VAR,
    STD,
    CAT,
    STACK,
    CROSS_ENTROPY,
    NLL_LOSS,
    MSE_LOSS,
    L1_LOSS,
    BINARY_CROSS_ENTROPY_WITH_LOGITS,
    LAYER_NORM,
    BATCH_NORM,
    GROUP_NORM,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_snake_case() {
        for (i, name) in ALL.iter().enumerate() {
            assert!(!ALL[..i].contains(name), "{name} listed twice");
            assert!(
                !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{name:?}"
            );
        }
    }
}
