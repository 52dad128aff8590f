//! What memory is for: every block carries a [`MemoryCategory`] (parameters,
//! gradients, optimizer state, activations, …), and the allocator keeps
//! allocated bytes per category ([`CategoryStats`], in
//! [`MemoryStats::by_category`](crate::MemoryStats::by_category)), traces it
//! (the `category` of each [`TraceEntry`](crate::TraceEntry), and
//! [`TraceAction::Retag`](crate::TraceAction::Retag) when it changes) and
//! shows it in snapshots and the summary table.
//!
//! The counts are of block sizes, the basis of `allocated_bytes`: at every
//! moment the categories' `current` values add up to
//! `allocated_bytes.all.current`.
//!
//! ```
//! use brasa_alloc::{CachingAllocator, HostBackend, MemoryCategory, StreamId};
//!
//! let alloc = CachingAllocator::new(HostBackend::new());
//! let weights = alloc.allocate_as(4 << 20, StreamId::DEFAULT, MemoryCategory::Parameter)?;
//! let scratch = alloc.allocate(1 << 20, StreamId::DEFAULT)?;            // `Other`
//! scratch.set_category(MemoryCategory::Activation);                   // retagged in place
//! let stats = alloc.stats();
//! assert_eq!(stats.by_category.get(MemoryCategory::Parameter).current, 4 << 20);
//! assert_eq!(stats.by_category.get(MemoryCategory::Activation).current, 1 << 20);
//! assert_eq!(stats.by_category.get(MemoryCategory::Other).current, 0);
//! assert_eq!(stats.by_category.total_current(), stats.allocated_bytes.all.current);
//! # drop((weights, scratch));
//! # Ok::<(), brasa_alloc::AllocError>(())
//! ```

use crate::stats::Stat;
use serde::{Deserialize, Serialize, Serializer};
use std::fmt;

/// What a block of memory holds, for accounting: who owns the bytes of a
/// training step. [`MemoryCategory::Other`] is the default (plain
/// [`CachingAllocator::allocate`](crate::CachingAllocator::allocate)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryCategory {
    /// Model parameters (weights, biases, buffers saved with the model).
    Parameter,
    /// Gradients of parameters.
    Gradient,
    /// Optimizer state (momentum, Adam's moments, master weights).
    OptimizerState,
    /// Activations kept for backward.
    Activation,
    /// Short-lived intermediates and workspaces.
    Temporary,
    /// Inputs (batches, targets).
    Input,
    /// Anything not tagged otherwise.
    #[default]
    Other,
}

impl MemoryCategory {
    /// Every category, in declaration order (the order of the statistics,
    /// the summary rows and [`CategoryStats::iter`]).
    pub const ALL: [MemoryCategory; 7] = [
        MemoryCategory::Parameter,
        MemoryCategory::Gradient,
        MemoryCategory::OptimizerState,
        MemoryCategory::Activation,
        MemoryCategory::Temporary,
        MemoryCategory::Input,
        MemoryCategory::Other,
    ];

    /// How many categories there are.
    pub const COUNT: usize = Self::ALL.len();

    /// The snake_case name, as serialized (`optimizer_state`).
    pub const fn name(self) -> &'static str {
        match self {
            MemoryCategory::Parameter => "parameter",
            MemoryCategory::Gradient => "gradient",
            MemoryCategory::OptimizerState => "optimizer_state",
            MemoryCategory::Activation => "activation",
            MemoryCategory::Temporary => "temporary",
            MemoryCategory::Input => "input",
            MemoryCategory::Other => "other",
        }
    }

    /// The position in [`MemoryCategory::ALL`].
    #[inline]
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The category at `index` in [`MemoryCategory::ALL`] (`None` past the end).
    #[inline]
    pub const fn from_index(index: usize) -> Option<MemoryCategory> {
        if index < Self::COUNT {
            Some(Self::ALL[index])
        } else {
            None
        }
    }
}

impl fmt::Display for MemoryCategory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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
    fn names_are_the_serialized_names() {
        for (index, category) in MemoryCategory::ALL.into_iter().enumerate() {
            assert_eq!(category.index(), index);
            assert_eq!(MemoryCategory::from_index(index), Some(category));
            let json = serde_json::to_string(&category).unwrap();
            assert_eq!(json, format!("\"{}\"", category.name()));
            assert_eq!(category.to_string(), category.name());
            let back: MemoryCategory = serde_json::from_str(&json).unwrap();
            assert_eq!(back, category);
        }
        assert_eq!(MemoryCategory::from_index(MemoryCategory::COUNT), None);
        assert_eq!(MemoryCategory::default(), MemoryCategory::Other);
        assert_eq!(MemoryCategory::OptimizerState.name(), "optimizer_state");
    }

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
}
