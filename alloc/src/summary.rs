//! The statistics as a text table, laid out like `torch.cuda.memory_summary()`.
//!
//! Beyond PyTorch's rows, allocated memory is broken down by
//! [`MemoryCategory`] ("Allocated by category") once anything was allocated
//! as a category other than `other`: one row per category that held bytes
//! since the last `reset_accumulated` (or holds some now).

use crate::category::MemoryCategory;
use crate::error::format_size;
use crate::stats::{MemoryStats, Stat, StatArray};
use std::fmt::Write;

const WIDTH: usize = 75;

/// Formats `stats` as PyTorch's 75-column table. With `abbreviated`, only the
/// `all` row of each group is shown (and no category rows).
pub fn memory_summary(device: &str, stats: &MemoryStats, abbreviated: bool) -> String {
    let mut lines = vec![
        "=".repeat(WIDTH),
        centre(&format!("brasa memory summary, device {device}")),
        "-".repeat(WIDTH),
        centre(&format!("OOMs: {:<12} | allocation retries: {:<8}", stats.num_ooms, stats.num_alloc_retries)),
    ];
    if stats.quarantined_blocks > 0 {
        lines.push(centre(&format!(
            "QUARANTINED (streams could not be waited for): {} blocks, {}",
            stats.quarantined_blocks,
            format_size(stats.quarantined_bytes as usize)
        )));
    }
    lines.extend([
        "=".repeat(WIDTH),
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_string(),
    ]);
    let byte_groups: [(&StatArray, &str); 5] = [
        (&stats.allocated_bytes, "Allocated memory"),
        (&stats.active_bytes, "Active memory"),
        (&stats.requested_bytes, "Requested memory"),
        (&stats.reserved_bytes, "Device reserved memory"),
        (&stats.inactive_split_bytes, "Non-releasable memory"),
    ];
    let count_groups: [(&StatArray, &str); 4] = [
        (&stats.allocation, "Allocations"),
        (&stats.active, "Active allocs"),
        (&stats.segment, "Device reserved segments"),
        (&stats.inactive_split, "Non-releasable allocs"),
    ];
    for (array, name) in byte_groups {
        group_rows(&mut lines, array, name, abbreviated, format_bytes);
        if name == "Allocated memory" && !abbreviated {
            category_rows(&mut lines, stats);
        }
    }
    for (array, name) in count_groups {
        group_rows(&mut lines, array, name, abbreviated, format_count);
    }
    for (stat, name) in
        [(&stats.oversize_allocations, "Oversize allocations"), (&stats.oversize_segments, "Oversize segments")]
    {
        lines.push("-".repeat(WIDTH));
        lines.push(row(name, stat, stat, format_count));
    }
    lines.push("=".repeat(WIDTH));
    let mut out = String::new();
    for line in lines {
        let _ = writeln!(out, "|{line}|");
    }
    out
}

/// Allocated bytes per category, in units chosen from all allocated bytes;
/// nothing while every byte was `other` (the rows would repeat the total).
fn category_rows(lines: &mut Vec<String>, stats: &MemoryStats) {
    let categories = &stats.by_category;
    let tagged = MemoryCategory::ALL.into_iter().any(|c| c != MemoryCategory::Other && categories.was_used(c));
    if !tagged {
        return;
    }
    let blank = " ".repeat(10);
    lines.push("-".repeat(WIDTH));
    lines.push(format!(" {:<22}| {blank} | {blank} | {blank} | {blank} ", "Allocated by category"));
    for (category, stat) in categories.iter().filter(|(c, _)| categories.was_used(*c)) {
        let name = format!("      {category}");
        lines.push(row(&name, stat, &stats.allocated_bytes.all, format_bytes));
    }
}

fn centre(text: &str) -> String {
    format!("{text:^WIDTH$}")
}

fn group_rows(
    lines: &mut Vec<String>,
    array: &StatArray,
    name: &str,
    abbreviated: bool,
    formatter: fn(i64, i64) -> String,
) {
    lines.push("-".repeat(WIDTH));
    lines.push(row(name, &array.all, &array.all, formatter));
    if !abbreviated {
        lines.push(row("      from large pool", &array.large_pool, &array.all, formatter));
        lines.push(row("      from small pool", &array.small_pool, &array.all, formatter));
    }
}

/// One row; the unit is chosen from the group's `all` stat so rows line up.
fn row(name: &str, stat: &Stat, reference: &Stat, formatter: fn(i64, i64) -> String) -> String {
    let name: String = name.chars().take(22).collect();
    format!(
        " {:<22}| {} | {} | {} | {} ",
        name,
        formatter(stat.current, reference.current),
        formatter(stat.peak, reference.peak),
        formatter(stat.allocated as i64, reference.allocated as i64),
        formatter(stat.freed as i64, reference.freed as i64),
    )
}

/// Integer sizes stepping up a unit while the reference value is ≥ 768 of it.
fn format_bytes(value: i64, reference: i64) -> String {
    const UNITS: [&str; 6] = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let (mut value, mut reference, mut unit) = (value, reference as f64, 0);
    while unit + 1 < UNITS.len() && reference >= 768.0 * 1024.0 {
        value /= 1024;
        reference /= 1024.0;
        unit += 1;
    }
    format!("{value:>6} {}", UNITS[unit])
}

/// Counts switching to K and M at 750,000.
fn format_count(value: i64, reference: i64) -> String {
    const UNITS: [&str; 3] = [" ", "K", "M"];
    let (mut value, mut reference, mut unit) = (value, reference as f64, 0);
    while unit + 1 < UNITS.len() && reference >= 750_000.0 {
        value /= 1000;
        reference /= 1000.0;
        unit += 1;
    }
    format!("{value:>7} {} ", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_step_up_at_768_kib() {
        assert_eq!(format_bytes(1000, 1000), "  1000 B  ");
        assert_eq!(format_bytes(800 * 1024, 800 * 1024), "   800 KiB");
        assert_eq!(format_bytes(3 << 20, 3 << 20), "  3072 KiB");
        assert_eq!(format_bytes(800 << 20, 800 << 20), "   800 MiB");
    }

    #[test]
    fn counts_switch_at_750_thousand() {
        assert_eq!(format_count(12, 12), "     12   ");
        assert_eq!(format_count(800_000, 800_000), "    800 K ");
    }

    #[test]
    fn table_is_75_columns_inside_its_borders() {
        let text = memory_summary("cpu:0", &MemoryStats::default(), false);
        for line in text.lines() {
            assert_eq!(line.chars().count(), WIDTH + 2, "{line:?}");
        }
        assert!(text.contains("Allocated memory"));
        assert!(text.contains("from small pool"));
        assert!(text.contains("Non-releasable allocs"));
        assert!(!text.contains("by category"), "no category rows while nothing was tagged");
    }

    #[test]
    fn used_categories_get_rows() {
        let mut stats = MemoryStats::default();
        stats.allocated_bytes.increase(crate::PoolKind::Large, 3 << 20);
        stats.by_category.increase(MemoryCategory::OptimizerState, 2 << 20);
        stats.by_category.increase(MemoryCategory::Other, 1 << 20);
        let text = memory_summary("cpu:0", &stats, false);
        for line in text.lines() {
            assert_eq!(line.chars().count(), WIDTH + 2, "{line:?}");
        }
        assert!(text.contains("Allocated by category"));
        let optimizer = text.lines().find(|l| l.contains("optimizer_state")).unwrap();
        assert!(optimizer.contains("2048 KiB"), "{optimizer}");
        assert!(text.lines().any(|l| l.contains("      other ")));
        assert!(!text.contains("parameter"), "unused categories have no row");
        assert!(!memory_summary("cpu:0", &stats, true).contains("by category"));
    }
}
