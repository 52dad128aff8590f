//! `cargo xtask bench`: builds and runs `brasa-bench` in release mode, collects
//! the figures it prints (one JSON object per line), writes
//! `target/bench/results.json` and prints them as a table.

use crate::workspace_root;
use serde_json::{json, Value};
use std::process::{Command, Stdio};

pub fn run(args: &[String]) -> Result<(), String> {
    let mut filter = String::new();
    let mut quick = false;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--filter" => filter = iter.next().ok_or("--filter needs a prefix, e.g. --filter alloc")?.clone(),
            other => {
                return Err(format!("unknown bench option `{other}` (expected --filter PREFIX[,PREFIX…], --quick)"))
            }
        }
    }
    let root = workspace_root();
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    command
        .current_dir(&root)
        .args(["run", "--quiet", "--release", "-p", "brasa-bench", "--"])
        .args(["--filter", &filter])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if quick {
        command.arg("--quick");
    }
    let output = command.output().map_err(|e| format!("running brasa-bench: {e}"))?;
    if !output.status.success() {
        return Err(format!("brasa-bench failed with {}", output.status));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let results: Vec<Value> = stdout
        .lines()
        .filter(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).map_err(|e| format!("bad figure line `{line}`: {e}")))
        .collect::<Result<_, _>>()?;
    if results.is_empty() {
        return Err(format!("no figure matched the filter `{filter}`"));
    }
    let report = json!({
        "date": utc_now(),
        "machine": { "cpu": cpu_model(), "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) },
        "quick": quick,
        "results": results,
    });
    let dir = root.join("target/bench");
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let path = dir.join("results.json");
    let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    print_table(&results);
    println!("\nwrote {}", path.display());
    Ok(())
}

fn print_table(results: &[Value]) {
    let name_width = results.iter().filter_map(|r| r["name"].as_str()).map(str::len).max().unwrap_or(4).max(6);
    println!("{:<name_width$}  {:>14}  {:<8}  better", "figure", "value", "unit");
    println!("{}", "-".repeat(name_width + 34));
    for result in results {
        let value = result["value"].as_f64().unwrap_or(f64::NAN);
        let shown = if value.abs() >= 100.0 { format!("{value:.1}") } else { format!("{value:.3}") };
        println!(
            "{:<name_width$}  {:>14}  {:<8}  {}",
            result["name"].as_str().unwrap_or("?"),
            shown,
            result["unit"].as_str().unwrap_or(""),
            result["better"].as_str().unwrap_or("")
        );
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`, without a date crate.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    #[test]
    fn date_is_formatted() {
        let now = super::utc_now();
        assert_eq!(now.len(), 20);
        assert!(now.starts_with("20") && now.ends_with('Z'));
    }
}
