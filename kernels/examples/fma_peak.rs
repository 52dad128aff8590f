//! Prints this machine's f32 FMA peak, measured five times.
//!
//! ```text
//! cargo run --release -p brasa-kernels --example fma_peak
//! ```

use brasa_kernels::peak::fma_peak_gflops;
use std::time::Duration;

fn main() {
    let threads = rayon::current_num_threads();
    let mut runs: Vec<f64> = (0..5).map(|_| fma_peak_gflops(Duration::from_millis(500))).collect();
    println!("runs: {runs:.1?}");
    runs.sort_by(|a, b| a.total_cmp(b));
    println!("f32 FMA peak, {threads} threads: median {:.1} GFLOP/s", runs[2]);
}
