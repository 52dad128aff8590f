//! The MPI [`CollectiveEngine`]: runs on the communicator's worker thread,
//! which makes every MPI call of the process after `MPI_Init_thread`.
//!
//! Each operation has two phases:
//!
//! 1. **Arrival**: every rank posts a 56-byte descriptor of what it is
//!    about to do ([`descriptor`](super::descriptor)) with a non-blocking
//!    `MPI_Iallgather` (a pair of `MPI_Isend`/`MPI_Irecv` for send/recv),
//!    polled with the communicator's timeout as deadline. A peer that does
//!    not arrive is a [`ParallelError::Timeout`]; descriptors that differ
//!    are a [`ParallelError::Mismatch`] on every rank (they all see the
//!    same array), before a byte of data moved; a peer whose communicator
//!    was dropped posts a goodbye instead, which is a
//!    [`ParallelError::PeerFailed`]. A barrier is this phase alone.
//! 2. **Data**: one blocking MPI collective on the tensor's own memory
//!    (in place where MPI allows it). Every rank is known to be there, so
//!    it completes unless a process dies or the network fails, which Open
//!    MPI turns into the end of the job, not a hang. (One race remains: a
//!    peer that gave up on this very arrival at its deadline may already
//!    have delivered its descriptor, so this rank proceeds into a data
//!    phase the peer never joins. Its `Work` still times out, its drop is
//!    bounded, and the job ends when that peer exits without finalizing.)
//!    Blocking calls let Open MPI use its tuned algorithms (its
//!    non-blocking collectives go through libnbc), and mean MPI never holds
//!    a tensor's memory after the operation returned.
//!
//! The group is *in step* while every rank has taken part in the same
//! sequence of MPI operations. A timeout or an MPI error breaks that
//! (requests were abandoned mid-flight); a mismatch does not. Only an
//! in-step group can say goodbye and call `MPI_Finalize` (see
//! [`MpiBackend::shutdown`]).

use super::descriptor::{encode, verdict, Posted, Role, Verdict, WORDS};
use super::ffi::{self as raw, Abandoned, Interrupt};
use super::ops::{copy_datatype, scale_for_average, Reductions};
use crate::collective::{Collective, ReduceOp};
use crate::communicator::CollectiveEngine;
use crate::deadline::Deadline;
use crate::error::{ParallelError, Result};
use crate::health::Abort;
use ::mpi::datatype::Equivalence;
use ::mpi::environment::Universe;
use ::mpi::ffi;
use ::mpi::raw::AsRaw;
use brasa_tensor::Tensor;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Tag of signature descriptors between a sender and its receiver.
const TAG_SIGNATURE: c_int = 1;
/// Tag of send/recv payloads.
const TAG_DATA: c_int = 2;

/// What the worker and the communicator's other threads share.
#[derive(Default)]
pub(crate) struct Shared {
    /// Lets a thread whose wait timed out stop the worker's arrival wait.
    pub(crate) interrupt: Interrupt,
    /// Set when the communicator was dropped: queued work is refused.
    pub(crate) leaving: AtomicBool,
}

/// How an MPI rank leaves: [`crate::health::Health`] calls this from any
/// thread. It makes no MPI call itself (only the worker thread does);
/// after a failure it stops the worker's arrival wait, and on drop it makes
/// the worker refuse queued work before saying goodbye.
pub(crate) struct MpiAbort {
    pub(crate) shared: Arc<Shared>,
}

impl Abort for MpiAbort {
    fn abort(&self, _reason: &str, after_failure: bool) {
        if after_failure {
            self.shared.interrupt.interrupt_current();
        } else {
            self.shared.leaving.store(true, Ordering::SeqCst);
        }
    }
}

/// Whether the ranks still run the same sequence of MPI operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Standing {
    /// Yes: a goodbye and `MPI_Finalize` are safe.
    InStep,
    /// A peer said goodbye while this rank wanted to work: it takes part in
    /// nothing more, so neither can this rank.
    PeerLeft,
    /// Requests were abandoned or MPI failed: nothing more can be matched.
    OutOfStep,
}

pub(crate) struct MpiBackend {
    /// `MPI_Finalize` happens when this drops; `None` once it did, or once
    /// it was deliberately leaked (a group out of step must not finalize).
    universe: Option<Universe>,
    /// Our own duplicate of `MPI_COMM_WORLD`, with errors returned instead
    /// of fatal, so brasa's traffic never matches anyone else's.
    comm: ffi::MPI_Comm,
    reductions: Option<Reductions>,
    rank: usize,
    world: usize,
    timeout: Duration,
    shared: Arc<Shared>,
    standing: Standing,
    /// Numbers the arrival waits, for [`Interrupt`].
    tickets: u64,
}

impl MpiBackend {
    /// Sets up the backend on the worker thread: duplicates the world
    /// communicator (a collective, so bounded by `timeout` like any other:
    /// a rank that never starts its communicator is a timeout here).
    pub(crate) fn new(
        universe: Universe,
        rank: usize,
        world: usize,
        timeout: Duration,
        shared: Arc<Shared>,
    ) -> Result<MpiBackend> {
        let mut backend = MpiBackend {
            universe: Some(universe),
            // SAFETY: reading a constant the rsmpi C shim exports.
            comm: unsafe { ffi::RSMPI_COMM_NULL },
            reductions: None,
            rank,
            world,
            timeout,
            shared,
            standing: Standing::InStep,
            tickets: 0,
        };
        let deadline = Deadline::after(timeout);
        // SAFETY: reading a constant the rsmpi C shim exports.
        let world_comm = unsafe { ffi::RSMPI_COMM_WORLD };
        // Open MPI writes the new handle when the request completes: on the
        // heap, so that an abandoned request can never write into a stack
        // frame that is gone.
        let mut comm = Box::new(backend.comm);
        let mut requests = [raw::null_request()];
        // SAFETY: MPI is initialised; `comm` and the request are written by MPI.
        let rc = unsafe { ffi::MPI_Comm_idup(world_comm, &mut *comm, &mut requests[0]) };
        if let Err(error) = raw::check(rc, rank, "MPI_Comm_idup") {
            backend.standing = Standing::OutOfStep;
            return Err(error);
        }
        backend.tickets += 1;
        if let Err(abandoned) =
            raw::poll(&mut requests, deadline, &backend.shared.interrupt, backend.tickets, rank, "MPI_Comm_idup")
        {
            std::mem::forget(comm);
            backend.standing = Standing::OutOfStep;
            return Err(backend.abandoned("init_from_env", abandoned, Vec::new()));
        }
        let comm = *comm;
        backend.comm = comm;
        // SAFETY: `comm` is the communicator just created; the handler is a
        // predefined one.
        let rc = unsafe { ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN) };
        raw::check(rc, rank, "MPI_Comm_set_errhandler").inspect_err(|_| backend.standing = Standing::OutOfStep)?;
        backend.reductions = Some(Reductions::new());
        Ok(backend)
    }

    fn abandoned(&self, op: &'static str, how: Abandoned, waiting_for: Vec<usize>) -> ParallelError {
        match how {
            Abandoned::Deadline | Abandoned::Interrupted => {
                ParallelError::Timeout { op, rank: self.rank, timeout: self.timeout, waiting_for }
            }
            Abandoned::Failed(error) => error,
        }
    }

    /// Arrival through every rank: posts `posted`, waits for everyone's
    /// descriptor and judges them.
    fn arrive_all(&mut self, op: &'static str, posted: &Posted) -> Result<()> {
        let deadline = Deadline::after(self.timeout);
        let ours = Box::new(encode(posted));
        let mut theirs = vec![0u64; WORDS * self.world].into_boxed_slice();
        let words = WORDS as c_int;
        let datatype = u64::equivalent_datatype().as_raw();
        let mut requests = [raw::null_request()];
        // SAFETY: both buffers outlive the request: they are freed only
        // after it completed, and leaked if it is abandoned.
        let rc = unsafe {
            ffi::MPI_Iallgather(
                ours.as_ptr() as *const c_void,
                words,
                datatype,
                theirs.as_mut_ptr() as *mut c_void,
                words,
                datatype,
                self.comm,
                &mut requests[0],
            )
        };
        if let Err(error) = raw::check(rc, self.rank, "MPI_Iallgather") {
            self.standing = Standing::OutOfStep;
            return Err(error);
        }
        self.tickets += 1;
        if let Err(how) = raw::poll(&mut requests, deadline, &self.shared.interrupt, self.tickets, self.rank, op) {
            // MPI may still write into `theirs` and read `ours`.
            std::mem::forget(ours);
            std::mem::forget(theirs);
            self.standing = Standing::OutOfStep;
            return Err(self.abandoned(op, how, Vec::new()));
        }
        let all: Vec<(usize, [u64; WORDS])> = theirs
            .chunks_exact(WORDS)
            .enumerate()
            .map(|(peer, words)| {
                let mut descriptor = [0u64; WORDS];
                descriptor.copy_from_slice(words);
                (peer, descriptor)
            })
            .collect();
        self.judge(op, posted, &all)
    }

    /// Arrival between this rank and `peer` (send/recv).
    fn arrive_pair(&mut self, op: &'static str, posted: &Posted, peer: usize) -> Result<()> {
        let deadline = Deadline::after(self.timeout);
        let ours = Box::new(encode(posted));
        let mut theirs = Box::new([0u64; WORDS]);
        let words = WORDS as c_int;
        let datatype = u64::equivalent_datatype().as_raw();
        let peer_rank = peer as c_int;
        let mut requests = [raw::null_request(), raw::null_request()];
        // SAFETY: as in `arrive_all`: the buffers outlive the requests.
        let rc = unsafe {
            ffi::MPI_Isend(
                ours.as_ptr() as *const c_void,
                words,
                datatype,
                peer_rank,
                TAG_SIGNATURE,
                self.comm,
                &mut requests[0],
            )
        };
        if let Err(error) = raw::check(rc, self.rank, "MPI_Isend") {
            self.standing = Standing::OutOfStep;
            return Err(error);
        }
        // SAFETY: as above.
        let rc = unsafe {
            ffi::MPI_Irecv(
                theirs.as_mut_ptr() as *mut c_void,
                words,
                datatype,
                peer_rank,
                TAG_SIGNATURE,
                self.comm,
                &mut requests[1],
            )
        };
        if let Err(error) = raw::check(rc, self.rank, "MPI_Irecv") {
            std::mem::forget(ours);
            self.standing = Standing::OutOfStep;
            return Err(error);
        }
        self.tickets += 1;
        if let Err(how) = raw::poll(&mut requests, deadline, &self.shared.interrupt, self.tickets, self.rank, op) {
            std::mem::forget(ours);
            std::mem::forget(theirs);
            self.standing = Standing::OutOfStep;
            return Err(self.abandoned(op, how, vec![peer]));
        }
        self.judge(op, posted, &[(self.rank, *ours), (peer, *theirs)])
    }

    fn judge(&mut self, op: &'static str, posted: &Posted, all: &[(usize, [u64; WORDS])]) -> Result<()> {
        match verdict(op, self.rank, posted, all) {
            Verdict::Agreed => Ok(()),
            // Every rank saw the same descriptors and refuses alike: still in step.
            Verdict::Mismatch(error) => Err(error),
            Verdict::PeerLeft(error) => {
                self.standing = Standing::PeerLeft;
                Err(error)
            }
            Verdict::Unreadable(error) => {
                self.standing = Standing::OutOfStep;
                Err(error)
            }
        }
    }

    /// The outcome of a data-phase call: an MPI error leaves the group out
    /// of step (ranks may have stopped at different points of the algorithm).
    fn data(&mut self, rc: c_int, what: &str) -> Result<()> {
        raw::check(rc, self.rank, what).inspect_err(|_| self.standing = Standing::OutOfStep)
    }

    fn reduction(
        &self,
        op: &'static str,
        tensor: &Tensor,
        reduce: ReduceOp,
    ) -> Result<(ffi::MPI_Datatype, ffi::MPI_Op)> {
        let reductions = self.reductions.as_ref().ok_or_else(|| ParallelError::Mpi {
            rank: self.rank,
            message: "the reduction operations are gone".into(),
            code: None,
        })?;
        reductions.pick(tensor.dtype(), reduce).ok_or_else(|| {
            ParallelError::invalid(op, format!("{} tensors cannot be reduced; use a float dtype", tensor.dtype()))
        })
    }

    fn all_reduce(&mut self, op: &Collective, tensor: &Tensor, reduce: ReduceOp) -> Result<()> {
        let name = op.name();
        let mut bytes = tensor.host_bytes_mut()?;
        self.arrive_all(name, &Posted::Op(op.signature(), Role::Collective))?;
        if tensor.numel() == 0 {
            return Ok(());
        }
        let count = raw::count(tensor.numel(), name)?;
        let (datatype, mpi_op) = self.reduction(name, tensor, reduce)?;
        // SAFETY: the write guard gives MPI exclusive use of `count`
        // elements of `datatype` at the pointer until the call returns.
        let rc = unsafe {
            ffi::MPI_Allreduce(raw::in_place(), bytes.as_mut_ptr() as *mut c_void, count, datatype, mpi_op, self.comm)
        };
        self.data(rc, "MPI_Allreduce")?;
        if reduce == ReduceOp::Avg {
            scale_for_average(tensor.dtype(), &mut bytes, self.world);
        }
        Ok(())
    }

    fn reduce_scatter(&mut self, op: &Collective, input: &Tensor, output: &Tensor, reduce: ReduceOp) -> Result<()> {
        let name = op.name();
        // Distinct storages (validated), so the two locks cannot deadlock.
        let source = input.host_bytes()?;
        let mut dest = output.host_bytes_mut()?;
        self.arrive_all(name, &Posted::Op(op.signature(), Role::Collective))?;
        if output.numel() == 0 {
            return Ok(());
        }
        let count = raw::count(output.numel(), name)?;
        raw::count(input.numel(), name)?;
        let (datatype, mpi_op) = self.reduction(name, output, reduce)?;
        // SAFETY: the read guard keeps `world × count` input elements
        // stable, the write guard gives MPI the `count` output elements.
        let rc = unsafe {
            ffi::MPI_Reduce_scatter_block(
                source.as_ptr() as *const c_void,
                dest.as_mut_ptr() as *mut c_void,
                count,
                datatype,
                mpi_op,
                self.comm,
            )
        };
        self.data(rc, "MPI_Reduce_scatter_block")?;
        if reduce == ReduceOp::Avg {
            scale_for_average(output.dtype(), &mut dest, self.world);
        }
        Ok(())
    }

    fn all_gather(&mut self, op: &Collective, input: &Tensor, output: &Tensor) -> Result<()> {
        let name = op.name();
        let mut dest = output.host_bytes_mut()?;
        // In place when the input is this rank's slot of the output: then
        // the output's write guard covers both (taking the input's read
        // guard too would deadlock on the one storage lock).
        let source = if input.shares_storage_with(output) {
            let offset = input.layout().offset() as isize - output.layout().offset() as isize;
            let slot = (self.rank * input.numel()) as isize;
            if offset != slot {
                return Err(ParallelError::invalid(
                    name,
                    format!(
                        "the input shares storage with the output but is not rank {}'s slot of it (elements {} .. {})",
                        self.rank,
                        slot,
                        slot + input.numel() as isize
                    ),
                ));
            }
            None
        } else {
            Some(input.host_bytes()?)
        };
        self.arrive_all(name, &Posted::Op(op.signature(), Role::Collective))?;
        if input.numel() == 0 {
            return Ok(());
        }
        let count = raw::count(input.numel(), name)?;
        raw::count(output.numel(), name)?;
        let datatype = copy_datatype(output.dtype());
        let out = dest.as_mut_ptr() as *mut c_void;
        // SAFETY: the guards give MPI the input's elements to read and the
        // output's `world × count` elements to write until the call returns;
        // in place, MPI reads this rank's slot of the output.
        let rc = unsafe {
            match &source {
                Some(source) => ffi::MPI_Allgather(
                    source.as_ptr() as *const c_void,
                    count,
                    datatype,
                    out,
                    count,
                    datatype,
                    self.comm,
                ),
                None => ffi::MPI_Allgather(
                    raw::in_place() as *const c_void,
                    0,
                    ffi::RSMPI_DATATYPE_NULL,
                    out,
                    count,
                    datatype,
                    self.comm,
                ),
            }
        };
        self.data(rc, "MPI_Allgather")
    }

    fn broadcast(&mut self, op: &Collective, tensor: &Tensor, root: usize) -> Result<()> {
        let name = op.name();
        // The root only reads: a read guard, so its tensor's version (what
        // autograd checks for in-place changes) does not move.
        enum Guard<'a> {
            Read(brasa_tensor::HostBytes<'a>),
            Write(brasa_tensor::HostBytesMut<'a>),
        }
        let mut guard =
            if self.rank == root { Guard::Read(tensor.host_bytes()?) } else { Guard::Write(tensor.host_bytes_mut()?) };
        self.arrive_all(name, &Posted::Op(op.signature(), Role::Collective))?;
        if tensor.numel() == 0 {
            return Ok(());
        }
        let count = raw::count(tensor.numel(), name)?;
        let buffer = match &mut guard {
            // MPI_Bcast takes a `void *` but does not write at the root.
            Guard::Read(bytes) => bytes.as_ptr() as *mut c_void,
            Guard::Write(bytes) => bytes.as_mut_ptr() as *mut c_void,
        };
        // SAFETY: the guard covers `count` elements at `buffer` until the
        // call returns (read at the root, written elsewhere).
        let rc = unsafe { ffi::MPI_Bcast(buffer, count, copy_datatype(tensor.dtype()), root as c_int, self.comm) };
        self.data(rc, "MPI_Bcast")
    }

    fn send(&mut self, op: &Collective, tensor: &Tensor, peer: usize) -> Result<()> {
        let name = op.name();
        let bytes = tensor.host_bytes()?;
        self.arrive_pair(name, &Posted::Op(op.signature(), Role::Sender), peer)?;
        if tensor.numel() == 0 {
            return Ok(());
        }
        let count = raw::count(tensor.numel(), name)?;
        // SAFETY: the read guard keeps the `count` elements stable until
        // MPI_Send returns (the buffer is then MPI's no more).
        let rc = unsafe {
            ffi::MPI_Send(
                bytes.as_ptr() as *const c_void,
                count,
                copy_datatype(tensor.dtype()),
                peer as c_int,
                TAG_DATA,
                self.comm,
            )
        };
        self.data(rc, "MPI_Send")
    }

    fn recv(&mut self, op: &Collective, tensor: &Tensor, peer: usize) -> Result<()> {
        let name = op.name();
        let mut bytes = tensor.host_bytes_mut()?;
        self.arrive_pair(name, &Posted::Op(op.signature(), Role::Receiver), peer)?;
        if tensor.numel() == 0 {
            return Ok(());
        }
        let count = raw::count(tensor.numel(), name)?;
        // SAFETY: the write guard gives MPI the `count` elements until
        // MPI_Recv returns; the sender agreed on the same count and dtype.
        let rc = unsafe {
            ffi::MPI_Recv(
                bytes.as_mut_ptr() as *mut c_void,
                count,
                copy_datatype(tensor.dtype()),
                peer as c_int,
                TAG_DATA,
                self.comm,
                ffi::RSMPI_STATUS_IGNORE,
            )
        };
        self.data(rc, "MPI_Recv")
    }

    /// Leaves the group. Only an in-step group calls `MPI_Finalize`, and
    /// only once every rank posted its goodbye (an arrival like any other,
    /// bounded by the timeout): `MPI_Finalize` waits for all ranks, so a
    /// rank finalizing while a peer is still in a collective would hang
    /// both. Otherwise MPI is left initialised and the process exits
    /// without finalizing, which the launcher reports as a failed job and
    /// ends; that is the right outcome, since something failed.
    fn shutdown(&mut self) {
        // SAFETY: reading a constant the rsmpi C shim exports.
        let null_comm = unsafe { ffi::RSMPI_COMM_NULL };
        let clean = self.standing == Standing::InStep
            && self.comm != null_comm
            && self.arrive_all("leave", &Posted::Leave).is_ok();
        if clean {
            // Free what MPI_Finalize would otherwise report as leaked, in
            // reverse order of creation, then finalize (Universe's drop).
            drop(self.reductions.take());
            // SAFETY: our own communicator, with no pending operation (every
            // request on it completed: the group is in step).
            let rc = unsafe { ffi::MPI_Comm_free(&mut self.comm) };
            if rc == ffi::MPI_SUCCESS as c_int {
                drop(self.universe.take());
            } else {
                std::mem::forget(self.universe.take());
            }
        } else {
            // Pending requests may still reference the buffers of abandoned
            // operations: free nothing, finalize nothing.
            std::mem::forget(self.reductions.take());
            std::mem::forget(self.universe.take());
        }
        super::ended();
    }
}

impl Drop for MpiBackend {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl CollectiveEngine for MpiBackend {
    fn run(&mut self, op: &Collective) -> Result<()> {
        if self.shared.leaving.load(Ordering::SeqCst) {
            return Err(ParallelError::Broken {
                rank: self.rank,
                cause: "the communicator was dropped before this operation ran".into(),
                source: None,
            });
        }
        match self.standing {
            Standing::InStep => {}
            Standing::PeerLeft => {
                return Err(ParallelError::Broken {
                    rank: self.rank,
                    cause: "a peer left the MPI group".into(),
                    source: None,
                })
            }
            Standing::OutOfStep => {
                return Err(ParallelError::Broken {
                    rank: self.rank,
                    cause: "the MPI group is out of step after an earlier timeout or MPI error".into(),
                    source: None,
                })
            }
        }
        match op {
            Collective::AllReduce { tensor, op: reduce } => self.all_reduce(op, tensor, *reduce),
            Collective::ReduceScatter { input, output, op: reduce } => self.reduce_scatter(op, input, output, *reduce),
            Collective::AllGather { input, output } => self.all_gather(op, input, output),
            Collective::Broadcast { tensor, root } => self.broadcast(op, tensor, *root),
            Collective::Send { tensor, peer } => self.send(op, tensor, *peer),
            Collective::Recv { tensor, peer } => self.recv(op, tensor, *peer),
            Collective::Barrier => self.arrive_all(op.name(), &Posted::Op(op.signature(), Role::Collective)),
        }
    }
}
