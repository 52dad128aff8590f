//! The iteration space of an elementwise kernel ([`Strided`], the ABI's
//! by-value struct): the common shape with its dims coalesced, and each
//! operand's strides (operand 0 is the output).
//!
//! Coalescing is the host `Plan`'s rule: size-1 dims are dropped, and a dim
//! merges into the next outer one wherever every operand steps over it
//! exactly, so contiguous operands become rank 1 (the kernels' fast path), a
//! broadcast scalar a stride-0 dim, and `[N, C] + [C]` rank 2.

use crate::error::{Result, TensorError};
use brasa_kernels::cuda_ptx::{Strided, MAX_DIMS};

/// The most operands one kernel walks (the output and three inputs).
const MAX_OPERANDS: usize = 4;

/// `Strided` for `dims` walked by operands with `strides` (output first, each
/// as long as `dims`), or an error naming `op` when more than
/// [`MAX_DIMS`] dims stay apart after coalescing.
pub(super) fn coalesce(op: &'static str, dims: &[usize], strides: &[&[isize]]) -> Result<Strided> {
    debug_assert!(strides.len() <= MAX_OPERANDS && strides.iter().all(|s| s.len() == dims.len()));
    let numel: usize = dims.iter().product();
    // (size, stride per operand), outermost first.
    let mut kept: Vec<(usize, [isize; MAX_OPERANDS])> = Vec::with_capacity(dims.len());
    for (d, &size) in dims.iter().enumerate() {
        if size == 1 {
            continue;
        }
        let mut step = [0isize; MAX_OPERANDS];
        for (s, operand) in step.iter_mut().zip(strides) {
            *s = operand[d];
        }
        if let Some((outer_size, outer_step)) = kept.last_mut() {
            let mergeable = (0..strides.len()).all(|k| Some(outer_step[k]) == step[k].checked_mul(size as isize));
            if mergeable {
                *outer_size *= size;
                *outer_step = step;
                continue;
            }
        }
        kept.push((size, step));
    }
    if kept.len() > MAX_DIMS {
        return Err(TensorError::invalid(
            op,
            format!(
                "CUDA kernels walk at most {MAX_DIMS} dims that cannot be merged; this view of shape {dims:?} \
                 needs {}: make an operand contiguous first",
                kept.len()
            ),
        ));
    }
    let mut out =
        Strided { numel: numel as i64, rank: kept.len() as i32, dims: [0; MAX_DIMS], strides: [[0; MAX_DIMS]; 4] };
    for (d, (size, step)) in kept.iter().enumerate() {
        out.dims[d] = *size as i64;
        for (operand, s) in out.strides.iter_mut().zip(step) {
            operand[d] = *s as i64;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_operands_become_one_dim() {
        let s = coalesce("t", &[2, 3, 4], &[&[12, 4, 1], &[12, 4, 1]]).unwrap();
        assert_eq!((s.numel, s.rank), (24, 1));
        assert_eq!((s.dims[0], s.strides[0][0], s.strides[1][0]), (24, 1, 1));
    }

    #[test]
    fn broadcast_rows_and_size_one_dims() {
        // [N, 1, C] + [C] broadcast: out contiguous, bias stride 0 along N.
        let s = coalesce("t", &[5, 1, 3], &[&[3, 3, 1], &[0, 0, 1]]).unwrap();
        assert_eq!(s.rank, 2);
        assert_eq!(&s.dims[..2], &[5, 3]);
        assert_eq!(&s.strides[1][..2], &[0, 1]);
        // A 0-d operand: rank 0, one element.
        let s = coalesce("t", &[], &[&[], &[]]).unwrap();
        assert_eq!((s.numel, s.rank), (1, 0));
    }

    #[test]
    fn transposed_operands_stay_apart_and_too_many_dims_is_an_error() {
        let s = coalesce("t", &[3, 4], &[&[4, 1], &[1, 3]]).unwrap();
        assert_eq!(s.rank, 2);
        let dims = [2usize; 9];
        let out: Vec<isize> = (0..9).rev().map(|d| 1isize << d).collect();
        let input: Vec<isize> = (0..9).map(|d| 1isize << d).collect();
        let err = coalesce("add", &dims, &[&out, &input]).unwrap_err();
        assert!(matches!(err, TensorError::Invalid { op: "add", .. }), "{err:?}");
        assert!(err.to_string().starts_with("add: CUDA kernels walk at most 8 dims"), "{err}");
    }
}
