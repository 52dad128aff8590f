//! # brasa-profile
//!
//! An event-based profiler for any Rust program, modelled on `torch.profiler`:
//! named, nested ranges from any thread ([`record_function`]), device work timed
//! with markers resolved after the fact ([`DeviceTimer`], [`device_span`]),
//! allocator events attributed to the op that caused them and to a memory category
//! ([`record_memory_event`], [`MemoryEvent`]), and four views of what was recorded:
//! an op table like PyTorch's `key_averages().table()` ([`ProfileResult::key_averages`]),
//! a Chrome/Perfetto trace ([`ProfileResult::export_chrome_trace`]), a self-contained
//! HTML memory timeline with allocated bytes stacked by category
//! ([`ProfileResult::export_memory_timeline`], [`ProfileResult::memory_timeline`]),
//! and a per-device utilization snapshot ([`utilization`]).
//!
//! Recording is process-wide and costs one relaxed atomic load per call when no
//! profiler runs ([`enabled`]); while one runs, each thread writes to its own
//! buffer, merged when the profile stops. A [`schedule`] picks which steps are
//! recorded, with PyTorch's exact wait / warmup / active / repeat / skip_first rules.
//!
//! It depends on no other brasa crate: a tensor library records its ops with
//! [`record_op`] and implements [`DeviceTimer`] / [`DeviceMonitor`]; an allocator
//! forwards its events to [`record_memory_event`].
//!
//! ```
//! use brasa_profile::{record_function, Profiler, SortBy, TableOptions};
//!
//! let profiler = Profiler::builder().record_shapes(true).start()?;
//! for _ in 0..3 {
//!     let _step = record_function("train_step");
//!     let _fwd = record_function("forward");
//!     std::hint::black_box((0..1000).sum::<u64>());
//! }
//! let result = profiler.stop();
//! println!("{}", result.key_averages().table(&TableOptions::default().sort_by(SortBy::CpuTotal)));
//! assert_eq!(result.key_averages().get("forward").map(|row| row.count), Some(3));
//! result.export_chrome_trace(std::env::temp_dir().join("brasa-doc-trace.json"))?;
//! # Ok::<(), brasa_profile::ProfileError>(())
//! ```
//!
//! ## Cargo features
//!
//! None.

#![forbid(unsafe_code)]

mod chrome_trace;
mod clock;
mod device;
mod error;
mod event;
mod key_averages;
mod memory;
mod memory_timeline;
mod profiler;
mod range;
mod result;
mod schedule;
mod session;
mod timer;
mod units;
mod user_code;
mod utilization;

pub use clock::{Clock, HostClock, ManualClock};
pub use device::{device_span, DeviceSpan};
pub use error::ProfileError;
pub use event::{
    DeviceId, DeviceInterval, MemoryBaseline, MemoryEvent, MemoryRecord, MemoryRetag, RangeEvent, RangeKind, ThreadInfo,
};
pub use key_averages::{KeyAverage, KeyAverages, SortBy, TableOptions};
pub use memory::record_memory_event;
pub use memory_timeline::{
    CategorySeries, DeviceTimeline, LiveBlock, MemoryTimeline, OpShare, PeakSnapshot, TimelinePoint, NO_RANGE,
    UNTRACKED_CATEGORY,
};
pub use profiler::{Profiler, ProfilerBuilder, TraceReadyFn};
pub use range::{record_function, record_function_with_shapes, record_op, RangeGuard};
pub use result::{ProfileResult, RangeStats};
pub use schedule::{schedule, ProfilerAction, Schedule};
pub use session::enabled;
pub use timer::{DeviceTimer, HostTimer, Marker};
pub use units::{format_bytes, format_memory, format_percent, format_time_ns, format_time_us};
pub use utilization::{
    host_memory, register_device_monitor, unregister_device_monitor, utilization, utilization_of, DeviceMonitor,
    DeviceUtilization, HostMemory, Utilization,
};
