//! The CUDA kernels of brasa as PTX text, and the `#[repr(C)]` structs their
//! kernels take by value.
//!
//! The sources are `kernels/cuda/*.cu` (one file per family, the contract in
//! `kernels/cuda/ABI.md`: every kernel's name, parameters and launch rule).
//! `cargo xtask kernels` compiles each with the pinned CUDA 13.0 `nvcc`
//! (`nvcc -ptx -arch=compute_80 --std=c++17 -Werror all-warnings -I
//! kernels/cuda`), checks that the PTX is ISA 9.0 (what a CUDA 13.0 driver
//! can JIT) and that `ptxas` accepts it for sm_80 and sm_90, and writes it to
//! `kernels/ptx/<family>.ptx`, which is committed: building this crate never
//! needs a CUDA compiler. [`MODULES`] embeds those files; a device backend
//! loads each module once per device (e.g. cudarc's
//! `ctx.load_module(Ptx::from_src(module.ptx))`) and looks kernels up by name.

/// One compiled family of kernels: `name` is the `.cu` file's stem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PtxModule {
    /// The family (`"elementwise"`, `"reduce"`, ...), also the source file's stem.
    pub name: &'static str,
    /// The PTX text, NUL-free, as `nvcc -ptx` wrote it.
    pub ptx: &'static str,
}

macro_rules! modules {
    ($($name:literal),* $(,)?) => {
        /// Every family, in the order of `kernels/cuda/ABI.md`.
        pub const MODULES: &[PtxModule] = &[
            $(PtxModule { name: $name, ptx: include_str!(concat!("../ptx/", $name, ".ptx")) },)*
        ];
    };
}

modules!(
    "elementwise",
    "cast",
    "fill",
    "random",
    "reduce",
    "softmax",
    "norm",
    "index",
    "conv",
    "pool",
    "optim",
    "attention",
);

/// The module named `name`, if there is one.
pub fn module(name: &str) -> Option<&'static PtxModule> {
    MODULES.iter().find(|m| m.name == name)
}

/// The most dims a [`Strided`] describes (`BRASA_MAX_DIMS` in `common.cuh`).
pub const MAX_DIMS: usize = 8;

/// The iteration space of a strided elementwise kernel, passed by value
/// (336 bytes; `struct Strided` in `kernels/cuda/common.cuh`).
///
/// `dims[..rank]` is the common shape, row-major (last dim fastest);
/// `strides[k][..rank]` are operand `k`'s strides in elements (0 broadcasts,
/// negative ones walk backwards), operand 0 being the output and 1..=3 the
/// inputs in argument order. Element offsets of the views are applied to the
/// pointers, not here. `rank == 0` is one element.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Strided {
    /// Elements of the shape (`dims[..rank]`'s product; 1 for rank 0).
    pub numel: i64,
    /// Dims in use, `0..=MAX_DIMS`.
    pub rank: i32,
    /// The shape; entries past `rank` are ignored.
    pub dims: [i64; MAX_DIMS],
    /// Per operand (0 = output, 1..=3 = inputs), the strides in elements.
    pub strides: [[i64; MAX_DIMS]; 4],
}

/// The geometry of `im2col_*` / `col2im_*` (`struct Conv2d` in `conv.cu`,
/// 104 bytes): `brasa_kernels::conv::Conv2dGeometry`'s sizes, all as i64.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct Conv2d {
    pub channels: i64,
    pub in_h: i64,
    pub in_w: i64,
    pub k_h: i64,
    pub k_w: i64,
    pub stride_h: i64,
    pub stride_w: i64,
    pub pad_h: i64,
    pub pad_w: i64,
    pub dil_h: i64,
    pub dil_w: i64,
    pub out_h: i64,
    pub out_w: i64,
}

/// The geometry of the pooling kernels (`struct Pool2d` in `pool.cu`, 80
/// bytes): `brasa_kernels::pool::Pool2dGeometry`'s sizes, all as i64.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct Pool2d {
    pub in_h: i64,
    pub in_w: i64,
    pub k_h: i64,
    pub k_w: i64,
    pub stride_h: i64,
    pub stride_w: i64,
    pub pad_h: i64,
    pub pad_w: i64,
    pub out_h: i64,
    pub out_w: i64,
}

/// The operands of `attention_forward_<T>_d<D>` (`struct AttentionForward`
/// in `attention.cu`, 232 bytes): device addresses, strides in elements and
/// the sizes, all passed by value. See `kernels/cuda/ABI.md`, "attention".
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct AttentionForward {
    /// `q` `[n, h, L, E]` through `q_strides` (last dim contiguous).
    pub q: u64,
    /// `k` `[n, h, S, E]`.
    pub k: u64,
    /// `v` `[n, h, S, Ev]`.
    pub v: u64,
    /// An additive f32 mask through `mask_strides`, or 0 for none.
    pub mask: u64,
    /// The output, contiguous `[n, h, L, Ev]`, the operands' dtype.
    pub out: u64,
    /// Each row's log-sum-exp, contiguous `[n, h, L]`, f32.
    pub lse: u64,
    /// `q`'s strides over n, h and rows.
    pub q_strides: [i64; 3],
    /// `k`'s strides over n, h and rows.
    pub k_strides: [i64; 3],
    /// `v`'s strides over n, h and rows.
    pub v_strides: [i64; 3],
    /// The mask's strides over n, h, rows and columns (0: broadcast).
    pub mask_strides: [i64; 4],
    /// Heads `h` (`bh = n·h + h`).
    pub heads: i64,
    /// Query rows `L`.
    pub l: i64,
    /// Key rows `S`.
    pub s: i64,
    /// The query and key width `E`.
    pub e: i64,
    /// The value width `Ev`.
    pub ev: i64,
    /// The factor on `q·kᵀ`.
    pub scale: f32,
    /// `1 − dropout_p` (1: no dropout).
    pub keep_prob: f32,
    /// 1 for the top-left causal mask.
    pub causal: i64,
    /// 1 when every row starts 16-byte aligned and `E`, `Ev` are multiples of 8.
    pub vectorized: i64,
    /// Dropout's Philox key.
    pub seed: u64,
    /// Dropout's first Philox counter.
    pub offset: u64,
}

/// The operands of `attention_backward_<T>_d<D>` (`struct AttentionBackward`
/// in `attention.cu`, 264 bytes); fields as in [`AttentionForward`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Default)]
#[allow(missing_docs)]
pub struct AttentionBackward {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub mask: u64,
    /// The output's gradient, contiguous `[n, h, L, Ev]`.
    pub grad: u64,
    /// The forward's log-sum-exp, contiguous `[n, h, L]`, f32.
    pub lse: u64,
    /// `rowsum(dO ∘ O)`, contiguous `[n, h, L]`, f32.
    pub delta: u64,
    /// `dq`'s f32 accumulator, contiguous `[n, h, L, E]`, zeroed before.
    pub dq: u64,
    /// `dk`, contiguous `[n, h, S, E]`.
    pub dk: u64,
    /// `dv`, contiguous `[n, h, S, Ev]`.
    pub dv: u64,
    pub q_strides: [i64; 3],
    pub k_strides: [i64; 3],
    pub v_strides: [i64; 3],
    pub mask_strides: [i64; 4],
    pub heads: i64,
    pub l: i64,
    pub s: i64,
    pub e: i64,
    pub ev: i64,
    pub scale: f32,
    pub keep_prob: f32,
    pub causal: i64,
    pub vectorized: i64,
    pub seed: u64,
    pub offset: u64,
}

/// Threads per block of the attention kernels (four warps).
pub const ATTENTION_THREADS: u32 = 128;
/// Query rows per forward block, key rows per backward block.
pub const ATTENTION_TILE: usize = 64;
/// The head dims the attention kernels are compiled for; `E` and `Ev` up to
/// the largest run in the smallest that holds both.
pub const ATTENTION_HEAD_DIMS: [usize; 2] = [64, 128];

/// The dynamic shared memory of `attention_backward_*_d<D>` in bytes
/// (`ATTN_BWD_SHARED` in `attention.cu`): key, value, query and output
/// gradient tiles of `64 × (D + 8)` and the `64 × 72` score gradient tile in
/// the 2-byte operand type, and two rows of 64 f32.
pub const fn attention_backward_shared_bytes(d: usize) -> u32 {
    ((4 * 64 * (d + 8) + 64 * (64 + 8)) * 2 + 2 * 64 * 4) as u32
}

/// The value `*bad_index` must hold before an indexing kernel runs
/// (`LLONG_MIN`); any other value afterwards is an offending index.
pub const NO_BAD_INDEX: i64 = i64::MIN;

/// Threads per block of every kernel.
pub const BLOCK: u32 = 256;

/// The grid of an elementwise (grid-stride) kernel over `n` items:
/// `min(ceil(n / 256), 65535)`, at least 1.
pub fn grid_for(n: u64) -> u32 {
    n.div_ceil(u64::from(BLOCK)).clamp(1, 65_535) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn structs_match_their_c_layouts() {
        assert_eq!(size_of::<Strided>(), 336);
        assert_eq!(offset_of!(Strided, numel), 0);
        assert_eq!(offset_of!(Strided, rank), 8);
        assert_eq!(offset_of!(Strided, dims), 16);
        assert_eq!(offset_of!(Strided, strides), 80);
        assert_eq!(std::mem::align_of::<Strided>(), 8);
        assert_eq!(size_of::<Conv2d>(), 104);
        assert_eq!(offset_of!(Conv2d, out_w), 96);
        assert_eq!(size_of::<Pool2d>(), 80);
        assert_eq!(offset_of!(Pool2d, out_w), 72);
        assert_eq!(size_of::<AttentionForward>(), 232);
        assert_eq!(offset_of!(AttentionForward, q_strides), 48);
        assert_eq!(offset_of!(AttentionForward, heads), 152);
        assert_eq!(offset_of!(AttentionForward, scale), 192);
        assert_eq!(offset_of!(AttentionForward, causal), 200);
        assert_eq!(offset_of!(AttentionForward, seed), 216);
        assert_eq!(size_of::<AttentionBackward>(), 264);
        assert_eq!(offset_of!(AttentionBackward, q_strides), 80);
        assert_eq!(offset_of!(AttentionBackward, scale), 224);
        assert_eq!(offset_of!(AttentionBackward, offset), 256);
        // Past 48 KiB a kernel must opt in to its dynamic shared memory.
        assert_eq!(attention_backward_shared_bytes(64), 46_592);
        assert_eq!(attention_backward_shared_bytes(128), 79_360);
    }

    #[test]
    fn every_module_is_ptx_9_0_with_its_kernels() {
        assert_eq!(MODULES.len(), 12);
        for m in MODULES {
            assert!(m.ptx.lines().any(|l| l == ".version 9.0"), "{} is not PTX ISA 9.0", m.name);
            assert!(m.ptx.lines().any(|l| l == ".target sm_80"), "{} does not target sm_80", m.name);
            assert!(!m.ptx.contains('\0'), "{}", m.name);
        }
        let has =
            |module: &str, kernel: &str| super::module(module).unwrap().ptx.contains(&format!(".entry {kernel}("));
        assert!(has("elementwise", "unary_exp_f32"));
        assert!(has("elementwise", "binary_add_bf16"));
        assert!(has("elementwise", "compare_lt_i64"));
        assert!(has("elementwise", "where_bool"));
        assert!(has("cast", "cast_f32_bf16"));
        assert!(has("cast", "cast_bool_bool"));
        assert!(has("fill", "fill_f16"));
        assert!(has("reduce", "reduce_sum_f32"));
        assert!(has("reduce", "reduce_argmax_bf16"));
        assert!(has("softmax", "log_softmax_f64"));
        assert!(has("index", "scatter_add_u8"));
        assert!(has("random", "random_normal_f32"));
        assert!(has("optim", "adam_step_bf16"));
        assert!(has("optim", "sgd_step_f32"));
        assert!(has("norm", "layer_norm_fwd_f32"));
        assert!(has("norm", "layer_norm_bwd_param_f64"));
        assert!(has("norm", "batch_norm_stats_bf16"));
        assert!(has("norm", "batch_norm_bwd_elemt_f16"));
        assert!(has("norm", "batch_norm_stats_rows_bf16"));
        assert!(has("norm", "batch_norm_stats_merge_f32"));
        assert!(has("norm", "batch_norm_bwd_reduce_rows_f64"));
        assert!(has("norm", "batch_norm_bwd_reduce_merge_f64"));
        assert!(has("elementwise", "binary_gelu_backward_bf16"));
        assert!(has("elementwise", "binary_gelu_tanh_backward_f32"));
        for dtype in ["f16", "bf16"] {
            for d in ATTENTION_HEAD_DIMS {
                assert!(has("attention", &format!("attention_forward_{dtype}_d{d}")));
                assert!(has("attention", &format!("attention_backward_{dtype}_d{d}")));
                assert!(has("attention", &format!("attention_forward_dropout_{dtype}_d{d}")));
                assert!(has("attention", &format!("attention_backward_dropout_{dtype}_d{d}")));
            }
            assert!(has("attention", &format!("attention_delta_{dtype}")));
        }
        assert!(module("loss").is_none());
        // Never launched, so removed rather than shipped (ABI.md, "What has no kernel").
        assert!(module("amp").is_none() && module("dropout").is_none());
    }

    #[test]
    fn grids_cover_and_cap() {
        assert_eq!(grid_for(0), 1);
        assert_eq!(grid_for(256), 1);
        assert_eq!(grid_for(257), 2);
        assert_eq!(grid_for(u64::MAX), 65_535);
    }
}
