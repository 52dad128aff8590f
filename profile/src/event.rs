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
/// [`record_memory_event`](crate::record_memory_event): an allocation, a free,
/// or a retag (a live block's bytes moving from one memory category to
/// another, the totals unchanged).
///
/// Every event names the category of its block (`"parameter"`,
/// `"activation"`, …; any `&'static str` — the profiler depends on no
/// allocator, and the names brasa-alloc uses get fixed colours in the memory
/// timeline). [`MemoryEvent::alloc`] and [`MemoryEvent::free`] use
/// [`MemoryEvent::DEFAULT_CATEGORY`]; [`with_category`](MemoryEvent::with_category)
/// sets another.
///
/// ```
/// use brasa_profile::{DeviceId, MemoryEvent};
///
/// let dev = DeviceId::cuda(0);
/// let alloc = MemoryEvent::alloc(dev, 0x100, 4096, 4096, 1 << 20).with_category("activation");
/// assert_eq!((alloc.bytes, alloc.category), (4096, "activation"));
/// // autograd is done with it: the same block now counts as a temporary.
/// let retag = MemoryEvent::retag(dev, 0x100, 4096, "activation", "temporary", 4096, 1 << 20);
/// assert_eq!(retag.bytes, 0, "a retag allocates nothing");
/// assert_eq!(retag.retag.map(|r| (r.from, r.bytes)), Some(("activation", 4096)));
/// assert_eq!(MemoryEvent::free(dev, 0x100, 4096, 0, 1 << 20).category, MemoryEvent::DEFAULT_CATEGORY);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct MemoryEvent {
    /// The device whose memory changed.
    pub device: DeviceId,
    /// Address (or any stable block id) of the block; a free (or retag) names the
    /// same address as its allocation.
    pub addr: u64,
    /// Bytes allocated (positive) or freed (negative); zero for a retag, and for
    /// an event that only changes the totals (a segment reserved or released).
    pub bytes: i64,
    /// What the block holds: its memory category (for a retag, the new one).
    pub category: &'static str,
    /// For a retag: the category the block's bytes left and how many moved.
    pub retag: Option<MemoryRetag>,
    /// Bytes allocated on the device after this event.
    pub total_allocated: u64,
    /// Bytes reserved (held by the allocator, in use or cached) after this event.
    pub total_reserved: u64,
}

/// What a retag [`MemoryEvent`] moved: `bytes` of a live block, from category
/// `from` to the event's `category`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct MemoryRetag {
    /// The category the block had before.
    pub from: &'static str,
    /// The block's size.
    pub bytes: u64,
}

impl MemoryEvent {
    /// The category of events that name none: `"other"` (brasa-alloc's name
    /// for untagged memory).
    pub const DEFAULT_CATEGORY: &'static str = "other";

    /// An allocation of `bytes` at `addr`, with the device totals after it, in
    /// [`DEFAULT_CATEGORY`](Self::DEFAULT_CATEGORY).
    pub fn alloc(device: DeviceId, addr: u64, bytes: u64, total_allocated: u64, total_reserved: u64) -> Self {
        Self {
            device,
            addr,
            bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
            category: Self::DEFAULT_CATEGORY,
            retag: None,
            total_allocated,
            total_reserved,
        }
    }

    /// A free of `bytes` at `addr`, with the device totals after it, in
    /// [`DEFAULT_CATEGORY`](Self::DEFAULT_CATEGORY).
    pub fn free(device: DeviceId, addr: u64, bytes: u64, total_allocated: u64, total_reserved: u64) -> Self {
        Self {
            bytes: -i64::try_from(bytes).unwrap_or(i64::MAX),
            ..Self::alloc(device, addr, 0, total_allocated, total_reserved)
        }
    }

    /// The live block of `bytes` at `addr` moved from category `from` to `to`;
    /// the device totals (unchanged by a retag) are given as for the others.
    pub fn retag(
        device: DeviceId,
        addr: u64,
        bytes: u64,
        from: &'static str,
        to: &'static str,
        total_allocated: u64,
        total_reserved: u64,
    ) -> Self {
        Self {
            category: to,
            retag: Some(MemoryRetag { from, bytes }),
            ..Self::alloc(device, addr, 0, total_allocated, total_reserved)
        }
    }

    /// The same event in `category` (for a retag: moving to `category`).
    #[must_use]
    pub fn with_category(mut self, category: &'static str) -> Self {
        self.category = category;
        self
    }
}

/// What a device's allocator held when a recording started: the memory
/// timeline's first point, so that bytes allocated before the profile (the
/// model's parameters, the optimizer's state) show under their categories
/// instead of as unknown. Taken from each registered
/// [`DeviceMonitor::memory_baseline`](crate::DeviceMonitor::memory_baseline)
/// when a profiler built with `profile_memory(true)` starts recording.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemoryBaseline {
    /// The device.
    pub device: DeviceId,
    /// Bytes allocated on the device.
    pub total_allocated: u64,
    /// Bytes reserved on the device.
    pub total_reserved: u64,
    /// Allocated bytes per category (categories holding nothing may be left out);
    /// the sum should be `total_allocated` (what it misses shows as unknown).
    pub by_category: Vec<(&'static str, u64)>,
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
