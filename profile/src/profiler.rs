//! The profiler session: start, step, stop, and PyTorch's schedule transitions.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::clock::{Clock, HostClock};
use crate::error::ProfileError;
use crate::event::RangeKind;
use crate::range::{open_range, OpenRange};
use crate::result::ProfileResult;
use crate::schedule::{ProfilerAction, Schedule};
use crate::session::{begin_session, enabled, end_session, Session, SessionConfig};
use crate::timer::DeviceTimer;
use crate::user_code::{call_user, drop_user};
use crate::utilization::memory_baselines;

/// Only one profiler records at a time: the recording switch is process-wide.
static PROFILER_RUNNING: AtomicBool = AtomicBool::new(false);

/// Called with each saved trace (the end of every schedule cycle, or at stop).
pub type TraceReadyFn = Box<dyn FnMut(&ProfileResult) + Send>;

/// Options for a [`Profiler`]; [`ProfilerBuilder::start`] starts it.
pub struct ProfilerBuilder {
    record_shapes: bool,
    profile_memory: bool,
    record_steps: bool,
    schedule: Option<Schedule>,
    on_trace_ready: Option<TraceReadyFn>,
    clock: Arc<dyn Clock>,
    device_timers: Vec<Arc<dyn DeviceTimer>>,
}

impl Default for ProfilerBuilder {
    fn default() -> Self {
        Self {
            record_shapes: false,
            profile_memory: false,
            record_steps: true,
            schedule: None,
            on_trace_ready: None,
            clock: Arc::new(HostClock),
            device_timers: Vec::new(),
        }
    }
}

impl ProfilerBuilder {
    /// Keep the input shapes given to `record_function_with_shapes` / `record_op`
    /// (copies of the shapes only: no tensor is kept alive). Default: off.
    pub fn record_shapes(mut self, on: bool) -> Self {
        self.record_shapes = on;
        self
    }

    /// Record allocator events forwarded with `record_memory_event`. Default: off.
    pub fn profile_memory(mut self, on: bool) -> Self {
        self.profile_memory = on;
        self
    }

    /// Open a `ProfilerStep#N` range at every [`Profiler::step`]. Default: on.
    pub fn record_steps(mut self, on: bool) -> Self {
        self.record_steps = on;
        self
    }

    /// Record only the steps `schedule` selects. Default: record everything
    /// from start to stop.
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedule = Some(schedule);
        self
    }

    /// Called with each saved trace: at the last active step of every schedule
    /// cycle, and at stop if the profiler was recording then.
    ///
    /// A panic in the callback does not escape (it may run in the profiler's
    /// `drop`, where a second panic would abort the process): it is caught,
    /// the callback is disabled for the rest of the session, and the panic's
    /// message is kept in [`Profiler::trace_ready_panic`] and added to the
    /// trace's `warnings`.
    pub fn on_trace_ready(mut self, callback: impl FnMut(&ProfileResult) + Send + 'static) -> Self {
        self.on_trace_ready = Some(Box::new(callback));
        self
    }

    /// The clock that stamps every event. Default: [`HostClock`].
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// A device timer whose origin marker is recorded when recording starts (timers
    /// first seen in `device_span` are registered then, which also works).
    pub fn device_timer(mut self, timer: Arc<dyn DeviceTimer>) -> Self {
        self.device_timers.push(timer);
        self
    }

    /// Starts the profiler at step 0. Errors if another profiler is running.
    pub fn start(self) -> Result<Profiler, ProfileError> {
        if PROFILER_RUNNING.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return Err(ProfileError::AlreadyActive);
        }
        let mut profiler = Profiler {
            config: SessionConfig {
                clock: self.clock,
                record_shapes: self.record_shapes,
                profile_memory: self.profile_memory,
                device_timers: self.device_timers,
            },
            schedule: self.schedule,
            on_trace_ready: self.on_trace_ready,
            record_steps: self.record_steps,
            step_num: 0,
            action: ProfilerAction::None,
            session: None,
            warming_up: false,
            step_range: None,
            last: None,
            traces_saved: 0,
            pending_warnings: Vec::new(),
            trace_ready_panic: None,
            stopped: false,
        };
        profiler.action = profiler.action_at(0);
        profiler.transit(ProfilerAction::None, Some(profiler.action));
        profiler.open_step_range();
        Ok(profiler)
    }
}

/// A profiling session, like `torch.profiler.profile`: records ranges, device
/// intervals and memory events from every thread between start and stop, in the
/// steps its schedule selects.
///
/// Dropping a running profiler stops it (and fires `on_trace_ready` if it was
/// recording), so a `?` between start and stop does not leave recording on.
pub struct Profiler {
    config: SessionConfig,
    schedule: Option<Schedule>,
    on_trace_ready: Option<TraceReadyFn>,
    record_steps: bool,
    step_num: u64,
    action: ProfilerAction,
    session: Option<Arc<Session>>,
    warming_up: bool,
    step_range: Option<OpenRange>,
    last: Option<ProfileResult>,
    traces_saved: u64,
    pending_warnings: Vec<String>,
    /// The message of a panic of `on_trace_ready`, which disabled it.
    trace_ready_panic: Option<String>,
    stopped: bool,
}

impl Profiler {
    /// Options for a new profiler.
    pub fn builder() -> ProfilerBuilder {
        ProfilerBuilder::default()
    }

    /// Starts a profiler with default options: record everything until stop.
    pub fn start() -> Result<Profiler, ProfileError> {
        ProfilerBuilder::default().start()
    }

    /// Ends the current step and begins the next: closes `ProfilerStep#N`, applies
    /// the schedule's transition (which may save a trace), opens `ProfilerStep#N+1`.
    pub fn step(&mut self) {
        if self.stopped {
            return;
        }
        self.close_step_range();
        let previous = self.action;
        self.step_num += 1;
        self.action = self.action_at(self.step_num);
        self.transit(previous, Some(self.action));
        self.open_step_range();
    }

    /// The current step number (0 at start, +1 per [`step`](Self::step)).
    pub fn step_num(&self) -> u64 {
        self.step_num
    }

    /// What the schedule says for the current step.
    pub fn current_action(&self) -> ProfilerAction {
        self.action
    }

    /// How many traces have been handed to `on_trace_ready` (or would have been,
    /// without a callback).
    pub fn traces_saved(&self) -> u64 {
        self.traces_saved
    }

    /// The message of the panic that disabled the `on_trace_ready` callback,
    /// if it panicked (see [`ProfilerBuilder::on_trace_ready`]).
    pub fn trace_ready_panic(&self) -> Option<&str> {
        self.trace_ready_panic.as_deref()
    }

    /// The most recently collected trace, if any.
    pub fn last_result(&self) -> Option<&ProfileResult> {
        self.last.as_ref()
    }

    /// Stops recording and returns the most recent trace: the one collected now if
    /// the profiler was recording, else the last one saved by the schedule (empty if
    /// nothing was ever recorded).
    pub fn stop(mut self) -> ProfileResult {
        self.shutdown();
        self.last.take().unwrap_or_default()
    }

    fn action_at(&self, step: u64) -> ProfilerAction {
        // Without a schedule PyTorch records every step.
        self.schedule.map_or(ProfilerAction::Record, |schedule| schedule.action(step))
    }

    fn shutdown(&mut self) {
        if self.stopped {
            return;
        }
        self.close_step_range();
        self.transit(self.action, None);
        // A session left open (only possible if a transition was skipped) must not
        // keep recording on.
        if let Some(session) = self.session.take() {
            end_session(&session);
            session.discard();
        }
        self.stopped = true;
        PROFILER_RUNNING.store(false, Ordering::Release);
    }

    /// PyTorch's `_transit_action` table; `to == None` is the profiler's exit.
    /// PyTorch's `prepare_trace` + `start_trace` pair is one [`Self::record`] here.
    fn transit(&mut self, from: ProfilerAction, to: Option<ProfilerAction>) {
        use ProfilerAction::{None as Idle, Record, RecordAndSave, Warmup};
        match (from, to) {
            (Idle, Some(Warmup)) => self.warm_up(),
            (Idle, Some(Record | RecordAndSave)) | (Warmup, Some(Record | RecordAndSave)) => self.record(),
            (Warmup, Some(Idle)) | (Warmup, None) => {
                self.warn("incorrect schedule: WARMUP followed by NONE");
                self.record();
                self.stop_trace();
            }
            (Record, Some(Idle | Warmup)) => {
                self.warn("incorrect schedule: RECORD followed by NONE or WARMUP");
                self.stop_trace();
            }
            (RecordAndSave, Some(Idle)) | (Record | RecordAndSave, None) => {
                self.stop_trace();
                self.trace_ready();
            }
            (RecordAndSave, Some(Warmup)) => {
                self.stop_trace();
                self.trace_ready();
                self.warm_up();
            }
            (RecordAndSave, Some(Record | RecordAndSave)) => {
                self.stop_trace();
                self.trace_ready();
                self.record();
            }
            (Idle, Some(Idle) | None) | (Warmup, Some(Warmup)) | (Record, Some(Record | RecordAndSave)) => {}
        }
    }

    fn warn(&mut self, message: &str) {
        self.pending_warnings.push(message.to_owned());
    }

    /// PyTorch's `prepare_trace`: recording on, but what is recorded is warm-up.
    fn warm_up(&mut self) {
        if self.session.is_none() {
            self.session = Some(self.begin());
            self.warming_up = true;
        }
    }

    /// PyTorch's `start_trace`: the recorded part begins; warm-up data is dropped.
    fn record(&mut self) {
        if self.warming_up {
            if let Some(warmup) = self.session.take() {
                end_session(&warmup);
                warmup.discard();
            }
        }
        if self.session.is_none() {
            self.session = Some(self.begin());
        }
        self.warming_up = false;
    }

    /// A new session, with the devices' memory baselines when it profiles memory.
    fn begin(&self) -> Arc<Session> {
        // Asked before recording is on: a monitor reads its allocator, and
        // nothing it does must be recorded. (An event racing in between on
        // another thread is missed, not counted twice: the timeline shows its
        // bytes as untracked.)
        let (baseline, warnings) =
            if self.config.profile_memory { memory_baselines() } else { (Vec::new(), Vec::new()) };
        let session = begin_session(self.config.clone(), baseline);
        for warning in warnings {
            session.warn(warning);
        }
        session
    }

    fn stop_trace(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        end_session(&session);
        let stop_ns = self.config.clock.now_ns();
        let mut result = session.finish(stop_ns, Some(self.step_num));
        result.warnings.append(&mut self.pending_warnings);
        self.last = Some(result);
    }

    fn trace_ready(&mut self) {
        self.traces_saved += 1;
        let (Some(callback), Some(result)) = (self.on_trace_ready.as_mut(), self.last.as_mut()) else {
            return;
        };
        if let Err(message) = call_user(|| callback(result)) {
            result.warnings.push(format!("on_trace_ready panicked ({message}); it is disabled from now on"));
            self.trace_ready_panic = Some(message);
            if let Some(callback) = self.on_trace_ready.take() {
                drop_user(callback);
            }
        }
    }

    /// What `shutdown` guarantees, after user code (a clock, a device timer)
    /// panicked in the middle of it: recording off, the profiler released.
    fn abandon(&mut self) {
        if let Some(range) = self.step_range.take() {
            drop_user(range);
        }
        if let Some(session) = self.session.take() {
            end_session(&session);
            session.discard();
        }
        self.stopped = true;
        PROFILER_RUNNING.store(false, Ordering::Release);
    }

    fn open_step_range(&mut self) {
        if self.record_steps && self.session.is_some() && enabled() {
            self.step_range =
                open_range(format!("ProfilerStep#{}", self.step_num).into(), RangeKind::ProfilerStep, None);
        }
    }

    fn close_step_range(&mut self) {
        if let Some(range) = self.step_range.take() {
            range.close();
        }
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        // User code runs in `shutdown` (the callback is guarded already; a
        // clock or a device timer may panic too): nothing may escape a drop.
        if call_user(|| self.shutdown()).is_err() {
            self.abandon();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiler_and_results_can_move_between_threads() {
        fn send<T: Send>() {}
        fn send_sync<T: Send + Sync>() {}
        send::<Profiler>();
        send_sync::<ProfileResult>();
        send::<ProfilerBuilder>();
    }
}
