//! The measurement behind the parallel thresholds of the elementwise ops
//! (`Cost::parallel_threshold` in `src/ops/elementwise.rs`): one thread
//! against rayon chunks, by size. The `tensor.*` speed figures are
//! `brasa-bench`'s (`cargo run --release -p brasa-bench -- --filter tensor.`).
//!
//! ```text
//! cargo run --release -p brasa-tensor --example elementwise_speed [-- --thresholds]
//! ```

use rayon::prelude::*;
use std::hint::black_box;
use std::time::Instant;

/// Median seconds of `f` over enough calls to last ~2 ms per sample.
fn seconds_per_call(mut f: impl FnMut()) -> f64 {
    let mut run = |calls: usize| {
        let start = Instant::now();
        (0..calls).for_each(|_| f());
        start.elapsed().as_secs_f64() / calls as f64
    };
    let calls = (1..).map(|k| 1usize << k).find(|&n| run(n) * n as f64 > 2e-3).unwrap_or(1);
    let mut samples: Vec<f64> = (0..9).map(|_| run(calls)).collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// One thread against rayon chunks (as the elementwise driver splits work)
/// for a cheap op (add) and an expensive one (exp), by size: the smallest
/// size where the parallel loop wins is the threshold.
fn main() {
    let threads = rayon::current_num_threads();
    println!("{threads} threads; microseconds per call");
    println!("{:>9} {:>10} {:>10} {:>10} {:>10}", "elements", "add 1 thr", "add par", "exp 1 thr", "exp par");
    for shift in 9..=20 {
        let n = 1usize << shift;
        let a: Vec<f32> = (0..n).map(|i| (i % 97) as f32 * 0.01).collect();
        let b = a.clone();
        let mut out = vec![0.0f32; n];
        let chunk = n.div_ceil(threads * 4).max(64);
        let add_seq = seconds_per_call(|| {
            for ((o, x), y) in out.iter_mut().zip(&a).zip(&b) {
                *o = x + y;
            }
            black_box(&mut out);
        });
        let add_par = seconds_per_call(|| {
            out.par_chunks_mut(chunk).zip(a.par_chunks(chunk)).zip(b.par_chunks(chunk)).for_each(|((o, x), y)| {
                for ((o, x), y) in o.iter_mut().zip(x).zip(y) {
                    *o = x + y;
                }
            });
            black_box(&mut out);
        });
        let exp_seq = seconds_per_call(|| {
            out.iter_mut().zip(&a).for_each(|(o, x)| *o = x.exp());
            black_box(&mut out);
        });
        let exp_par = seconds_per_call(|| {
            out.par_chunks_mut(chunk).zip(a.par_chunks(chunk)).for_each(|(o, x)| {
                o.iter_mut().zip(x).for_each(|(o, x)| *o = x.exp());
            });
            black_box(&mut out);
        });
        let us = |s: f64| s * 1e6;
        println!("{n:>9} {:>10.2} {:>10.2} {:>10.2} {:>10.2}", us(add_seq), us(add_par), us(exp_seq), us(exp_par));
    }
}
