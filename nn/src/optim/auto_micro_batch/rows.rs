//! How a device batch of `n` rows is cut into `k` micro-batches.

use std::ops::Range;

/// The rows of micro-batch `index` of `count` over a batch of `rows`: as
/// even as possible, the first `rows % count` micro-batches one row longer.
/// Micro-batches past the rows (more micro-batches than rows) are empty.
pub(crate) fn micro_batch_rows(rows: usize, count: usize, index: usize) -> Range<usize> {
    let (base, extra) = (rows / count, rows % count);
    let start = index * base + index.min(extra);
    let len = base + usize::from(index < extra);
    start..start + len
}

#[cfg(test)]
mod tests {
    use super::micro_batch_rows;
    use proptest::prelude::*;

    #[test]
    fn halves_are_even_and_remainders_go_first() {
        assert_eq!(micro_batch_rows(8, 2, 0), 0..4);
        assert_eq!(micro_batch_rows(8, 2, 1), 4..8);
        assert_eq!(micro_batch_rows(7, 4, 0), 0..2);
        assert_eq!(micro_batch_rows(7, 4, 2), 4..6);
        assert_eq!(micro_batch_rows(7, 4, 3), 6..7);
        assert_eq!(micro_batch_rows(2, 4, 3), 2..2);
    }

    proptest! {
        #[test]
        fn micro_batches_tile_the_batch(rows in 0usize..300, count in 1usize..40) {
            let mut next = 0;
            for index in 0..count {
                let range = micro_batch_rows(rows, count, index);
                prop_assert_eq!(range.start, next);
                prop_assert!(range.len() <= rows.div_ceil(count));
                prop_assert!(range.len() + 1 >= rows / count);
                next = range.end;
            }
            prop_assert_eq!(next, rows);
        }
    }
}
