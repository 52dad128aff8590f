//! Packing bf16 operands into the AMX tile layout (see `amx_tile`).
//!
//! A panel is 32 rows of A (or 32 columns of B) over the whole depth, cut
//! into steps of 32 depth elements; each step is two 1 KiB tiles of 16 x 16
//! [`Bf16Pair`]s, a pair holding two consecutive depth elements.
//!
//! - A tile ([`PanelLayout::Rows`]): tile row `r` is row `r` of A, its 16
//!   pairs the step's 32 depth elements — what `TDPBF16PS` reads as its
//!   first source.
//! - B tile ([`PanelLayout::Cols`]): tile row `q` is depth pair `q`, its 16
//!   pairs the 16 columns — the "VNNI" layout of the second source.
//!
//! Both are packed from an "index x depth" view (A itself, B transposed),
//! so one routine serves both; missing rows, columns and depth (edges, odd
//! depth) are packed as +0, which adds nothing to the products.

use super::amx_tile::{PAIRS_PER_STEP, PAIRS_PER_TILE, TILE_K, TILE_MN, TILE_ROWS};
use super::element::Bf16Pair;
use super::matrix::MatRef;
use half::bf16;

/// Where an (index, depth pair) element goes inside a step's two tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PanelLayout {
    /// A operand: the index is a tile row.
    Rows,
    /// B operand: the index is a tile column.
    Cols,
}

/// Pairs one packed panel of depth `k` holds.
pub(crate) fn panel_len(k: usize) -> usize {
    k.div_ceil(TILE_K) * PAIRS_PER_STEP
}

/// Packs `src` (at most 32 indices x depth `k`) into `dst`
/// (`panel_len(k)` pairs) in `layout`.
pub(crate) fn pack_panel(dst: &mut [Bf16Pair], src: MatRef<'_, bf16>, layout: PanelLayout) {
    let (live, k) = (src.rows(), src.cols());
    debug_assert!(live <= TILE_MN && dst.len() == panel_len(k));
    for (step, step_dst) in dst.chunks_exact_mut(PAIRS_PER_STEP).enumerate() {
        let p0 = step * TILE_K;
        for (t, tile) in step_dst.chunks_exact_mut(PAIRS_PER_TILE).enumerate() {
            let x0 = t * TILE_ROWS;
            let xs = live.saturating_sub(x0).min(TILE_ROWS);
            if xs == 0 {
                tile.fill(Bf16Pair(0));
            } else if xs == TILE_ROWS && p0 + TILE_K <= k {
                pack_full_tile(tile, src, x0, p0, layout);
            } else {
                pack_edge_tile(tile, src, x0, p0, layout);
            }
        }
    }
}

fn pair(lo: bf16, hi: bf16) -> Bf16Pair {
    Bf16Pair(u32::from(lo.to_bits()) | u32::from(hi.to_bits()) << 16)
}

/// A tile with all 16 indices and 32 depth elements in `src`: the loops
/// read runs that are contiguous in the source, where there are any, and
/// write runs contiguous in the tile where the layout allows (the compiler
/// vectorises those).
fn pack_full_tile(tile: &mut [Bf16Pair], src: MatRef<'_, bf16>, x0: usize, p0: usize, layout: PanelLayout) {
    let (data, offset, rs, cs) = (src.data(), src.offset(), src.row_stride(), src.col_stride());
    let at = |x: usize, p: usize| offset + (x0 + x) * rs + (p0 + p) * cs;
    if cs == 1 {
        // Each index's 32 depth elements are one slice (A row-major, or B
        // stored transposed as a linear layer's weight).
        for x in 0..TILE_ROWS {
            let depth = &data[at(x, 0)..][..TILE_K];
            match layout {
                PanelLayout::Rows => {
                    let row = &mut tile[x * 16..][..16];
                    // Little-endian x86-64: two consecutive bf16 in memory
                    // are the pair (lo, hi) as a u32, so the row is a copy.
                    // SAFETY: 32 bf16 and 16 u32 are both 64 bytes; the
                    // regions are distinct borrows.
                    unsafe {
                        std::ptr::copy_nonoverlapping(depth.as_ptr().cast::<u8>(), row.as_mut_ptr().cast::<u8>(), 64)
                    };
                }
                PanelLayout::Cols => {
                    for (q, two) in depth.chunks_exact(2).enumerate() {
                        tile[q * 16 + x] = pair(two[0], two[1]);
                    }
                }
            }
        }
    } else if rs == 1 {
        // The 16 indices of one depth element are one slice (A stored
        // transposed, or B row-major).
        for q in 0..16 {
            let lo = &data[at(0, 2 * q)..][..TILE_ROWS];
            let hi = &data[at(0, 2 * q + 1)..][..TILE_ROWS];
            match layout {
                PanelLayout::Cols => {
                    for ((d, &l), &h) in tile[q * 16..][..16].iter_mut().zip(lo).zip(hi) {
                        *d = pair(l, h);
                    }
                }
                PanelLayout::Rows => {
                    for (x, (&l, &h)) in lo.iter().zip(hi).enumerate() {
                        tile[x * 16 + q] = pair(l, h);
                    }
                }
            }
        }
    } else {
        pack_edge_tile(tile, src, x0, p0, layout);
    }
}

/// Any tile, element by element: indices past `src`'s rows and depth past
/// its columns are +0.
fn pack_edge_tile(tile: &mut [Bf16Pair], src: MatRef<'_, bf16>, x0: usize, p0: usize, layout: PanelLayout) {
    let (live, k) = (src.rows(), src.cols());
    let (data, offset, rs, cs) = (src.data(), src.offset(), src.row_stride(), src.col_stride());
    let get = |x: usize, p: usize| if x < live && p < k { data[offset + x * rs + p * cs] } else { bf16::ZERO };
    for x in 0..TILE_ROWS {
        for q in 0..16 {
            let (xg, pg) = (x0 + x, p0 + 2 * q);
            let slot = match layout {
                PanelLayout::Rows => x * 16 + q,
                PanelLayout::Cols => q * 16 + x,
            };
            tile[slot] = pair(get(xg, pg), get(xg, pg + 1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(x: usize, p: usize) -> bf16 {
        bf16::from_f32((x * 100 + p) as f32)
    }

    /// Every slot of the packed panel holds the element the layout says, or
    /// +0 beyond the edges, whatever the source's strides.
    #[test]
    fn panels_hold_each_element_once_in_its_slot() {
        for (live, k) in [(32, 64), (5, 3), (17, 33), (32, 1), (1, 70)] {
            // Row-major (depth contiguous) and column-major storage.
            let row_major: Vec<bf16> = (0..live * k).map(|e| value(e / k, e % k)).collect();
            let col_major: Vec<bf16> = (0..live * k).map(|e| value(e % live, e / live)).collect();
            let views =
                [MatRef::row_major(&row_major, live, k).unwrap(), MatRef::col_major(&col_major, live, k).unwrap()];
            for view in views {
                for layout in [PanelLayout::Rows, PanelLayout::Cols] {
                    let mut dst = vec![Bf16Pair(0xDEAD_BEEF); panel_len(k)];
                    pack_panel(&mut dst, view, layout);
                    for (at, got) in dst.iter().enumerate() {
                        let (step, tile, within) =
                            (at / PAIRS_PER_STEP, at % PAIRS_PER_STEP / PAIRS_PER_TILE, at % PAIRS_PER_TILE);
                        let (x_in, q_in) = match layout {
                            PanelLayout::Rows => (within / 16, within % 16),
                            PanelLayout::Cols => (within % 16, within / 16),
                        };
                        let x = tile * TILE_ROWS + x_in;
                        let p = step * TILE_K + 2 * q_in;
                        let want = |p: usize| if x < live && p < k { value(x, p).to_bits() } else { 0 };
                        let expected = u32::from(want(p)) | u32::from(want(p + 1)) << 16;
                        assert_eq!(got.0, expected, "{layout:?} live {live} k {k} slot {at}: x {x} p {p}");
                    }
                }
            }
        }
    }
}
