//! The crate's error type: every fallible call returns `Result<_, ProfileError>`.

use thiserror::Error;

/// What can go wrong while profiling or exporting a profile.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ProfileError {
    /// `schedule(wait, warmup, active, ..)` was given `active == 0` (PyTorch asserts `active > 0`).
    #[error("invalid profiler schedule: {0}")]
    InvalidSchedule(String),
    /// A second [`Profiler`](crate::Profiler) was started while one is running; the
    /// recording state is process-wide, so only one session can be active at a time.
    #[error("a profiler is already running in this process; stop it before starting another")]
    AlreadyActive,
    /// A [`DeviceTimer`](crate::DeviceTimer) failed to record or resolve a marker.
    #[error("device timer on {device}: {message}")]
    Device {
        /// The device, as `kind:index`.
        device: String,
        /// What the device backend reported.
        message: String,
    },
    /// Writing an export failed.
    #[error("writing profile output: {0}")]
    Io(#[from] std::io::Error),
    /// Serializing an export failed.
    #[error("serializing profile output: {0}")]
    Json(#[from] serde_json::Error),
}
