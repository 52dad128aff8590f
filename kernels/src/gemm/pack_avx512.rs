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
//! The loops are `pack_simd`'s, shared with the AVX2 packer; the [`Lanes`]
//! implementations here supply the AVX-512 vector operations for each
//! packed type. Everything is inlined into the three entry points, which
//! carry the target features.

use super::element::Bf16Pair;
use super::matrix::PackShape;
use super::pack_simd::{pack, Lanes};
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
    unsafe { pack::<Avx512F32>(dst, src, shape) }
}

/// f64 version of [`pack_f32`].
///
/// # Safety
/// As for [`pack_f32`].
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn pack_f64(dst: *mut f64, src: *const f64, shape: PackShape) {
    // SAFETY: as in `pack_f32`.
    unsafe { pack::<Avx512F64>(dst, src, shape) }
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
    unsafe { pack::<Avx512Pairs>(dst, src, shape) }
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

/// f32 on AVX-512: 16 x 16 blocks.
pub(crate) struct Avx512F32;

impl Lanes for Avx512F32 {
    type Packed = f32;
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

/// f64 on AVX-512: 8 x 8 blocks.
pub(crate) struct Avx512F64;

impl Lanes for Avx512F64 {
    type Packed = f64;
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

/// bf16 pairs on AVX-512 (with BW): 16 x 16 blocks of 32-bit pairs.
pub(crate) struct Avx512Pairs;

impl Lanes for Avx512Pairs {
    type Packed = Bf16Pair;
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
        unsafe { Avx512F32::store_transposed(dst.cast(), width, units, lanes, block) }
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
