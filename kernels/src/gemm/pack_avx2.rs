//! AVX2 packing of f32 operands: the layout of [`super::pack`], made with
//! 8-wide vector copies and in-register 8 x 8 transposes (`pack_simd`'s
//! loops over this module's [`Lanes`]), for the AVX2 micro-kernels (panels
//! of 16 rows of A, 6 of B).
//!
//! The scalar packer writes a transposed panel (a row-major operand packed
//! along its rows, as both operands of `x · Wᵀ` and the B of every product
//! into a row-major C are) an element at a time, `width` elements apart,
//! and copies a contiguous panel column with a `memcpy` call per column;
//! on a 2-core AMD EPYC (Zen 3, no AVX-512) that was 13 % of a GPT
//! training step's time plus 4–6 % in `memcpy`. With these packers it is
//! about 14 % in all, the rest being the wait for operands not in cache
//! (single-thread products 2–5 % faster, 15–19 % on 64 x 64 x 32). AVX-512
//! machines have their own packers (`pack_avx512`); these serve every CPU
//! with AVX2.
//!
//! Partial loads at the edges use AVX's masked loads: a masked-off lane is
//! not read, so it may lie outside the view (hence `wrapping_add`), and it
//! loads as zero, which is what the panels' padding rows must hold. Partial
//! stores (every store into a 6-wide panel of B) are split into 4-, 2- and
//! 1-element stores instead: AMD's Zen cores run a masked store
//! (`vmaskmovps`) as a slow microcoded sequence, which made products
//! packed with them 13 % slower than with the scalar copies.

use super::matrix::PackShape;
use super::pack_simd::{pack, Lanes};
use std::arch::x86_64::*;

/// Packs `rows x depth` f32 read at `src + i * rs + p * cs` into panels of
/// `width` rows, as [`super::pack::pack_panels`] does; one of the strides is
/// 1.
///
/// # Safety
/// AVX2 is available; `rs == 1` or `cs == 1`; every `(i, p)` with
/// `i < rows`, `p < depth` addresses a readable element; `dst` holds
/// `rows.div_ceil(width) * width * depth` writable elements.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn pack_f32(dst: *mut f32, src: *const f32, shape: PackShape) {
    // SAFETY: forwarded contract; the target features are enabled here.
    unsafe { pack::<Avx2F32>(dst, src, shape) }
}

/// Eight lanes of -1 then eight of 0: the mask of the first `n ≤ 8` lanes
/// is the eight elements from index `8 - n`.
const MASK_SOURCE: [i32; 16] = [-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0];

/// Lanes `0..n` set (all for `n ≥ 8`).
#[target_feature(enable = "avx2")]
#[inline]
fn mask(n: usize) -> __m256i {
    // SAFETY: `8 - min(n, 8)` is at most 8, so the eight elements read lie
    // inside the 16-element array.
    unsafe { _mm256_loadu_si256(MASK_SOURCE.as_ptr().add(8 - n.min(8)).cast()) }
}

/// Loads lanes `0..n` from `src` (all for `n ≥ 8`), the rest zero.
///
/// # Safety
/// The `min(n, 8)` elements at `src` are readable.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn load_lanes(src: *const f32, n: usize) -> __m256 {
    // SAFETY: reads only the first `min(n, 8)` elements (contract).
    unsafe {
        if n >= 8 {
            _mm256_loadu_ps(src)
        } else {
            _mm256_maskload_ps(src, mask(n))
        }
    }
}

/// Stores lanes `0..n` of `v` at `dst` (all for `n ≥ 8`), without a masked
/// store (see the module doc).
///
/// # Safety
/// The `min(n, 8)` elements at `dst` are writable.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn store_lanes(dst: *mut f32, n: usize, v: __m256) {
    // SAFETY: writes only the first `min(n, 8)` elements (contract).
    unsafe {
        if n >= 8 {
            _mm256_storeu_ps(dst, v);
            return;
        }
        let (mut d, mut left) = (dst, n);
        let mut part = _mm256_castps256_ps128(v);
        if left >= 4 {
            _mm_storeu_ps(d, part);
            (d, left) = (d.add(4), left - 4);
            part = _mm256_extractf128_ps::<1>(v);
        }
        if left >= 2 {
            _mm_store_sd(d.cast(), _mm_castps_pd(part));
            (d, left) = (d.add(2), left - 2);
            part = _mm_movehl_ps(part, part);
        }
        if left == 1 {
            _mm_store_ss(d, part);
        }
    }
}

/// f32 on AVX2: 8 x 8 blocks.
pub(crate) struct Avx2F32;

impl Lanes for Avx2F32 {
    type Packed = f32;
    type Src = f32;
    const LANES: usize = 8;
    type Block = [__m256; 8];

    #[inline(always)]
    unsafe fn copy_rows(dst: *mut f32, src: *const f32, _cs: usize, _cols: usize, load: usize, store: usize) {
        // SAFETY: reads `load` and writes `store` elements at most (contract).
        unsafe { store_lanes(dst, store, load_lanes(src, load)) }
    }

    #[inline(always)]
    unsafe fn load_block(src: *const f32, rs: usize, rows: usize, cols: usize) -> [__m256; 8] {
        // SAFETY: the entry point has AVX2.
        let mut block = [unsafe { _mm256_setzero_ps() }; 8];
        for (i, v) in block.iter_mut().enumerate().take(rows) {
            // SAFETY: `cols` elements of rows `< rows` are readable (contract).
            *v = unsafe { load_lanes(src.wrapping_add(i * rs), cols) };
        }
        block
    }

    #[inline(always)]
    unsafe fn store_transposed(dst: *mut f32, width: usize, units: usize, lanes: usize, block: [__m256; 8]) {
        // SAFETY: the entry point has AVX2; rows `j < units` of `lanes`
        // elements are writable (contract).
        unsafe {
            for (j, &v) in transpose8(block).iter().enumerate().take(units) {
                store_lanes(dst.wrapping_add(j * width), lanes, v);
            }
        }
    }
}

/// Transposes an 8 x 8 f32 block held as 8 rows.
#[target_feature(enable = "avx2")]
#[inline]
fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    // Rows 2k, 2k + 1 interleaved: t[2k] holds columns 0, 1 | 4, 5 and
    // t[2k + 1] columns 2, 3 | 6, 7 of the two rows.
    let mut t = [_mm256_setzero_ps(); 8];
    for k in 0..4 {
        t[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    // u[4h + c]: column c | c + 4 of rows 4h..4h + 4.
    let mut u = [_mm256_setzero_ps(); 8];
    for h in 0..2 {
        let (a, b, c, d) = (t[4 * h], t[4 * h + 1], t[4 * h + 2], t[4 * h + 3]);
        u[4 * h] = _mm256_shuffle_ps::<0x44>(a, c);
        u[4 * h + 1] = _mm256_shuffle_ps::<0xee>(a, c);
        u[4 * h + 2] = _mm256_shuffle_ps::<0x44>(b, d);
        u[4 * h + 3] = _mm256_shuffle_ps::<0xee>(b, d);
    }
    // Column c: the low halves of u[c] and u[4 + c]; column c + 4 the high ones.
    let mut out = [_mm256_setzero_ps(); 8];
    for c in 0..4 {
        out[c] = _mm256_permute2f128_ps::<0x20>(u[c], u[4 + c]);
        out[c + 4] = _mm256_permute2f128_ps::<0x31>(u[c], u[4 + c]);
    }
    out
}
