//! Runtime CPU-feature detection, done once and cached.
//!
//! The kernels are compiled for the baseline target and pick their
//! instruction set at run time, so one binary runs everywhere and still uses
//! AVX-512 where it exists.

use std::sync::OnceLock;

/// The instruction-set extensions the kernels care about.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuFeatures {
    /// AVX-512 Foundation (512-bit vectors, 32 vector registers, masks).
    pub avx512f: bool,
    /// AVX2 (256-bit integer and float vectors).
    pub avx2: bool,
    /// Fused multiply-add on 128/256-bit vectors.
    pub fma: bool,
    /// Half-precision conversion instructions.
    pub f16c: bool,
    /// AVX-512 bfloat16 dot products and conversions.
    pub avx512bf16: bool,
}

impl CpuFeatures {
    /// Detects the features of the CPU this process runs on.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            CpuFeatures {
                avx512f: std::arch::is_x86_feature_detected!("avx512f"),
                avx2: std::arch::is_x86_feature_detected!("avx2"),
                fma: std::arch::is_x86_feature_detected!("fma"),
                f16c: std::arch::is_x86_feature_detected!("f16c"),
                avx512bf16: std::arch::is_x86_feature_detected!("avx512bf16"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            CpuFeatures::default()
        }
    }

    /// Whether the AVX2 + FMA kernels can run.
    pub fn has_avx2_fma(&self) -> bool {
        self.avx2 && self.fma
    }
}

/// The features of this CPU, detected on first use and cached.
pub fn cpu_features() -> &'static CpuFeatures {
    static FEATURES: OnceLock<CpuFeatures> = OnceLock::new();
    FEATURES.get_or_init(CpuFeatures::detect)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_matches_fresh_detection() {
        assert_eq!(*cpu_features(), CpuFeatures::detect());
    }

    #[test]
    fn avx512_implies_avx2_on_real_cpus() {
        let f = cpu_features();
        if f.avx512f {
            assert!(f.avx2 && f.fma, "AVX-512 CPU without AVX2/FMA: {f:?}");
        }
    }
}
