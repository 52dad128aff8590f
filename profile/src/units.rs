//! How times and sizes are printed.

/// A duration in microseconds the way PyTorch's tables print it: `138.447us`,
/// `11.434ms`, `2.500s`.
pub fn format_time_us(us: f64) -> String {
    if us >= 1_000_000.0 {
        format!("{:.3}s", us / 1_000_000.0)
    } else if us >= 1_000.0 {
        format!("{:.3}ms", us / 1_000.0)
    } else {
        format!("{us:.3}us")
    }
}

/// A duration in nanoseconds, printed like [`format_time_us`].
pub fn format_time_ns(ns: u64) -> String {
    format_time_us(ns as f64 / 1_000.0)
}

/// A byte count the way PyTorch's tables print it: `512 b`, `1.50 Kb`, `2.00 Mb`,
/// `1.25 Gb` (powers of 1024; negative for net frees).
pub fn format_memory(bytes: i64) -> String {
    const KB: f64 = 1024.0;
    const MB: f64 = KB * 1024.0;
    const GB: f64 = MB * 1024.0;
    let b = bytes as f64;
    if b.abs() >= GB {
        format!("{:.2} Gb", b / GB)
    } else if b.abs() >= MB {
        format!("{:.2} Mb", b / MB)
    } else if b.abs() >= KB {
        format!("{:.2} Kb", b / KB)
    } else {
        format!("{bytes} b")
    }
}

/// A byte count with binary units for people: `512 B`, `1.50 KiB`, `96.00 MiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

/// `part / whole` as `12.34%`, or `NaN` when `whole` is zero (as PyTorch prints it).
pub fn format_percent(part: f64, whole: f64) -> String {
    if whole == 0.0 {
        "NaN".to_owned()
    } else {
        format!("{:.2}%", part * 100.0 / whole)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_like_pytorch() {
        assert_eq!(format_time_us(138.447), "138.447us");
        assert_eq!(format_time_us(11_434.0), "11.434ms");
        assert_eq!(format_time_us(2_500_000.0), "2.500s");
        assert_eq!(format_time_ns(1_500), "1.500us");
        assert_eq!(format_time_ns(0), "0.000us");
    }

    #[test]
    fn memory_prints_like_pytorch() {
        assert_eq!(format_memory(512), "512 b");
        assert_eq!(format_memory(1536), "1.50 Kb");
        assert_eq!(format_memory(-2 * 1024 * 1024), "-2.00 Mb");
        assert_eq!(format_memory(3 << 30), "3.00 Gb");
        assert_eq!(format_bytes(100), "100 B");
        assert_eq!(format_bytes(96 << 20), "96.00 MiB");
        assert_eq!(format_percent(1.0, 4.0), "25.00%");
        assert_eq!(format_percent(0.0, 0.0), "NaN");
    }
}
