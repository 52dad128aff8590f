//! Worker threads that outlive their epoch: a worker still inside a
//! dataset read when its [`Epoch`](super::Epoch) is dropped is not waited
//! for there (a stalled network or disk read would hang the training loop)
//! but handed to the [`DataLoader`](super::DataLoader)'s [`Stragglers`],
//! which reaps those that finished whenever an epoch starts and joins the
//! rest when the loader is dropped, waiting at most [`SHUTDOWN_GRACE`] in
//! all. A thread cannot be killed: one whose read still has not returned
//! then is reported on stderr and left to exit when the read returns (its
//! queues are closed, so it reads nothing more).

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long dropping a loader waits, in all, for worker threads still in a
/// dataset read (PyTorch waits as long for its worker processes before it
/// terminates them, `MP_STATUS_CHECK_INTERVAL`); also how long dropping an
/// epoch without a `timeout` waits for each before handing it to the loader.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Worker threads still in a dataset read when their epoch ended, joined
/// when the loader and its last epoch are gone (at most [`SHUTDOWN_GRACE`]
/// in all), and reaped as they finish whenever an epoch starts.
#[derive(Default)]
pub(super) struct Stragglers {
    threads: std::sync::Mutex<Vec<(String, JoinHandle<()>)>>,
}

impl Stragglers {
    fn threads(&self) -> std::sync::MutexGuard<'_, Vec<(String, JoinHandle<()>)>> {
        self.threads.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `thread`, still in a read, to join later.
    pub(super) fn adopt(&self, name: String, thread: JoinHandle<()>) {
        self.threads().push((name, thread));
    }

    /// Joins the ones that have finished.
    pub(super) fn reap(&self) {
        let mut threads = self.threads();
        let (done, running): (Vec<_>, Vec<_>) = threads.drain(..).partition(|(_, t)| t.is_finished());
        *threads = running;
        drop(threads);
        for (_, thread) in done {
            let _ = thread.join();
        }
    }
}

impl Drop for Stragglers {
    fn drop(&mut self) {
        let threads = std::mem::take(&mut *self.threads());
        let deadline = Instant::now() + SHUTDOWN_GRACE;
        for (name, thread) in threads {
            while !thread.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            if thread.is_finished() {
                let _ = thread.join();
            } else {
                // Threads cannot be killed; its queues are closed, so it exits
                // as soon as the dataset returns.
                eprintln!(
                    "brasa-nn DataLoader: worker thread {name} is still in a dataset read {SHUTDOWN_GRACE:?} after \
                     the loader was dropped; leaving it to exit when the read returns"
                );
            }
        }
    }
}
