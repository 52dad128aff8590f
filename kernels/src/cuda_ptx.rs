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
    "amp",
    "dropout",
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
    }

    #[test]
    fn every_module_is_ptx_9_0_with_its_kernels() {
        assert_eq!(MODULES.len(), 13);
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
        assert!(has("elementwise", "binary_gelu_backward_bf16"));
        assert!(has("elementwise", "binary_gelu_tanh_backward_f32"));
        assert!(has("amp", "amp_unscale_f32"));
        assert!(has("dropout", "dropout_f16"));
        assert!(module("loss").is_none());
    }

    #[test]
    fn grids_cover_and_cap() {
        assert_eq!(grid_for(0), 1);
        assert_eq!(grid_for(256), 1);
        assert_eq!(grid_for(257), 2);
        assert_eq!(grid_for(u64::MAX), 65_535);
    }
}
