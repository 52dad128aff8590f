//! The autocast policy: which dtype each operation computes in under
//! [`crate::autocast`], as one table of operation names and
//! [`Category`]s.
//!
//! The defaults are PyTorch's lists (`torch/csrc/autocast_mode.cpp`, the
//! "Autocast Op Reference" of the `torch.amp` docs): [`Policy::cuda`] (the
//! default) and [`Policy::cpu`], each with brasa's additions
//! ([`BRASA_FLOAT32`]: means, variances and batch norm in f32, which
//! PyTorch leaves to follow their input — pytorch/pytorch#88929; on the
//! CPU batch norm follows its input, as in PyTorch).
//! [`Policy::pytorch_cuda`] and [`Policy::pytorch_cpu`] are PyTorch's lists
//! alone. Any entry can be overridden with [`Policy::with`].
//!
//! Names are those operations pass to `brasa_autograd::autocast_inputs`.
//! brasa's operations ask under the constants of [`brasa_autograd::op_names`],
//! which the tables below use too, so the two cannot drift apart by a typo
//! (an unknown name would silently mean [`Category::Follow`]); the other
//! names in the tables are PyTorch's, there for custom operations that use
//! them:
//!
//! | name | asked by | default category |
//! |---|---|---|
//! | `matmul` | `Var::matmul` | [`Category::Lower`] |
//! | `linear` | `Var::linear`, `Linear` | [`Category::Lower`] |
//! | `addmm`, `baddbmm` | `Var::addmm`, `Var::baddbmm` (all three operands) | [`Category::Lower`] |
//! | `conv2d` | `Var::conv2d`, `Conv2d` | [`Category::Lower`] |
//! | `conv1d` | `Var::conv1d`, `Conv1d` | [`Category::Lower`] |
//! | `conv_transpose1d`, `conv_transpose2d` | `Var::conv_transpose1d/2d`, `ConvTranspose1d/2d` | [`Category::Lower`] |
//! | `scaled_dot_product_attention` | `Var::scaled_dot_product_attention`, `MultiheadAttention` | [`Category::Lower`] |
//! | `softmax`, `log_softmax` | `Var::softmax`, `Var::log_softmax` | [`Category::Float32`] |
//! | `softplus` | `Var::softplus`, `Softplus` | [`Category::Float32`] ([`Policy::cpu`]: [`Category::Follow`]) |
//! | `exp`, `log`, `rsqrt` | `Var::exp`, `Var::log`, `Var::rsqrt` | [`Category::Float32`] |
//! | `pow` | `Var::pow`, `Var::powf` | [`Category::Float32`] |
//! | `sum` | `Var::sum`, `Var::sum_all` | [`Category::Float32`] |
//! | `mean`, `var`, `std` | `Var::mean(_all)`, `Var::var`, `Var::std` | [`Category::Float32`] (brasa) |
//! | `cross_entropy`, `nll_loss`, `mse_loss`, `l1_loss`, `binary_cross_entropy_with_logits` | `brasa_nn::functional` | [`Category::Float32`] |
//! | `layer_norm` | `functional::layer_norm`, `LayerNorm` | [`Category::Float32`] |
//! | `group_norm` | `functional::group_norm`, `GroupNorm` | [`Category::Float32`] |
//! | `batch_norm` | `functional::batch_norm`, `BatchNorm1d/2d` | [`Category::Float32`] (brasa; [`Policy::cpu`]: [`Category::Follow`], computed in f32 inside) |
//! | `cat`, `stack` | `Var::cat`, `Var::stack` | [`Category::Promote`] |
//!
//! Every other operation (elementwise arithmetic, activations, views,
//! pooling, dropout, embedding) is not asked and runs in its inputs' dtype,
//! as unlisted operations do in PyTorch.
//!
//! ```
//! use brasa_amp::{Category, Policy};
//! use brasa_autograd::op_names as op;
//! use brasa_tensor::DType;
//!
//! let policy = Policy::default().with(op::SOFTMAX, Category::Follow);
//! assert_eq!(policy.category(op::LINEAR), Category::Lower);
//! assert_eq!(policy.category("softmax"), Category::Follow);
//! assert_eq!(policy.target(op::LINEAR, &[DType::F32, DType::F32], DType::BF16), Some(DType::BF16));
//! assert_eq!(policy.target(op::CAT, &[DType::BF16, DType::F32], DType::BF16), Some(DType::F32));
//! ```

use brasa_autograd::op_names as op;
use brasa_tensor::DType;
use std::borrow::Cow;
use std::collections::HashMap;

/// What autocast does with an operation's floating-point inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Category {
    /// Cast to the region's low dtype (f16 or bf16): matrix products,
    /// linear layers, convolutions.
    Lower,
    /// Cast to f32: operations whose range or accumulation suffers in half
    /// precision (softmax, exp/log, pow, sums, norms, losses, distances).
    Float32,
    /// Cast to the widest input dtype (f32 if the inputs mix f32 and a half
    /// type, or f16 with bf16), so that mixed inputs can meet.
    Promote,
    /// Leave the inputs as they are (the default for unlisted operations).
    Follow,
}

/// PyTorch's CUDA list of operations that run in the low dtype.
pub const CUDA_LOWER: &[&str] = &[
    "__matmul__",
    "addbmm",
    op::ADDMM,
    "addmv",
    "addr",
    op::BADDBMM,
    "bmm",
    "chain_matmul",
    "multi_dot",
    op::LINEAR,
    op::MATMUL,
    "mm",
    "mv",
    op::CONV1D,
    op::CONV2D,
    "conv3d",
    "conv_tbc",
    op::CONV_TRANSPOSE1D,
    op::CONV_TRANSPOSE2D,
    "conv_transpose3d",
    "prelu",
    "gru_cell",
    "lstm_cell",
    "rnn_tanh_cell",
    "rnn_relu_cell",
    op::SCALED_DOT_PRODUCT_ATTENTION,
];

/// PyTorch's CUDA list of operations that run in f32.
pub const CUDA_FLOAT32: &[&str] = &[
    // Powers and division.
    "__pow__",
    "__rdiv__",
    "__rpow__",
    "__rtruediv__",
    op::POW,
    "reciprocal",
    op::RSQRT,
    // Elementwise math.
    "acos",
    "asin",
    "cosh",
    "sinh",
    "tan",
    "erfinv",
    op::EXP,
    "expm1",
    op::LOG,
    "log10",
    "log1p",
    "log2",
    // Reductions and norms.
    "cumprod",
    "cumsum",
    "prod",
    op::SUM,
    "norm",
    "normalize",
    "renorm",
    op::LAYER_NORM,
    op::GROUP_NORM,
    // The softmax family.
    op::SOFTMAX,
    "softmin",
    op::LOG_SOFTMAX,
    op::SOFTPLUS,
    // Distances.
    "cdist",
    "pdist",
    "dist",
    "cosine_similarity",
    // Losses.
    op::BINARY_CROSS_ENTROPY_WITH_LOGITS,
    "cosine_embedding_loss",
    op::CROSS_ENTROPY,
    "hinge_embedding_loss",
    "kl_div",
    op::L1_LOSS,
    "margin_ranking_loss",
    op::MSE_LOSS,
    "multilabel_margin_loss",
    "multi_margin_loss",
    op::NLL_LOSS,
    "poisson_nll_loss",
    "smooth_l1_loss",
    "huber_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
];

/// PyTorch's CUDA list of operations that take the widest input dtype
/// (`cat`, `stack` and `index_copy` are in `autocast_mode.cpp`, not in the
/// docs' table).
pub const CUDA_PROMOTE: &[&str] = &[
    "addcdiv",
    "addcmul",
    "atan2",
    "bilinear",
    "cross",
    "dot",
    "grid_sample",
    "index_put",
    "scatter_add",
    "tensordot",
    op::CAT,
    op::STACK,
    "index_copy",
];

/// PyTorch's CPU list of operations that run in the low dtype (f16 shares
/// bf16's lists on the CPU).
pub const CPU_LOWER: &[&str] = &[
    op::CONV1D,
    op::CONV2D,
    "conv3d",
    "conv_tbc",
    op::CONV_TRANSPOSE1D,
    op::CONV_TRANSPOSE2D,
    "conv_transpose3d",
    "bmm",
    "mm",
    "linalg_vecdot",
    op::BADDBMM,
    op::ADDMM,
    "addbmm",
    op::LINEAR,
    op::MATMUL,
    "prelu",
    op::SCALED_DOT_PRODUCT_ATTENTION,
];

/// PyTorch's CPU list of operations that run in f32: losses, FFTs, linear
/// algebra, 3-d pooling, padding, quantiles.
pub const CPU_FLOAT32: &[&str] = &[
    // Losses.
    op::BINARY_CROSS_ENTROPY_WITH_LOGITS,
    "cosine_embedding_loss",
    op::CROSS_ENTROPY,
    "ctc_loss",
    "hinge_embedding_loss",
    "huber_loss",
    "kl_div",
    op::L1_LOSS,
    "margin_ranking_loss",
    op::MSE_LOSS,
    "multilabel_margin_loss",
    "multi_margin_loss",
    op::NLL_LOSS,
    "nll_loss2d",
    "poisson_nll_loss",
    "smooth_l1_loss",
    "soft_margin_loss",
    "triplet_margin_loss",
    // Pooling and padding.
    "avg_pool3d",
    "max_pool3d",
    "adaptive_avg_pool3d",
    "adaptive_max_pool3d",
    "fractional_max_pool2d",
    "fractional_max_pool3d",
    "max_unpool2d",
    "max_unpool3d",
    "reflection_pad1d",
    "reflection_pad2d",
    "replication_pad1d",
    "replication_pad2d",
    "replication_pad3d",
    // Statistics and signals.
    "prod",
    "quantile",
    "nanquantile",
    "stft",
    "cdist",
    "trace",
    "grid_sampler",
    "polar",
    // FFTs.
    "fft_fft",
    "fft_ifft",
    "fft_fft2",
    "fft_ifft2",
    "fft_fftn",
    "fft_ifftn",
    "fft_rfft",
    "fft_irfft",
    "fft_rfft2",
    "fft_irfft2",
    "fft_rfftn",
    "fft_irfftn",
    "fft_hfft",
    "fft_ihfft",
    // Linear algebra.
    "cholesky",
    "cholesky_inverse",
    "cholesky_solve",
    "inverse",
    "lu_solve",
    "orgqr",
    "ormqr",
    "pinverse",
    "geqrf",
    "qr",
    "svd",
    "triangular_solve",
    "linalg_cholesky",
    "linalg_cond",
    "linalg_eig",
    "linalg_eigh",
    "linalg_eigvals",
    "linalg_eigvalsh",
    "linalg_householder_product",
    "linalg_inv",
    "linalg_lstsq",
    "linalg_matrix_rank",
    "linalg_qr",
    "linalg_solve",
    "linalg_svd",
    "linalg_svdvals",
    "linalg_tensorinv",
    "linalg_tensorsolve",
];

/// PyTorch's CPU list of operations that take the widest input dtype.
pub const CPU_PROMOTE: &[&str] = &[op::CAT, op::STACK, "index_copy"];

/// brasa's additions to the default policies: reductions that PyTorch
/// leaves to follow their input, and batch norm, whose f32 output PyTorch
/// does not give (pytorch/pytorch#88929; [`Policy::cpu`] leaves batch norm
/// to follow its input, as PyTorch's CPU autocast does). brasa's f16/bf16 kernels already
/// accumulate these in f32; in f32 the result keeps its precision too.
pub const BRASA_FLOAT32: &[&str] = &[op::MEAN, op::VAR, op::STD, op::BATCH_NORM, op::GROUP_NORM];

/// The table autocast consults: an operation name → [`Category`];
/// unlisted operations [`Category::Follow`] their inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    ops: HashMap<Cow<'static, str>, Category>,
}

impl Default for Policy {
    /// [`Policy::cuda`]: PyTorch's CUDA lists with brasa's additions.
    fn default() -> Policy {
        Policy::cuda()
    }
}

impl Policy {
    /// A table with no entries: every operation follows its inputs.
    pub fn empty() -> Policy {
        Policy { ops: HashMap::new() }
    }

    /// PyTorch's CUDA lists ([`CUDA_LOWER`], [`CUDA_FLOAT32`],
    /// [`CUDA_PROMOTE`]) with brasa's [`BRASA_FLOAT32`]: the default.
    pub fn cuda() -> Policy {
        Policy::pytorch_cuda().with_all(BRASA_FLOAT32, Category::Float32)
    }

    /// PyTorch's CPU lists ([`CPU_LOWER`], [`CPU_FLOAT32`],
    /// [`CPU_PROMOTE`]) with brasa's [`BRASA_FLOAT32`] but for batch norm.
    /// Softmax, exp/log and sums are not on PyTorch's CPU lists: they follow
    /// their inputs here.
    ///
    /// Batch norm follows its input, as in PyTorch's CPU autocast: the
    /// host's batch norm computes a half input's statistics and
    /// normalisation in f32 anyway and saves that input for backward, so
    /// casting it to f32 first would only add a cast, save the f32 copy
    /// (twice the bytes), and leave what comes after it (ReLU, pooling) in
    /// f32 until the next convolution casts back.
    pub fn cpu() -> Policy {
        Policy::pytorch_cpu().with_all(BRASA_FLOAT32, Category::Float32).with(op::BATCH_NORM, Category::Follow)
    }

    /// PyTorch's CUDA lists exactly (batch norm follows its input).
    pub fn pytorch_cuda() -> Policy {
        Policy::empty()
            .with_all(CUDA_LOWER, Category::Lower)
            .with_all(CUDA_FLOAT32, Category::Float32)
            .with_all(CUDA_PROMOTE, Category::Promote)
    }

    /// PyTorch's CPU lists exactly.
    pub fn pytorch_cpu() -> Policy {
        Policy::empty()
            .with_all(CPU_LOWER, Category::Lower)
            .with_all(CPU_FLOAT32, Category::Float32)
            .with_all(CPU_PROMOTE, Category::Promote)
    }

    /// This policy with `op` in `category` (an override, or a new entry for
    /// a custom operation that calls `autocast_inputs(op, ...)`).
    pub fn with(mut self, op: impl Into<Cow<'static, str>>, category: Category) -> Policy {
        self.set(op, category);
        self
    }

    /// This policy with every op of `ops` in `category`.
    pub fn with_all(mut self, ops: &[&'static str], category: Category) -> Policy {
        for &op in ops {
            self.set(op, category);
        }
        self
    }

    /// Puts `op` in `category`, in place.
    pub fn set(&mut self, op: impl Into<Cow<'static, str>>, category: Category) {
        let op = op.into();
        if category == Category::Follow {
            // Follow is what an absent entry means: keep the table small.
            self.ops.remove(op.as_ref());
        } else {
            self.ops.insert(op, category);
        }
    }

    /// `op`'s category ([`Category::Follow`] when unlisted).
    pub fn category(&self, op: &str) -> Category {
        self.ops.get(op).copied().unwrap_or(Category::Follow)
    }

    /// The listed operations of `category`, sorted (for docs and reports).
    pub fn ops(&self, category: Category) -> Vec<&str> {
        let mut ops: Vec<&str> = self.ops.iter().filter(|(_, &c)| c == category).map(|(op, _)| op.as_ref()).collect();
        ops.sort_unstable();
        ops
    }

    /// The dtype `op`'s floating-point inputs (of dtypes `inputs`) should be
    /// cast to in a region whose low dtype is `low`, or `None` to leave them.
    /// As in PyTorch, f64 is never autocast: an operation with an f64 input
    /// runs as it is.
    pub fn target(&self, op: &str, inputs: &[DType], low: DType) -> Option<DType> {
        let mut floats = inputs.iter().copied().filter(|d| d.is_float()).peekable();
        floats.peek()?;
        if inputs.contains(&DType::F64) {
            return None;
        }
        match self.category(op) {
            Category::Lower => Some(low),
            Category::Float32 => Some(DType::F32),
            Category::Promote => Some(widest(floats)),
            Category::Follow => None,
        }
    }
}

/// The widest of some f32/f16/bf16 dtypes: f32 when one is f32 or when
/// f16 meets bf16 (neither holds the other), else the one half type.
fn widest(mut dtypes: impl Iterator<Item = DType>) -> DType {
    let first = dtypes.next().unwrap_or(DType::F32);
    dtypes.fold(first, |wide, d| if d == wide { wide } else { DType::F32 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_pytorch_with_brasa_additions() {
        let cuda = Policy::cuda();
        assert_eq!(cuda.category("conv2d"), Category::Lower);
        assert_eq!(cuda.category("log_softmax"), Category::Float32);
        assert_eq!(cuda.category("cat"), Category::Promote);
        assert_eq!(cuda.category("relu"), Category::Follow);
        assert_eq!(cuda.category("batch_norm"), Category::Float32);
        assert_eq!(Policy::pytorch_cuda().category("batch_norm"), Category::Follow);
        let cpu = Policy::cpu();
        assert_eq!(cpu.category("softmax"), Category::Follow, "not on PyTorch's CPU lists");
        assert_eq!(cpu.category("mse_loss"), Category::Float32);
        assert_eq!(cpu.category("linear"), Category::Lower);
        assert_eq!(cpu.category("batch_norm"), Category::Follow, "computed in f32 inside, on a half input");
        assert_eq!(cpu.category("group_norm"), Category::Float32);
        for policy in [&cuda, &cpu] {
            assert_eq!(policy.category("scaled_dot_product_attention"), Category::Lower);
        }
        assert_eq!(Policy::default(), cuda);
    }

    #[test]
    fn targets_per_category() {
        let p = Policy::default();
        let (f32_, f16_, bf16_, f64_) = (DType::F32, DType::F16, DType::BF16, DType::F64);
        assert_eq!(p.target("matmul", &[f32_, f32_], f16_), Some(f16_));
        assert_eq!(p.target("matmul", &[f32_, f64_], f16_), None, "f64 is not autocast");
        assert_eq!(p.target("softmax", &[bf16_], bf16_), Some(f32_));
        assert_eq!(p.target("stack", &[bf16_, bf16_], f16_), Some(bf16_));
        assert_eq!(p.target("stack", &[bf16_, f16_], f16_), Some(f32_));
        assert_eq!(p.target("stack", &[f32_, f16_], f16_), Some(f32_));
        assert_eq!(p.target("relu", &[f16_], f16_), None);
        assert_eq!(p.target("matmul", &[DType::I64], f16_), None, "no float input");
    }

    #[test]
    fn overrides_replace_and_remove_entries() {
        let p = Policy::default().with("softmax", Category::Lower).with("my_op", Category::Float32);
        assert_eq!(p.category("softmax"), Category::Lower);
        assert_eq!(p.category("my_op"), Category::Float32);
        let p = p.with("linear", Category::Follow);
        assert_eq!(p.category("linear"), Category::Follow);
        assert!(!p.ops(Category::Lower).contains(&"linear"));
        assert!(p.ops(Category::Float32).contains(&"my_op"));
    }
}
