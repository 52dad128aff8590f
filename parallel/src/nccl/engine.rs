//! One rank's NCCL communicator behind the [`CollectiveEngine`] interface.
//!
//! Each collective is queued on the engine's own CUDA stream (the
//! communication stream) after the event the submitting thread recorded
//! on its current stream, so it reads what the kernels before it wrote and
//! runs beside the kernels after it. The worker thread then polls the
//! stream's completion event and NCCL's asynchronous error until the
//! collective is done, the communicator fails, or the timeout passes (the
//! communicator is then aborted, as PyTorch's watchdog does); the tensors
//! the collective uses are held until then, so the caching allocator
//! cannot hand their memory to anyone else while NCCL reads it.

use super::library::{data_type, reduction, Nccl, RawComm, IN_PROGRESS, SUCCESS};
use crate::collective::{Collective, ReduceOp, Signature};
use crate::communicator::CollectiveEngine;
use crate::deadline::Deadline;
use crate::error::{ParallelError, Result};
use crate::health::Abort;
use brasa_tensor::{cuda_interop, DType, Device, Event, Stream, Tensor};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A communicator handle that is destroyed once: by the engine when it is
/// dropped, or aborted after a failure. Every NCCL call on it is made with
/// its lock held, so an abort asked for from another thread (a `Work`
/// that timed out, a dropped communicator) never frees the communicator
/// under a call: it runs at once when no call is in progress, else right
/// after the call returns.
pub(crate) struct CommHandle {
    nccl: &'static Nccl,
    rank: usize,
    /// `None` once destroyed or aborted.
    raw: Mutex<Option<SendComm>>,
    /// An abort was asked for while a call held the lock.
    abort_requested: AtomicBool,
}

/// `ncclComm_t` moved between threads: NCCL allows a communicator to be
/// used from any thread, one at a time, and aborted from another.
#[derive(Clone, Copy)]
struct SendComm(RawComm);
// SAFETY: see the type's comment.
unsafe impl Send for SendComm {}

impl CommHandle {
    pub(crate) fn new(nccl: &'static Nccl, rank: usize, raw: RawComm) -> CommHandle {
        CommHandle { nccl, rank, raw: Mutex::new(Some(SendComm(raw))), abort_requested: AtomicBool::new(false) }
    }

    /// Runs `call` on the live handle with the lock held (then honours an
    /// abort asked for meanwhile), or returns the error of a communicator
    /// already aborted.
    fn with<T>(&self, op: &'static str, call: impl FnOnce(RawComm) -> Result<T>) -> Result<T> {
        let result = {
            let guard = self.raw.lock().unwrap_or_else(|e| e.into_inner());
            match *guard {
                Some(SendComm(raw)) => call(raw),
                None => Err(ParallelError::Broken {
                    rank: self.rank,
                    cause: format!("{op}: the NCCL communicator was aborted after an earlier failure"),
                    source: None,
                }),
            }
        };
        if self.abort_requested.load(Ordering::Acquire) {
            self.abort_now();
        }
        result
    }

    /// Aborts the communicator (its pending device work is dropped) if it
    /// is still live. Only called where no NCCL call on it is in progress.
    fn abort_now(&self) {
        if let Some(SendComm(raw)) = self.raw.lock().unwrap_or_else(|e| e.into_inner()).take() {
            // SAFETY: `raw` is a live communicator, taken out under the lock
            // that every call holds, so nothing uses it after this.
            unsafe { (self.nccl.comm_abort)(raw) };
        }
    }

    /// The device memory NCCL holds for this communicator, where the
    /// library can say.
    /// `None` too while a call holds the communicator: a query must not
    /// wait on a collective (one stuck on a peer would hang it).
    pub(crate) fn memory(&self) -> Option<u64> {
        let guard = self.raw.try_lock().ok()?;
        let raw = (*guard)?;
        self.nccl.memory_of(raw.0)
    }
}

impl Drop for CommHandle {
    fn drop(&mut self) {
        if let Some(SendComm(raw)) = self.raw.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            // SAFETY: the last owner of a live communicator; the engine
            // waited for every collective it queued.
            unsafe { (self.nccl.comm_destroy)(raw) };
        }
    }
}

impl Abort for CommHandle {
    fn abort(&self, _reason: &str, _after_failure: bool) {
        // NCCL tells the peers nothing itself: their collectives fail at
        // their own timeouts (or with NCCL's remote error).
        self.abort_requested.store(true, Ordering::Release);
        // Abort now unless a call holds the lock; that call's `with`
        // aborts when it returns. A call that never returns (a blocking
        // enqueue waiting for a peer that froze) leaves the communicator to
        // the process's end rather than blocking here.
        let taken = match self.raw.try_lock() {
            Ok(mut guard) => guard.take(),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner().take(),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        if let Some(SendComm(raw)) = taken {
            // SAFETY: taken out under the lock that every call holds.
            unsafe { (self.nccl.comm_abort)(raw) };
        }
    }
}

/// The engine of one rank.
pub(crate) struct NcclEngine {
    pub(crate) nccl: &'static Nccl,
    pub(crate) comm: Arc<CommHandle>,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) device: Device,
    pub(crate) timeout: Duration,
    /// The communication stream, made on the worker thread.
    pub(crate) stream: Option<Stream>,
}

/// The collectives' names and reductions in the order of their codes in
/// an encoded signature.
const OPS: [&str; 7] = ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "send", "recv", "barrier"];
const REDUCTIONS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];

/// What ranks must agree on, in five integers (-1: absent).
fn encode(s: &Signature) -> [i64; 5] {
    let code = |position: Option<usize>| position.map_or(-1, |p| p as i64);
    [
        code(OPS.iter().position(|op| *op == s.op)),
        code(s.dtype.and_then(|d| DType::ALL.iter().position(|x| *x == d))),
        s.numel as i64,
        code(s.reduce.and_then(|r| REDUCTIONS.iter().position(|x| *x == r))),
        code(s.root),
    ]
}

/// A peer's encoded signature, back (`None` for words no rank encodes).
fn decode(words: &[i64]) -> Option<Signature> {
    let at = |i: usize| words.get(i).and_then(|&w| usize::try_from(w).ok());
    Some(Signature {
        op: OPS.get(at(0)?)?,
        dtype: at(1).and_then(|d| DType::ALL.get(d).copied()),
        numel: at(2)?,
        reduce: at(3).and_then(|r| REDUCTIONS.get(r).copied()),
        root: at(4),
    })
}

impl NcclEngine {
    fn stream(&mut self) -> Result<Stream> {
        if let Some(stream) = self.stream {
            return Ok(stream);
        }
        let stream = Stream::new(self.device)?;
        self.stream = Some(stream);
        Ok(stream)
    }

    /// Waits for `done` while watching NCCL's asynchronous error and the
    /// deadline; aborts the communicator on either failure.
    fn wait_done(&self, op: &'static str, done: &Event, deadline: Deadline) -> Result<()> {
        let started = Instant::now();
        loop {
            if done.query() {
                return Ok(());
            }
            let nccl = self.nccl;
            let failed = self.comm.with(op, |comm| {
                let mut state = SUCCESS;
                // SAFETY: `comm` is live (the lock is held); `state` is a valid out-pointer.
                let code = unsafe { (nccl.comm_get_async_error)(comm, &mut state) };
                nccl.check(self.rank, "ncclCommGetAsyncError", code, Some(comm))?;
                Ok((state != SUCCESS && state != IN_PROGRESS)
                    .then(|| nccl.error(self.rank, op_call(op), state, Some(comm))))
            })?;
            if let Some(error) = failed {
                self.comm.abort_now();
                return Err(error);
            }
            if deadline.passed() {
                self.comm.abort_now();
                return Err(ParallelError::Timeout { op, rank: self.rank, timeout: self.timeout, waiting_for: vec![] });
            }
            // Spin briefly (collectives of a few hundred microseconds
            // are common), then yield the core.
            if started.elapsed() < Duration::from_micros(200) {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    /// Exchanges `op`'s signature with every rank (an all-gather of five
    /// integers) and names the first rank that disagrees.
    fn check_signature(&mut self, op: &Collective, deadline: Deadline) -> Result<()> {
        let stream = self.stream()?;
        let ours = encode(&op.signature());
        let words = ours.len();
        let mine = {
            let _on = stream.make_current();
            Tensor::from_vec_on(ours.to_vec(), [words], self.device)?
        };
        let all = {
            let _on = stream.make_current();
            Tensor::zeros_on([words * self.world], DType::I64, self.device)?
        };
        self.enqueue(&Collective::AllGather { input: mine, output: all.clone() }, &stream, deadline)?;
        let gathered: Vec<i64> = {
            let _on = stream.make_current();
            all.to_vec()?
        };
        for (peer, theirs) in gathered.chunks(words).enumerate() {
            if theirs != ours {
                return Err(ParallelError::Mismatch {
                    op: op.name(),
                    rank: self.rank,
                    ours: op.signature().to_string(),
                    peer,
                    theirs: decode(theirs)
                        .map_or_else(|| format!("an unreadable signature {theirs:?}"), |s| s.to_string()),
                });
            }
        }
        Ok(())
    }

    /// Queues `op` on `stream` and waits for it.
    fn enqueue(&mut self, op: &Collective, stream: &Stream, deadline: Deadline) -> Result<()> {
        let name = op.name();
        let raw_stream = cuda_interop::cuda_stream(stream)? as *mut c_void;
        let nccl = self.nccl;
        let ptr = |t: &Tensor| -> Result<*mut c_void> { Ok(cuda_interop::data_ptr(t)? as usize as *mut c_void) };
        // A barrier is an all-reduce of one element, made on the
        // communication stream and held until the barrier completes.
        let barrier_scratch = match op {
            Collective::Barrier => {
                let _on = stream.make_current();
                Some(Tensor::zeros_on([1], DType::F32, self.device)?)
            }
            _ => None,
        };
        self.comm.with(name, |comm| {
            // SAFETY: every call below gets pointers to live, contiguous
            // device tensors of at least the counts given (validated by
            // `Collective::validate` before submission and held by `op`, or
            // `barrier_scratch`, until the collective completes); the stream
            // and communicator belong to this rank's device, whose context is
            // current; the communicator's lock is held.
            let code = unsafe {
                match op {
                    Collective::AllReduce { tensor, op } => (nccl.all_reduce)(
                        ptr(tensor)?,
                        ptr(tensor)?,
                        tensor.numel(),
                        data_type(tensor.dtype()),
                        reduction(*op),
                        comm,
                        raw_stream,
                    ),
                    Collective::Broadcast { tensor, root } => (nccl.broadcast)(
                        ptr(tensor)?,
                        ptr(tensor)?,
                        tensor.numel(),
                        data_type(tensor.dtype()),
                        *root as i32,
                        comm,
                        raw_stream,
                    ),
                    Collective::AllGather { input, output } => (nccl.all_gather)(
                        ptr(input)?,
                        ptr(output)?,
                        input.numel(),
                        data_type(input.dtype()),
                        comm,
                        raw_stream,
                    ),
                    Collective::ReduceScatter { input, output, op } => (nccl.reduce_scatter)(
                        ptr(input)?,
                        ptr(output)?,
                        output.numel(),
                        data_type(output.dtype()),
                        reduction(*op),
                        comm,
                        raw_stream,
                    ),
                    Collective::Send { tensor, peer } => (nccl.send)(
                        ptr(tensor)?,
                        tensor.numel(),
                        data_type(tensor.dtype()),
                        *peer as i32,
                        comm,
                        raw_stream,
                    ),
                    Collective::Recv { tensor, peer } => (nccl.recv)(
                        ptr(tensor)?,
                        tensor.numel(),
                        data_type(tensor.dtype()),
                        *peer as i32,
                        comm,
                        raw_stream,
                    ),
                    Collective::Barrier => {
                        let scratch = barrier_scratch.as_ref().map(ptr).transpose()?.unwrap_or(std::ptr::null_mut());
                        (nccl.all_reduce)(scratch, scratch, 1, data_type(DType::F32), 0, comm, raw_stream)
                    }
                }
            };
            if code == SUCCESS || code == IN_PROGRESS {
                Ok(())
            } else {
                Err(nccl.error(self.rank, op_call(name), code, Some(comm)))
            }
        })?;
        let done = stream.record_event(false)?;
        self.wait_done(name, &done, deadline)?;
        drop(barrier_scratch);
        Ok(())
    }
}

/// The NCCL function behind a collective's name, for error messages.
fn op_call(op: &'static str) -> &'static str {
    match op {
        "all_reduce" | "barrier" => "ncclAllReduce",
        "broadcast" => "ncclBroadcast",
        "all_gather" => "ncclAllGather",
        "reduce_scatter" => "ncclReduceScatter",
        "send" => "ncclSend",
        "recv" => "ncclRecv",
        _ => "an NCCL collective",
    }
}

impl CollectiveEngine for NcclEngine {
    fn run(&mut self, op: &Collective) -> Result<()> {
        self.run_after(op, None)
    }

    fn reads_device_memory(&self) -> bool {
        true
    }

    fn run_after(&mut self, op: &Collective, ready: Option<&Event>) -> Result<()> {
        let deadline = Deadline::after(self.timeout);
        cuda_interop::bind_context(self.device)?;
        let stream = self.stream()?;
        if let Some(ready) = ready {
            stream.wait_event(ready)?;
        }
        let point_to_point = matches!(op, Collective::Send { .. } | Collective::Recv { .. });
        if self.world > 1 && !point_to_point {
            self.check_signature(op, deadline)?;
        }
        self.enqueue(op, &stream, deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_round_trip_through_their_words() {
        let all = [
            Signature {
                op: "all_reduce",
                dtype: Some(DType::BF16),
                numel: 1 << 20,
                reduce: Some(ReduceOp::Avg),
                root: None,
            },
            Signature { op: "broadcast", dtype: Some(DType::I64), numel: 3, reduce: None, root: Some(2) },
            Signature { op: "barrier", dtype: None, numel: 0, reduce: None, root: None },
        ];
        for signature in all {
            let words = encode(&signature);
            assert_eq!(decode(&words), Some(signature), "{words:?}");
        }
        assert_eq!(decode(&[99, -1, 0, -1, -1]), None);
        assert_eq!(decode(&[0, -1]), None);
    }
}
