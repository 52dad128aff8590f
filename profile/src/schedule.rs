//! Which steps a profiler records: PyTorch's `torch.profiler.schedule`.

use crate::error::ProfileError;

/// What the profiler does during a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProfilerAction {
    /// Not recording.
    None,
    /// Recording, but the data is thrown away (the first steps after enabling
    /// carry one-time overheads).
    Warmup,
    /// Recording.
    Record,
    /// Recording; the last step of a cycle: when it ends, the cycle's trace is
    /// handed to `on_trace_ready`.
    RecordAndSave,
}

/// `schedule(wait, warmup, active, repeat, skip_first)` — see [`schedule`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Schedule {
    /// Idle steps at the start of each cycle.
    pub wait: u64,
    /// Warm-up steps (recorded, discarded) after the idle ones.
    pub warmup: u64,
    /// Recorded steps; the last one saves. Always > 0.
    pub active: u64,
    /// Number of cycles; 0 means cycle forever.
    pub repeat: u64,
    /// Steps ignored before the first cycle.
    pub skip_first: u64,
}

/// PyTorch's `torch.profiler.schedule`: skip `skip_first` steps, then cycle
/// through `wait` idle steps, `warmup` warm-up steps and `active` recorded steps
/// (the last of which saves the cycle), `repeat` times (0 = forever).
///
/// Errors if `active == 0` (PyTorch asserts `active > 0`).
pub fn schedule(wait: u64, warmup: u64, active: u64, repeat: u64, skip_first: u64) -> Result<Schedule, ProfileError> {
    if active == 0 {
        return Err(ProfileError::InvalidSchedule("active must be > 0 (at least one recorded step per cycle)".into()));
    }
    if wait.checked_add(warmup).and_then(|s| s.checked_add(active)).is_none() {
        return Err(ProfileError::InvalidSchedule("wait + warmup + active overflows u64".into()));
    }
    Ok(Schedule { wait, warmup, active, repeat, skip_first })
}

impl Schedule {
    /// The action for step `step` (0-based), exactly as PyTorch's `schedule_fn`.
    pub fn action(&self, step: u64) -> ProfilerAction {
        if step < self.skip_first {
            return ProfilerAction::None;
        }
        let step = step - self.skip_first;
        // Fields are public, so a hand-built Schedule may have active == 0 or an
        // overflowing cycle; treat such a schedule as never recording.
        let Some(cycle) =
            self.wait.checked_add(self.warmup).and_then(|s| s.checked_add(self.active)).filter(|_| self.active > 0)
        else {
            return ProfilerAction::None;
        };
        if self.repeat > 0 && step / cycle >= self.repeat {
            return ProfilerAction::None;
        }
        let in_cycle = step % cycle;
        if in_cycle < self.wait {
            ProfilerAction::None
        } else if in_cycle < self.wait + self.warmup {
            ProfilerAction::Warmup
        } else if in_cycle < cycle - 1 {
            ProfilerAction::Record
        } else {
            ProfilerAction::RecordAndSave
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ProfilerAction::{None as N, Record as R, RecordAndSave as S, Warmup as W};

    fn actions(s: &Schedule, steps: u64) -> Vec<ProfilerAction> {
        (0..steps).map(|i| s.action(i)).collect()
    }

    #[test]
    fn active_zero_is_an_error() {
        assert!(matches!(schedule(1, 1, 0, 0, 0), Err(ProfileError::InvalidSchedule(_))));
    }

    #[test]
    fn wait_warmup_active_cycle_forever() {
        let s = schedule(1, 1, 2, 0, 0).unwrap();
        assert_eq!(actions(&s, 8), [N, W, R, S, N, W, R, S]);
    }

    #[test]
    fn repeat_stops_after_n_cycles() {
        let s = schedule(1, 0, 1, 2, 0).unwrap();
        assert_eq!(actions(&s, 7), [N, S, N, S, N, N, N]);
    }

    #[test]
    fn skip_first_shifts_everything() {
        let s = schedule(0, 1, 1, 1, 3).unwrap();
        assert_eq!(actions(&s, 7), [N, N, N, W, S, N, N]);
    }

    #[test]
    fn single_active_step_is_record_and_save() {
        let s = schedule(0, 0, 1, 0, 0).unwrap();
        assert_eq!(actions(&s, 3), [S, S, S]);
    }

    #[test]
    fn hand_built_invalid_schedule_never_records() {
        let s = Schedule { wait: 0, warmup: 0, active: 0, repeat: 0, skip_first: 0 };
        assert_eq!(actions(&s, 3), [N, N, N]);
    }
}
