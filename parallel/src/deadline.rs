//! [`Deadline`]: when a wait gives up. A timeout too long to add to the
//! current instant (`Duration::MAX`, or `BRASA_COMM_TIMEOUT_S=1e19`) is a
//! wait without end rather than an overflow: `Instant + Duration` panics
//! where `checked_add` says "never".

use std::sync::{Condvar, MutexGuard};
use std::time::{Duration, Instant};

/// The instant a wait that started now with some timeout gives up at, or
/// never.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Deadline(Option<Instant>);

impl Deadline {
    /// `timeout` from now; never when the sum does not fit an `Instant`.
    pub(crate) fn after(timeout: Duration) -> Deadline {
        Deadline(Instant::now().checked_add(timeout))
    }

    /// Whether it has passed.
    pub(crate) fn passed(&self) -> bool {
        self.0.is_some_and(|at| Instant::now() >= at)
    }

    /// The time left (zero once passed), or `None` for never.
    pub(crate) fn remaining(&self) -> Option<Duration> {
        self.0.map(|at| at.saturating_duration_since(Instant::now()))
    }

    /// Waits on `condvar` until notified or this deadline.
    pub(crate) fn wait<'a, T>(&self, condvar: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        match self.remaining() {
            Some(left) => condvar.wait_timeout(guard, left).unwrap_or_else(|e| e.into_inner()).0,
            None => condvar.wait(guard).unwrap_or_else(|e| e.into_inner()),
        }
    }
}

/// Seconds written by a person (`BRASA_COMM_TIMEOUT_S=2.5`) as a timeout: a
/// positive number; more than a `Duration` holds (`1e30`, `inf`) saturates
/// to `Duration::MAX`, a wait without end. `None` for anything else (not a
/// number, NaN, zero, negative, or so small it rounds to zero).
pub(crate) fn seconds_to_timeout(text: &str) -> Option<Duration> {
    let seconds: f64 = text.trim().parse().ok()?;
    if seconds.is_nan() || seconds <= 0.0 {
        return None;
    }
    match Duration::try_from_secs_f64(seconds) {
        Ok(timeout) if timeout.is_zero() => None,
        Ok(timeout) => Some(timeout),
        Err(_) => Some(Duration::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_past_the_end_of_time_is_never() {
        let never = Deadline::after(Duration::MAX);
        assert!(!never.passed() && never.remaining().is_none());
        let now = Deadline::after(Duration::ZERO);
        assert!(now.passed() && now.remaining() == Some(Duration::ZERO));
        let later = Deadline::after(Duration::from_secs(60));
        assert!(!later.passed() && later.remaining().is_some_and(|r| r > Duration::from_secs(59)));
    }

    #[test]
    fn seconds_saturate_or_are_refused() {
        assert_eq!(seconds_to_timeout("0.25"), Some(Duration::from_millis(250)));
        assert_eq!(seconds_to_timeout("1e19"), Some(Duration::from_secs_f64(1e19)));
        for huge in ["1e20", "1e30", "1e308", "inf", "+inf", "1e309"] {
            assert_eq!(seconds_to_timeout(huge), Some(Duration::MAX), "{huge}");
        }
        for bad in ["", "x", "NaN", "-nan", "0", "-0", "-1", "-inf", "1e-400", "1e-10"] {
            assert_eq!(seconds_to_timeout(bad), None, "{bad}");
        }
    }
}
