//! State dicts of a sharded model: this rank's shards (saved and loaded
//! per rank, same world size), or the whole model under the unwrapped
//! model's names (gathered on rank 0; loaded by every rank from the whole
//! dict), which an unsharded model loads as it is.

use super::unit::lock;
use super::FullyShardedDataParallel;
use crate::error::{ParallelError, Result};
use brasa_autograd::no_grad;
use brasa_nn::{ModuleExt, StateDict};
use brasa_tensor::{DType, Tensor};
use std::collections::BTreeSet;

/// The names of the entries recording who saved a sharded dict.
const WORLD_SIZE: &str = "fsdp.world_size";
const RANK: &str = "fsdp.rank";

impl FullyShardedDataParallel {
    /// This rank's shards (`<unit>.flat_shard`, sharing storage with the
    /// model), the layers' buffers under the unwrapped model's names, and
    /// the world size and rank that saved it. Save it per rank with
    /// [`StateDict::save`]; load it with
    /// [`load_sharded_state_dict`](Self::load_sharded_state_dict) on the
    /// same rank of a job of the same size.
    pub fn sharded_state_dict(&self) -> Result<StateDict> {
        let comm = &self.shared.comm;
        let mut dict = StateDict::new();
        for unit in self.shared.units.iter().filter(|u| !u.layout.slots.is_empty()) {
            dict.insert(format!("{}.flat_shard", unit.name), unit.shard.tensor().clone());
        }
        self.insert_buffers(&mut dict);
        dict.insert(WORLD_SIZE, Tensor::from_vec_on(vec![comm.world_size() as i64], [1], comm.device())?);
        dict.insert(RANK, Tensor::from_vec_on(vec![comm.rank() as i64], [1], comm.device())?);
        Ok(dict)
    }

    /// Copies a dict made by [`sharded_state_dict`](Self::sharded_state_dict)
    /// on this rank into the shards and buffers. An error naming the
    /// problem when it was saved by another world size or rank, or when an
    /// entry is missing, unexpected, or of another shape or dtype (nothing
    /// is copied then).
    pub fn load_sharded_state_dict(&self, dict: &StateDict) -> Result<()> {
        const OP: &str = "FullyShardedDataParallel::load_sharded_state_dict";
        let comm = &self.shared.comm;
        for (name, ours) in [(WORLD_SIZE, comm.world_size()), (RANK, comm.rank())] {
            let saved = dict
                .get(name)
                .ok_or_else(|| ParallelError::invalid(OP, format!("the dict has no {name}: not a sharded state dict")))?
                .to_dtype(DType::I64)?
                .to_vec::<i64>()?;
            if saved.first().copied() != Some(ours as i64) {
                return Err(ParallelError::invalid(
                    OP,
                    format!(
                        "the dict was saved with {name} {saved:?}, this rank has {ours}; a sharded dict loads on the \
                         same rank of a job of the same size (use the full state dict to change the world size)"
                    ),
                ));
            }
        }
        let mut targets = self.sharded_state_dict()?;
        targets.remove(WORLD_SIZE);
        targets.remove(RANK);
        copy_matching(OP, &targets, dict, &[WORLD_SIZE, RANK])
    }

    /// The whole model's parameters (in their master dtype) and buffers
    /// under the unwrapped model's names (`0.weight`, `2.bias`), gathered
    /// unit by unit: `Some` on rank 0, `None` elsewhere. A collective:
    /// every rank calls it. The dict loads into the unsharded model
    /// ([`ModuleExt::load_state_dict`]) and, on any world size, into a
    /// sharded one ([`load_full_state_dict`](Self::load_full_state_dict)).
    pub fn full_state_dict(&self) -> Result<Option<StateDict>> {
        let comm = &self.shared.comm;
        let _no_grad = no_grad();
        let mut dict = StateDict::new();
        for unit in self.shared.units.iter().filter(|u| !u.layout.slots.is_empty()) {
            let full = Tensor::zeros_on([unit.padded()], unit.shard.dtype(), comm.device())?;
            comm.all_gather(&full, unit.shard.tensor())?;
            if comm.rank() != 0 {
                continue;
            }
            for slot in &unit.layout.slots {
                let dims: Vec<isize> = slot.dims.iter().map(|&d| d as isize).collect();
                dict.insert(
                    slot.name.clone(),
                    full.narrow(0, slot.offset, slot.numel())?.reshape(&dims)?.contiguous()?,
                );
            }
        }
        if comm.rank() != 0 {
            return Ok(None);
        }
        self.insert_buffers(&mut dict);
        Ok(Some(dict))
    }

    /// Copies this rank's part of a whole-model dict (as
    /// [`full_state_dict`](Self::full_state_dict) or the unsharded model's
    /// `state_dict()` makes it; every rank passes the whole dict) into the
    /// shards and buffers. Strict: a missing or unexpected name, or another
    /// shape or dtype, is an error naming it (nothing is copied then).
    pub fn load_full_state_dict(&self, dict: &StateDict) -> Result<()> {
        const OP: &str = "FullyShardedDataParallel::load_full_state_dict";
        let comm = &self.shared.comm;
        let mut expected = BTreeSet::new();
        // Check everything first.
        for unit in &self.shared.units {
            for slot in &unit.layout.slots {
                let tensor = dict.get(&slot.name).ok_or_else(|| {
                    ParallelError::invalid(OP, format!("the dict has no {} (unit {})", slot.name, unit.name))
                })?;
                if tensor.dims() != slot.dims.as_slice() {
                    return Err(ParallelError::invalid(
                        OP,
                        format!(
                            "{} has shape {:?} in the dict, the model's is {:?}",
                            slot.name,
                            tensor.dims(),
                            slot.dims
                        ),
                    ));
                }
                expected.insert(slot.name.clone());
            }
        }
        let mut buffers = StateDict::new();
        self.insert_buffers(&mut buffers);
        expected.extend(buffers.names().map(str::to_string));
        if let Some(extra) = dict.names().find(|name| !expected.contains(*name)) {
            return Err(ParallelError::invalid(OP, format!("the dict has {extra}, which the model does not")));
        }
        let only_buffers: StateDict =
            dict.iter().filter(|(name, _)| buffers.get(name).is_some()).fold(StateDict::new(), |mut d, (name, t)| {
                d.insert(name, t.clone());
                d
            });
        check_matching(OP, &buffers, &only_buffers)?;
        let _no_grad = no_grad();
        for unit in self.shared.units.iter().filter(|u| !u.layout.slots.is_empty()) {
            let tensors: Vec<Tensor> = unit
                .layout
                .slots
                .iter()
                .map(|slot| dict.get(&slot.name).cloned())
                .collect::<Option<Vec<Tensor>>>()
                .ok_or_else(|| ParallelError::invalid(OP, "an entry vanished"))?;
            unit.layout.copy_to_shard(0, comm.rank(), unit.shard.tensor(), &tensors)?;
        }
        copy_matching(OP, &buffers, &only_buffers, &[])
    }

    /// The layers' buffers under the unwrapped model's names.
    fn insert_buffers(&self, dict: &mut StateDict) {
        for unit in &self.shared.units {
            if let Some(module) = &unit.module {
                for (name, buffer) in lock(module).named_buffers() {
                    dict.insert(format!("{}.{name}", unit.name), buffer);
                }
            }
        }
    }
}

/// Errors unless `dict` has exactly `targets`' names with their shapes and
/// dtypes.
fn check_matching(op: &'static str, targets: &StateDict, dict: &StateDict) -> Result<()> {
    for (name, target) in targets.iter() {
        let source = dict.get(name).ok_or_else(|| ParallelError::invalid(op, format!("the dict has no {name}")))?;
        if source.dims() != target.dims() || source.dtype() != target.dtype() {
            return Err(ParallelError::invalid(
                op,
                format!(
                    "{name} is {:?} {} in the dict, the model's is {:?} {}",
                    source.dims(),
                    source.dtype(),
                    target.dims(),
                    target.dtype()
                ),
            ));
        }
    }
    Ok(())
}

/// Checks, then copies `dict` into `targets` (names in `ignore` aside).
fn copy_matching(op: &'static str, targets: &StateDict, dict: &StateDict, ignore: &[&str]) -> Result<()> {
    check_matching(op, targets, dict)?;
    if let Some(extra) = dict.names().find(|name| targets.get(name).is_none() && !ignore.contains(name)) {
        return Err(ParallelError::invalid(op, format!("the dict has {extra}, which the model does not")));
    }
    let _no_grad = no_grad();
    for (name, target) in targets.iter() {
        if let Some(source) = dict.get(name) {
            target.copy_(source)?;
        }
    }
    Ok(())
}
