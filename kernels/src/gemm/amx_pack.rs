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
    let pairs = k.div_ceil(TILE_K) * (TILE_K / 2);
    debug_assert!(live <= TILE_MN && dst.len() == panel_len(k));
    let slot = |x: usize, q: usize| {
        let (step, q) = (q / 16, q % 16);
        let within = match layout {
            PanelLayout::Rows => (x % TILE_ROWS) * 16 + q,
            PanelLayout::Cols => q * 16 + x % TILE_ROWS,
        };
        step * PAIRS_PER_STEP + (x / TILE_ROWS) * PAIRS_PER_TILE + within
    };
    let (data, offset, rs, cs) = (src.data(), src.offset(), src.row_stride(), src.col_stride());
    let bits = |x: usize, p: usize| if p < k { data[offset + x * rs + p * cs].to_bits() } else { 0 };
    let pair = |x: usize, q: usize| Bf16Pair(u32::from(bits(x, 2 * q)) | u32::from(bits(x, 2 * q + 1)) << 16);
    if cs == 1 && k > 0 {
        // Depth contiguous (A row-major; B stored transposed, as a linear
        // layer's weight): each index's depth is one slice, read in order.
        let full = k / 2;
        for x in 0..live {
            let row = &data[offset + x * rs..][..k];
            for (q, two) in row.chunks_exact(2).enumerate() {
                dst[slot(x, q)] = Bf16Pair(u32::from(two[0].to_bits()) | u32::from(two[1].to_bits()) << 16);
            }
            for q in full..pairs {
                dst[slot(x, q)] = pair(x, q);
            }
        }
    } else {
        // Index contiguous or general strides: walk the depth outside, so
        // consecutive reads are the contiguous ones.
        for q in 0..pairs {
            for x in 0..live {
                dst[slot(x, q)] = pair(x, q);
            }
        }
    }
    for x in live..TILE_MN {
        for q in 0..pairs {
            dst[slot(x, q)] = Bf16Pair(0);
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
