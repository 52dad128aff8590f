//! The backward half of sharding: each gathered parameter enters the graph
//! through a [`ParamUse`] node (its backward adds the parameter's gradient
//! into the unit's unsharded gradient buffer and, once the unit's last
//! gradient arrived, reduce-scatters the buffer to the owners while
//! backward goes on); tensors a unit's operations save from its gathered
//! buffer are kept as references ([`GatheredReferences`]) and re-gathered
//! when backward needs them; a callback at the end of backward waits for
//! the reductions and adds them to the shards' gradients.

use super::unit::{lock, Unit};
use super::{Shared, Step};
use crate::collective::ReduceOp;
use crate::error::{ParallelError, Result};
use crate::work::Work;
use brasa_autograd::{
    apply, install_saved_tensor_hooks, no_grad, queue_callback, Function, FunctionCtx, Packed, SavedTensorHooks,
    SavedTensorsHooksGuard, Var,
};
use brasa_tensor::memory::{category_scope, MemoryCategory};
use brasa_tensor::{Storage, Tensor};
use std::any::Any;
use std::sync::{Arc, Weak};

const OP: &str = "FullyShardedDataParallel backward";

/// A reduce-scatter of one unit's gradients in flight.
pub(super) struct PendingReduce {
    unit: usize,
    /// This rank's averaged slice, in the reduction dtype.
    output: Tensor,
    /// `None` once waited for.
    work: Option<Work>,
    /// The unsharded gradients it reads: held until the wait, so that they
    /// are freed at a point of this thread's program (the next unit's
    /// reduction, or the end of backward), never when the communication
    /// thread happens to finish; memory plans then equal runs.
    input: Option<Tensor>,
}

/// One use of one gathered parameter in the graph.
struct ParamUse {
    shared: Weak<Shared>,
    unit: usize,
    slot: usize,
    /// The view handed to the graph (taken by forward).
    view: Option<Tensor>,
    delivered: bool,
}

impl Function for ParamUse {
    fn name(&self) -> &'static str {
        "fsdp_gathered_parameter"
    }

    fn forward(&mut self, _ctx: &mut FunctionCtx, _inputs: &[Tensor]) -> brasa_autograd::Result<Tensor> {
        self.view.take().ok_or_else(|| ParallelError::invalid(OP, "a gathered parameter was used twice").into())
    }

    fn backward(
        &mut self,
        _saved: &[Tensor],
        grad: &Tensor,
        _needs: &[bool],
    ) -> brasa_autograd::Result<Vec<Option<Tensor>>> {
        if self.delivered {
            return Err(ParallelError::invalid(
                OP,
                "backward ran twice through a sharded unit (retain_graph is not supported with sharding)",
            )
            .into());
        }
        self.delivered = true;
        let shared = self
            .shared
            .upgrade()
            .ok_or_else(|| ParallelError::invalid(OP, "the FullyShardedDataParallel was dropped before backward"))?;
        shared.accumulate(self.unit, self.slot, grad)?;
        // The shard's gradient is set by the end-of-backward callback.
        Ok(vec![None])
    }
}

impl Drop for ParamUse {
    fn drop(&mut self) {
        // A graph dropped without backward: its uses will never deliver.
        if !self.delivered {
            if let Some(shared) = self.shared.upgrade() {
                let mut grads = lock(&shared.units[self.unit].grads);
                grads.expected[self.slot] = grads.expected[self.slot].saturating_sub(1);
            }
        }
    }
}

/// `view` (slot `slot` of unit `unit`'s gathered buffer) as a `Var` whose
/// gradient goes to the unit's reduction.
pub(super) fn record_param_use(shared: &Arc<Shared>, unit: usize, slot: usize, view: Tensor) -> Result<Var> {
    lock(&shared.units[unit].grads).expected[slot] += 1;
    let function = ParamUse { shared: Arc::downgrade(shared), unit, slot, view: Some(view), delivered: false };
    Ok(apply(function, &[&shared.units[unit].shard])?)
}

/// Where a saved tensor lies in a unit's gathered buffer.
struct SavedView {
    unit: usize,
    dims: Vec<usize>,
    strides: Vec<isize>,
    offset: usize,
}

/// Saved-tensor hooks of one unit's forward: a tensor that is a view of
/// the gathered buffer of a watched unit is saved as where it lies, and
/// rebuilt on the buffer gathered again for backward.
struct GatheredReferences {
    shared: Weak<Shared>,
    watched: Vec<(usize, Weak<Storage>)>,
}

impl SavedTensorHooks for GatheredReferences {
    fn pack(&self, tensor: &Tensor) -> brasa_autograd::Result<Packed> {
        let storage = Arc::as_ptr(tensor.storage());
        Ok(match self.watched.iter().find(|(_, s)| std::ptr::eq(s.as_ptr(), storage)) {
            Some(&(unit, _)) => Packed::value(SavedView {
                unit,
                dims: tensor.dims().to_vec(),
                strides: tensor.strides().to_vec(),
                offset: tensor.layout().offset(),
            }),
            None => Packed::Keep,
        })
    }

    fn unpack(&self, packed: &(dyn Any + Send + Sync)) -> brasa_autograd::Result<Tensor> {
        let view = Packed::downcast_ref::<SavedView>(packed, OP)?;
        let shared = self
            .shared
            .upgrade()
            .ok_or_else(|| ParallelError::invalid(OP, "the FullyShardedDataParallel was dropped before backward"))?;
        shared.needed_in_backward(view.unit)?;
        let full = shared.gathered(view.unit)?;
        Ok(full.as_strided(&view.dims, &view.strides, view.offset)?)
    }
}

/// Installs the hooks that save views of `units`' gathered buffers as
/// references, for the forward of one unit.
pub(super) fn save_gathered_as_references(shared: &Arc<Shared>, units: &[usize]) -> SavedTensorsHooksGuard {
    let watched = units
        .iter()
        .filter_map(|&u| match &*lock(&shared.units[u].gathered) {
            super::Gathered::Ready(full) => Some((u, Arc::downgrade(full.storage()))),
            _ => None,
        })
        .collect();
    install_saved_tensor_hooks(Arc::new(GatheredReferences { shared: Arc::downgrade(shared), watched }))
}

impl Shared {
    /// Backward first needs unit `unit`: note the order, and prefetch the
    /// unit that comes after it.
    fn needed_in_backward(self: &Arc<Self>, unit: usize) -> Result<()> {
        self.queue_end_of_backward()?;
        let next = {
            let mut step = lock(&self.step);
            if step.backward_order.contains(&unit) {
                return Ok(());
            }
            step.backward_order.push(unit);
            if !self.config.prefetch || unit >= self.layers {
                return Ok(());
            }
            next_in_backward(&step, unit, |u| u < self.layers && self.has_parameters(u))
        };
        if let Some(next) = next {
            // Only a unit whose gradients are still to come.
            let waiting = lock(&self.units[next].grads).expected_total() > 0 || self.config.checkpoint;
            if waiting {
                self.launch_gather(next, true)?;
            }
        }
        Ok(())
    }

    /// Queues the end-of-backward callback once per backward.
    fn queue_end_of_backward(self: &Arc<Self>) -> Result<()> {
        let mut step = lock(&self.step);
        if step.callback_queued {
            return Ok(());
        }
        step.callback_queued = true;
        drop(step);
        let weak = Arc::downgrade(self);
        queue_callback(move || match weak.upgrade() {
            Some(shared) => shared.end_of_backward().map_err(Into::into),
            None => Ok(()),
        })?;
        Ok(())
    }

    /// Adds one parameter use's gradient into its unit's unsharded buffer;
    /// the unit's last one starts its reduction.
    fn accumulate(self: &Arc<Self>, unit_index: usize, slot: usize, grad: &Tensor) -> Result<()> {
        self.needed_in_backward(unit_index)?;
        let unit = &self.units[unit_index];
        let _no_grad = no_grad();
        let complete = {
            let mut grads = lock(&unit.grads);
            let reduce_dtype = self.reduce_dtype(unit);
            let full = match &grads.full {
                Some(full) => full.clone(),
                None => {
                    let _gradients = category_scope(MemoryCategory::Gradient);
                    let full = Tensor::zeros_on([unit.padded()], reduce_dtype, self.comm.device())?;
                    grads.full = Some(full.clone());
                    full
                }
            };
            let place = &unit.layout.slots[slot];
            let target = full.narrow(0, place.offset, place.numel())?;
            let grad = grad.reshape(&[-1])?;
            let grad = if grad.dtype() == reduce_dtype { grad } else { grad.to_dtype(reduce_dtype)? };
            target.add_(&grad)?;
            grads.arrived[slot] += 1;
            grads.arrived_total() >= grads.expected_total()
        };
        if complete {
            self.unit_complete(unit_index)?;
        }
        Ok(())
    }

    fn reduce_dtype(&self, unit: &Unit) -> brasa_tensor::DType {
        self.config.mixed_precision.map_or(unit.shard.dtype(), |mp| mp.reduce_dtype)
    }

    /// Every gradient of the unit arrived: free its gathered parameters and
    /// (unless accumulating) reduce-scatter its gradients.
    fn unit_complete(self: &Arc<Self>, unit_index: usize) -> Result<()> {
        let unit = &self.units[unit_index];
        let full = {
            let mut grads = lock(&unit.grads);
            grads.arrived.iter_mut().for_each(|a| *a = 0);
            grads.expected.iter_mut().for_each(|e| *e = 0);
            if self.syncing() {
                grads.full.take()
            } else {
                None
            }
        };
        self.release(unit_index)?;
        let Some(full) = full else { return Ok(()) };
        // At most one reduction in flight: the previous one's unsharded
        // input is freed before this one starts, so a step never holds
        // more than two units' unsharded gradients (this one's and the one
        // being computed), however slow the communication.
        let previous = lock(&self.step).pending.last_mut().map(|p| (p.work.take(), p.input.take()));
        if let Some((work, input)) = previous {
            if let Some(work) = work {
                self.wait_timed(work)?;
            }
            drop(input);
        }
        let _no_grad = no_grad();
        let output = {
            let _gradients = category_scope(MemoryCategory::Gradient);
            Tensor::zeros_on([unit.shard_len()], full.dtype(), self.comm.device())?
        };
        let work = self.comm.reduce_scatter_async(&output, &full, ReduceOp::Avg);
        // Overlapped when another unit still has gradients to come.
        let more_to_come =
            self.units.iter().enumerate().any(|(i, u)| i != unit_index && lock(&u.grads).expected_total() > 0);
        let bytes = full.storage().size_in_bytes();
        let mut step = lock(&self.step);
        step.stats.reduce_scatters += 1;
        step.stats.reduce_scatter_bytes += bytes;
        if more_to_come {
            step.stats.overlapped_reduce_bytes += bytes;
        }
        step.pending.push(PendingReduce { unit: unit_index, output, work: Some(work), input: Some(full) });
        Ok(())
    }

    /// The end of backward: reduce what is complete and not yet reduced,
    /// wait for every reduction, add it to the shards' gradients, free
    /// what is still gathered, and close the step's statistics.
    fn end_of_backward(self: &Arc<Self>) -> Result<()> {
        lock(&self.step).callback_queued = false;
        let mut incomplete = Vec::new();
        for (i, unit) in self.units.iter().enumerate() {
            let grads = lock(&unit.grads);
            let (arrived, expected) = (grads.arrived_total(), grads.expected_total());
            if arrived > 0 && arrived < expected {
                let missing: Vec<&str> = (0..grads.arrived.len())
                    .filter(|&k| grads.arrived[k] < grads.expected[k])
                    .map(|k| unit.layout.slots[k].name.as_str())
                    .collect();
                incomplete.push(format!("unit {} ({})", unit.name, missing.join(", ")));
            } else if arrived > 0 {
                drop(grads);
                self.unit_complete(i)?;
            }
        }
        let pending = std::mem::take(&mut lock(&self.step).pending);
        let _no_grad = no_grad();
        for reduce in pending {
            if let Some(work) = reduce.work {
                self.wait_timed(work)?;
            }
            drop(reduce.input);
            let shard = &self.units[reduce.unit].shard;
            let output = if reduce.output.dtype() == shard.dtype() {
                reduce.output
            } else {
                reduce.output.to_dtype(shard.dtype())?
            };
            match shard.grad() {
                Some(grad) => grad.add_(&output)?,
                None => shard.set_grad(Some(output))?,
            }
        }
        self.release_all()?;
        let mut step = lock(&self.step);
        close_order(&mut step);
        let stats = std::mem::take(&mut step.stats);
        drop(step);
        *lock(&self.last_stats) = stats;
        if !incomplete.is_empty() {
            return Err(ParallelError::invalid(
                OP,
                format!(
                    "some parameters got no gradient in this backward while others of their unit did: {}; every \
                     parameter of a sharded unit must take part in the loss (or the output of another forward is \
                     still waiting for its backward)",
                    incomplete.join("; ")
                ),
            ));
        }
        Ok(())
    }
}

impl Shared {
    /// Clears everything a step holds between forward and the end of
    /// backward — gathered units, unsharded gradients, reductions in
    /// flight (waited for), the queued-callback mark — after a backward
    /// that failed midway (its end-of-backward callback never ran).
    pub(super) fn reset_step(&self) -> Result<()> {
        let pending = {
            let mut step = lock(&self.step);
            step.callback_queued = false;
            step.backward_order.clear();
            step.shared_vars = None;
            std::mem::take(&mut step.pending)
        };
        let mut first_error = None;
        for reduce in pending {
            if let Some(work) = reduce.work {
                if let Err(error) = work.wait() {
                    first_error.get_or_insert(error);
                }
            }
        }
        for unit in &self.units {
            let mut grads = lock(&unit.grads);
            grads.full = None;
            grads.arrived.iter_mut().for_each(|a| *a = 0);
            grads.expected.iter_mut().for_each(|e| *e = 0);
        }
        self.release_all()?;
        first_error.map_or(Ok(()), Err)
    }
}

/// The unit to prefetch after `unit` in backward: the next one in the
/// recorded order, or the layer before it when nothing is recorded yet.
fn next_in_backward(step: &Step, unit: usize, gathers: impl Fn(usize) -> bool) -> Option<usize> {
    match &step.recorded_order {
        Some(order) => order.iter().position(|&u| u == unit).and_then(|p| order.get(p + 1)).copied(),
        None => (0..unit).rev().find(|&u| gathers(u)),
    }
    .filter(|next| !step.backward_order.contains(next))
}

/// Records the first backward's order of units, or counts a change.
fn close_order(step: &mut Step) {
    let order = std::mem::take(&mut step.backward_order);
    if order.is_empty() {
        return;
    }
    match &step.recorded_order {
        None => step.recorded_order = Some(order),
        Some(recorded) if *recorded != order => {
            step.stats.order_changes += 1;
            step.stats.last_order_change =
                Some(format!("backward needed the units in the order {order:?}, the recorded order was {recorded:?}"));
            step.recorded_order = Some(order);
        }
        Some(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_order_is_recorded_and_a_change_is_counted_and_followed() {
        let mut step = Step { backward_order: vec![3, 2, 1, 0], ..Step::default() };
        close_order(&mut step);
        assert_eq!(step.recorded_order.as_deref(), Some(&[3, 2, 1, 0][..]));
        assert_eq!(step.stats.order_changes, 0);
        // Prefetch follows the recorded order, skipping units already seen.
        step.backward_order = vec![3];
        assert_eq!(next_in_backward(&step, 3, |_| true), Some(2));
        step.backward_order = vec![3, 1];
        assert_eq!(next_in_backward(&step, 1, |_| true), Some(0));
        step.backward_order = vec![3, 2, 1, 0];
        assert_eq!(next_in_backward(&step, 1, |_| true), None);
        // The same order again: nothing to report.
        step.backward_order = vec![3, 2, 1, 0];
        close_order(&mut step);
        assert_eq!(step.stats.order_changes, 0);
        // Another order: counted, described, and recorded for the next step.
        step.backward_order = vec![3, 1, 2, 0];
        close_order(&mut step);
        assert_eq!(step.stats.order_changes, 1);
        let message = step.stats.last_order_change.clone().unwrap();
        assert!(message.contains("[3, 1, 2, 0]") && message.contains("[3, 2, 1, 0]"), "{message}");
        step.backward_order = vec![3];
        assert_eq!(next_in_backward(&step, 3, |_| true), Some(1));
        // Before any record: the layer before, among those that gather.
        let fresh = Step::default();
        assert_eq!(next_in_backward(&fresh, 3, |u| u != 2), Some(1));
    }
}
