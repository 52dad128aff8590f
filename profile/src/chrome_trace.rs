//! Chrome / Perfetto trace export (the Trace Event Format, object form).
//!
//! Layout follows PyTorch's Kineto traces: `ts`/`dur` in microseconds with three
//! decimals relative to `baseTimeNanoseconds`; host ranges as complete events
//! (`ph:"X"`) on the host process, one track per thread; device work on one
//! process per device, one track per queue; `ph:"s"`/`ph:"f"` flow arrows from the
//! launching range to its device work; `[memory]` instants (with the block's
//! `Category`), `[memory retag]` instants for bytes that changed category, and
//! `ph:"C"` counters of allocated/reserved bytes per device. The JSON is written by hand (streamed,
//! fixed three-decimal timestamps) rather than built as a tree.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use crate::error::ProfileError;
use crate::event::DeviceId;
use crate::result::ProfileResult;

/// Device processes get pids from here up: above any Linux pid (`pid_max` ≤ 2^22),
/// inside i32 so every trace viewer accepts them.
const DEVICE_PID_BASE: u64 = 0x7FFF_0000;

impl ProfileResult {
    /// The trace as a JSON string (open it in `chrome://tracing` or ui.perfetto.dev).
    pub fn chrome_trace_json(&self) -> String {
        let mut out = Vec::new();
        // Writing into a Vec cannot fail.
        let _ = self.write_chrome_trace(&mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    /// Writes the trace to `path` (a `.json` file).
    pub fn export_chrome_trace(&self, path: impl AsRef<Path>) -> Result<(), ProfileError> {
        let mut file = BufWriter::new(File::create(path)?);
        self.write_chrome_trace(&mut file)?;
        file.flush()?;
        Ok(())
    }

    /// Streams the trace JSON into `out`.
    pub fn write_chrome_trace(&self, out: &mut impl Write) -> Result<(), ProfileError> {
        TraceWriter::new(self, out).write()
    }
}

/// Microseconds with exactly three decimals, from nanoseconds.
fn micros(ns: u64) -> String {
    format!("{}.{:03}", ns / 1_000, ns % 1_000)
}

fn json_string(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".to_owned())
}

struct TraceWriter<'a, W: Write> {
    result: &'a ProfileResult,
    out: &'a mut W,
    first: bool,
    host_pid: u64,
    device_pids: BTreeMap<DeviceId, u64>,
}

impl<'a, W: Write> TraceWriter<'a, W> {
    fn new(result: &'a ProfileResult, out: &'a mut W) -> Self {
        let devices: BTreeSet<DeviceId> = result
            .device_intervals
            .iter()
            .map(|d| d.device)
            .chain(result.memory.iter().map(|m| m.event.device))
            .collect();
        let device_pids = devices.into_iter().enumerate().map(|(i, d)| (d, DEVICE_PID_BASE + i as u64)).collect();
        Self { result, out, first: true, host_pid: u64::from(result.process_id), device_pids }
    }

    fn ts(&self, ns: u64) -> String {
        micros(ns.saturating_sub(self.result.start_ns))
    }

    fn event(&mut self, body: &str) -> Result<(), ProfileError> {
        let sep = if self.first { "\n" } else { ",\n" };
        self.first = false;
        write!(self.out, "{sep}{{{body}}}")?;
        Ok(())
    }

    fn metadata(&mut self, name: &str, pid: u64, tid: u64, args: &str) -> Result<(), ProfileError> {
        self.event(&format!(r#""name":"{name}","ph":"M","ts":0.000,"pid":{pid},"tid":{tid},"args":{{{args}}}"#))
    }

    fn write(mut self) -> Result<(), ProfileError> {
        let r = self.result;
        write!(
            self.out,
            r#"{{"schemaVersion":1,"displayTimeUnit":"ms","baseTimeNanoseconds":{},"traceName":"brasa-profile","#,
            r.base_unix_ns
        )?;
        if let Some(step) = r.step {
            write!(self.out, r#""profilerStep":{step},"#)?;
        }
        let warnings: Vec<String> = r.warnings.iter().map(|w| json_string(w)).collect();
        write!(self.out, r#""warnings":[{}],"traceEvents":["#, warnings.join(","))?;

        self.write_metadata()?;
        self.write_ranges()?;
        self.write_device_intervals()?;
        self.write_memory()?;
        write!(self.out, "\n]}}\n")?;
        Ok(())
    }

    fn write_metadata(&mut self) -> Result<(), ProfileError> {
        let host = self.host_pid;
        self.metadata("process_name", host, 0, r#""name":"host""#)?;
        self.metadata("process_labels", host, 0, r#""labels":"CPU""#)?;
        self.metadata("process_sort_index", host, 0, r#""sort_index":0"#)?;
        let mut tids: BTreeSet<u64> = self.result.threads.iter().map(|t| t.tid).collect();
        tids.extend(self.result.ranges.iter().map(|r| r.tid));
        tids.extend(self.result.memory.iter().map(|m| m.tid));
        for tid in tids {
            let name = json_string(&self.result.thread_name(tid));
            self.metadata("thread_name", host, tid, &format!(r#""name":{name}"#))?;
            self.metadata("thread_sort_index", host, tid, &format!(r#""sort_index":{tid}"#))?;
        }
        let devices: Vec<(DeviceId, u64)> = self.device_pids.iter().map(|(d, p)| (*d, *p)).collect();
        for (rank, (device, pid)) in devices.into_iter().enumerate() {
            self.metadata("process_name", pid, 0, &format!(r#""name":"{device}""#))?;
            self.metadata("process_sort_index", pid, 0, &format!(r#""sort_index":{}"#, rank + 1))?;
            let queues: BTreeSet<u32> =
                self.result.device_intervals.iter().filter(|d| d.device == device).map(|d| d.queue).collect();
            // PyTorch's traces call a CUDA device's tracks `stream N`.
            let track = if device.kind == "cuda" { "stream" } else { "queue" };
            for queue in queues {
                self.metadata("thread_name", pid, u64::from(queue), &format!(r#""name":"{track} {queue}""#))?;
                self.metadata("thread_sort_index", pid, u64::from(queue), &format!(r#""sort_index":{queue}"#))?;
            }
        }
        Ok(())
    }

    fn write_ranges(&mut self) -> Result<(), ProfileError> {
        let r = self.result;
        for (index, range) in r.ranges.iter().enumerate() {
            let mut args = format!(r#""External id":{}"#, index + 1);
            if let Some(shapes) = &range.input_shapes {
                args.push_str(&format!(r#","Input Shapes":{}"#, shapes_json(shapes)));
            }
            if range.truncated {
                args.push_str(r#","truncated":true"#);
            }
            self.event(&format!(
                r#""name":{},"cat":"{}","ph":"X","ts":{},"dur":{},"pid":{},"tid":{},"args":{{{}}}"#,
                json_string(&range.name),
                range.kind.category(),
                self.ts(range.start_ns),
                micros(range.duration_ns()),
                self.host_pid,
                range.tid,
                args
            ))?;
        }
        Ok(())
    }

    fn write_device_intervals(&mut self) -> Result<(), ProfileError> {
        let r = self.result;
        for (index, interval) in r.device_intervals.iter().enumerate() {
            let Some(&pid) = self.device_pids.get(&interval.device) else {
                continue;
            };
            let correlation = index + 1;
            let launched_by = interval.range.filter(|&i| i < r.ranges.len());
            let external = launched_by.map_or(String::new(), |i| format!(r#","External id":{}"#, i + 1));
            self.event(&format!(
                r#""name":{},"cat":"{}","ph":"X","ts":{},"dur":{},"pid":{pid},"tid":{},"args":{{"device":"{}","queue":{},"correlation":{correlation}{external}}}"#,
                json_string(&interval.name),
                device_category(&interval.name),
                self.ts(interval.start_ns),
                micros(interval.duration_ns()),
                interval.queue,
                interval.device,
                interval.queue,
            ))?;
            if launched_by.is_some() {
                // The arrow starts inside the launching range (at the launch) and
                // binds to the enclosing device slice at its start.
                self.event(&format!(
                    r#""name":"ac2g","cat":"ac2g","ph":"s","id":{correlation},"ts":{},"pid":{},"tid":{}"#,
                    self.ts(interval.launch_ns),
                    self.host_pid,
                    interval.tid
                ))?;
                self.event(&format!(
                    r#""name":"ac2g","cat":"ac2g","ph":"f","bp":"e","id":{correlation},"ts":{},"pid":{pid},"tid":{}"#,
                    self.ts(interval.start_ns),
                    interval.queue
                ))?;
            }
        }
        Ok(())
    }

    fn write_memory(&mut self) -> Result<(), ProfileError> {
        let r = self.result;
        for record in &r.memory {
            let e = &record.event;
            let op = record
                .range
                .and_then(|i| r.ranges.get(i))
                .map_or(String::new(), |range| format!(r#","Op":{}"#, json_string(&range.name)));
            if let Some(retag) = e.retag {
                // Not a PyTorch event (its tools read `[memory]` as an
                // allocation); the totals, and so the counters, are unchanged.
                self.event(&format!(
                    r#""name":"[memory retag]","cat":"cpu_instant_event","ph":"i","s":"t","ts":{},"pid":{},"tid":{},"args":{{"Device Type":"{}","Device Id":{},"Addr":{},"Bytes":{},"From":{},"To":{}{op}}}"#,
                    self.ts(record.time_ns),
                    self.host_pid,
                    record.tid,
                    e.device.kind,
                    e.device.index,
                    e.addr,
                    retag.bytes,
                    json_string(retag.from),
                    json_string(e.category),
                ))?;
                continue;
            }
            self.event(&format!(
                r#""name":"[memory]","cat":"cpu_instant_event","ph":"i","s":"t","ts":{},"pid":{},"tid":{},"args":{{"Device Type":"{}","Device Id":{},"Addr":{},"Bytes":{},"Total Allocated":{},"Total Reserved":{},"Category":{}{op}}}"#,
                self.ts(record.time_ns),
                self.host_pid,
                record.tid,
                e.device.kind,
                e.device.index,
                e.addr,
                e.bytes,
                e.total_allocated,
                e.total_reserved,
                json_string(e.category),
            ))?;
            if let Some(&pid) = self.device_pids.get(&e.device) {
                self.event(&format!(
                    r#""name":"Memory {}","ph":"C","ts":{},"pid":{pid},"tid":0,"args":{{"allocated":{},"reserved":{}}}"#,
                    e.device,
                    self.ts(record.time_ns),
                    e.total_allocated,
                    e.total_reserved
                ))?;
            }
        }
        Ok(())
    }
}

/// The trace category of device work, as Kineto names it: copies and fills
/// go by PyTorch's names (`Memcpy HtoD (Pinned -> Device)`, `Memset (Device)`),
/// everything else is a kernel.
fn device_category(name: &str) -> &'static str {
    if name.starts_with("Memcpy ") {
        "gpu_memcpy"
    } else if name.starts_with("Memset ") {
        "gpu_memset"
    } else {
        "kernel"
    }
}

fn shapes_json(shapes: &[Vec<usize>]) -> String {
    let inner: Vec<String> = shapes
        .iter()
        .map(|s| {
            let dims: Vec<String> = s.iter().map(usize::to_string).collect();
            format!("[{}]", dims.join(","))
        })
        .collect();
    format!("[{}]", inner.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micros_have_three_decimals() {
        assert_eq!(micros(0), "0.000");
        assert_eq!(micros(1), "0.001");
        assert_eq!(micros(1_234_567), "1234.567");
    }

    #[test]
    fn empty_result_is_valid_json() {
        let json = ProfileResult::default().chrome_trace_json();
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["displayTimeUnit"], "ms");
        assert!(value["traceEvents"].is_array());
    }

    #[test]
    fn shapes_json_is_nested_arrays() {
        assert_eq!(shapes_json(&[vec![2, 3], vec![]]), "[[2,3],[]]");
    }
}
