//! [`DataParallel`]: one process, several devices, one model replica per
//! device, one optimizer step per batch — PyTorch's `nn.DataParallel`, but
//! balanced, so that device 0 carries no more than the others.
//!
//! PyTorch's `DataParallel` re-replicates the module on every forward,
//! gathers every output to device 0, computes the loss there, sums the
//! gradients there and steps the optimizer there: device 0 holds the
//! outputs, the loss, the reduced gradients, the whole optimizer state and
//! the master weights (its docs recommend DDP even on one machine). Here:
//!
//! - **Replicas are built once** (from a model factory called once per
//!   device) and kept; replica 0's initial values are copied to the others,
//!   so they start equal whatever the factory drew.
//! - **The batch is scattered along dim 0** like `torch.chunk`: chunks of
//!   `ceil(batch / devices)` rows in device order, the last one smaller, and
//!   devices past the last chunk sit the batch out ([`chunk_sizes`]: 10
//!   rows over 4 devices are 3, 3, 3, 1). Rows that already live on a
//!   device are used in place.
//! - **Forward, the loss and backward run in every replica**, each on its
//!   own thread and rayon pool; nothing is gathered to device 0. Each
//!   replica's loss is weighted by its share of the rows, so the summed
//!   gradients and the returned loss are the full batch's mean (or sum,
//!   with [`LossReduction::Sum`]), even when the batch does not divide.
//! - **The optimizer step is sharded by element** (ZeRO-1 across devices):
//!   every replica keeps its trainable parameters and gradients in flat
//!   per-dtype buffers (backward accumulates straight into them), device
//!   `r` owns the `r`-th equal slice of every buffer, a reduce-scatter sums
//!   the gradients into their owners, each owner's optimizer updates its
//!   slice (so optimizer state is spread evenly, not piled on device 0),
//!   and an all-gather brings the new values to every replica. The
//!   collectives run on an in-process [`Communicator`] group.
//!
//! The optimizer comes from a factory called once per device with the
//! parameter slices that device owns: 1-D views, each a piece of one
//! parameter. Element-wise optimizers (`Sgd`, `Adam`, `AdamW`) then give
//! exactly the single-device result; an optimizer that needs whole
//! parameters (a per-parameter norm, as in LAMB) does not fit this design.
//!
//! ```
//! use brasa_nn::functional::cross_entropy;
//! use brasa_nn::optim::{Adam, AdamConfig};
//! use brasa_nn::{Linear, Relu, Sequential};
//! use brasa_parallel::{ensure_host_devices, DataParallel};
//! use brasa_tensor::{DType, Device, Tensor};
//!
//! ensure_host_devices(2)?;
//! let mut dp = DataParallel::new(
//!     &[Device::cpu(0), Device::cpu(1)],
//!     |device| Ok(Sequential::new().push(Linear::new(8, 16, device)?).push(Relu).push(Linear::new(16, 3, device)?)),
//!     |params| Adam::new(params, AdamConfig { lr: 1e-2, ..Default::default() }),
//! )?;
//! let x = Tensor::randn([30, 8], DType::F32)?;
//! let y = Tensor::from_vec((0..30).map(|i| i % 3).collect::<Vec<i64>>(), [30])?;
//! let first = dp.step(&x, &y, cross_entropy)?; // full-batch mean loss; the optimizer stepped
//! for _ in 0..30 {
//!     dp.step(&x, &y, cross_entropy)?;
//! }
//! assert!(dp.evaluate(&x, &y, cross_entropy)? < first);
//! # Ok::<(), brasa_parallel::ParallelError>(())
//! ```
//!
//! [`DataParallel::step`] is [`DataParallel::forward_backward`] followed by
//! [`DataParallel::optimizer_step`]; call `forward_backward` several times
//! before one `optimizer_step` to accumulate gradients over micro-batches
//! (they add up, as repeated `backward` calls do in PyTorch).
//!
//! Failures are errors naming the replica and device, never a hang: a
//! replica whose forward, loss or backward fails (or panics) makes
//! `forward_backward` return that error after the others finished, with
//! the accumulated gradients discarded and the `DataParallel` still usable.
//! A failure inside the collective half (`optimizer_step`) makes every
//! device leave the group at once; replicas may then disagree, so the
//! `DataParallel` refuses further steps.
//!
//! Memory per device: the parameters and their gradients (each a flat
//! buffer), `1/devices` of the summed gradients and of the optimizer state,
//! the activations of its rows, and during backward the transient gradient
//! of one parameter before it is added into the flat buffer. Nothing else
//! lands on device 0, except the caller's batch if it lives there (rows
//! already on a device are not copied). `parallel.dp_device0_share` in
//! `cargo xtask bench` measures device 0's peak over the others' mean.
//!
//! Every trainable parameter receives a gradient each step (zero when the
//! model did not use it), so an optimizer with momentum or weight decay
//! still moves it, as with DDP. Buffers (batch-norm statistics) are copied
//! from device 0 to the others after each optimizer step, as
//! `DistributedDataParallel` does; dropout draws differ from a single-device
//! run.

mod chunks;
mod replica;

pub use chunks::chunk_sizes;

use crate::communicator::CommOptions;
use crate::error::{ParallelError, Result};
use crate::sharding::layout::FlatLayout;
use brasa_autograd::Var;
use brasa_nn::optim::Optimizer;
use brasa_nn::{LoadReport, Module, ModuleExt, StateDict};
use brasa_tensor::{Device, ErrorBox, SharedError, Tensor};
use replica::{loss_weight, Replica};
use std::ops::Range;

/// How a replica's loss relates to the full batch's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LossReduction {
    /// The loss is a mean over the rows (PyTorch's default reduction): each
    /// replica's loss is weighted by its share of the rows.
    #[default]
    Mean,
    /// The loss is a sum over the rows: replicas' losses add up as they are.
    Sum,
}

/// Settings of a [`DataParallel`].
#[derive(Clone, Debug)]
pub struct DataParallelConfig {
    /// The collectives' options (how long a device waits for the others).
    pub comm: CommOptions,
    /// Threads each device's tensor ops may use (a rayon pool per device).
    /// Default: the machine's cores divided among the devices, at least 1.
    pub threads_per_device: Option<usize>,
    /// Whether the loss closure returns a mean (default) or a sum over rows.
    pub loss_reduction: LossReduction,
    /// Clip the summed gradients to this total 2-norm before the optimizer
    /// step (PyTorch's `clip_grad_norm_`, over all devices' shards together).
    pub max_grad_norm: Option<f64>,
    /// Copy device 0's buffers (batch-norm running statistics) to the other
    /// replicas after every optimizer step (default true).
    pub broadcast_buffers: bool,
}

impl Default for DataParallelConfig {
    fn default() -> DataParallelConfig {
        DataParallelConfig {
            comm: CommOptions::default(),
            threads_per_device: None,
            loss_reduction: LossReduction::Mean,
            max_grad_norm: None,
            broadcast_buffers: true,
        }
    }
}

/// A model trained on several devices of one process; see the module docs.
///
/// `M` is the model, `O` the optimizer type each device runs on the
/// parameter elements it owns.
pub struct DataParallel<M, O> {
    replicas: Vec<Replica<M>>,
    /// Device `rank`'s optimizer, over the elements it owns (`None` when it
    /// owns none). Apart from the replicas: an optimizer is `Send` but need
    /// not be `Sync`, and the forward phase shares the replicas.
    optimizers: Vec<Option<O>>,
    pools: Vec<rayon::ThreadPool>,
    layout: FlatLayout,
    config: DataParallelConfig,
    /// Why the group can no longer step, after a failed collective phase.
    broken: Option<ParallelError>,
    last_grad_norm: Option<f64>,
}

impl<M, O> std::fmt::Debug for DataParallel<M, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let devices: Vec<Device> = self.replicas.iter().map(|r| r.device).collect();
        f.debug_struct("DataParallel")
            .field("devices", &devices)
            .field("parameters", &self.layout.slots.len())
            .field("broken", &self.broken)
            .finish()
    }
}

impl<M: Module, O: Optimizer> DataParallel<M, O> {
    /// A `DataParallel` over `devices` (distinct host devices, rank `i` on
    /// `devices[i]`; see [`crate::ensure_host_devices`]) with the default
    /// [`DataParallelConfig`]. `make_model(device)` builds one replica,
    /// with every parameter and buffer on `device`; `make_optimizer(params)`
    /// builds the optimizer of the parameter slices one device owns.
    pub fn new(
        devices: &[Device],
        make_model: impl Fn(Device) -> brasa_nn::Result<M>,
        make_optimizer: impl Fn(Vec<Var>) -> brasa_nn::Result<O>,
    ) -> Result<DataParallel<M, O>> {
        Self::with_config(devices, make_model, make_optimizer, DataParallelConfig::default())
    }

    /// [`DataParallel::new`] with `config`.
    pub fn with_config(
        devices: &[Device],
        make_model: impl Fn(Device) -> brasa_nn::Result<M>,
        make_optimizer: impl Fn(Vec<Var>) -> brasa_nn::Result<O>,
        config: DataParallelConfig,
    ) -> Result<DataParallel<M, O>> {
        const OP: &str = "DataParallel::new";
        if let Some(max_norm) = config.max_grad_norm {
            if max_norm.is_nan() || max_norm < 0.0 {
                return Err(ParallelError::invalid(OP, format!("max_grad_norm must be >= 0, got {max_norm}")));
            }
        }
        if config.threads_per_device == Some(0) {
            return Err(ParallelError::invalid(OP, "threads_per_device must be at least 1"));
        }
        // Checks the devices (distinct host devices) before anything is built.
        let comms = crate::launch::group_on_devices(devices, &config.comm)?;
        let world = devices.len();
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let threads = config.threads_per_device.unwrap_or((cores / world).max(1));
        let pools = devices
            .iter()
            .map(|device| {
                let name = device.to_string();
                let thread_prefix = format!("brasa-dp-{name}-worker");
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(move |i| format!("{thread_prefix}-{i}"))
                    .build()
                    .map_err(|e| ParallelError::Spawn {
                        op: OP,
                        what: format!("a rayon pool for {name}"),
                        source: SharedError::new(e),
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        let models = devices
            .iter()
            .enumerate()
            .map(|(rank, &device)| {
                let model = make_model(device).map_err(|e| replica_error(OP, rank, device, e.into()))?;
                check_placement(&model, rank, device)?;
                Ok(model)
            })
            .collect::<Result<Vec<M>>>()?;
        let reference: Vec<(String, Var)> = models[0].named_parameters();
        let reference_buffers = models[0].named_buffers();
        for (rank, model) in models.iter().enumerate().skip(1) {
            check_same_structure(model, &reference, &reference_buffers, rank, devices[rank])?;
        }
        let trainable: Vec<_> = reference
            .iter()
            .filter(|(_, p)| p.requires_grad())
            .map(|(name, p)| (name.clone(), p.dtype(), p.dims().to_vec()))
            .collect();
        let layout = FlatLayout::new(&trainable, world);
        let mut replicas: Vec<Replica<M>> = Vec::with_capacity(world);
        for ((rank, model), comm) in models.into_iter().enumerate().zip(comms) {
            let device = devices[rank];
            if rank > 0 {
                // Frozen parameters and buffers start as replica 0's too.
                copy_untrained(&model, &replicas[0].module).map_err(|e| replica_error(OP, rank, device, e))?;
            }
            let replica = Replica::new(rank, device, model, comm, &layout, replicas.first())
                .map_err(|e| replica_error(OP, rank, device, e))?;
            replicas.push(replica);
        }
        let mut optimizers = Vec::with_capacity(world);
        for replica in &replicas {
            optimizers.push(if replica.owned.is_empty() {
                None
            } else {
                let optimizer = make_optimizer(replica.owned.clone())
                    .map_err(|e| replica_error(OP, replica.rank, replica.device, e.into()))?;
                Some(optimizer)
            });
        }
        Ok(DataParallel { replicas, optimizers, pools, layout, config, broken: None, last_grad_norm: None })
    }

    /// One training step on a batch: [`DataParallel::forward_backward`]
    /// then [`DataParallel::optimizer_step`]. Returns the full batch's loss.
    ///
    /// `loss_fn(output, target)` gets one replica's output and its rows of
    /// `target` and returns a one-element loss: a mean over its rows (or a
    /// sum, with [`LossReduction::Sum`]).
    pub fn step<F>(&mut self, input: &Tensor, target: &Tensor, loss_fn: F) -> Result<f64>
    where
        F: Fn(&Var, &Tensor) -> brasa_nn::Result<Var> + Sync,
    {
        let loss = self.forward_backward(input, target, loss_fn)?;
        self.optimizer_step()?;
        Ok(loss)
    }

    /// Scatters `input` and `target` along dim 0 (like `torch.chunk`; see
    /// [`chunk_sizes`]) and runs forward, `loss_fn` and backward in every
    /// replica at once, each on its own thread. Gradients accumulate until
    /// [`DataParallel::optimizer_step`]. Returns the full batch's loss: the
    /// replicas' losses weighted by their share of the rows (summed, with
    /// [`LossReduction::Sum`]).
    ///
    /// A replica that fails makes this an error naming it (the lowest
    /// failing rank's), and the accumulated gradients are discarded.
    pub fn forward_backward<F>(&mut self, input: &Tensor, target: &Tensor, loss_fn: F) -> Result<f64>
    where
        F: Fn(&Var, &Tensor) -> brasa_nn::Result<Var> + Sync,
    {
        const OP: &str = "DataParallel::forward_backward";
        self.check_usable(OP)?;
        let (batch, rows) = self.split(OP, input, Some(target))?;
        let reduction = self.config.loss_reduction;
        let replicas: Vec<&Replica<M>> = self.replicas.iter().collect();
        let outcomes = run_on_devices(&self.pools, replicas, |rank, replica| {
            let rows = rows[rank].clone();
            let weight = loss_weight(reduction, rows.len(), batch);
            let loss = replica.forward_backward(input, target, rows, weight, &loss_fn)?;
            Ok(loss * weight)
        });
        match self.first_failure(OP, outcomes) {
            Ok(losses) => Ok(losses.iter().sum()),
            Err(error) => {
                // No partial batch may reach the optimizer.
                for replica in &self.replicas {
                    replica.zero_grads().map_err(|e| replica_error(OP, replica.rank, replica.device, e))?;
                }
                Err(error)
            }
        }
    }

    /// Sums the accumulated gradients over the replicas, clips them if
    /// configured, steps each device's optimizer on the elements it owns,
    /// brings the new values to every replica, copies device 0's buffers to
    /// the others, and clears the gradients.
    ///
    /// A failure here (a device's optimizer, a collective) makes every device
    /// leave the group at once; the error names the device where it started,
    /// and the `DataParallel` refuses further work, since replicas may now
    /// differ.
    pub fn optimizer_step(&mut self) -> Result<()> {
        const OP: &str = "DataParallel::optimizer_step";
        self.check_usable(OP)?;
        let mut work = Vec::with_capacity(self.replicas.len());
        for (replica, optimizer) in self.replicas.iter_mut().zip(&mut self.optimizers) {
            let comm = replica.comm.take();
            work.push((replica, optimizer.as_mut(), comm));
        }
        let layout = &self.layout;
        let config = &self.config;
        let outcomes = run_on_devices(&self.pools, work, |_, (replica, optimizer, comm)| {
            let comm = comm.ok_or_else(|| ParallelError::invalid(OP, "the device's communicator is gone"))?;
            // On failure `comm` is dropped here: the device leaves the group
            // and the others' collectives fail at once instead of waiting.
            let norm = replica.reduce_and_update(&comm, layout, config, optimizer)?;
            Ok((comm, norm))
        });
        let outcomes = match self.first_failure(OP, outcomes) {
            Ok(outcomes) => outcomes,
            Err(error) => {
                self.broken = Some(error.clone());
                return Err(error);
            }
        };
        for (replica, (comm, norm)) in self.replicas.iter_mut().zip(outcomes) {
            replica.comm = Some(comm);
            self.last_grad_norm = norm;
        }
        Ok(())
    }

    /// Discards the gradients accumulated by [`DataParallel::forward_backward`].
    pub fn zero_grad(&mut self) -> Result<()> {
        for replica in &self.replicas {
            replica
                .zero_grads()
                .map_err(|e| replica_error("DataParallel::zero_grad", replica.rank, replica.device, e))?;
        }
        Ok(())
    }

    /// The full batch's `metric` (a mean over rows, or a sum with
    /// [`LossReduction::Sum`]) computed in every replica at once without
    /// recording a graph, combined as in [`DataParallel::forward_backward`].
    pub fn evaluate<F>(&self, input: &Tensor, target: &Tensor, metric: F) -> Result<f64>
    where
        F: Fn(&Var, &Tensor) -> brasa_nn::Result<Var> + Sync,
    {
        const OP: &str = "DataParallel::evaluate";
        let (batch, rows) = self.split(OP, input, Some(target))?;
        let reduction = self.config.loss_reduction;
        let replicas: Vec<&Replica<M>> = self.replicas.iter().collect();
        let outcomes = run_on_devices(&self.pools, replicas, |rank, replica| {
            let rows = rows[rank].clone();
            let weight = loss_weight(reduction, rows.len(), batch);
            Ok(replica.evaluate(input, target, rows, &metric)? * weight)
        });
        Ok(self.first_failure(OP, outcomes)?.iter().sum())
    }

    /// The model's output for the whole batch, gathered on device 0: the
    /// shape of PyTorch's `nn.DataParallel(model)(input)`, for evaluation
    /// and metrics. `input` is scattered along dim 0 as for training (see
    /// [`chunk_sizes`]; a batch smaller than the number of devices leaves
    /// the last ones idle), every replica runs its forward at once on its
    /// own thread and device, and the outputs are concatenated along dim 0
    /// on the first device, in row order.
    ///
    /// It runs without recording a graph (as under `no_grad`): the output
    /// has no gradient history and nothing accumulates into the gradients;
    /// training goes through [`DataParallel::step`]. Replicas run in their
    /// current mode (see [`DataParallel::set_training`]: call it with
    /// `false` first for dropout and batch-norm evaluation behaviour).
    /// [`DataParallel::predict`] gathers on another device.
    ///
    /// A 0-d or empty `input`, rows the model refuses (a wrong feature
    /// size, named by the replica that failed), or an output without one
    /// row per input row are errors that say so.
    pub fn forward(&self, input: &Tensor) -> Result<Tensor> {
        self.gather_outputs("DataParallel::forward", input, self.replicas[0].device)
    }

    /// The model's output for `input` (scattered as for training, computed
    /// in every replica without recording a graph), concatenated along dim
    /// 0 on `device`. Only this gathered output lands on one device.
    /// [`DataParallel::forward`] is this on device 0.
    pub fn predict(&self, input: &Tensor, device: Device) -> Result<Tensor> {
        self.gather_outputs("DataParallel::predict", input, device)
    }

    /// [`DataParallel::predict`] for `op` (named in errors).
    fn gather_outputs(&self, op: &'static str, input: &Tensor, device: Device) -> Result<Tensor> {
        let (_, rows) = self.split(op, input, None)?;
        let replicas: Vec<&Replica<M>> = self.replicas.iter().collect();
        let outcomes =
            run_on_devices(&self.pools, replicas, |rank, replica| replica.predict(op, input, rows[rank].clone()));
        let outputs = self.first_failure(op, outcomes)?;
        let moved = outputs.into_iter().flatten().map(|t| t.to(device)).collect::<brasa_tensor::Result<Vec<_>>>()?;
        let parts: Vec<&Tensor> = moved.iter().collect();
        Ok(Tensor::cat(&parts, 0)?)
    }

    /// The devices, in rank order.
    pub fn devices(&self) -> Vec<Device> {
        self.replicas.iter().map(|r| r.device).collect()
    }

    /// The number of devices.
    pub fn world_size(&self) -> usize {
        self.replicas.len()
    }

    /// Replica 0, the model to evaluate, save or inspect (every replica
    /// holds the same values after each optimizer step).
    pub fn module(&self) -> &M {
        &self.replicas[0].module
    }

    /// The replica on device `rank`.
    pub fn replica(&self, rank: usize) -> Option<&M> {
        self.replicas.get(rank).map(|r| &r.module)
    }

    /// The optimizer of device `rank` (`None` when it owns no element, in a
    /// model with fewer elements than devices).
    pub fn optimizer(&self, rank: usize) -> Option<&O> {
        self.optimizers.get(rank).and_then(Option::as_ref)
    }

    /// The parameter elements each device owns and updates (padding
    /// excluded), in rank order: equal up to one element per dtype.
    pub fn owned_elements(&self) -> Vec<usize> {
        (0..self.replicas.len()).map(|rank| self.layout.owned_elements(rank)).collect()
    }

    /// The learning rate (the first device's that has an optimizer; all are
    /// kept equal by [`DataParallel::set_lr`]).
    pub fn lr(&self) -> Option<f64> {
        self.optimizers.iter().flatten().next().map(|o| o.lr())
    }

    /// Sets every device's learning rate (schedules call this between steps).
    /// A rate the optimizers refuse (NaN, infinite, negative) is an error,
    /// and then no device's rate changes.
    pub fn set_lr(&mut self, lr: f64) -> Result<()> {
        for optimizer in self.optimizers.iter_mut().flatten() {
            optimizer.set_lr(lr)?;
        }
        Ok(())
    }

    /// The total gradient norm before clipping, measured at the last
    /// optimizer step when [`DataParallelConfig::max_grad_norm`] is set.
    pub fn last_grad_norm(&self) -> Option<f64> {
        self.last_grad_norm
    }

    /// Sets every replica's train/eval mode.
    pub fn set_training(&mut self, training: bool) {
        for replica in &mut self.replicas {
            replica.module.set_training(training);
        }
    }

    /// Loads `dict` into every replica (see [`ModuleExt::load_state_dict`]);
    /// returns replica 0's report.
    pub fn load_state_dict(&self, dict: &StateDict, strict: bool) -> Result<LoadReport> {
        let mut first = None;
        for replica in &self.replicas {
            let report = replica
                .module
                .load_state_dict(dict, strict)
                .map_err(|e| replica_error("DataParallel::load_state_dict", replica.rank, replica.device, e.into()))?;
            first.get_or_insert(report);
        }
        first.ok_or_else(|| ParallelError::invalid("DataParallel::load_state_dict", "no replica"))
    }

    /// The gradients accumulated so far, summed over replicas, by parameter
    /// name, on device 0: what the next optimizer step will apply (before
    /// clipping). For inspection and tests: unlike training, this puts a
    /// full copy of the gradients on device 0. The tensors are fresh copies:
    /// neither this call nor changes to its result touch the gradients the
    /// optimizer step will use.
    pub fn gradients(&self) -> Result<Vec<(String, Tensor)>> {
        const OP: &str = "DataParallel::gradients";
        let device = self.replicas[0].device;
        let mut out = Vec::with_capacity(self.layout.slots.len());
        for (index, slot) in self.layout.slots.iter().enumerate() {
            // A new buffer, never the live gradient view (`contiguous` would
            // return the view itself, and the sum would land in replica 0's
            // gradient, applying the others' share twice).
            let ours = &self.replicas[0].grad_views[index];
            let sum = ours.zeros_like()?;
            sum.copy_(ours)?;
            for replica in &self.replicas[1..] {
                let theirs = replica.grad_views[index]
                    .to(device)
                    .map_err(|e| replica_error(OP, replica.rank, replica.device, ParallelError::from(e)))?;
                sum.add_(&theirs)?;
            }
            out.push((slot.name.clone(), sum));
        }
        Ok(out)
    }

    fn check_usable(&self, op: &'static str) -> Result<()> {
        match &self.broken {
            Some(cause) => Err(ParallelError::Unusable { op, source: ErrorBox::new(cause.clone()) }),
            None => Ok(()),
        }
    }

    /// Checks the batch and returns its size and each device's rows.
    fn split(&self, op: &'static str, input: &Tensor, target: Option<&Tensor>) -> Result<(usize, Vec<Range<usize>>)> {
        let rows_of = |t: &Tensor, what: &str| -> Result<usize> {
            t.dims().first().copied().ok_or_else(|| {
                ParallelError::invalid(op, format!("the {what} is 0-d; it needs a batch dimension (dim 0) to scatter"))
            })
        };
        let batch = rows_of(input, "input")?;
        if let Some(target) = target {
            let target_rows = rows_of(target, "target")?;
            if target_rows != batch {
                return Err(ParallelError::invalid(
                    op,
                    format!(
                        "the input has {batch} rows (shape {:?}) but the target {target_rows} (shape {:?})",
                        input.dims(),
                        target.dims()
                    ),
                ));
            }
        }
        if batch == 0 {
            return Err(ParallelError::invalid(op, "the batch is empty"));
        }
        let mut start = 0;
        let rows = chunk_sizes(batch, self.replicas.len())
            .into_iter()
            .map(|len| {
                start += len;
                start - len..start
            })
            .collect();
        Ok((batch, rows))
    }

    /// Every device's value, or the error that best explains a failure:
    /// the lowest rank's own failure before a peer's report that someone
    /// left or timed out, named by its replica and device.
    fn first_failure<T>(&self, op: &'static str, outcomes: Vec<Result<T>>) -> Result<Vec<T>> {
        let failures: Vec<(usize, &ParallelError)> =
            outcomes.iter().enumerate().filter_map(|(rank, o)| o.as_ref().err().map(|e| (rank, e))).collect();
        let culprit = ParallelError::root_cause(failures.iter().map(|(_, e)| *e)).map(|at| failures[at].0);
        let Some(culprit) = culprit else {
            return Ok(outcomes.into_iter().filter_map(|o| o.ok()).collect());
        };
        let others: Vec<usize> = failures.iter().map(|(rank, _)| *rank).filter(|&r| r != culprit).collect();
        let error = outcomes.into_iter().nth(culprit).and_then(|o| o.err());
        let error = error.unwrap_or_else(|| ParallelError::invalid(op, "a replica failed"));
        let device = self.replicas[culprit].device;
        Err(ParallelError::Replica { op, rank: culprit, device, source: ErrorBox::new(error), others })
    }
}

/// `error` from replica `rank`, kept whole inside a [`ParallelError::Replica`].
fn replica_error(op: &'static str, rank: usize, device: Device, error: ParallelError) -> ParallelError {
    ParallelError::Replica { op, rank, device, source: ErrorBox::new(error), others: Vec::new() }
}

/// Runs `f(rank, item)` for every item at once, each on its own thread
/// inside device `rank`'s rayon pool; returns the outcomes in rank order
/// (a panic as [`ParallelError::RankPanicked`]).
fn run_on_devices<T, R, F>(pools: &[rayon::ThreadPool], items: Vec<T>, f: F) -> Vec<Result<R>>
where
    T: Send,
    R: Send,
    F: Fn(usize, T) -> Result<R> + Sync,
{
    std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .into_iter()
            .zip(pools)
            .enumerate()
            .map(|(rank, (item, pool))| {
                let f = &f;
                std::thread::Builder::new()
                    .name(format!("brasa-dp-replica{rank}"))
                    .spawn_scoped(scope, move || pool.install(|| f(rank, item)))
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, handle)| match handle {
                Ok(handle) => handle.join().unwrap_or_else(|payload| {
                    Err(ParallelError::RankPanicked { rank, message: crate::launch::panic_message(payload.as_ref()) })
                }),
                Err(e) => Err(ParallelError::Spawn {
                    op: "DataParallel",
                    what: format!("replica {rank}'s thread"),
                    source: SharedError::new(e),
                }),
            })
            .collect()
    })
}

/// Errors unless every parameter and buffer of `model` is on `device`.
fn check_placement<M: Module>(model: &M, rank: usize, device: Device) -> Result<()> {
    let params = model.named_parameters().into_iter().map(|(name, p)| (name, p.device(), "parameter"));
    let buffers = model.named_buffers().into_iter().map(|(name, b)| (name, b.device(), "buffer"));
    for (name, on, what) in params.chain(buffers) {
        if on != device {
            return Err(ParallelError::invalid(
                "DataParallel::new",
                format!(
                    "replica {rank}: {what} `{name}` is on {on}, not {device}; the model factory must build \
                     everything on the device it is given"
                ),
            ));
        }
    }
    Ok(())
}

/// Errors unless `model` has the same parameters and buffers (names,
/// shapes, dtypes, trainability) as replica 0.
fn check_same_structure<M: Module>(
    model: &M,
    reference: &[(String, Var)],
    reference_buffers: &[(String, Tensor)],
    rank: usize,
    device: Device,
) -> Result<()> {
    let describe = |dims: &[usize], dtype: brasa_tensor::DType, trainable: bool| {
        format!("{dtype} {dims:?}{}", if trainable { "" } else { " (frozen)" })
    };
    let ours: Vec<(String, String)> = model
        .named_parameters()
        .into_iter()
        .map(|(n, p)| (n, describe(p.dims(), p.dtype(), p.requires_grad())))
        .chain(model.named_buffers().into_iter().map(|(n, b)| (n, describe(b.dims(), b.dtype(), false))))
        .collect();
    let theirs: Vec<(String, String)> = reference
        .iter()
        .map(|(n, p)| (n.clone(), describe(p.dims(), p.dtype(), p.requires_grad())))
        .chain(reference_buffers.iter().map(|(n, b)| (n.clone(), describe(b.dims(), b.dtype(), false))))
        .collect();
    if ours == theirs {
        return Ok(());
    }
    let difference = match ours.iter().zip(&theirs).find(|(a, b)| a != b) {
        Some((a, b)) => format!("it has `{}` ({}) where replica 0 has `{}` ({})", a.0, a.1, b.0, b.1),
        None => format!("it has {} parameters and buffers, replica 0 has {}", ours.len(), theirs.len()),
    };
    Err(ParallelError::invalid(
        "DataParallel::new",
        format!(
            "replica {rank} on {device} differs from replica 0: {difference}; the model factory must build \
             the same model for every device"
        ),
    ))
}

/// Copies `source`'s frozen parameters and buffers into `model`'s (same
/// structure, checked before).
fn copy_untrained<M: Module>(model: &M, source: &M) -> Result<()> {
    let frozen = |m: &M| -> Vec<Tensor> {
        m.parameters().into_iter().filter(|p| !p.requires_grad()).map(|p| p.tensor().clone()).collect()
    };
    for (ours, theirs) in frozen(model).iter().zip(frozen(source).iter()) {
        ours.copy_(theirs)?;
    }
    for ((_, ours), (_, theirs)) in model.named_buffers().iter().zip(source.named_buffers().iter()) {
        ours.copy_(theirs)?;
    }
    Ok(())
}
