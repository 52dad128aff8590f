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
use super::element::{Compute, Packed};
use super::matrix::RawMut;
use super::pack::PackInto;
use super::parallel::gemm_shared_b;
use super::product::{macro_kernel, packed_depth, ranges, Plan, Product};
use rayon::prelude::*;

impl<T, S> Product<'_, T, S> {
    /// The same product transposed: `C^T = B^T A^T`.
    fn t(self) -> Self {
        Product { a: self.b.t(), b: self.a.t(), c: self.c.t(), ..self }
    }

    /// The part that computes columns `j0..j1` of C.
    ///
    /// # Safety
    /// The columns are inside C.
    unsafe fn columns(self, j0: usize, j1: usize) -> Self {
        // SAFETY: inside C (caller's contract).
        let c = unsafe { self.c.sub(0, j0, self.c.rows, j1 - j0) };
        Product { b: self.b.sub(0, j0, self.b.rows(), j1 - j0), c, ..self }
    }
}

/// Runs the product.
pub(crate) fn gemm<T: Compute, P: Packed, S: PackInto<P>>(plan: &Plan<T, P>, p: Product<'_, T, S>) {
    let (m, n, k) = (p.c.rows, p.c.cols, p.a.cols());
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 || p.alpha == T::ZERO {
        scale(p.c, p.beta);
        return;
    }
    // The micro-kernel writes columns of C with vector stores. A row-major C
    // is the column-major C^T = B^T A^T: swap rather than scatter.
    let p = if p.c.row_stride != 1 && p.c.col_stride == 1 { p.t() } else { p };
    match split_for_threads(p.c.rows, p.c.cols, plan.kernel.mr, plan.kernel.nr, plan.threads) {
        Split::None => sequential(plan, p),
        Split::SharedB(threads) => gemm_shared_b(plan, threads, p),
        // SAFETY: the column ranges are disjoint and inside C.
        Split::Cols(parts) => parts.into_par_iter().for_each(|(j0, j1)| sequential(plan, unsafe { p.columns(j0, j1) })),
    }
}

/// `C = beta * C`, writing zeros (not `0 * C`) when beta is 0.
pub(crate) fn scale<T: Compute>(c: RawMut<T>, beta: T) {
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

#[derive(Debug, PartialEq)]
enum Split {
    None,
    /// Threads share packed B and claim blocks of rows (see `parallel`).
    SharedB(usize),
    /// Too few rows to share: each thread takes columns and packs its own.
    Cols(Vec<(usize, usize)>),
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
fn sequential<T: Compute, P: Packed, S: PackInto<P>>(plan: &Plan<T, P>, p: Product<'_, T, S>) {
    let Product { alpha, a, b, beta, c } = p;
    let (m, n, k) = (c.rows, c.cols, a.cols());
    let kernel = &plan.kernel;
    let (mr, nr) = (kernel.mr, kernel.nr);
    let Blocking { mc, kc, nc } = plan.blocking_for(k);
    let kc_max = packed_depth::<P>(kc.min(k));
    let a_len = mc.min(m.div_ceil(mr) * mr) * kc_max;
    let b_len = nc.min(n.div_ceil(nr) * nr) * kc_max;
    with_pack_buffers::<P, _>(a_len, b_len, |a_pack, b_pack| {
        for jc in (0..n).step_by(nc) {
            let ncb = nc.min(n - jc);
            for pc in (0..k).step_by(kc) {
                let kcb = kc.min(k - pc);
                S::pack(b_pack, b.sub(pc, jc, kcb, ncb).t(), nr, kernel.simd_pack);
                // Later depth blocks add to what the first one wrote.
                let beta_p = if pc == 0 { beta } else { T::ONE };
                for ic in (0..m).step_by(mc) {
                    let mcb = mc.min(m - ic);
                    S::pack(a_pack, a.sub(ic, pc, mcb, kcb), mr, kernel.simd_pack);
                    // SAFETY: the block is inside C.
                    let c_block = unsafe { c.sub(ic, jc, mcb, ncb) };
                    macro_kernel(kernel, packed_depth::<P>(kcb), a_pack, b_pack, alpha, beta_p, c_block);
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

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
