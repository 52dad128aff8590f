//! Elementwise speed: the `tensor.*` figures of `brasa-bench` (the same
//! code, compiled from `bench/src/tensor_elementwise_figures.rs`), and with
//! `--thresholds` the measurement behind the parallel thresholds of the
//! elementwise ops.
//!
//! ```text
//! cargo run --release -p brasa-tensor --example elementwise_speed [-- --quick] [--filter PREFIX] [--thresholds]
//! ```

use rayon::prelude::*;
use std::hint::black_box;

/// The part of `brasa-bench`'s `measure` module the figures use.
mod measure {
    use std::time::Instant;

    pub struct Options {
        pub quick: bool,
        pub filter: String,
    }

    impl Options {
        pub fn reps(&self, full: usize, quick: usize) -> usize {
            if self.quick {
                quick
            } else {
                full
            }
        }

        pub fn wants(&self, name: &str) -> bool {
            name.starts_with(&self.filter) || self.filter.starts_with(name)
        }
    }

    pub enum Better {
        Higher,
        Lower,
    }

    pub struct Figure;

    impl Figure {
        pub fn new(name: &'static str, value: f64, unit: &'static str, better: Better) -> Self {
            let better = match better {
                Better::Higher => "higher is better",
                Better::Lower => "lower is better",
            };
            println!("{name:<26} {value:>10.3} {unit:<5} ({better})");
            Figure
        }
    }

    pub fn time(f: impl FnOnce()) -> f64 {
        let start = Instant::now();
        f();
        start.elapsed().as_secs_f64()
    }

    pub fn median(samples: &mut [f64]) -> f64 {
        samples.sort_by(f64::total_cmp);
        samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN)
    }
}

#[path = "../../bench/src/tensor_elementwise_figures.rs"]
mod tensor_elementwise_figures;

/// Median seconds of `f` over enough calls to last ~20 ms per sample.
fn seconds_per_call(mut f: impl FnMut()) -> f64 {
    let calls = (1..).map(|k| 1usize << k).find(|&n| measure::time(|| (0..n).for_each(|_| f())) > 2e-3).unwrap_or(1);
    let mut samples: Vec<f64> = (0..9).map(|_| measure::time(|| (0..calls).for_each(|_| f())) / calls as f64).collect();
    measure::median(&mut samples)
}

/// One thread against rayon chunks (as the elementwise driver splits work)
/// for a cheap op (add) and an expensive one (exp), by size: the smallest
/// size where the parallel loop wins is the threshold.
fn thresholds() {
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

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--thresholds") {
        thresholds();
        return;
    }
    let filter = args.iter().position(|a| a == "--filter").and_then(|i| args.get(i + 1)).cloned().unwrap_or_default();
    let options = measure::Options { quick: args.iter().any(|a| a == "--quick"), filter };
    tensor_elementwise_figures::run(&options);
}
