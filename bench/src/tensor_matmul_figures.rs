//! `tensor.matmul_*`, `tensor.conv2d_*` and `kernels.fma_peak_gflops`: matrix
//! products and convolutions through `Tensor` ops, against this machine's
//! FMA peak.
//!
//! - `kernels.fma_peak_gflops`: the f32 FMA peak on all threads.
//! - `tensor.matmul_f32_1024_gflops`: `Tensor::matmul` of two 1024x1024 f32
//!   matrices, median of several runs; `tensor.matmul_vs_peak` is its ratio
//!   to the peak measured in the same run.
//! - `tensor.matmul_bf16_1024_gflops`, `tensor.matmul_bf16_vs_peak`: the same
//!   product in bf16, against the peak of the bf16 path this CPU runs
//!   (`brasa_kernels::peak::bf16_dot_peak_gflops`: `VDPBF16PS` where there is
//!   AVX512-BF16, else the f32 FMA peak).
//! - `tensor.matmul_mlp_gflops`: the three products of a 784 -> 512 linear
//!   layer on a batch of 128 (forward `x · Wᵀ`, and backward `gᵀ · x` and
//!   `g · W` on transposed views), combined.
//! - `tensor.conv2d_gflops`: a 3x3 convolution, padding 1, of a
//!   64x32x28x28 input to 64 channels (`2·N·C_out·H·W·C_in·9` flops);
//!   `tensor.conv2d_vs_matmul` is its ratio to the 1024³ product's rate.

use crate::measure::{median, try_time, BenchResult, Better, Figure, Options};
use brasa_tensor::{Conv2dParams, DType, Tensor};
use std::hint::black_box;
use std::time::Duration;

pub fn run(options: &Options) -> BenchResult<Vec<Figure>> {
    let mut figures = Vec::new();
    let wants_matmul = options.wants("tensor.matmul_f32_1024_gflops")
        || options.wants("tensor.matmul_vs_peak")
        || options.wants("tensor.conv2d_vs_matmul");
    let peak = (options.wants("kernels.fma_peak_gflops") || options.wants("tensor.matmul_vs_peak"))
        .then(|| brasa_kernels::peak::fma_peak_gflops(Duration::from_millis(options.reps(1000, 200) as u64)));
    if let Some(peak) = peak.filter(|_| options.wants("kernels.fma_peak_gflops")) {
        figures.push(Figure::new("kernels.fma_peak_gflops", peak, "GFLOP/s", Better::Higher));
    }
    let matmul = if wants_matmul { Some(matmul_1024_gflops(options)?) } else { None };
    if let Some(rate) = matmul.filter(|_| options.wants("tensor.matmul_f32_1024_gflops")) {
        figures.push(Figure::new("tensor.matmul_f32_1024_gflops", rate, "GFLOP/s", Better::Higher));
    }
    if let (Some(rate), Some(peak)) = (matmul, peak) {
        if options.wants("tensor.matmul_vs_peak") {
            figures.push(Figure::new("tensor.matmul_vs_peak", rate / peak, "ratio", Better::Higher));
        }
    }
    if options.wants("tensor.matmul_bf16_vs_peak") {
        let peak = brasa_kernels::peak::bf16_dot_peak_gflops(Duration::from_millis(options.reps(1000, 200) as u64));
        let rate = matmul_1024_gflops_in(options, DType::BF16)?;
        figures.push(Figure::new("tensor.matmul_bf16_1024_gflops", rate, "GFLOP/s", Better::Higher));
        figures.push(Figure::new("tensor.matmul_bf16_vs_peak", rate / peak, "ratio", Better::Higher));
    }
    if options.wants("tensor.matmul_mlp_gflops") {
        figures.push(Figure::new("tensor.matmul_mlp_gflops", mlp_gflops(options)?, "GFLOP/s", Better::Higher));
    }
    if options.wants("tensor.conv2d_gflops") || options.wants("tensor.conv2d_vs_matmul") {
        let conv = conv2d_gflops(options)?;
        if options.wants("tensor.conv2d_gflops") {
            figures.push(Figure::new("tensor.conv2d_gflops", conv, "GFLOP/s", Better::Higher));
        }
        if let Some(rate) = matmul.filter(|_| options.wants("tensor.conv2d_vs_matmul")) {
            figures.push(Figure::new("tensor.conv2d_vs_matmul", conv / rate, "ratio", Better::Higher));
        }
    }
    Ok(figures)
}

fn randn(shape: &[usize]) -> brasa_tensor::Result<Tensor> {
    Tensor::randn(shape.to_vec(), DType::F32)
}

/// Median seconds of `f` over `reps` runs, after two warm-up runs; the first
/// error `f` returns ends the measurement.
fn median_seconds(reps: usize, f: impl Fn() -> brasa_tensor::Result<()>) -> brasa_tensor::Result<f64> {
    f()?;
    f()?;
    let mut samples: Vec<f64> = (0..reps).map(|_| try_time(&f)).collect::<brasa_tensor::Result<_>>()?;
    Ok(median(&mut samples))
}

fn matmul_1024_gflops(options: &Options) -> BenchResult<f64> {
    matmul_1024_gflops_in(options, DType::F32)
}

fn matmul_1024_gflops_in(options: &Options, dtype: DType) -> BenchResult<f64> {
    let n = 1024;
    let (a, b) = (randn(&[n, n])?.to_dtype(dtype)?, randn(&[n, n])?.to_dtype(dtype)?);
    let seconds = median_seconds(options.reps(15, 3), || {
        black_box(a.matmul(&b)?);
        Ok(())
    })?;
    Ok(2.0 * (n * n * n) as f64 / seconds / 1e9)
}

fn mlp_gflops(options: &Options) -> BenchResult<f64> {
    let (batch, inputs, outputs) = (128, 784, 512);
    let x = randn(&[batch, inputs])?;
    let w = randn(&[outputs, inputs])?; // PyTorch's Linear layout
    let g = randn(&[batch, outputs])?;
    let (wt, gt) = (w.t()?, g.t()?);
    let seconds = median_seconds(options.reps(51, 5), || {
        black_box(x.matmul(&wt)?); // forward: 128x784 · 784x512
        black_box(gt.matmul(&x)?); // weight gradient: 512x128 · 128x784
        black_box(g.matmul(&w)?); // input gradient: 128x512 · 512x784
        Ok(())
    })?;
    Ok(3.0 * 2.0 * (batch * inputs * outputs) as f64 / seconds / 1e9)
}

fn conv2d_gflops(options: &Options) -> BenchResult<f64> {
    let (n, c_in, c_out, hw) = (64, 32, 64, 28);
    let x = randn(&[n, c_in, hw, hw])?;
    let w = randn(&[c_out, c_in, 3, 3])?;
    let params = Conv2dParams::default().with_padding((1, 1));
    let seconds = median_seconds(options.reps(15, 3), || {
        black_box(x.conv2d(&w, None, params)?);
        Ok(())
    })?;
    Ok(2.0 * (n * c_out * hw * hw * c_in * 9) as f64 / seconds / 1e9)
}
