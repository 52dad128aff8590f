//! What memory is for: every block carries a [`MemoryCategory`] (parameters,
//! gradients, optimizer state, activations, …), and the allocator keeps
//! allocated bytes per category ([`CategoryStats`](crate::CategoryStats), in
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

use serde::{Deserialize, Serialize};
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
    /// the summary rows and [`CategoryStats::iter`](crate::CategoryStats::iter)).
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
}
