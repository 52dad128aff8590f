//! One device's part of a [`DataParallel`](super::DataParallel): its copy of
//! the model, whose trainable parameters and gradients are views of flat
//! per-dtype buffers, the shard of gradients and parameters it owns, and
//! the parameter elements it updates.

use super::{DataParallelConfig, LossReduction};
use crate::communicator::Communicator;
use crate::error::{ParallelError, Result};
use crate::sharding::layout::FlatLayout;
use crate::{ReduceOp, Work};
use brasa_autograd::Var;
use brasa_nn::optim::Optimizer;
use brasa_nn::{Module, ModuleExt, VisitorMut, WalkMut};
use brasa_tensor::{DType, Device, Tensor};
use std::ops::Range;

pub(crate) struct Replica<M> {
    pub(crate) rank: usize,
    pub(crate) device: Device,
    pub(crate) module: M,
    /// Taken out for the duration of a collective phase, so that a device
    /// that fails drops it and its peers stop waiting at once; `None`
    /// afterwards means the group broke.
    pub(crate) comm: Option<Communicator>,
    /// The trainable parameters in layout order: views of `flat_params`.
    pub(crate) params: Vec<Var>,
    /// Their gradients: views of `flat_grads`, which backward accumulates
    /// into in place, so the reduction needs no packing copy.
    pub(crate) grad_views: Vec<Tensor>,
    pub(crate) flat_params: Vec<Tensor>,
    pub(crate) flat_grads: Vec<Tensor>,
    /// This device's shard of the summed gradients, one per dtype group.
    pub(crate) grad_shards: Vec<Tensor>,
    /// What this device's optimizer updates (views of its shards of
    /// `flat_params`) with their gradients (views of `grad_shards`).
    pub(crate) owned: Vec<Var>,
    pub(crate) owned_grads: Vec<Tensor>,
    /// The module's buffers, kept equal to device 0's.
    pub(crate) buffers: Vec<Tensor>,
}

/// Swaps each listed parameter for its replacement wherever the model holds it.
struct ReplaceParams<'a> {
    replacements: &'a [(Var, Var)],
}

impl VisitorMut for ReplaceParams<'_> {
    fn param(&mut self, _path: &str, param: &mut Var) -> brasa_nn::Result<()> {
        if let Some((_, new)) = self.replacements.iter().find(|(old, _)| old.same_var(param)) {
            *param = new.clone();
        }
        Ok(())
    }
}

/// A view of `flat`'s elements `range` with shape `dims`.
fn view_of(flat: &Tensor, range: Range<usize>, dims: &[usize]) -> Result<Tensor> {
    let shape: Vec<isize> = dims.iter().map(|&d| d as isize).collect();
    Ok(flat.narrow(0, range.start, range.len())?.view(&shape)?)
}

impl<M: Module> Replica<M> {
    /// Moves `module`'s trainable parameters into flat buffers on `device`
    /// (values from `source`'s flat buffers when given, else its own) and
    /// points their gradients at flat gradient buffers. The optimizer is
    /// added by the caller, over [`Replica::owned`].
    pub(crate) fn new(
        rank: usize,
        device: Device,
        module: M,
        comm: Communicator,
        layout: &FlatLayout,
        source: Option<&Replica<M>>,
    ) -> Result<Replica<M>> {
        let named: Vec<(String, Var)> = module.named_parameters();
        let trainable: Vec<&Var> = named.iter().filter(|(_, p)| p.requires_grad()).map(|(_, p)| p).collect();
        let zeros = |len: usize, dtype: DType| Tensor::zeros_on([len], dtype, device);
        let mut flat_params = Vec::with_capacity(layout.groups.len());
        let mut flat_grads = Vec::with_capacity(layout.groups.len());
        let mut grad_shards = Vec::with_capacity(layout.groups.len());
        for (index, group) in layout.groups.iter().enumerate() {
            flat_params.push(zeros(layout.padded_len(index), group.dtype)?);
            flat_grads.push(zeros(layout.padded_len(index), group.dtype)?);
            grad_shards.push(zeros(group.shard_len, group.dtype)?);
        }
        match source {
            // One copy per dtype group instead of one per parameter.
            Some(source) => {
                for (flat, theirs) in flat_params.iter().zip(&source.flat_params) {
                    flat.copy_(theirs)?;
                }
            }
            None => {
                for (slot, param) in layout.slots.iter().zip(&trainable) {
                    view_of(&flat_params[slot.group], slot.range(), &slot.dims)?.copy_(param.tensor())?;
                }
            }
        }
        let mut replacements = Vec::with_capacity(trainable.len());
        let mut grad_views = Vec::with_capacity(trainable.len());
        for (slot, old) in layout.slots.iter().zip(&trainable) {
            let new = Var::param(view_of(&flat_params[slot.group], slot.range(), &slot.dims)?)?;
            let grad = view_of(&flat_grads[slot.group], slot.range(), &slot.dims)?;
            new.set_grad(Some(grad.clone()))?;
            replacements.push(((*old).clone(), new));
            grad_views.push(grad);
        }
        let mut module = module;
        module.visit_mut(&mut WalkMut::new(&mut ReplaceParams { replacements: &replacements }))?;
        // A hand-written `visit_mut` that hides a parameter would leave it
        // out of the flat buffers: it would silently never be trained.
        let now: Vec<Var> = module.parameters().into_iter().filter(Var::requires_grad).collect();
        let params: Vec<Var> = replacements.into_iter().map(|(_, new)| new).collect();
        if now.len() != params.len() || now.iter().zip(&params).any(|(a, b)| !a.same_var(b)) {
            return Err(ParallelError::invalid(
                "DataParallel::new",
                format!(
                    "replica {rank} on {device}: the model did not let every parameter be replaced through \
                     Parameters::visit_mut; DataParallel keeps parameters in flat buffers and needs to"
                ),
            ));
        }
        let mut owned = Vec::new();
        let mut owned_grads = Vec::new();
        for piece in layout.pieces(rank) {
            let shard = layout.shard(piece.group, rank);
            let len = piece.flat.len();
            owned.push(Var::param(flat_params[piece.group].narrow(0, piece.flat.start, len)?)?);
            owned_grads.push(grad_shards[piece.group].narrow(0, piece.flat.start - shard.start, len)?);
        }
        let buffers = module.named_buffers().into_iter().map(|(_, b)| b).collect();
        Ok(Replica {
            rank,
            device,
            module,
            comm: Some(comm),
            params,
            grad_views,
            flat_params,
            flat_grads,
            grad_shards,
            owned,
            owned_grads,
            buffers,
        })
    }

    /// Makes every trainable parameter's gradient its view of the flat
    /// gradient buffer again, keeping what the user left there: after
    /// `zero_grad` on the module (gradient `None`) the slot is zeroed, a
    /// gradient set by hand is copied in.
    pub(crate) fn attach_grads(&self) -> Result<()> {
        for (param, view) in self.params.iter().zip(&self.grad_views) {
            match param.grad() {
                Some(grad) if grad.shares_storage_with(view) => continue,
                Some(grad) => view.copy_(&grad)?,
                None => view.zero_()?,
            }
            param.set_grad(Some(view.clone()))?;
        }
        Ok(())
    }

    /// Discards the accumulated gradients.
    pub(crate) fn zero_grads(&self) -> Result<()> {
        for flat in &self.flat_grads {
            flat.zero_()?;
        }
        self.attach_grads()
    }

    /// Forward, loss and backward on rows `rows` of the batch; returns the
    /// loss (unweighted). Backward runs on the loss times `weight`, so that
    /// the sum over devices is the full batch's gradient.
    pub(crate) fn forward_backward<F>(
        &self,
        input: &Tensor,
        target: &Tensor,
        rows: Range<usize>,
        weight: f64,
        loss_fn: &F,
    ) -> Result<f64>
    where
        F: Fn(&Var, &Tensor) -> brasa_nn::Result<Var> + Sync,
    {
        if rows.is_empty() {
            return Ok(0.0);
        }
        let _range = brasa_profile::record_function(format!("DataParallel: forward_backward ({})", self.device));
        let _grad_mode = brasa_autograd::enable_grad();
        self.attach_grads()?;
        let loss = self.loss(input, target, rows, loss_fn)?;
        let value = loss.item()?;
        if weight == 1.0 {
            loss.backward()?;
        } else {
            loss.mul_scalar(weight)?.backward()?;
        }
        Ok(value)
    }

    /// The loss of rows `rows` without recording a graph.
    pub(crate) fn evaluate<F>(&self, input: &Tensor, target: &Tensor, rows: Range<usize>, metric: &F) -> Result<f64>
    where
        F: Fn(&Var, &Tensor) -> brasa_nn::Result<Var> + Sync,
    {
        if rows.is_empty() {
            return Ok(0.0);
        }
        let _grad_mode = brasa_autograd::no_grad();
        self.loss(input, target, rows, metric)?.item().map_err(ParallelError::from)
    }

    /// The model's output for rows `rows`, without recording a graph; an
    /// error for `op` unless it has one row per input row (the outputs are
    /// gathered along dim 0).
    pub(crate) fn predict(&self, op: &'static str, input: &Tensor, rows: Range<usize>) -> Result<Option<Tensor>> {
        if rows.is_empty() {
            return Ok(None);
        }
        let _grad_mode = brasa_autograd::no_grad();
        let x = input.narrow(0, rows.start, rows.len())?.to(self.device)?;
        let output = self.module.forward(&Var::new(x))?.tensor().clone();
        if output.dims().first() != Some(&rows.len()) {
            return Err(ParallelError::invalid(
                op,
                format!(
                    "the model's output for {} input rows has shape {:?}; the outputs are gathered along dim 0, so \
                     the model must return one row per input row",
                    rows.len(),
                    output.dims()
                ),
            ));
        }
        Ok(Some(output))
    }

    fn loss<F>(&self, input: &Tensor, target: &Tensor, rows: Range<usize>, loss_fn: &F) -> Result<Var>
    where
        F: Fn(&Var, &Tensor) -> brasa_nn::Result<Var> + Sync,
    {
        // Rows already on this device are used in place (no copy).
        let x = input.narrow(0, rows.start, rows.len())?.to(self.device)?;
        let y = target.narrow(0, rows.start, rows.len())?.to(self.device)?;
        let output = self.module.forward(&Var::new(x))?;
        let loss = loss_fn(&output, &y)?;
        if loss.numel() != 1 {
            return Err(ParallelError::invalid(
                "DataParallel",
                format!("the loss must be one number, got shape {:?} (reduce it with a mean or sum)", loss.dims()),
            ));
        }
        Ok(loss)
    }

    /// The collective half of a step, on every device at once: sums the
    /// gradients into their owners' shards, clips them by their global
    /// norm if configured, steps this device's optimizer on its shard,
    /// gathers every shard's new values into every replica, copies device
    /// 0's buffers to the others and clears the gradients. Returns the
    /// gradient norm when clipping is on.
    pub(crate) fn reduce_and_update<O: Optimizer>(
        &mut self,
        comm: &Communicator,
        layout: &FlatLayout,
        config: &DataParallelConfig,
        optimizer: Option<&mut O>,
    ) -> Result<Option<f64>> {
        let _range = brasa_profile::record_function(format!("DataParallel: optimizer step ({})", self.device));
        let _grad_mode = brasa_autograd::no_grad();
        let works: Vec<Work> = self
            .grad_shards
            .iter()
            .zip(&self.flat_grads)
            .map(|(shard, flat)| comm.reduce_scatter_async(shard, flat, ReduceOp::Sum))
            .collect();
        wait_all(works)?;
        for (var, grad) in self.owned.iter().zip(&self.owned_grads) {
            var.set_grad(Some(grad.clone()))?;
        }
        let norm = match config.max_grad_norm {
            Some(max_norm) => Some(crate::sharding::clip::clip_grad_norm(comm, &self.owned, max_norm)?),
            None => None,
        };
        if let Some(optimizer) = optimizer {
            optimizer.step()?;
        }
        let mut works = Vec::with_capacity(self.flat_params.len());
        for (group, flat) in self.flat_params.iter().enumerate() {
            let shard = layout.shard(group, self.rank);
            // In place: this device's shard is its own slot of the output.
            works.push(comm.all_gather_async(flat, &flat.narrow(0, shard.start, shard.len())?));
        }
        wait_all(works)?;
        if config.broadcast_buffers && comm.world_size() > 1 {
            self.broadcast_buffers(comm)?;
        }
        self.zero_grads()?;
        Ok(norm)
    }

    fn broadcast_buffers(&self, comm: &Communicator) -> Result<()> {
        for buffer in &self.buffers {
            if buffer.is_contiguous() {
                comm.broadcast(buffer, 0)?;
            } else {
                let staged = buffer.contiguous()?;
                comm.broadcast(&staged, 0)?;
                buffer.copy_(&staged)?;
            }
        }
        Ok(())
    }
}

/// Waits for every work (none is left running on buffers that the caller
/// may reuse) and returns the first failure.
fn wait_all(works: Vec<Work>) -> Result<()> {
    let mut first = Ok(());
    for work in works {
        let outcome = work.wait();
        if first.is_ok() {
            first = outcome;
        }
    }
    first
}

/// The weight of a replica's loss in the full batch's: its share of the
/// rows for a mean, 1 for a sum.
pub(crate) fn loss_weight(reduction: LossReduction, rows: usize, batch: usize) -> f64 {
    match reduction {
        LossReduction::Mean => rows as f64 / batch as f64,
        LossReduction::Sum => 1.0,
    }
}
