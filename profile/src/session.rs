//! The process-wide recording state and the per-thread buffers.
//!
//! Recording is process-wide (any thread, any library can open a range), so the
//! on/off switch is a global atomic: when off, [`enabled`] is one relaxed load and
//! nothing else happens. When on, each thread writes into its own buffer, which it
//! finds through a thread-local cache keyed by the session's generation number:
//! the global lock is taken once per thread per session (to register the buffer),
//! never per event. The per-thread buffer sits behind its own mutex, which only its
//! thread takes while recording (uncontended) and the profiler takes once at stop.

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use crate::clock::{unix_now_ns, Clock};
use crate::event::{DeviceInterval, MemoryBaseline, MemoryEvent, MemoryRecord, RangeEvent, RangeKind, ThreadInfo};
use crate::result::ProfileResult;
use crate::timer::{DeviceTimer, Marker};

static ENABLED: AtomicBool = AtomicBool::new(false);
/// Bumped on every session start and end; thread-local caches compare against it.
static GENERATION: AtomicU64 = AtomicU64::new(0);
static CURRENT: Mutex<Option<Arc<Session>>> = Mutex::new(None);
static NEXT_TID: AtomicU64 = AtomicU64::new(1);

/// Whether a profiling session is recording (or warming up) right now.
///
/// This is the whole cost of every recording call when profiling is off: one
/// relaxed atomic load. Libraries may also call it to skip preparing arguments
/// (formatting a name, collecting shapes) that only a recording would use.
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in user code while a buffer was locked leaves plain data behind,
    // still consistent enough to report; never propagate the poison.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a session records, fixed when it starts.
#[derive(Clone)]
pub(crate) struct SessionConfig {
    pub clock: Arc<dyn Clock>,
    pub record_shapes: bool,
    pub profile_memory: bool,
    pub device_timers: Vec<Arc<dyn DeviceTimer>>,
}

pub(crate) struct RawRange {
    pub name: Cow<'static, str>,
    pub kind: RangeKind,
    pub start_ns: u64,
    pub end_ns: Option<u64>,
    pub parent: Option<u32>,
    pub input_shapes: Option<Vec<Vec<usize>>>,
}

pub(crate) struct RawMemory {
    pub event: MemoryEvent,
    pub time_ns: u64,
    pub range: Option<u32>,
}

pub(crate) struct RawDeviceInterval {
    pub name: Cow<'static, str>,
    pub slot: usize,
    pub queue: u32,
    pub start: Marker,
    pub end: Marker,
    pub launch_ns: u64,
    pub range: Option<u32>,
}

/// One thread's events for one session.
pub(crate) struct ThreadBuffer {
    pub tid: u64,
    pub name: String,
    /// Set when the session collected this buffer; later writes are dropped.
    pub closed: bool,
    pub ranges: Vec<RawRange>,
    /// Indices into `ranges` of the ranges open on this thread, innermost last.
    pub stack: Vec<u32>,
    pub memory: Vec<RawMemory>,
    pub device: Vec<RawDeviceInterval>,
}

impl ThreadBuffer {
    pub fn innermost(&self) -> Option<u32> {
        self.stack.last().copied()
    }

    /// Closes range `index` at `end_ns` and takes it off the open stack (usually
    /// its top; guards dropped out of order are handled too).
    pub fn close(&mut self, index: u32, end_ns: u64) {
        if self.closed {
            return;
        }
        if let Some(range) = self.ranges.get_mut(index as usize) {
            if range.end_ns.is_none() {
                range.end_ns = Some(end_ns.max(range.start_ns));
            }
        }
        if self.stack.last() == Some(&index) {
            self.stack.pop();
        } else {
            self.stack.retain(|&open| open != index);
        }
    }
}

struct TimerSlot {
    timer: Arc<dyn DeviceTimer>,
    origin: Marker,
    origin_host_ns: u64,
}

/// One recording session: from a profiler's `prepare`/`start` to its `stop`.
pub(crate) struct Session {
    pub generation: u64,
    pub clock: Arc<dyn Clock>,
    pub record_shapes: bool,
    pub profile_memory: bool,
    pub start_ns: u64,
    pub start_unix_ns: u64,
    /// What each device's allocator held at the start (with `profile_memory`).
    memory_baseline: Vec<MemoryBaseline>,
    buffers: Mutex<Vec<Arc<Mutex<ThreadBuffer>>>>,
    timers: RwLock<Vec<TimerSlot>>,
    warnings: Mutex<Vec<String>>,
}

/// A thread's view of the running session.
pub(crate) struct Handle {
    pub session: Arc<Session>,
    pub buffer: Arc<Mutex<ThreadBuffer>>,
}

struct LocalCache {
    generation: u64,
    handle: Option<(Arc<Session>, Arc<Mutex<ThreadBuffer>>)>,
}

thread_local! {
    static LOCAL: RefCell<LocalCache> = const {
        RefCell::new(LocalCache { generation: u64::MAX, handle: None })
    };
    static TID: u64 = NEXT_TID.fetch_add(1, Ordering::Relaxed);
}

/// The profiler's id for the calling thread.
pub(crate) fn current_tid() -> u64 {
    TID.try_with(|t| *t).unwrap_or(0)
}

/// The running session and this thread's buffer in it, registering the buffer on
/// the thread's first event of the session. `None` when nothing is recording.
pub(crate) fn current() -> Option<Handle> {
    let generation = GENERATION.load(Ordering::Acquire);
    LOCAL
        .try_with(|cell| {
            let mut cache = cell.try_borrow_mut().ok()?;
            if cache.generation != generation {
                let session = lock(&CURRENT).clone();
                match session {
                    Some(session) if session.generation == generation => {
                        let buffer = session.register_thread();
                        cache.handle = Some((session, buffer));
                        cache.generation = generation;
                    }
                    Some(_) => return None, // a session is starting or ending right now
                    None => {
                        cache.handle = None;
                        cache.generation = generation;
                    }
                }
            }
            cache
                .handle
                .as_ref()
                .map(|(session, buffer)| Handle { session: Arc::clone(session), buffer: Arc::clone(buffer) })
        })
        .ok()
        .flatten()
}

/// Starts recording, from what each device's allocator held just before
/// (`memory_baseline`, empty without `profile_memory`). The caller (the
/// `Profiler`) guarantees one session at a time.
pub(crate) fn begin_session(config: SessionConfig, memory_baseline: Vec<MemoryBaseline>) -> Arc<Session> {
    let mut current = lock(&CURRENT);
    let generation = GENERATION.load(Ordering::Relaxed) + 1;
    let start_ns = config.clock.now_ns();
    let session = Arc::new(Session {
        generation,
        clock: Arc::clone(&config.clock),
        record_shapes: config.record_shapes,
        profile_memory: config.profile_memory,
        start_ns,
        start_unix_ns: unix_now_ns(),
        memory_baseline,
        buffers: Mutex::new(Vec::new()),
        timers: RwLock::new(Vec::new()),
        warnings: Mutex::new(Vec::new()),
    });
    for timer in &config.device_timers {
        if let Err(err) = session.timer_slot(timer) {
            session.warn(err.to_string());
        }
    }
    *current = Some(Arc::clone(&session));
    GENERATION.store(generation, Ordering::Release);
    ENABLED.store(true, Ordering::Release);
    session
}

/// Stops recording into `session` (if it is the current one).
pub(crate) fn end_session(session: &Arc<Session>) {
    let mut current = lock(&CURRENT);
    if current.as_ref().is_some_and(|running| Arc::ptr_eq(running, session)) {
        *current = None;
        ENABLED.store(false, Ordering::Release);
        GENERATION.fetch_add(1, Ordering::Release);
    }
}

impl Session {
    fn register_thread(&self) -> Arc<Mutex<ThreadBuffer>> {
        let tid = current_tid();
        let thread = std::thread::current();
        let name = thread.name().map_or_else(|| format!("thread-{tid}"), str::to_owned);
        let buffer = Arc::new(Mutex::new(ThreadBuffer {
            tid,
            name,
            closed: false,
            ranges: Vec::new(),
            stack: Vec::new(),
            memory: Vec::new(),
            device: Vec::new(),
        }));
        lock(&self.buffers).push(Arc::clone(&buffer));
        buffer
    }

    pub fn warn(&self, message: String) {
        lock(&self.warnings).push(message);
    }

    /// The slot of `timer` in this session, recording its origin marker the first
    /// time the timer is seen.
    pub fn timer_slot(&self, timer: &Arc<dyn DeviceTimer>) -> Result<usize, crate::ProfileError> {
        let same = |slot: &TimerSlot| std::ptr::addr_eq(Arc::as_ptr(&slot.timer), Arc::as_ptr(timer));
        {
            let timers = self.timers.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(index) = timers.iter().position(same) {
                return Ok(index);
            }
        }
        let mut timers = self.timers.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(index) = timers.iter().position(same) {
            return Ok(index);
        }
        // The timer says when on the host clock the device reached its origin
        // marker (by default: the clock read just after enqueueing it, so device
        // work is never placed before the host launched it).
        let (origin, origin_host_ns) = timer.record_reference(self.clock.as_ref())?;
        timers.push(TimerSlot { timer: Arc::clone(timer), origin, origin_host_ns });
        Ok(timers.len() - 1)
    }

    /// Drops everything recorded (warm-up data), handing device markers back
    /// without resolving them.
    pub fn discard(&self) {
        let buffers: Vec<_> = std::mem::take(&mut *lock(&self.buffers));
        let timers = std::mem::take(&mut *self.timers.write().unwrap_or_else(PoisonError::into_inner));
        for buffer in buffers {
            let mut b = lock(&buffer);
            b.closed = true;
            b.ranges = Vec::new();
            b.stack = Vec::new();
            b.memory = Vec::new();
            for raw in std::mem::take(&mut b.device) {
                if let Some(slot) = timers.get(raw.slot) {
                    slot.timer.release_marker(raw.start);
                    slot.timer.release_marker(raw.end);
                }
            }
        }
        for slot in &timers {
            slot.timer.release_marker(slot.origin);
        }
    }

    /// Collects every thread's buffer into a result. Ranges still open are cut at
    /// `stop_ns`; device markers are resolved now (this is where a device backend
    /// may synchronize, after the timed region).
    pub fn finish(&self, stop_ns: u64, step: Option<u64>) -> ProfileResult {
        let buffers: Vec<_> = std::mem::take(&mut *lock(&self.buffers));
        let mut taken: Vec<_> = buffers
            .iter()
            .map(|buffer| {
                let mut b = lock(buffer);
                b.closed = true;
                (
                    ThreadInfo { tid: b.tid, name: std::mem::take(&mut b.name) },
                    std::mem::take(&mut b.ranges),
                    std::mem::take(&mut b.memory),
                    std::mem::take(&mut b.device),
                )
            })
            .collect();
        taken.sort_by_key(|(info, ..)| info.tid);

        let mut result = ProfileResult {
            start_ns: self.start_ns,
            end_ns: stop_ns.max(self.start_ns),
            base_unix_ns: self.start_unix_ns,
            process_id: std::process::id(),
            step,
            memory_baseline: self.memory_baseline.clone(),
            ..ProfileResult::default()
        };
        // Taken out, so no lock is held while device code resolves markers, and the
        // timers are not kept alive by threads that still cache this session.
        let timers = std::mem::take(&mut *self.timers.write().unwrap_or_else(PoisonError::into_inner));
        let mut to_release: Vec<(usize, Marker)> = Vec::new();
        for (info, ranges, memory, device) in taken {
            let offset = result.ranges.len();
            let global = |local: Option<u32>| local.map(|i| offset + i as usize);
            for raw in ranges {
                let truncated = raw.end_ns.is_none();
                result.ranges.push(RangeEvent {
                    name: raw.name,
                    kind: raw.kind,
                    tid: info.tid,
                    start_ns: raw.start_ns,
                    end_ns: raw.end_ns.unwrap_or(stop_ns).max(raw.start_ns),
                    parent: global(raw.parent),
                    input_shapes: raw.input_shapes,
                    truncated,
                });
            }
            for raw in memory {
                result.memory.push(MemoryRecord {
                    event: raw.event,
                    time_ns: raw.time_ns,
                    tid: info.tid,
                    range: global(raw.range),
                });
            }
            for raw in device {
                let Some(slot) = timers.get(raw.slot) else {
                    continue;
                };
                to_release.push((raw.slot, raw.start));
                to_release.push((raw.slot, raw.end));
                // Placed from the origin, timed between its own markers: a
                // device timer's precision may fall with the distance (CUDA
                // gives f32 milliseconds), and the duration is what a table sums.
                let start = slot.timer.elapsed_ns(slot.origin, raw.start);
                let duration = slot.timer.elapsed_ns(raw.start, raw.end);
                match (start, duration) {
                    (Ok(start), Ok(duration)) => result.device_intervals.push(DeviceInterval {
                        name: raw.name,
                        device: slot.timer.device(),
                        queue: raw.queue,
                        start_ns: slot.origin_host_ns.saturating_add(start),
                        end_ns: slot.origin_host_ns.saturating_add(start).saturating_add(duration),
                        launch_ns: raw.launch_ns,
                        range: global(raw.range),
                        tid: info.tid,
                    }),
                    (Err(err), _) | (_, Err(err)) => {
                        result.warnings.push(format!("dropped device interval {:?}: {err}", raw.name));
                    }
                }
            }
            result.threads.push(info);
        }
        for (slot, marker) in to_release {
            if let Some(slot) = timers.get(slot) {
                slot.timer.release_marker(marker);
            }
        }
        for slot in &timers {
            slot.timer.release_marker(slot.origin);
        }
        result.memory.sort_by_key(|m| m.time_ns);
        result.device_intervals.sort_by_key(|d| (d.device, d.queue, d.start_ns));
        result.warnings.extend(std::mem::take(&mut *lock(&self.warnings)));
        result
    }
}
