//! Fully sharded data parallelism (ZeRO-3): [`FullyShardedDataParallel`],
//! its settings, statistics, backward half and state dicts.

mod backward;
mod config;
mod state_dict;
mod stats;
mod unit;

pub use config::{FsdpConfig, MixedPrecision};
pub use stats::FsdpStats;

use crate::communicator::Communicator;
use crate::error::{ParallelError, Result};
use crate::memory::MemoryBreakdown;
use crate::work::Work;
use brasa_autograd::{checkpoint, in_backward, is_grad_enabled, no_grad, Var};
use brasa_nn::optim::Optimizer;
use brasa_nn::{Module, ModuleExt, Parameters, Sequential, Visitor, VisitorMut, Walk, WalkMut};
use brasa_tensor::memory::{category_scope, MemoryCategory};
use brasa_tensor::{DType, MemoryTarget, MetaDevice, Tensor};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use unit::{lock, swap_parameters, FlatLayout, Gathered, Unit};

/// A unit before sharding: its name, its layer, its parameters.
type UnitParts = (String, Option<Box<dyn Module>>, Vec<(String, Var)>);

/// A model sharded over the ranks of a communicator (ZeRO-3, PyTorch's FSDP): every
/// rank keeps 1/N of the parameters, gradients and optimizer state, and
/// gathers one unit's parameters just before it runs.
///
/// A model is a [`Sequential`] whose layers are the *units* (group layers
/// into one unit with a nested `Sequential`; a transformer's units are its
/// blocks). Each unit's parameters are laid end to end in a flat buffer and
/// cut into N equal shards; rank r keeps shard r as a parameter of its own
/// ([`parameters`](FullyShardedDataParallel::parameters): build the
/// optimizer over these), and the layer holds meta-device stand-ins.
/// Parameters that several layers share (tied weights) form one more unit,
/// gathered for the whole step.
///
/// - **Forward**: a unit's parameters are all-gathered just before it runs
///   (the next unit's all-gather is started while it computes) and freed
///   when it returns ([`FsdpConfig::reshard_after_forward`]); the tensors
///   its backward needs from them are saved as references, not copies.
/// - **Backward**: a unit is gathered again when backward first needs it
///   (the next unit in backward order is prefetched, the order recorded in
///   the first backward and followed afterwards; a change is counted in
///   [`FsdpStats`]); as soon as all its gradients are complete they are
///   reduce-scattered (averaged) to their owners while backward goes on,
///   and the gathered copy is freed. `backward()` returns with every
///   shard's gradient averaged over ranks.
/// - [`no_sync`](FullyShardedDataParallel::no_sync): gradient accumulation
///   without communication; the unsharded gradients are kept and the next
///   synchronised backward reduces their sum (as FSDP does).
/// - [`MixedPrecision`]: bf16 gathered parameters and compute, f32 shards
///   and f32 reduction. [`FsdpConfig::checkpoint`]: each unit under an
///   activation checkpoint (gathered again for the recomputation).
/// - [`clip_grad_norm`](FullyShardedDataParallel::clip_grad_norm): the
///   global norm over every rank's shards. State dicts: this rank's shards
///   ([`sharded_state_dict`](FullyShardedDataParallel::sharded_state_dict))
///   or the whole model gathered on rank 0 under the unwrapped model's
///   names ([`full_state_dict`](FullyShardedDataParallel::full_state_dict)),
///   which loads into an unsharded model and back.
///
/// Per rank, model states are (P + G + K·P)/N plus the gathered units: at
/// most two units' parameters (the running one and the prefetched one) and
/// one unit's unsharded gradient.
///
/// ```
/// use brasa_parallel::{run_in_process, FsdpConfig, FullyShardedDataParallel, LaunchOptions};
/// use brasa_nn::{functional::mse_loss, functional::Reduction, optim::{Adam, AdamConfig, Optimizer}, Linear, Relu, Sequential};
/// use brasa_autograd::Var;
/// use brasa_tensor::{DType, Tensor};
///
/// run_in_process(2, &LaunchOptions::default(), |comm| {
///     let dev = comm.device();
///     let model = Sequential::new().push(Linear::new(8, 16, dev)?).push(Relu).push(Linear::new(16, 4, dev)?);
///     let fsdp = FullyShardedDataParallel::new(model, comm.clone(), FsdpConfig::default())?;
///     let mut opt = Adam::new(fsdp.parameters(), AdamConfig::default())?;   // this rank's shards
///     let x = Var::new(Tensor::randn_on([16, 8], DType::F32, dev)?);
///     mse_loss(&fsdp.forward(&x)?, &Var::new(Tensor::zeros_on([16, 4], DType::F32, dev)?), Reduction::Mean)?.backward()?;
///     opt.step()?;                                   // updates 1/2 of every unit
///     assert!(fsdp.stats().overlap() > 0.0);
///     Ok(())
/// })?;
/// # Ok::<(), brasa_parallel::ParallelError>(())
/// ```
pub struct FullyShardedDataParallel {
    shared: Arc<Shared>,
}

/// What the public handle, the backward nodes and the saved-tensor hooks
/// share.
pub(crate) struct Shared {
    comm: Communicator,
    config: FsdpConfig,
    /// The layers' units in forward order, then the shared unit if any.
    units: Vec<Unit>,
    /// How many of `units` are layers.
    layers: usize,
    step: Mutex<Step>,
    last_stats: Mutex<FsdpStats>,
    no_sync_guards: AtomicUsize,
    /// Where the stand-in parameters live (no memory).
    _meta: MetaDevice,
}

/// The state of the step in progress.
#[derive(Default)]
struct Step {
    stats: FsdpStats,
    /// The shared unit's parameters for the forward in progress.
    shared_vars: Option<Vec<Var>>,
    /// The end-of-backward callback is queued.
    callback_queued: bool,
    pending: Vec<backward::PendingReduce>,
    /// Units in the order this backward first needed them.
    backward_order: Vec<usize>,
    /// The order of the first backward (prefetch follows it).
    recorded_order: Option<Vec<usize>>,
}

impl FullyShardedDataParallel {
    /// Shards `model` (each layer one unit) over `comm`'s ranks. Every rank
    /// must pass the same architecture: parameters are checked (count,
    /// shapes, dtypes) and rank 0's values broadcast first. Every parameter
    /// must require grad, and a layer's parameters share one dtype.
    pub fn new(model: Sequential, comm: Communicator, config: FsdpConfig) -> Result<FullyShardedDataParallel> {
        FullyShardedDataParallel::from_units(model.into_layers(), comm, config)
    }

    /// [`new`](Self::new) from the units themselves, in forward order.
    pub fn from_units(
        units: Vec<Box<dyn Module>>,
        comm: Communicator,
        config: FsdpConfig,
    ) -> Result<FullyShardedDataParallel> {
        const OP: &str = "FullyShardedDataParallel::new";
        if units.is_empty() {
            return Err(ParallelError::invalid(OP, "the model has no layers to shard"));
        }
        // Every parameter of every layer, named as in the unwrapped model.
        let per_layer: Vec<Vec<(String, Var)>> = units
            .iter()
            .enumerate()
            .map(|(i, layer)| layer.named_parameters().into_iter().map(|(n, p)| (format!("{i}.{n}"), p)).collect())
            .collect();
        let all: Vec<(String, Var)> = per_layer.iter().flatten().cloned().collect();
        for (name, param) in &all {
            if !param.requires_grad() {
                return Err(ParallelError::invalid(
                    OP,
                    format!("parameter {name} does not require grad; frozen parameters are not supported by sharding"),
                ));
            }
            if param.device() != comm.device() {
                return Err(ParallelError::invalid(
                    OP,
                    format!(
                        "parameter {name} is on {} but rank {} works on {}; move the model first",
                        param.device(),
                        comm.rank(),
                        comm.device()
                    ),
                ));
            }
        }
        // A parameter in several layers belongs to the shared unit.
        let holders = |param: &Var| per_layer.iter().filter(|l| l.iter().any(|(_, p)| p.same_var(param))).count();
        let mut shared_params: Vec<(String, Var)> = Vec::new();
        for (name, param) in &all {
            if holders(param) > 1 && !shared_params.iter().any(|(_, p)| p.same_var(param)) {
                shared_params.push((name.clone(), param.clone()));
            }
        }
        let own: Vec<Vec<(String, Var)>> = per_layer
            .iter()
            .map(|l| l.iter().filter(|(_, p)| !shared_params.iter().any(|(_, s)| s.same_var(p))).cloned().collect())
            .collect();
        let unique: Vec<(String, Var)> = own.iter().flatten().chain(shared_params.iter()).cloned().collect();
        crate::ddp::verify_same_model(&comm, &unique)?;
        {
            let _no_grad = no_grad();
            for (_, param) in &unique {
                comm.broadcast(param.tensor(), 0)?;
            }
            for layer in &units {
                for (_, buffer) in layer.named_buffers() {
                    comm.broadcast(&buffer, 0)?;
                }
            }
        }
        let meta = MetaDevice::new(MemoryTarget::host(None))?;
        let mut groups: Vec<UnitParts> =
            units.into_iter().zip(own).enumerate().map(|(i, (m, p))| (i.to_string(), Some(m), p)).collect();
        if !shared_params.is_empty() {
            groups.push(("shared".to_string(), None, shared_params));
        }
        let mut built = Vec::with_capacity(groups.len());
        let mut replaced: Vec<(Var, Var)> = Vec::new(); // (original, stand-in)
        for (name, module, params) in groups {
            let dtype = match params.first() {
                Some((_, p)) => p.dtype(),
                None => DType::F32,
            };
            if let Some((bad, p)) = params.iter().find(|(_, p)| p.dtype() != dtype) {
                return Err(ParallelError::invalid(
                    OP,
                    format!(
                        "unit {name} mixes dtypes: parameter {bad} is {} while {} is {dtype}; convert the model to one \
                         dtype (mixed precision is FsdpConfig::mixed_precision)",
                        p.dtype(),
                        params[0].0
                    ),
                ));
            }
            let described: Vec<(String, DType, Vec<usize>)> =
                params.iter().map(|(n, p)| (n.clone(), p.dtype(), p.dims().to_vec())).collect();
            let layout = FlatLayout::new(&described, comm.world_size());
            let shard = shard_of(&params, &layout, comm.rank(), dtype)?;
            let placeholders = params
                .iter()
                .map(|(_, p)| Ok(Var::param(Tensor::zeros_on(p.dims(), dtype, meta.device())?)?))
                .collect::<Result<Vec<Var>>>()?;
            replaced.extend(params.iter().map(|(_, p)| p.clone()).zip(placeholders.iter().cloned()));
            built.push(Unit::new(name, module, layout, placeholders, shard));
        }
        // Every layer now holds stand-ins (its own and the shared unit's).
        let (originals, stand_ins): (Vec<Var>, Vec<Var>) = replaced.into_iter().unzip();
        for unit in &mut built {
            if let Some(module) = unit.module.as_mut() {
                let module = module.get_mut().unwrap_or_else(|e| e.into_inner());
                let present = present_parameters(&**module, &originals);
                let from: Vec<Var> = present.iter().map(|&i| originals[i].clone()).collect();
                let to: Vec<Var> = present.iter().map(|&i| stand_ins[i].clone()).collect();
                swap_parameters(&mut **module, &from, &to)?;
            }
        }
        // Which of the shared unit's parameters each layer holds (its
        // forward swaps those in too).
        if let Some(shared) = built.iter().position(|u| u.module.is_none()) {
            let shared_stand_ins = built[shared].placeholders.clone();
            for unit in &mut built {
                if let Some(module) = unit.module.as_mut() {
                    let module = module.get_mut().unwrap_or_else(|e| e.into_inner());
                    unit.uses_shared = present_parameters(&**module, &shared_stand_ins);
                }
            }
        }
        let layers = built.iter().filter(|u| u.module.is_some()).count();
        Ok(FullyShardedDataParallel {
            shared: Arc::new(Shared {
                comm,
                config,
                units: built,
                layers,
                step: Mutex::new(Step::default()),
                last_stats: Mutex::new(FsdpStats::default()),
                no_sync_guards: AtomicUsize::new(0),
                _meta: meta,
            }),
        })
    }

    /// This rank's shards, one per unit: what the optimizer updates.
    pub fn parameters(&self) -> Vec<Var> {
        self.shared.units.iter().filter(|u| !u.layout.slots.is_empty()).map(|u| u.shard.clone()).collect()
    }

    /// For each of this rank's shards (in [`parameters`](Self::parameters)'
    /// order), a tensor of the shard's shape and dtype holding 1 where the
    /// element belongs to a parameter `select` picks (given its name in the
    /// unwrapped model and its shape) and 0 elsewhere (other parameters,
    /// padding). A shard is a flat slice of a whole unit — matrices, norm
    /// gains and biases together — so settings that differ per parameter
    /// go through such masks: weight decay on the matrices only is
    /// `shard.add_scaled_(-lr * wd, &shard.mul(&mask)?)` before the step.
    pub fn shard_masks(&self, select: impl Fn(&str, &[usize]) -> bool) -> Result<Vec<Tensor>> {
        let _no_grad = no_grad();
        let rank = self.shared.comm.rank();
        let mut masks = Vec::new();
        for unit in self.shared.units.iter().filter(|u| !u.layout.slots.is_empty()) {
            let mask = Tensor::zeros_on([unit.shard_len()], unit.shard.dtype(), unit.shard.device())?;
            let start = unit.shard_range(rank).start;
            for piece in unit.layout.pieces(rank) {
                let slot = &unit.layout.slots[piece.slot];
                if select(&slot.name, &slot.dims) {
                    mask.narrow(0, piece.flat.start - start, piece.flat.len())?.fill_(1.0)?;
                }
            }
            masks.push(mask);
        }
        Ok(masks)
    }

    /// The communicator the model is sharded over.
    pub fn communicator(&self) -> &Communicator {
        &self.shared.comm
    }

    /// The settings it was built with.
    pub fn config(&self) -> &FsdpConfig {
        &self.shared.config
    }

    /// The units' names (`0`, `1`, ..., and `shared` when layers share
    /// parameters) with the unwrapped model's names of their parameters.
    pub fn units(&self) -> Vec<(String, Vec<String>)> {
        self.shared
            .units
            .iter()
            .map(|u| (u.name.clone(), u.layout.slots.iter().map(|s| s.name.clone()).collect()))
            .collect()
    }

    /// Elements of each unit's flat buffer (padded to a multiple of the
    /// world size).
    pub fn unit_numels(&self) -> Vec<usize> {
        self.shared.units.iter().map(|u| u.padded()).collect()
    }

    /// What the last finished step moved and overlapped.
    pub fn stats(&self) -> FsdpStats {
        lock(&self.shared.last_stats).clone()
    }

    /// Runs the model: each unit gathered just before it runs. With grad
    /// mode on, prepares the backward that reduce-scatters the gradients.
    pub fn forward(&self, input: &Var) -> Result<Var> {
        let shared = &self.shared;
        if !in_backward() {
            if lock(&shared.step).callback_queued {
                // The last backward failed before its end (its queued
                // callback was dropped): clear what it left.
                shared.reset_step()?;
            }
            // Whatever a forward without backward left gathered is stale
            // once an optimizer may have stepped.
            shared.release_all()?;
        }
        let grad = is_grad_enabled();
        if let Some(k) = shared.shared_unit() {
            // Under checkpoints the units run without a graph first; each
            // recomputation records the shared parameters anew.
            let vars = shared.param_vars(k, grad && !shared.config.checkpoint)?;
            lock(&shared.step).shared_vars = Some(vars);
        }
        let mut x = input.clone();
        let outcome = (|| {
            for i in 0..shared.layers {
                x = if shared.config.checkpoint && grad {
                    let unit_shared = Arc::clone(shared);
                    checkpoint(move |xs| Ok(unit_shared.unit_forward(i, &xs[0])?), &[&x])?
                } else {
                    shared.unit_forward(i, &x)?
                };
            }
            Ok(())
        })();
        // The graph holds what backward needs of the shared unit.
        lock(&shared.step).shared_vars = None;
        if !grad {
            if let Some(k) = shared.shared_unit() {
                shared.release(k)?;
            }
        }
        outcome.map(|()| x)
    }

    /// Backward passes run while the guard lives accumulate unsharded
    /// gradients locally without communication (gradient accumulation);
    /// the next synchronised backward reduce-scatters their sum. Guards
    /// nest and may be dropped in any order. Costs one unsharded gradient
    /// buffer per unit until then, as in PyTorch's FSDP.
    pub fn no_sync(&self) -> FsdpNoSync<'_> {
        self.shared.no_sync_guards.fetch_add(1, Ordering::AcqRel);
        FsdpNoSync { guards: &self.shared.no_sync_guards }
    }

    /// Scales every rank's shard gradients so that the global L2 norm of
    /// the whole model's gradient is at most `max_norm` (PyTorch's
    /// `FSDP.clip_grad_norm_`); returns that norm before clipping. A
    /// collective: every rank calls it.
    pub fn clip_grad_norm(&self, max_norm: f64) -> Result<f64> {
        if max_norm.is_nan() || max_norm < 0.0 {
            return Err(ParallelError::invalid(
                "FullyShardedDataParallel::clip_grad_norm",
                format!("max_norm must be >= 0, got {max_norm}"),
            ));
        }
        crate::sharding::clip::clip_grad_norm(&self.shared.comm, &self.parameters(), max_norm)
    }

    /// Whether any rank's `local` verdict is true (a collective: every rank
    /// calls it). For a `GradScaler`, whose inf/NaN check sees only this
    /// rank's shards: `scaler.unscale_(&opt)?;` then
    /// `scaler.set_found_inf(&opt, fsdp.any_rank_nonfinite(scaler.found_inf(&opt) == Some(true))?)?;`
    /// so that every rank skips the step when one found an inf.
    pub fn any_rank_nonfinite(&self, local: bool) -> Result<bool> {
        let comm = &self.shared.comm;
        let flag = Tensor::full_on([1], if local { 1.0 } else { 0.0 }, DType::F32, comm.device())?;
        comm.all_reduce(&flag, crate::ReduceOp::Max)?;
        if flag.device().is_meta() {
            return Ok(local);
        }
        Ok(flag.to_vec::<f32>()?[0] > 0.0)
    }

    /// This rank's bytes of parameters (shards and what is gathered now),
    /// gradients (the shards' and unsharded buffers held now) and the
    /// state of `optimizer` (built over [`parameters`](Self::parameters)).
    pub fn memory_breakdown(&self, optimizer: &dyn Optimizer) -> MemoryBreakdown {
        let units = &self.shared.units;
        let mut extra_params = Vec::new();
        let mut extra_grads = Vec::new();
        for unit in units {
            match &*lock(&unit.gathered) {
                Gathered::Ready(full) | Gathered::InFlight { full, .. } => extra_params.push(full.clone()),
                Gathered::Empty => {}
            }
            if let Some(full) = &lock(&unit.grads).full {
                extra_grads.push(full.clone());
            }
        }
        let mut breakdown = MemoryBreakdown::measure(&self.parameters(), &extra_grads, optimizer, 0);
        breakdown.parameters += extra_params.iter().map(|t| t.storage().size_in_bytes()).sum::<usize>();
        breakdown
    }
}

impl Shared {
    fn shared_unit(&self) -> Option<usize> {
        (self.units.len() > self.layers).then_some(self.layers)
    }

    fn has_parameters(&self, i: usize) -> bool {
        !self.units[i].layout.slots.is_empty()
    }

    fn syncing(&self) -> bool {
        self.no_sync_guards.load(Ordering::Acquire) == 0
    }

    /// The compute dtype of gathered parameters.
    fn param_dtype(&self, unit: &Unit) -> DType {
        self.config.mixed_precision.map_or(unit.shard.dtype(), |mp| mp.param_dtype)
    }

    /// Starts gathering unit `i` unless it is gathered or on its way.
    fn launch_gather(&self, i: usize, prefetch: bool) -> Result<()> {
        let unit = &self.units[i];
        let mut gathered = lock(&unit.gathered);
        if !matches!(*gathered, Gathered::Empty) || unit.layout.slots.is_empty() {
            return Ok(());
        }
        let _no_grad = no_grad();
        let full = {
            let _parameters = category_scope(MemoryCategory::Parameter);
            Tensor::zeros_on([unit.padded()], self.param_dtype(unit), self.comm.device())?
        };
        let range = unit.shard_range(self.comm.rank());
        let mine = full.narrow(0, range.start, range.len())?;
        mine.copy_(unit.shard.tensor())?;
        let work = self.comm.all_gather_async(&full, &mine);
        let bytes = full.storage().size_in_bytes();
        {
            let mut step = lock(&self.step);
            step.stats.all_gathers += 1;
            step.stats.all_gather_bytes += bytes;
            if prefetch {
                step.stats.prefetched_bytes += bytes;
            }
        }
        *gathered = Gathered::InFlight { full, work };
        Ok(())
    }

    /// Unit `i`'s gathered parameters, waiting for (or starting) the
    /// all-gather.
    fn gathered(&self, i: usize) -> Result<Tensor> {
        self.launch_gather(i, false)?;
        let unit = &self.units[i];
        let mut gathered = lock(&unit.gathered);
        match std::mem::replace(&mut *gathered, Gathered::Empty) {
            Gathered::Ready(full) => {
                *gathered = Gathered::Ready(full.clone());
                Ok(full)
            }
            Gathered::InFlight { full, work } => {
                self.wait_timed(work)?;
                *gathered = Gathered::Ready(full.clone());
                Ok(full)
            }
            Gathered::Empty => {
                Err(ParallelError::invalid("FullyShardedDataParallel", format!("unit {} was not gathered", unit.name)))
            }
        }
    }

    /// Frees unit `i`'s gathered parameters (after its all-gather, if one
    /// is in flight, finished).
    fn release(&self, i: usize) -> Result<()> {
        let previous = std::mem::replace(&mut *lock(&self.units[i].gathered), Gathered::Empty);
        if let Gathered::InFlight { work, .. } = previous {
            work.wait()?;
        }
        Ok(())
    }

    /// Waits for `work`, counting the time as waited.
    fn wait_timed(&self, work: Work) -> Result<()> {
        let started = Instant::now();
        work.wait()?;
        lock(&self.step).stats.waited += started.elapsed();
        Ok(())
    }

    fn release_all(&self) -> Result<()> {
        (0..self.units.len()).try_for_each(|i| self.release(i))
    }

    /// Unit `i`'s parameters as views of its gathered buffer: recorded
    /// (their gradients go to the unit's reduction) when `record`.
    fn param_vars(self: &Arc<Self>, i: usize, record: bool) -> Result<Vec<Var>> {
        if self.units[i].layout.slots.is_empty() {
            return Ok(Vec::new());
        }
        let full = self.gathered(i)?;
        let unit = &self.units[i];
        unit.layout
            .slots
            .iter()
            .enumerate()
            .map(|(k, slot)| {
                let dims: Vec<isize> = slot.dims.iter().map(|&d| d as isize).collect();
                let view = full.narrow(0, slot.offset, slot.numel())?.reshape(&dims)?;
                if record {
                    backward::record_param_use(self, i, k, view)
                } else {
                    Ok(Var::new(view))
                }
            })
            .collect()
    }

    /// Runs layer `i` on its gathered parameters.
    fn unit_forward(self: &Arc<Self>, i: usize, input: &Var) -> Result<Var> {
        let grad = is_grad_enabled();
        let unit = &self.units[i];
        if unit.layout.slots.is_empty() && unit.uses_shared.is_empty() {
            // Nothing to gather (an activation, a pooling layer).
            if let Some(module) = &unit.module {
                return Ok(lock(module).forward(input)?);
            }
        }
        let vars = self.param_vars(i, grad)?;
        if self.config.prefetch && !in_backward() {
            if let Some(next) = (i + 1..self.layers).find(|&j| self.has_parameters(j)) {
                self.launch_gather(next, true)?;
            }
        }
        let mut from = unit.placeholders.clone();
        let mut to = vars;
        let mut watched = vec![i];
        if let Some(k) = self.shared_unit().filter(|_| !unit.uses_shared.is_empty()) {
            let existing = lock(&self.step).shared_vars.clone();
            let shared_vars = match existing {
                Some(vars) => vars,
                // A checkpoint's recomputation, after forward ended.
                None => self.param_vars(k, grad)?,
            };
            for &p in &unit.uses_shared {
                from.push(self.units[k].placeholders[p].clone());
                to.push(shared_vars[p].clone());
            }
            watched.push(k);
        }
        let module = unit.module.as_ref().ok_or_else(|| {
            ParallelError::invalid("FullyShardedDataParallel", format!("unit {} has no layer to run", unit.name))
        })?;
        let output = {
            let mut module = lock(module);
            swap_parameters(&mut **module, &from, &to)?;
            let output = {
                let _hooks = grad.then(|| backward::save_gathered_as_references(self, &watched));
                module.forward(input)
            };
            swap_parameters(&mut **module, &to, &from)?;
            output
        };
        drop(to);
        let last = !(i + 1..self.layers).any(|j| self.has_parameters(j));
        let needed_by_backward = grad && (in_backward() || !self.config.reshard_after_forward || last);
        if !needed_by_backward {
            self.release(i)?;
        }
        Ok(output?)
    }
}

/// The indices of `params` that `module` holds.
fn present_parameters(module: &dyn Module, params: &[Var]) -> Vec<usize> {
    struct Find<'a> {
        params: &'a [Var],
        found: Vec<bool>,
    }
    impl Visitor for Find<'_> {
        fn param(&mut self, _path: &str, param: &Var) {
            if let Some(i) = self.params.iter().position(|p| p.same_var(param)) {
                self.found[i] = true;
            }
        }
    }
    let mut find = Find { params, found: vec![false; params.len()] };
    module.visit(&mut Walk::new(&mut find));
    (0..params.len()).filter(|&i| find.found[i]).collect()
}

/// This rank's shard of `params` laid out by `layout`: a new parameter.
fn shard_of(params: &[(String, Var)], layout: &FlatLayout, rank: usize, dtype: DType) -> Result<Var> {
    let _no_grad = no_grad();
    let device = params.first().map_or(brasa_tensor::Device::CPU, |(_, p)| p.device());
    let _parameters = category_scope(MemoryCategory::Parameter);
    // A unit without parameters keeps a one-element shard nobody trains.
    let len = layout.groups.first().map_or(1, |g| g.shard_len.max(1));
    let shard = Tensor::zeros_on([len], dtype, device)?;
    if !layout.groups.is_empty() {
        let tensors: Vec<Tensor> = params.iter().map(|(_, p)| p.tensor().clone()).collect();
        layout.copy_to_shard(0, rank, &shard, &tensors)?;
    }
    Ok(Var::param(shard)?)
}

/// Guard of [`FullyShardedDataParallel::no_sync`].
pub struct FsdpNoSync<'a> {
    guards: &'a AtomicUsize,
}

impl Drop for FsdpNoSync<'_> {
    fn drop(&mut self) {
        let _ = self.guards.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_sub(1)));
    }
}

/// Forwards a layer's buffers and train/eval flags (not its stand-in
/// parameters) to the walk over the sharded model.
struct BuffersAndFlags<'a, 'w>(&'a mut Walk<'w>);

impl Visitor for BuffersAndFlags<'_, '_> {
    fn buffer(&mut self, path: &str, buffer: &Tensor) {
        self.0.field(path, buffer);
    }
    fn training(&mut self, path: &str, training: &brasa_nn::Training) {
        self.0.field(path, training);
    }
}

struct BuffersAndFlagsMut<'a, 'w>(&'a mut WalkMut<'w>);

impl VisitorMut for BuffersAndFlagsMut<'_, '_> {
    fn buffer(&mut self, path: &str, buffer: &mut Tensor) -> brasa_nn::Result<()> {
        self.0.field(path, buffer)
    }
    fn training(&mut self, path: &str, training: &mut brasa_nn::Training) -> brasa_nn::Result<()> {
        self.0.field(path, training)
    }
}

impl Parameters for FullyShardedDataParallel {
    /// Each unit's shard as the parameter `<unit>.flat_shard`, and the
    /// layers' buffers and flags under their own names.
    fn visit(&self, walk: &mut Walk<'_>) {
        for unit in &self.shared.units {
            walk.field(&format!("{}.flat_shard", unit.name), &unit.shard);
            if let Some(module) = &unit.module {
                let module = lock(module);
                let mut forward = BuffersAndFlags(walk);
                let mut inner = Walk::new(&mut forward);
                inner.field(&unit.name, &**module);
            }
        }
    }

    /// Buffers and flags may change (`train()`, `eval()`, moving buffers);
    /// the shards may not be replaced: sharded parameters cannot be moved
    /// or converted after wrapping (an error naming the unit).
    fn visit_mut(&mut self, walk: &mut WalkMut<'_>) -> brasa_nn::Result<()> {
        for unit in &self.shared.units {
            let mut shard = unit.shard.clone();
            walk.field(&format!("{}.flat_shard", unit.name), &mut shard)?;
            if !shard.same_var(&unit.shard) {
                return Err(ParallelError::invalid(
                    "FullyShardedDataParallel",
                    format!(
                        "unit {}'s shard cannot be replaced (move or convert the model before sharding it)",
                        unit.name
                    ),
                )
                .into());
            }
            if let Some(module) = &unit.module {
                let mut module = lock(module);
                let mut forward = BuffersAndFlagsMut(walk);
                let mut inner = WalkMut::new(&mut forward);
                inner.field(&unit.name, &mut **module)?;
            }
        }
        Ok(())
    }
}

impl Module for FullyShardedDataParallel {
    fn forward(&self, input: &Var) -> brasa_nn::Result<Var> {
        FullyShardedDataParallel::forward(self, input).map_err(Into::into)
    }
}
