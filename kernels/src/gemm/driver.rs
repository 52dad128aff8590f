//! The blocked product: BLIS's five loops around the micro-kernel, and the
//! split of C across threads.
//!
//! ```text
//! for jc in 0..n step nc          B panel  kc x nc  -> L3
//!   for pc in 0..k step kc        (pack B panel)
//!     for ic in 0..m step mc      A block  mc x kc  -> L2 (pack A block)
//!       for jr in 0..nc step nr   B sliver kc x nr  -> L1
//!         for ir in 0..mc step mr micro-kernel: mr x nr tile of C in registers
//! ```
//!
//! Threads each take a disjoint rectangle of C and run these loops on it
//! alone, packing what they need: no barrier inside a product, one fork-join
//! per call.

use super::blocking::Blocking;
use super::buffer::with_pack_buffers;
use super::element::{Compute, PackSource};
use super::matrix::{MatRef, RawMut};
use super::microkernel::{MicroKernel, MAX_TILE};
use super::pack::pack_panels;
use super::parallel::gemm_shared_b;
use rayon::prelude::*;

/// What to run: a kernel, its blocking and the number of threads.
#[derive(Clone, Copy)]
pub(crate) struct Plan<T> {
    pub kernel: MicroKernel<T>,
    pub blocking: Blocking,
    pub threads: usize,
}

/// `C = alpha * A * B + beta * C`. Shapes must agree (checked by the caller):
/// `A` is `m x k`, `B` is `k x n`, `C` is `m x n`.
pub(crate) fn gemm<T, SA, SB>(plan: &Plan<T>, alpha: T, a: MatRef<'_, SA>, b: MatRef<'_, SB>, beta: T, c: RawMut<T>)
where
    T: Compute,
    SA: PackSource<T>,
    SB: PackSource<T>,
{
    let (m, n, k) = (c.rows, c.cols, a.cols());
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 || alpha == T::ZERO {
        scale(c, beta);
        return;
    }
    // The micro-kernel writes columns of C with vector stores. A row-major C
    // is the column-major C^T = B^T A^T: swap rather than scatter.
    if c.row_stride != 1 && c.col_stride == 1 {
        oriented(plan, alpha, b.t(), a.t(), beta, c.t());
    } else {
        oriented(plan, alpha, a, b, beta, c);
    }
}

/// `C = beta * C`, writing zeros (not `0 * C`) when beta is 0.
fn scale<T: Compute>(c: RawMut<T>, beta: T) {
    for j in 0..c.cols {
        for i in 0..c.rows {
            // SAFETY: (i, j) is inside the checked output view.
            unsafe {
                let p = c.ptr.add(i * c.row_stride + j * c.col_stride);
                *p = if beta == T::ZERO { T::ZERO } else { beta * *p };
            }
        }
    }
}

fn oriented<T, SA, SB>(plan: &Plan<T>, alpha: T, a: MatRef<'_, SA>, b: MatRef<'_, SB>, beta: T, c: RawMut<T>)
where
    T: Compute,
    SA: PackSource<T>,
    SB: PackSource<T>,
{
    let (m, n) = (c.rows, c.cols);
    let (mr, nr) = (plan.kernel.mr, plan.kernel.nr);
    match split_for_threads(m, n, mr, nr, plan.threads) {
        Split::None => sequential(plan, alpha, a, b, beta, c),
        Split::SharedB(threads) => gemm_shared_b(plan, threads, alpha, a, b, beta, c),
        Split::Cols(parts) => parts.into_par_iter().for_each(|(j0, j1)| {
            // SAFETY: the column ranges are disjoint and inside C.
            let c_part = unsafe { c.sub(0, j0, m, j1 - j0) };
            sequential(plan, alpha, a, b.sub(0, j0, b.rows(), j1 - j0), beta, c_part)
        }),
    }
}

#[derive(Debug, PartialEq)]
enum Split {
    None,
    /// Threads share packed B and claim blocks of rows (see `parallel`).
    SharedB(usize),
    /// Too few rows to share: each thread takes columns and packs its own.
    Cols(Vec<(usize, usize)>),
}

/// Cuts `len` into `parts` ranges of whole `unit`-sized tiles, as even as
/// the tiles allow.
pub(crate) fn ranges(len: usize, unit: usize, parts: usize) -> Vec<(usize, usize)> {
    let tiles = len.div_ceil(unit);
    (0..parts)
        .map(|t| {
            let lo = (t * tiles / parts * unit).min(len);
            let hi = ((t + 1) * tiles / parts * unit).min(len);
            (lo, hi)
        })
        .filter(|(lo, hi)| hi > lo)
        .collect()
}

/// Rows of C are shared out when there is a row tile per thread; otherwise
/// columns, each thread packing the (small) A itself.
fn split_for_threads(m: usize, n: usize, mr: usize, nr: usize, threads: usize) -> Split {
    if threads <= 1 {
        return Split::None;
    }
    let row_tiles = m.div_ceil(mr);
    if row_tiles >= 2 {
        return Split::SharedB(threads.min(row_tiles));
    }
    let parts = threads.min(n.div_ceil(nr));
    if parts <= 1 {
        return Split::None;
    }
    Split::Cols(ranges(n, nr, parts))
}

/// The five loops on one thread.
fn sequential<T, SA, SB>(plan: &Plan<T>, alpha: T, a: MatRef<'_, SA>, b: MatRef<'_, SB>, beta: T, c: RawMut<T>)
where
    T: Compute,
    SA: PackSource<T>,
    SB: PackSource<T>,
{
    let (m, n, k) = (c.rows, c.cols, a.cols());
    let kernel = &plan.kernel;
    let (mr, nr) = (kernel.mr, kernel.nr);
    let Blocking { mc, kc, nc } = plan.blocking.for_depth(k, mr, nr);
    let kc_max = kc.min(k);
    let a_len = mc.min(m.div_ceil(mr) * mr) * kc_max;
    let b_len = nc.min(n.div_ceil(nr) * nr) * kc_max;
    with_pack_buffers::<T, _>(a_len, b_len, |a_pack, b_pack| {
        for jc in (0..n).step_by(nc) {
            let ncb = nc.min(n - jc);
            for pc in (0..k).step_by(kc) {
                let kcb = kc.min(k - pc);
                pack_panels(b_pack, b.sub(pc, jc, kcb, ncb).t(), nr, kernel.simd_pack);
                // Later depth blocks add to what the first one wrote.
                let beta_p = if pc == 0 { beta } else { T::ONE };
                for ic in (0..m).step_by(mc) {
                    let mcb = mc.min(m - ic);
                    pack_panels(a_pack, a.sub(ic, pc, mcb, kcb), mr, kernel.simd_pack);
                    // SAFETY: the block is inside C.
                    let c_block = unsafe { c.sub(ic, jc, mcb, ncb) };
                    macro_kernel(kernel, kcb, a_pack, b_pack, alpha, beta_p, c_block);
                }
            }
        }
    });
}

/// All micro-tiles of one packed A block times one packed B panel.
pub(crate) fn macro_kernel<T: Compute>(
    kernel: &MicroKernel<T>,
    kc: usize,
    a_pack: &[T],
    b_pack: &[T],
    alpha: T,
    beta: T,
    c: RawMut<T>,
) {
    let (mr, nr) = (kernel.mr, kernel.nr);
    let (m, n) = (c.rows, c.cols);
    let (rs, cs) = (c.row_stride, c.col_stride);
    let direct = rs == 1;
    let mut scratch = [T::ZERO; MAX_TILE];
    for (jq, jr) in (0..n).step_by(nr).enumerate() {
        let nrb = nr.min(n - jr);
        let b_sliver = &b_pack[jq * nr * kc..(jq + 1) * nr * kc];
        for (iq, ir) in (0..m).step_by(mr).enumerate() {
            let mrb = mr.min(m - ir);
            let a_sliver = &a_pack[iq * mr * kc..(iq + 1) * mr * kc];
            if direct && mrb == mr && nrb == nr {
                // SAFETY: the kernel was selected for a CPU that supports it;
                // the slivers hold kc * mr and kc * nr elements; the mr x nr
                // tile at (ir, jr) is inside C, which is column-major here.
                unsafe {
                    (kernel.func)(kc, a_sliver.as_ptr(), b_sliver.as_ptr(), c.ptr.add(ir + jr * cs), cs, alpha, beta)
                }
            } else {
                // Edge tile or general strides: compute into a scratch tile
                // (mr <= MAX_TILE / nr, checked by the kernel table's tests),
                // then add the live part into C.
                // SAFETY: as above, with the scratch as a column-major mr x nr C.
                unsafe {
                    (kernel.func)(kc, a_sliver.as_ptr(), b_sliver.as_ptr(), scratch.as_mut_ptr(), mr, T::ONE, T::ZERO)
                }
                for j in 0..nrb {
                    for i in 0..mrb {
                        let x = alpha * scratch[i + j * mr];
                        // SAFETY: (ir + i, jr + j) is inside C.
                        unsafe {
                            let p = c.ptr.add((ir + i) * rs + (jr + j) * cs);
                            *p = if beta == T::ZERO { x } else { x + beta * *p };
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_in_whole_tiles() {
        assert_eq!(ranges(100, 32, 2), vec![(0, 64), (64, 100)]);
        assert_eq!(ranges(10, 32, 2), vec![(0, 10)]);
        assert_eq!(ranges(96, 32, 3), vec![(0, 32), (32, 64), (64, 96)]);
    }

    #[test]
    fn split_shares_rows_when_it_can() {
        assert_eq!(split_for_threads(1024, 1024, 32, 12, 1), Split::None);
        assert_eq!(split_for_threads(1024, 128, 32, 12, 2), Split::SharedB(2));
        assert_eq!(split_for_threads(64, 1000, 32, 12, 4), Split::SharedB(2));
        // One row tile: split columns instead.
        assert_eq!(split_for_threads(20, 24, 32, 12, 2), Split::Cols(vec![(0, 12), (12, 24)]));
        assert_eq!(split_for_threads(8, 8, 32, 12, 2), Split::None);
    }
}
