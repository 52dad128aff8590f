//! The recorded data: ranges, device intervals, memory events, threads.
//!
//! These are plain data with public fields so that a [`ProfileResult`](crate::ProfileResult)
//! can also be built by hand (tests, importers) and fed to every exporter.

use std::borrow::Cow;
use std::fmt;

use serde::Serialize;

/// A device as `kind:index`, e.g. `cuda:0` or `cpu:1`. Cheap to copy so an
/// allocator can stamp every event with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct DeviceId {
    /// The device family: `"cpu"`, `"cuda"`, ...
    pub kind: &'static str,
    /// The ordinal within the family.
    pub index: u32,
}

impl DeviceId {
    /// A device id from its family and ordinal.
    pub const fn new(kind: &'static str, index: u32) -> Self {
        Self { kind, index }
    }

    /// `cpu:index`.
    pub const fn cpu(index: u32) -> Self {
        Self::new("cpu", index)
    }

    /// `cuda:index`.
    pub const fn cuda(index: u32) -> Self {
        Self::new("cuda", index)
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind, self.index)
    }
}

/// What opened a range; exported as the Chrome trace category.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum RangeKind {
    /// `record_function`: a range a person named (`user_annotation` in PyTorch traces).
    UserAnnotation,
    /// An operator recorded by a tensor library (`cpu_op`).
    Op,
    /// `ProfilerStep#N`, opened by [`Profiler::step`](crate::Profiler::step).
    ProfilerStep,
}

impl RangeKind {
    /// The Chrome trace category PyTorch uses for this kind.
    pub fn category(self) -> &'static str {
        match self {
            RangeKind::UserAnnotation => "user_annotation",
            RangeKind::Op => "cpu_op",
            RangeKind::ProfilerStep => "user_annotation",
        }
    }
}

/// One closed host range: a `record_function` scope, an op, or a profiler step.
#[derive(Clone, Debug, PartialEq)]
pub struct RangeEvent {
    /// The name given when the range was opened.
    pub name: Cow<'static, str>,
    /// What opened it.
    pub kind: RangeKind,
    /// The recording thread (index into nothing: match with [`ThreadInfo::tid`]).
    pub tid: u64,
    /// Start, in the session clock's nanoseconds.
    pub start_ns: u64,
    /// End, in the session clock's nanoseconds (≥ `start_ns`).
    pub end_ns: u64,
    /// Index of the enclosing range in [`ProfileResult::ranges`](crate::ProfileResult::ranges),
    /// always on the same thread.
    pub parent: Option<usize>,
    /// Input shapes, when the session records shapes and the caller gave them.
    pub input_shapes: Option<Vec<Vec<usize>>>,
    /// True when the range was still open when the profile stopped and was cut there.
    pub truncated: bool,
}

impl RangeEvent {
    /// `end_ns - start_ns`.
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// Work timed on a device queue (a kernel, a copy), resolved from device markers
/// when the profile ended.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceInterval {
    /// What ran, e.g. the kernel name.
    pub name: Cow<'static, str>,
    /// Where it ran.
    pub device: DeviceId,
    /// The queue (stream) it ran on.
    pub queue: u32,
    /// Start on the host timeline (session clock nanoseconds).
    pub start_ns: u64,
    /// End on the host timeline (session clock nanoseconds).
    pub end_ns: u64,
    /// When the host enqueued it (session clock nanoseconds), the start of the
    /// launch → execution flow arrow.
    pub launch_ns: u64,
    /// The host range that was innermost on the launching thread, if any.
    pub range: Option<usize>,
    /// The launching thread.
    pub tid: u64,
}

impl DeviceInterval {
    /// `end_ns - start_ns`.
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// One allocator event, as an allocator observer forwards it with
/// [`record_memory_event`](crate::record_memory_event).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct MemoryEvent {
    /// The device whose memory changed.
    pub device: DeviceId,
    /// Address (or any stable block id) of the block; a free names the same address
    /// as its allocation.
    pub addr: u64,
    /// Bytes allocated (positive) or freed (negative).
    pub bytes: i64,
    /// Bytes allocated on the device after this event.
    pub total_allocated: u64,
    /// Bytes reserved (held by the allocator, in use or cached) after this event.
    pub total_reserved: u64,
}

impl MemoryEvent {
    /// An allocation of `bytes` at `addr`, with the device totals after it.
    pub fn alloc(device: DeviceId, addr: u64, bytes: u64, total_allocated: u64, total_reserved: u64) -> Self {
        Self { device, addr, bytes: i64::try_from(bytes).unwrap_or(i64::MAX), total_allocated, total_reserved }
    }

    /// A free of `bytes` at `addr`, with the device totals after it.
    pub fn free(device: DeviceId, addr: u64, bytes: u64, total_allocated: u64, total_reserved: u64) -> Self {
        Self {
            bytes: -i64::try_from(bytes).unwrap_or(i64::MAX),
            ..Self::alloc(device, addr, 0, total_allocated, total_reserved)
        }
    }
}

/// A [`MemoryEvent`] as recorded: when, on which thread, inside which range.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryRecord {
    /// The event as the allocator reported it.
    pub event: MemoryEvent,
    /// When it was recorded (session clock nanoseconds).
    pub time_ns: u64,
    /// The recording thread.
    pub tid: u64,
    /// The innermost open range on that thread when it happened.
    pub range: Option<usize>,
}

/// A thread that recorded at least one event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadInfo {
    /// The profiler's small, stable id for the thread (its trace track).
    pub tid: u64,
    /// `std::thread::Thread::name`, or `thread-<tid>` for unnamed threads.
    pub name: String,
}
