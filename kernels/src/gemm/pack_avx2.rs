//! AVX2 packing of f32 operands: the layout of [`super::pack`], made with
//! 8-wide vector copies and in-register 8 x 8 transposes, for the AVX2
//! micro-kernels (panels of 16 rows of A, 6 of B).
//!
//! The scalar packer writes a transposed panel (a row-major operand packed
//! along its rows, as both operands of `x · Wᵀ` and the B of every product
//! into a row-major C are) an element at a time, `width` elements apart;
//! on a 2-core AMD EPYC (Zen 3, no AVX-512) packing took 13 % of a GPT
//! training step's time, against under 5 % here. AVX-512 machines have
//! their own packers (`pack_avx512`); these serve every CPU with AVX2.
//!
//! Partial loads at the edges use AVX's masked loads: a masked-off lane is
//! not read, so it may lie outside the view (hence `wrapping_add`), and it
//! loads as zero, which is what the panels' padding rows must hold. Partial
//! stores (every store into a 6-wide panel of B) are split into 4-, 2- and
//! 1-element stores instead: AMD's Zen cores run a masked store
//! (`vmaskmovps`) as a slow microcoded sequence, which made packing with
//! them 13 % slower than the scalar copies it replaces.

use super::matrix::PackShape;
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
    unsafe {
        if shape.rs == 1 {
            copy_columns(dst, src, shape);
        } else {
            debug_assert_eq!(shape.cs, 1);
            transpose_rows(dst, src, shape);
        }
    }
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

/// Rows packed per sweep of the copy path: the panels being written stay
/// few (L1-resident streams) while each source column is read in one go.
const COPY_ROWS: usize = 256;

/// Panel columns are contiguous in the source (`rs == 1`): for a chunk of
/// rows, read each source column once and copy it into the chunk's panels
/// eight elements at a time.
///
/// # Safety
/// As for [`pack_f32`] with `rs == 1`.
#[inline(always)]
unsafe fn copy_columns(dst: *mut f32, src: *const f32, shape: PackShape) {
    let PackShape { rows, depth, cs, width, .. } = shape;
    let chunk = (COPY_ROWS / width).max(1) * width;
    let mut r0 = 0;
    while r0 < rows {
        let chunk_rows = chunk.min(rows - r0);
        // SAFETY: loads are masked to rows `< rows` of columns `< depth`,
        // stores to the `width` rows of panels inside `dst` (contract).
        unsafe {
            for p in 0..depth {
                let s = src.add(p * cs + r0);
                for q in 0..chunk_rows.div_ceil(width) {
                    let live = width.min(chunk_rows - q * width);
                    let d = dst.add((r0 / width + q) * width * depth + p * width);
                    let mut i = 0;
                    while i < width {
                        let v = load_lanes(s.wrapping_add(q * width + i), live.saturating_sub(i));
                        store_lanes(d.add(i), width - i, v);
                        i += 8;
                    }
                }
            }
        }
        r0 += chunk_rows;
    }
}

/// Panel rows are contiguous in the source (`cs == 1`): load 8 rows of 8
/// depth elements, transpose, store 8 panel columns.
///
/// # Safety
/// As for [`pack_f32`] with `cs == 1`.
#[inline(always)]
unsafe fn transpose_rows(dst: *mut f32, src: *const f32, shape: PackShape) {
    let PackShape { rows, depth, rs, width, .. } = shape;
    let panels = rows.div_ceil(width);
    for q in 0..panels {
        let live = width.min(rows - q * width);
        // SAFETY: panel q lies inside `dst` and its rows inside `src`
        // (contract); loads are masked to rows `< live` and columns
        // `< depth`, stores to panel columns `< depth` and rows `< width`.
        unsafe {
            let panel = dst.add(q * width * depth);
            let base = src.add(q * width * rs);
            if q + 1 < panels {
                // The source rows are short streams (kc elements) far apart:
                // ask for the next panel's rows while this one is transposed.
                for i in 0..width.min(rows - (q + 1) * width) {
                    let row = base.add((width + i) * rs);
                    let mut l = 0;
                    while l < depth {
                        _mm_prefetch::<_MM_HINT_T0>(row.add(l) as *const i8);
                        l += 16;
                    }
                }
            }
            let mut p = 0;
            while p < depth {
                let cols = 8.min(depth - p);
                let mut g = 0;
                while g < width {
                    let mut block = [_mm256_setzero_ps(); 8];
                    for (i, v) in block.iter_mut().enumerate().take(live.saturating_sub(g)) {
                        *v = load_lanes(base.add((g + i) * rs + p), cols);
                    }
                    for (j, &v) in transpose8(block).iter().enumerate().take(cols) {
                        store_lanes(panel.add((p + j) * width + g), width - g, v);
                    }
                    g += 8;
                }
                p += 8;
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
