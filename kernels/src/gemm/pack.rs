//! Packing: copying a block of A or B into the order the micro-kernel reads.
//!
//! A block of A (`mc x kc`) becomes `ceil(mc / mr)` micro-panels; panel `q`
//! holds, for each `p` in `0..kc`, the `mr` elements `A[q*mr .. q*mr+mr, p]`
//! side by side. B (`kc x nc`) is packed the same way as `B^T` with width
//! `nr`. Rows past the edge of the matrix are filled with zeros so that the
//! micro-kernel always runs on whole tiles. Strides are resolved here, and
//! narrow element types (f16, bf16) are widened here, once per element.
//!
//! bf16 packed as [`Bf16Pair`]s has the same layout with a pair of depth
//! indices `(2u, 2u + 1)` in place of one index `p`; an odd depth's last pair
//! is completed with a zero.

use super::element::{Bf16Pair, Compute, PackSource};
use super::matrix::MatRef;
#[cfg(target_arch = "x86_64")]
use super::matrix::PackShape;
use half::bf16;

/// Which vector packers may run: those of the micro-kernel's instruction
/// set, which its selection has checked the CPU for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum PackSimd {
    /// Scalar loops only.
    #[default]
    Scalar,
    /// The AVX2 f32 packers (`pack_avx2`); narrow types widened to f32 too.
    Avx2,
    /// The AVX-512 packers (`pack_avx512`): f32, f64, widened narrow types,
    /// and bf16 pairs where AVX-512BW is available.
    Avx512,
}

impl PackSimd {
    /// The best packers this CPU can run (for tests and references).
    #[cfg(test)]
    pub(crate) fn best() -> PackSimd {
        let cpu = crate::cpu_features::cpu_features();
        if cpu.avx512f {
            PackSimd::Avx512
        } else if cpu.has_avx2_fma() {
            PackSimd::Avx2
        } else {
            PackSimd::Scalar
        }
    }
}

/// A stored element type that can be packed into `P`.
pub(crate) trait PackInto<P>: Copy + Send + Sync + 'static {
    /// Packs `src` (`rows x depth`) into panels of `width` rows; see the
    /// module doc. `dst` must hold
    /// `rows.div_ceil(width) * width * depth.div_ceil(P::DEPTH)` elements.
    /// `simd` names the vector packers that may run where they apply.
    fn pack(dst: &mut [P], src: MatRef<'_, Self>, width: usize, simd: PackSimd);
}

impl<T: Compute, S: PackSource<T>> PackInto<T> for S {
    fn pack(dst: &mut [T], src: MatRef<'_, S>, width: usize, simd: PackSimd) {
        pack_panels(dst, src, width, simd);
    }
}

impl PackInto<Bf16Pair> for bf16 {
    fn pack(dst: &mut [Bf16Pair], src: MatRef<'_, bf16>, width: usize, simd: PackSimd) {
        pack_pairs(dst, src, width, simd);
    }
}

/// [`PackInto::pack`] for the compute types, widening narrow sources.
/// With vector packers, f32 operands with a unit stride (and f16 / bf16
/// ones with contiguous panel rows) are packed with them, and f64 ones too
/// with AVX-512.
pub(crate) fn pack_panels<T: Compute, S: PackSource<T>>(
    dst: &mut [T],
    src: MatRef<'_, S>,
    width: usize,
    simd: PackSimd,
) {
    let (rows, depth) = (src.rows(), src.cols());
    let (rs, cs) = (src.row_stride(), src.col_stride());
    let data = src.data();
    let panel_len = width * depth;
    if rows == 0 || depth == 0 {
        return;
    }
    assert!(dst.len() >= rows.div_ceil(width) * panel_len, "pack buffer too small");
    #[cfg(target_arch = "x86_64")]
    if pack_simd(dst, src, width, simd) {
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = simd;
    for (q, panel) in dst.chunks_exact_mut(panel_len).take(rows.div_ceil(width)).enumerate() {
        let r0 = q * width;
        let live = width.min(rows - r0);
        let base = src.offset() + r0 * rs;
        if rs == 1 || live == 1 {
            // Each column of the panel is contiguous in the source.
            for (p, out) in panel.chunks_exact_mut(width).enumerate() {
                let start = base + p * cs;
                if live == 1 {
                    out[0] = data[start].to_compute();
                } else {
                    S::convert_slice(&data[start..start + live], &mut out[..live]);
                }
                out[live..].fill(T::ZERO);
            }
        } else if cs == 1 {
            // Each row of the panel is contiguous: a transposing copy, done
            // a row at a time so that every read streams.
            for i in 0..live {
                let row = &data[base + i * rs..base + i * rs + depth];
                for (out, &x) in panel.chunks_exact_mut(width).zip(row) {
                    out[i] = x.to_compute();
                }
            }
            if live < width {
                for out in panel.chunks_exact_mut(width) {
                    out[live..].fill(T::ZERO);
                }
            }
        } else {
            for (p, out) in panel.chunks_exact_mut(width).enumerate() {
                for (i, o) in out[..live].iter_mut().enumerate() {
                    *o = data[base + i * rs + p * cs].to_compute();
                }
                out[live..].fill(T::ZERO);
            }
        }
    }
}

/// The shape of a non-empty view for the vector packers, and the address
/// of its element (0, 0).
#[cfg(target_arch = "x86_64")]
fn simd_args<S>(src: MatRef<'_, S>, width: usize) -> (*const S, PackShape) {
    // Non-empty view (checked by the callers): element (0, 0) is in bounds.
    let origin = src.data()[src.offset()..].as_ptr();
    let (rows, depth, rs, cs) = (src.rows(), src.cols(), src.row_stride(), src.col_stride());
    (origin, PackShape { rows, depth, rs, cs, width })
}

/// An f32 packer of one instruction set (see `pack_avx2::pack_f32`).
#[cfg(target_arch = "x86_64")]
type PackF32 = unsafe fn(*mut f32, *const f32, PackShape);

/// The vector packers, for f32 from f32 (either stride 1), f32 from f16 or
/// bf16 with contiguous panel rows, and with AVX-512 f64 from f64 (either
/// stride 1); returns whether it packed (false otherwise).
#[cfg(target_arch = "x86_64")]
fn pack_simd<T: Compute, S: PackSource<T>>(dst: &mut [T], src: MatRef<'_, S>, width: usize, simd: PackSimd) -> bool {
    use std::any::TypeId;
    let pack_f32: PackF32 = match simd {
        PackSimd::Scalar => return false,
        PackSimd::Avx2 => super::pack_avx2::pack_f32,
        PackSimd::Avx512 => super::pack_avx512::pack_f32,
    };
    let (origin, shape) = simd_args(src, width);
    let unit_stride = shape.rs == 1 || shape.cs == 1;
    let same = TypeId::of::<S>() == TypeId::of::<T>();
    if unit_stride && same && TypeId::of::<T>() == TypeId::of::<f32>() {
        // SAFETY: T and S are both f32 (same TypeId), so the casts are
        // identities; the view was bounds-checked when made, `dst` is large
        // enough (asserted by the caller), and the kernel's selection
        // checked the packer's instruction set.
        unsafe { pack_f32(dst.as_mut_ptr().cast(), origin.cast(), shape) };
        true
    } else if simd == PackSimd::Avx512 && unit_stride && same && TypeId::of::<T>() == TypeId::of::<f64>() {
        // SAFETY: as above, with f64 and AVX-512F.
        unsafe { super::pack_avx512::pack_f64(dst.as_mut_ptr().cast(), origin.cast(), shape) };
        true
    } else if TypeId::of::<T>() == TypeId::of::<f32>() && shape.cs == 1 && shape.rs != 1 {
        pack_widened_rows(dst, src, width, pack_f32);
        true
    } else {
        false
    }
}

/// A narrow operand (f16, bf16) widened to f32 whose panel rows are
/// contiguous: each panel's rows are widened into an f32 scratch block (a
/// vectorised pass over a few kilobytes), which the vector f32 packer then
/// transposes. The scalar transposing copy this replaces cost about a fifth
/// of a bf16 product. The caller has checked that `T` is f32 and that the
/// CPU runs `pack_f32`.
#[cfg(target_arch = "x86_64")]
fn pack_widened_rows<T: Compute, S: PackSource<T>>(dst: &mut [T], src: MatRef<'_, S>, width: usize, pack_f32: PackF32) {
    let (rows, depth, rs) = (src.rows(), src.cols(), src.row_stride());
    let data = src.data();
    let mut scratch = vec![T::ZERO; width * depth];
    for (q, panel) in dst.chunks_exact_mut(width * depth).take(rows.div_ceil(width)).enumerate() {
        let live = width.min(rows - q * width);
        for (i, out) in scratch.chunks_exact_mut(depth).take(live).enumerate() {
            let start = src.offset() + (q * width + i) * rs;
            S::convert_slice(&data[start..start + depth], out);
        }
        let shape = PackShape { rows: live, depth, rs: depth, cs: 1, width };
        // SAFETY: T is f32 (caller's check), so the casts are identities;
        // the scratch holds `live` rows of `depth` elements, `depth` apart;
        // the panel holds `width * depth` elements; the caller checked the
        // packer's instruction set.
        unsafe { pack_f32(panel.as_mut_ptr().cast(), scratch.as_ptr().cast(), shape) };
    }
}

/// [`PackInto::pack`] for bf16 pairs. With the AVX-512 packers, operands
/// with a unit stride are packed with them.
fn pack_pairs(dst: &mut [Bf16Pair], src: MatRef<'_, bf16>, width: usize, simd: PackSimd) {
    let (rows, depth) = (src.rows(), src.cols());
    if rows == 0 || depth == 0 {
        return;
    }
    let units = depth.div_ceil(2);
    assert!(dst.len() >= rows.div_ceil(width) * width * units, "pack buffer too small");
    #[cfg(target_arch = "x86_64")]
    if simd == PackSimd::Avx512 && (src.row_stride() == 1 || src.col_stride() == 1) {
        let (origin, shape) = simd_args(src, width);
        // SAFETY: the view was bounds-checked when made and has a unit
        // stride, `dst` is large enough (asserted above), and the pair
        // kernels' selection checked AVX-512F and AVX-512BW.
        unsafe { super::pack_avx512::pack_pairs(dst.as_mut_ptr(), origin, shape) };
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = simd;
    let at = |i: usize, p: usize| src.get(i, p).copied().unwrap_or(bf16::ZERO);
    for (q, panel) in dst.chunks_exact_mut(width * units).take(rows.div_ceil(width)).enumerate() {
        for (u, out) in panel.chunks_exact_mut(width).enumerate() {
            for (i, o) in out.iter_mut().enumerate() {
                let r = q * width + i;
                // Past the last row or column, `get` gives None: zero.
                *o = Bf16Pair::new(at(r, 2 * u), at(r, 2 * u + 1));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packed(src: MatRef<'_, f32>, width: usize) -> Vec<f32> {
        let mut dst = vec![f32::NAN; src.rows().div_ceil(width) * width * src.cols()];
        pack_panels(&mut dst, src, width, PackSimd::Scalar);
        let mut simd = vec![f32::NAN; dst.len()];
        pack_panels(&mut simd, src, width, PackSimd::best());
        assert_eq!(dst, simd, "{:?} packing differs", PackSimd::best());
        dst
    }

    #[test]
    fn all_stride_paths_agree() {
        // 5x3 matrix, element (i, p) = 10 i + p.
        let rm: Vec<f32> = (0..5).flat_map(|i| (0..3).map(move |p| (10 * i + p) as f32)).collect();
        let row_major = MatRef::row_major(&rm, 5, 3).unwrap();
        let cm: Vec<f32> = (0..3).flat_map(|p| (0..5).map(move |i| (10 * i + p) as f32)).collect();
        let col_major = MatRef::col_major(&cm, 5, 3).unwrap();
        let mut wide = vec![0.0f32; 5 * 7];
        for i in 0..5 {
            for p in 0..3 {
                wide[i * 7 + p * 2] = (10 * i + p) as f32;
            }
        }
        let strided = MatRef::new(&wide, 0, [5, 3], [7, 2]).unwrap();
        let expect = vec![
            0., 10., 20., 30., 1., 11., 21., 31., 2., 12., 22., 32., // panel 0
            40., 0., 0., 0., 41., 0., 0., 0., 42., 0., 0., 0., // panel 1, padded
        ];
        assert_eq!(packed(row_major, 4), expect);
        assert_eq!(packed(col_major, 4), expect);
        assert_eq!(packed(strided, 4), expect);
    }

    /// Element-wise reference of the packed layout.
    fn reference<T: Copy + Default>(src: MatRef<'_, T>, width: usize) -> Vec<T> {
        let (rows, depth) = (src.rows(), src.cols());
        let mut out = vec![T::default(); rows.div_ceil(width) * width * depth];
        for q in 0..rows.div_ceil(width) {
            for p in 0..depth {
                for i in 0..width {
                    if let Some(&x) = src.get(q * width + i, p) {
                        out[q * width * depth + p * width + i] = x;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn simd_and_scalar_packing_match_reference_on_many_shapes() {
        // The scalar packer, and every vector packer this CPU runs.
        let packers: Vec<PackSimd> = match PackSimd::best() {
            PackSimd::Avx512 => vec![PackSimd::Scalar, PackSimd::Avx2, PackSimd::Avx512],
            PackSimd::Avx2 => vec![PackSimd::Scalar, PackSimd::Avx2],
            PackSimd::Scalar => vec![PackSimd::Scalar],
        };
        let data32: Vec<f32> = (0..12000).map(|i| i as f32 + 0.5).collect();
        let data64: Vec<f64> = (0..12000).map(|i| i as f64 + 0.25).collect();
        // Scattered finite bit patterns (bit 14 clear: the exponent is never
        // all ones), subnormals included: widening is exact.
        let pattern = |i: u16| i.wrapping_mul(40503) & 0xbfff;
        let data_bf16: Vec<half::bf16> = (0..12000).map(|i| half::bf16::from_bits(pattern(i))).collect();
        let data_f16: Vec<half::f16> = (0..12000).map(|i| half::f16::from_bits(pattern(i))).collect();
        for width in [4, 6, 8, 12, 16, 32] {
            for (rows, depth) in [(1, 1), (3, 17), (31, 5), (33, 16), (40, 37), (12, 40), (300, 9), (7, 8), (16, 64)] {
                // Row-major, column-major and doubly strided storage.
                for strides in [[depth, 1], [1, rows], [2 * depth + 1, 2]] {
                    let a32 = MatRef::new(&data32, 3, [rows, depth], strides).unwrap();
                    let want = reference(a32, width);
                    for &simd in &packers {
                        let mut got = vec![f32::NAN; want.len()];
                        pack_panels(&mut got, a32, width, simd);
                        assert_eq!(got, want, "f32 {rows}x{depth} {strides:?} w{width} simd {simd:?}");
                    }
                    let a16 = MatRef::new(&data_bf16, 3, [rows, depth], strides).unwrap();
                    let want: Vec<f32> = reference(a16, width).iter().map(|x| x.to_f32()).collect();
                    for &simd in &packers {
                        let mut got = vec![f32::NAN; want.len()];
                        pack_panels(&mut got, a16, width, simd);
                        assert_eq!(got, want, "bf16 {rows}x{depth} {strides:?} w{width} simd {simd:?}");
                    }
                    let ah = MatRef::new(&data_f16, 3, [rows, depth], strides).unwrap();
                    let want: Vec<f32> = reference(ah, width).iter().map(|x| x.to_f32()).collect();
                    for &simd in &packers {
                        let mut got = vec![f32::NAN; want.len()];
                        pack_panels(&mut got, ah, width, simd);
                        assert_eq!(got, want, "f16 {rows}x{depth} {strides:?} w{width} simd {simd:?}");
                    }
                    let a64 = MatRef::new(&data64, 3, [rows, depth], strides).unwrap();
                    let want = reference(a64, width);
                    for &simd in &packers {
                        let mut got = vec![f64::NAN; want.len()];
                        pack_panels(&mut got, a64, width, simd);
                        assert_eq!(got, want, "f64 {rows}x{depth} {strides:?} w{width} simd {simd:?}");
                    }
                }
            }
        }
    }

    /// Element-wise reference of the pair layout.
    fn reference_pairs(src: MatRef<'_, bf16>, width: usize) -> Vec<Bf16Pair> {
        let (rows, units) = (src.rows(), src.cols().div_ceil(2));
        let at = |i, p| src.get(i, p).copied().unwrap_or(bf16::ZERO);
        let mut out = vec![Bf16Pair(0); rows.div_ceil(width) * width * units];
        for q in 0..rows.div_ceil(width) {
            for u in 0..units {
                for i in 0..width {
                    let r = q * width + i;
                    out[q * width * units + u * width + i] = Bf16Pair::new(at(r, 2 * u), at(r, 2 * u + 1));
                }
            }
        }
        out
    }

    #[test]
    fn pair_packing_matches_reference_on_many_shapes() {
        let cpu = crate::cpu_features::cpu_features();
        let simd_too = if cfg!(target_arch = "x86_64") && cpu.avx512f && cpu.avx512bw {
            PackSimd::Avx512
        } else {
            PackSimd::Scalar
        };
        // Every bit pattern: packing moves bits and never looks at values.
        let data: Vec<bf16> = (0..40000u32).map(|i| bf16::from_bits((i.wrapping_mul(40503) >> 3) as u16)).collect();
        for width in [4, 12, 16, 32, 48] {
            for (rows, depth) in [(1, 1), (1, 2), (3, 17), (31, 5), (33, 16), (40, 37), (12, 40), (300, 9), (17, 64)] {
                // Row-major (also with an odd padded row stride), column-major
                // (also padded), and doubly strided storage.
                for strides in [[depth, 1], [depth + 3, 1], [1, rows], [1, rows + 1], [2 * depth + 1, 2]] {
                    let src = MatRef::new(&data, 3, [rows, depth], strides).unwrap();
                    let want = reference_pairs(src, width);
                    for simd in [PackSimd::Scalar, simd_too] {
                        // A pattern no packing writes, to catch missed elements.
                        let mut got = vec![Bf16Pair(0xdead_beef); want.len()];
                        bf16::pack(&mut got, src, width, simd);
                        assert_eq!(got, want, "{rows}x{depth} {strides:?} w{width} simd {simd:?}");
                    }
                }
            }
        }
        // Odd depth: the last pair's high half is zero, not the next element.
        let v: Vec<bf16> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].iter().map(|&x| bf16::from_f32(x)).collect();
        for simd in [PackSimd::Scalar, simd_too] {
            let mut got = vec![Bf16Pair(0); 4 * 2];
            bf16::pack(&mut got, MatRef::row_major(&v, 2, 3).unwrap(), 4, simd);
            let pair = |lo: f32, hi: f32| Bf16Pair::new(bf16::from_f32(lo), bf16::from_f32(hi));
            let zero = Bf16Pair(0);
            assert_eq!(got, [pair(1.0, 2.0), pair(4.0, 5.0), zero, zero, pair(3.0, 0.0), pair(6.0, 0.0), zero, zero]);
        }
    }
}
