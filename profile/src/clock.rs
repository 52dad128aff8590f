//! Where timestamps come from.
//!
//! Every range and event is stamped by a [`Clock`] in nanoseconds. The default,
//! [`HostClock`], is monotonic host time; [`ManualClock`] is a seam for tests (or
//! for replaying recorded timings) where time only moves when told to.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// A monotonic source of nanosecond timestamps shared by all threads.
pub trait Clock: Send + Sync {
    /// Nanoseconds since an arbitrary, fixed origin. Must never go backwards.
    fn now_ns(&self) -> u64;
}

/// Monotonic host time (`std::time::Instant`), in nanoseconds since the first time
/// any `HostClock` was read in this process.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostClock;

fn process_epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl Clock for HostClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        // u64 nanoseconds cover 584 years; saturate rather than wrap past that.
        u64::try_from(process_epoch().elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A clock that only moves when told to: `set` or `advance`. Clones share the
/// same time, so a test can keep one handle and give another to the profiler.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `start_ns`.
    pub fn new(start_ns: u64) -> Self {
        Self { now: Arc::new(AtomicU64::new(start_ns)) }
    }

    /// Moves time forward by `delta_ns` and returns the new time. Time stops
    /// at `u64::MAX` rather than wrapping round to the past.
    pub fn advance(&self, delta_ns: u64) -> u64 {
        let step = |now: u64| Some(now.saturating_add(delta_ns));
        // `fetch_add` would wrap; the closure never refuses, so this is `Ok`.
        let before = self.now.fetch_update(Ordering::SeqCst, Ordering::SeqCst, step).unwrap_or_else(|now| now);
        before.saturating_add(delta_ns)
    }

    /// Sets the time. Going backwards is ignored, to keep the clock monotonic.
    pub fn set(&self, now_ns: u64) {
        self.now.fetch_max(now_ns, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

/// Wall-clock time of "now" as Unix nanoseconds (0 if the system clock is before 1970).
pub(crate) fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_clock_is_monotonic() {
        let c = HostClock;
        let a = c.now_ns();
        let b = c.now_ns();
        assert!(b >= a);
    }

    #[test]
    fn manual_clock_moves_only_forward_and_is_shared() {
        let c = ManualClock::new(10);
        let other = c.clone();
        assert_eq!(c.advance(5), 15);
        assert_eq!(other.now_ns(), 15);
        other.set(3);
        assert_eq!(c.now_ns(), 15, "set backwards is ignored");
        other.set(100);
        assert_eq!(c.now_ns(), 100);
    }
}
