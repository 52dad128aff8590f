//! The memory timeline: allocated and reserved bytes over time per device, and at
//! each device's peak, the live blocks and the ops that allocated them — the
//! picture that answers "what filled my memory". Exported as one self-contained
//! HTML file (inline SVG, a few lines of inline script for hover; no network).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use serde_json::json;

use crate::error::ProfileError;
use crate::event::DeviceId;
use crate::result::ProfileResult;
use crate::units::format_bytes;

/// The op name given to blocks allocated outside any range.
pub const NO_RANGE: &str = "(outside any range)";

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

/// A block live at the peak.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    /// Its address (or block id).
    pub addr: u64,
    /// Its size.
    pub bytes: u64,
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
    /// Allocated bytes not explained by blocks seen during the profile (allocated
    /// before it started).
    pub unattributed_bytes: u64,
}

/// One device's memory over the profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceTimeline {
    /// The device.
    pub device: DeviceId,
    /// One point per allocator event, in time order.
    pub points: Vec<TimelinePoint>,
    /// The peak (`None` when the device had no events).
    pub peak: Option<PeakSnapshot>,
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
    /// Allocated/reserved bytes over time per device, with each device's peak.
    pub fn memory_timeline(&self) -> MemoryTimeline {
        let mut per_device: BTreeMap<DeviceId, Vec<usize>> = BTreeMap::new();
        for (i, record) in self.memory.iter().enumerate() {
            per_device.entry(record.event.device).or_default().push(i);
        }
        let devices = per_device.into_iter().map(|(device, indices)| self.device_timeline(device, &indices)).collect();
        MemoryTimeline { devices, duration_ns: self.end_ns.saturating_sub(self.start_ns) }
    }

    fn device_timeline(&self, device: DeviceId, indices: &[usize]) -> DeviceTimeline {
        let rel = |t: u64| t.saturating_sub(self.start_ns);
        let points: Vec<TimelinePoint> = indices
            .iter()
            .map(|&i| {
                let record = &self.memory[i];
                TimelinePoint {
                    time_ns: rel(record.time_ns),
                    allocated: record.event.total_allocated,
                    reserved: record.event.total_reserved,
                }
            })
            .collect();
        // The first event with the highest allocated total.
        let peak_at = points
            .iter()
            .enumerate()
            .fold(None::<(usize, u64)>, |best, (i, p)| match best {
                Some((_, bytes)) if bytes >= p.allocated => best,
                _ => Some((i, p.allocated)),
            })
            .map(|(i, _)| i);
        let peak = peak_at.map(|peak_at| {
            let mut live: HashMap<u64, (u64, Option<usize>, u64)> = HashMap::new();
            for &i in &indices[..=peak_at] {
                let record = &self.memory[i];
                let e = record.event;
                if e.bytes > 0 {
                    live.insert(e.addr, (e.bytes.unsigned_abs(), record.range, rel(record.time_ns)));
                } else if e.bytes < 0 {
                    live.remove(&e.addr);
                }
            }
            let mut blocks: Vec<LiveBlock> = live
                .into_iter()
                .map(|(addr, (bytes, range, at))| LiveBlock {
                    addr,
                    bytes,
                    op: range
                        .and_then(|r| self.ranges.get(r))
                        .map_or_else(|| NO_RANGE.to_owned(), |r| r.name.to_string()),
                    op_path: range.map_or_else(|| NO_RANGE.to_owned(), |r| self.range_path(r).join(" > ")),
                    allocated_at_ns: at,
                })
                .collect();
            blocks.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.allocated_at_ns.cmp(&b.allocated_at_ns)));
            let mut by_op: BTreeMap<&str, (u64, usize)> = BTreeMap::new();
            for block in &blocks {
                let entry = by_op.entry(block.op.as_str()).or_default();
                entry.0 += block.bytes;
                entry.1 += 1;
            }
            let mut by_op: Vec<OpShare> =
                by_op.into_iter().map(|(op, (bytes, blocks))| OpShare { op: op.to_owned(), bytes, blocks }).collect();
            by_op.sort_by_key(|share| std::cmp::Reverse(share.bytes));
            let point = points[peak_at];
            let known: u64 = blocks.iter().map(|b| b.bytes).sum();
            PeakSnapshot {
                time_ns: point.time_ns,
                allocated: point.allocated,
                reserved: point.reserved,
                unattributed_bytes: point.allocated.saturating_sub(known),
                blocks,
                by_op,
            }
        });
        DeviceTimeline { device, points, peak }
    }

    /// The memory timeline as a self-contained HTML page.
    pub fn memory_timeline_html(&self) -> String {
        render_html(&self.memory_timeline(), self.memory.len())
    }

    /// Writes [`memory_timeline_html`](Self::memory_timeline_html) to `path`.
    pub fn export_memory_timeline(&self, path: impl AsRef<Path>) -> Result<(), ProfileError> {
        fs::write(path, self.memory_timeline_html())?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Rendering

const CHART_W: f64 = 1100.0;
const CHART_H: f64 = 360.0;
const LEFT: f64 = 84.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 44.0;
const BOTTOM: f64 = 52.0;
/// Above this many points per device, the chart keeps per-pixel extremes only.
const MAX_PLOT_POINTS: usize = 4_000;
const TOP_BLOCKS: usize = 12;
const TOP_OPS: usize = 10;

const ALLOCATED_COLOR: &str = "#2563eb";
const RESERVED_COLOR: &str = "#d97706";
const PEAK_COLOR: &str = "#dc2626";

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// A 1-2-5 step giving about `target` intervals over `span`.
fn nice_step(span: f64, target: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / target;
    let magnitude = 10f64.powf(raw.log10().floor());
    let residual = raw / magnitude;
    let nice = if residual <= 1.0 {
        1.0
    } else if residual <= 2.0 {
        2.0
    } else if residual <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * magnitude
}

/// Prints `value` with as many decimals as `step` needs.
fn tick_label(value: f64, step: f64) -> String {
    let decimals = if step >= 1.0 { 0 } else { (-step.log10().floor()) as usize };
    format!("{value:.decimals$}")
}

/// The binary unit that keeps `max_bytes` below 1024 of it.
fn byte_unit(max_bytes: f64) -> (&'static str, f64) {
    const UNITS: [(&str, f64); 5] =
        [("B", 1.0), ("KiB", 1024.0), ("MiB", 1048576.0), ("GiB", 1073741824.0), ("TiB", 1099511627776.0)];
    UNITS.iter().rev().find(|(_, size)| max_bytes >= *size).copied().unwrap_or(UNITS[0])
}

/// Points to draw: all of them, or per-bucket extremes (first, last, min/max of
/// allocated and max of reserved) so peaks survive.
fn plot_points(points: &[TimelinePoint], duration_ns: u64) -> Vec<TimelinePoint> {
    if points.len() <= MAX_PLOT_POINTS {
        return points.to_vec();
    }
    let buckets = MAX_PLOT_POINTS / 5;
    let span = duration_ns.max(1) as f64;
    let mut keep = vec![false; points.len()];
    let mut start = 0;
    while start < points.len() {
        let bucket = ((points[start].time_ns as f64 / span) * buckets as f64) as usize;
        let mut end = start;
        while end < points.len() && ((points[end].time_ns as f64 / span) * buckets as f64) as usize == bucket {
            end += 1;
        }
        let slice = &points[start..end];
        let pick = |key: &dyn Fn(&TimelinePoint) -> i128| {
            slice.iter().enumerate().max_by_key(|(_, p)| key(p)).map_or(0, |(i, _)| i)
        };
        for i in [
            0,
            slice.len() - 1,
            pick(&|p| i128::from(p.allocated)),
            pick(&|p| -i128::from(p.allocated)),
            pick(&|p| i128::from(p.reserved)),
        ] {
            keep[start + i] = true;
        }
        start = end;
    }
    points.iter().zip(keep).filter_map(|(p, k)| k.then_some(*p)).collect()
}

struct Scale {
    t_max_ms: f64,
    y_max: f64,
}

impl Scale {
    fn x(&self, t_ms: f64) -> f64 {
        LEFT + (t_ms / self.t_max_ms).clamp(0.0, 1.0) * (CHART_W - LEFT - RIGHT)
    }
    fn y(&self, bytes: f64) -> f64 {
        CHART_H - BOTTOM - (bytes / self.y_max).clamp(0.0, 1.0) * (CHART_H - TOP - BOTTOM)
    }
}

/// A step path (memory holds its value until the next event) through the points.
fn step_path(scale: &Scale, points: &[TimelinePoint], end_ms: f64, value: fn(&TimelinePoint) -> u64) -> String {
    let mut path = String::new();
    for (i, p) in points.iter().enumerate() {
        let (x, y) = (scale.x(ms(p.time_ns)), scale.y(value(p) as f64));
        if i == 0 {
            let _ = write!(path, "M{x:.1},{y:.1}");
        } else {
            let _ = write!(path, "H{x:.1}V{y:.1}");
        }
    }
    if !points.is_empty() {
        let _ = write!(path, "H{:.1}", scale.x(end_ms));
    }
    path
}

fn render_chart(out: &mut String, index: usize, device: &DeviceTimeline, duration_ns: u64) {
    let points = plot_points(&device.points, duration_ns);
    let max_bytes = device.points.iter().map(|p| p.allocated.max(p.reserved)).max().unwrap_or(0).max(1) as f64;
    let (unit, unit_size) = byte_unit(max_bytes);
    let y_step = nice_step(max_bytes / unit_size, 5.0);
    let y_max_units = ((max_bytes / unit_size) * 1.08 / y_step).ceil() * y_step;
    let end_ms = ms(duration_ns.max(device.points.last().map_or(0, |p| p.time_ns)));
    let t_step = nice_step(end_ms.max(1e-3), 10.0);
    let t_max_ms = (end_ms / t_step).ceil().max(1.0) * t_step;
    let scale = Scale { t_max_ms, y_max: y_max_units * unit_size };
    let (plot_left, plot_right) = (LEFT, CHART_W - RIGHT);
    let (plot_top, plot_bottom) = (TOP, CHART_H - BOTTOM);

    let _ = write!(
        out,
        r#"<div class="chart"><svg id="chart-{index}" data-device="{index}" data-tmax="{t_max_ms}" viewBox="0 0 {CHART_W} {CHART_H}" role="img" aria-label="memory of {dev} over time">"#,
        dev = device.device
    );
    // Grid and axes.
    let mut y = 0.0;
    while y <= y_max_units + y_step * 0.01 {
        let py = scale.y(y * unit_size);
        let _ = write!(
            out,
            r#"<line class="grid" x1="{plot_left}" x2="{plot_right}" y1="{py:.1}" y2="{py:.1}"/><text class="tick" x="{:.1}" y="{:.1}" text-anchor="end">{} {unit}</text>"#,
            plot_left - 8.0,
            py + 4.0,
            tick_label(y, y_step)
        );
        y += y_step;
    }
    let mut t = 0.0;
    while t <= t_max_ms + t_step * 0.01 {
        let px = scale.x(t);
        let _ = write!(
            out,
            r#"<line class="grid" x1="{px:.1}" x2="{px:.1}" y1="{plot_top}" y2="{plot_bottom}"/><text class="tick" x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            plot_bottom + 18.0,
            tick_label(t, t_step)
        );
        t += t_step;
    }
    let _ = write!(
        out,
        r#"<line class="axis" x1="{plot_left}" x2="{plot_right}" y1="{plot_bottom}" y2="{plot_bottom}"/><line class="axis" x1="{plot_left}" x2="{plot_left}" y1="{plot_top}" y2="{plot_bottom}"/>"#
    );
    let _ = write!(
        out,
        r#"<text class="axis-title" x="{:.1}" y="{:.1}" text-anchor="middle">time since profile start (ms)</text><text class="axis-title" transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">memory ({unit})</text>"#,
        (plot_left + plot_right) / 2.0,
        CHART_H - 10.0,
        (plot_top + plot_bottom) / 2.0
    );
    // Series: allocated as a filled area under its step line, reserved as a line.
    let allocated = step_path(&scale, &points, end_ms, |p| p.allocated);
    if let Some(first) = points.first() {
        let _ = write!(
            out,
            r#"<path class="area" d="{allocated}V{:.1}H{:.1}Z" fill="{ALLOCATED_COLOR}"/>"#,
            plot_bottom,
            scale.x(ms(first.time_ns))
        );
    }
    let _ = write!(
        out,
        r#"<path class="series" d="{}" stroke="{RESERVED_COLOR}" stroke-dasharray="6 3"/><path class="series" d="{allocated}" stroke="{ALLOCATED_COLOR}"/>"#,
        step_path(&scale, &points, end_ms, |p| p.reserved)
    );
    // Peak marker.
    if let Some(peak) = &device.peak {
        let (px, py) = (scale.x(ms(peak.time_ns)), scale.y(peak.allocated as f64));
        let label = format!("peak {} at {:.3} ms", format_bytes(peak.allocated), ms(peak.time_ns));
        let anchor = if px > (plot_left + plot_right) / 2.0 { "end" } else { "start" };
        let dx = if anchor == "end" { -8.0 } else { 8.0 };
        let _ = write!(
            out,
            r#"<line x1="{px:.1}" x2="{px:.1}" y1="{plot_top}" y2="{plot_bottom}" stroke="{PEAK_COLOR}" stroke-dasharray="3 3"/><circle cx="{px:.1}" cy="{py:.1}" r="5" fill="{PEAK_COLOR}"><title>{}</title></circle><text class="peak-label" x="{:.1}" y="{:.1}" text-anchor="{anchor}" fill="{PEAK_COLOR}">{}</text>"#,
            escape(&label),
            px + dx,
            (py - 10.0).max(plot_top + 12.0),
            escape(&label)
        );
    }
    // Legend.
    let _ = write!(
        out,
        r#"<g class="legend" transform="translate({plot_left} 18)"><rect width="14" height="10" y="-9" fill="{ALLOCATED_COLOR}" opacity="0.6"/><text x="20">allocated</text><line x1="104" x2="122" y1="-4" y2="-4" stroke="{RESERVED_COLOR}" stroke-width="2" stroke-dasharray="6 3"/><text x="128">reserved</text><circle cx="222" cy="-4" r="5" fill="{PEAK_COLOR}"/><text x="232">peak allocated</text></g>"#
    );
    let _ = write!(
        out,
        r#"<line class="cursor" id="cursor-{index}" x1="0" x2="0" y1="{plot_top}" y2="{plot_bottom}" visibility="hidden"/></svg><div class="readout" id="readout-{index}">hover the chart for values</div></div>"#
    );
}

fn render_peak(out: &mut String, device: &DeviceTimeline) {
    let Some(peak) = &device.peak else {
        return;
    };
    let _ = write!(
        out,
        r#"<h3>What was live at the peak ({} allocated, {} reserved, at {:.3} ms)</h3><div class="peak">"#,
        format_bytes(peak.allocated),
        format_bytes(peak.reserved),
        ms(peak.time_ns)
    );
    // By op: horizontal bars, as a share of the peak.
    let mut shares: Vec<(String, String, u64, usize)> =
        peak.by_op.iter().take(TOP_OPS).map(|s| (s.op.clone(), s.op.clone(), s.bytes, s.blocks)).collect();
    let rest: u64 = peak.by_op.iter().skip(TOP_OPS).map(|s| s.bytes).sum();
    if rest > 0 {
        shares.push(("other ops".into(), "other ops".into(), rest, 0));
    }
    if peak.unattributed_bytes > 0 {
        shares.push((
            "before this trace".into(),
            "allocated before this trace started recording".into(),
            peak.unattributed_bytes,
            0,
        ));
    }
    let row_h = 26.0;
    let height = row_h * shares.len().max(1) as f64 + 8.0;
    let _ = write!(
        out,
        r#"<div class="by-op"><h4>Live bytes by allocating op</h4><svg viewBox="0 0 520 {height:.0}" class="bars">"#
    );
    let denominator = peak.allocated.max(1) as f64;
    // Bars are scaled to the largest share so small peaks still read; the label
    // gives the share of the peak.
    let widest = shares.iter().map(|s| s.2).max().unwrap_or(1).max(1) as f64;
    for (i, (op, title, bytes, blocks)) in shares.iter().enumerate() {
        let y = 4.0 + i as f64 * row_h;
        let width = (*bytes as f64 / widest).clamp(0.0, 1.0) * 210.0;
        let shown: String = if op.chars().count() > 26 {
            op.chars().take(25).chain(std::iter::once('…')).collect()
        } else {
            op.clone()
        };
        let blocks_note = if *blocks > 0 {
            format!(", {blocks} block{}", if *blocks == 1 { "" } else { "s" })
        } else {
            String::new()
        };
        let _ = write!(
            out,
            r#"<g><title>{} — {} ({:.1}% of peak{blocks_note})</title><text class="bar-label" x="180" y="{:.1}" text-anchor="end">{}</text><rect x="188" y="{y:.1}" width="{width:.1}" height="18" rx="2" fill="{}"/><text class="bar-value" x="{:.1}" y="{:.1}">{} · {:.1}%</text></g>"#,
            escape(title),
            format_bytes(*bytes),
            *bytes as f64 * 100.0 / denominator,
            y + 13.0,
            escape(&shown),
            if op == "before this trace" { "#9ca3af" } else { ALLOCATED_COLOR },
            188.0 + width + 6.0,
            y + 13.0,
            format_bytes(*bytes),
            *bytes as f64 * 100.0 / denominator,
        );
    }
    out.push_str("</svg></div>");
    // Largest blocks.
    out.push_str(
        r#"<div class="blocks"><h4>Largest live blocks</h4><table><thead><tr><th>#</th><th>size</th><th>allocated by</th><th>at (ms)</th><th>address</th></tr></thead><tbody>"#,
    );
    for (i, block) in peak.blocks.iter().take(TOP_BLOCKS).enumerate() {
        let _ = write!(
            out,
            r#"<tr><td>{}</td><td class="num">{}</td><td title="{}">{}</td><td class="num">{:.3}</td><td class="mono">0x{:x}</td></tr>"#,
            i + 1,
            format_bytes(block.bytes),
            escape(&block.op_path),
            escape(&block.op),
            ms(block.allocated_at_ns),
            block.addr
        );
    }
    if peak.blocks.len() > TOP_BLOCKS {
        let rest: u64 = peak.blocks.iter().skip(TOP_BLOCKS).map(|b| b.bytes).sum();
        let _ = write!(
            out,
            r#"<tr class="muted"><td></td><td class="num">{}</td><td colspan="3">{} smaller blocks</td></tr>"#,
            format_bytes(rest),
            peak.blocks.len() - TOP_BLOCKS
        );
    }
    if peak.blocks.is_empty() {
        out.push_str(r#"<tr class="muted"><td colspan="5">no block allocated during the profile was live</td></tr>"#);
    }
    out.push_str("</tbody></table></div></div>");
}

fn data_json(timeline: &MemoryTimeline) -> String {
    let devices: Vec<serde_json::Value> = timeline
        .devices
        .iter()
        .map(|d| {
            let points: Vec<serde_json::Value> = plot_points(&d.points, timeline.duration_ns)
                .iter()
                .map(|p| json!([ms(p.time_ns), p.allocated, p.reserved]))
                .collect();
            let peak = d.peak.as_ref().map(|p| {
                json!({
                    "time_ms": ms(p.time_ns),
                    "allocated": p.allocated,
                    "reserved": p.reserved,
                    "unattributed": p.unattributed_bytes,
                    "blocks": p.blocks.iter().map(|b| json!({
                        "addr": b.addr,
                        "bytes": b.bytes,
                        "op": b.op,
                        "path": b.op_path,
                        "allocated_at_ms": ms(b.allocated_at_ns),
                    })).collect::<Vec<_>>(),
                    "by_op": p.by_op.iter().map(|s| json!({
                        "op": s.op, "bytes": s.bytes, "blocks": s.blocks,
                    })).collect::<Vec<_>>(),
                })
            });
            json!({
                "device": d.device.to_string(),
                "events": d.points.len(),
                "points": points,
                "peak": peak,
            })
        })
        .collect();
    let data = json!({ "duration_ms": ms(timeline.duration_ns), "devices": devices });
    // Inside <script>, a "</" would end the element early.
    data.to_string().replace("</", "<\\/")
}

fn render_html(timeline: &MemoryTimeline, events: usize) -> String {
    let mut out = String::with_capacity(16 * 1024);
    out.push_str(
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Memory timeline — brasa-profile</title>
<style>
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1160px;padding:0 16px;color:#111827;background:#fff}
h1{font-size:24px;margin:0 0 4px}h2{font-size:19px;margin:28px 0 6px;border-bottom:1px solid #e5e7eb;padding-bottom:4px}
h3{font-size:15px;margin:14px 0 6px;color:#374151}h4{font-size:13px;margin:4px 0 6px;color:#4b5563;text-transform:uppercase;letter-spacing:.04em}
.sub{color:#6b7280;margin:0 0 8px}.chart{position:relative}.chart svg{width:100%;height:auto;display:block}
.grid{stroke:#eef0f3}.axis{stroke:#6b7280}.tick{font-size:11px;fill:#4b5563}.axis-title{font-size:12px;fill:#374151}
.series{fill:none;stroke-width:2}.area{opacity:.18}.legend text{font-size:12px;fill:#374151}.peak-label{font-size:12px;font-weight:600}
.cursor{stroke:#111827;stroke-width:1;opacity:.45}.readout{font-size:12px;color:#374151;min-height:16px;font-variant-numeric:tabular-nums}
.peak{display:flex;flex-wrap:wrap;gap:24px}.by-op{flex:1 1 520px}.blocks{flex:1 1 480px}.bars{width:100%;max-width:560px;height:auto}
.bar-label{font-size:12px;fill:#111827}.bar-value{font-size:11px;fill:#374151}
table{border-collapse:collapse;font-size:12.5px;width:100%}th,td{padding:4px 8px;border-bottom:1px solid #eef0f3;text-align:left}
th{color:#4b5563;font-weight:600}.num{text-align:right;font-variant-numeric:tabular-nums}.mono{font-family:ui-monospace,Menlo,Consolas,monospace;color:#4b5563}
.muted td{color:#6b7280}
</style></head><body>
<h1>Memory timeline</h1>
"#,
    );
    let total_peak: u64 = timeline.devices.iter().filter_map(|d| d.peak.as_ref().map(|p| p.allocated)).sum();
    let _ = write!(
        out,
        r#"<p class="sub">{} allocator events on {} device{} over {:.3} ms · allocated is what tensors hold; reserved is what the allocator holds from the device (allocated + cached). Sum of per-device peaks: {}.</p>"#,
        events,
        timeline.devices.len(),
        if timeline.devices.len() == 1 { "" } else { "s" },
        ms(timeline.duration_ns),
        format_bytes(total_peak)
    );
    if timeline.devices.is_empty() {
        out.push_str(r#"<p>No memory events were recorded. Build the profiler with <code>profile_memory(true)</code> and connect an allocator observer that calls <code>record_memory_event</code>.</p>"#);
    }
    for (index, device) in timeline.devices.iter().enumerate() {
        let headline = device.peak.as_ref().map_or_else(String::new, |p| {
            format!(
                " — peak {} allocated at {:.3} ms (reserved {})",
                format_bytes(p.allocated),
                ms(p.time_ns),
                format_bytes(p.reserved)
            )
        });
        let _ = write!(out, "<section><h2>{}{}</h2>", device.device, escape(&headline));
        render_chart(&mut out, index, device, timeline.duration_ns);
        render_peak(&mut out, device);
        out.push_str("</section>\n");
    }
    let _ = write!(out, "<script type=\"application/json\" id=\"brasa-memory-data\">{}</script>", data_json(timeline));
    out.push_str(HOVER_SCRIPT);
    out.push_str("</body></html>\n");
    out
}

/// Hover readout: nearest earlier event under the mouse. Reads the embedded data;
/// the geometry constants match the Rust side.
const HOVER_SCRIPT: &str = r#"<script>
(function () {
  var data = JSON.parse(document.getElementById("brasa-memory-data").textContent);
  var L = 84, R = 24, W = 1100;
  function fmt(b) {
    var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
    while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
    return (i === 0 ? b.toFixed(0) : b.toFixed(2)) + " " + u[i];
  }
  data.devices.forEach(function (dev, k) {
    var svg = document.getElementById("chart-" + k);
    var cursor = document.getElementById("cursor-" + k);
    var readout = document.getElementById("readout-" + k);
    if (!svg || !dev.points.length) return;
    var tmax = parseFloat(svg.getAttribute("data-tmax")) || data.duration_ms || 1;
    svg.addEventListener("mousemove", function (ev) {
      var pt = svg.createSVGPoint(); pt.x = ev.clientX; pt.y = ev.clientY;
      var p = pt.matrixTransform(svg.getScreenCTM().inverse());
      if (p.x < L || p.x > W - R) return;
      var t = (p.x - L) / (W - L - R) * tmax, lo = 0, hi = dev.points.length - 1;
      if (t < dev.points[0][0]) { readout.textContent = "t = " + t.toFixed(3) + " ms · no event yet"; return; }
      while (lo < hi) { var mid = (lo + hi + 1) >> 1; if (dev.points[mid][0] <= t) lo = mid; else hi = mid - 1; }
      var q = dev.points[lo];
      cursor.setAttribute("x1", p.x); cursor.setAttribute("x2", p.x); cursor.setAttribute("visibility", "visible");
      readout.textContent = "t = " + t.toFixed(3) + " ms · allocated " + fmt(q[1]) + " · reserved " + fmt(q[2]);
    });
    svg.addEventListener("mouseleave", function () { cursor.setAttribute("visibility", "hidden"); });
  });
})();
</script>
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_steps_are_1_2_5() {
        assert_eq!(nice_step(10.0, 10.0), 1.0);
        assert_eq!(nice_step(17.0, 10.0), 2.0);
        assert_eq!(nice_step(0.4, 10.0), 0.05);
        assert_eq!(tick_label(0.15, 0.05), "0.15");
        assert_eq!(tick_label(20.0, 5.0), "20");
    }

    #[test]
    fn byte_units() {
        assert_eq!(byte_unit(100.0).0, "B");
        assert_eq!(byte_unit(3.0 * 1048576.0).0, "MiB");
        assert_eq!(byte_unit(5.0 * 1073741824.0).0, "GiB");
    }

    #[test]
    fn escaping() {
        assert_eq!(escape("<a & 'b'>"), "&lt;a &amp; &#39;b&#39;&gt;");
    }

    #[test]
    fn downsampling_keeps_the_peak() {
        let points: Vec<TimelinePoint> = (0..20_000u64)
            .map(|i| TimelinePoint {
                time_ns: i * 10,
                allocated: if i == 12_345 { 1_000_000 } else { i % 100 },
                reserved: 2_000_000,
            })
            .collect();
        let kept = plot_points(&points, 200_000);
        assert!(kept.len() <= MAX_PLOT_POINTS + 5);
        assert!(kept.iter().any(|p| p.allocated == 1_000_000));
        assert_eq!(kept.first(), points.first());
        assert_eq!(kept.last(), points.last());
    }
}
