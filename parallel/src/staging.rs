//! Collectives on CUDA tensors over engines that move host bytes (the
//! in-process engine, Open MPI): the submitting thread copies the tensors
//! into page-locked host memory (on its own stream, so the copy sees the
//! kernels that produced them), the engine works on those copies, and
//! [`Work::wait`](crate::Work::wait) copies the results back to the device.
//! DDP, ZeRO and FSDP then run on `cuda:N` devices unchanged; the staging
//! costs a device-to-host and a host-to-device copy of each tensor, which
//! an engine that reads device memory (NCCL) does not pay.

use crate::collective::Collective;
use crate::error::Result;
use brasa_tensor::{Device, Tensor};

/// A collective rewritten onto host copies, and the copies to write back.
pub(crate) struct Staged {
    pub(crate) op: Collective,
    /// (host copy, device tensor) of every tensor the collective writes.
    pub(crate) write_back: Vec<(Tensor, Tensor)>,
}

impl Staged {
    /// Copies the results back to the device.
    pub(crate) fn finish(self) -> Result<()> {
        for (host, device) in self.write_back {
            device.copy_(&host)?;
        }
        Ok(())
    }
}

/// Whether `op` touches a tensor the engines cannot read in place.
pub(crate) fn needs_staging(op: &Collective) -> bool {
    op.tensors().iter().any(|t| matches!(t.device(), Device::Cuda(_)))
}

/// `op` on host copies of its tensors: what it only reads is copied to
/// the host; what it writes lands in page-locked host buffers (pageable
/// when the memory cannot be locked), filled from the device only where
/// the collective also reads them (all-reduce, broadcast).
pub(crate) fn stage(op: &Collective) -> Result<Staged> {
    let read = |t: &Tensor| -> Result<Tensor> { Ok(t.to(Device::CPU)?) };
    let mut write_back = Vec::new();
    let mut written = |t: &Tensor, fill: bool| -> Result<Tensor> {
        let host = Tensor::zeros_on(t.dims(), t.dtype(), Device::CPU)?;
        let host = host.pin_memory().unwrap_or(host);
        if fill {
            host.copy_(t)?;
        }
        write_back.push((host.clone(), t.clone()));
        Ok(host)
    };
    let staged = match op {
        Collective::AllReduce { tensor, op } => Collective::AllReduce { tensor: written(tensor, true)?, op: *op },
        Collective::Broadcast { tensor, root } => Collective::Broadcast { tensor: written(tensor, true)?, root: *root },
        Collective::AllGather { input, output } => {
            Collective::AllGather { input: read(input)?, output: written(output, false)? }
        }
        Collective::ReduceScatter { input, output, op } => {
            Collective::ReduceScatter { input: read(input)?, output: written(output, false)?, op: *op }
        }
        Collective::Send { tensor, peer } => Collective::Send { tensor: read(tensor)?, peer: *peer },
        Collective::Recv { tensor, peer } => Collective::Recv { tensor: written(tensor, false)?, peer: *peer },
        Collective::Barrier => Collective::Barrier,
    };
    Ok(Staged { op: staged, write_back })
}
