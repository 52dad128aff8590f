//! Portable micro-kernel: plain Rust that the compiler vectorises for the
//! baseline target. Used where neither AVX-512 nor AVX2+FMA exists.

use super::element::Compute;

/// `C[0..MR, 0..NR] = alpha * A_panel * B_panel + beta * C` for one tile;
/// see [`super::microkernel::MicroKernelFn`] for the contract.
///
/// # Safety
/// `a` points to `kc * MR` readable elements, `b` to `kc * NR`, and
/// `c + i + j * cs_c` is writable for `i < MR`, `j < NR`.
pub(crate) unsafe fn tile<T: Compute, const MR: usize, const NR: usize>(
    kc: usize,
    a: *const T,
    b: *const T,
    c: *mut T,
    cs_c: usize,
    alpha: T,
    beta: T,
) {
    // SAFETY: the caller guarantees `kc * MR` elements behind `a` and
    // `kc * NR` behind `b`.
    let (a, b) = unsafe { (std::slice::from_raw_parts(a, kc * MR), std::slice::from_raw_parts(b, kc * NR)) };
    let mut acc = [[T::ZERO; MR]; NR];
    for (ap, bp) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
        for (accj, &bj) in acc.iter_mut().zip(bp) {
            for (x, &ai) in accj.iter_mut().zip(ap) {
                *x = *x + ai * bj;
            }
        }
    }
    for (j, accj) in acc.iter().enumerate() {
        // SAFETY: column j of the tile is writable for MR elements (caller).
        let col = unsafe { std::slice::from_raw_parts_mut(c.add(j * cs_c), MR) };
        if beta == T::ZERO {
            for (o, &x) in col.iter_mut().zip(accj) {
                *o = alpha * x;
            }
        } else {
            for (o, &x) in col.iter_mut().zip(accj) {
                *o = alpha * x + beta * *o;
            }
        }
    }
}
