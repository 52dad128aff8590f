//! bf16 products on AMX tiles: `C = alpha * A * B + beta * C`, C in f32 or
//! bf16.
//!
//! The shape of the computation follows the AMX kernel (`amx_tile`): C is
//! cut into 32 x 32 tiles, each computed over the whole depth in tile
//! registers and stored once — rounded there, for a bf16 C, so that no f32
//! workspace of C is written and then narrowed in a second pass. A and B are packed once per product, whole
//! (`amx_pack`), by all threads; then the threads take blocks of up to
//! 4 x 4 tiles, and inside a block walk one panel of A against the
//! block's panels of B, which stay in L2 (4 panels of 2 KiB per 32 of
//! depth: 256 KiB at depth 1024).
//!
//! ```
//! use brasa_kernels::gemm::{gemm_bf16, MatMut, MatRef};
//! use half::bf16;
//!
//! // Where the CPU has AMX (and the product is large enough), this runs on
//! // tiles; elsewhere on the AVX-512 or widened kernels: same results
//! // within f32 rounding.
//! let a = vec![bf16::ONE; 64 * 64];
//! let mut c = vec![bf16::ZERO; 64 * 64];
//! let (x, y) = (MatRef::row_major(&a, 64, 64)?, MatRef::row_major(&a, 64, 64)?);
//! gemm_bf16(1.0, x, y, 0.0, MatMut::row_major(&mut c, 64, 64)?)?;
//! assert!(c.iter().all(|v| v.to_f32() == 64.0));
//! # Ok::<(), brasa_kernels::KernelError>(())
//! ```

use super::amx_pack::{pack_panel, panel_len, PanelLayout};
use super::amx_tile::{TileKernel, PAIRS_PER_STEP, TILE_K, TILE_MN};
use super::buffer::{try_with_buffer, Slot};
use super::element::{Bf16Pair, Narrow};
use super::matrix::RawMut;
use super::product::{ranges, Product};
use crate::error::Result;
use half::bf16;
use rayon::prelude::*;

/// Products below this many flops (`2 m n k`) stay off the tiles (on the
/// f32 kernel, operands widened while packed): packing whole panels and
/// loading the tile configuration cost a few microseconds, and a first tile
/// use on a thread costs the kernel trap that allocates its tile state (7-9
/// µs, measured on a Sapphire Rapids). On one core of the Xeon host of a GPU
/// machine (`gemm_tune`, tiles forced at every size) the tiles already ran
/// at 2.2x the f32 kernel on cnn_bn's first weight gradient (32 x 27 x
/// 1024, 1.8 MFLOP) and 1.3x at 128 x 128 x 64.
pub(crate) const AMX_MIN_FLOPS: usize = 1 << 20;

/// Panels of A and of B per block of C a thread takes at once.
const BLOCK_PANELS: usize = 4;

/// How many times the f32 kernel's flops per second the tiles reach, rounded
/// (see [`super::parallel_worth`]): 840 against 240 GFLOP/s at 1024^3 on 2
/// cores of a Sapphire Rapids Xeon (`gemm_tune`).
pub(crate) const SPEED_VS_F32: usize = 4;

/// Whether a product of this shape goes to the tiles.
pub(crate) fn worth_tiles(m: usize, n: usize, k: usize) -> bool {
    let flops = 2usize.saturating_mul(m).saturating_mul(n).saturating_mul(k);
    m >= 16 && n >= 16 && k >= TILE_K && flops >= AMX_MIN_FLOPS
}

/// A 32 x 32 f32 tile of C, aligned for the tile stores.
#[repr(C, align(64))]
struct Scratch([f32; TILE_MN * TILE_MN]);

/// Runs the product on up to `threads` threads with `kernel`.
pub(crate) fn gemm<S: Narrow>(kernel: TileKernel, threads: usize, p: Product<'_, f32, bf16, S>) -> Result<()> {
    let Product { alpha, a, b, beta, c } = p;
    let (m, n, k) = (c.rows, c.cols, a.cols());
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 || alpha == 0.0 {
        // SAFETY: the caller's checked output view, written by this call only.
        unsafe { scale(c, beta) };
        return Ok(());
    }
    let len = panel_len(k);
    let (row_panels, col_panels) = (m.div_ceil(TILE_MN), n.div_ceil(TILE_MN));
    let parallel = threads > 1;
    try_with_buffer::<Bf16Pair, _>(Slot::A, row_panels * len, |a_pack| {
        try_with_buffer::<Bf16Pair, _>(Slot::B, col_panels * len, |b_pack| {
            let pack_a = |(ip, dst): (usize, &mut [Bf16Pair])| {
                let rows = TILE_MN.min(m - ip * TILE_MN);
                pack_panel(dst, a.sub(ip * TILE_MN, 0, rows, k), PanelLayout::Rows);
            };
            let pack_b = |(jp, dst): (usize, &mut [Bf16Pair])| {
                let cols = TILE_MN.min(n - jp * TILE_MN);
                pack_panel(dst, b.sub(0, jp * TILE_MN, k, cols).t(), PanelLayout::Cols);
            };
            if parallel {
                a_pack.par_chunks_mut(len).enumerate().for_each(pack_a);
                b_pack.par_chunks_mut(len).enumerate().for_each(pack_b);
            } else {
                a_pack.chunks_mut(len).enumerate().for_each(pack_a);
                b_pack.chunks_mut(len).enumerate().for_each(pack_b);
            }
            let (a_pack, b_pack) = (&*a_pack, &*b_pack);
            let blocks = blocks(row_panels, col_panels, threads);
            let run = |range: (usize, usize)| {
                let _tiles = kernel.configure();
                let mut scratch = Scratch([0.0; TILE_MN * TILE_MN]);
                for &(rows, cols) in &blocks[range.0..range.1] {
                    for ip in rows.0..rows.1 {
                        for jp in cols.0..cols.1 {
                            // SAFETY: panels ip and jp hold `len` pairs each
                            // (k.div_ceil(32) >= 1 steps, k > 0 here), the
                            // scratch 1024 f32; a hardware kernel's tiles were
                            // configured on this thread just above.
                            unsafe {
                                (kernel.func)(
                                    len / PAIRS_PER_STEP,
                                    a_pack[ip * len..].as_ptr(),
                                    b_pack[jp * len..].as_ptr(),
                                    scratch.0.as_mut_ptr(),
                                )
                            };
                            // SAFETY: tile (ip, jp) is inside C, and no other
                            // task writes it (blocks are disjoint).
                            unsafe { store_tile(&scratch, c, ip, jp, alpha, beta) };
                        }
                    }
                }
            };
            if parallel {
                ranges(blocks.len(), 1, threads).into_par_iter().for_each(run);
            } else {
                run((0, blocks.len()));
            }
        })
    })??;
    Ok(())
}

/// Blocks of (row panels, column panels) of C, up to 4 x 4 panels, smaller
/// when that leaves fewer than two blocks per thread.
fn blocks(row_panels: usize, col_panels: usize, threads: usize) -> Vec<((usize, usize), (usize, usize))> {
    let (mut bi, mut bj) = (BLOCK_PANELS, BLOCK_PANELS);
    let count = |bi: usize, bj: usize| row_panels.div_ceil(bi) * col_panels.div_ceil(bj);
    while count(bi, bj) < 2 * threads && (bi > 1 || bj > 1) {
        if bi >= bj {
            bi /= 2;
        } else {
            bj /= 2;
        }
    }
    let mut out = Vec::with_capacity(count(bi, bj));
    for i0 in (0..row_panels).step_by(bi) {
        for j0 in (0..col_panels).step_by(bj) {
            out.push(((i0, (i0 + bi).min(row_panels)), (j0, (j0 + bj).min(col_panels))));
        }
    }
    out
}

/// `C[tile] = alpha * scratch + beta * C[tile]` on the tile's live part
/// (beta 0: C not read), rounded once into C's type: a row at a time
/// through the slice conversions where C's rows are contiguous.
///
/// # Safety
/// Tile `(ip, jp)` of C is inside `c` and written by no one else meanwhile.
unsafe fn store_tile<S: Narrow>(scratch: &Scratch, c: RawMut<S>, ip: usize, jp: usize, alpha: f32, beta: f32) {
    let (i0, j0) = (ip * TILE_MN, jp * TILE_MN);
    let (rows, cols) = (TILE_MN.min(c.rows - i0), TILE_MN.min(c.cols - j0));
    let mut row = [0f32; TILE_MN];
    for i in 0..rows {
        let acc = &scratch.0[i * TILE_MN..i * TILE_MN + cols];
        // SAFETY: (i0 + i, j0) is inside C (caller's contract).
        let start = unsafe { c.ptr.add((i0 + i) * c.row_stride + j0 * c.col_stride) };
        if c.col_stride == 1 {
            // SAFETY: the row's `cols` elements from `start` are contiguous,
            // inside C and ours (caller's contract).
            let out = unsafe { std::slice::from_raw_parts_mut(start, cols) };
            let row = &mut row[..cols];
            if beta == 0.0 {
                for (r, &x) in row.iter_mut().zip(acc) {
                    *r = alpha * x;
                }
            } else {
                S::convert_slice(out, row);
                for (r, &x) in row.iter_mut().zip(acc) {
                    *r = alpha * x + beta * *r;
                }
            }
            S::narrow_slice(row, out);
        } else {
            for (j, &x) in acc.iter().enumerate() {
                // SAFETY: element j of the row is inside C (caller's contract).
                unsafe {
                    let at = start.add(j * c.col_stride);
                    let x = alpha * x;
                    *at = S::narrow(if beta == 0.0 { x } else { x + beta * (*at).to_compute() });
                }
            }
        }
    }
}

/// `C = beta * C` (beta 0: C not read), rounded into C's type.
///
/// # Safety
/// `c` is a valid output view, written by no one else meanwhile.
unsafe fn scale<S: Narrow>(c: RawMut<S>, beta: f32) {
    for i in 0..c.rows {
        for j in 0..c.cols {
            // SAFETY: (i, j) is inside the view (caller's contract).
            unsafe {
                let at = c.ptr.add(i * c.row_stride + j * c.col_stride);
                *at = S::narrow(if beta == 0.0 { 0.0 } else { beta * (*at).to_compute() });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::matrix::MatMut;
    use crate::gemm::MatRef;

    fn values(n: usize, seed: u32) -> Vec<bf16> {
        crate::gemm::test_values::values(n, seed).into_iter().map(bf16::from_f32).collect()
    }

    /// The tile kernels this CPU runs: always the emulated one, and the
    /// hardware one where AMX is usable.
    fn kernels() -> Vec<TileKernel> {
        let mut out = vec![TileKernel::emulated()];
        #[cfg(target_arch = "x86_64")]
        if crate::cpu_features::cpu_features().amx_bf16 {
            out.push(TileKernel::amx());
        }
        out
    }

    /// The driver on every edge: rows, columns and depth around the 32
    /// tile, transposed and strided operands, row- and column-major C,
    /// alpha and beta (beta 0 leaves C's NaN unread), one and several
    /// threads; against the f64 product of the same bf16 values.
    #[test]
    fn products_match_f64_on_every_edge() -> Result<()> {
        for kernel in kernels() {
            for (m, n, k) in [(1, 1, 1), (16, 16, 32), (33, 17, 31), (64, 96, 65), (100, 40, 129), (31, 130, 7)] {
                let a_rm = values(m * k, 1);
                let b_rm = values(k * n, 2);
                // The same matrices stored transposed.
                let a_cm: Vec<bf16> = (0..m * k).map(|e| a_rm[(e % m) * k + e / m]).collect();
                let b_cm: Vec<bf16> = (0..k * n).map(|e| b_rm[(e % k) * n + e / k]).collect();
                let exact = |i: usize, j: usize| -> f64 {
                    (0..k).map(|p| f64::from(a_rm[i * k + p].to_f32()) * f64::from(b_rm[p * n + j].to_f32())).sum()
                };
                let tol = k as f64 * 4.0 * f64::from(f32::EPSILON) + 1e-6;
                for (transposed, threads, beta, c_row_major) in
                    [(false, 1, 0.0f32, true), (true, 2, 1.0, false), (false, 3, 0.5, false), (true, 1, 0.0, true)]
                {
                    let a = if transposed { MatRef::col_major(&a_cm, m, k)? } else { MatRef::row_major(&a_rm, m, k)? };
                    let b = if transposed { MatRef::col_major(&b_cm, k, n)? } else { MatRef::row_major(&b_rm, k, n)? };
                    let c0: Vec<f32> = (0..m * n).map(|e| (e % 7) as f32 - 3.0).collect();
                    let mut c = if beta == 0.0 { vec![f32::NAN; m * n] } else { c0.clone() };
                    let mut view =
                        if c_row_major { MatMut::row_major(&mut c, m, n)? } else { MatMut::col_major(&mut c, m, n)? };
                    gemm(kernel, threads, Product { alpha: 2.0, a, b, beta, c: view.raw() })?;
                    for i in 0..m {
                        for j in 0..n {
                            let at = if c_row_major { i * n + j } else { i + j * m };
                            let want = 2.0 * exact(i, j) + f64::from(beta) * f64::from(c0[at]);
                            let got = f64::from(c[at]);
                            assert!(
                                (got - want).abs() <= tol * 2.0,
                                "hw {} {m}x{n}x{k} t{transposed} ({i},{j}): {got} vs {want}",
                                kernel.hardware
                            );
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// A bf16 C is the f32 C of the same product rounded once, bit for bit:
    /// row- and column-major, beta 0 (C unread) and not, edges of the tile.
    #[test]
    fn bf16_c_is_the_f32_c_rounded_once() -> Result<()> {
        for kernel in kernels() {
            for (m, n, k) in [(33, 17, 31), (64, 96, 65), (31, 130, 40)] {
                let (a, b) = (values(m * k, 3), values(k * n, 4));
                let (a, b) = (MatRef::row_major(&a, m, k)?, MatRef::row_major(&b, k, n)?);
                for (threads, beta, row_major) in [(1, 0.0f32, true), (2, 0.75, true), (3, 1.0, false), (1, 0.0, false)]
                {
                    let c0: Vec<bf16> = values(m * n, 5);
                    let mut wide: Vec<f32> = c0.iter().map(|v| v.to_f32()).collect();
                    let mut narrow = if beta == 0.0 { vec![bf16::NAN; m * n] } else { c0.clone() };
                    let mut view = if row_major {
                        MatMut::row_major(&mut wide, m, n)?
                    } else {
                        MatMut::col_major(&mut wide, m, n)?
                    };
                    gemm(kernel, threads, Product { alpha: 1.5, a, b, beta, c: view.raw() })?;
                    let mut out = if row_major {
                        MatMut::row_major(&mut narrow, m, n)?
                    } else {
                        MatMut::col_major(&mut narrow, m, n)?
                    };
                    gemm(kernel, threads, Product { alpha: 1.5, a, b, beta, c: out.raw() })?;
                    for (e, (&w, &got)) in wide.iter().zip(&narrow).enumerate() {
                        assert_eq!(
                            got.to_bits(),
                            bf16::from_f32(w).to_bits(),
                            "hw {} {m}x{n}x{k} beta {beta} row-major {row_major}, element {e}",
                            kernel.hardware
                        );
                    }
                }
            }
        }
        let mut c = [bf16::from_f32(3.0); 4];
        let empty = values(0, 1);
        let (x, y) = (MatRef::row_major(&empty, 2, 0)?, MatRef::row_major(&empty, 0, 2)?);
        let mut view = MatMut::row_major(&mut c, 2, 2)?;
        gemm(TileKernel::emulated(), 1, Product { alpha: 1.0, a: x, b: y, beta: 0.5, c: view.raw() })?;
        assert_eq!(c, [bf16::from_f32(1.5); 4]);
        Ok(())
    }

    #[test]
    fn zero_depth_and_zero_alpha_scale_c() -> Result<()> {
        let a = values(4, 1);
        let mut c = vec![3.0f32; 4];
        let (x, y) = (MatRef::row_major(&a[..0], 2, 0)?, MatRef::row_major(&a[..0], 0, 2)?);
        let mut view = MatMut::row_major(&mut c, 2, 2)?;
        gemm(TileKernel::emulated(), 1, Product { alpha: 1.0, a: x, b: y, beta: 0.5, c: view.raw() })?;
        assert_eq!(c, [1.5; 4]);
        Ok(())
    }

    #[test]
    fn blocks_cover_c_once_and_feed_the_threads() {
        for (rp, cp, threads) in [(1, 1, 1), (10, 3, 2), (64, 64, 16), (2, 40, 8), (5, 5, 64)] {
            let blocks = blocks(rp, cp, threads);
            let mut seen = vec![0u8; rp * cp];
            for ((i0, i1), (j0, j1)) in &blocks {
                assert!(i1 - i0 <= BLOCK_PANELS && j1 - j0 <= BLOCK_PANELS);
                for i in *i0..*i1 {
                    for j in *j0..*j1 {
                        seen[i * cp + j] += 1;
                    }
                }
            }
            assert!(seen.iter().all(|&s| s == 1), "{rp}x{cp}");
            assert!(blocks.len() >= (2 * threads).min(rp * cp), "{rp}x{cp} on {threads}: {} blocks", blocks.len());
        }
    }

    #[test]
    fn small_products_stay_off_the_tiles() {
        assert!(!worth_tiles(8, 1024, 1024));
        assert!(!worth_tiles(1024, 1024, 16));
        assert!(!worth_tiles(32, 32, 32));
        assert!(worth_tiles(128, 128, 128));
    }
}
