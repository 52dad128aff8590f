//! Allocator statistics, as `torch.cuda.memory_stats()` keeps them: each stat
//! has `{current, peak, allocated, freed}` for all blocks, the large pool and
//! the small pool; allocated bytes are also kept per [`MemoryCategory`]
//! ([`MemoryStats::by_category`]).

use crate::category::MemoryCategory;
use crate::policy::PoolKind;
use serde::{Serialize, Serializer};

/// One statistic: its current value, its peak, and the cumulative increases
/// (`allocated`) and decreases (`freed`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stat {
    /// The value now.
    pub current: i64,
    /// The highest value since creation or the last `reset_peak`.
    pub peak: i64,
    /// Sum of all increases since creation or the last `reset_accumulated`.
    pub allocated: u64,
    /// Sum of all decreases since creation or the last `reset_accumulated`.
    pub freed: u64,
}

impl Stat {
    #[inline]
    pub(crate) fn increase(&mut self, amount: u64) {
        self.current += amount as i64;
        self.allocated += amount;
        self.peak = self.peak.max(self.current);
    }

    #[inline]
    pub(crate) fn decrease(&mut self, amount: u64) {
        self.current -= amount as i64;
        self.freed += amount;
    }

    fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// A statistic split by pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StatArray {
    /// Both pools.
    pub all: Stat,
    /// Blocks larger than 1 MiB.
    pub large_pool: Stat,
    /// Blocks of at most 1 MiB.
    pub small_pool: Stat,
}

impl StatArray {
    #[inline]
    pub(crate) fn increase(&mut self, pool: PoolKind, amount: u64) {
        self.all.increase(amount);
        self.pool_mut(pool).increase(amount);
    }

    #[inline]
    pub(crate) fn decrease(&mut self, pool: PoolKind, amount: u64) {
        self.all.decrease(amount);
        self.pool_mut(pool).decrease(amount);
    }

    #[inline]
    fn pool_mut(&mut self, pool: PoolKind) -> &mut Stat {
        match pool {
            PoolKind::Large => &mut self.large_pool,
            PoolKind::Small => &mut self.small_pool,
        }
    }

    /// The stat for one pool.
    pub fn pool(&self, pool: PoolKind) -> &Stat {
        match pool {
            PoolKind::Large => &self.large_pool,
            PoolKind::Small => &self.small_pool,
        }
    }

    fn for_each(&mut self, f: impl Fn(&mut Stat)) {
        f(&mut self.all);
        f(&mut self.large_pool);
        f(&mut self.small_pool);
    }
}

/// Everything the allocator counts for one device (PyTorch's `memory_stats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MemoryStats {
    /// Allocation requests being served (blocks handed out).
    pub allocation: StatArray,
    /// Segments obtained from the backend.
    pub segment: StatArray,
    /// Allocated blocks plus freed blocks still waiting on stream events.
    pub active: StatArray,
    /// Free pieces of split segments: cached but not releasable.
    pub inactive_split: StatArray,
    /// Bytes of allocated blocks (rounded sizes).
    pub allocated_bytes: StatArray,
    /// Bytes of segments obtained from the backend.
    pub reserved_bytes: StatArray,
    /// Bytes of active blocks.
    pub active_bytes: StatArray,
    /// Bytes of inactive split blocks.
    pub inactive_split_bytes: StatArray,
    /// Bytes the callers asked for (compare with `allocated_bytes` for rounding overhead).
    pub requested_bytes: StatArray,
    /// Allocations of at least `max_split_size`.
    pub oversize_allocations: Stat,
    /// Segments of at least `max_split_size`.
    pub oversize_segments: Stat,
    /// Allocations that succeeded only after releasing the cache and retrying.
    pub num_alloc_retries: u64,
    /// Allocations that failed with out-of-memory.
    pub num_ooms: u64,
    /// Times every outstanding stream event was waited for (a slow path).
    pub num_sync_all_streams: u64,
    /// Segments obtained from the backend.
    pub num_device_alloc: u64,
    /// Segments returned to the backend.
    pub num_device_free: u64,
    /// The configured `max_split_size` in bytes (`usize::MAX` when off).
    pub max_split_size: usize,
    /// Blocks freed while the device could not be synchronised with the
    /// streams that used them (a failed event record, event wait and device
    /// wait): kept out of the cache for good, since work may still use them.
    /// PyTorch raises here; a `Drop` cannot, so the allocator counts them,
    /// traces them (`quarantine`) and shows them in snapshots.
    pub quarantined_blocks: u64,
    /// Bytes of the quarantined blocks (still part of `reserved_bytes`).
    pub quarantined_bytes: u64,
    /// `allocated_bytes` split by what the memory holds: the categories'
    /// `current` values add up to `allocated_bytes.all.current`, and a
    /// retag moves a block's bytes from one category to another (see
    /// [`MemoryCategory`]).
    pub by_category: CategoryStats,
}

impl MemoryStats {
    fn stat_arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    /// Sets every peak to its current value (`reset_peak_memory_stats`).
    pub fn reset_peak(&mut self) {
        for array in self.stat_arrays_mut() {
            array.for_each(Stat::reset_peak);
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
        self.by_category.for_each(Stat::reset_peak);
    }

    /// Zeroes the cumulative counts and counters (`reset_accumulated_memory_stats`).
    pub fn reset_accumulated(&mut self) {
        for array in self.stat_arrays_mut() {
            array.for_each(Stat::reset_accumulated);
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.by_category.for_each(Stat::reset_accumulated);
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    /// Allocated bytes of one category (`by_category.get(category)`).
    pub fn allocated_in(&self, category: MemoryCategory) -> &Stat {
        self.by_category.get(category)
    }

    /// Serializes as JSON (the field names above, nested by pool;
    /// `by_category` by category name).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// Allocated bytes per [`MemoryCategory`]: one [`Stat`] each (current,
/// peak, allocated, freed), counted in block sizes like
/// `allocated_bytes`. A retag ([`Allocation::set_category`](crate::Allocation::set_category))
/// counts as a free from the old category and an allocation in the new one.
/// Serializes as a map from category name to stat.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CategoryStats {
    stats: [Stat; MemoryCategory::COUNT],
}

impl CategoryStats {
    /// The stat of one category.
    #[inline]
    pub fn get(&self, category: MemoryCategory) -> &Stat {
        &self.stats[category.index()]
    }

    /// Every category with its stat, in [`MemoryCategory::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (MemoryCategory, &Stat)> + '_ {
        MemoryCategory::ALL.into_iter().zip(self.stats.iter())
    }

    /// The sum of the categories' `current` values: always equal to
    /// `allocated_bytes.all.current`.
    pub fn total_current(&self) -> i64 {
        self.stats.iter().map(|s| s.current).sum()
    }

    /// Whether a category ever held bytes since creation or the last
    /// `reset_accumulated` (or holds some now).
    pub fn was_used(&self, category: MemoryCategory) -> bool {
        let stat = self.get(category);
        stat.current != 0 || stat.allocated != 0 || stat.peak != 0
    }

    #[inline]
    pub(crate) fn increase(&mut self, category: MemoryCategory, amount: u64) {
        self.stats[category.index()].increase(amount);
    }

    #[inline]
    pub(crate) fn decrease(&mut self, category: MemoryCategory, amount: u64) {
        self.stats[category.index()].decrease(amount);
    }

    pub(crate) fn for_each(&mut self, f: impl Fn(&mut Stat)) {
        self.stats.iter_mut().for_each(f);
    }
}

impl std::ops::Index<MemoryCategory> for CategoryStats {
    type Output = Stat;

    fn index(&self, category: MemoryCategory) -> &Stat {
        self.get(category)
    }
}

impl Serialize for CategoryStats {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter().map(|(category, stat)| (category.name(), stat)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_serialize_as_a_map_by_name() {
        let mut stats = CategoryStats::default();
        stats.increase(MemoryCategory::Gradient, 1024);
        stats.increase(MemoryCategory::Activation, 512);
        stats.decrease(MemoryCategory::Activation, 512);
        assert_eq!(stats.total_current(), 1024);
        assert!(stats.was_used(MemoryCategory::Activation));
        assert!(!stats.was_used(MemoryCategory::Input));
        assert_eq!(stats[MemoryCategory::Gradient].peak, 1024);
        let json = serde_json::to_value(stats).unwrap();
        assert_eq!(json["gradient"]["current"], 1024);
        assert_eq!(json["activation"]["freed"], 512);
        assert_eq!(json["optimizer_state"]["current"], 0);
    }

    #[test]
    fn peak_follows_current_and_resets_to_it() {
        let mut stat = Stat::default();
        stat.increase(10);
        stat.decrease(4);
        stat.increase(1);
        assert_eq!(stat, Stat { current: 7, peak: 10, allocated: 11, freed: 4 });
        stat.reset_peak();
        assert_eq!(stat.peak, 7);
        stat.reset_accumulated();
        assert_eq!((stat.allocated, stat.freed, stat.current), (0, 0, 7));
    }

    #[test]
    fn arrays_update_all_and_one_pool() {
        let mut array = StatArray::default();
        array.increase(PoolKind::Small, 3);
        array.increase(PoolKind::Large, 5);
        assert_eq!(array.all.current, 8);
        assert_eq!(array.small_pool.current, 3);
        assert_eq!(array.large_pool.current, 5);
    }
}
