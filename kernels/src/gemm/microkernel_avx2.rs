//! AVX2+FMA micro-kernels: 16 vector registers hold a 12-accumulator tile
//! (BLIS's Haswell shapes).

use super::microkernel_x86::simd_tile;
use std::arch::x86_64::*;

simd_tile!(
    /// AVX2+FMA f32 tile, 16 x 6: 12 ymm accumulators.
    avx2_f32, "avx2,fma", f32, lanes 8, mv 2, nr 6, prefetch 1,
    c: [_mm256_setzero_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_mul_ps]
);

simd_tile!(
    /// AVX2+FMA f64 tile, 8 x 6: 12 ymm accumulators.
    avx2_f64, "avx2,fma", f64, lanes 4, mv 2, nr 6, prefetch 1,
    c: [_mm256_setzero_pd, _mm256_loadu_pd, _mm256_storeu_pd, _mm256_set1_pd, _mm256_fmadd_pd, _mm256_mul_pd]
);
