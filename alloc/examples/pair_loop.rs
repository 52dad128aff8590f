//! Allocates and frees in a loop, for profiling the hot path
//! (`perf record cargo run --release -p brasa-alloc --example pair_loop`).

use brasa_alloc::{CachingAllocator, HostBackend, StreamId};
use std::hint::black_box;

fn main() {
    let alloc = CachingAllocator::new(HostBackend::new());
    let sizes = [512usize, 4096, 64 << 10, 1 << 20, 3 << 20, 12 << 20];
    let start = std::time::Instant::now();
    let pairs = 20_000_000;
    for i in 0..pairs {
        black_box(alloc.allocate(sizes[i % sizes.len()], StreamId::DEFAULT).ok());
    }
    println!("{:.1} ns per pair", start.elapsed().as_nanos() as f64 / pairs as f64);
}
