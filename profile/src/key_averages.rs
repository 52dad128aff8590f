//! The aggregated op table, like PyTorch's `prof.key_averages().table(...)`.

use std::collections::HashMap;
use std::fmt;

use crate::result::ProfileResult;
use crate::units::{format_memory, format_percent, format_time_ns, format_time_us};

/// One row: every range with the same name (and, when grouping by shape, the
/// same input shapes), summed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyAverage {
    /// The range name.
    pub name: String,
    /// The input shapes of this group (only when grouped by input shape).
    pub input_shapes: Option<Vec<Vec<usize>>>,
    /// Number of ranges summed.
    pub count: u64,
    /// Σ self time (duration minus children).
    pub self_cpu_ns: u64,
    /// Σ duration.
    pub cpu_total_ns: u64,
    /// Σ device time launched directly inside.
    pub self_device_ns: u64,
    /// Σ device time launched inside, children included.
    pub device_total_ns: u64,
    /// Σ net bytes allocated directly inside.
    pub self_mem_bytes: i64,
    /// Σ net bytes allocated inside, children included.
    pub mem_bytes: i64,
}

impl KeyAverage {
    /// Mean duration per call, in nanoseconds.
    pub fn cpu_time_avg_ns(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.cpu_total_ns as f64 / self.count as f64
        }
    }

    /// Mean device time per call, in nanoseconds.
    pub fn device_time_avg_ns(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.device_total_ns as f64 / self.count as f64
        }
    }
}

/// A row's identity: name, and input shapes when grouping by shape.
type GroupKey<'a> = (&'a str, Option<&'a Vec<Vec<usize>>>);

/// The widest an `Input Shapes` cell gets before it is cut.
const SHAPES_WIDTH: usize = 80;

/// Sort keys for [`KeyAverages::sort_by`] (always descending, like PyTorch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SortBy {
    /// `self_cpu_time_total`.
    SelfCpu,
    /// `cpu_time_total`.
    CpuTotal,
    /// `self_cuda_time_total` (any device).
    SelfDevice,
    /// `cuda_time_total` (any device).
    DeviceTotal,
    /// `count`.
    Calls,
    /// `self_cpu_memory_usage` (any device).
    SelfMem,
    /// `cpu_memory_usage` (any device).
    Mem,
}

/// How [`KeyAverages::table`] prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableOptions {
    sort_by: Option<SortBy>,
    row_limit: Option<usize>,
    max_name_width: usize,
}

impl Default for TableOptions {
    fn default() -> Self {
        Self { sort_by: None, row_limit: None, max_name_width: 55 }
    }
}

impl TableOptions {
    /// Sort rows by `key`, descending. Default: first-seen order.
    pub fn sort_by(mut self, key: SortBy) -> Self {
        self.sort_by = Some(key);
        self
    }

    /// Print at most `rows` rows (percentages and totals still count all rows).
    pub fn row_limit(mut self, rows: usize) -> Self {
        self.row_limit = Some(rows);
        self
    }

    /// Truncate names longer than this with `...`. Default 55, as PyTorch.
    pub fn max_name_width(mut self, width: usize) -> Self {
        self.max_name_width = width.max(8);
        self
    }
}

/// The rows of the op table; build with [`ProfileResult::key_averages`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyAverages {
    rows: Vec<KeyAverage>,
    grouped_by_input_shape: bool,
    device_label: &'static str,
}

/// What the device columns are called: `CUDA` when every device interval ran
/// on a CUDA device (PyTorch's `Self CUDA` / `CUDA total`), `Device` otherwise.
fn device_label(result: &ProfileResult) -> &'static str {
    let mut kinds = result.device_intervals.iter().map(|d| d.device.kind);
    match kinds.next() {
        Some("cuda") if kinds.all(|kind| kind == "cuda") => "CUDA",
        _ => "Device",
    }
}

impl ProfileResult {
    /// Ranges grouped by name, like PyTorch's `key_averages()`.
    pub fn key_averages(&self) -> KeyAverages {
        KeyAverages::new(self, false)
    }

    /// Ranges grouped by name and input shapes, like
    /// `key_averages(group_by_input_shape=True)`.
    pub fn key_averages_by_input_shape(&self) -> KeyAverages {
        KeyAverages::new(self, true)
    }
}

impl KeyAverages {
    /// Groups `result`'s ranges by name (and input shapes if asked), in order of
    /// first appearance.
    pub fn new(result: &ProfileResult, group_by_input_shape: bool) -> Self {
        let stats = result.range_stats();
        let mut rows: Vec<KeyAverage> = Vec::new();
        let mut index: HashMap<GroupKey<'_>, usize> = HashMap::new();
        for (range, stat) in result.ranges.iter().zip(&stats) {
            let shapes = if group_by_input_shape { range.input_shapes.as_ref() } else { None };
            let row = *index.entry((range.name.as_ref(), shapes)).or_insert_with(|| {
                rows.push(KeyAverage {
                    name: range.name.to_string(),
                    input_shapes: shapes.cloned(),
                    ..KeyAverage::default()
                });
                rows.len() - 1
            });
            let row = &mut rows[row];
            row.count += 1;
            row.self_cpu_ns = row.self_cpu_ns.saturating_add(stat.self_ns);
            row.cpu_total_ns = row.cpu_total_ns.saturating_add(stat.total_ns);
            row.self_device_ns = row.self_device_ns.saturating_add(stat.self_device_ns);
            row.device_total_ns = row.device_total_ns.saturating_add(stat.device_total_ns);
            row.self_mem_bytes = row.self_mem_bytes.saturating_add(stat.self_mem_bytes);
            row.mem_bytes = row.mem_bytes.saturating_add(stat.mem_bytes);
        }
        Self { rows, grouped_by_input_shape: group_by_input_shape, device_label: device_label(result) }
    }

    /// The name of the device columns: `CUDA` when all device time was
    /// recorded on CUDA devices, else `Device`.
    pub fn device_label(&self) -> &'static str {
        if self.device_label.is_empty() {
            "Device"
        } else {
            self.device_label
        }
    }

    /// The rows, in the current order.
    pub fn rows(&self) -> &[KeyAverage] {
        &self.rows
    }

    /// The first row named `name`.
    pub fn get(&self, name: &str) -> Option<&KeyAverage> {
        self.rows.iter().find(|r| r.name == name)
    }

    /// Sorts rows by `key`, descending; ties keep their order.
    pub fn sort_by(&mut self, key: SortBy) {
        sort_rows(&mut self.rows, key);
    }

    /// Σ self CPU time over all rows: the table's percentages are against this.
    pub fn self_cpu_time_total_ns(&self) -> u64 {
        self.rows.iter().fold(0u64, |sum, r| sum.saturating_add(r.self_cpu_ns))
    }

    /// Σ self device time over all rows.
    pub fn self_device_time_total_ns(&self) -> u64 {
        self.rows.iter().fold(0u64, |sum, r| sum.saturating_add(r.self_device_ns))
    }

    /// The table as PyTorch prints it. Device columns (`Self CUDA`, `Self CUDA %`,
    /// `CUDA total`, `CUDA time avg`, and the footer `Self CUDA time total`; named
    /// `Device` instead of `CUDA` when other devices recorded too) appear when any
    /// device time was recorded, as PyTorch hides its CUDA columns for CPU-only
    /// runs; memory columns when any memory event was; `Input Shapes` when grouped
    /// by shape.
    pub fn table(&self, options: &TableOptions) -> String {
        let mut rows: Vec<&KeyAverage> = self.rows.iter().collect();
        if let Some(key) = options.sort_by {
            rows.sort_by_key(|row| std::cmp::Reverse(sort_value(row, key)));
        }
        let self_cpu_total = self.self_cpu_time_total_ns() as f64;
        let self_device_total = self.self_device_time_total_ns() as f64;
        let has_device = self.rows.iter().any(|r| r.device_total_ns > 0);
        let has_mem = self.rows.iter().any(|r| r.mem_bytes != 0 || r.self_mem_bytes != 0);
        let shown = &rows[..options.row_limit.unwrap_or(rows.len()).min(rows.len())];

        let label = self.device_label();
        let mut headers: Vec<String> =
            ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"].map(String::from).into();
        if has_device {
            headers.extend([
                format!("Self {label}"),
                format!("Self {label} %"),
                format!("{label} total"),
                format!("{label} time avg"),
            ]);
        }
        if has_mem {
            headers.extend(["Self Mem".to_owned(), "Mem".to_owned()]);
        }
        headers.push("# of Calls".to_owned());
        if self.grouped_by_input_shape {
            headers.push("Input Shapes".to_owned());
        }

        let name_width = shown
            .iter()
            .map(|r| r.name.chars().count())
            .max()
            .unwrap_or(0)
            .max(4)
            .saturating_add(4)
            .min(options.max_name_width);
        let body: Vec<Vec<String>> = shown
            .iter()
            .map(|row| {
                let mut cells = vec![
                    truncate(&row.name, name_width),
                    format_percent(row.self_cpu_ns as f64, self_cpu_total),
                    format_time_ns(row.self_cpu_ns),
                    format_percent(row.cpu_total_ns as f64, self_cpu_total),
                    format_time_ns(row.cpu_total_ns),
                    format_time_us(row.cpu_time_avg_ns() / 1_000.0),
                ];
                if has_device {
                    cells.extend([
                        format_time_ns(row.self_device_ns),
                        format_percent(row.self_device_ns as f64, self_device_total),
                        format_time_ns(row.device_total_ns),
                        format_time_us(row.device_time_avg_ns() / 1_000.0),
                    ]);
                }
                if has_mem {
                    cells.extend([format_memory(row.self_mem_bytes), format_memory(row.mem_bytes)]);
                }
                cells.push(row.count.to_string());
                if self.grouped_by_input_shape {
                    cells.push(truncate(&shapes_text(row), SHAPES_WIDTH));
                }
                cells
            })
            .collect();

        // PyTorch's layout: 12-wide columns (wider when a header or a cell needs
        // it), every cell right-aligned, two spaces after each column.
        let widths: Vec<usize> = headers
            .iter()
            .enumerate()
            .map(|(c, header)| {
                let cells = body.iter().map(|r| r[c].chars().count()).max().unwrap_or(0);
                let floor = if c == 0 { name_width } else { 12 };
                floor.max(header.len()).max(cells)
            })
            .collect();
        let separator: String = widths.iter().map(|w| format!("{}  ", "-".repeat(*w))).collect();
        let line = |cells: &[String]| -> String {
            cells.iter().zip(&widths).map(|(cell, w)| format!("{cell:>w$}  ", w = *w)).collect::<String>()
        };

        let mut out = String::new();
        out.push_str(&separator);
        out.push('\n');
        out.push_str(&line(&headers));
        out.push('\n');
        out.push_str(&separator);
        out.push('\n');
        for cells in &body {
            out.push_str(&line(cells));
            out.push('\n');
        }
        out.push_str(&separator);
        out.push('\n');
        out.push_str(&format!("Self CPU time total: {}\n", format_time_ns(self.self_cpu_time_total_ns())));
        if has_device {
            out.push_str(&format!("Self {label} time total: {}\n", format_time_ns(self.self_device_time_total_ns())));
        }
        out
    }
}

impl fmt::Display for KeyAverages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.table(&TableOptions::default()))
    }
}

fn sort_value(row: &KeyAverage, key: SortBy) -> i128 {
    match key {
        SortBy::SelfCpu => row.self_cpu_ns.into(),
        SortBy::CpuTotal => row.cpu_total_ns.into(),
        SortBy::SelfDevice => row.self_device_ns.into(),
        SortBy::DeviceTotal => row.device_total_ns.into(),
        SortBy::Calls => row.count.into(),
        SortBy::SelfMem => row.self_mem_bytes.into(),
        SortBy::Mem => row.mem_bytes.into(),
    }
}

fn sort_rows(rows: &mut [KeyAverage], key: SortBy) {
    rows.sort_by_key(|row| std::cmp::Reverse(sort_value(row, key)));
}

fn shapes_text(row: &KeyAverage) -> String {
    match &row.input_shapes {
        Some(shapes) => format!("{shapes:?}"),
        None => "[]".to_owned(),
    }
}

/// Cuts `text` to `width` characters, ending in `...` when cut (as PyTorch does).
fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_owned()
    } else {
        let mut cut: String = text.chars().take(width.saturating_sub(3)).collect();
        cut.push_str("...");
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{RangeEvent, RangeKind};

    fn range(
        name: &'static str,
        start: u64,
        end: u64,
        parent: Option<usize>,
        shapes: Option<Vec<Vec<usize>>>,
    ) -> RangeEvent {
        RangeEvent {
            name: name.into(),
            kind: RangeKind::Op,
            tid: 1,
            start_ns: start,
            end_ns: end,
            parent,
            input_shapes: shapes,
            truncated: false,
        }
    }

    fn sample() -> ProfileResult {
        ProfileResult {
            ranges: vec![
                range("forward", 0, 10_000_000, None, None),
                range("matmul", 1_000_000, 4_000_000, Some(0), Some(vec![vec![2, 3], vec![3, 4]])),
                range("matmul", 5_000_000, 6_000_000, Some(0), Some(vec![vec![8, 8], vec![8, 8]])),
                range("relu", 7_000_000, 7_138_447, Some(0), None),
            ],
            ..ProfileResult::default()
        }
    }

    #[test]
    fn groups_by_name_and_sums() {
        let k = sample().key_averages();
        assert_eq!(k.rows().len(), 3);
        let mm = k.get("matmul").unwrap();
        assert_eq!(mm.count, 2);
        assert_eq!(mm.cpu_total_ns, 4_000_000);
        assert_eq!(mm.self_cpu_ns, 4_000_000);
        assert_eq!(k.get("forward").unwrap().self_cpu_ns, 10_000_000 - 4_000_000 - 138_447);
        assert_eq!(k.self_cpu_time_total_ns(), 10_000_000);
    }

    #[test]
    fn groups_by_input_shape() {
        let k = sample().key_averages_by_input_shape();
        assert_eq!(k.rows().len(), 4);
        let table = k.table(&TableOptions::default());
        assert!(table.contains("Input Shapes"));
        assert!(table.contains("[[2, 3], [3, 4]]"));
        assert!(table.contains("[[8, 8], [8, 8]]"));
    }

    #[test]
    fn table_has_pytorch_columns_footer_and_formats() {
        let table = sample().key_averages().table(&TableOptions::default().sort_by(SortBy::CpuTotal));
        let lines: Vec<&str> = table.lines().collect();
        for header in ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg", "# of Calls"] {
            assert!(lines[1].contains(header), "missing {header}: {}", lines[1]);
        }
        assert!(!lines[1].contains("Self Device"), "no device columns without device time");
        assert!(lines[0].starts_with("---"));
        assert!(lines[3].trim_start().starts_with("forward"), "sorted by CPU total: {}", lines[3]);
        assert!(lines[3].contains("100.00%"));
        assert!(table.contains("138.447us"));
        assert!(table.contains("10.000ms"));
        assert!(table.ends_with("Self CPU time total: 10.000ms\n"));
    }

    #[test]
    fn sort_and_row_limit() {
        let mut k = sample().key_averages();
        k.sort_by(SortBy::Calls);
        assert_eq!(k.rows()[0].name, "matmul");
        let table = k.table(&TableOptions::default().sort_by(SortBy::SelfCpu).row_limit(1));
        let body: Vec<&str> = table.lines().skip(3).take_while(|l| !l.starts_with("---")).collect();
        assert_eq!(body.len(), 1);
        assert!(body[0].contains("forward"));
        // Percentages still use all rows: forward's self time is 58.62 % of the total.
        assert!(body[0].contains("58.62%"), "{}", body[0]);
    }

    #[test]
    fn device_columns_are_named_after_the_devices_and_hidden_without_device_time() {
        use crate::event::{DeviceId, DeviceInterval};
        let interval = |device, range, start, end| DeviceInterval {
            name: "kernel".into(),
            device,
            queue: 0,
            start_ns: start,
            end_ns: end,
            launch_ns: start,
            range: Some(range),
            tid: 1,
        };
        let mut r = sample();
        assert!(!r.key_averages().table(&TableOptions::default()).contains("CUDA"));
        // 1 000 ns under matmul (inside forward), 250 ns directly under forward.
        r.device_intervals =
            vec![interval(DeviceId::cuda(0), 1, 1_500_000, 1_501_000), interval(DeviceId::cuda(0), 0, 6_000, 6_250)];
        let k = r.key_averages();
        assert_eq!(k.device_label(), "CUDA");
        let (fwd, mm) = (k.get("forward").unwrap(), k.get("matmul").unwrap());
        assert_eq!((fwd.self_device_ns, fwd.device_total_ns), (250, 1_250));
        assert_eq!((mm.self_device_ns, mm.device_total_ns), (1_000, 1_000));
        assert_eq!(mm.device_time_avg_ns(), 500.0, "two calls");
        let table = k.table(&TableOptions::default());
        let header = table.lines().nth(1).unwrap();
        let columns: Vec<&str> = header.split("  ").map(str::trim).filter(|c| !c.is_empty()).collect();
        assert_eq!(
            columns,
            [
                "Name",
                "Self CPU %",
                "Self CPU",
                "CPU total %",
                "CPU total",
                "CPU time avg",
                "Self CUDA",
                "Self CUDA %",
                "CUDA total",
                "CUDA time avg",
                "# of Calls"
            ]
        );
        let matmul_row = table.lines().find(|l| l.trim_start().starts_with("matmul")).unwrap();
        assert!(matmul_row.contains("80.00%"), "1000 of 1250 ns: {matmul_row}");
        assert!(table.ends_with("Self CUDA time total: 1.250us\n"), "{table}");

        r.device_intervals.push(interval(DeviceId::cpu(1), 3, 7_000_000, 7_000_100));
        let mixed = r.key_averages();
        assert_eq!(mixed.device_label(), "Device");
        assert!(mixed.table(&TableOptions::default()).contains("Self Device time total: 1.350us"));
    }

    #[test]
    fn long_names_are_truncated() {
        let mut r = sample();
        r.ranges[3].name = "a_really_long_operator_name_that_goes_on_and_on_and_on_forever".into();
        let table = r.key_averages().table(&TableOptions::default());
        assert!(table.contains("a_really_long_operator_name_that_goes_on_and_on_and_..."));
    }
}
