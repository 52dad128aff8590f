//! The raw MPI calls the backend makes itself, and why it makes them
//! through `mpi::ffi` rather than the `mpi` crate's safe API:
//!
//! - the safe API ignores return codes (it relies on MPI's default
//!   "errors are fatal" handler), while every call here checks its code,
//!   so a failure becomes [`ParallelError::Mpi`] with MPI's own message;
//! - it has no `MPI_IN_PLACE` (the C shim `shim.c` provides it) and no
//!   `MPI_Comm_idup`;
//! - a request that must be abandoned after a timeout cannot be dropped
//!   in its scopes without aborting, while here it can simply be left.
//!
//! Also here: [`poll`], which waits for non-blocking requests with a
//! deadline, so that a peer that never arrives is a timeout, not a hang.

use crate::deadline::Deadline;
use crate::error::{ParallelError, Result};
use ::mpi::ffi;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

extern "C" {
    /// `MPI_IN_PLACE` of the MPI being linked (src/mpi/shim.c).
    fn brasa_mpi_in_place() -> *mut c_void;
}

/// `MPI_IN_PLACE`: the send buffer argument that says "the data is already
/// in the receive buffer".
pub(crate) fn in_place() -> *mut c_void {
    // SAFETY: the shim returns a constant and touches nothing.
    unsafe { brasa_mpi_in_place() }
}

/// MPI's text for error code `code`.
pub(crate) fn error_string(code: c_int) -> String {
    let mut text = [0 as c_char; 1024];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING (256 in Open MPI and
    // MPICH) characters and more; MPI writes at most that and sets `len`.
    let rc = unsafe { ffi::MPI_Error_string(code, text.as_mut_ptr(), &mut len) };
    if rc != ffi::MPI_SUCCESS as c_int {
        return format!("MPI error code {code}");
    }
    let len = usize::try_from(len).unwrap_or(0).min(text.len());
    let bytes: Vec<u8> = text[..len].iter().map(|&c| c as u8).collect();
    format!("{} (MPI error code {code})", String::from_utf8_lossy(&bytes))
}

/// `Ok` for `MPI_SUCCESS`, else [`ParallelError::Mpi`] naming `what`.
pub(crate) fn check(rc: c_int, rank: usize, what: &str) -> Result<()> {
    if rc == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(ParallelError::Mpi { rank, message: format!("{what} failed: {}", error_string(rc)), code: Some(rc) })
    }
}

/// An element count as MPI's `int`, or an error naming the limit.
pub(crate) fn count(n: usize, op: &'static str) -> Result<c_int> {
    c_int::try_from(n).map_err(|_| {
        ParallelError::invalid(
            op,
            format!("{n} elements exceed MPI's count limit of {} per call; split the tensor", c_int::MAX),
        )
    })
}

/// A null request (what `MPI_Test` leaves behind when a request completes).
pub(crate) fn null_request() -> ffi::MPI_Request {
    // SAFETY: reading a constant the rsmpi C shim exports.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

/// Where the worker says which exchange it is polling, and another thread
/// asks it to give up on one: the number of the exchange, so that a
/// request to interrupt one exchange can never hit a later one.
#[derive(Default)]
pub(crate) struct Interrupt {
    polling: AtomicU64,
    interrupt: AtomicU64,
}

impl Interrupt {
    /// Asks the worker to stop waiting in the exchange it polls now, if any.
    pub(crate) fn interrupt_current(&self) {
        let current = self.polling.load(Ordering::SeqCst);
        if current != 0 {
            self.interrupt.store(current, Ordering::SeqCst);
        }
    }
}

/// How [`poll`] ended when it did not complete.
pub(crate) enum Abandoned {
    /// The deadline passed.
    Deadline,
    /// Another thread gave up on this operation ([`Interrupt::interrupt_current`]).
    Interrupted,
    /// `MPI_Testall` failed.
    Failed(ParallelError),
}

/// Waits until every request in `requests` completed, the deadline passed
/// or `interrupt` asks to stop (exchange number `ticket`, nonzero).
///
/// Open MPI only makes progress inside MPI calls, so this keeps calling
/// `MPI_Testall`: back to back for the first ~100 µs (ranks that arrive
/// together finish here, at full speed), then yielding the core between
/// tests, then sleeping up to 200 µs between them, so that a rank waiting
/// for a late peer leaves the CPU to whoever computes (two ranks may share
/// two cores). A peer arriving late is noticed within one sleep.
///
/// After an `Err`, the requests are still pending: their buffers must stay
/// alive and untouched for as long as the process runs.
pub(crate) fn poll(
    requests: &mut [ffi::MPI_Request],
    deadline: Deadline,
    interrupt: &Interrupt,
    ticket: u64,
    rank: usize,
    what: &str,
) -> std::result::Result<(), Abandoned> {
    interrupt.polling.store(ticket, Ordering::SeqCst);
    let outcome = poll_inner(requests, deadline, interrupt, ticket, rank, what);
    interrupt.polling.store(0, Ordering::SeqCst);
    outcome
}

fn poll_inner(
    requests: &mut [ffi::MPI_Request],
    deadline: Deadline,
    interrupt: &Interrupt,
    ticket: u64,
    rank: usize,
    what: &str,
) -> std::result::Result<(), Abandoned> {
    let count = c_int::try_from(requests.len()).unwrap_or(c_int::MAX);
    let start = Instant::now();
    let mut sleep = Duration::from_micros(5);
    loop {
        let mut done: c_int = 0;
        // SAFETY: `requests` are live requests (or null ones) of this
        // process; statuses are ignored.
        let rc = unsafe { ffi::MPI_Testall(count, requests.as_mut_ptr(), &mut done, ffi::RSMPI_STATUSES_IGNORE) };
        check(rc, rank, what).map_err(Abandoned::Failed)?;
        if done != 0 {
            return Ok(());
        }
        if interrupt.interrupt.load(Ordering::SeqCst) == ticket {
            return Err(Abandoned::Interrupted);
        }
        if deadline.passed() {
            return Err(Abandoned::Deadline);
        }
        let waited = start.elapsed();
        if waited < Duration::from_micros(100) {
            std::hint::spin_loop();
        } else if waited < Duration::from_millis(2) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(deadline.remaining().map_or(sleep, |left| sleep.min(left)));
            sleep = (sleep * 2).min(Duration::from_micros(200));
        }
    }
}
