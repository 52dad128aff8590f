//! The template of the x86 micro-kernels: one macro, instantiated per
//! instruction set and element type in `microkernel_avx512` and
//! `microkernel_avx2`.
//!
//! A kernel holds an `MR x NR` tile of C in `NR * MV` vector registers
//! (`MV` vectors of `LANES` elements make one column of `MR = MV * LANES`).
//! Each step of `p` loads `MV` vectors of packed A, broadcasts `NR` elements
//! of packed B and issues `MV * NR` independent multiply-adds: with two FMA
//! pipes of latency 4, at least 8 independent accumulators keep them busy.
//! The packed elements are usually C's type; for bf16 pairs a step is two
//! depth indices and the multiply-add a dot product of pairs.

/// Generates one micro-kernel; see the module doc. The invoking module
/// imports `std::arch::x86_64::*`.
///
/// `c: [...]` are the operations on vectors of C's type: zero, load, store,
/// broadcast, fused multiply-add `(a, b, acc)` and multiply. `ab: [...]` are
/// those on packed operands: zero, load of A, broadcast of one B element,
/// and the multiply-add into an accumulator `(a, b, acc)`.
macro_rules! simd_tile {
    // Packed operands of C's type: the same operations on both.
    (
        $(#[$doc:meta])*
        $name:ident, $feature:literal, $t:ty, lanes $lanes:literal, mv $mv:literal, nr $nr:literal,
        prefetch $prefetch_lines:literal,
        c: [$zero:path, $loadu:path, $storeu:path, $set1:path, $fmadd:path, $mul:path]
    ) => {
        simd_tile!(
            $(#[$doc])*
            $name, $feature, $t => $t, lanes $lanes, mv $mv, nr $nr, prefetch $prefetch_lines,
            c: [$zero, $loadu, $storeu, $set1, $fmadd, $mul],
            ab: [$zero, $loadu, $set1, $fmadd]
        );
    };
    (
        $(#[$doc:meta])*
        $name:ident, $feature:literal, $p:ty => $t:ty, lanes $lanes:literal, mv $mv:literal, nr $nr:literal,
        prefetch $prefetch_lines:literal,
        c: [$zero:path, $loadu:path, $storeu:path, $set1:path, $fmadd:path, $mul:path],
        ab: [$zero_ab:path, $load_a:path, $bcast_b:path, $madd:path]
    ) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The CPU supports the target features; `a` points to
        /// `kc * MR` readable packed elements, `b` to `kc * NR`, and
        /// `c + i + j * cs_c` is writable for `i < MR`, `j < NR`.
        #[target_feature(enable = $feature)]
        pub(crate) unsafe fn $name(
            kc: usize,
            a: *const $p,
            b: *const $p,
            c: *mut $t,
            cs_c: usize,
            alpha: $t,
            beta: $t,
        ) {
            // SAFETY: all pointer arithmetic stays within the `kc * MR`
            // elements of `a`, `kc * NR` of `b` and the MR x NR tile of `c`
            // that the caller guarantees; unaligned loads/stores need no
            // alignment; the target features are enabled on this function.
            unsafe {
                // Warm the C tile while the loop runs: it is touched only at
                // the end, and usually is not in cache.
                for j in 0..$nr {
                    for l in 0..$prefetch_lines {
                        _mm_prefetch::<_MM_HINT_T0>(c.add(j * cs_c + l * (64 / size_of::<$t>())) as *const i8);
                    }
                }
                let mut acc = [[$zero(); $mv]; $nr];
                let mut a = a;
                let mut b = b;
                for _ in 0..kc {
                    let mut av = [$zero_ab(); $mv];
                    for (v, x) in av.iter_mut().enumerate() {
                        *x = $load_a(a.add(v * $lanes));
                    }
                    for (j, accj) in acc.iter_mut().enumerate() {
                        let bj = $bcast_b(*b.add(j));
                        for (x, &ai) in accj.iter_mut().zip(&av) {
                            *x = $madd(ai, bj, *x);
                        }
                    }
                    a = a.add($lanes * $mv);
                    b = b.add($nr);
                }
                let alpha_v = $set1(alpha);
                if beta == 0.0 {
                    // BLAS semantics: with beta = 0, C is written, never read
                    // (a NaN already in C does not leak into the result).
                    for (j, accj) in acc.iter().enumerate() {
                        for (v, &x) in accj.iter().enumerate() {
                            $storeu(c.add(j * cs_c + v * $lanes), $mul(x, alpha_v));
                        }
                    }
                } else {
                    let beta_v = $set1(beta);
                    for (j, accj) in acc.iter().enumerate() {
                        for (v, &x) in accj.iter().enumerate() {
                            let p = c.add(j * cs_c + v * $lanes);
                            $storeu(p, $fmadd(x, alpha_v, $mul($loadu(p), beta_v)));
                        }
                    }
                }
            }
        }
    };
}

pub(crate) use simd_tile;
