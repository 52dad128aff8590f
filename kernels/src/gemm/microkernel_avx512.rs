//! AVX-512F micro-kernels: 32 vector registers hold a 24-accumulator tile
//! plus the A vectors and a broadcast. Per step, 2 vector loads and 12
//! broadcasts feed 24 FMAs, so the two load ports keep up with the two FMA
//! pipes.

use super::microkernel_x86::simd_tile;
use std::arch::x86_64::*;

simd_tile!(
    /// AVX-512 f32 tile, 32 x 12: 24 zmm accumulators.
    avx512_f32, "avx512f", f32, 16, 2, 12,
    _mm512_setzero_ps, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_mul_ps, 2
);

simd_tile!(
    /// AVX-512 f64 tile, 16 x 12: 24 zmm accumulators.
    avx512_f64, "avx512f", f64, 8, 2, 12,
    _mm512_setzero_pd, _mm512_loadu_pd, _mm512_storeu_pd, _mm512_set1_pd, _mm512_fmadd_pd, _mm512_mul_pd, 2
);
