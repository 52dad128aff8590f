//! [`DistributedDataParallel`]: PyTorch's DDP for brasa — one model replica
//! per rank, gradients averaged across ranks *during* backward.
//!
//! At construction, parameters and buffers are broadcast from rank 0 (the
//! ranks' models must have the same parameters: the count, then every
//! parameter's shape and dtype in order are checked first, and a difference
//! is an error naming the parameter and both ranks). Each
//! parameter's gradient then lives as a view into a flat bucket (gradient
//! memory 1×); buckets follow the reverse parameter order with a small
//! last bucket (1 MiB, holding the gradients that become ready last, so the
//! all-reduce nothing overlaps is short) and a cap (25 MiB), and are
//! rebuilt once from the order gradients actually became ready. In backward, each bucket's
//! all-reduce starts as soon as its last gradient is accumulated, while
//! backward goes on; `backward()` returns with every gradient averaged.
//!
//! - [`no_sync`](DistributedDataParallel::no_sync): accumulate gradients
//!   locally; the next synchronised backward reduces the sum. Guards are
//!   counted, so they may nest and drop in any order.
//! - Unused parameters are found from brasa's own graph after every forward
//!   and named in an error ([`ParallelError::UnusedParameters`]), unless
//!   [`DdpConfig::find_unused_parameters`] says the model may skip them.
//! - [`join`](DistributedDataParallel::join): ranks with fewer batches than
//!   others finish without hanging, and leave with the same parameters and
//!   buffers as the rank that trained last.
//! - Activation checkpoints ([`brasa_autograd::checkpoint`]) inside the
//!   module: the parameters a checkpoint uses count as reached by the
//!   forward, and get their gradients from its recomputation in backward.
//! - [`Compression::Bf16`]: half the bytes on the wire.
//!
//! ```
//! use brasa_parallel::{run_in_process, DdpConfig, DistributedDataParallel, LaunchOptions};
//! use brasa_nn::{functional::mse_loss, functional::Reduction, optim::{Optimizer, Sgd, SgdConfig}, Linear, ModuleExt};
//! use brasa_autograd::Var;
//! use brasa_tensor::{manual_seed, DType, Tensor};
//!
//! run_in_process(2, &LaunchOptions::default(), |comm| {
//!     let dev = comm.device();
//!     let model = Linear::new(4, 1, dev)?;                     // rank 0's weights win
//!     let ddp = DistributedDataParallel::new(model, comm.clone(), DdpConfig::default())?;
//!     let mut opt = Sgd::new(ddp.module().parameters(), SgdConfig { lr: 0.1, ..Default::default() })?;
//!     let x = Var::new(Tensor::full_on([8, 4], comm.rank() as f64, DType::F32, dev)?);  // this rank's shard
//!     let y = Var::new(Tensor::zeros_on([8, 1], DType::F32, dev)?);
//!     mse_loss(&ddp.forward(&x)?, &y, Reduction::Mean)?.backward()?;  // gradients averaged here
//!     opt.step()?;                                                       // same step on every rank
//!     Ok(ddp.module().weight.tensor().to_vec::<f32>()?)
//! })
//! .map(|weights| assert_eq!(weights[0], weights[1]))?;
//! # Ok::<(), brasa_parallel::ParallelError>(())
//! ```

mod buckets;
mod config;
mod reducer;
mod split_peers;
mod stats;

pub use buckets::{assign_buckets, BUCKET_CAP_BYTES, FIRST_BUCKET_BYTES};
pub use config::{Compression, DdpConfig, ZeroStage};
pub use stats::DdpStats;

use crate::collective::ReduceOp;
use crate::communicator::Communicator;
use crate::error::{ParallelError, Result};
use brasa_autograd::{is_grad_enabled, no_grad, Var};
use brasa_nn::{Module, ModuleExt, Parameters, Walk, WalkMut};
use brasa_tensor::{DType, Tensor};
pub(crate) use reducer::{Reducer, Shard};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// A module replicated on every rank of a communicator, whose gradients are
/// averaged across ranks during backward. See the [crate docs](crate).
pub struct DistributedDataParallel<M: Module> {
    module: M,
    reducer: Arc<Reducer>,
    /// Inside [`DistributedDataParallel::join`].
    joining: AtomicBool,
    /// Inside `join`: the lowest rank still training at the last collective
    /// where one was. Its buffers are broadcast before each forward, and
    /// once every rank joined, its parameters and buffers to every rank.
    join_authority: std::sync::Mutex<Option<usize>>,
    /// The one-number tensor ranks all-reduce to agree on a micro-batch's
    /// outcome under `AutoMicroBatch`, allocated at the first such step.
    split_flag: std::sync::Mutex<Option<Tensor>>,
}

impl<M: Module> DistributedDataParallel<M> {
    /// Wraps `module` (already on `comm.device()`): checks that every rank
    /// has the same parameters, broadcasts parameters and buffers from rank
    /// 0, lays gradients out in buckets and hooks every parameter.
    pub fn new(mut module: M, comm: Communicator, config: DdpConfig) -> Result<Self> {
        if config.first_bucket_bytes == 0 || config.bucket_cap_bytes == 0 {
            return Err(ParallelError::invalid("DistributedDataParallel", "bucket sizes must be at least 1 byte"));
        }
        let named: Vec<(String, Var)> =
            module.named_parameters().into_iter().filter(|(_, p)| p.requires_grad()).collect();
        if named.is_empty() {
            return Err(ParallelError::invalid(
                "DistributedDataParallel",
                "the module has no parameter that requires grad",
            ));
        }
        for (name, param) in &named {
            if param.device() != comm.device() {
                return Err(ParallelError::invalid(
                    "DistributedDataParallel",
                    format!(
                        "parameter {name} is on {} but rank {} works on {}; move the module first",
                        param.device(),
                        comm.rank(),
                        comm.device()
                    ),
                ));
            }
            if !param.tensor().is_contiguous() {
                return Err(ParallelError::invalid(
                    "DistributedDataParallel",
                    format!(
                        "parameter {name} is not contiguous (strides {:?}{}); its gradient bucket is a row-major \
                         view, so DistributedDataParallel takes row-major parameters only",
                        param.tensor().strides(),
                        if param.tensor().is_channels_last() { ", channels-last" } else { "" }
                    ),
                ));
            }
        }
        verify_same_model(&comm, &named)?;
        {
            let _no_grad = no_grad();
            for (_, param) in &named {
                comm.broadcast(param.tensor(), 0)?;
            }
            for (_, buffer) in module.named_buffers() {
                comm.broadcast(&buffer, 0)?;
            }
        }
        let (names, params): (Vec<String>, Vec<Var>) = named.into_iter().unzip();
        let assignment = Reducer::initial_assignment(&params, &config);
        let (params, flat_params) = match config.zero {
            None => (params, Vec::new()),
            Some(_) => {
                if config.compression != Compression::None {
                    return Err(ParallelError::invalid(
                        "DistributedDataParallel",
                        "ZeRO sharding and gradient compression cannot be combined",
                    ));
                }
                let (views, flats) = crate::sharding::flat_params::flatten(&params, &assignment, comm.world_size())?;
                crate::sharding::flat_params::replace_parameters(&mut module, &params, &views)?;
                (views, flats)
            }
        };
        let reducer = Reducer::new(comm, params, names, config, assignment, flat_params)?;
        Ok(DistributedDataParallel {
            module,
            reducer,
            joining: AtomicBool::new(false),
            join_authority: std::sync::Mutex::new(None),
            split_flag: std::sync::Mutex::new(None),
        })
    }

    /// The wrapped module (its parameters are what optimizers update).
    pub fn module(&self) -> &M {
        &self.module
    }

    /// The wrapped module, mutably (train/eval). Do not replace its
    /// parameters: the next forward refuses a module whose parameters are
    /// not the ones DDP hooked.
    pub fn module_mut(&mut self) -> &mut M {
        &mut self.module
    }

    /// The communicator gradients are averaged over.
    pub fn communicator(&self) -> &Communicator {
        &self.reducer.comm
    }

    /// What the last synchronised backward reduced and how much overlapped.
    pub fn stats(&self) -> DdpStats {
        self.reducer.stats()
    }

    /// Bytes of each gradient bucket, in launch order.
    pub fn bucket_bytes(&self) -> Vec<usize> {
        self.reducer.bucket_bytes()
    }

    /// Parameter names of each bucket, in launch order.
    pub fn bucket_parameters(&self) -> Vec<Vec<String>> {
        self.reducer
            .bucket_params()
            .into_iter()
            .map(|b| b.into_iter().map(|i| self.reducer.names[i].clone()).collect())
            .collect()
    }

    pub(crate) fn reducer(&self) -> &Arc<Reducer> {
        &self.reducer
    }

    /// Bytes of gradient buckets currently allocated (under ZeRO-2 they are
    /// released after each synchronised backward).
    pub fn allocated_bucket_bytes(&self) -> usize {
        self.reducer.allocated_bucket_bytes()
    }

    /// Whether the buckets were rebuilt from the observed gradient order.
    pub fn buckets_rebuilt(&self) -> bool {
        self.reducer.has_rebuilt()
    }

    /// Runs the module. With grad mode on, prepares the backward that
    /// averages gradients (unless inside [`no_sync`](Self::no_sync)) and
    /// checks that the output reaches every parameter.
    pub fn forward(&self, input: &Var) -> Result<Var> {
        self.check_parameters_unchanged()?;
        let comm = &self.reducer.comm;
        // Buffers come from rank 0, or inside `join` from the lowest rank
        // still training (rank 0 may have joined, its buffers stale).
        let mut buffers_from = 0;
        if self.joining.load(Ordering::Acquire) {
            if !self.reducer.is_syncing() {
                return Err(ParallelError::invalid(
                    "DistributedDataParallel::forward",
                    "no_sync inside join is not supported: ranks that joined mirror one synchronised step per forward",
                ));
            }
            buffers_from = self.announce(true)?.unwrap_or(comm.rank());
        }
        if self.reducer.config.broadcast_buffers && comm.world_size() > 1 {
            self.broadcast_buffers(buffers_from)?;
        }
        let expect_backward = is_grad_enabled();
        self.reducer.prepare_forward(expect_backward)?;
        let output = self.module.forward(input)?;
        if expect_backward {
            self.reducer.check_unused(&output)?;
        }
        Ok(output)
    }

    fn broadcast_buffers(&self, root: usize) -> Result<()> {
        let _no_grad = no_grad();
        for (_, buffer) in self.module.named_buffers() {
            self.reducer.comm.broadcast(&buffer, root)?;
        }
        Ok(())
    }

    fn check_parameters_unchanged(&self) -> Result<()> {
        let current = self.module.named_parameters();
        let mut hooked = self.reducer.params.iter();
        for (name, param) in current.iter().filter(|(_, p)| p.requires_grad()) {
            if !hooked.next().is_some_and(|h| h.same_var(param)) {
                return Err(ParallelError::invalid(
                    "DistributedDataParallel::forward",
                    format!("parameter {name} is not the one DDP was built with (moved, converted or replaced after wrapping); wrap the module after moving it"),
                ));
            }
        }
        Ok(())
    }

    /// Backward passes run while the guard lives accumulate gradients
    /// locally, without communication (gradient accumulation); the first
    /// synchronised backward after it reduces the accumulated sum. Guards
    /// nest and may be dropped in any order: backward synchronises again
    /// once every guard is gone.
    pub fn no_sync(&self) -> NoSync<'_> {
        self.reducer.no_sync_guards.fetch_add(1, Ordering::AcqRel);
        NoSync { guards: &self.reducer.no_sync_guards }
    }

    /// Runs `body` (this rank's training loop) so that ranks with fewer
    /// batches than others finish without hanging (PyTorch's `join`): every
    /// forward inside announces that this rank is still training; once
    /// `body` returns, this rank mirrors the others' collectives with zero
    /// gradients until every rank is done. Gradients are averaged over the
    /// whole world, so a step where some ranks already joined weighs their
    /// missing batches as zero (PyTorch's `divide_by_initial_world_size`).
    ///
    /// Inside `join`, buffers are broadcast before each forward from the
    /// lowest rank still training. When every rank is done, the parameters
    /// and buffers of a rank that trained to the end are broadcast to all
    /// (PyTorch's `_sync_final_model`), so every rank leaves `join` with
    /// the same model. Optimizer state (momentum) stays each rank's own.
    pub fn join<T>(&self, body: impl FnOnce() -> Result<T>) -> Result<T> {
        if self.joining.swap(true, Ordering::AcqRel) {
            return Err(ParallelError::invalid("DistributedDataParallel::join", "already inside join"));
        }
        *self.join_authority.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let outcome = body();
        let finished = outcome.as_ref().err().is_none().then(|| self.shadow_until_all_joined());
        self.joining.store(false, Ordering::Release);
        match finished {
            Some(Err(error)) => Err(error),
            _ => outcome,
        }
    }

    fn shadow_until_all_joined(&self) -> Result<()> {
        let comm = &self.reducer.comm;
        while let Some(trainer) = self.announce(false)? {
            if self.reducer.config.broadcast_buffers && comm.world_size() > 1 {
                self.broadcast_buffers(trainer)?;
            }
            let _no_grad = no_grad();
            self.reducer.shadow_step()?;
        }
        self.sync_final_model()
    }

    /// Every rank joined: the last to train holds the final model.
    fn sync_final_model(&self) -> Result<()> {
        let Some(root) = *self.join_authority.lock().unwrap_or_else(|e| e.into_inner()) else {
            return Ok(()); // nobody trained: nothing changed
        };
        let _no_grad = no_grad();
        for (_, param) in self.module.named_parameters() {
            self.reducer.comm.broadcast(param.tensor(), root)?;
        }
        self.broadcast_buffers(root)
    }

    /// All-reduces whether this rank is still training; returns the lowest
    /// rank that is (and remembers it), or `None` once every rank joined.
    fn announce(&self, training: bool) -> Result<Option<usize>> {
        let comm = &self.reducer.comm;
        let mine = if training { comm.rank() } else { comm.world_size() };
        let flag = Tensor::full_on([1], mine as f64, DType::F64, comm.device())?;
        comm.all_reduce(&flag, ReduceOp::Min)?;
        // A plan (meta devices) has no values: it assumes every rank trains.
        let lowest = if flag.device().is_meta() { 0 } else { flag.to_vec::<f64>()?[0] as usize };
        let trainer = (lowest < comm.world_size()).then_some(lowest);
        if trainer.is_some() {
            *self.join_authority.lock().unwrap_or_else(|e| e.into_inner()) = trainer;
        }
        Ok(trainer)
    }
}

/// Checks that every rank has the same parameters: as many, in the same
/// order, each with the same shape and dtype (PyTorch's
/// `_verify_param_shape_across_processes`). Every rank learns every rank's
/// parameters, so every rank returns the same verdict: an error naming the
/// first parameter that differs from rank 0's and the first rank it differs
/// on (this rank and that one, or rank 0 when this rank is the one).
pub(crate) fn verify_same_model(comm: &Communicator, named: &[(String, Var)]) -> Result<()> {
    let (rank, world) = (comm.rank(), comm.world_size());
    // First the counts (so that the descriptors below have one size): how
    // many parameters, how many elements, the most dims of one.
    let count = named.len();
    let numel: usize = named.iter().map(|(_, p)| p.numel()).sum();
    let most_dims = named.iter().map(|(_, p)| p.rank()).max().unwrap_or(0);
    let all = gather_i64(comm, &[count as i64, numel as i64, most_dims as i64])?;
    let summary = |r: usize| &all[3 * r..3 * r + 3];
    if let Some(peer) = (1..world).find(|&peer| summary(peer)[..2] != summary(0)[..2]) {
        return Err(ParallelError::Mismatch {
            op: "DistributedDataParallel::new",
            rank,
            ours: format!("rank 0's model: {} parameters, {} elements", summary(0)[0], summary(0)[1]),
            peer,
            theirs: format!("{} parameters, {} elements", summary(peer)[0], summary(peer)[1]),
        });
    }
    // Then every parameter as [dtype, dims, size of each dim padded with 0].
    let width = 2 + (0..world).map(|r| summary(r)[2]).max().unwrap_or(0) as usize;
    let mut mine = vec![0i64; count * width];
    for ((_, param), slot) in named.iter().zip(mine.chunks_exact_mut(width)) {
        slot[0] = DType::ALL.iter().position(|d| *d == param.dtype()).map_or(-1, |code| code as i64);
        slot[1] = param.rank() as i64;
        for (to, &size) in slot[2..].iter_mut().zip(param.dims()) {
            *to = size as i64;
        }
    }
    let all = gather_i64(comm, &mine)?;
    let param = |r: usize, i: usize| &all[(r * count + i) * width..(r * count + i + 1) * width];
    let first_difference =
        (0..count).find_map(|i| (1..world).find(|&peer| param(peer, i) != param(0, i)).map(|peer| (i, peer)));
    let Some((index, differs)) = first_difference else { return Ok(()) };
    let peer = if rank == differs { 0 } else { differs };
    let like_rank_0 = if rank != 0 && rank != differs { " (as on rank 0)" } else { "" };
    Err(ParallelError::Mismatch {
        op: "DistributedDataParallel::new",
        rank,
        ours: format!(
            "parameter {} (number {index}) of {}{like_rank_0}",
            named[index].0,
            describe_parameter(param(rank, index))
        ),
        peer,
        theirs: format!("{}; every rank must wrap the same model", describe_parameter(param(peer, index))),
    })
}

/// Every rank's `values`, in rank order.
fn gather_i64(comm: &Communicator, values: &[i64]) -> Result<Vec<i64>> {
    let mine = Tensor::from_vec_on(values.to_vec(), [values.len()], comm.device())?;
    let all = Tensor::zeros_on([values.len() * comm.world_size()], DType::I64, comm.device())?;
    comm.all_gather(&all, &mine)?;
    if all.device().is_meta() {
        // A plan (meta devices) has no values: every rank runs the same
        // setup, so it assumes every rank has these.
        return Ok(values.repeat(comm.world_size()));
    }
    Ok(all.to_vec::<i64>()?)
}

/// `shape [6, 2], f32` from a parameter's descriptor (see `verify_same_model`).
fn describe_parameter(descriptor: &[i64]) -> String {
    let dims = usize::try_from(descriptor[1]).unwrap_or(0).min(descriptor.len() - 2);
    let dtype = usize::try_from(descriptor[0]).ok().and_then(|code| DType::ALL.get(code));
    let dtype = dtype.map_or_else(|| "an unknown dtype".to_string(), |d| d.to_string());
    format!("shape {:?}, {dtype}", &descriptor[2..2 + dims])
}

/// Guard of [`DistributedDataParallel::no_sync`]: one of the live guards
/// that keep backward local.
pub struct NoSync<'a> {
    guards: &'a AtomicUsize,
}

impl Drop for NoSync<'_> {
    fn drop(&mut self) {
        // Never below zero: each guard added one.
        let _ = self.guards.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_sub(1)));
    }
}

impl<M: Module> Parameters for DistributedDataParallel<M> {
    fn visit(&self, walk: &mut Walk<'_>) {
        walk.field("module", &self.module);
    }

    fn visit_mut(&mut self, walk: &mut WalkMut<'_>) -> brasa_nn::Result<()> {
        walk.field("module", &mut self.module)
    }
}

impl<M: Module> Module for DistributedDataParallel<M> {
    fn forward(&self, input: &Var) -> brasa_nn::Result<Var> {
        DistributedDataParallel::forward(self, input).map_err(Into::into)
    }
}
