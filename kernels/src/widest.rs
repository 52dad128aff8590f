//! Loops compiled for the widest vectors the CPU has, picked at run time.
//!
//! The crate is built for baseline x86-64 (SSE2), where some loops stay
//! scalar or 4 lanes wide: half-precision widening, rounding and narrowing
//! do not map onto SSE2. A loop written once as a [`WideLoop`] (its `run`
//! always inlined) is compiled three times: inside an AVX-512 (F, BW, VL)
//! function, inside an AVX2 one, and as it is; [`on_widest`] runs the first
//! the CPU supports. The code is the same in all three, so results are too
//! (Rust does not fuse a multiply and an add into an FMA on its own).
//!
//! ```ignore
//! struct Double<'a>(&'a mut [f32]);
//! impl WideLoop for Double<'_> {
//!     type Output = ();
//!     #[inline(always)]
//!     fn run(self) {
//!         self.0.iter_mut().for_each(|x| *x *= 2.0);
//!     }
//! }
//! on_widest(Double(&mut values));
//! ```

/// A loop and its arguments, as a value [`on_widest`] can run compiled for
/// each instruction set. Implementations mark `run` `#[inline(always)]`:
/// a call left out of line would run the baseline build.
pub(crate) trait WideLoop {
    type Output;
    fn run(self) -> Self::Output;
}

/// Runs `work` compiled for AVX-512 (F, BW, VL) or AVX2 when the CPU has
/// them, else the baseline build.
#[inline]
pub(crate) fn on_widest<W: WideLoop>(work: W) -> W::Output {
    #[cfg(target_arch = "x86_64")]
    {
        let cpu = crate::cpu_features::cpu_features();
        if cpu.has_avx512_bw_vl() {
            // SAFETY: the CPU has AVX-512F, BW and VL.
            return unsafe { on_avx512(work) };
        }
        if cpu.avx2 {
            // SAFETY: the CPU has AVX2.
            return unsafe { on_avx2(work) };
        }
    }
    work.run()
}

/// [`on_widest`] when `wide`, else the baseline build: for loops that gain
/// only for some element types (the half types, whose conversions do not
/// vectorise on SSE2).
#[inline]
pub(crate) fn on_widest_if<W: WideLoop>(wide: bool, work: W) -> W::Output {
    if wide {
        on_widest(work)
    } else {
        work.run()
    }
}

/// # Safety
/// The CPU has AVX-512F, BW and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn on_avx512<W: WideLoop>(work: W) -> W::Output {
    work.run()
}

/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn on_avx2<W: WideLoop>(work: W) -> W::Output {
    work.run()
}
