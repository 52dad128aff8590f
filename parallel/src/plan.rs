//! Memory plans of a distributed step: every rank runs its share on a meta
//! device imitating its target, in a group whose collectives meet as they
//! would and move no data. One plan per rank, exact on host targets as a
//! single-device plan is.
//!
//! ```
//! use brasa_nn::{Linear, Module, ModuleExt};
//! use brasa_parallel::{plan_in_process, DdpConfig, DistributedDataParallel, LaunchOptions};
//! use brasa_tensor::{DType, MemoryTarget, Tensor};
//! use brasa_autograd::Var;
//!
//! // DDP over two 1 GiB devices: what each rank will hold.
//! let targets = [MemoryTarget::cuda(1 << 30), MemoryTarget::cuda(1 << 30)];
//! let plans = plan_in_process(&targets, &LaunchOptions::default(), |comm| {
//!     let device = comm.device();
//!     let model = DistributedDataParallel::new(Linear::new(512, 512, device)?, comm, DdpConfig::default())?;
//!     let x = Tensor::zeros_on([64, 512], DType::F32, device)?;
//!     Ok(move || -> brasa_parallel::Result<()> {
//!         model.forward(&Var::new(x.clone()))?.sum_all()?.backward()?;
//!         Ok(())
//!     })
//! })?;
//! assert_eq!(plans.len(), 2);
//! assert!(plans.iter().all(|p| p.fits));
//! # Ok::<(), brasa_parallel::ParallelError>(())
//! ```

use crate::communicator::Communicator;
use crate::error::{ParallelError, Result};
use crate::launch::{run_on_devices, LaunchOptions};
use brasa_tensor::memory::{plan_on, MemoryPlan, PLANNED_STEPS};
use brasa_tensor::{Device, MemoryTarget, MetaDevice};

/// Plans a step of a group of `targets.len()` ranks, rank `i` on a meta
/// device imitating `targets[i]`: `setup(comm)` builds the rank's model,
/// optimizer and batch on `comm.device()` and returns its step, which runs
/// [`PLANNED_STEPS`] times. Returns each rank's plan, in rank order.
///
/// A rank that would run out of memory ends the group: the result is then
/// an error naming that rank and the allocation its target would refuse
/// (the other ranks stop at their next collective).
pub fn plan_in_process<Setup, Step>(
    targets: &[MemoryTarget],
    options: &LaunchOptions,
    setup: Setup,
) -> Result<Vec<MemoryPlan>>
where
    Setup: Fn(Communicator) -> Result<Step> + Sync,
    Step: FnMut() -> Result<()>,
{
    let metas =
        targets.iter().map(|target| MetaDevice::new(target.clone())).collect::<std::result::Result<Vec<_>, _>>()?;
    let devices: Vec<Device> = metas.iter().map(MetaDevice::device).collect();
    // The rank that ran out of memory, whatever error its peers then saw.
    let out_of_memory = std::sync::Mutex::new(None);
    let outcome = run_on_devices(&devices, options, |comm| {
        let rank = comm.rank();
        let plan = plan_on(&metas[rank], PLANNED_STEPS, |_device| setup(comm))?;
        match &plan.failure {
            None => Ok(plan),
            Some(failure) => {
                let error = ParallelError::invalid(
                    "plan_in_process",
                    format!(
                        "rank {rank} does not fit {}: {} asked for {} bytes ({}) with {} allocated and {} reserved",
                        plan.target,
                        failure.op,
                        failure.requested,
                        failure.category,
                        failure.allocated,
                        failure.reserved
                    ),
                );
                out_of_memory.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(error.clone());
                Err(error)
            }
        }
    });
    match out_of_memory.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(error) => Err(error),
        None => outcome,
    }
}
