//! A collected profile and the per-range arithmetic every view is built on.

use crate::event::{DeviceInterval, MemoryBaseline, MemoryRecord, RangeEvent, ThreadInfo};

/// Everything one profiling session (or one schedule cycle) recorded.
///
/// Fields are public so a profile can be built by hand and fed to the exporters;
/// indices (`parent`, `range`) that point nowhere are ignored, never a panic.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProfileResult {
    /// Host ranges, grouped by thread, each thread's in opening order.
    pub ranges: Vec<RangeEvent>,
    /// Device work, resolved from device markers, sorted by device, queue, start.
    pub device_intervals: Vec<DeviceInterval>,
    /// Allocator events, sorted by time.
    pub memory: Vec<MemoryRecord>,
    /// What each device's allocator held when recording started, by device
    /// (from [`DeviceMonitor::memory_baseline`](crate::DeviceMonitor::memory_baseline);
    /// empty without `profile_memory` or monitors that report it).
    pub memory_baseline: Vec<MemoryBaseline>,
    /// Threads that recorded something, by tid.
    pub threads: Vec<ThreadInfo>,
    /// When recording started (clock nanoseconds): the trace's time zero.
    pub start_ns: u64,
    /// When recording stopped (clock nanoseconds).
    pub end_ns: u64,
    /// Wall-clock Unix nanoseconds at `start_ns` (the trace's `baseTimeNanoseconds`).
    pub base_unix_ns: u64,
    /// The recording process.
    pub process_id: u32,
    /// The profiler step at which this trace was saved.
    pub step: Option<u64>,
    /// Things that went wrong but did not stop the recording (a device marker that
    /// failed, an incorrect schedule).
    pub warnings: Vec<String>,
}

/// Self and total figures of one range.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RangeStats {
    /// Duration minus the durations of child ranges.
    pub self_ns: u64,
    /// Duration.
    pub total_ns: u64,
    /// Device time of intervals launched directly inside this range.
    pub self_device_ns: u64,
    /// Device time of intervals launched inside this range or its descendants.
    pub device_total_ns: u64,
    /// Net bytes allocated directly inside this range (allocations minus frees).
    pub self_mem_bytes: i64,
    /// Net bytes allocated inside this range or its descendants.
    pub mem_bytes: i64,
}

impl ProfileResult {
    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty() && self.device_intervals.is_empty() && self.memory.is_empty()
    }

    /// Self/total time, device time and memory of every range, by index.
    pub fn range_stats(&self) -> Vec<RangeStats> {
        let n = self.ranges.len();
        let mut stats: Vec<RangeStats> =
            self.ranges.iter().map(|r| RangeStats { total_ns: r.duration_ns(), ..RangeStats::default() }).collect();
        let mut children_ns = vec![0u64; n];
        for (index, range) in self.ranges.iter().enumerate() {
            if let Some(parent) = range.parent.filter(|&p| p < n && p != index) {
                children_ns[parent] = children_ns[parent].saturating_add(range.duration_ns());
            }
        }
        for (stat, children) in stats.iter_mut().zip(&children_ns) {
            stat.self_ns = stat.total_ns.saturating_sub(*children);
        }
        for interval in &self.device_intervals {
            if let Some(stat) = interval.range.and_then(|r| stats.get_mut(r)) {
                stat.self_device_ns = stat.self_device_ns.saturating_add(interval.duration_ns());
            }
        }
        for record in &self.memory {
            if let Some(stat) = record.range.and_then(|r| stats.get_mut(r)) {
                stat.self_mem_bytes = stat.self_mem_bytes.saturating_add(record.event.bytes);
            }
        }
        // Totals: add each range's own figures to itself and every ancestor. The
        // walk is bounded by n steps so a malformed (cyclic) parent chain ends.
        for index in 0..n {
            let (device, mem) = (stats[index].self_device_ns, stats[index].self_mem_bytes);
            if device == 0 && mem == 0 {
                continue;
            }
            let mut at = Some(index);
            let mut steps = 0;
            while let Some(i) = at.filter(|&i| i < n && steps <= n) {
                stats[i].device_total_ns = stats[i].device_total_ns.saturating_add(device);
                stats[i].mem_bytes = stats[i].mem_bytes.saturating_add(mem);
                at = self.ranges[i].parent;
                steps += 1;
            }
        }
        stats
    }

    /// Names of `index`'s ancestors and itself, outermost first.
    pub fn range_path(&self, index: usize) -> Vec<&str> {
        let mut path = Vec::new();
        let mut at = Some(index);
        while let Some(range) = at.and_then(|i| self.ranges.get(i)) {
            if path.len() > self.ranges.len() {
                break;
            }
            path.push(range.name.as_ref());
            at = range.parent;
        }
        path.reverse();
        path
    }

    /// The thread's name, or `thread-<tid>`.
    pub fn thread_name(&self, tid: u64) -> String {
        self.threads.iter().find(|t| t.tid == tid).map_or_else(|| format!("thread-{tid}"), |t| t.name.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{DeviceId, MemoryEvent, RangeKind};

    fn range(name: &'static str, start: u64, end: u64, parent: Option<usize>) -> RangeEvent {
        RangeEvent {
            name: name.into(),
            kind: RangeKind::UserAnnotation,
            tid: 1,
            start_ns: start,
            end_ns: end,
            parent,
            input_shapes: None,
            truncated: false,
        }
    }

    #[test]
    fn self_time_is_total_minus_children() {
        let result = ProfileResult {
            ranges: vec![
                range("root", 0, 100, None),
                range("a", 10, 40, Some(0)),
                range("a.x", 15, 25, Some(1)),
                range("b", 50, 90, Some(0)),
            ],
            ..ProfileResult::default()
        };
        let s = result.range_stats();
        assert_eq!(s[0].total_ns, 100);
        assert_eq!(s[0].self_ns, 100 - 30 - 40);
        assert_eq!(s[1].self_ns, 30 - 10);
        assert_eq!(s[2].self_ns, 10);
        assert_eq!(s[3].self_ns, 40);
        let self_sum: u64 = s.iter().map(|x| x.self_ns).sum();
        assert_eq!(self_sum, 100);
        assert_eq!(result.range_path(2), ["root", "a", "a.x"]);
    }

    #[test]
    fn device_and_memory_totals_roll_up_to_ancestors() {
        let dev = DeviceId::cuda(0);
        let result = ProfileResult {
            ranges: vec![range("root", 0, 100, None), range("mm", 10, 40, Some(0))],
            device_intervals: vec![DeviceInterval {
                name: "gemm".into(),
                device: dev,
                queue: 0,
                start_ns: 20,
                end_ns: 70,
                launch_ns: 12,
                range: Some(1),
                tid: 1,
            }],
            memory: vec![
                MemoryRecord {
                    event: MemoryEvent::alloc(dev, 0x10, 512, 512, 2048),
                    time_ns: 11,
                    tid: 1,
                    range: Some(1),
                },
                MemoryRecord {
                    event: MemoryEvent::alloc(dev, 0x20, 256, 768, 2048),
                    time_ns: 45,
                    tid: 1,
                    range: Some(0),
                },
                MemoryRecord {
                    event: MemoryEvent::free(dev, 0x10, 512, 256, 2048),
                    time_ns: 46,
                    tid: 1,
                    range: Some(0),
                },
            ],
            ..ProfileResult::default()
        };
        let s = result.range_stats();
        assert_eq!((s[1].self_device_ns, s[1].device_total_ns), (50, 50));
        assert_eq!((s[0].self_device_ns, s[0].device_total_ns), (0, 50));
        assert_eq!((s[1].self_mem_bytes, s[1].mem_bytes), (512, 512));
        assert_eq!((s[0].self_mem_bytes, s[0].mem_bytes), (-256, 256));
    }

    #[test]
    fn malformed_parents_do_not_panic_or_loop() {
        let result = ProfileResult {
            ranges: vec![range("a", 0, 10, Some(1)), range("b", 0, 10, Some(0)), range("c", 0, 5, Some(99))],
            memory: vec![MemoryRecord {
                event: MemoryEvent::alloc(DeviceId::cpu(0), 1, 8, 8, 8),
                time_ns: 1,
                tid: 1,
                range: Some(0),
            }],
            ..ProfileResult::default()
        };
        let s = result.range_stats();
        assert_eq!(s.len(), 3);
        assert_eq!(s[2].self_ns, 5);
        assert!(result.range_path(0).len() <= 4);
    }
}
