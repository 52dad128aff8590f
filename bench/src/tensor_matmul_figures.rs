//! `tensor.matmul_*`, `tensor.conv2d_*` and `kernels.fma_peak_gflops`: matrix
//! products and convolutions through `Tensor` ops, against this machine's
//! FMA peak.
//!
//! - `kernels.fma_peak_gflops`: the f32 FMA peak on all threads.
//! - `tensor.matmul_f32_1024_gflops`: `Tensor::matmul` of two 1024x1024 f32
//!   matrices, median of several runs; `tensor.matmul_vs_peak` is its ratio
//!   to the peak measured in the same run.
//! - `tensor.matmul_mlp_gflops`: the three products of a 784 -> 512 linear
//!   layer on a batch of 128 (forward `x · Wᵀ`, and backward `gᵀ · x` and
//!   `g · W` on transposed views), combined.
//! - `tensor.conv2d_gflops`: a 3x3 convolution, padding 1, of a
//!   64x32x28x28 input to 64 channels (`2·N·C_out·H·W·C_in·9` flops);
//!   `tensor.conv2d_vs_matmul` is its ratio to the 1024³ product's rate.

use crate::measure::{median, time, Better, Figure, Options};
use brasa_tensor::{Conv2dParams, DType, Tensor};
use std::hint::black_box;
use std::time::Duration;

pub fn run(options: &Options) -> Vec<Figure> {
    let mut figures = Vec::new();
    let wants_matmul = options.wants("tensor.matmul_f32_1024_gflops")
        || options.wants("tensor.matmul_vs_peak")
        || options.wants("tensor.conv2d_vs_matmul");
    let peak = (options.wants("kernels.fma_peak_gflops") || options.wants("tensor.matmul_vs_peak"))
        .then(|| brasa_kernels::peak::fma_peak_gflops(Duration::from_millis(options.reps(1000, 200) as u64)));
    if let Some(peak) = peak.filter(|_| options.wants("kernels.fma_peak_gflops")) {
        figures.push(Figure::new("kernels.fma_peak_gflops", peak, "GFLOP/s", Better::Higher));
    }
    let matmul = wants_matmul.then(|| matmul_1024_gflops(options));
    if let Some(rate) = matmul.filter(|_| options.wants("tensor.matmul_f32_1024_gflops")) {
        figures.push(Figure::new("tensor.matmul_f32_1024_gflops", rate, "GFLOP/s", Better::Higher));
    }
    if let (Some(rate), Some(peak)) = (matmul, peak) {
        if options.wants("tensor.matmul_vs_peak") {
            figures.push(Figure::new("tensor.matmul_vs_peak", rate / peak, "ratio", Better::Higher));
        }
    }
    if options.wants("tensor.matmul_mlp_gflops") {
        figures.push(Figure::new("tensor.matmul_mlp_gflops", mlp_gflops(options), "GFLOP/s", Better::Higher));
    }
    if options.wants("tensor.conv2d_gflops") || options.wants("tensor.conv2d_vs_matmul") {
        let conv = conv2d_gflops(options);
        if options.wants("tensor.conv2d_gflops") {
            figures.push(Figure::new("tensor.conv2d_gflops", conv, "GFLOP/s", Better::Higher));
        }
        if let Some(rate) = matmul.filter(|_| options.wants("tensor.conv2d_vs_matmul")) {
            figures.push(Figure::new("tensor.conv2d_vs_matmul", conv / rate, "ratio", Better::Higher));
        }
    }
    figures
}

fn randn(shape: &[usize]) -> Tensor {
    Tensor::randn(shape.to_vec(), DType::F32).expect("benchmark input")
}

/// Median seconds of `f` over `reps` runs, after two warm-up runs.
fn median_seconds(reps: usize, f: impl Fn()) -> f64 {
    f();
    f();
    let mut samples: Vec<f64> = (0..reps).map(|_| time(&f)).collect();
    median(&mut samples)
}

fn matmul_1024_gflops(options: &Options) -> f64 {
    let n = 1024;
    let (a, b) = (randn(&[n, n]), randn(&[n, n]));
    let seconds = median_seconds(options.reps(15, 3), || {
        black_box(a.matmul(&b).expect("matmul"));
    });
    2.0 * (n * n * n) as f64 / seconds / 1e9
}

fn mlp_gflops(options: &Options) -> f64 {
    let (batch, inputs, outputs) = (128, 784, 512);
    let x = randn(&[batch, inputs]);
    let w = randn(&[outputs, inputs]); // PyTorch's Linear layout
    let g = randn(&[batch, outputs]);
    let (wt, gt) = (w.t().expect("view"), g.t().expect("view"));
    let seconds = median_seconds(options.reps(51, 5), || {
        black_box(x.matmul(&wt).expect("forward")); // 128x784 · 784x512
        black_box(gt.matmul(&x).expect("weight gradient")); // 512x128 · 128x784
        black_box(g.matmul(&w).expect("input gradient")); // 128x512 · 512x784
    });
    3.0 * 2.0 * (batch * inputs * outputs) as f64 / seconds / 1e9
}

fn conv2d_gflops(options: &Options) -> f64 {
    let (n, c_in, c_out, hw) = (64, 32, 64, 28);
    let x = randn(&[n, c_in, hw, hw]);
    let w = randn(&[c_out, c_in, 3, 3]);
    let params = Conv2dParams::default().with_padding((1, 1));
    let seconds = median_seconds(options.reps(15, 3), || {
        black_box(x.conv2d(&w, None, params).expect("conv2d"));
    });
    2.0 * (n * c_out * hw * hw * c_in * 9) as f64 / seconds / 1e9
}
