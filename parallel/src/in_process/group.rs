//! The meeting point of an in-process group: ranks post what they are about
//! to do (a signature and their buffers' addresses), wait for each other
//! with a timeout, and leave when their communicator is dropped, which makes
//! everyone still waiting on them fail at once.

use crate::collective::Signature;
use crate::deadline::Deadline;
use crate::error::{ParallelError, Result};
use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// What one rank lends the others for one collective: the signature to
/// compare and the addresses of its buffers (valid until the collective's
/// closing barrier; the rank holds its storages' locks until then).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Posted {
    pub(crate) signature: Signature,
    /// The input (or only) buffer.
    pub(crate) input: usize,
    /// The output buffer (same as `input` for in-place collectives).
    pub(crate) output: usize,
}

/// Where a send stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Waiting for the receiver.
    Offered,
    /// The receiver is copying: the sender must not give up now.
    Copying,
    /// Done.
    Taken,
}

/// A sender's offer, waiting for its receiver.
#[derive(Clone, Copy, Debug)]
struct Letter {
    signature: Signature,
    data: usize,
    stage: Stage,
}

struct State {
    /// Ranks waiting at the current barrier, and how many barriers completed.
    arrived: usize,
    generation: u64,
    posted: Vec<Option<Posted>>,
    /// What everyone posted for the last completed opening barrier (kept
    /// until every rank passed the closing one, so late wakers read it).
    round: Vec<Option<Posted>>,
    /// Why a rank left, once it did, and whether it only gave up after
    /// another failure.
    departed: Vec<Option<(String, bool)>>,
    /// Pending sends by (sender, receiver).
    letters: HashMap<(usize, usize), Letter>,
}

pub(crate) struct Group {
    world: usize,
    state: Mutex<State>,
    changed: Condvar,
}

impl Group {
    pub(crate) fn new(world: usize) -> Group {
        Group {
            world,
            state: Mutex::new(State {
                arrived: 0,
                generation: 0,
                posted: vec![None; world],
                round: vec![None; world],
                departed: vec![None; world],
                letters: HashMap::new(),
            }),
            changed: Condvar::new(),
        }
    }

    pub(crate) fn world(&self) -> usize {
        self.world
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Rank `rank` leaves: everyone waiting on it fails with `reason`.
    pub(crate) fn depart(&self, rank: usize, reason: &str, after_failure: bool) {
        let mut state = self.lock();
        if state.departed[rank].is_none() {
            state.departed[rank] = Some((reason.to_string(), after_failure));
        }
        drop(state);
        self.changed.notify_all();
    }

    /// A departed rank among `among` (`None`: all) as an error, naming a
    /// rank that left on its own before one that gave up because of it.
    fn departure(state: &State, op: &'static str, rank: usize, among: Option<usize>) -> Option<ParallelError> {
        if let Some((reason, _)) = &state.departed[rank] {
            return Some(ParallelError::Broken { rank, cause: format!("{op}: this rank {reason}"), source: None });
        }
        let gone = |cascade: bool| {
            state.departed.iter().enumerate().find_map(|(peer, departed)| match departed {
                Some((reason, after_failure)) if *after_failure == cascade && among.is_none_or(|p| p == peer) => {
                    Some(ParallelError::PeerFailed { op, rank, peer, reason: reason.clone() })
                }
                _ => None,
            })
        };
        gone(false).or_else(|| gone(true))
    }

    /// Waits until every rank arrived (posting `posted` for the others to
    /// read) and returns what everyone posted. A barrier that
    /// completed succeeds even if a rank left right after it.
    pub(crate) fn arrive(
        &self,
        op: &'static str,
        rank: usize,
        posted: Posted,
        timeout: Duration,
    ) -> Result<Vec<Option<Posted>>> {
        let deadline = Deadline::after(timeout);
        let mut state = self.lock();
        if let Some(error) = Self::departure(&state, op, rank, None) {
            return Err(error);
        }
        state.posted[rank] = Some(posted);
        let generation = state.generation;
        state.arrived += 1;
        if state.arrived == self.world {
            state.arrived = 0;
            state.generation += 1;
            let everyone = std::mem::replace(&mut state.posted, vec![None; self.world]);
            state.round = everyone.clone();
            drop(state);
            self.changed.notify_all();
            return Ok(everyone);
        }
        loop {
            if state.generation != generation {
                return Ok(state.round.clone());
            }
            if let Some(error) = Self::departure(&state, op, rank, None) {
                return Err(error);
            }
            if deadline.passed() {
                let waiting_for = (0..self.world).filter(|r| *r != rank && state.posted[*r].is_none()).collect();
                return Err(ParallelError::Timeout { op, rank, timeout, waiting_for });
            }
            state = deadline.wait(&self.changed, state);
        }
    }

    /// The closing barrier of a collective's data phase. Every rank that
    /// passed the opening barrier is in a bounded copy into its peers'
    /// buffers, so this waits for all of them with no timeout and whatever
    /// happened meanwhile: returning earlier would let this rank release a
    /// buffer a peer is still writing.
    pub(crate) fn finish_data_phase(&self) {
        let mut state = self.lock();
        let generation = state.generation;
        state.arrived += 1;
        if state.arrived == self.world {
            state.arrived = 0;
            state.generation += 1;
            drop(state);
            self.changed.notify_all();
            return;
        }
        while state.generation == generation {
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Offers `data` to `receiver` and waits until it was taken.
    pub(crate) fn send(
        &self,
        rank: usize,
        receiver: usize,
        signature: Signature,
        data: usize,
        timeout: Duration,
    ) -> Result<()> {
        let deadline = Deadline::after(timeout);
        let mut state = self.lock();
        state.letters.insert((rank, receiver), Letter { signature, data, stage: Stage::Offered });
        self.changed.notify_all();
        loop {
            let stage = state.letters.get(&(rank, receiver)).map(|l| l.stage);
            if stage == Some(Stage::Taken) {
                state.letters.remove(&(rank, receiver));
                return Ok(());
            }
            if stage == Some(Stage::Copying) {
                // The copy is bounded and reads our buffer: wait it out.
                state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            if let Some(error) = Self::departure(&state, "send", rank, Some(receiver)) {
                state.letters.remove(&(rank, receiver));
                return Err(error);
            }
            if deadline.passed() {
                state.letters.remove(&(rank, receiver));
                return Err(ParallelError::Timeout { op: "send", rank, timeout, waiting_for: vec![receiver] });
            }
            state = deadline.wait(&self.changed, state);
        }
    }

    /// Waits for `sender`'s offer, checks it against `signature`, and runs
    /// `copy` with its address while the sender waits.
    pub(crate) fn recv(
        &self,
        rank: usize,
        sender: usize,
        signature: Signature,
        timeout: Duration,
        copy: impl FnOnce(usize),
    ) -> Result<()> {
        let deadline = Deadline::after(timeout);
        let mut state = self.lock();
        loop {
            if let Some(letter) = state.letters.get(&(sender, rank)).copied().filter(|l| l.stage == Stage::Offered) {
                if letter.signature != signature {
                    // Refuse it; the sender learns by its own timeout or
                    // by this rank breaking and leaving.
                    return Err(ParallelError::Mismatch {
                        op: "recv",
                        rank,
                        ours: format!("recv of {} {:?} elements", signature.numel, signature.dtype),
                        peer: sender,
                        theirs: format!("send of {} {:?} elements", letter.signature.numel, letter.signature.dtype),
                    });
                }
                // The sender waits (holding its lock on the data) while the
                // letter is being copied, so copying outside our lock is safe.
                if let Some(letter) = state.letters.get_mut(&(sender, rank)) {
                    letter.stage = Stage::Copying;
                }
                drop(state);
                copy(letter.data);
                let mut state = self.lock();
                if let Some(letter) = state.letters.get_mut(&(sender, rank)) {
                    letter.stage = Stage::Taken;
                }
                drop(state);
                self.changed.notify_all();
                return Ok(());
            }
            if let Some(error) = Self::departure(&state, "recv", rank, Some(sender)) {
                return Err(error);
            }
            if deadline.passed() {
                return Err(ParallelError::Timeout { op: "recv", rank, timeout, waiting_for: vec![sender] });
            }
            state = deadline.wait(&self.changed, state);
        }
    }
}
