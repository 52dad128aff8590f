//! `alloc.*`: the caching allocator against the host backend it sits on.

use crate::measure::{median, time, try_time, BenchResult, Better, Figure, Options, Xorshift};
use brasa_alloc::{Allocation, AllocatorConfig, Backend, CachingAllocator, HostBackend, StreamId};
use std::hint::black_box;

const S0: StreamId = StreamId::DEFAULT;
const TRACE: &str = include_str!("../data/gpt2_block_step.trace");

pub fn run(options: &Options) -> BenchResult<Vec<Figure>> {
    let mut figures = Vec::new();
    if options.wants("alloc.cached_pair_ns") {
        figures.push(cached_pair_ns(options));
    }
    if options.wants("alloc.speedup_vs_system") {
        figures.push(speedup_vs_system(options));
    }
    if options.wants("alloc.trace_speedup") {
        figures.push(trace_speedup(options)?);
    }
    if options.wants("alloc.trace_fragmentation") {
        figures.push(trace_fragmentation("alloc.trace_fragmentation", AllocatorConfig::default())?);
    }
    if options.wants("alloc.trace_fragmentation_expandable") {
        let config = AllocatorConfig { expandable_segments: true, ..AllocatorConfig::default() };
        figures.push(trace_fragmentation("alloc.trace_fragmentation_expandable", config)?);
    }
    Ok(figures)
}

/// Median ns of one allocate + free served from the cache, over sizes in both pools.
fn cached_pair_ns(options: &Options) -> Figure {
    let alloc = CachingAllocator::new(HostBackend::new());
    let sizes = [512usize, 4096, 64 << 10, 1 << 20, 3 << 20, 12 << 20];
    for size in sizes {
        drop(alloc.allocate(size, S0));
    }
    let pairs = options.reps(200_000, 20_000);
    let mut samples: Vec<f64> = (0..options.reps(21, 5))
        .map(|_| {
            let seconds = time(|| {
                for i in 0..pairs {
                    let block = alloc.allocate(sizes[i % sizes.len()], S0);
                    black_box(&block);
                }
            });
            seconds * 1e9 / pairs as f64
        })
        .collect();
    Figure::new("alloc.cached_pair_ns", median(&mut samples), "ns", Better::Lower)
}

/// Sizes log-uniform from 512 B to 64 MiB, fixed seed.
pub(crate) fn mixed_sizes(count: usize) -> Vec<usize> {
    let mut rng = Xorshift(0x5EED_0A11_0C00_0001);
    let (low, high) = ((512f64).ln(), ((64u64 << 20) as f64).ln());
    (0..count).map(|_| (low + (high - low) * rng.next_f64()).exp() as usize).collect()
}

/// Total time of a mixed sequence of pairs straight on the host backend
/// divided by the time on the (warm) caching allocator; interleaved runs.
fn speedup_vs_system(options: &Options) -> Figure {
    let sizes = mixed_sizes(2_000);
    let backend = HostBackend::new();
    let alloc = CachingAllocator::new(HostBackend::new());
    let run_cached = || {
        for &size in &sizes {
            black_box(alloc.allocate(size, S0).ok());
        }
    };
    run_cached();
    let mut ratios = Vec::new();
    for _ in 0..options.reps(9, 3) {
        let cached = time(run_cached);
        let system = time(|| {
            for &size in &sizes {
                if let Ok(addr) = backend.allocate(size) {
                    black_box(addr);
                    // SAFETY: allocated just above with this size.
                    unsafe { backend.free(addr, size) };
                }
            }
        });
        ratios.push(system / cached);
    }
    Figure::new("alloc.speedup_vs_system", median(&mut ratios), "x", Better::Higher)
}

enum TraceOp {
    Alloc { id: usize, bytes: usize },
    Free { id: usize },
}

/// The events of the committed trace, or which line is malformed.
fn parse_trace() -> BenchResult<Vec<TraceOp>> {
    TRACE
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.starts_with('#') && !line.trim().is_empty())
        .map(|(index, line)| {
            let malformed = |what: &str| format!("gpt2_block_step.trace line {}: {what} in {line:?}", index + 1);
            let mut fields = line.split_whitespace();
            let kind = fields.next();
            let id: usize = fields.next().and_then(|f| f.parse().ok()).ok_or_else(|| malformed("no id"))?;
            Ok(match kind {
                Some("a") => TraceOp::Alloc {
                    id,
                    bytes: fields.next().and_then(|f| f.parse().ok()).ok_or_else(|| malformed("no size"))?,
                },
                _ => TraceOp::Free { id },
            })
        })
        .collect()
}

/// Replays the trace with `allocate`/`release`, writing every allocation once;
/// stops at the first failed allocation or an id the trace never allocated.
fn replay<H>(
    trace: &[TraceOp],
    mut allocate: impl FnMut(usize) -> BenchResult<(usize, H)>,
    mut release: impl FnMut(H),
) -> BenchResult<()> {
    let slots = trace.iter().filter(|op| matches!(op, TraceOp::Alloc { .. })).count();
    let mut live: Vec<Option<H>> = (0..slots).map(|_| None).collect();
    for op in trace {
        let id = match *op {
            TraceOp::Alloc { id, .. } | TraceOp::Free { id } => id,
        };
        let slot = live.get_mut(id).ok_or_else(|| format!("trace id {id} out of range (0..{slots})"))?;
        match *op {
            TraceOp::Alloc { bytes, .. } => {
                let (addr, handle) = allocate(bytes)?;
                // SAFETY: `addr` points at `bytes` writable bytes owned by `handle`.
                unsafe { std::ptr::write_bytes(addr as *mut u8, 1, bytes) };
                *slot = Some(handle);
            }
            TraceOp::Free { .. } => {
                if let Some(handle) = slot.take() {
                    release(handle);
                }
            }
        }
    }
    Ok(())
}

fn replay_cached(trace: &[TraceOp], alloc: &CachingAllocator<HostBackend>) -> BenchResult<()> {
    replay(
        trace,
        |bytes| {
            let block: Allocation<HostBackend> = alloc.allocate(bytes, S0)?;
            Ok((block.addr(), block))
        },
        drop,
    )
}

/// One training step's trace: time straight on the host backend divided by
/// time on the caching allocator in steady state (the cache persists across
/// steps as it does in training); interleaved runs, median of ratios.
fn trace_speedup(options: &Options) -> BenchResult<Figure> {
    let trace = parse_trace()?;
    let backend = HostBackend::new();
    let alloc = CachingAllocator::new(HostBackend::new());
    replay_cached(&trace, &alloc)?;
    let mut ratios = Vec::new();
    for _ in 0..options.reps(5, 2) {
        let cached = try_time(|| replay_cached(&trace, &alloc))?;
        let system = try_time(|| {
            replay(
                &trace,
                |bytes| {
                    let addr = backend.allocate(bytes)?;
                    Ok((addr, (addr, bytes)))
                },
                // SAFETY: each handle is an allocation of this backend, freed once.
                |(addr, bytes)| unsafe { backend.free(addr, bytes) },
            )
        })?;
        ratios.push(system / cached);
    }
    Ok(Figure::new("alloc.trace_speedup", median(&mut ratios), "x", Better::Higher))
}

/// Peak reserved / peak allocated over three steps of the trace, under `config`.
fn trace_fragmentation(name: &'static str, config: AllocatorConfig) -> BenchResult<Figure> {
    let trace = parse_trace()?;
    let alloc = CachingAllocator::with_config(HostBackend::new(), config);
    for _ in 0..3 {
        replay_cached(&trace, &alloc)?;
    }
    let stats = alloc.stats();
    let ratio = stats.reserved_bytes.all.peak as f64 / stats.allocated_bytes.all.peak as f64;
    eprintln!(
        "    peak allocated {:.1} MiB, peak reserved {:.1} MiB",
        stats.allocated_bytes.all.peak as f64 / (1 << 20) as f64,
        stats.reserved_bytes.all.peak as f64 / (1 << 20) as f64
    );
    Ok(Figure::new(name, ratio, "ratio", Better::Lower))
}
