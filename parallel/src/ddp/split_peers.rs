//! DDP as the [`SplitPeers`] of an [`AutoMicroBatch`](brasa_nn::optim::AutoMicroBatch):
//! micro-batches accumulate under `no_sync`, ranks agree after each with a
//! one-number all-reduce (`Max`), and the accumulated gradients are reduced
//! once at the end, bucket by bucket as a synchronised backward would.

use super::DistributedDataParallel;
use crate::collective::ReduceOp;
use brasa_nn::optim::{LocalGuard, SplitOutcome, SplitPeers};
use brasa_nn::{Module, ModuleExt, NnError};
use brasa_tensor::{DType, Tensor};

impl<M: Module> SplitPeers for DistributedDataParallel<M> {
    fn rank(&self) -> usize {
        self.communicator().rank()
    }

    fn prepare(&self) -> brasa_nn::Result<()> {
        let mut flag = self.split_flag.lock().unwrap_or_else(|e| e.into_inner());
        if flag.is_none() {
            *flag = Some(Tensor::zeros_on([1], DType::F64, self.communicator().device())?);
        }
        Ok(())
    }

    fn accumulate_locally(&self) -> LocalGuard<'_> {
        LocalGuard::new(self.no_sync())
    }

    fn agree(&self, mine: SplitOutcome) -> brasa_nn::Result<SplitOutcome> {
        let guard = self.split_flag.lock().unwrap_or_else(|e| e.into_inner());
        let Some(flag) = guard.as_ref() else {
            return Err(NnError::invalid("DistributedDataParallel as SplitPeers", "agree before prepare"));
        };
        flag.fill_(mine.code() as f64)?;
        self.communicator().all_reduce(flag, ReduceOp::Max)?;
        if flag.device().is_meta() {
            // A plan (meta devices) has no values: every rank runs the same step.
            return Ok(mine);
        }
        let code = flag.to_vec::<f64>()?[0];
        Ok(SplitOutcome::from_code(code as u64))
    }

    fn reduce_gradients(&self) -> brasa_nn::Result<()> {
        Ok(self.reducer.reduce_accumulated()?)
    }

    fn zero_grad(&self) -> brasa_nn::Result<()> {
        self.module.zero_grad()
    }
}
