//! AVX-512F micro-kernels: 32 vector registers hold a 24-accumulator tile
//! plus the A vectors and a broadcast. Per step, 2 vector loads and 12
//! broadcasts feed 24 FMAs, so the two load ports keep up with the two FMA
//! pipes.
//!
//! The bf16 kernel has the f32 kernel's shape, but each step takes a pair of
//! depth indices: `VDPBF16PS` multiplies the bf16 pairs of A and B (exact
//! products, as bf16 has 8 significant bits) and adds both to the f32
//! accumulator, so one instruction does twice an FMA's work. Like every
//! `VDPBF16PS`, it treats bf16 subnormal inputs as zero and flushes
//! subnormal sums to zero; accumulation is in f32, rounded to nearest even.

use super::element::Bf16Pair;
use super::microkernel_x86::simd_tile;
use std::arch::x86_64::*;

simd_tile!(
    /// AVX-512 f32 tile, 32 x 12: 24 zmm accumulators.
    avx512_f32, "avx512f", f32, lanes 16, mv 2, nr 12, prefetch 2,
    c: [_mm512_setzero_ps, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_mul_ps]
);

simd_tile!(
    /// AVX-512 f64 tile, 16 x 12: 24 zmm accumulators.
    avx512_f64, "avx512f", f64, lanes 8, mv 2, nr 12, prefetch 2,
    c: [_mm512_setzero_pd, _mm512_loadu_pd, _mm512_storeu_pd, _mm512_set1_pd, _mm512_fmadd_pd, _mm512_mul_pd]
);

simd_tile!(
    /// AVX512-BF16 tile of bf16 pairs, 32 x 12 f32 accumulators: 24 zmm.
    avx512_bf16, "avx512f,avx512bf16", Bf16Pair => f32, lanes 16, mv 2, nr 12, prefetch 2,
    c: [_mm512_setzero_ps, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_mul_ps],
    ab: [zero_pairs, load_pairs, splat_pair, dot_pairs]
);

/// A vector of zero pairs.
#[target_feature(enable = "avx512f,avx512bf16")]
fn zero_pairs() -> __m512bh {
    // SAFETY: both are 64-byte vectors of plain bits.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_setzero_si512()) }
}

/// Loads 16 pairs.
///
/// # Safety
/// `p` points to 16 readable pairs.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn load_pairs(p: *const Bf16Pair) -> __m512bh {
    // SAFETY: 64 readable bytes (caller's contract); both are 64-byte
    // vectors of plain bits.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p.cast())) }
}

/// One pair in every lane.
#[target_feature(enable = "avx512f,avx512bf16")]
fn splat_pair(x: Bf16Pair) -> __m512bh {
    // SAFETY: both are 64-byte vectors of plain bits.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(x.0 as i32)) }
}

/// `acc + a.lo * b.lo + a.hi * b.hi`, lane by lane.
#[target_feature(enable = "avx512f,avx512bf16")]
fn dot_pairs(a: __m512bh, b: __m512bh, acc: __m512) -> __m512 {
    _mm512_dpbf16_ps(acc, a, b)
}
