//! What one product is and the pieces every schedule of it is built from:
//! the plan (micro-kernel, blocking, threads), the operands, the cut of a
//! dimension into whole tiles and the macro-kernel (all micro-tiles of one
//! packed A block times one packed B panel). The single-thread loops and the
//! column split (`driver.rs`) and the shared-B schedule (`parallel.rs`) run
//! on them.

use super::blocking::Blocking;
use super::element::{Compute, Packed};
use super::matrix::{MatRef, RawMut};
use super::microkernel::{MicroKernel, MAX_TILE};

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
}
