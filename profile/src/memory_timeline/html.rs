//! The memory timeline as one self-contained HTML page: per device, a chart
//! of allocated bytes stacked by memory category with reserved drawn as a
//! line above, a legend that reads the values under the mouse, and what was
//! live at the peak. The style sheet and the hover script are assets of
//! this crate (`src/assets/`), inlined in the page; the chart itself is SVG
//! written here, so the page shows everything without script.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde_json::json;

use super::{DeviceTimeline, MemoryTimeline, TimelinePoint, KNOWN_CATEGORIES, UNTRACKED_CATEGORY};
use crate::units::format_bytes;

const CHART_W: f64 = 1100.0;
const CHART_H: f64 = 360.0;
const LEFT: f64 = 84.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 52.0;
/// Above this many points per device, the chart keeps per-pixel extremes only.
const MAX_PLOT_POINTS: usize = 4_000;
const TOP_BLOCKS: usize = 12;
const TOP_OPS: usize = 10;

const ALLOCATED_COLOR: &str = "#111827";
const RESERVED_COLOR: &str = "#d97706";
const PEAK_COLOR: &str = "#dc2626";
const OP_BAR_COLOR: &str = "#2563eb";
const UNTRACKED_COLOR: &str = "#cbd5e1";
/// Colours of brasa-alloc's categories, in [`KNOWN_CATEGORIES`] order.
const KNOWN_COLORS: [&str; 7] = ["#3b82f6", "#8b5cf6", "#14b8a6", "#22c55e", "#facc15", "#ec4899", "#64748b"];
/// Colours of other category names, by first appearance (then again).
const EXTRA_COLORS: [&str; 6] = ["#0ea5e9", "#84cc16", "#f97316", "#a855f7", "#10b981", "#f43f5e"];

const STYLE: &str = include_str!("../assets/memory_timeline.css");
const HOVER_SCRIPT: &str = include_str!("../assets/memory_timeline.js");

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

/// The colour of each category of the page, the same on every device:
/// fixed for brasa-alloc's names, from a palette for others.
struct Palette {
    extra: HashMap<&'static str, &'static str>,
}

impl Palette {
    fn new(timeline: &MemoryTimeline) -> Self {
        let mut extra = HashMap::new();
        for series in timeline.devices.iter().flat_map(|d| &d.categories) {
            let name = series.category;
            if name != UNTRACKED_CATEGORY && !KNOWN_CATEGORIES.contains(&name) && !extra.contains_key(name) {
                extra.insert(name, EXTRA_COLORS[extra.len() % EXTRA_COLORS.len()]);
            }
        }
        Self { extra }
    }

    fn color(&self, category: &str) -> &'static str {
        if category == UNTRACKED_CATEGORY {
            return UNTRACKED_COLOR;
        }
        match KNOWN_CATEGORIES.iter().position(|&known| known == category) {
            Some(i) => KNOWN_COLORS[i],
            None => self.extra.get(category).copied().unwrap_or(UNTRACKED_COLOR),
        }
    }
}

/// Indices of the points to draw: all of them, or per-bucket extremes (first,
/// last, min/max of allocated and max of reserved) so peaks survive.
fn plot_indices(points: &[TimelinePoint], duration_ns: u64) -> Vec<usize> {
    if points.len() <= MAX_PLOT_POINTS {
        return (0..points.len()).collect();
    }
    let buckets = MAX_PLOT_POINTS / 5;
    let span = duration_ns.max(1) as f64;
    let bucket_of = |p: &TimelinePoint| ((p.time_ns as f64 / span) * buckets as f64) as usize;
    let mut keep = vec![false; points.len()];
    let mut start = 0;
    while start < points.len() {
        let bucket = bucket_of(&points[start]);
        let mut end = start;
        while end < points.len() && bucket_of(&points[end]) == bucket {
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
    keep.iter().enumerate().filter_map(|(i, &k)| k.then_some(i)).collect()
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

/// A step line (memory holds its value until the next event) through
/// `values` at `times`, one vertex per value, on to `end_ms`.
fn step_path(scale: &Scale, times: &[f64], values: &[u64], end_ms: f64) -> String {
    let mut path = String::new();
    for (i, (&t, &v)) in times.iter().zip(values).enumerate() {
        let (x, y) = (scale.x(t), scale.y(v as f64));
        if i == 0 {
            let _ = write!(path, "M{x:.1},{y:.1}");
        } else {
            let _ = write!(path, "H{x:.1}V{y:.1}");
        }
    }
    if !times.is_empty() {
        let _ = write!(path, "H{:.1}", scale.x(end_ms));
    }
    path
}

/// The closed step area between `lower` and `upper` (cumulative bytes at
/// `times`): the upper edge forward, the lower one back. Vertices where an
/// edge does not move are left out, so a band that rarely changes stays small.
fn band_path(scale: &Scale, times: &[f64], lower: &[u64], upper: &[u64], end_ms: f64) -> String {
    let mut path = String::new();
    let (Some(&t0), Some(&u0)) = (times.first(), upper.first()) else {
        return path;
    };
    let x0 = scale.x(t0);
    let _ = write!(path, "M{x0:.1},{:.1}", scale.y(u0 as f64));
    for i in 1..times.len() {
        if upper[i] != upper[i - 1] {
            let _ = write!(path, "H{:.1}V{:.1}", scale.x(times[i]), scale.y(upper[i] as f64));
        }
    }
    let last = times.len() - 1;
    let _ = write!(path, "H{:.1}V{:.1}", scale.x(end_ms), scale.y(lower[last] as f64));
    for i in (1..times.len()).rev() {
        if lower[i] != lower[i - 1] {
            let _ = write!(path, "H{:.1}V{:.1}", scale.x(times[i]), scale.y(lower[i - 1] as f64));
        }
    }
    let _ = write!(path, "H{x0:.1}Z");
    path
}

fn render_chart(out: &mut String, index: usize, device: &DeviceTimeline, duration_ns: u64, palette: &Palette) {
    let plotted = plot_indices(&device.points, duration_ns);
    let times: Vec<f64> = plotted.iter().map(|&i| ms(device.points[i].time_ns)).collect();
    let allocated: Vec<u64> = plotted.iter().map(|&i| device.points[i].allocated).collect();
    let reserved: Vec<u64> = plotted.iter().map(|&i| device.points[i].reserved).collect();
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
    // Bands: allocated bytes stacked by category, bottom first.
    let mut lower = vec![0u64; plotted.len()];
    for series in &device.categories {
        let upper: Vec<u64> =
            plotted.iter().zip(&lower).map(|(&i, &below)| below.saturating_add(series.bytes[i])).collect();
        if upper != lower {
            let _ = write!(
                out,
                r#"<path class="band" data-category="{name}" d="{}" fill="{}"><title>{name} (at most {})</title></path>"#,
                band_path(&scale, &times, &lower, &upper, end_ms),
                palette.color(series.category),
                format_bytes(series.peak),
                name = escape(series.category),
            );
        }
        lower = upper;
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
    // Lines: reserved (dashed), then allocated, the top of the bands.
    let _ = write!(
        out,
        r#"<path class="series" d="{}" stroke="{RESERVED_COLOR}" stroke-dasharray="6 3"/><path class="series allocated" d="{}" stroke="{ALLOCATED_COLOR}"/>"#,
        step_path(&scale, &times, &reserved, end_ms),
        step_path(&scale, &times, &allocated, end_ms),
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
    let _ = write!(
        out,
        r#"<line class="cursor" id="cursor-{index}" x1="0" x2="0" y1="{plot_top}" y2="{plot_bottom}" visibility="hidden"/></svg>"#
    );
    render_legend(out, index, device, palette);
    out.push_str("</div>");
}

/// The legend under a chart: one entry per band (top of the stack first, as
/// the bands read), then the lines. Each entry shows its value at the peak;
/// the hover script shows the values under the mouse instead.
fn render_legend(out: &mut String, index: usize, device: &DeviceTimeline, palette: &Palette) {
    let at_peak = |category: &str| {
        device.peak.as_ref().and_then(|p| p.by_category.iter().find(|(name, _)| *name == category)).map_or(0, |c| c.1)
    };
    let _ = write!(out, r#"<div class="legend" id="legend-{index}">"#);
    for (k, series) in device.categories.iter().enumerate().rev() {
        let title = if series.category == UNTRACKED_CATEGORY {
            "allocated before the recording started, category unknown".to_owned()
        } else {
            format!("{} — at most {}", series.category, format_bytes(series.peak))
        };
        let _ = write!(
            out,
            r#"<span class="item" title="{}"><i class="swatch" style="background:{}"></i>{}<b class="value" data-series="{k}">{}</b></span>"#,
            escape(&title),
            palette.color(series.category),
            escape(series.category),
            format_bytes(at_peak(series.category)),
        );
    }
    let (allocated, reserved) = device.peak.as_ref().map_or((0, 0), |p| (p.allocated, p.reserved));
    let _ = write!(
        out,
        r#"<span class="item"><i class="line" style="border-color:{ALLOCATED_COLOR}"></i>allocated<b class="value" data-series="allocated">{}</b></span><span class="item"><i class="line dashed" style="border-color:{RESERVED_COLOR}"></i>reserved<b class="value" data-series="reserved">{}</b></span><span class="item"><i class="dot" style="background:{PEAK_COLOR}"></i>peak allocated</span></div>"#,
        format_bytes(allocated),
        format_bytes(reserved),
    );
    let readout = device.peak.as_ref().map_or_else(
        || "hover the chart for values".to_owned(),
        |p| format!("values at the peak ({:.3} ms); hover the chart for other times", ms(p.time_ns)),
    );
    let _ = write!(out, r#"<div class="readout" id="readout-{index}">{}</div>"#, escape(&readout));
}

/// Horizontal bars: `(label, tooltip, bytes, note, colour)` per row, scaled to
/// the largest, labelled with their share of `denominator`.
fn render_bars(out: &mut String, title: &str, rows: &[(String, String, u64, String, &str)], denominator: u64) {
    let row_h = 26.0;
    let height = row_h * rows.len().max(1) as f64 + 8.0;
    let _ = write!(out, r#"<h4>{}</h4><svg viewBox="0 0 520 {height:.0}" class="bars">"#, escape(title));
    let denominator = denominator.max(1) as f64;
    // Bars are scaled to the largest row so small peaks still read; the label
    // gives the share of the peak.
    let widest = rows.iter().map(|r| r.2).max().unwrap_or(1).max(1) as f64;
    for (i, (label, tooltip, bytes, note, color)) in rows.iter().enumerate() {
        let y = 4.0 + i as f64 * row_h;
        let width = (*bytes as f64 / widest).clamp(0.0, 1.0) * 210.0;
        let shown: String = if label.chars().count() > 26 {
            label.chars().take(25).chain(std::iter::once('…')).collect()
        } else {
            label.clone()
        };
        let share = *bytes as f64 * 100.0 / denominator;
        let _ = write!(
            out,
            r#"<g><title>{} — {} ({share:.1}% of peak{note})</title><text class="bar-label" x="180" y="{:.1}" text-anchor="end">{}</text><rect x="188" y="{y:.1}" width="{width:.1}" height="18" rx="2" fill="{color}"/><text class="bar-value" x="{:.1}" y="{:.1}">{} · {share:.1}%</text></g>"#,
            escape(tooltip),
            format_bytes(*bytes),
            y + 13.0,
            escape(&shown),
            188.0 + width + 6.0,
            y + 13.0,
            format_bytes(*bytes),
        );
    }
    out.push_str("</svg>");
}

fn render_peak(out: &mut String, device: &DeviceTimeline, palette: &Palette) {
    let Some(peak) = &device.peak else {
        return;
    };
    let _ = write!(
        out,
        r#"<h3>What was live at the peak ({} allocated, {} reserved, at {:.3} ms)</h3><div class="peak"><div class="by-op">"#,
        format_bytes(peak.allocated),
        format_bytes(peak.reserved),
        ms(peak.time_ns)
    );
    // By category, then by op: horizontal bars, as a share of the peak.
    let categories: Vec<(String, String, u64, String, &str)> = peak
        .by_category
        .iter()
        .map(|&(name, bytes)| {
            let tooltip = if name == UNTRACKED_CATEGORY {
                "allocated before the recording started, category unknown".to_owned()
            } else {
                name.to_owned()
            };
            (name.to_owned(), tooltip, bytes, String::new(), palette.color(name))
        })
        .collect();
    if !categories.is_empty() {
        render_bars(out, "Allocated bytes by category", &categories, peak.allocated);
    }
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    let mut shares: Vec<(String, String, u64, String, &str)> = peak
        .by_op
        .iter()
        .take(TOP_OPS)
        .map(|s| {
            (s.op.clone(), s.op.clone(), s.bytes, format!(", {} block{}", s.blocks, plural(s.blocks)), OP_BAR_COLOR)
        })
        .collect();
    let rest: u64 = peak.by_op.iter().skip(TOP_OPS).map(|s| s.bytes).sum();
    if rest > 0 {
        shares.push(("other ops".into(), "other ops".into(), rest, String::new(), OP_BAR_COLOR));
    }
    if peak.unattributed_bytes > 0 {
        shares.push((
            "before this trace".into(),
            "allocated before this trace started recording".into(),
            peak.unattributed_bytes,
            String::new(),
            "#9ca3af",
        ));
    }
    render_bars(out, "Live bytes by allocating op", &shares, peak.allocated);
    out.push_str("</div>");
    // Largest blocks.
    out.push_str(
        r#"<div class="blocks"><h4>Largest live blocks</h4><table><thead><tr><th>#</th><th>size</th><th>category</th><th>allocated by</th><th>at (ms)</th><th>address</th></tr></thead><tbody>"#,
    );
    for (i, block) in peak.blocks.iter().take(TOP_BLOCKS).enumerate() {
        let _ = write!(
            out,
            r#"<tr><td>{}</td><td class="num">{}</td><td class="cat"><i class="swatch" style="background:{}"></i>{}</td><td title="{}">{}</td><td class="num">{:.3}</td><td class="mono">0x{:x}</td></tr>"#,
            i + 1,
            format_bytes(block.bytes),
            palette.color(block.category),
            escape(block.category),
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
            r#"<tr class="muted"><td></td><td class="num">{}</td><td colspan="4">{} smaller blocks</td></tr>"#,
            format_bytes(rest),
            peak.blocks.len() - TOP_BLOCKS
        );
    }
    if peak.blocks.is_empty() {
        out.push_str(r#"<tr class="muted"><td colspan="6">no block allocated during the profile was live</td></tr>"#);
    }
    out.push_str("</tbody></table></div></div>");
}

/// The page's data for the hover script (and for anyone reading the file):
/// per device the drawn points `[ms, allocated, reserved]` and, parallel to
/// them, each category's bytes (the categories add up to allocated).
fn data_json(timeline: &MemoryTimeline, palette: &Palette) -> String {
    let devices: Vec<serde_json::Value> = timeline
        .devices
        .iter()
        .map(|d| {
            let plotted = plot_indices(&d.points, timeline.duration_ns);
            let points: Vec<serde_json::Value> = plotted
                .iter()
                .map(|&i| {
                    let p = d.points[i];
                    json!([ms(p.time_ns), p.allocated, p.reserved])
                })
                .collect();
            let categories: Vec<serde_json::Value> = d
                .categories
                .iter()
                .map(|series| {
                    json!({
                        "name": series.category,
                        "color": palette.color(series.category),
                        "peak": series.peak,
                        "bytes": plotted.iter().map(|&i| series.bytes[i]).collect::<Vec<_>>(),
                    })
                })
                .collect();
            let peak = d.peak.as_ref().map(|p| {
                json!({
                    "time_ms": ms(p.time_ns),
                    "allocated": p.allocated,
                    "reserved": p.reserved,
                    "unattributed": p.unattributed_bytes,
                    "by_category": p.by_category.iter().map(|&(name, bytes)| json!({
                        "category": name, "bytes": bytes,
                    })).collect::<Vec<_>>(),
                    "blocks": p.blocks.iter().map(|b| json!({
                        "addr": b.addr,
                        "bytes": b.bytes,
                        "category": b.category,
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
                "categories": categories,
                "peak": peak,
            })
        })
        .collect();
    let data = json!({ "duration_ms": ms(timeline.duration_ns), "devices": devices });
    // Inside <script>, a "</" would end the element early.
    data.to_string().replace("</", "<\\/")
}

pub(super) fn render_html(timeline: &MemoryTimeline, events: usize) -> String {
    let palette = Palette::new(timeline);
    let mut out = String::with_capacity(16 * 1024);
    out.push_str(
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Memory timeline — brasa-profile</title>
<style>
"#,
    );
    out.push_str(STYLE);
    out.push_str("</style></head><body>\n<h1>Memory timeline</h1>\n");
    let total_peak: u64 = timeline.devices.iter().filter_map(|d| d.peak.as_ref().map(|p| p.allocated)).sum();
    let _ = write!(
        out,
        r#"<p class="sub">{} allocator events on {} device{} over {:.3} ms · allocated is what tensors hold, stacked by what it is for (parameters, gradients, optimizer state, activations, …); reserved is what the allocator holds from the device (allocated + cached). Sum of per-device peaks: {}.</p>"#,
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
        render_chart(&mut out, index, device, timeline.duration_ns, &palette);
        render_peak(&mut out, device, &palette);
        out.push_str("</section>\n");
    }
    let _ = write!(
        out,
        "<script type=\"application/json\" id=\"brasa-memory-data\">{}</script>\n<script>\n",
        data_json(timeline, &palette)
    );
    out.push_str(HOVER_SCRIPT);
    out.push_str("</script>\n</body></html>\n");
    out
}

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
        let kept = plot_indices(&points, 200_000);
        assert!(kept.len() <= MAX_PLOT_POINTS + 5);
        assert!(kept.contains(&12_345));
        assert_eq!(kept.first(), Some(&0));
        assert_eq!(kept.last(), Some(&(points.len() - 1)));
        assert!(kept.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn bands_are_closed_steps_between_their_edges() {
        let scale = Scale { t_max_ms: 10.0, y_max: 100.0 };
        // Two points; the band sits between 0 and 50, then between 20 and 50.
        let path = band_path(&scale, &[0.0, 5.0], &[0, 20], &[50, 50], 10.0);
        assert!(path.starts_with(&format!("M{:.1},{:.1}", scale.x(0.0), scale.y(50.0))), "{path}");
        assert!(path.ends_with('Z'));
        // The flat upper edge has no vertex at t = 5; the lower edge steps there.
        assert_eq!(path.matches('V').count(), 2, "{path}");
        assert!(band_path(&scale, &[], &[], &[], 10.0).is_empty());
    }

    #[test]
    fn known_categories_have_fixed_distinct_colours() {
        let palette = Palette { extra: HashMap::from([("kv_cache", EXTRA_COLORS[0])]) };
        let mut colours: Vec<&str> = KNOWN_CATEGORIES.iter().map(|c| palette.color(c)).collect();
        colours.push(palette.color(UNTRACKED_CATEGORY));
        colours.push(palette.color("kv_cache"));
        for colour in [ALLOCATED_COLOR, RESERVED_COLOR, PEAK_COLOR] {
            colours.push(colour);
        }
        let count = colours.len();
        colours.sort_unstable();
        colours.dedup();
        assert_eq!(colours.len(), count, "every band and line has its own colour");
    }
}
