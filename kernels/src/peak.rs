//! This machine's floating-point peak: the denominator of "fraction of peak".
//!
//! [`fma_peak_gflops`] runs, on every thread of the rayon pool at once, a loop
//! of independent FMA chains that touches no memory, on the widest vector
//! unit the CPU has. Twelve chains per thread cover two FMA pipes of latency
//! up to six cycles, so the loop is bound by FMA throughput alone.
//! [`bf16_dot_peak_gflops`] does the same with the bf16 dot-product
//! instruction the bf16 GEMM uses, where the CPU has it.

use crate::cpu_features::cpu_features;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Independent accumulator chains per thread.
const CHAINS: usize = 12;
/// FMA steps per chain between clock reads.
const STEPS: usize = 4096;

/// Measures the f32 FMA peak of this machine in GFLOP/s (one FMA = 2 flops
/// per lane), running every thread of the current rayon pool for about
/// `duration`.
pub fn fma_peak_gflops(duration: Duration) -> f64 {
    let start = Instant::now();
    let flops: f64 = rayon::broadcast(|_| run_for(duration)).into_iter().sum();
    flops / start.elapsed().as_secs_f64() / 1e9
}

/// Runs chunks of the FMA loop until `duration` has passed; returns the
/// flops done.
/// The peak of the bf16 matrix-product path this CPU runs, in GFLOP/s on all
/// threads: AMX's `TDPBF16PS` on tiles in registers where the process can
/// use AMX; else `VDPBF16PS` (16 lanes, two products each) where the CPU has
/// AVX512-BF16 — full rate on Zen 4/5, half the FMA rate on Intel Xeons —
/// else the f32 FMA peak, since bf16 products are then widened to f32.
pub fn bf16_dot_peak_gflops(duration: Duration) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if cpu_features().amx_bf16 {
        // Each thread's rate over the same period: their sum is the
        // machine's.
        // SAFETY: AMX-BF16 is usable by this process.
        let per_thread: Vec<f64> = rayon::broadcast(|_| unsafe { crate::gemm::amx_peak_thread(duration) });
        return per_thread.into_iter().sum();
    }
    #[cfg(target_arch = "x86_64")]
    if cpu_features().avx512bf16 && cpu_features().avx512f {
        let start = Instant::now();
        let flops: f64 = rayon::broadcast(|_| run_chunks_for(duration, bf16_chunk)).into_iter().sum();
        return flops / start.elapsed().as_secs_f64() / 1e9;
    }
    fma_peak_gflops(duration)
}

#[cfg(target_arch = "x86_64")]
fn bf16_chunk() -> f64 {
    // SAFETY: only called where the CPU has AVX512-BF16 and AVX-512F.
    unsafe { x86::chunk_bf16() };
    (STEPS * CHAINS * 16 * 4) as f64
}

fn run_for(duration: Duration) -> f64 {
    run_chunks_for(duration, fma_chunk)
}

fn run_chunks_for(duration: Duration, chunk: fn() -> f64) -> f64 {
    let start = Instant::now();
    let mut flops = 0.0;
    while start.elapsed() < duration {
        flops += chunk();
    }
    flops
}

/// One chunk on the widest unit available; returns its flop count.
fn fma_chunk() -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        let f = cpu_features();
        if f.avx512f {
            // SAFETY: AVX-512F is present.
            unsafe { x86::chunk_avx512() };
            return (STEPS * CHAINS * 16 * 2) as f64;
        }
        if f.has_avx2_fma() {
            // SAFETY: AVX2 and FMA are present.
            unsafe { x86::chunk_avx2() };
            return (STEPS * CHAINS * 8 * 2) as f64;
        }
    }
    let _ = cpu_features;
    chunk_scalar();
    (STEPS * CHAINS * 2) as f64
}

fn chunk_scalar() {
    let mut acc = [0.0f32; CHAINS];
    let (x, y) = (black_box(0.999_f32), black_box(1e-7_f32));
    for _ in 0..STEPS {
        for a in acc.iter_mut() {
            *a = a.mul_add(x, y);
        }
    }
    black_box(acc);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{CHAINS, STEPS};
    use std::arch::x86_64::*;
    use std::hint::black_box;

    macro_rules! chunk {
        ($name:ident, $feature:literal, $set1:ident, $fmadd:ident) => {
            /// Callers check that the CPU supports the target features.
            #[target_feature(enable = $feature)]
            pub(super) fn $name() {
                let x = $set1(black_box(0.999));
                let y = $set1(black_box(1e-7));
                let mut acc = [$set1(black_box(1.0)); CHAINS];
                for _ in 0..STEPS {
                    for a in acc.iter_mut() {
                        *a = $fmadd(*a, x, y);
                    }
                }
                black_box(acc);
            }
        };
    }

    chunk!(chunk_avx512, "avx512f", _mm512_set1_ps, _mm512_fmadd_ps);
    chunk!(chunk_avx2, "avx2,fma", _mm256_set1_ps, _mm256_fmadd_ps);

    /// `CHAINS` independent chains of `VDPBF16PS`: each adds to 16 f32 lanes
    /// the products of two bf16 pairs (4 flops per lane).
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) fn chunk_bf16() {
        // bf16 pairs of 1.0 (0x3F80 twice per 32-bit lane) and tiny addends
        // keep the accumulators finite.
        let x = _mm512_set1_epi32(black_box(0x3F80_3F80u32 as i32));
        let y = _mm512_set1_epi32(black_box(0x3380_3380u32 as i32));
        // SAFETY: both are 64-byte vectors of plain bits.
        let (x, y) =
            unsafe { (std::mem::transmute::<__m512i, __m512bh>(x), std::mem::transmute::<__m512i, __m512bh>(y)) };
        let mut acc = [_mm512_set1_ps(black_box(1.0)); CHAINS];
        for _ in 0..STEPS {
            for a in acc.iter_mut() {
                *a = _mm512_dpbf16_ps(*a, x, y);
            }
        }
        black_box(acc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_is_positive_and_finite() {
        let g = fma_peak_gflops(Duration::from_millis(20));
        assert!(g.is_finite() && g > 0.1, "peak {g} GFLOP/s");
        let bf16 = bf16_dot_peak_gflops(Duration::from_millis(20));
        assert!(bf16.is_finite() && bf16 > 0.1, "bf16 peak {bf16} GFLOP/s");
    }
}
