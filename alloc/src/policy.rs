//! Size classes and the split rule: the functions that round requests, size
//! segments and decide splits from PyTorch's `CUDACachingAllocator` constants
//! (in `sizes.rs`, re-exported here) and the allocator's configuration.

use crate::config::AllocatorConfig;

pub use crate::sizes::{
    LARGE_BUFFER, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE, MIN_LARGE_ALLOC, ROUND_LARGE, SMALL_BUFFER, SMALL_SIZE,
};

/// The page size of an expandable segment: what it maps at a time (PyTorch:
/// `kSmallBuffer` for the small pool, `kLargeBuffer` for the large one),
/// rounded up to a multiple of the backend's mapping granularity.
#[inline]
pub fn expandable_page_size(pool: PoolKind, granularity: usize) -> usize {
    let page = match pool {
        PoolKind::Small => SMALL_BUFFER,
        PoolKind::Large => LARGE_BUFFER,
    };
    let granularity = granularity.max(1);
    page.div_ceil(granularity) * granularity
}

/// Which free list a block belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolKind {
    /// Blocks of at most [`SMALL_SIZE`], carved from 2 MiB segments.
    Small,
    /// Everything larger.
    Large,
}

impl PoolKind {
    /// The pool a rounded request is served from.
    #[inline]
    pub fn for_size(rounded: usize) -> PoolKind {
        if rounded <= SMALL_SIZE {
            PoolKind::Small
        } else {
            PoolKind::Large
        }
    }
}

/// The size a request occupies in the cache (PyTorch's `round_size`), or
/// `None` when the rounded size would exceed [`MAX_BLOCK_SIZE`] — a request
/// no device can serve (rounding it in plain arithmetic would wrap to a
/// small block).
///
/// Below 512 B everything is 512 B. With `roundup_power2_divisions` set for the
/// request's size interval, the size is rounded up to the next of that many equal
/// steps between the surrounding powers of two; otherwise to a multiple of 512.
#[inline]
pub fn round_size(size: usize, config: &AllocatorConfig) -> Option<usize> {
    if size < MIN_BLOCK_SIZE {
        return Some(MIN_BLOCK_SIZE);
    }
    if size > MAX_BLOCK_SIZE {
        return None;
    }
    // From here on size < 2^48, so no step below can overflow.
    let divisions = config.roundup_power2_divisions_for(size);
    let rounded = if divisions > 1 && size > MIN_BLOCK_SIZE.saturating_mul(divisions) {
        roundup_power2_next_division(size, divisions)
    } else {
        size.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
    };
    (rounded <= MAX_BLOCK_SIZE).then_some(rounded)
}

/// Rounds `size` up to the next of `divisions` equal steps between the power of
/// two below it and the one above (powers of two are returned unchanged).
/// `size` is at most [`MAX_BLOCK_SIZE`], so the result is at most 2^48.
fn roundup_power2_next_division(size: usize, divisions: usize) -> usize {
    if size.is_power_of_two() {
        return size;
    }
    let power2_floor = 1usize << (usize::BITS - 1 - size.leading_zeros());
    let step = power2_floor >> divisions.trailing_zeros();
    if step == 0 {
        return power2_floor << 1;
    }
    let floor = size & !(step - 1);
    if floor == size {
        size
    } else {
        floor + step
    }
}

/// The size of the segment requested from the backend for a rounded request
/// that the cache could not serve (PyTorch's `get_allocation_size`).
/// `rounded` comes from [`round_size`] (at most [`MAX_BLOCK_SIZE`]), so
/// rounding it up to 2 MiB cannot overflow.
#[inline]
pub fn segment_size(rounded: usize) -> usize {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

/// Whether a free block of `block_size` serving a request of `rounded` bytes is
/// split, the remainder going back to the pool.
///
/// Small pool: split when at least 512 B remain. Large pool: split when the
/// request is below `max_split_size` and more than 1 MiB remains — so a large
/// allocation may hold up to 1 MiB more than it asked for.
#[inline]
pub fn should_split(pool: PoolKind, block_size: usize, rounded: usize, max_split_size: usize) -> bool {
    let remaining = block_size - rounded;
    match pool {
        PoolKind::Small => remaining >= MIN_BLOCK_SIZE,
        PoolKind::Large => rounded < max_split_size && remaining > SMALL_SIZE,
    }
}

/// Whether a free block may serve a request at all under the oversize rules.
///
/// Blocks of at least `max_split_size` are never split, so they are kept for
/// requests that are themselves oversize, and even then only when the waste is
/// below `max_non_split_rounding` (PyTorch: `kLargeBuffer`, 20 MiB).
#[inline]
pub fn oversize_rule_allows(block_size: usize, rounded: usize, config: &AllocatorConfig) -> bool {
    let max_split = config.max_split_size;
    if rounded < max_split && block_size >= max_split {
        return false;
    }
    if rounded >= max_split && block_size >= rounded.saturating_add(config.max_non_split_rounding) {
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    fn config() -> AllocatorConfig {
        AllocatorConfig::default()
    }

    #[test]
    fn tiny_requests_take_one_min_block() {
        assert_eq!(round_size(0, &config()).unwrap(), 512);
        assert_eq!(round_size(1, &config()), Some(512));
        assert_eq!(round_size(512, &config()), Some(512));
    }

    #[test]
    fn sizes_beyond_the_largest_block_do_not_round() {
        let divided = AllocatorConfig::builder().roundup_power2_divisions(4).build().unwrap();
        assert_eq!(round_size(MAX_BLOCK_SIZE, &config()), Some(MAX_BLOCK_SIZE));
        // With power-of-two divisions it would round up to 2^48.
        assert_eq!(round_size(MAX_BLOCK_SIZE, &divided), None);
        for config in [config(), divided] {
            assert_eq!(round_size(MAX_BLOCK_SIZE + 1, &config), None);
            assert_eq!(round_size(1 << 48, &config), None);
            assert_eq!(round_size(isize::MAX as usize, &config), None);
            assert_eq!(round_size(usize::MAX - 511, &config), None, "would wrap to 0");
            assert_eq!(round_size(usize::MAX, &config), None);
        }
        assert_eq!(round_size(MAX_BLOCK_SIZE - 1500, &config()), Some(MAX_BLOCK_SIZE - 1024));
        assert_eq!(segment_size(MAX_BLOCK_SIZE - 1024), MAX_BLOCK_SIZE);
        assert_eq!(segment_size(MAX_BLOCK_SIZE), MAX_BLOCK_SIZE);
    }

    #[test]
    fn requests_round_to_512_bytes() {
        assert_eq!(round_size(513, &config()), Some(1024));
        assert_eq!(round_size(1025, &config()), Some(1536));
        assert_eq!(round_size(3 * MIB + 1, &config()), Some(3 * MIB + 512));
    }

    #[test]
    fn pool_boundary_is_one_mib() {
        assert_eq!(PoolKind::for_size(MIB), PoolKind::Small);
        assert_eq!(PoolKind::for_size(MIB + 512), PoolKind::Large);
    }

    #[test]
    fn segment_sizes_follow_the_three_classes() {
        assert_eq!(segment_size(512), 2 * MIB);
        assert_eq!(segment_size(MIB), 2 * MIB);
        assert_eq!(segment_size(MIB + 512), 20 * MIB);
        assert_eq!(segment_size(3 * MIB), 20 * MIB);
        assert_eq!(segment_size(10 * MIB - 512), 20 * MIB);
        assert_eq!(segment_size(10 * MIB), 10 * MIB);
        assert_eq!(segment_size(11 * MIB + 512), 12 * MIB);
        assert_eq!(segment_size(64 * MIB), 64 * MIB);
    }

    #[test]
    fn expandable_pages_follow_the_pools_and_the_granularity() {
        assert_eq!(expandable_page_size(PoolKind::Small, 4096), 2 * MIB);
        assert_eq!(expandable_page_size(PoolKind::Large, 4096), 20 * MIB);
        assert_eq!(expandable_page_size(PoolKind::Large, 8 * MIB), 24 * MIB);
    }

    #[test]
    fn small_pool_splits_when_512_bytes_remain() {
        assert!(should_split(PoolKind::Small, 2 * MIB, 2 * MIB - 512, usize::MAX));
        assert!(!should_split(PoolKind::Small, 1024, 1024, usize::MAX));
    }

    #[test]
    fn large_pool_keeps_remainders_of_at_most_one_mib() {
        assert!(!should_split(PoolKind::Large, 4 * MIB, 3 * MIB, usize::MAX));
        assert!(should_split(PoolKind::Large, 4 * MIB + 512, 3 * MIB, usize::MAX));
        assert!(should_split(PoolKind::Large, 20 * MIB, 3 * MIB, usize::MAX));
    }

    #[test]
    fn oversize_blocks_are_not_split() {
        assert!(!should_split(PoolKind::Large, 100 * MIB, 60 * MIB, 40 * MIB));
        assert!(should_split(PoolKind::Large, 100 * MIB, 30 * MIB, 40 * MIB));
    }

    #[test]
    fn oversize_blocks_serve_only_close_oversize_requests() {
        let config = AllocatorConfig { max_split_size: 40 * MIB, ..AllocatorConfig::default() };
        // A normal request never takes an oversize block.
        assert!(!oversize_rule_allows(50 * MIB, 30 * MIB, &config));
        // An oversize request takes a block wasting less than 20 MiB...
        assert!(oversize_rule_allows(60 * MIB, 50 * MIB, &config));
        // ...but not one wasting 20 MiB or more.
        assert!(!oversize_rule_allows(70 * MIB, 50 * MIB, &config));
        // Without max_split_size every block is allowed.
        assert!(oversize_rule_allows(500 * MIB, 30 * MIB, &AllocatorConfig::default()));
    }

    #[test]
    fn power2_divisions_round_between_powers_of_two() {
        let config = AllocatorConfig::builder().roundup_power2_divisions(4).build().unwrap();
        // 1200 KiB lies between 1 MiB and 2 MiB: steps of 256 KiB.
        assert_eq!(round_size(1200 << 10, &config), Some(1280 << 10));
        // Powers of two are unchanged.
        assert_eq!(round_size(4 * MIB, &config), Some(4 * MIB));
        // Below 512 * divisions the 512 B rule applies.
        assert_eq!(round_size(1500, &config), Some(1536));
        // 5 MiB + 1 lies between 4 and 8 MiB: steps of 1 MiB.
        assert_eq!(round_size(5 * MIB + 1, &config), Some(6 * MIB));
    }

    #[test]
    fn power2_divisions_per_interval() {
        let config = AllocatorConfig::from_conf_str("roundup_power2_divisions:[2:1,4:2,>:8]").unwrap();
        // Below 2 MiB: one division, so the 512 B rule.
        assert_eq!(round_size(MIB + 1000, &config), Some(MIB + 1024));
        // [2 MiB, 4 MiB): two divisions of 1 MiB.
        assert_eq!(round_size(2 * MIB + 1, &config), Some(3 * MIB));
        // 64 MiB and up: eight divisions.
        assert_eq!(round_size(65 * MIB, &config), Some(72 * MIB));
    }
}
