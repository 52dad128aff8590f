//! Splitting a batch into micro-batches along dim 0, the way
//! `torch.distributed.pipelining` does it (`torch.tensor_split`): `m`
//! micro-batches whose sizes differ by at most one, the first `N mod m`
//! one row larger. More micro-batches than rows, or none, is an error;
//! every micro-batch has at least one row.
//!
//! ```
//! use brasa_parallel::pipeline::micro_batch_sizes;
//!
//! assert_eq!(micro_batch_sizes(10, 4)?, [3, 3, 2, 2]);
//! assert!(micro_batch_sizes(3, 4).is_err());
//! # Ok::<(), brasa_parallel::ParallelError>(())
//! ```

use crate::error::{ParallelError, Result};
use brasa_tensor::Tensor;

/// The rows of each of `micro_batches` micro-batches of a batch of `batch`
/// rows (see the module docs).
pub fn micro_batch_sizes(batch: usize, micro_batches: usize) -> Result<Vec<usize>> {
    const OP: &str = "Pipeline::step";
    if micro_batches == 0 {
        return Err(ParallelError::invalid(OP, "the number of micro-batches must be at least 1, got 0"));
    }
    if micro_batches > batch {
        return Err(ParallelError::invalid(
            OP,
            format!(
                "a batch of {batch} rows cannot be split into {micro_batches} micro-batches (each needs at least \
                 one row); use at most {batch} micro-batches or a larger batch"
            ),
        ));
    }
    let (base, extra) = (batch / micro_batches, batch % micro_batches);
    Ok((0..micro_batches).map(|j| base + usize::from(j < extra)).collect())
}

/// `tensor` split along dim 0 into views of `sizes` rows each.
pub(crate) fn split_rows(tensor: &Tensor, sizes: &[usize], what: &str) -> Result<Vec<Tensor>> {
    let rows = tensor.dims().first().copied().unwrap_or(0);
    let total: usize = sizes.iter().sum();
    if tensor.rank() == 0 || rows != total {
        return Err(ParallelError::invalid(
            "Pipeline::step",
            format!("the {what} has shape {:?} but the batch has {total} rows (dim 0 is the batch)", tensor.dims()),
        ));
    }
    let mut start = 0;
    let mut parts = Vec::with_capacity(sizes.len());
    for &size in sizes {
        parts.push(tensor.narrow(0, start, size)?);
        start += size;
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_tensor_split() {
        assert_eq!(micro_batch_sizes(8, 4).unwrap(), [2, 2, 2, 2]);
        assert_eq!(micro_batch_sizes(10, 4).unwrap(), [3, 3, 2, 2]);
        assert_eq!(micro_batch_sizes(7, 7).unwrap(), [1; 7]);
        for batch in 1..40 {
            for m in 1..=batch {
                let sizes = micro_batch_sizes(batch, m).unwrap();
                assert_eq!(sizes.iter().sum::<usize>(), batch);
                assert!(sizes.iter().all(|&s| s >= 1));
                assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
            }
        }
    }

    #[test]
    fn bad_counts_are_errors_that_say_why() {
        let zero = micro_batch_sizes(8, 0).unwrap_err();
        let ParallelError::Invalid { op: "Pipeline::step", message } = &zero else { panic!("{zero:?}") };
        // The message says what is allowed.
        assert!(message.contains("at least 1"), "{message}");
        let many = micro_batch_sizes(3, 4).unwrap_err();
        let ParallelError::Invalid { op: "Pipeline::step", message } = &many else { panic!("{many:?}") };
        // The message names the values seen and what would do.
        assert!(message.contains("3 rows") && message.contains("4 micro-batches"), "{message}");
        assert!(message.contains("use at most 3 micro-batches"), "{message}");
    }
}
