//! PyTorch's `CUDACachingAllocator` size constants: what a request is rounded
//! to, which pool serves it and how large a segment is made for it. Below both
//! the configuration (which validates `max_split_size_mb` against them) and
//! the policy functions that apply them.

/// Every request is rounded up to a multiple of 512 bytes (and at least 512).
pub const MIN_BLOCK_SIZE: usize = 512;
/// Requests of at most 1 MiB are served from the small pool.
pub const SMALL_SIZE: usize = 1 << 20;
/// A segment made for the small pool is 2 MiB.
pub const SMALL_BUFFER: usize = 2 << 20;
/// Large requests under 10 MiB share a 20 MiB segment.
pub const MIN_LARGE_ALLOC: usize = 10 << 20;
/// The segment for large requests under [`MIN_LARGE_ALLOC`].
pub const LARGE_BUFFER: usize = 20 << 20;
/// Segments for requests of 10 MiB and more are rounded up to 2 MiB.
pub const ROUND_LARGE: usize = 2 << 20;

/// The largest block or segment the allocator handles: 256 TiB less 2 MiB,
/// more than any device holds. The free lists key blocks by 48 bits of size
/// (`pool.rs`), and it is a multiple of [`ROUND_LARGE`] so that the segment
/// of a request of at most this size is too. Larger requests (up to
/// `usize::MAX`, where rounding in plain arithmetic would wrap to a small
/// block) fail as out of memory before anything is rounded.
pub const MAX_BLOCK_SIZE: usize = (1 << 48) - ROUND_LARGE;
