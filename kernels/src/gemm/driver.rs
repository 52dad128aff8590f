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
use super::matrix::{MatRef, RawMut};
use super::microkernel::{MicroKernel, MAX_TILE};
use super::pack::PackInto;
use super::parallel::gemm_shared_b;
use rayon::prelude::*;

/// What to run: a kernel accumulating in `T` on packed `P`, its blocking and
/// the number of threads.
#[derive(Clone, Copy)]
pub(crate) struct Plan<T, P> {
    pub kernel: MicroKernel<T, P>,
    pub blocking: Blocking,
    pub threads: usize,
}

impl<T, P: Packed> Plan<T, P> {
    /// The blocking for depth `k`: see [`Blocking::for_depth`].
    pub fn blocking_for(&self, k: usize) -> Blocking {
        self.blocking.for_depth(k, self.kernel.mr, self.kernel.nr, P::DEPTH)
    }
}

/// Packed elements holding `k` depth elements.
pub(crate) fn packed_depth<P: Packed>(k: usize) -> usize {
    k.div_ceil(P::DEPTH)
}

/// One product `C = alpha * A * B + beta * C` with scalars of the compute
/// type `T`, operands stored as `S` and C of type `C` (the drivers write a C
/// of the compute type). Shapes agree (checked by the caller): `A` is
/// `m x k`, `B` is `k x n`, `C` is `m x n`.
#[derive(Clone, Copy)]
pub(crate) struct Product<'a, T, S, C = T> {
    pub alpha: T,
    pub a: MatRef<'a, S>,
    pub b: MatRef<'a, S>,
    pub beta: T,
    pub c: RawMut<C>,
}

impl<'a, T, S, C> Product<'a, T, S, C> {
    /// The same product into another C.
    pub fn with_c<D>(self, c: RawMut<D>) -> Product<'a, T, S, D> {
        Product { alpha: self.alpha, a: self.a, b: self.b, beta: self.beta, c }
    }
}

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

/// All micro-tiles of one packed A block times one packed B panel, `kc`
/// packed elements deep.
pub(crate) fn macro_kernel<T: Compute, P>(
    kernel: &MicroKernel<T, P>,
    kc: usize,
    a_pack: &[P],
    b_pack: &[P],
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
