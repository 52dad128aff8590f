//! [`DistributedDataParallel`]: PyTorch's DDP for brasa — one model replica
//! per rank, gradients averaged across ranks *during* backward.
//!
//! At construction, parameters and buffers are broadcast from rank 0 (the
//! ranks' models must have the same parameters: counts and sizes are
//! checked first, and a difference is an error naming both ranks). Each
//! parameter's gradient then lives as a view into a flat bucket (gradient
//! memory 1×); buckets follow the reverse parameter order with a small
//! last bucket (1 MiB, holding the gradients that become ready last, so the
//! all-reduce nothing overlaps is short) and a cap (25 MiB), and are
//! rebuilt once from the order gradients actually became ready. In backward, each bucket's
//! all-reduce starts as soon as its last gradient is accumulated, while
//! backward goes on; `backward()` returns with every gradient averaged.
//!
//! - [`no_sync`](DistributedDataParallel::no_sync): accumulate gradients
//!   locally; the next synchronised backward reduces the sum.
//! - Unused parameters are found from brasa's own graph after every forward
//!   and named in an error ([`ParallelError::UnusedParameters`]), unless
//!   [`DdpConfig::find_unused_parameters`] says the model may skip them.
//! - [`join`](DistributedDataParallel::join): ranks with fewer batches than
//!   others finish without hanging.
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
mod flat_params;
mod reducer;
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A module replicated on every rank of a communicator, whose gradients are
/// averaged across ranks during backward. See the [crate docs](crate).
pub struct DistributedDataParallel<M: Module> {
    module: M,
    reducer: Arc<Reducer>,
    /// Inside [`DistributedDataParallel::join`].
    joining: AtomicBool,
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
                    format!("parameter {name} is not contiguous"),
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
                let (views, flats) = flat_params::flatten(&params, &assignment, comm.world_size())?;
                flat_params::replace_parameters(&mut module, &params, &views)?;
                (views, flats)
            }
        };
        let reducer = Reducer::new(comm, params, names, config, assignment, flat_params)?;
        Ok(DistributedDataParallel { module, reducer, joining: AtomicBool::new(false) })
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
        if self.joining.load(Ordering::Acquire) {
            if !self.reducer.sync.load(Ordering::Acquire) {
                return Err(ParallelError::invalid(
                    "DistributedDataParallel::forward",
                    "no_sync inside join is not supported: ranks that joined mirror one synchronised step per forward",
                ));
            }
            announce(comm, 1.0)?;
        }
        if self.reducer.config.broadcast_buffers && comm.world_size() > 1 {
            self.broadcast_buffers()?;
        }
        let expect_backward = is_grad_enabled();
        self.reducer.prepare_forward(expect_backward)?;
        let output = self.module.forward(input)?;
        if expect_backward {
            self.reducer.check_unused(&output)?;
        }
        Ok(output)
    }

    fn broadcast_buffers(&self) -> Result<()> {
        let _no_grad = no_grad();
        for (_, buffer) in self.module.named_buffers() {
            self.reducer.comm.broadcast(&buffer, 0)?;
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
    /// synchronised backward after it reduces the accumulated sum.
    pub fn no_sync(&self) -> NoSync<'_> {
        let previous = self.reducer.sync.swap(false, Ordering::AcqRel);
        NoSync { sync: &self.reducer.sync, previous }
    }

    /// Runs `body` (this rank's training loop) so that ranks with fewer
    /// batches than others finish without hanging (PyTorch's `join`): every
    /// forward inside announces that this rank is still training; once
    /// `body` returns, this rank mirrors the others' collectives with zero
    /// gradients until every rank is done. Gradients are averaged over the
    /// whole world, so a step where some ranks already joined weighs their
    /// missing batches as zero (PyTorch's `divide_by_initial_world_size`).
    pub fn join<T>(&self, body: impl FnOnce() -> Result<T>) -> Result<T> {
        if self.joining.swap(true, Ordering::AcqRel) {
            return Err(ParallelError::invalid("DistributedDataParallel::join", "already inside join"));
        }
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
        loop {
            if announce(comm, 0.0)? == 0.0 {
                return Ok(());
            }
            if self.reducer.config.broadcast_buffers && comm.world_size() > 1 {
                self.broadcast_buffers()?;
            }
            let _no_grad = no_grad();
            self.reducer.shadow_step()?;
        }
    }
}

/// All-reduces this rank's "still training" flag; returns how many ranks are.
fn announce(comm: &Communicator, active: f64) -> Result<f64> {
    let flag = Tensor::full_on([1], active, DType::F32, comm.device())?;
    comm.all_reduce(&flag, ReduceOp::Sum)?;
    Ok(flag.to_vec::<f32>()?[0] as f64)
}

/// Checks that every rank has as many parameters with the same sizes; an
/// error names the first rank that differs from rank 0.
fn verify_same_model(comm: &Communicator, named: &[(String, Var)]) -> Result<()> {
    let world = comm.world_size();
    let count = named.len() as f64;
    let numel: f64 = named.iter().map(|(_, p)| p.numel() as f64).sum();
    let mine = Tensor::from_vec_on(vec![count, numel], [2], comm.device())?;
    let all = Tensor::zeros_on([2 * world], DType::F64, comm.device())?;
    comm.all_gather(&all, &mine)?;
    let all = all.to_vec::<f64>()?;
    for peer in 1..world {
        let (c, n) = (all[2 * peer], all[2 * peer + 1]);
        if c != all[0] || n != all[1] {
            return Err(ParallelError::Mismatch {
                op: "DistributedDataParallel::new",
                rank: comm.rank(),
                ours: format!("rank 0's model: {} parameters, {} elements", all[0], all[1]),
                peer,
                theirs: format!("{c} parameters, {n} elements"),
            });
        }
    }
    Ok(())
}

/// Guard of [`DistributedDataParallel::no_sync`].
pub struct NoSync<'a> {
    sync: &'a AtomicBool,
    previous: bool,
}

impl Drop for NoSync<'_> {
    fn drop(&mut self) {
        self.sync.store(self.previous, Ordering::Release);
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
