//! f32 matrix products: ours against the `gemm` crate (AVX-512 build) and
//! `matrixmultiply` (threaded), on square sizes and the MLP training shapes;
//! and ours in bf16 and f16 against ours in f32 (group `hgemm`): bf16 with
//! AVX512-BF16 dot products where the CPU has them (`bf16`) and widened to
//! f32 while packed (`bf16_widened`, measured only where the two differ).
//!
//! ```text
//! cargo bench -p brasa-kernels --bench gemm
//! ```
//!
//! Throughput is reported in elements = flops (`2 m n k`), so criterion's
//! "elem/s" reads as flop/s. The shapes, operands and reference calls are
//! those of the `gemm_tune` example.

use brasa_kernels::gemm::{GemmOptions, KernelChoice};
use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use half::{bf16, f16};
use std::time::Duration;

// The example's `main` is unused here.
#[allow(dead_code)]
#[path = "../examples/gemm_tune.rs"]
mod tune;

use tune::{Shape, MLP_SHAPES};

/// Square sizes, then the MLP shapes.
fn shapes(squares: &[usize]) -> Vec<(String, Shape)> {
    let squares = squares.iter().map(|&n| (n.to_string(), Shape::new(n, n, n)));
    squares.chain(MLP_SHAPES.iter().map(|&(name, s)| (name.to_string(), s))).collect()
}

fn group<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(name);
    group.sample_size(20).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    group
}

/// Times `f` as benchmark `name` of `shape`.
fn bench(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, shape: &str, mut f: impl FnMut()) {
    group.bench_function(BenchmarkId::new(name, shape), |bench| bench.iter(&mut f));
}

fn bench_gemm(c: &mut Criterion) {
    let threads = rayon::current_num_threads();
    let mut group = group(c, "sgemm");
    for (name, s) in shapes(&[256, 512, 1024]) {
        group.throughput(Throughput::Elements(s.flops() as u64));
        bench(&mut group, "brasa", &name, s.ours::<f32>(GemmOptions::default(), |x| x));
        bench(&mut group, "gemm", &name, s.reference_gemm(threads));
        bench(&mut group, "matrixmultiply", &name, s.reference_matrixmultiply());
    }
    group.finish();
}

fn bench_half_gemm(c: &mut Criterion) {
    let mut group = group(c, "hgemm");
    let options = GemmOptions::default();
    let widened = tune::widened(options);
    for (name, s) in shapes(&[1024]) {
        group.throughput(Throughput::Elements(s.flops() as u64));
        bench(&mut group, "f32", &name, s.ours::<f32>(options, |x| x));
        bench(&mut group, "bf16", &name, s.ours(options, bf16::from_f32));
        if matches!(options.kernel.resolve(), KernelChoice::Avx512Bf16 | KernelChoice::AmxBf16) {
            bench(&mut group, "bf16_widened", &name, s.ours(widened, bf16::from_f32));
        }
        bench(&mut group, "f16", &name, s.ours(options, f16::from_f32));
    }
    group.finish();
}

criterion_group!(benches, bench_gemm, bench_half_gemm);
criterion_main!(benches);
