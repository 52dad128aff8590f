//! Whether a communicator can still be used. The first failure (a timeout,
//! a lost peer, ranks out of step) breaks it for good, as an aborted NCCL
//! communicator: later work fails at once with [`ParallelError::Broken`]
//! instead of waiting on a group that can no longer complete anything, and
//! the backend is told to abort so that peers fail fast too.

use crate::error::ParallelError;
use brasa_tensor::ErrorBox;
use std::sync::{Arc, Mutex};

/// Tells a backend's peers that this rank gave up, from any thread, even
/// while the backend's worker is blocked inside a collective.
pub trait Abort: Send + Sync {
    /// Leaves the group: peers waiting on this rank fail with `reason`.
    /// `after_failure` says this rank gives up because something else failed
    /// first (peers then name the original culprit when they can).
    fn abort(&self, reason: &str, after_failure: bool);
}

pub(crate) struct Health {
    rank: usize,
    cause: Mutex<Option<ParallelError>>,
    abort: Option<Arc<dyn Abort>>,
}

impl Health {
    pub(crate) fn new(rank: usize, abort: Option<Arc<dyn Abort>>) -> Health {
        Health { rank, cause: Mutex::new(None), abort }
    }

    /// Records the first failure and aborts the backend.
    pub(crate) fn fail(&self, error: &ParallelError) {
        let first = {
            let mut cause = self.cause.lock().unwrap_or_else(|e| e.into_inner());
            if cause.is_none() {
                *cause = Some(error.clone());
                true
            } else {
                false
            }
        };
        if first {
            if let Some(abort) = &self.abort {
                abort.abort(&format!("gave up after: {error}"), true);
            }
        }
    }

    /// The error for work refused because of an earlier failure.
    pub(crate) fn check(&self) -> Result<(), ParallelError> {
        match &*self.cause.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(cause) => Err(ParallelError::Broken {
                rank: self.rank,
                cause: cause.to_string(),
                source: Some(ErrorBox::new(cause.clone())),
            }),
            None => Ok(()),
        }
    }

    /// Leaves the group without an error (the communicator was dropped).
    pub(crate) fn leave(&self, reason: &str) {
        if let Some(abort) = &self.abort {
            abort.abort(reason, false);
        }
    }
}
