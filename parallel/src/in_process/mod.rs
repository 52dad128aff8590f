//! The in-process backend: a group of ranks that are threads of one
//! process, each on its own logical host device (`Device::Cpu(rank)`),
//! exchanging through shared memory with no staging copies. A group of
//! meta devices plans a distributed step: the ranks meet as they would and
//! move no data.

mod engine;
mod group;
mod kernels;

use crate::communicator::{CollectiveEngine, CommOptions, Communicator, RankInfo};
use crate::error::{ParallelError, Result};
use brasa_tensor::Device;
use engine::{InProcessBackend, LeaveGroup};
use group::Group;
use std::sync::Arc;

/// Communicators for an in-process group with one rank per device in
/// `devices` (rank i works on `devices[i]`). Hand each to its own thread;
/// [`crate::launch::run_in_process`] does that for you.
pub fn in_process_group(devices: &[Device], options: &CommOptions) -> Result<Vec<Communicator>> {
    options.check()?;
    if devices.is_empty() {
        return Err(ParallelError::invalid("in_process_group", "a group needs at least one device"));
    }
    // Host devices, CUDA devices (tensors staged through host memory, see
    // staging.rs), or meta devices for a plan of the group's step; one kind.
    let kind = |d: &Device| (d.is_cpu(), d.is_meta());
    for (rank, device) in devices.iter().enumerate() {
        if kind(device) != kind(&devices[0]) {
            return Err(ParallelError::invalid(
                "in_process_group",
                format!(
                    "rank {rank}'s device is {device} but rank 0's is {}; the in-process backend works on host \
                     devices, CUDA devices or (to plan memory) meta devices, all of one kind",
                    devices[0]
                ),
            ));
        }
        // Several ranks may share a GPU (each its own part of its memory);
        // a logical host device is one rank's.
        let shareable = matches!(device, Device::Cuda(_));
        if let Some(other) = devices[..rank].iter().position(|d| d == device).filter(|_| !shareable) {
            return Err(ParallelError::invalid(
                "in_process_group",
                format!("ranks {other} and {rank} are both on {device}; give each rank its own device"),
            ));
        }
    }
    let group = Arc::new(Group::new(devices.len()));
    devices
        .iter()
        .enumerate()
        .map(|(rank, device)| {
            let info = RankInfo { rank, world_size: devices.len(), device: *device, backend: "in-process" };
            let abort = Arc::new(LeaveGroup { group: Arc::clone(&group), rank });
            let backend = InProcessBackend { group: Arc::clone(&group), rank, timeout: options.timeout };
            Communicator::start(info, options, Some(abort), move || Ok(Box::new(backend) as Box<dyn CollectiveEngine>))
        })
        .collect()
}
