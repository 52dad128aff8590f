//! Speed of `Tensor::matmul` and `Tensor::conv2d` against this machine's FMA
//! peak: the same figures `brasa-bench` publishes as `tensor.matmul_*` and
//! `tensor.conv2d_*`.
//!
//! ```text
//! cargo run --release -p brasa-tensor --example matmul_speed [-- --quick]
//! ```

use brasa_tensor::{Conv2dParams, DType, Result, Tensor};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Median seconds of `f` over `reps` runs, after two warm-up runs; each
/// result is dropped (inside the timing: freeing is part of an op's cost).
fn median_seconds<R>(reps: usize, f: impl Fn() -> Result<R>) -> Result<f64> {
    black_box(f()?);
    black_box(f()?);
    let mut samples = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        black_box(f()?);
        samples.push(start.elapsed().as_secs_f64());
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

fn main() -> Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let reps = |full: usize, short: usize| if quick { short } else { full };
    let randn = |shape: &[usize]| Tensor::randn(shape.to_vec(), DType::F32);

    let peak = brasa_kernels::peak::fma_peak_gflops(Duration::from_millis(reps(1000, 200) as u64));
    println!("kernels.fma_peak_gflops      {peak:8.1} GFLOP/s ({} threads)", rayon::current_num_threads());

    let n = 1024;
    let (a, b) = (randn(&[n, n])?, randn(&[n, n])?);
    let s = median_seconds(reps(15, 3), || a.matmul(&b))?;
    let matmul = 2.0 * (n * n * n) as f64 / s / 1e9;
    println!("tensor.matmul_f32_1024_gflops {matmul:8.1} GFLOP/s ({:.2} ms)", s * 1e3);
    println!("tensor.matmul_vs_peak         {:8.3}", matmul / peak);

    let (batch, inputs, outputs) = (128, 784, 512);
    let (x, w, g) = (randn(&[batch, inputs])?, randn(&[outputs, inputs])?, randn(&[batch, outputs])?);
    let (wt, gt) = (w.t()?, g.t()?);
    let products: [(&str, &Tensor, &Tensor); 3] = [("x · Wᵀ", &x, &wt), ("gᵀ · x", &gt, &x), ("g · W", &g, &w)];
    let flops = 2.0 * (batch * inputs * outputs) as f64;
    let mut total = 0.0;
    for (name, lhs, rhs) in products {
        let s = median_seconds(reps(51, 5), || lhs.matmul(rhs))?;
        println!("  mlp {name:<8} {:?} · {:?}: {:8.1} GFLOP/s", lhs.dims(), rhs.dims(), flops / s / 1e9);
        total += s;
    }
    println!("tensor.matmul_mlp_gflops      {:8.1} GFLOP/s", 3.0 * flops / total / 1e9);

    let (n, c_in, c_out, hw) = (64, 32, 64, 28);
    let (x, w) = (randn(&[n, c_in, hw, hw])?, randn(&[c_out, c_in, 3, 3])?);
    let params = Conv2dParams::default().with_padding((1, 1));
    let flops = 2.0 * (n * c_out * hw * hw * c_in * 9) as f64;
    let s = median_seconds(reps(15, 3), || x.conv2d(&w, None, params))?;
    let conv = flops / s / 1e9;
    println!("tensor.conv2d_gflops          {conv:8.1} GFLOP/s ({:.2} ms)", s * 1e3);
    println!("tensor.conv2d_vs_matmul       {:8.3}", conv / matmul);
    let gy = x.conv2d(&w, None, params)?;
    let s = median_seconds(reps(15, 3), || gy.conv2d_backward_input(&w, x.dims(), params))?;
    println!("  conv2d backward input       {:8.1} GFLOP/s", flops / s / 1e9);
    let s = median_seconds(reps(15, 3), || x.conv2d_backward_weight(&gy, w.dims(), params))?;
    println!("  conv2d backward weight      {:8.1} GFLOP/s", flops / s / 1e9);
    let s = median_seconds(reps(15, 3), || x.max_pool2d((2, 2), (2, 2), (0, 0)))?;
    println!(
        "  max_pool2d 2x2 of {:?}  {:8.2} ms ({:.1} GB/s read)",
        x.dims(),
        s * 1e3,
        x.numel() as f64 * 4.0 / s / 1e9
    );
    Ok(())
}
