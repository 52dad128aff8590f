//! AVX-512 packing for f32 and f64 operands: the same layout as
//! [`super::pack`], made with vector copies and in-register transposes.
//!
//! A row-major operand packed along its rows (`A` of `C = A B` when C is
//! row-major, or either operand of `A B^T`) needs a transpose: each panel
//! reads `width` rows of `kc` contiguous elements and writes `kc` groups of
//! `width`. Done an element at a time that costs about as much as a fifth of
//! the multiplication on 1024-sized products; here a 16 x 16 (f32) or 8 x 8
//! (f64) block is loaded, transposed with shuffles and stored at once.

use std::arch::x86_64::*;

/// Packs `rows x depth` elements read at `src + i * rs + p * cs` into panels
/// of `width` rows, as [`super::pack::pack_panels`] does.
///
/// # Safety
/// AVX-512F is available; every `(i, p)` with `i < rows`, `p < depth`
/// addresses a readable element; `dst` holds
/// `rows.div_ceil(width) * width * depth` writable elements.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn pack_f32(
    dst: *mut f32,
    src: *const f32,
    rows: usize,
    depth: usize,
    rs: usize,
    cs: usize,
    width: usize,
) {
    if rs == 1 {
        // SAFETY: forwarded contract.
        unsafe { copy_columns_f32(dst, src, rows, depth, cs, width) };
        return;
    }
    let panels = rows.div_ceil(width);
    for q in 0..panels {
        let live = width.min(rows - q * width);
        // SAFETY: panel q lies inside `dst` and its rows inside `src`
        // (caller's contract); every access below stays within the panel's
        // `live` rows, `depth` columns and `width * depth` outputs.
        unsafe {
            let panel = dst.add(q * width * depth);
            let base = src.add(q * width * rs);
            if cs == 1 {
                if q + 1 < panels {
                    // The source rows are short streams (kc elements) far
                    // apart: ask for the next panel's rows while this one
                    // is transposed.
                    prefetch_rows(base.add(width * rs), width.min(rows - (q + 1) * width), depth, rs);
                }
                transpose_rows_f32(panel, base, live, depth, rs, width);
            } else {
                for p in 0..depth {
                    for i in 0..width {
                        *panel.add(p * width + i) = if i < live { *base.add(i * rs + p * cs) } else { 0.0 };
                    }
                }
            }
        }
    }
}

/// Prefetches `rows` rows of `len` contiguous elements, `rs` apart.
///
/// # Safety
/// The rows lie inside one allocation.
#[inline(always)]
unsafe fn prefetch_rows<T>(base: *const T, rows: usize, len: usize, rs: usize) {
    let per_line = 64 / size_of::<T>();
    for i in 0..rows {
        let mut l = 0;
        while l < len {
            // SAFETY: inside the rows (caller's contract); prefetches never fault.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(base.add(i * rs + l) as *const i8) };
            l += per_line;
        }
    }
}

/// Source columns ahead of the one being copied that are prefetched.
const PREFETCH_COLUMNS: usize = 8;

/// Rows packed per sweep of the copy path: the panels being written stay
/// few (L1-resident streams) while each source column is read in one go.
const COPY_ROWS: usize = 256;

/// Lanes `0..n` set.
#[inline(always)]
fn mask16(n: usize) -> __mmask16 {
    if n >= 16 {
        0xffff
    } else {
        ((1u32 << n) - 1) as __mmask16
    }
}

/// Panel columns are contiguous in the source (`rs == 1`): for a chunk of
/// rows, read each source column once, contiguously, and scatter it over the
/// chunk's panels with masked vector copies.
///
/// # Safety
/// As for [`pack_f32`] with `rs == 1`.
#[target_feature(enable = "avx512f")]
unsafe fn copy_columns_f32(dst: *mut f32, src: *const f32, rows: usize, depth: usize, cs: usize, width: usize) {
    let chunk = (COPY_ROWS / width).max(1) * width;
    let mut r0 = 0;
    while r0 < rows {
        let chunk_rows = chunk.min(rows - r0);
        // SAFETY: reads rows `r0..r0 + chunk_rows` (< rows) of columns
        // `< depth`; writes whole panels of the chunk inside `dst`.
        unsafe {
            for p in 0..depth {
                if p + PREFETCH_COLUMNS < depth {
                    prefetch_rows(src.add((p + PREFETCH_COLUMNS) * cs + r0), 1, chunk_rows, 0);
                }
                let s = src.add(p * cs + r0);
                for q in 0..chunk_rows.div_ceil(width) {
                    let live = width.min(chunk_rows - q * width);
                    let d = dst.add((r0 / width + q) * width * depth + p * width);
                    let sq = s.add(q * width);
                    let mut i = 0;
                    while i < width {
                        // Lanes past `live` are masked off and never read.
                        let v = _mm512_maskz_loadu_ps(mask16(live.saturating_sub(i)), sq.wrapping_add(i));
                        _mm512_mask_storeu_ps(d.add(i), mask16(width - i), v);
                        i += 16;
                    }
                }
            }
        }
        r0 += chunk_rows;
    }
}

/// Panel rows are contiguous in the source: transpose 16 x 16 blocks.
#[target_feature(enable = "avx512f")]
unsafe fn transpose_rows_f32(panel: *mut f32, base: *const f32, live: usize, depth: usize, rs: usize, width: usize) {
    // SAFETY: loads touch rows `< live` and columns `< depth` only (masked);
    // stores touch packed columns `< depth` and rows `< width` only.
    unsafe {
        let mut p = 0;
        while p < depth {
            let cols = 16.min(depth - p);
            let load_mask = mask16(cols);
            let mut g = 0;
            while g < width {
                // Fixed trip counts keep the block in registers; rows past
                // `live` and columns past `depth` are masked off (a masked-off
                // lane is never read or written, so its address may be
                // outside the view: hence `wrapping_add`).
                let rows_here = live.saturating_sub(g);
                let mut r = [_mm512_setzero_ps(); 16];
                for (i, v) in r.iter_mut().enumerate() {
                    let m = if i < rows_here { load_mask } else { 0 };
                    *v = _mm512_maskz_loadu_ps(m, base.wrapping_add((g + i) * rs + p));
                }
                let t = transpose16(r);
                let store_mask = mask16(width - g);
                for (j, &v) in t.iter().enumerate() {
                    let m = if j < cols { store_mask } else { 0 };
                    _mm512_mask_storeu_ps(panel.wrapping_add((p + j) * width + g), m, v);
                }
                g += 16;
            }
            p += 16;
        }
    }
}

/// Transposes a 16 x 16 f32 block held as 16 rows.
#[target_feature(enable = "avx512f")]
fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
    // 32-bit interleave within 128-bit lanes.
    let mut t = [_mm512_setzero_ps(); 16];
    for k in 0..8 {
        t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    // 64-bit interleave: u[4k + c], lane L = rows 4k..4k+4 of column 4L + c.
    let mut u = [_mm512_setzero_ps(); 16];
    for k in 0..4 {
        let (a, b, c, d) = (
            _mm512_castps_pd(t[4 * k]),
            _mm512_castps_pd(t[4 * k + 1]),
            _mm512_castps_pd(t[4 * k + 2]),
            _mm512_castps_pd(t[4 * k + 3]),
        );
        u[4 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[4 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[4 * k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        u[4 * k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    // Gather the 128-bit lanes: out[4L + c] = lane L of u[c], u[4+c], u[8+c], u[12+c].
    let mut out = [_mm512_setzero_ps(); 16];
    for c in 0..4 {
        let v1 = _mm512_shuffle_f32x4::<0x88>(u[c], u[4 + c]);
        let v2 = _mm512_shuffle_f32x4::<0xdd>(u[c], u[4 + c]);
        let w1 = _mm512_shuffle_f32x4::<0x88>(u[8 + c], u[12 + c]);
        let w2 = _mm512_shuffle_f32x4::<0xdd>(u[8 + c], u[12 + c]);
        out[c] = _mm512_shuffle_f32x4::<0x88>(v1, w1);
        out[8 + c] = _mm512_shuffle_f32x4::<0xdd>(v1, w1);
        out[4 + c] = _mm512_shuffle_f32x4::<0x88>(v2, w2);
        out[12 + c] = _mm512_shuffle_f32x4::<0xdd>(v2, w2);
    }
    out
}

/// f64 version of [`pack_f32`].
///
/// # Safety
/// As for [`pack_f32`].
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn pack_f64(
    dst: *mut f64,
    src: *const f64,
    rows: usize,
    depth: usize,
    rs: usize,
    cs: usize,
    width: usize,
) {
    if rs == 1 {
        let chunk = (COPY_ROWS / width).max(1) * width;
        let mut r0 = 0;
        while r0 < rows {
            let chunk_rows = chunk.min(rows - r0);
            // SAFETY: as in `copy_columns_f32`.
            unsafe {
                for p in 0..depth {
                    if p + PREFETCH_COLUMNS < depth {
                        prefetch_rows(src.add((p + PREFETCH_COLUMNS) * cs + r0), 1, chunk_rows, 0);
                    }
                    let s = src.add(p * cs + r0);
                    for q in 0..chunk_rows.div_ceil(width) {
                        let live = width.min(chunk_rows - q * width);
                        let d = dst.add((r0 / width + q) * width * depth + p * width);
                        let sq = s.add(q * width);
                        let mut i = 0;
                        while i < width {
                            let v = _mm512_maskz_loadu_pd(mask8(live.saturating_sub(i)), sq.wrapping_add(i));
                            _mm512_mask_storeu_pd(d.add(i), mask8(width - i), v);
                            i += 8;
                        }
                    }
                }
            }
            r0 += chunk_rows;
        }
        return;
    }
    let panels = rows.div_ceil(width);
    for q in 0..panels {
        let live = width.min(rows - q * width);
        // SAFETY: as in `pack_f32`.
        unsafe {
            let panel = dst.add(q * width * depth);
            let base = src.add(q * width * rs);
            if cs == 1 {
                if q + 1 < panels {
                    prefetch_rows(base.add(width * rs), width.min(rows - (q + 1) * width), depth, rs);
                }
                let mut p = 0;
                while p < depth {
                    let cols = 8.min(depth - p);
                    let mut g = 0;
                    while g < width {
                        // As in `transpose_rows_f32`: fixed trip counts, masks.
                        let rows_here = live.saturating_sub(g);
                        let mut r = [_mm512_setzero_pd(); 8];
                        for (i, v) in r.iter_mut().enumerate() {
                            let m = if i < rows_here { mask8(cols) } else { 0 };
                            *v = _mm512_maskz_loadu_pd(m, base.wrapping_add((g + i) * rs + p));
                        }
                        let t = transpose8(r);
                        for (j, &v) in t.iter().enumerate() {
                            let m = if j < cols { mask8(width - g) } else { 0 };
                            _mm512_mask_storeu_pd(panel.wrapping_add((p + j) * width + g), m, v);
                        }
                        g += 8;
                    }
                    p += 8;
                }
            } else {
                for p in 0..depth {
                    for i in 0..width {
                        *panel.add(p * width + i) = if i < live { *base.add(i * rs + p * cs) } else { 0.0 };
                    }
                }
            }
        }
    }
}

/// Lanes `0..n` set, for 8-lane vectors.
#[inline(always)]
fn mask8(n: usize) -> __mmask8 {
    if n >= 8 {
        0xff
    } else {
        ((1u32 << n) - 1) as __mmask8
    }
}

/// Transposes an 8 x 8 f64 block held as 8 rows.
#[target_feature(enable = "avx512f")]
fn transpose8(r: [__m512d; 8]) -> [__m512d; 8] {
    // t[2k], t[2k+1]: rows 2k, 2k+1 interleaved (columns even / odd).
    let mut t = [_mm512_setzero_pd(); 8];
    for k in 0..4 {
        t[2 * k] = _mm512_unpacklo_pd(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm512_unpackhi_pd(r[2 * k], r[2 * k + 1]);
    }
    // Now lane L (2 doubles) of t[2k + c] = rows 2k..2k+2 of column 2L + c.
    // out[2L + c] = lane L of t[c], t[2+c], t[4+c], t[6+c].
    let mut out = [_mm512_setzero_pd(); 8];
    for c in 0..2 {
        let v1 = _mm512_shuffle_f64x2::<0x88>(t[c], t[2 + c]);
        let v2 = _mm512_shuffle_f64x2::<0xdd>(t[c], t[2 + c]);
        let w1 = _mm512_shuffle_f64x2::<0x88>(t[4 + c], t[6 + c]);
        let w2 = _mm512_shuffle_f64x2::<0xdd>(t[4 + c], t[6 + c]);
        out[c] = _mm512_shuffle_f64x2::<0x88>(v1, w1);
        out[4 + c] = _mm512_shuffle_f64x2::<0xdd>(v1, w1);
        out[2 + c] = _mm512_shuffle_f64x2::<0x88>(v2, w2);
        out[6 + c] = _mm512_shuffle_f64x2::<0xdd>(v2, w2);
    }
    out
}
