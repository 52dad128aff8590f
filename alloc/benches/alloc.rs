//! Criterion micro-benchmarks of the caching allocator's hot path, against the
//! host backend it sits on.

// Benchmark code: a failed unwrap aborts the benchmark with its message.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_alloc::{Backend, CachingAllocator, HostBackend, StreamId};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::hint::black_box;

fn cached_pairs(c: &mut Criterion) {
    let mut group = c.benchmark_group("cached_pair");
    let alloc = CachingAllocator::new(HostBackend::new());
    for size in [512usize, 64 << 10, 3 << 20, 12 << 20] {
        drop(alloc.allocate(size, StreamId::DEFAULT));
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter(|| black_box(alloc.allocate(size, StreamId::DEFAULT).ok()))
        });
    }
    group.finish();
}

fn host_backend_pairs(c: &mut Criterion) {
    let mut group = c.benchmark_group("host_backend_pair");
    let backend = HostBackend::new();
    for size in [512usize, 64 << 10, 3 << 20, 12 << 20] {
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter(|| {
                let addr = backend.allocate(size).unwrap();
                // SAFETY: allocated just above with this size.
                unsafe { backend.free(black_box(addr), size) };
            })
        });
    }
    group.finish();
}

criterion_group!(benches, cached_pairs, host_backend_pairs);
criterion_main!(benches);
