//! The loops of the vector packers (`pack_avx512`, `pack_avx2`): the
//! layout of [`super::pack`], made a vector of rows at a time. A panel
//! whose columns are contiguous in the source is a run of vector copies; a
//! row-major operand packed along its rows (`A` of `C = A B` when C is
//! row-major, or either operand of `A B^T`) needs a transpose: square
//! blocks are loaded, transposed in registers and stored at once.
//!
//! Each instruction set supplies its vector operations through [`Lanes`];
//! these loops are `#[inline(always)]` into its entry points, which carry
//! the target features.

use super::element::Packed;
use super::matrix::PackShape;
use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};

/// The vector operations the packing loops need: one implementation per
/// instruction set and packed type.
pub(crate) trait Lanes {
    /// The packed element written.
    type Packed: Packed;
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
    unsafe fn copy_rows(
        dst: *mut Self::Packed,
        src: *const Self::Src,
        cs: usize,
        cols: usize,
        load: usize,
        store: usize,
    );

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
    unsafe fn store_transposed(dst: *mut Self::Packed, width: usize, units: usize, lanes: usize, block: Self::Block);
}

/// Packs `rows x depth` elements read at `src + i * rs + p * cs` into
/// panels of `width` rows, as [`super::pack::pack_panels`] does; one of the
/// strides is 1. Inlined into each instruction set's entry point.
///
/// # Safety
/// The CPU has `L`'s instruction set (enabled on the caller); `rs == 1` or
/// `cs == 1`; every `(i, p)` with `i < rows`, `p < depth` addresses a
/// readable element; `dst` holds `rows.div_ceil(width) * width *
/// depth.div_ceil(DEPTH)` writable packed elements.
#[inline(always)]
pub(crate) unsafe fn pack<L: Lanes>(dst: *mut L::Packed, src: *const L::Src, shape: PackShape) {
    // SAFETY: forwarded contract.
    unsafe {
        if shape.rs == 1 {
            copy_columns::<L>(dst, src, shape);
        } else {
            debug_assert_eq!(shape.cs, 1);
            transpose_rows::<L>(dst, src, shape);
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
/// As for [`pack`] with `rs == 1`.
#[inline(always)]
unsafe fn copy_columns<L: Lanes>(dst: *mut L::Packed, src: *const L::Src, shape: PackShape) {
    let PackShape { rows, depth, cs, width, .. } = shape;
    let units = depth.div_ceil(<L::Packed as Packed>::DEPTH);
    let chunk = (COPY_ROWS / width).max(1) * width;
    let mut r0 = 0;
    while r0 < rows {
        let chunk_rows = chunk.min(rows - r0);
        // SAFETY: reads rows `r0..r0 + chunk_rows` (< rows) of columns
        // `< depth`; writes whole panels of the chunk inside `dst`.
        unsafe {
            for u in 0..units {
                let p = u * <L::Packed as Packed>::DEPTH;
                let cols = <L::Packed as Packed>::DEPTH.min(depth - p);
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
                        L::copy_rows(
                            d.add(i),
                            s.wrapping_add(q * width + i),
                            cs,
                            cols,
                            live.saturating_sub(i),
                            width - i,
                        );
                        i += L::LANES;
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
/// As for [`pack`] with `cs == 1`.
#[inline(always)]
unsafe fn transpose_rows<L: Lanes>(dst: *mut L::Packed, src: *const L::Src, shape: PackShape) {
    let PackShape { rows, depth, rs, width, .. } = shape;
    let units = depth.div_ceil(<L::Packed as Packed>::DEPTH);
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
                let p = u * <L::Packed as Packed>::DEPTH;
                let cols = (L::LANES * <L::Packed as Packed>::DEPTH).min(depth - p);
                let mut g = 0;
                while g < width {
                    let block = L::load_block(base.wrapping_add(g * rs + p), rs, live.saturating_sub(g), cols);
                    let lanes = L::LANES.min(width - g);
                    L::store_transposed(
                        panel.wrapping_add(u * width + g),
                        width,
                        cols.div_ceil(<L::Packed as Packed>::DEPTH),
                        lanes,
                        block,
                    );
                    g += L::LANES;
                }
                u += L::LANES;
            }
        }
    }
}
