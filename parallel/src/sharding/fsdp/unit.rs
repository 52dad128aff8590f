//! One unit of a sharded model: its parameters laid end to end in a flat
//! buffer padded to a multiple of the world size (the sharding module's
//! [`FlatLayout`], one dtype group), this
//! rank's 1/N of it (the shard the optimizer updates), the module with
//! stand-ins in place of its parameters between uses, and the state of its
//! gathered copy and of its gradients during a step.

use crate::error::{ParallelError, Result};
pub(crate) use crate::sharding::layout::FlatLayout;
use crate::work::Work;
use brasa_autograd::Var;
use brasa_nn::{Module, VisitorMut, WalkMut};
use brasa_tensor::Tensor;
use std::ops::Range;
use std::sync::{Mutex, MutexGuard};

/// The gathered copy of a unit's parameters.
pub(crate) enum Gathered {
    /// Only the shard exists.
    Empty,
    /// An all-gather into `full` was started and not yet waited for.
    InFlight { full: Tensor, work: Work },
    /// `full` holds every rank's shard.
    Ready(Tensor),
}

/// A unit's gradients during a step: the unsharded buffer they are summed
/// in, and how many parameter uses recorded in forward have delivered
/// theirs (a unit run twice in one forward expects two per parameter).
pub(crate) struct UnitGrads {
    /// `[padded]` in the reduction dtype; kept across backward passes under
    /// `no_sync` (gradient accumulation), handed to the reduce-scatter
    /// otherwise.
    pub(crate) full: Option<Tensor>,
    pub(crate) expected: Vec<usize>,
    pub(crate) arrived: Vec<usize>,
}

impl UnitGrads {
    pub(crate) fn expected_total(&self) -> usize {
        self.expected.iter().sum()
    }

    pub(crate) fn arrived_total(&self) -> usize {
        self.arrived.iter().sum()
    }
}

/// One unit: a layer of the model (`module` is `Some`), or the parameters
/// several layers share (tied weights: `module` is `None`, they are gathered
/// for the whole step).
pub(crate) struct Unit {
    /// `0`, `1`, ... (the layer's index), or `shared`.
    pub(crate) name: String,
    pub(crate) module: Option<Mutex<Box<dyn Module>>>,
    pub(crate) layout: FlatLayout,
    /// Meta-device parameters of the right shapes, held by the module
    /// between uses (one per slot).
    pub(crate) placeholders: Vec<Var>,
    /// This rank's `[padded / world]` elements: a parameter of its own,
    /// which the optimizer updates.
    pub(crate) shard: Var,
    pub(crate) gathered: Mutex<Gathered>,
    pub(crate) grads: Mutex<UnitGrads>,
    /// The indices of the shared unit's parameters this layer holds.
    pub(crate) uses_shared: Vec<usize>,
}

impl Unit {
    pub(crate) fn new(
        name: String,
        module: Option<Box<dyn Module>>,
        layout: FlatLayout,
        placeholders: Vec<Var>,
        shard: Var,
    ) -> Unit {
        let slots = layout.slots.len();
        Unit {
            name,
            module: module.map(Mutex::new),
            layout,
            placeholders,
            shard,
            gathered: Mutex::new(Gathered::Empty),
            grads: Mutex::new(UnitGrads { full: None, expected: vec![0; slots], arrived: vec![0; slots] }),
            uses_shared: Vec::new(),
        }
    }

    /// Elements of the flat buffer, padding included (0 without parameters).
    pub(crate) fn padded(&self) -> usize {
        if self.layout.groups.is_empty() {
            0
        } else {
            self.layout.padded_len(0)
        }
    }

    /// Elements of one rank's shard.
    pub(crate) fn shard_len(&self) -> usize {
        self.layout.groups.first().map_or(0, |g| g.shard_len)
    }

    /// The elements of the flat buffer that `rank` owns.
    pub(crate) fn shard_range(&self, rank: usize) -> Range<usize> {
        rank * self.shard_len()..(rank + 1) * self.shard_len()
    }
}

/// Locks `mutex`, taking the data of a poisoned one (a panicking rank is
/// reported by the launcher; the state is still consistent enough to fail
/// the next collective cleanly).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Replaces every parameter of `module` that is one of `from` by the `to`
/// at the same index (a parameter used twice is replaced at each place).
/// An error when one of `from` is nowhere in the module.
pub(crate) fn swap_parameters(module: &mut dyn Module, from: &[Var], to: &[Var]) -> Result<()> {
    struct Swap<'a> {
        from: &'a [Var],
        to: &'a [Var],
        found: Vec<bool>,
    }
    impl VisitorMut for Swap<'_> {
        fn param(&mut self, _path: &str, param: &mut Var) -> brasa_nn::Result<()> {
            if let Some(i) = self.from.iter().position(|p| p.same_var(param)) {
                *param = self.to[i].clone();
                self.found[i] = true;
            }
            Ok(())
        }
    }
    let mut swap = Swap { from, to, found: vec![false; from.len()] };
    module.visit_mut(&mut WalkMut::new(&mut swap))?;
    if let Some(missing) = swap.found.iter().position(|found| !found) {
        return Err(ParallelError::invalid(
            "FullyShardedDataParallel",
            format!(
                "parameter {} of {} is no longer in its layer (was the layer changed through module_mut?)",
                missing,
                from.len()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use brasa_tensor::{DType, Tensor};

    #[test]
    fn a_unit_pads_to_equal_shards() -> Result<()> {
        let layout = FlatLayout::new(&[("w".into(), DType::F32, vec![3, 2]), ("b".into(), DType::F32, vec![5])], 4);
        let shard = Var::param(Tensor::zeros([3], DType::F32)?)?;
        let unit = Unit::new("0".into(), None, layout, Vec::new(), shard);
        assert_eq!(unit.padded(), 12);
        assert_eq!(unit.shard_len(), 3);
        assert_eq!(unit.shard_range(3), 9..12);
        assert_eq!((unit.layout.slots[1].offset, unit.layout.slots[1].numel()), (6, 5));
        Ok(())
    }
}
