//! Errors of the caching allocator, and the out-of-memory report.

use crate::backend::{BackendError, StreamId};
use crate::config::ConfigError;
use std::fmt;

/// Everything the caching allocator can fail with.
///
/// An out-of-memory error's [`std::error::Error::source`] is its
/// [`OutOfMemory`] report, so the `source()` chain of any error that wraps
/// this one (tensor, autograd, nn, amp and parallel errors, boxed or behind an
/// `Arc`) leads to the report: [`find_out_of_memory`] walks it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AllocError {
    /// The device has no room for the request, even after releasing the cache.
    OutOfMemory(Box<OutOfMemory>),
    /// The backend failed for another reason; its error is the
    /// [`std::error::Error::source`].
    Backend {
        /// The device's name.
        device: String,
        /// What the backend said.
        source: BackendError,
    },
    /// A bad configuration.
    Config(ConfigError),
}

impl From<ConfigError> for AllocError {
    fn from(error: ConfigError) -> AllocError {
        AllocError::Config(error)
    }
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::OutOfMemory(oom) => fmt::Display::fmt(oom, f),
            AllocError::Backend { device, source } => write!(f, "device error on {device}: {source}"),
            AllocError::Config(error) => fmt::Display::fmt(error, f),
        }
    }
}

impl std::error::Error for AllocError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // The report itself, so that a walk of the chain can downcast to it.
            AllocError::OutOfMemory(oom) => Some(&**oom),
            AllocError::Backend { source, .. } => Some(source),
            // Transparent, as before.
            AllocError::Config(error) => std::error::Error::source(error),
        }
    }
}

impl AllocError {
    /// The out-of-memory report, if this is one.
    pub fn as_out_of_memory(&self) -> Option<&OutOfMemory> {
        match self {
            AllocError::OutOfMemory(oom) => Some(oom),
            _ => None,
        }
    }
}

/// The out-of-memory report anywhere in `error`'s [`source`] chain (`error`
/// included): the one way to ask an error of any type — a brasa error, one
/// boxed in `Box<dyn Error>`, one inside another crate's error that keeps it
/// as its source — "is this an out of memory, on which device, for how many
/// bytes". The typed errors' `as_out_of_memory` methods
/// ([`AllocError::as_out_of_memory`], `TensorError::as_out_of_memory`, ...)
/// answer the same question.
///
/// ```
/// # use brasa_alloc::{find_out_of_memory, AllocError, BackendError};
/// let error = AllocError::Backend { device: "cpu:0".into(), source: BackendError::Device("gone".into()) };
/// assert!(find_out_of_memory(&error).is_none());
/// ```
///
/// [`source`]: std::error::Error::source
pub fn find_out_of_memory<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a OutOfMemory> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(oom) = error.downcast_ref::<OutOfMemory>() {
            return Some(oom);
        }
        if let Some(oom) = error.downcast_ref::<AllocError>().and_then(AllocError::as_out_of_memory) {
            return Some(oom);
        }
        next = error.source();
    }
    None
}

/// What a person needs to understand an out-of-memory error and act on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfMemory {
    /// The device's name.
    pub device: String,
    /// The stream the request was made on.
    pub stream: StreamId,
    /// Bytes the caller asked for.
    pub requested_bytes: usize,
    /// The request rounded to the allocator's size classes.
    pub rounded_bytes: usize,
    /// The segment the allocator tried to obtain from the device.
    pub segment_bytes: usize,
    /// The device's capacity.
    pub capacity_bytes: usize,
    /// Bytes the device reported free.
    pub device_free_bytes: usize,
    /// The limit set by a memory fraction, if one is set.
    pub allowed_bytes: Option<usize>,
    /// Bytes held by live allocations.
    pub allocated_bytes: usize,
    /// Bytes reserved from the device by this allocator.
    pub reserved_bytes: usize,
    /// The largest free block in the cache.
    pub largest_free_block: usize,
    /// Free bytes in split segments, which `empty_cache` cannot release.
    pub inactive_split_bytes: usize,
}

impl OutOfMemory {
    /// Reserved bytes that no allocation uses.
    pub fn reserved_unallocated_bytes(&self) -> usize {
        self.reserved_bytes.saturating_sub(self.allocated_bytes)
    }

    /// Whether free cache memory would have covered the request had it been in one piece.
    pub fn is_fragmentation(&self) -> bool {
        self.reserved_unallocated_bytes() >= self.rounded_bytes && self.largest_free_block < self.rounded_bytes
    }

    fn hint(&self) -> String {
        if self.is_fragmentation() {
            let mb = (self.rounded_bytes >> 20).clamp(20, usize::MAX);
            format!(
                "fragmentation: {} is cached but no free block is large enough — try \
                 BRASA_ALLOC_CONF=expandable_segments:True (segments grow in place and free pages go \
                 back), or max_split_size_mb:{mb} so large blocks are not split, free cached memory \
                 between phases with empty_cache(), a smaller batch, or checkpointing",
                format_size(self.reserved_unallocated_bytes())
            )
        } else if let Some(allowed) =
            self.allowed_bytes.filter(|a| self.reserved_bytes.saturating_add(self.segment_bytes) > *a)
        {
            format!(
                "the memory fraction allows {} — raise per_process_memory_fraction, or try a smaller \
                 batch, checkpointing or mixed precision",
                format_size(allowed)
            )
        } else {
            "try a smaller batch, gradient checkpointing, mixed precision, or dropping tensors you no \
             longer need (a running loss summed as a tensor keeps every graph alive: use item())"
                .to_string()
        }
    }
}

/// The report is an error of its own: the [`std::error::Error::source`] of
/// [`AllocError::OutOfMemory`].
impl std::error::Error for OutOfMemory {}

impl fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "out of memory on {}: tried to allocate {} (rounded {}, segment {}); capacity {}, {} free",
            self.device,
            format_size(self.requested_bytes),
            format_size(self.rounded_bytes),
            format_size(self.segment_bytes),
            format_size(self.capacity_bytes),
            format_size(self.device_free_bytes),
        )?;
        if let Some(allowed) = self.allowed_bytes {
            write!(f, ", {} allowed by the memory fraction", format_size(allowed))?;
        }
        write!(
            f,
            "; {} allocated, {} reserved but unallocated (largest free block {}, {} in split segments) — {}",
            format_size(self.allocated_bytes),
            format_size(self.reserved_unallocated_bytes()),
            format_size(self.largest_free_block),
            format_size(self.inactive_split_bytes),
            self.hint()
        )
    }
}

/// Formats a byte count like PyTorch: `N bytes` up to 1 KiB, then KiB, MiB,
/// GiB with two decimals.
pub fn format_size(bytes: usize) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    if bytes <= 1024 {
        format!("{bytes} bytes")
    } else if b <= KIB * KIB {
        format!("{:.2} KiB", b / KIB)
    } else if b <= KIB * KIB * KIB {
        format!("{:.2} MiB", b / (KIB * KIB))
    } else {
        format!("{:.2} GiB", b / (KIB * KIB * KIB))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_format_like_pytorch() {
        assert_eq!(format_size(512), "512 bytes");
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(1536), "1.50 KiB");
        assert_eq!(format_size(96 << 20), "96.00 MiB");
        assert_eq!(format_size(2 << 30), "2.00 GiB");
    }

    fn report() -> OutOfMemory {
        OutOfMemory {
            device: "cpu:1".into(),
            stream: StreamId::DEFAULT,
            requested_bytes: 96 << 20,
            rounded_bytes: 96 << 20,
            segment_bytes: 96 << 20,
            capacity_bytes: 2 << 30,
            device_free_bytes: 40 << 20,
            allowed_bytes: None,
            allocated_bytes: 1700 << 20,
            reserved_bytes: 1900 << 20,
            largest_free_block: 18 << 20,
            inactive_split_bytes: 200 << 20,
        }
    }

    #[test]
    fn fragmentation_gets_the_split_size_hint() {
        let text = report().to_string();
        assert!(text.starts_with("out of memory on cpu:1: tried to allocate 96.00 MiB"), "{text}");
        assert!(text.contains("200.00 MiB reserved but unallocated"), "{text}");
        assert!(text.contains("largest free block 18.00 MiB"), "{text}");
        assert!(text.contains("max_split_size_mb:96"), "{text}");
        assert!(text.contains("expandable_segments:True"), "{text}");
    }

    #[test]
    fn the_source_chain_leads_to_the_report() {
        use std::error::Error;
        let error = AllocError::OutOfMemory(Box::new(report()));
        let source = error.source().expect("the report is the source");
        assert_eq!(source.downcast_ref::<OutOfMemory>(), Some(&report()));
        assert_eq!(error.to_string(), report().to_string());
        // Boxed and wrapped in another error's chain, it is still found.
        let boxed: Box<dyn Error + Send + Sync> = Box::new(error.clone());
        assert_eq!(find_out_of_memory(&*boxed), Some(&report()));
        assert_eq!(find_out_of_memory(source), Some(&report()));
        let other = AllocError::Backend { device: "cpu:0".into(), source: BackendError::Device("lost".into()) };
        assert!(find_out_of_memory(&other).is_none());
        let backend = other.source().and_then(|e| e.downcast_ref::<BackendError>());
        assert_eq!(backend, Some(&BackendError::Device("lost".into())));
    }

    #[test]
    fn a_full_device_gets_the_batch_hint() {
        let mut oom = report();
        oom.reserved_bytes = oom.allocated_bytes;
        let text = oom.to_string();
        assert!(!text.contains("fragmentation"), "{text}");
        assert!(text.contains("smaller batch"), "{text}");
    }
}
