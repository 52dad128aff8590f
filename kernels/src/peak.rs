//! This machine's floating-point peak: the denominator of "fraction of peak".
//!
//! [`fma_peak_gflops`] runs, on every thread of the rayon pool at once, a loop
//! of independent FMA chains that touches no memory, on the widest vector
//! unit the CPU has. Twelve chains per thread cover two FMA pipes of latency
//! up to six cycles, so the loop is bound by FMA throughput alone.

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
fn run_for(duration: Duration) -> f64 {
    let start = Instant::now();
    let mut flops = 0.0;
    while start.elapsed() < duration {
        flops += fma_chunk();
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_is_positive_and_finite() {
        let g = fma_peak_gflops(Duration::from_millis(20));
        assert!(g.is_finite() && g > 0.1, "peak {g} GFLOP/s");
    }
}
