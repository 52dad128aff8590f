//! The in-process [`CollectiveEngine`]: one rank per thread, exchanging
//! through the memory the ranks' tensors already occupy. Each rank locks its
//! own storages, lends their addresses through the [`Group`], and does its
//! share of the work directly in its peers' buffers:
//!
//! - all-reduce: rank r reduces share r of every buffer and writes the
//!   result into every buffer (one read and one write per byte and rank,
//!   against 2(n-1)/n reads and writes for a ring);
//! - reduce-scatter: rank r reduces slice r of every input into its output;
//! - all-gather: rank r writes its input into slot r of every output;
//! - broadcast: every other rank copies the root's buffer;
//! - send/recv: the receiver copies straight from the sender's buffer.

use super::group::{Group, Posted};
use super::kernels;
use crate::collective::Collective;
use crate::communicator::CollectiveEngine;
use crate::error::{ParallelError, Result};
use crate::health::Abort;
use brasa_tensor::{HostBytes, HostBytesMut, Tensor};
use std::sync::Arc;
use std::time::Duration;

pub(crate) struct InProcessBackend {
    pub(crate) group: Arc<Group>,
    pub(crate) rank: usize,
    pub(crate) timeout: Duration,
}

/// Leaving an in-process group.
pub(crate) struct LeaveGroup {
    pub(crate) group: Arc<Group>,
    pub(crate) rank: usize,
}

impl Abort for LeaveGroup {
    fn abort(&self, reason: &str, after_failure: bool) {
        self.group.depart(self.rank, reason, after_failure);
    }
}

/// The write guard on `output` and, when `input` is a view into the same
/// storage (an in-place all-gather), the input's address inside it.
fn lend_output(output: &Tensor) -> Result<HostBytesMut<'_>> {
    Ok(output.host_bytes_mut()?)
}

fn lend_input(input: &Tensor) -> Result<HostBytes<'_>> {
    Ok(input.host_bytes()?)
}

fn addr_mut(bytes: &mut HostBytesMut<'_>) -> usize {
    bytes.as_mut_ptr() as usize
}

impl InProcessBackend {
    fn world(&self) -> usize {
        self.group.world()
    }

    /// The opening barrier: posts `posted`, gets everyone's, checks that
    /// every rank runs the same collective with the same sizes and dtype.
    fn open(&self, op: &'static str, posted: Posted) -> Result<Vec<Posted>> {
        let everyone = self.group.arrive(op, self.rank, posted, self.timeout)?;
        let everyone: Vec<Posted> = everyone
            .into_iter()
            .enumerate()
            .map(|(peer, p)| {
                p.ok_or_else(|| ParallelError::PeerFailed {
                    op,
                    rank: self.rank,
                    peer,
                    reason: "posted nothing for this collective".into(),
                })
            })
            .collect::<Result<_>>()?;
        check_signatures(op, self.rank, &everyone)?;
        Ok(everyone)
    }

    /// The data phase between the barriers; the closing barrier always runs
    /// (peers may be writing into this rank's buffers until it completes).
    fn data_phase(&self, work: impl FnOnce()) -> Result<()> {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        self.group.finish_data_phase();
        outcome.map_err(|_| ParallelError::invalid("in-process collective", "the data phase panicked"))
    }

    fn all_reduce(&self, op: &Collective, tensor: &Tensor, reduce: crate::ReduceOp) -> Result<()> {
        let signature = op.signature();
        let mut bytes = lend_output(tensor)?;
        let addr = addr_mut(&mut bytes);
        let everyone = self.open(op.name(), Posted { signature, input: addr, output: addr })?;
        let buffers: Vec<usize> = everyone.iter().map(|p| p.output).collect();
        let range = kernels::share(tensor.numel(), self.rank, self.world());
        let (dtype, world) = (tensor.dtype(), self.world());
        self.data_phase(|| {
            // SAFETY: every rank holds its buffer's write lock until the
            // closing barrier; ranks touch disjoint element ranges.
            unsafe { kernels::reduce(dtype, reduce, world, &buffers, &buffers, range, 0) }
        })?;
        drop(bytes);
        Ok(())
    }

    fn reduce_scatter(&self, op: &Collective, input: &Tensor, output: &Tensor, reduce: crate::ReduceOp) -> Result<()> {
        let signature = op.signature();
        let source = lend_input(input)?;
        let mut dest = lend_output(output)?;
        let posted = Posted { signature, input: source.as_ptr() as usize, output: addr_mut(&mut dest) };
        let everyone = self.open(op.name(), posted)?;
        let inputs: Vec<usize> = everyone.iter().map(|p| p.input).collect();
        let n = output.numel();
        let range = self.rank * n..(self.rank + 1) * n;
        let (dtype, world, out) = (output.dtype(), self.world(), posted.output);
        self.data_phase(|| {
            // SAFETY: inputs are read-locked by their ranks and only read;
            // the output is this rank's own, write-locked.
            unsafe { kernels::reduce(dtype, reduce, world, &inputs, &[out], range.clone(), range.start) }
        })?;
        drop((source, dest));
        Ok(())
    }

    fn all_gather(&self, op: &Collective, input: &Tensor, output: &Tensor) -> Result<()> {
        let signature = op.signature();
        let bytes_in = input.numel() * input.dtype().size_in_bytes();
        let mut dest = lend_output(output)?;
        let out = addr_mut(&mut dest);
        // In place: the input is this rank's slot of the output (one lock).
        let (source, input_addr) = if input.shares_storage_with(output) {
            let size = output.dtype().size_in_bytes();
            let offset = input.layout().offset() as isize - output.layout().offset() as isize;
            let slot = (self.rank * input.numel()) as isize;
            if offset != slot {
                return Err(ParallelError::invalid(
                    "all_gather",
                    format!(
                        "the input shares storage with the output but is not rank {}'s slot of it (elements {} .. {})",
                        self.rank,
                        slot,
                        slot + input.numel() as isize
                    ),
                ));
            }
            (None, (out as isize + offset * size as isize) as usize)
        } else {
            let source = lend_input(input)?;
            let addr = source.as_ptr() as usize;
            (Some(source), addr)
        };
        let everyone = self.open(op.name(), Posted { signature, input: input_addr, output: out })?;
        let rank = self.rank;
        self.data_phase(|| {
            for peer in &everyone {
                // SAFETY: slot `rank` of every output is written by this
                // rank alone; outputs are write-locked by their owners.
                unsafe { kernels::copy(input_addr, peer.output + rank * bytes_in, bytes_in) }
            }
        })?;
        drop((source, dest));
        Ok(())
    }

    fn broadcast(&self, op: &Collective, tensor: &Tensor, root: usize) -> Result<()> {
        let signature = op.signature();
        let mut bytes = lend_output(tensor)?;
        let addr = addr_mut(&mut bytes);
        let everyone = self.open(op.name(), Posted { signature, input: addr, output: addr })?;
        let len = bytes.len();
        let source = everyone[root].input;
        let is_root = self.rank == root;
        self.data_phase(|| {
            if !is_root {
                // SAFETY: the root only reads during the data phase; this
                // rank writes its own buffer.
                unsafe { kernels::copy(source, addr, len) }
            }
        })?;
        drop(bytes);
        Ok(())
    }

    fn barrier(&self, op: &Collective) -> Result<()> {
        self.open(op.name(), Posted { signature: op.signature(), input: 0, output: 0 })?;
        Ok(())
    }

    fn send(&self, op: &Collective, tensor: &Tensor, peer: usize) -> Result<()> {
        let bytes = tensor.host_bytes()?;
        self.group.send(self.rank, peer, op.signature(), bytes.as_ptr() as usize, self.timeout)?;
        drop(bytes);
        Ok(())
    }

    fn recv(&self, op: &Collective, tensor: &Tensor, peer: usize) -> Result<()> {
        let mut bytes = tensor.host_bytes_mut()?;
        let (dest, len) = (addr_mut(&mut bytes), bytes.len());
        self.group.recv(self.rank, peer, op.signature(), self.timeout, |source| {
            // SAFETY: the sender holds its read lock and waits while we copy;
            // we hold the destination's write lock.
            unsafe { kernels::copy(source, dest, len) }
        })?;
        drop(bytes);
        Ok(())
    }
}

impl InProcessBackend {
    /// A collective between meta devices (a plan of a distributed step):
    /// the ranks meet as they would, with the same checks and barriers, and
    /// move nothing (meta tensors have no values; collectives allocate
    /// nothing of their own).
    fn without_data(&self, op: &Collective) -> Result<()> {
        match op {
            Collective::Send { peer, .. } => self.group.send(self.rank, *peer, op.signature(), 0, self.timeout),
            Collective::Recv { peer, .. } => self.group.recv(self.rank, *peer, op.signature(), self.timeout, |_| {}),
            Collective::Barrier => self.barrier(op),
            _ => {
                self.open(op.name(), Posted { signature: op.signature(), input: 0, output: 0 })?;
                self.data_phase(|| {})
            }
        }
    }
}

/// Whether the collective's tensors are on a meta device.
fn on_meta(op: &Collective) -> bool {
    let tensor = match op {
        Collective::AllReduce { tensor, .. }
        | Collective::Broadcast { tensor, .. }
        | Collective::Send { tensor, .. }
        | Collective::Recv { tensor, .. } => tensor,
        Collective::ReduceScatter { output, .. } | Collective::AllGather { output, .. } => output,
        Collective::Barrier => return false,
    };
    tensor.device().is_meta()
}

impl CollectiveEngine for InProcessBackend {
    fn run(&mut self, op: &Collective) -> Result<()> {
        if on_meta(op) {
            return self.without_data(op);
        }
        match op {
            Collective::AllReduce { tensor, op: reduce } => self.all_reduce(op, tensor, *reduce),
            Collective::ReduceScatter { input, output, op: reduce } => self.reduce_scatter(op, input, output, *reduce),
            Collective::AllGather { input, output } => self.all_gather(op, input, output),
            Collective::Broadcast { tensor, root } => self.broadcast(op, tensor, *root),
            Collective::Send { tensor, peer } => self.send(op, tensor, *peer),
            Collective::Recv { tensor, peer } => self.recv(op, tensor, *peer),
            Collective::Barrier => self.barrier(op),
        }
    }
}

/// Every rank compares everyone's signature: the verdict (all equal or
/// not) is the same on every rank, so none starts moving data alone.
fn check_signatures(op: &'static str, rank: usize, everyone: &[Posted]) -> Result<()> {
    if everyone.iter().all(|p| p.signature == everyone[0].signature) {
        return Ok(());
    }
    let ours = everyone[rank].signature;
    let (peer, theirs) = everyone
        .iter()
        .enumerate()
        .find(|(_, p)| p.signature != ours)
        .map(|(peer, p)| (peer, p.signature))
        .unwrap_or((rank, ours));
    Err(ParallelError::Mismatch { op, rank, ours: ours.to_string(), peer, theirs: theirs.to_string() })
}
