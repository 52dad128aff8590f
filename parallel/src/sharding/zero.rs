//! [`ZeroOptimizer`]: ZeRO sharding over any brasa optimizer.
//!
//! Built on a [`DistributedDataParallel`] made with
//! [`DdpConfig::zero`](crate::DdpConfig::zero): the model's parameters live
//! in flat per-bucket buffers, each rank owns 1/N of every bucket, and the
//! inner optimizer (Adam, SGD, …, built by a closure over this rank's
//! shards) keeps state for that 1/N only. A step updates the shards, then
//! all-gathers every bucket so all ranks hold the new parameters.
//!
//! - Stage 1: gradients are all-reduced whole (as DDP); the optimizer reads
//!   this rank's slice of them. Per rank: P + G + K·P/N bytes.
//! - Stage 2: each bucket's gradients are reduce-scattered to their owners
//!   during backward and the full buffers released when backward ends. Per
//!   rank: P + G/N + K·P/N (f32 Adam, K = 2: 0.625 of DDP at N = 2, 0.4375
//!   at N = 4).
//!
//! Elementwise optimizers (SGD, Adam, AdamW) give the same parameters as
//! plain DDP. Anything that needs the whole gradient at once (a global
//! gradient-norm clip) must combine the shards' partial results itself.
//!
//! ```
//! use brasa_parallel::{run_in_process, DdpConfig, DistributedDataParallel, LaunchOptions, ZeroOptimizer, ZeroStage};
//! use brasa_nn::{functional::mse_loss, functional::Reduction, optim::{Adam, AdamConfig, Optimizer}, Linear};
//! use brasa_autograd::Var;
//! use brasa_tensor::{DType, Tensor};
//!
//! run_in_process(2, &LaunchOptions::default(), |comm| {
//!     let dev = comm.device();
//!     let config = DdpConfig { zero: Some(ZeroStage::Two), ..DdpConfig::default() };
//!     let ddp = DistributedDataParallel::new(Linear::new(8, 4, dev)?, comm.clone(), config)?;
//!     let mut opt = ZeroOptimizer::new(&ddp, |shards| Adam::new(shards, AdamConfig::default()))?;
//!     let x = Var::new(Tensor::randn_on([16, 8], DType::F32, dev)?);
//!     mse_loss(&ddp.forward(&x)?, &Var::new(Tensor::zeros_on([16, 4], DType::F32, dev)?), Reduction::Mean)?.backward()?;
//!     opt.step()?;                                    // this rank's half, then all-gather
//!     println!("{}", opt.memory_breakdown());        // parameters, gradients, state, buffers
//!     Ok(())
//! })?;
//! # Ok::<(), brasa_parallel::ParallelError>(())
//! ```

use crate::ddp::{DistributedDataParallel, Reducer, Shard};
use crate::error::{ParallelError, Result};
use crate::memory::MemoryBreakdown;
use brasa_autograd::{no_grad, Var};
use brasa_nn::optim::Optimizer;
use brasa_nn::{Module, StateDict};
use brasa_tensor::Tensor;
use std::sync::Arc;

/// An optimizer that updates only this rank's shard of the parameters and
/// keeps state only for it. See the [crate docs](crate).
pub struct ZeroOptimizer<O: Optimizer> {
    inner: O,
    reducer: Arc<Reducer>,
    shards: Vec<Shard>,
    shard_params: Vec<Var>,
}

impl<O: Optimizer> ZeroOptimizer<O> {
    /// Shards `ddp`'s parameters (it must have been built with
    /// `DdpConfig { zero: Some(..), .. }`) and builds the inner optimizer
    /// over this rank's shards with `make`.
    pub fn new<M: Module>(
        ddp: &DistributedDataParallel<M>,
        make: impl FnOnce(Vec<Var>) -> brasa_nn::Result<O>,
    ) -> Result<ZeroOptimizer<O>> {
        let reducer = Arc::clone(ddp.reducer());
        if reducer.config.zero.is_none() {
            return Err(ParallelError::invalid(
                "ZeroOptimizer::new",
                "the DistributedDataParallel was built without sharding; set DdpConfig { zero: Some(ZeroStage::One \
                 or ZeroStage::Two), .. }",
            ));
        }
        let shards = reducer.shards.clone();
        let shard_params: Vec<Var> = shards.iter().map(|s| s.param.clone()).collect();
        let inner = make(shard_params.clone())?;
        Ok(ZeroOptimizer { inner, reducer, shards, shard_params })
    }

    /// The inner optimizer (over this rank's shards).
    pub fn inner(&self) -> &O {
        &self.inner
    }

    /// This rank's bytes of parameters, gradients, optimizer state and
    /// communication buffers.
    pub fn memory_breakdown(&self) -> MemoryBreakdown {
        let shard_grads: Vec<Tensor> = self.shards.iter().map(|s| s.grad.clone()).collect();
        MemoryBreakdown::measure(
            &self.reducer.params,
            &shard_grads,
            &self.inner,
            // ZeRO-2's full gradient buffers exist only during backward.
            match self.reducer.config.zero {
                Some(crate::ZeroStage::Two) => self.reducer.allocated_bucket_bytes(),
                _ => 0,
            },
        )
    }
}

impl<O: Optimizer> Optimizer for ZeroOptimizer<O> {
    fn step(&mut self) -> brasa_nn::Result<()> {
        for shard in &self.shards {
            shard.param.set_grad(Some(shard.grad.clone()))?;
        }
        self.inner.step()?;
        let _no_grad = no_grad();
        let comm = &self.reducer.comm;
        let works: Vec<_> =
            self.shards.iter().map(|s| comm.all_gather_async(&s.flat_param, s.param.tensor())).collect();
        for work in works {
            work.wait()?;
        }
        Ok(())
    }

    fn zero_grad_with(&mut self, set_to_none: bool) -> brasa_nn::Result<()> {
        // Model gradients go (DDP lays them out again at the next forward);
        // the shards' gradient buffers stay and are zeroed.
        for param in &self.reducer.params {
            param.zero_grad(set_to_none)?;
        }
        for shard in &self.shards {
            shard.grad.zero_()?;
        }
        Ok(())
    }

    fn lr(&self) -> f64 {
        self.inner.lr()
    }

    fn set_lr(&mut self, lr: f64) -> brasa_nn::Result<()> {
        self.inner.set_lr(lr)
    }

    fn params(&self) -> &[Var] {
        &self.shard_params
    }

    fn state_dict(&self) -> brasa_nn::Result<StateDict> {
        self.inner.state_dict()
    }

    fn load_state_dict(&mut self, state: &StateDict) -> brasa_nn::Result<()> {
        self.inner.load_state_dict(state)
    }
}
