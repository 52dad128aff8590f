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
    /// AVX-512 byte and word instructions (16-bit lanes: bf16 packing and
    /// rounding).
    pub avx512bw: bool,
    /// AVX-512 on 128/256-bit vectors too.
    pub avx512vl: bool,
    /// AVX-512 bfloat16 dot products and conversions.
    pub avx512bf16: bool,
    /// AMX tiles with bf16 products (`TDPBF16PS`), usable by this process:
    /// the CPU has them, the OS saves their state (XCR0) and, on Linux, it
    /// granted the permission to use them (`arch_prctl`).
    pub amx_bf16: bool,
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
                avx512bw: std::arch::is_x86_feature_detected!("avx512bw"),
                avx512vl: std::arch::is_x86_feature_detected!("avx512vl"),
                avx512bf16: std::arch::is_x86_feature_detected!("avx512bf16"),
                amx_bf16: amx::usable(),
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

    /// Whether AVX-512 F, BW and VL are all there: what the loops compiled
    /// for AVX-512 at run time (half-precision element-wise ops, 2x2 max
    /// pooling) are built for.
    pub fn has_avx512_bw_vl(&self) -> bool {
        self.avx512f && self.avx512bw && self.avx512vl
    }
}

/// AMX detection on stable Rust: `is_x86_feature_detected!("amx-bf16")` is
/// unstable, so CPUID, XCR0 and the Linux permission request are read here.
#[cfg(target_arch = "x86_64")]
mod amx {
    use std::arch::asm;
    use std::sync::OnceLock;

    /// CPUID leaf 7 EDX: AMX-BF16 (bit 22) and AMX-TILE (bit 24).
    const CPUID7_EDX_AMX: u32 = (1 << 22) | (1 << 24);
    /// XCR0: the OS saves XTILECFG (bit 17) and XTILEDATA (bit 18).
    const XCR0_TILE: u64 = (1 << 17) | (1 << 18);
    /// CPUID leaf 1 ECX bit 27: OSXSAVE, which makes XGETBV legal.
    const CPUID1_ECX_OSXSAVE: u32 = 1 << 27;

    /// Whether this process may run AMX bf16 instructions; the permission
    /// is requested once per process (it is process-wide: every thread,
    /// earlier ones included, may then use the tiles).
    pub(super) fn usable() -> bool {
        static USABLE: OnceLock<bool> = OnceLock::new();
        *USABLE.get_or_init(|| cpu_has_amx_bf16() && os_saves_tiles() && request_permission())
    }

    fn cpu_has_amx_bf16() -> bool {
        // SAFETY: CPUID is available on every x86-64 CPU.
        #[allow(unused_unsafe)]
        let (max_leaf, leaf7) = unsafe { (std::arch::x86_64::__cpuid(0).eax, std::arch::x86_64::__cpuid_count(7, 0)) };
        max_leaf >= 7 && leaf7.edx & CPUID7_EDX_AMX == CPUID7_EDX_AMX
    }

    fn os_saves_tiles() -> bool {
        // SAFETY: as above.
        #[allow(unused_unsafe)]
        let leaf1 = unsafe { std::arch::x86_64::__cpuid(1) };
        if leaf1.ecx & CPUID1_ECX_OSXSAVE == 0 {
            return false;
        }
        let (lo, hi): (u32, u32);
        // SAFETY: XGETBV with ECX = 0 reads XCR0; OSXSAVE (checked above)
        // makes it legal. It touches no memory.
        unsafe {
            asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags))
        };
        let xcr0 = u64::from(lo) | u64::from(hi) << 32;
        xcr0 & XCR0_TILE == XCR0_TILE
    }

    /// Linux hands out the (8 KiB) tile state only on request:
    /// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`. Without it the
    /// first tile instruction raises SIGILL.
    #[cfg(target_os = "linux")]
    fn request_permission() -> bool {
        const SYS_ARCH_PRCTL: i64 = 158;
        const ARCH_REQ_XCOMP_PERM: u64 = 0x1023;
        const XFEATURE_XTILEDATA: u64 = 18;
        let ret: i64;
        // SAFETY: a raw arch_prctl system call: it reads no user memory for
        // this request and clobbers only RCX and R11, as every syscall.
        unsafe {
            asm!(
                "syscall",
                inlateout("rax") SYS_ARCH_PRCTL => ret,
                in("rdi") ARCH_REQ_XCOMP_PERM,
                in("rsi") XFEATURE_XTILEDATA,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            )
        };
        ret == 0
    }

    /// Other systems: not tried (their permission models differ).
    #[cfg(not(target_os = "linux"))]
    fn request_permission() -> bool {
        false
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

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn amx_detection_is_stable_and_implies_avx512() {
        let first = super::amx::usable();
        assert_eq!(first, super::amx::usable());
        // Every CPU with AMX also has AVX-512 (Sapphire Rapids and later).
        if first {
            assert!(std::arch::is_x86_feature_detected!("avx512f"));
        }
    }

    #[test]
    fn avx512_implies_avx2_on_real_cpus() {
        let f = cpu_features();
        if f.avx512f {
            assert!(f.avx2 && f.fma, "AVX-512 CPU without AVX2/FMA: {f:?}");
        }
    }
}
