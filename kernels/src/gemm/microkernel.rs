//! Micro-kernel selection: which register-blocked tile routine runs, chosen
//! once per call from the CPU's features (or forced by the caller).

use super::blocking::Blocking;
use super::element::{Bf16Pair, Compute, Packed};
use super::microkernel_portable;
use super::pack::PackSimd;
#[cfg(target_arch = "x86_64")]
use super::{microkernel_avx2, microkernel_avx512};
use crate::cpu_features::cpu_features;
use crate::error::{KernelError, Result};

/// Computes one `MR x NR` tile: `C = alpha * A_panel * B_panel + beta * C`,
/// where `A_panel` is `kc` packed columns of `MR` elements, `B_panel` is `kc`
/// packed rows of `NR` elements, and C is column-major with column stride
/// `cs_c`. A packed element `P` holds `P::DEPTH` consecutive depth indices,
/// so the tile's depth is `kc * P::DEPTH`. With `beta == 0`, C is not read.
/// (Reading a column-major A in place instead of packing it was measured
/// slower: the packed panel streams from L2 without TLB misses.)
pub(crate) type MicroKernelFn<T, P> =
    unsafe fn(kc: usize, a: *const P, b: *const P, c: *mut T, cs_c: usize, alpha: T, beta: T);

/// Which micro-kernel family to run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KernelChoice {
    /// The fastest one this CPU supports.
    #[default]
    Auto,
    /// AMX tiles for bf16 products large enough to pay for them
    /// (Sapphire Rapids and later Xeons, x86-64 Linux), the `Avx512Bf16`
    /// kernels for smaller ones and for every other type.
    AmxBf16,
    /// AVX-512F, and for bf16 operands AVX512-BF16 dot products on operands
    /// packed as bf16 pairs (x86-64). Other types run the `Avx512` kernels.
    Avx512Bf16,
    /// AVX-512F (x86-64); bf16 operands are widened to f32 while packed.
    Avx512,
    /// AVX2 with FMA (x86-64).
    Avx2Fma,
    /// Plain Rust, any CPU.
    Portable,
}

impl KernelChoice {
    /// Whether this CPU can run the kernel.
    pub fn is_supported(self) -> bool {
        let cpu = cpu_features();
        match self {
            KernelChoice::Auto | KernelChoice::Portable => true,
            // The pair packers shuffle 16-bit lanes, which takes AVX-512BW
            // (every CPU with AVX512-BF16 has it).
            KernelChoice::AmxBf16 => KernelChoice::Avx512Bf16.is_supported() && cpu.amx_bf16,
            KernelChoice::Avx512Bf16 => KernelChoice::Avx512.is_supported() && cpu.avx512bf16 && cpu.avx512bw,
            KernelChoice::Avx512 => cfg!(target_arch = "x86_64") && cpu.avx512f,
            KernelChoice::Avx2Fma => cfg!(target_arch = "x86_64") && cpu.has_avx2_fma(),
        }
    }

    /// The kernel `Auto` resolves to on this CPU.
    pub fn resolve(self) -> KernelChoice {
        match self {
            // Every product resolves its choice: no allocation here.
            KernelChoice::Auto => {
                Self::FASTEST_FIRST.into_iter().find(|k| k.is_supported()).unwrap_or(KernelChoice::Portable)
            }
            other => other,
        }
    }

    /// Every concrete kernel, fastest first.
    const FASTEST_FIRST: [KernelChoice; 5] = [
        KernelChoice::AmxBf16,
        KernelChoice::Avx512Bf16,
        KernelChoice::Avx512,
        KernelChoice::Avx2Fma,
        KernelChoice::Portable,
    ];

    /// Every concrete kernel this CPU supports, fastest first.
    pub fn supported() -> Vec<KernelChoice> {
        Self::FASTEST_FIRST.into_iter().filter(|k| k.is_supported()).collect()
    }

    fn name(self) -> &'static str {
        match self {
            KernelChoice::Auto => "auto",
            KernelChoice::AmxBf16 => "amx+bf16",
            KernelChoice::Avx512Bf16 => "avx512+bf16",
            KernelChoice::Avx512 => "avx512",
            KernelChoice::Avx2Fma => "avx2+fma",
            KernelChoice::Portable => "portable",
        }
    }
}

/// A micro-kernel with its tile shape and default blocking.
#[derive(Clone, Copy)]
pub(crate) struct MicroKernel<T, P> {
    pub mr: usize,
    pub nr: usize,
    pub func: MicroKernelFn<T, P>,
    pub blocking: Blocking,
    /// The vector packers of the kernel's instruction set.
    pub simd_pack: PackSimd,
}

/// The largest `mr * nr` of any kernel: size of the edge-tile scratch.
pub(crate) const MAX_TILE: usize = 32 * 12;

/// A kernel table entry: `mc` rows and `kc` depth elements per packed block.
fn kernel<T, P>(mr: usize, nr: usize, func: MicroKernelFn<T, P>, mc: usize, kc: usize) -> MicroKernel<T, P> {
    MicroKernel { mr, nr, func, blocking: Blocking { mc, kc, nc: 4080 }, simd_pack: PackSimd::Scalar }
}

/// [`kernel`] for the AVX-512 kernels, which also pack with AVX-512.
fn avx512_kernel<T, P>(mr: usize, nr: usize, func: MicroKernelFn<T, P>, mc: usize, kc: usize) -> MicroKernel<T, P> {
    MicroKernel { simd_pack: PackSimd::Avx512, ..kernel(mr, nr, func, mc, kc) }
}

/// [`kernel`] for the AVX2 kernels, which also pack with AVX2.
#[cfg(target_arch = "x86_64")]
fn avx2_kernel<T, P>(mr: usize, nr: usize, func: MicroKernelFn<T, P>, mc: usize, kc: usize) -> MicroKernel<T, P> {
    MicroKernel { simd_pack: PackSimd::Avx2, ..kernel(mr, nr, func, mc, kc) }
}

/// Per accumulator type `T`, the kernel of each family that reads packed
/// elements of this type.
pub(crate) trait HasMicroKernels<T: Compute>: Packed {
    /// The kernel of the concrete family `choice`, if there is one.
    fn micro_kernel(choice: KernelChoice) -> Option<MicroKernel<T, Self>>;
}

/// The kernel for `choice`, or an error when this CPU cannot run it.
pub(crate) fn select<T: Compute, P: HasMicroKernels<T>>(choice: KernelChoice) -> Result<MicroKernel<T, P>> {
    let concrete = choice.resolve();
    let unsupported = KernelError::UnsupportedKernel { kernel: concrete.name() };
    if !concrete.is_supported() {
        return Err(unsupported);
    }
    P::micro_kernel(concrete).ok_or(unsupported)
}

// Tile shapes: AVX-512 keeps 24 accumulators, AVX2 12 (BLIS's Haswell
// shapes); the blockings were measured with the `gemm_tune` example.
impl HasMicroKernels<f32> for f32 {
    fn micro_kernel(choice: KernelChoice) -> Option<MicroKernel<f32, f32>> {
        Some(match choice {
            #[cfg(target_arch = "x86_64")]
            KernelChoice::Avx512 | KernelChoice::Avx512Bf16 | KernelChoice::AmxBf16 => {
                avx512_kernel(32, 12, microkernel_avx512::avx512_f32, 256, 256)
            }
            #[cfg(target_arch = "x86_64")]
            KernelChoice::Avx2Fma => avx2_kernel(16, 6, microkernel_avx2::avx2_f32, 192, 256),
            _ => kernel(8, 4, microkernel_portable::tile::<f32, 8, 4>, 128, 256),
        })
    }
}

impl HasMicroKernels<f64> for f64 {
    fn micro_kernel(choice: KernelChoice) -> Option<MicroKernel<f64, f64>> {
        Some(match choice {
            #[cfg(target_arch = "x86_64")]
            KernelChoice::Avx512 | KernelChoice::Avx512Bf16 | KernelChoice::AmxBf16 => {
                avx512_kernel(16, 12, microkernel_avx512::avx512_f64, 128, 256)
            }
            #[cfg(target_arch = "x86_64")]
            KernelChoice::Avx2Fma => avx2_kernel(8, 6, microkernel_avx2::avx2_f64, 96, 256),
            _ => kernel(4, 4, microkernel_portable::tile::<f64, 4, 4>, 128, 256),
        })
    }
}

impl HasMicroKernels<f32> for Bf16Pair {
    fn micro_kernel(choice: KernelChoice) -> Option<MicroKernel<f32, Bf16Pair>> {
        match choice {
            // The f32 kernel's tile and bytes per block: a pair is 4 bytes.
            #[cfg(target_arch = "x86_64")]
            // AMX products smaller than its threshold run this one too.
            KernelChoice::Avx512Bf16 | KernelChoice::AmxBf16 => {
                Some(avx512_kernel(32, 12, microkernel_avx512::avx512_bf16, 256, 512))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_fit_the_scratch() {
        for choice in KernelChoice::supported() {
            let k32 = <f32 as HasMicroKernels<f32>>::micro_kernel(choice).unwrap();
            let k64 = <f64 as HasMicroKernels<f64>>::micro_kernel(choice).unwrap();
            assert!(k32.mr * k32.nr <= MAX_TILE);
            assert!(k64.mr * k64.nr <= MAX_TILE);
            if let Some(k) = Bf16Pair::micro_kernel(choice) {
                assert!(k.mr * k.nr <= MAX_TILE);
                assert!(matches!(choice, KernelChoice::Avx512Bf16 | KernelChoice::AmxBf16));
            }
        }
    }

    #[test]
    fn auto_resolves_to_a_supported_kernel() {
        let k = KernelChoice::Auto.resolve();
        assert_ne!(k, KernelChoice::Auto);
        assert!(k.is_supported());
        assert_eq!(KernelChoice::supported()[0], k);
        assert!(select::<f32, f32>(KernelChoice::Auto).is_ok());
    }

    #[test]
    fn selection_agrees_with_support() {
        for choice in KernelChoice::FASTEST_FIRST {
            let selected = select::<f32, f32>(choice);
            assert_eq!(selected.is_ok(), choice.is_supported(), "{choice:?}");
            if let Err(e) = selected {
                assert!(matches!(e, KernelError::UnsupportedKernel { .. }));
            }
        }
        // Pairs have only the AVX512-BF16 kernel.
        let pairs = select::<f32, Bf16Pair>(KernelChoice::Avx512Bf16);
        assert_eq!(pairs.is_ok(), KernelChoice::Avx512Bf16.is_supported());
        assert!(select::<f32, Bf16Pair>(KernelChoice::Portable).is_err());
    }
}
