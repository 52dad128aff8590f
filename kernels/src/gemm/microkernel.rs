//! Micro-kernel selection: which register-blocked tile routine runs, chosen
//! once per call from the CPU's features (or forced by the caller).

use super::blocking::Blocking;
use super::element::Compute;
use super::microkernel_portable;
#[cfg(target_arch = "x86_64")]
use super::{microkernel_avx2, microkernel_avx512};
use crate::cpu_features::cpu_features;
use crate::error::{KernelError, Result};

/// Computes one `MR x NR` tile: `C = alpha * A_panel * B_panel + beta * C`,
/// where `A_panel` is `kc` packed columns of `MR` elements, `B_panel` is `kc`
/// packed rows of `NR` elements, and C is column-major with column stride
/// `cs_c`. With `beta == 0`, C is not read. (Reading a column-major A in
/// place instead of packing it was measured slower: the packed panel streams
/// from L2 without TLB misses.)
pub(crate) type MicroKernelFn<T> =
    unsafe fn(kc: usize, a: *const T, b: *const T, c: *mut T, cs_c: usize, alpha: T, beta: T);

/// Which micro-kernel family to run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KernelChoice {
    /// The fastest one this CPU supports.
    #[default]
    Auto,
    /// AVX-512F (x86-64).
    Avx512,
    /// AVX2 with FMA (x86-64).
    Avx2Fma,
    /// Plain Rust, any CPU.
    Portable,
}

impl KernelChoice {
    /// Whether this CPU can run the kernel.
    pub fn is_supported(self) -> bool {
        match self {
            KernelChoice::Auto | KernelChoice::Portable => true,
            KernelChoice::Avx512 => cfg!(target_arch = "x86_64") && cpu_features().avx512f,
            KernelChoice::Avx2Fma => cfg!(target_arch = "x86_64") && cpu_features().has_avx2_fma(),
        }
    }

    /// The kernel `Auto` resolves to on this CPU.
    pub fn resolve(self) -> KernelChoice {
        match self {
            KernelChoice::Auto if KernelChoice::Avx512.is_supported() => KernelChoice::Avx512,
            KernelChoice::Auto if KernelChoice::Avx2Fma.is_supported() => KernelChoice::Avx2Fma,
            KernelChoice::Auto => KernelChoice::Portable,
            other => other,
        }
    }

    /// Every concrete kernel this CPU supports, fastest first.
    pub fn supported() -> Vec<KernelChoice> {
        [KernelChoice::Avx512, KernelChoice::Avx2Fma, KernelChoice::Portable]
            .into_iter()
            .filter(|k| k.is_supported())
            .collect()
    }

    fn name(self) -> &'static str {
        match self {
            KernelChoice::Auto => "auto",
            KernelChoice::Avx512 => "avx512",
            KernelChoice::Avx2Fma => "avx2+fma",
            KernelChoice::Portable => "portable",
        }
    }
}

/// A micro-kernel with its tile shape and default blocking.
#[derive(Clone, Copy)]
pub(crate) struct MicroKernel<T> {
    pub mr: usize,
    pub nr: usize,
    pub func: MicroKernelFn<T>,
    pub blocking: Blocking,
    /// Pack with AVX-512 (only set on kernels that require it).
    pub simd_pack: bool,
}

/// The largest `mr * nr` of any kernel: size of the edge-tile scratch.
pub(crate) const MAX_TILE: usize = 32 * 12;

/// Per compute type, the kernel of each family.
pub(crate) trait HasMicroKernels: Compute {
    fn micro_kernel(choice: KernelChoice) -> MicroKernel<Self>;
}

/// The kernel for `choice`, or an error when this CPU cannot run it.
pub(crate) fn select<T: HasMicroKernels>(choice: KernelChoice) -> Result<MicroKernel<T>> {
    let concrete = choice.resolve();
    if !concrete.is_supported() {
        return Err(KernelError::UnsupportedKernel { kernel: concrete.name() });
    }
    Ok(T::micro_kernel(concrete))
}

impl HasMicroKernels for f32 {
    fn micro_kernel(choice: KernelChoice) -> MicroKernel<f32> {
        match choice {
            #[cfg(target_arch = "x86_64")]
            KernelChoice::Avx512 => MicroKernel {
                mr: 32,
                nr: 12,
                func: microkernel_avx512::avx512_f32,
                blocking: Blocking { mc: 256, kc: 256, nc: 4080 },
                simd_pack: true,
            },
            #[cfg(target_arch = "x86_64")]
            KernelChoice::Avx2Fma => MicroKernel {
                mr: 16,
                nr: 6,
                func: microkernel_avx2::avx2_f32,
                blocking: Blocking { mc: 192, kc: 256, nc: 4080 },
                simd_pack: false,
            },
            _ => MicroKernel {
                mr: 8,
                nr: 4,
                func: microkernel_portable::tile::<f32, 8, 4>,
                blocking: Blocking { mc: 128, kc: 256, nc: 4096 },
                simd_pack: false,
            },
        }
    }
}

impl HasMicroKernels for f64 {
    fn micro_kernel(choice: KernelChoice) -> MicroKernel<f64> {
        match choice {
            #[cfg(target_arch = "x86_64")]
            KernelChoice::Avx512 => MicroKernel {
                mr: 16,
                nr: 12,
                func: microkernel_avx512::avx512_f64,
                blocking: Blocking { mc: 128, kc: 256, nc: 4080 },
                simd_pack: true,
            },
            #[cfg(target_arch = "x86_64")]
            KernelChoice::Avx2Fma => MicroKernel {
                mr: 8,
                nr: 6,
                func: microkernel_avx2::avx2_f64,
                blocking: Blocking { mc: 96, kc: 256, nc: 4080 },
                simd_pack: false,
            },
            _ => MicroKernel {
                mr: 4,
                nr: 4,
                func: microkernel_portable::tile::<f64, 4, 4>,
                blocking: Blocking { mc: 128, kc: 256, nc: 4096 },
                simd_pack: false,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_fit_the_scratch() {
        for choice in KernelChoice::supported() {
            let k32 = f32::micro_kernel(choice);
            let k64 = f64::micro_kernel(choice);
            assert!(k32.mr * k32.nr <= MAX_TILE);
            assert!(k64.mr * k64.nr <= MAX_TILE);
        }
    }

    #[test]
    fn auto_resolves_to_a_supported_kernel() {
        let k = KernelChoice::Auto.resolve();
        assert_ne!(k, KernelChoice::Auto);
        assert!(k.is_supported());
        assert_eq!(KernelChoice::supported()[0], k);
        assert!(select::<f32>(KernelChoice::Auto).is_ok());
    }

    #[test]
    fn selection_agrees_with_support() {
        for choice in [KernelChoice::Avx512, KernelChoice::Avx2Fma, KernelChoice::Portable] {
            let selected = select::<f32>(choice);
            assert_eq!(selected.is_ok(), choice.is_supported(), "{choice:?}");
            if let Err(e) = selected {
                assert!(matches!(e, KernelError::UnsupportedKernel { .. }));
            }
        }
    }
}
