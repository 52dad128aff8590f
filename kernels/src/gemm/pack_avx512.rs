//! AVX-512 packing: the layout of [`super::pack`], made with vector copies
//! and in-register transposes, for f32 and f64 operands and for bf16
//! operands packed as pairs.
//!
//! A row-major operand packed along its rows (`A` of `C = A B` when C is
//! row-major, or either operand of `A B^T`) needs a transpose: each panel
//! reads `width` rows of `kc` contiguous elements and writes `kc` groups of
//! `width`. Done an element at a time that costs about as much as a fifth of
//! the multiplication on 1024-sized products; here a 16 x 16 (f32, bf16
//! pairs) or 8 x 8 (f64) block is loaded, transposed with shuffles and
//! stored at once. A bf16 pair is a 32-bit lane, so pairs are transposed as
//! f32 bits are.
//!
//! One generic body per stride case serves every element type; the [`Lanes`]
//! trait supplies the few type-specific vector operations. Everything is
//! inlined into the three entry points, which carry the target features.

use super::element::{Bf16Pair, Packed};
use super::matrix::PackShape;
use half::bf16;
use std::arch::x86_64::*;

/// Packs `rows x depth` f32 read at `src + i * rs + p * cs` into panels of
/// `width` rows, as [`super::pack::pack_panels`] does; one of the strides is
/// 1.
///
/// # Safety
/// AVX-512F is available; `rs == 1` or `cs == 1`; every `(i, p)` with
/// `i < rows`, `p < depth` addresses a readable element; `dst` holds
/// `rows.div_ceil(width) * width * depth` writable elements.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn pack_f32(dst: *mut f32, src: *const f32, shape: PackShape) {
    // SAFETY: forwarded contract; the target features are enabled here.
    unsafe { pack(dst, src, shape) }
}

/// f64 version of [`pack_f32`].
///
/// # Safety
/// As for [`pack_f32`].
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn pack_f64(dst: *mut f64, src: *const f64, shape: PackShape) {
    // SAFETY: as in `pack_f32`.
    unsafe { pack(dst, src, shape) }
}

/// [`pack_f32`] for bf16 packed as pairs of consecutive depth indices; an
/// odd depth's last pair has a zero high half.
///
/// # Safety
/// As for [`pack_f32`], with AVX-512BW also available and `dst` holding
/// `rows.div_ceil(width) * width * depth.div_ceil(2)` pairs.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn pack_pairs(dst: *mut Bf16Pair, src: *const bf16, shape: PackShape) {
    // SAFETY: as in `pack_f32`.
    unsafe { pack(dst, src, shape) }
}

/// The vector operations the generic packers need from a packed type.
trait Lanes: Packed {
    /// The stored element read.
    type Src: Copy;
    /// Packed elements per vector: rows moved at once.
    const LANES: usize;
    /// `LANES` vectors: a square block of packed elements.
    type Block: Copy;

    /// Packs one packed column's rows `0..store` (at most `LANES`) at `dst`
    /// from the source column at `src` (rows contiguous; a pair's second
    /// column `cs` further, if `cols == 2`): rows past `load` are zero.
    ///
    /// # Safety
    /// Rows `< load` of the `cols` columns are readable; `store` packed
    /// elements are writable at `dst`; the entry point's features.
    unsafe fn copy_rows(dst: *mut Self, src: *const Self::Src, cs: usize, cols: usize, load: usize, store: usize);

    /// Loads a block: row `i < rows` holds `cols` source elements from
    /// `src + i * rs` (the rest, and rows past `rows`, zero).
    ///
    /// # Safety
    /// Those elements are readable; the entry point's features.
    unsafe fn load_block(src: *const Self::Src, rs: usize, rows: usize, cols: usize) -> Self::Block;

    /// Transposes a block and stores its rows `j < units`, `lanes` packed
    /// elements each (at most `LANES`), at `dst + j * width`.
    ///
    /// # Safety
    /// Those elements are writable; the entry point's features.
    unsafe fn store_transposed(dst: *mut Self, width: usize, units: usize, lanes: usize, block: Self::Block);
}

/// See [`pack_f32`].
///
/// # Safety
/// As for the entry point that calls it.
#[inline(always)]
unsafe fn pack<E: Lanes>(dst: *mut E, src: *const E::Src, shape: PackShape) {
    // SAFETY: forwarded contract.
    unsafe {
        if shape.rs == 1 {
            copy_columns(dst, src, shape);
        } else {
            debug_assert_eq!(shape.cs, 1);
            transpose_rows(dst, src, shape);
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

/// Panel columns are contiguous in the source (`rs == 1`): for a chunk of
/// rows, read each source column once, contiguously, and scatter it over the
/// chunk's panels with masked vector copies.
///
/// # Safety
/// As for [`pack_f32`] with `rs == 1`.
#[inline(always)]
unsafe fn copy_columns<E: Lanes>(dst: *mut E, src: *const E::Src, shape: PackShape) {
    let PackShape { rows, depth, cs, width, .. } = shape;
    let units = depth.div_ceil(E::DEPTH);
    let chunk = (COPY_ROWS / width).max(1) * width;
    let mut r0 = 0;
    while r0 < rows {
        let chunk_rows = chunk.min(rows - r0);
        // SAFETY: reads rows `r0..r0 + chunk_rows` (< rows) of columns
        // `< depth`; writes whole panels of the chunk inside `dst`.
        unsafe {
            for u in 0..units {
                let p = u * E::DEPTH;
                let cols = E::DEPTH.min(depth - p);
                for ahead in p + PREFETCH_COLUMNS..(p + cols + PREFETCH_COLUMNS).min(depth) {
                    prefetch_rows(src.add(ahead * cs + r0), 1, chunk_rows, 0);
                }
                let s = src.add(p * cs + r0);
                for q in 0..chunk_rows.div_ceil(width) {
                    let live = width.min(chunk_rows - q * width);
                    let d = dst.add((r0 / width + q) * width * units + u * width);
                    let mut i = 0;
                    while i < width {
                        // Rows past `live` are masked off and never read.
                        E::copy_rows(
                            d.add(i),
                            s.wrapping_add(q * width + i),
                            cs,
                            cols,
                            live.saturating_sub(i),
                            width - i,
                        );
                        i += E::LANES;
                    }
                }
            }
        }
        r0 += chunk_rows;
    }
}

/// Panel rows are contiguous in the source (`cs == 1`): transpose square
/// blocks.
///
/// # Safety
/// As for [`pack_f32`] with `cs == 1`.
#[inline(always)]
unsafe fn transpose_rows<E: Lanes>(dst: *mut E, src: *const E::Src, shape: PackShape) {
    let PackShape { rows, depth, rs, width, .. } = shape;
    let units = depth.div_ceil(E::DEPTH);
    let panels = rows.div_ceil(width);
    for q in 0..panels {
        let live = width.min(rows - q * width);
        // SAFETY: panel q lies inside `dst` and its rows inside `src`
        // (caller's contract). Loads touch rows `< live` and columns
        // `< depth` only, stores packed columns `< units` and rows `< width`
        // only: the rest is masked off (a masked-off lane is never read or
        // written, so its address may be outside the view: hence
        // `wrapping_add`).
        unsafe {
            let panel = dst.add(q * width * units);
            let base = src.add(q * width * rs);
            if q + 1 < panels {
                // The source rows are short streams (kc elements) far apart:
                // ask for the next panel's rows while this one is transposed.
                prefetch_rows(base.add(width * rs), width.min(rows - (q + 1) * width), depth, rs);
            }
            let mut u = 0;
            while u < units {
                let p = u * E::DEPTH;
                let cols = (E::LANES * E::DEPTH).min(depth - p);
                let mut g = 0;
                while g < width {
                    let block = E::load_block(base.wrapping_add(g * rs + p), rs, live.saturating_sub(g), cols);
                    let lanes = E::LANES.min(width - g);
                    E::store_transposed(
                        panel.wrapping_add(u * width + g),
                        width,
                        cols.div_ceil(E::DEPTH),
                        lanes,
                        block,
                    );
                    g += E::LANES;
                }
                u += E::LANES;
            }
        }
    }
}

/// Lanes `0..n` set, for 16-lane vectors.
#[inline(always)]
fn mask16(n: usize) -> __mmask16 {
    if n >= 16 {
        0xffff
    } else {
        ((1u32 << n) - 1) as __mmask16
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

/// Lanes `0..n` set, for 32-lane (16-bit) vectors.
#[inline(always)]
fn mask32(n: usize) -> __mmask32 {
    if n >= 32 {
        u32::MAX
    } else {
        (1u32 << n) - 1
    }
}

impl Lanes for f32 {
    type Src = f32;
    const LANES: usize = 16;
    type Block = [__m512; 16];

    #[inline(always)]
    unsafe fn copy_rows(dst: *mut f32, src: *const f32, _cs: usize, _cols: usize, load: usize, store: usize) {
        // SAFETY: masked to the readable and writable lanes (contract).
        unsafe { _mm512_mask_storeu_ps(dst, mask16(store), _mm512_maskz_loadu_ps(mask16(load), src)) }
    }

    #[inline(always)]
    unsafe fn load_block(src: *const f32, rs: usize, rows: usize, cols: usize) -> [__m512; 16] {
        // Fixed trip counts keep the block in registers.
        // SAFETY: the entry point has AVX-512F.
        let mut r = [unsafe { _mm512_setzero_ps() }; 16];
        for (i, v) in r.iter_mut().enumerate() {
            // SAFETY: masked to the readable lanes (contract).
            *v = unsafe { _mm512_maskz_loadu_ps(if i < rows { mask16(cols) } else { 0 }, src.wrapping_add(i * rs)) };
        }
        r
    }

    #[inline(always)]
    unsafe fn store_transposed(dst: *mut f32, width: usize, units: usize, lanes: usize, block: [__m512; 16]) {
        // SAFETY: the entry point has AVX-512F; masked to the writable
        // lanes (contract).
        unsafe {
            for (j, &v) in transpose16(block).iter().enumerate() {
                _mm512_mask_storeu_ps(dst.wrapping_add(j * width), if j < units { mask16(lanes) } else { 0 }, v);
            }
        }
    }
}

impl Lanes for f64 {
    type Src = f64;
    const LANES: usize = 8;
    type Block = [__m512d; 8];

    #[inline(always)]
    unsafe fn copy_rows(dst: *mut f64, src: *const f64, _cs: usize, _cols: usize, load: usize, store: usize) {
        // SAFETY: as for f32.
        unsafe { _mm512_mask_storeu_pd(dst, mask8(store), _mm512_maskz_loadu_pd(mask8(load), src)) }
    }

    #[inline(always)]
    unsafe fn load_block(src: *const f64, rs: usize, rows: usize, cols: usize) -> [__m512d; 8] {
        // SAFETY: as for f32.
        let mut r = [unsafe { _mm512_setzero_pd() }; 8];
        for (i, v) in r.iter_mut().enumerate() {
            // SAFETY: as for f32.
            *v = unsafe { _mm512_maskz_loadu_pd(if i < rows { mask8(cols) } else { 0 }, src.wrapping_add(i * rs)) };
        }
        r
    }

    #[inline(always)]
    unsafe fn store_transposed(dst: *mut f64, width: usize, units: usize, lanes: usize, block: [__m512d; 8]) {
        // SAFETY: as for f32.
        unsafe {
            for (j, &v) in transpose8(block).iter().enumerate() {
                _mm512_mask_storeu_pd(dst.wrapping_add(j * width), if j < units { mask8(lanes) } else { 0 }, v);
            }
        }
    }
}

impl Lanes for Bf16Pair {
    type Src = bf16;
    const LANES: usize = 16;
    type Block = [__m512; 16];

    #[inline(always)]
    unsafe fn copy_rows(dst: *mut Bf16Pair, src: *const bf16, cs: usize, cols: usize, load: usize, store: usize) {
        // Lane 2t of the result is x[t] and lane 2t + 1 is y[t] (index 32 +
        // t selects the second operand): the two columns interleaved.
        const INTERLEAVE: [i16; 32] = {
            let mut idx = [0i16; 32];
            let mut t = 0;
            while t < 16 {
                idx[2 * t] = t as i16;
                idx[2 * t + 1] = 32 + t as i16;
                t += 1;
            }
            idx
        };
        let m = mask32(load.min(16));
        // SAFETY: masked to the readable rows of the `cols` columns and the
        // writable pairs (contract); the entry point has AVX-512F and BW.
        unsafe {
            let x = _mm512_maskz_loadu_epi16(m, src.cast());
            let y = if cols == 2 {
                _mm512_maskz_loadu_epi16(m, src.wrapping_add(cs).cast())
            } else {
                _mm512_setzero_si512()
            };
            let idx = _mm512_loadu_si512(INTERLEAVE.as_ptr().cast());
            _mm512_mask_storeu_epi32(dst.cast(), mask16(store), _mm512_permutex2var_epi16(x, idx, y));
        }
    }

    #[inline(always)]
    unsafe fn load_block(src: *const bf16, rs: usize, rows: usize, cols: usize) -> [__m512; 16] {
        // 16-bit masks: an odd depth's last pair gets a zero high half.
        // SAFETY: as for f32.
        let mut r = [unsafe { _mm512_setzero_ps() }; 16];
        for (i, v) in r.iter_mut().enumerate() {
            let m = if i < rows { mask32(cols) } else { 0 };
            // SAFETY: masked to the readable elements (contract); the entry
            // point has AVX-512BW.
            *v = unsafe { _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, src.wrapping_add(i * rs).cast())) };
        }
        r
    }

    #[inline(always)]
    unsafe fn store_transposed(dst: *mut Bf16Pair, width: usize, units: usize, lanes: usize, block: [__m512; 16]) {
        // SAFETY: a pair is 32 bits, moved as f32 bits are (shuffles and
        // masked stores do not look at the values); contract as for f32.
        unsafe { f32::store_transposed(dst.cast(), width, units, lanes, block) }
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
