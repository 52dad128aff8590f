//! f32 matrix products: ours against the `gemm` crate (AVX-512 build) and
//! `matrixmultiply` (threaded), on square sizes and the MLP training shapes;
//! and ours in bf16 and f16 against ours in f32 (group `hgemm`), which shows
//! what widening while packing and narrowing on write-back cost.
//!
//! ```text
//! cargo bench -p brasa-kernels --bench gemm
//! ```
//!
//! Throughput is reported in elements = flops (`2 m n k`), so criterion's
//! "elem/s" reads as flop/s.

use brasa_kernels::gemm::{gemm, gemm_f32, GemmElement, MatMut, MatRef};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use half::{bf16, f16};
use std::hint::black_box;
use std::time::Duration;

/// `C (m x n) = A (m x k) B (k x n)`, with A or B possibly stored transposed.
#[derive(Clone, Copy)]
struct Shape {
    name: &'static str,
    m: usize,
    n: usize,
    k: usize,
    a_transposed: bool,
    b_transposed: bool,
}

const fn square(name: &'static str, n: usize) -> Shape {
    Shape { name, m: n, n, k: n, a_transposed: false, b_transposed: false }
}

const SHAPES: [Shape; 6] = [
    square("256", 256),
    square("512", 512),
    square("1024", 1024),
    // MLP 784-512, batch 128: the forward X W (128x784 . 784x512), and the
    // backward products with a transposed operand: 512x128 . 128x784 (A
    // stored as its 128x512 transpose) and 128x512 . 512x784 (B stored as
    // its 784x512 transpose).
    Shape { name: "mlp_fwd_128x784x512", m: 128, n: 512, k: 784, a_transposed: false, b_transposed: false },
    Shape { name: "mlp_dw_784x128x512_At", m: 784, n: 512, k: 128, a_transposed: true, b_transposed: false },
    Shape { name: "mlp_dx_128x512x784_Bt", m: 128, n: 784, k: 512, a_transposed: false, b_transposed: true },
];

fn bench_gemm(c: &mut Criterion) {
    let threads = rayon::current_num_threads();
    let mut group = c.benchmark_group("sgemm");
    group.sample_size(20).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    for s in SHAPES {
        let (m, n, k) = (s.m, s.n, s.k);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 8.0).collect();
        let mut out = vec![0.0f32; m * n];
        // Element (i, p) of A at i * a_rs + p * a_cs; likewise B.
        let (a_rs, a_cs) = if s.a_transposed { (1, m) } else { (k, 1) };
        let (b_rs, b_cs) = if s.b_transposed { (1, k) } else { (n, 1) };
        group.throughput(Throughput::Elements(2 * (m * n * k) as u64));

        group.bench_function(BenchmarkId::new("brasa", s.name), |bench| {
            bench.iter(|| {
                let av = MatRef::new(&a, 0, [m, k], [a_rs, a_cs]).unwrap();
                let bv = MatRef::new(&b, 0, [k, n], [b_rs, b_cs]).unwrap();
                gemm_f32(1.0, av, bv, 0.0, MatMut::row_major(&mut out, m, n).unwrap()).unwrap();
                black_box(&out);
            })
        });
        group.bench_function(BenchmarkId::new("gemm", s.name), |bench| {
            bench.iter(|| {
                // SAFETY: the pointers and strides describe the buffers above.
                unsafe {
                    gemm::gemm(
                        m,
                        n,
                        k,
                        out.as_mut_ptr(),
                        1,
                        n as isize,
                        false,
                        a.as_ptr(),
                        a_cs as isize,
                        a_rs as isize,
                        b.as_ptr(),
                        b_cs as isize,
                        b_rs as isize,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        gemm::Parallelism::Rayon(threads),
                    )
                };
                black_box(&out);
            })
        });
        group.bench_function(BenchmarkId::new("matrixmultiply", s.name), |bench| {
            bench.iter(|| {
                // SAFETY: as above.
                unsafe {
                    matrixmultiply::sgemm(
                        m,
                        k,
                        n,
                        1.0,
                        a.as_ptr(),
                        a_rs as isize,
                        a_cs as isize,
                        b.as_ptr(),
                        b_rs as isize,
                        b_cs as isize,
                        0.0,
                        out.as_mut_ptr(),
                        n as isize,
                        1,
                    )
                };
                black_box(&out);
            })
        });
    }
    group.finish();
}

/// Half-precision shapes: `(name, m, n, k)`, all operands row-major.
const HALF_SHAPES: [(&str, usize, usize, usize); 2] =
    [("512x784x512", 512, 512, 784), ("mlp_fwd_128x784x512", 128, 512, 784)];

/// One row-major product of `m x k` by `k x n` in `T`, timed.
fn bench_typed<T: GemmElement<Scalar = f32>>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    (shape, m, n, k): (&str, usize, usize, usize),
    from_f32: fn(f32) -> T,
) {
    let a: Vec<T> = (0..m * k).map(|i| from_f32(((i * 7 % 13) as f32 - 6.0) / 8.0)).collect();
    let b: Vec<T> = (0..k * n).map(|i| from_f32(((i * 5 % 11) as f32 - 5.0) / 8.0)).collect();
    let mut out = vec![from_f32(0.0); m * n];
    group.bench_function(BenchmarkId::new(name, shape), |bench| {
        bench.iter(|| {
            let av = MatRef::row_major(&a, m, k).unwrap();
            let bv = MatRef::row_major(&b, k, n).unwrap();
            gemm(1.0, av, bv, 0.0, MatMut::row_major(&mut out, m, n).unwrap()).unwrap();
            black_box(&out);
        })
    });
}

fn bench_half_gemm(c: &mut Criterion) {
    let mut group = c.benchmark_group("hgemm");
    group.sample_size(20).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    for shape in HALF_SHAPES {
        let (_, m, n, k) = shape;
        group.throughput(Throughput::Elements(2 * (m * n * k) as u64));
        bench_typed::<f32>(&mut group, "f32", shape, |x| x);
        bench_typed::<bf16>(&mut group, "bf16", shape, bf16::from_f32);
        bench_typed::<f16>(&mut group, "f16", shape, f16::from_f32);
    }
    group.finish();
}

criterion_group!(benches, bench_gemm, bench_half_gemm);
criterion_main!(benches);
