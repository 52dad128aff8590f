//! [`SplitReport`]: what one step of [`AutoMicroBatch`](super::AutoMicroBatch) did.

use brasa_alloc::{format_size, OutOfMemory};
use std::fmt;

/// One attempt that ran out of memory and was retried with twice as many
/// micro-batches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitRetry {
    /// The micro-batches the failed attempt had.
    pub micro_batches: usize,
    /// The micro-batch (from 0) during which the ranks learned of it.
    pub micro_batch: usize,
    /// This rank's out-of-memory report, or `None` when another rank ran
    /// out of memory and this one retried with it.
    pub out_of_memory: Option<OutOfMemory>,
}

/// What one step did: the split it finished with and the attempts before.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SplitReport {
    /// Rows of the device batch.
    pub rows: usize,
    /// Micro-batches the step finished with.
    pub micro_batches: usize,
    /// Attempts that ran out of memory (here or on another rank), in order.
    pub retries: Vec<SplitRetry>,
    /// Whether the allocator had to free its cache and retry in enough
    /// consecutive steps that the next step splits further.
    pub split_for_thrashing: bool,
}

impl SplitReport {
    /// Rows of the largest micro-batch.
    pub fn micro_batch_rows(&self) -> usize {
        self.rows.div_ceil(self.micro_batches.max(1))
    }

    /// Whether anything happened: a retry or a split for thrashing.
    pub fn changed_split(&self) -> bool {
        !self.retries.is_empty() || self.split_for_thrashing
    }
}

impl fmt::Display for SplitReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for retry in &self.retries {
            match &retry.out_of_memory {
                Some(oom) => write!(
                    f,
                    "out of memory on {} ({} requested) in micro-batch {} of {}; ",
                    oom.device,
                    format_size(oom.requested_bytes),
                    retry.micro_batch,
                    retry.micro_batches
                )?,
                None => write!(
                    f,
                    "another rank ran out of memory in micro-batch {} of {}; ",
                    retry.micro_batch, retry.micro_batches
                )?,
            }
        }
        write!(
            f,
            "{} rows in {} micro-batch{} of up to {}",
            self.rows,
            self.micro_batches,
            if self.micro_batches == 1 { "" } else { "es" },
            self.micro_batch_rows()
        )?;
        if self.split_for_thrashing {
            write!(f, "; the allocator kept retrying, the next step splits in {}", self.micro_batches * 2)?;
        }
        Ok(())
    }
}
