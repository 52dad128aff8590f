//! The memory timeline: allocated and reserved bytes over time per device,
//! allocated bytes split by memory category (parameters, gradients, optimizer
//! state, activations, …), and at each device's peak the live blocks and the
//! ops that allocated them — the picture that answers "what filled my memory".
//! Exported as one self-contained HTML file: inline SVG with one stacked band
//! per category under the allocated line, reserved drawn as a line above, and
//! a few lines of inline script for the hover readout (no network).
//!
//! The categories come from the events ([`MemoryEvent::category`](crate::MemoryEvent::category);
//! a retag moves a block's bytes from one band to another) and, for bytes
//! allocated before the recording started, from each device's
//! [`MemoryBaseline`](crate::MemoryBaseline). Allocated bytes the timeline
//! cannot place (allocated before the recording, on a device that reports no
//! baseline) form the [`UNTRACKED_CATEGORY`] band, so that at every point the
//! bands add up to the allocated line exactly.
//!
//! ```
//! use brasa_profile::{DeviceId, MemoryEvent, MemoryRecord, ProfileResult};
//!
//! let dev = DeviceId::cuda(0);
//! let at = |time_ns, event| MemoryRecord { event, time_ns, tid: 1, range: None };
//! let result = ProfileResult {
//!     memory: vec![
//!         at(10, MemoryEvent::alloc(dev, 0x1, 4096, 4096, 8192).with_category("parameter")),
//!         at(20, MemoryEvent::alloc(dev, 0x2, 1024, 5120, 8192).with_category("temporary")),
//!         at(30, MemoryEvent::retag(dev, 0x2, 1024, "temporary", "activation", 5120, 8192)),
//!     ],
//!     end_ns: 40,
//!     ..ProfileResult::default()
//! };
//! let timeline = result.memory_timeline();
//! let cuda = &timeline.devices[0];
//! assert_eq!(cuda.categories_at(1), [("parameter", 4096), ("temporary", 1024)]);
//! assert_eq!(cuda.categories_at(2), [("parameter", 4096), ("activation", 1024)]);
//! for (i, point) in cuda.points.iter().enumerate() {
//!     let bands: u64 = cuda.categories.iter().map(|series| series.bytes[i]).sum();
//!     assert_eq!(bands, point.allocated);
//! }
//! assert!(result.memory_timeline_html().contains(">activation<"));
//! ```

mod html;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::Path;

use crate::error::ProfileError;
use crate::event::{DeviceId, MemoryBaseline, MemoryRecord};
use crate::result::ProfileResult;

/// The op name given to blocks allocated outside any range.
pub const NO_RANGE: &str = "(outside any range)";

/// The band of allocated bytes whose category the timeline cannot know:
/// allocated before the recording started on a device that reported no
/// [`MemoryBaseline`], or left over when events from several threads reached
/// the profiler out of order.
pub const UNTRACKED_CATEGORY: &str = "(before this trace)";

/// The categories brasa-alloc uses, in its order: the bands are stacked in
/// this order (bottom first), other names after them as they first appear.
pub(crate) const KNOWN_CATEGORIES: [&str; 7] =
    ["parameter", "gradient", "optimizer_state", "activation", "temporary", "input", "other"];

/// Allocated and reserved bytes after one allocator event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimelinePoint {
    /// Nanoseconds since the profile started.
    pub time_ns: u64,
    /// Bytes allocated on the device after the event.
    pub allocated: u64,
    /// Bytes reserved on the device after the event.
    pub reserved: u64,
}

/// Allocated bytes of one memory category at each point of a
/// [`DeviceTimeline`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CategorySeries {
    /// The category (as the events name it), or [`UNTRACKED_CATEGORY`].
    pub category: &'static str,
    /// Bytes after each point: `bytes[i]` goes with `points[i]`.
    pub bytes: Vec<u64>,
    /// The most the category held.
    pub peak: u64,
}

/// A block live at the peak.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    /// Its address (or block id).
    pub addr: u64,
    /// Its size.
    pub bytes: u64,
    /// Its memory category at the peak (after any retag).
    pub category: &'static str,
    /// The innermost range open when it was allocated ([`NO_RANGE`] if none).
    pub op: String,
    /// That range's enclosing ranges and itself, `outer > ... > inner`.
    pub op_path: String,
    /// When it was allocated, in nanoseconds since the profile started.
    pub allocated_at_ns: u64,
}

/// Live bytes at the peak, summed per allocating op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpShare {
    /// The op (range name).
    pub op: String,
    /// Live bytes it allocated.
    pub bytes: u64,
    /// How many live blocks.
    pub blocks: usize,
}

/// The moment a device's allocated bytes were highest, and what was live then.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeakSnapshot {
    /// Nanoseconds since the profile started (the first time the peak was reached).
    pub time_ns: u64,
    /// Allocated bytes at the peak.
    pub allocated: u64,
    /// Reserved bytes at the peak.
    pub reserved: u64,
    /// Live blocks allocated during the profile, largest first.
    pub blocks: Vec<LiveBlock>,
    /// Live bytes per allocating op, largest first.
    pub by_op: Vec<OpShare>,
    /// Allocated bytes per memory category at the peak, largest first (empty
    /// categories left out); they add up to `allocated`.
    pub by_category: Vec<(&'static str, u64)>,
    /// Allocated bytes not explained by blocks seen during the profile (allocated
    /// before it started).
    pub unattributed_bytes: u64,
}

/// One device's memory over the profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceTimeline {
    /// The device.
    pub device: DeviceId,
    /// One point per allocator event, in time order, after a first point at
    /// time zero when the device reported a [`MemoryBaseline`].
    pub points: Vec<TimelinePoint>,
    /// Allocated bytes per category at each point, in stacking order (bottom
    /// first): [`UNTRACKED_CATEGORY`], then brasa-alloc's categories in its
    /// order, then other names as they first appear; only categories that
    /// held bytes at some point. At every point they add up to the point's
    /// `allocated`.
    pub categories: Vec<CategorySeries>,
    /// The peak (`None` when the device had no events).
    pub peak: Option<PeakSnapshot>,
}

impl DeviceTimeline {
    /// The categories holding bytes after point `index`, in stacking order
    /// (empty past the end).
    pub fn categories_at(&self, index: usize) -> Vec<(&'static str, u64)> {
        self.categories
            .iter()
            .filter_map(|series| series.bytes.get(index).filter(|&&bytes| bytes > 0).map(|&b| (series.category, b)))
            .collect()
    }
}

/// Every device's memory over the profile; see [`ProfileResult::memory_timeline`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryTimeline {
    /// Per device, ordered by device.
    pub devices: Vec<DeviceTimeline>,
    /// Length of the profile in nanoseconds.
    pub duration_ns: u64,
}

impl ProfileResult {
    /// Allocated/reserved bytes over time per device, split by memory
    /// category, with each device's peak.
    pub fn memory_timeline(&self) -> MemoryTimeline {
        let mut per_device: BTreeMap<DeviceId, Vec<&MemoryRecord>> = BTreeMap::new();
        for record in &self.memory {
            per_device.entry(record.event.device).or_default().push(record);
        }
        let baselines: BTreeMap<DeviceId, &MemoryBaseline> =
            self.memory_baseline.iter().map(|baseline| (baseline.device, baseline)).collect();
        let devices: BTreeSet<DeviceId> = per_device
            .keys()
            .copied()
            .chain(baselines.values().filter(|b| b.total_allocated > 0 || b.total_reserved > 0).map(|b| b.device))
            .collect();
        let devices = devices
            .into_iter()
            .map(|device| {
                let records = per_device.get(&device).map_or(&[][..], Vec::as_slice);
                self.device_timeline(device, baselines.get(&device).copied(), records)
            })
            .collect();
        MemoryTimeline { devices, duration_ns: self.end_ns.saturating_sub(self.start_ns) }
    }

    fn device_timeline(
        &self,
        device: DeviceId,
        baseline: Option<&MemoryBaseline>,
        records: &[&MemoryRecord],
    ) -> DeviceTimeline {
        let rel = |t: u64| t.saturating_sub(self.start_ns);
        let points: Vec<TimelinePoint> = baseline
            .map(|b| TimelinePoint { time_ns: 0, allocated: b.total_allocated, reserved: b.total_reserved })
            .into_iter()
            .chain(records.iter().map(|record| TimelinePoint {
                time_ns: rel(record.time_ns),
                allocated: record.event.total_allocated,
                reserved: record.event.total_reserved,
            }))
            .collect();
        // The first point with the highest allocated total.
        let peak_at = points
            .iter()
            .enumerate()
            .fold(None::<(usize, u64)>, |best, (i, p)| match best {
                Some((_, bytes)) if bytes >= p.allocated => best,
                _ => Some((i, p.allocated)),
            })
            .map(|(i, _)| i);

        let mut replay = CategoryReplay::default();
        let mut held_after: Vec<Vec<u64>> = Vec::with_capacity(points.len());
        let mut live_at_peak: Vec<(u64, Tracked)> = Vec::new();
        let offset = usize::from(baseline.is_some());
        if let Some(baseline) = baseline {
            replay.apply_baseline(baseline);
            held_after.push(replay.held.clone());
        }
        for (i, record) in records.iter().enumerate() {
            replay.apply(record, rel(record.time_ns));
            held_after.push(replay.held.clone());
            if peak_at == Some(i + offset) {
                live_at_peak = replay.blocks.iter().map(|(&addr, &block)| (addr, block)).collect();
            }
        }
        let categories = replay.series(&points, &held_after);

        let peak = peak_at.map(|peak_at| {
            let mut blocks: Vec<LiveBlock> = live_at_peak
                .into_iter()
                .filter_map(|(addr, block)| {
                    let (range, at) = block.allocated?;
                    Some(LiveBlock {
                        addr,
                        bytes: block.bytes,
                        category: replay.names[block.category],
                        op: range
                            .and_then(|r| self.ranges.get(r))
                            .map_or_else(|| NO_RANGE.to_owned(), |r| r.name.to_string()),
                        op_path: range.map_or_else(|| NO_RANGE.to_owned(), |r| self.range_path(r).join(" > ")),
                        allocated_at_ns: at,
                    })
                })
                .collect();
            blocks.sort_by(|a, b| {
                b.bytes.cmp(&a.bytes).then(a.allocated_at_ns.cmp(&b.allocated_at_ns)).then(a.addr.cmp(&b.addr))
            });
            let mut by_op: BTreeMap<&str, (u64, usize)> = BTreeMap::new();
            for block in &blocks {
                let entry = by_op.entry(block.op.as_str()).or_default();
                entry.0 += block.bytes;
                entry.1 += 1;
            }
            let mut by_op: Vec<OpShare> =
                by_op.into_iter().map(|(op, (bytes, blocks))| OpShare { op: op.to_owned(), bytes, blocks }).collect();
            by_op.sort_by_key(|share| std::cmp::Reverse(share.bytes));
            let mut by_category: Vec<(&'static str, u64)> = categories
                .iter()
                .map(|series| (series.category, series.bytes[peak_at]))
                .filter(|&(_, bytes)| bytes > 0)
                .collect();
            by_category.sort_by_key(|&(_, bytes)| std::cmp::Reverse(bytes));
            let point = points[peak_at];
            let known: u64 = blocks.iter().map(|b| b.bytes).sum();
            PeakSnapshot {
                time_ns: point.time_ns,
                allocated: point.allocated,
                reserved: point.reserved,
                unattributed_bytes: point.allocated.saturating_sub(known),
                blocks,
                by_op,
                by_category,
            }
        });
        DeviceTimeline { device, points, categories, peak }
    }

    /// The memory timeline as a self-contained HTML page.
    pub fn memory_timeline_html(&self) -> String {
        html::render_html(&self.memory_timeline(), self.memory.len())
    }

    /// Writes [`memory_timeline_html`](Self::memory_timeline_html) to `path`.
    pub fn export_memory_timeline(&self, path: impl AsRef<Path>) -> Result<(), ProfileError> {
        fs::write(path, self.memory_timeline_html())?;
        Ok(())
    }
}

/// A block the replay knows: its size and category, and for blocks
/// allocated during the profile, the range and time of the allocation.
#[derive(Clone, Copy, Debug)]
struct Tracked {
    bytes: u64,
    category: usize,
    allocated: Option<(Option<usize>, u64)>,
}

/// Replays one device's events into bytes per category. Category 0 is
/// [`UNTRACKED_CATEGORY`], whose bytes are never held here: they are what
/// the allocated total has beyond the others.
struct CategoryReplay {
    names: Vec<&'static str>,
    index: HashMap<&'static str, usize>,
    /// Bytes per category index.
    held: Vec<u64>,
    /// Bytes of each category that the baseline reported and that no event
    /// has freed or retagged yet (blocks from before the recording, whose
    /// addresses the timeline never saw).
    baseline_left: Vec<u64>,
    /// Blocks allocated, or retagged, during the profile, by address.
    blocks: HashMap<u64, Tracked>,
}

impl Default for CategoryReplay {
    fn default() -> Self {
        Self {
            names: vec![UNTRACKED_CATEGORY],
            index: HashMap::from([(UNTRACKED_CATEGORY, 0)]),
            held: vec![0],
            baseline_left: vec![0],
            blocks: HashMap::new(),
        }
    }
}

impl CategoryReplay {
    fn category(&mut self, name: &'static str) -> usize {
        if let Some(&index) = self.index.get(name) {
            return index;
        }
        let index = self.names.len();
        self.names.push(name);
        self.index.insert(name, index);
        self.held.push(0);
        self.baseline_left.push(0);
        index
    }

    fn apply_baseline(&mut self, baseline: &MemoryBaseline) {
        for &(name, bytes) in &baseline.by_category {
            let c = self.category(name);
            self.held[c] = self.held[c].saturating_add(bytes);
            self.baseline_left[c] = self.baseline_left[c].saturating_add(bytes);
        }
    }

    /// Takes up to `bytes` of category `c`'s baseline (a block from before
    /// the recording was freed or retagged).
    fn take_baseline(&mut self, c: usize, bytes: u64) {
        let taken = bytes.min(self.baseline_left[c]);
        self.baseline_left[c] -= taken;
        self.held[c] = self.held[c].saturating_sub(taken);
    }

    fn release(&mut self, block: Tracked) {
        self.held[block.category] = self.held[block.category].saturating_sub(block.bytes);
    }

    fn apply(&mut self, record: &MemoryRecord, time_ns: u64) {
        let event = &record.event;
        let c = self.category(event.category);
        if let Some(retag) = event.retag {
            let from = self.category(retag.from);
            let block = match self.blocks.get(&event.addr).copied() {
                Some(block) => {
                    self.release(block);
                    Tracked { category: c, ..block }
                }
                // A block from before the recording: its bytes leave the
                // baseline (or the untracked band) and are tracked from now on.
                None => {
                    self.take_baseline(from, retag.bytes);
                    Tracked { bytes: retag.bytes, category: c, allocated: None }
                }
            };
            self.held[c] = self.held[c].saturating_add(block.bytes);
            self.blocks.insert(event.addr, block);
        } else if event.bytes > 0 {
            let block =
                Tracked { bytes: event.bytes.unsigned_abs(), category: c, allocated: Some((record.range, time_ns)) };
            if let Some(stale) = self.blocks.insert(event.addr, block) {
                // The same address again without a free in between: a lost event.
                self.release(stale);
            }
            self.held[c] = self.held[c].saturating_add(block.bytes);
        } else if event.bytes < 0 {
            match self.blocks.remove(&event.addr) {
                Some(block) => self.release(block),
                None => self.take_baseline(c, event.bytes.unsigned_abs()),
            }
        }
    }

    /// The series, in stacking order, from the bytes held after each point:
    /// the untracked band is what the allocated total has beyond the others;
    /// where they exceed it (events from several threads recorded slightly
    /// out of order), the excess is cut from the top of the stack down, so
    /// the bands always add up to the allocated line.
    fn series(&self, points: &[TimelinePoint], held_after: &[Vec<u64>]) -> Vec<CategorySeries> {
        let mut order: Vec<usize> = (1..self.names.len()).collect();
        order.sort_by_key(|&c| {
            let name = self.names[c];
            (KNOWN_CATEGORIES.iter().position(|&known| known == name).unwrap_or(KNOWN_CATEGORIES.len()), c)
        });
        order.insert(0, 0);
        let mut bytes: Vec<Vec<u64>> = vec![Vec::with_capacity(points.len()); order.len()];
        for (point, held) in points.iter().zip(held_after) {
            let mut room = point.allocated;
            let tracked: Vec<u64> = order[1..]
                .iter()
                .map(|&c| {
                    let value = held.get(c).copied().unwrap_or(0).min(room);
                    room -= value;
                    value
                })
                .collect();
            bytes[0].push(room);
            for (series, value) in bytes[1..].iter_mut().zip(tracked) {
                series.push(value);
            }
        }
        order
            .into_iter()
            .zip(bytes)
            .filter(|(_, bytes)| bytes.iter().any(|&b| b > 0))
            .map(|(c, bytes)| CategorySeries {
                category: self.names[c],
                peak: bytes.iter().copied().max().unwrap_or(0),
                bytes,
            })
            .collect()
    }
}
