//! Indexing loops over slices: picking rows by index (`index_select`,
//! embedding lookups), element-wise gathers and scatter-adds along one
//! dimension, one-hot encoding, and copies between two sequences of
//! contiguous runs (concatenation).
//!
//! Indices are `i64`, as tensors store them. Every index is checked against
//! the size of the dimension it indexes before anything is written; a bad one
//! is an [`IndexError::OutOfRange`] carrying its position, value and the size,
//! so the caller can name the dimension in its message. Negative indices are
//! out of range (PyTorch's rule for these ops).

use std::fmt;
use std::ops::Range;

use crate::reduce::{Accumulator, ReduceElement};

/// Why an indexing kernel refused its input.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum IndexError {
    /// `indices[position] == index`, which is not in `0..size`.
    OutOfRange {
        /// Position of the bad index in the index slice (row-major).
        position: usize,
        /// Its value.
        index: i64,
        /// The size of the dimension it indexes.
        size: usize,
    },
    /// The slices' lengths do not fit the shape described by the arguments.
    Shape {
        /// Which lengths disagree.
        detail: String,
    },
}

impl fmt::Display for IndexError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IndexError::OutOfRange { position, index, size } => {
                write!(f, "index {index} at position {position} is out of range for a dimension of size {size}")
            }
            IndexError::Shape { detail } => write!(f, "shape mismatch: {detail}"),
        }
    }
}

impl std::error::Error for IndexError {}

fn shape_error(detail: String) -> IndexError {
    IndexError::Shape { detail }
}

/// Errors on the first index outside `0..size`. The scan for "any bad index"
/// is branch-free and vectorises; the position is only looked for on failure.
pub fn check_indices(indices: &[i64], size: usize) -> Result<(), IndexError> {
    let limit = i64::try_from(size).unwrap_or(i64::MAX);
    let any_bad = indices.iter().fold(false, |bad, &i| bad | !(0..limit).contains(&i));
    if !any_bad {
        return Ok(());
    }
    match indices.iter().position(|&i| !(0..limit).contains(&i)) {
        Some(position) => Err(IndexError::OutOfRange { position, index: indices[position], size }),
        None => Ok(()),
    }
}

/// `dst[o, j, :] = src[o, indices[j], :]` for a row-major `src` of shape
/// `[outer, size, inner]` and `dst` of shape `[outer, indices.len(), inner]`
/// (`outer` follows from the lengths). An embedding lookup is the case
/// `outer == 1`.
pub fn index_select<T: Copy>(
    src: &[T],
    size: usize,
    inner: usize,
    indices: &[i64],
    dst: &mut [T],
) -> Result<(), IndexError> {
    check_indices(indices, size)?;
    let src_block = size * inner;
    let dst_block = indices.len() * inner;
    if src_block == 0 || dst_block == 0 {
        return if dst.is_empty() {
            Ok(())
        } else {
            Err(shape_error(format!("dst has {} elements but selects from an empty src", dst.len())))
        };
    }
    if !src.len().is_multiple_of(src_block) || dst.len() != src.len() / src_block * dst_block {
        return Err(shape_error(format!(
            "src of {} elements is not [outer, {size}, {inner}], or dst of {} elements is not [outer, {}, {inner}]",
            src.len(),
            dst.len(),
            indices.len()
        )));
    }
    for (src, dst) in src.chunks_exact(src_block).zip(dst.chunks_exact_mut(dst_block)) {
        for (&index, out) in indices.iter().zip(dst.chunks_exact_mut(inner)) {
            // In range: checked above.
            let start = index as usize * inner;
            out.copy_from_slice(&src[start..start + inner]);
        }
    }
    Ok(())
}

/// `dst[p] = src[bases[p] + indices[p] * stride]` for each position `p`:
/// a gather along one dimension of size `size` and stride `stride`, where
/// `bases` yields the storage offset of each position with that dimension's
/// coordinate set to 0. Errors on an index outside `0..size` or an offset
/// past `src`; `dst`, `indices` and `bases` must have the same length.
pub fn gather<T: Copy>(
    src: &[T],
    bases: impl Iterator<Item = usize>,
    indices: &[i64],
    size: usize,
    stride: usize,
    dst: &mut [T],
) -> Result<(), IndexError> {
    if indices.len() != dst.len() {
        return Err(shape_error(format!("{} indices for {} outputs", indices.len(), dst.len())));
    }
    check_indices(indices, size)?;
    let mut written = 0;
    for ((out, &index), base) in dst.iter_mut().zip(indices).zip(bases) {
        let at = base + index as usize * stride;
        *out = *src.get(at).ok_or_else(|| shape_error(format!("offset {at} is past src of {} elements", src.len())))?;
        written += 1;
    }
    if written != dst.len() {
        return Err(shape_error(format!("{written} base offsets for {} outputs", dst.len())));
    }
    Ok(())
}

/// `dst[bases[p] + indices[p] * stride] += values[p]` for each position `p`,
/// in order (so repeated indices accumulate). The addition happens in the
/// element's accumulator type (`f32` for half types, `i64` for integers,
/// wrapping back on store; for `bool` it is a logical or). Every index is
/// checked before anything is written; an offset past `dst` is an error.
pub fn scatter_add<T: ReduceElement>(
    dst: &mut [T],
    bases: impl Iterator<Item = usize>,
    indices: &[i64],
    size: usize,
    stride: usize,
    values: impl Iterator<Item = T>,
) -> Result<(), IndexError> {
    check_indices(indices, size)?;
    let len = dst.len();
    for ((&index, base), value) in indices.iter().zip(bases).zip(values) {
        let at = base + index as usize * stride;
        let slot = dst.get_mut(at).ok_or_else(|| shape_error(format!("offset {at} is past dst of {len} elements")))?;
        *slot = T::from_acc(slot.to_acc().add(value.to_acc()));
    }
    Ok(())
}

/// `dst[ids[j]] += src[j]` for rows of `inner` elements (`dst` and `src`
/// row-major, `size` rows in `dst`, one row of `src` per id), in order of
/// `j` (so repeated ids accumulate): a scatter-add along the first dim whose
/// index is constant along every row, as an embedding's backward or
/// `index_add_` along dim 0 make. Each element is added exactly as
/// [`scatter_add`] adds it, in the same order, so the results are the same
/// bits; whole rows at a time let the additions vectorise. Every id is
/// checked before anything is written.
pub fn scatter_add_rows<T: ReduceElement>(
    dst: &mut [T],
    size: usize,
    inner: usize,
    ids: &[i64],
    src: &[T],
) -> Result<(), IndexError> {
    check_indices(ids, size)?;
    if dst.len() != size * inner || src.len() != ids.len() * inner {
        return Err(shape_error(format!(
            "{size} rows of {inner} in dst and {} ids need {} and {} elements, got {} and {}",
            ids.len(),
            size * inner,
            ids.len() * inner,
            dst.len(),
            src.len()
        )));
    }
    if inner == 0 {
        return Ok(());
    }
    for (&id, row) in ids.iter().zip(src.chunks_exact(inner)) {
        let start = id as usize * inner;
        for (slot, &value) in dst[start..start + inner].iter_mut().zip(row) {
            *slot = T::from_acc(slot.to_acc().add(value.to_acc()));
        }
    }
    Ok(())
}

/// Writes the one-hot rows of `ids` into `out` (`ids.len() × classes`,
/// row-major): 1 at column `ids[i]` of row `i`, 0 elsewhere. Errors on an id
/// outside `0..classes` before writing.
pub fn one_hot(ids: &[i64], classes: usize, out: &mut [i64]) -> Result<(), IndexError> {
    check_indices(ids, classes)?;
    if out.len() != ids.len() * classes {
        return Err(shape_error(format!(
            "{} ids of {classes} classes need {} outputs, got {}",
            ids.len(),
            ids.len() * classes,
            out.len()
        )));
    }
    out.fill(0);
    if classes == 0 {
        return Ok(());
    }
    for (row, &id) in out.chunks_exact_mut(classes).zip(ids) {
        row[id as usize] = 1;
    }
    Ok(())
}

/// Copies the elements of `src` visited by `src_runs` into the places of
/// `dst` visited by `dst_runs`, in order: two walks over the same number of
/// elements cut into contiguous runs of possibly different lengths (a strided
/// source into a block of a concatenation, say). Errors when a run is out of
/// bounds or the walks have different lengths.
pub fn copy_runs<T: Copy>(
    src: &[T],
    src_runs: impl Iterator<Item = Range<usize>>,
    dst: &mut [T],
    dst_runs: impl Iterator<Item = Range<usize>>,
) -> Result<(), IndexError> {
    let out_of_bounds = |what: &str, run: &Range<usize>, len: usize| {
        shape_error(format!("{what} run {}..{} is out of bounds for {len} elements", run.start, run.end))
    };
    let mut src_runs = src_runs.filter(|r| !r.is_empty());
    let mut current = src_runs.next();
    for run in dst_runs {
        let dst_len = dst.len();
        let mut out = dst.get_mut(run.clone()).ok_or_else(|| out_of_bounds("dst", &run, dst_len))?;
        while !out.is_empty() {
            let Some(from) = current.take() else {
                return Err(shape_error("the source has fewer elements than the destination".into()));
            };
            let input = src.get(from.clone()).ok_or_else(|| out_of_bounds("src", &from, src.len()))?;
            let n = input.len().min(out.len());
            let (head, tail) = out.split_at_mut(n);
            head.copy_from_slice(&input[..n]);
            out = tail;
            current = if n < from.len() { Some(from.start + n..from.end) } else { src_runs.next() };
        }
    }
    if current.is_some() {
        return Err(shape_error("the source has more elements than the destination".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;
    use proptest::prelude::*;

    #[test]
    fn index_select_picks_rows_and_names_bad_indices() {
        // src [2, 3, 2]
        let src: Vec<i32> = (0..12).collect();
        let mut dst = vec![0; 2 * 2 * 2];
        index_select(&src, 3, 2, &[2, 0], &mut dst).unwrap();
        assert_eq!(dst, [4, 5, 0, 1, 10, 11, 6, 7]);
        let error = index_select(&src, 3, 2, &[1, 3], &mut dst).unwrap_err();
        assert_eq!(error, IndexError::OutOfRange { position: 1, index: 3, size: 3 });
        assert!(index_select(&src, 3, 2, &[-1, 0], &mut dst).is_err());
        assert!(matches!(index_select(&src, 3, 2, &[0], &mut dst), Err(IndexError::Shape { .. })));
        let mut empty: [i32; 0] = [];
        index_select(&src, 3, 2, &[], &mut empty).unwrap();
    }

    proptest! {
        /// Whole rows at a time give the element-wise scatter-add's bits,
        /// repeated ids included (half precision rounds per addition, so
        /// the order of additions shows).
        #[test]
        fn scatter_add_rows_is_the_elementwise_scatter_add(
            size in 1usize..6,
            inner in 0usize..9,
            picks in proptest::collection::vec((0usize..64, -50i32..50), 0..24),
        ) {
            let ids: Vec<i64> = picks.iter().map(|&(p, _)| (p % size) as i64).collect();
            let src: Vec<f16> = (0..ids.len() * inner)
                .map(|i| f16::from_f32(picks[i / inner.max(1)].1 as f32 * 0.37 + i as f32 * 0.011))
                .collect();
            let start: Vec<f16> = (0..size * inner).map(|i| f16::from_f32(i as f32 * 0.5 - 3.0)).collect();
            let mut rows = start.clone();
            scatter_add_rows(&mut rows, size, inner, &ids, &src).unwrap();
            let mut elements = start;
            let spread: Vec<i64> = ids.iter().flat_map(|&id| std::iter::repeat_n(id, inner)).collect();
            let bases = (0..ids.len()).flat_map(|_| 0..inner);
            scatter_add(&mut elements, bases, &spread, size, inner, src.iter().copied()).unwrap();
            prop_assert_eq!(rows.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                elements.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        }
    }

    #[test]
    fn scatter_add_rows_checks_ids_and_sizes_before_writing() {
        let mut dst = [0f32; 6];
        let error = scatter_add_rows(&mut dst, 3, 2, &[0, 3], &[1.0; 4]).unwrap_err();
        assert_eq!(error, IndexError::OutOfRange { position: 1, index: 3, size: 3 });
        assert_eq!(dst, [0.0; 6], "nothing written");
        assert!(matches!(scatter_add_rows(&mut dst, 3, 2, &[0], &[1.0; 4]), Err(IndexError::Shape { .. })));
        scatter_add_rows(&mut dst, 3, 2, &[2, 0, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        assert_eq!(dst, [3.0, 4.0, 0.0, 0.0, 6.0, 8.0]);
    }

    #[test]
    fn gather_and_scatter_add_follow_offsets() {
        // A 2x3 matrix, gather along dim 1 (stride 1), bases are row starts.
        let src = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut dst = [0f32; 4];
        gather(&src, [0, 0, 3, 3].into_iter(), &[2, 0, 1, 1], 3, 1, &mut dst).unwrap();
        assert_eq!(dst, [3.0, 1.0, 5.0, 5.0]);
        assert!(gather(&src, [0, 0, 3, 3].into_iter(), &[2, 0, 1, 3], 3, 1, &mut dst).is_err());
        assert!(gather(&src, [0, 0, 3].into_iter(), &[2, 0, 1, 1], 3, 1, &mut dst).is_err());
        let mut acc = [f16::ZERO; 3];
        scatter_add(
            &mut acc,
            [0; 4].into_iter(),
            &[1, 1, 2, 0],
            3,
            1,
            [1.5, 2.0, 4.0, 8.0].map(f16::from_f32).into_iter(),
        )
        .unwrap();
        assert_eq!(acc.map(f16::to_f32), [8.0, 3.5, 4.0]);
        let mut counts = [250u8; 2];
        scatter_add(&mut counts, [0; 2].into_iter(), &[0, 0], 2, 1, [3u8, 4].into_iter()).unwrap();
        assert_eq!(counts, [1, 250]);
        assert!(scatter_add(&mut counts, [0; 2].into_iter(), &[0, 2], 2, 1, [1u8, 1].into_iter()).is_err());
        assert_eq!(counts, [1, 250], "nothing is written when an index is bad");
    }

    #[test]
    fn one_hot_rows() {
        let mut out = [9i64; 6];
        one_hot(&[2, 0], 3, &mut out).unwrap();
        assert_eq!(out, [0, 0, 1, 1, 0, 0]);
        assert_eq!(one_hot(&[3], 3, &mut out[..3]), Err(IndexError::OutOfRange { position: 0, index: 3, size: 3 }));
    }

    #[test]
    fn copy_runs_checks_lengths() {
        let src = [1, 2, 3, 4];
        let mut dst = [0; 4];
        copy_runs(&src, [0..1, 1..4].into_iter(), &mut dst, [2..4, 0..2].into_iter()).unwrap();
        assert_eq!(dst, [3, 4, 1, 2]);
        assert!(copy_runs(&src, std::iter::once(0..3), &mut dst, std::iter::once(0..4)).is_err());
        assert!(copy_runs(&src, std::iter::once(0..4), &mut dst, std::iter::once(0..3)).is_err());
        assert!(copy_runs(&src, std::iter::once(0..5), &mut dst, std::iter::once(0..4)).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn copy_runs_matches_elementwise_copy(
            len in 0usize..200,
            src_cut in prop::collection::vec(1usize..17, 1..8),
            dst_cut in prop::collection::vec(1usize..17, 1..8),
        ) {
            let cut = |sizes: &[usize]| {
                let mut runs = Vec::new();
                let (mut at, mut i) = (0, 0);
                while at < len {
                    let n = sizes[i % sizes.len()].min(len - at);
                    runs.push(at..at + n);
                    at += n;
                    i += 1;
                }
                runs
            };
            let src: Vec<u32> = (0..len as u32).collect();
            let mut dst = vec![0u32; len];
            copy_runs(&src, cut(&src_cut).into_iter(), &mut dst, cut(&dst_cut).into_iter()).unwrap();
            prop_assert_eq!(dst, src);
        }

        #[test]
        fn index_select_matches_naive(
            outer in 0usize..4,
            size in 1usize..6,
            inner in 1usize..5,
            indices in prop::collection::vec(0i64..6, 0..8),
        ) {
            let src: Vec<u32> = (0..(outer * size * inner) as u32).collect();
            let mut dst = vec![0u32; outer * indices.len() * inner];
            let result = index_select(&src, size, inner, &indices, &mut dst);
            match indices.iter().position(|&i| i as usize >= size) {
                Some(position) => prop_assert_eq!(
                    result,
                    Err(IndexError::OutOfRange { position, index: indices[position], size })
                ),
                None => {
                    prop_assert!(result.is_ok());
                    for o in 0..outer {
                        for (j, &i) in indices.iter().enumerate() {
                            for k in 0..inner {
                                prop_assert_eq!(
                                    dst[(o * indices.len() + j) * inner + k],
                                    src[(o * size + i as usize) * inner + k]
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
