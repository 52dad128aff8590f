//! Measures our matrix product against the machine's FMA peak and the
//! reference crates, with medians of repeated runs; and our bf16 and f16
//! products against our f32 one, measured in the same rounds.
//!
//! ```text
//! cargo run --release -p brasa-kernels --example gemm_tune -- [reps]
//! ```
//!
//! Environment knobs for tuning: `BRASA_MC`, `BRASA_KC`, `BRASA_NC` (blocking),
//! `BRASA_KERNEL` (`amx`, `avx512bf16`, `avx512`, `avx2`, `portable`),
//! `BRASA_THREADS` (parts), `BRASA_SHAPES` (`m,n,k;m,n,k;...`, an `a` or `b`
//! suffix = A or B stored transposed), `BRASA_REFS=0` to skip the reference
//! crates, `BRASA_DTYPES` (comma-separated: `f32`, `bf16`, `bf16w` = bf16
//! widened to f32 while packed, `f16`; default `f32`), `BRASA_COLD=1` to
//! evict the caches (by writing 64 MiB) before every timed call, as a
//! training step's products find their operands: only the calls are timed.
//!
//! The benchmark `benches/gemm.rs` includes this file as a module for its
//! shapes, operands and reference calls.

// Example code: a bad shape or `BRASA_SHAPES` entry stops the run with the message.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_kernels::gemm::{gemm_with, Blocking, GemmElement, GemmOptions, KernelChoice, MatMut, MatRef, Parallelism};
use brasa_kernels::peak::fma_peak_gflops;
use half::{bf16, f16};
use std::time::{Duration, Instant};

/// `C (m x n) = A (m x k) B (k x n)`, with A or B possibly stored transposed
/// (A as its `k x m` transpose, B as its `n x k` one: the backward products).
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Rows of A and C.
    pub m: usize,
    /// Columns of B and C.
    pub n: usize,
    /// The reduced dimension: columns of A, rows of B.
    pub k: usize,
    /// A is stored as its `k x m` transpose.
    pub a_transposed: bool,
    /// B is stored as its `n x k` transpose.
    pub b_transposed: bool,
}

impl Shape {
    /// An `m x n x k` product with A and B stored row-major.
    pub const fn new(m: usize, n: usize, k: usize) -> Shape {
        Shape { m, n, k, a_transposed: false, b_transposed: false }
    }

    /// `2 m n k`.
    pub fn flops(&self) -> f64 {
        2.0 * (self.m * self.n * self.k) as f64
    }

    /// Row and column strides of A: element (i, p) at `i * rs + p * cs`.
    pub fn a_strides(&self) -> [usize; 2] {
        if self.a_transposed {
            [1, self.m]
        } else {
            [self.k, 1]
        }
    }

    /// Row and column strides of B.
    pub fn b_strides(&self) -> [usize; 2] {
        if self.b_transposed {
            [1, self.k]
        } else {
            [self.n, 1]
        }
    }

    /// Deterministic operands A and B, stored as the strides say.
    pub fn operands(&self) -> (Vec<f32>, Vec<f32>) {
        let a = (0..self.m * self.k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0).collect();
        let b = (0..self.k * self.n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 8.0).collect();
        (a, b)
    }

    /// A closure that runs `product(shape, a, b, c)` on this shape's
    /// operands converted to `T` and a row-major C.
    fn with_operands<T: Copy>(
        &self,
        from_f32: fn(f32) -> T,
        mut product: impl FnMut(&Shape, &[T], &[T], &mut [T]),
    ) -> impl FnMut() {
        let s = *self;
        let (a, b) = s.operands();
        let a: Vec<T> = a.into_iter().map(from_f32).collect();
        let b: Vec<T> = b.into_iter().map(from_f32).collect();
        let mut c = vec![from_f32(0.0); s.m * s.n];
        move || product(&s, &a, &b, &mut c)
    }

    /// `C = A B` with our product in `T` (operands rounded from
    /// [`Shape::operands`]), row-major C; returns the closure that runs it.
    pub fn ours<T: GemmElement<Scalar = f32>>(&self, options: GemmOptions, from_f32: fn(f32) -> T) -> impl FnMut() {
        self.with_operands(from_f32, move |s, a, b, c| {
            let av = MatRef::new(a, 0, [s.m, s.k], s.a_strides()).unwrap();
            let bv = MatRef::new(b, 0, [s.k, s.n], s.b_strides()).unwrap();
            gemm_with(&options, 1.0, av, bv, 0.0, MatMut::row_major(c, s.m, s.n).unwrap()).unwrap();
        })
    }

    /// `C = A B` in f32 with the `gemm` crate on `threads` rayon threads.
    pub fn reference_gemm(&self, threads: usize) -> impl FnMut() {
        self.with_operands(
            |x| x,
            move |s, a, b, c| {
                let ([a_rs, a_cs], [b_rs, b_cs]) = (s.a_strides(), s.b_strides());
                // SAFETY: the pointers and strides describe the slices.
                unsafe {
                    gemm::gemm(
                        s.m,
                        s.n,
                        s.k,
                        c.as_mut_ptr(),
                        1,
                        s.n as isize,
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
                }
            },
        )
    }

    /// `C = A B` in f32 with `matrixmultiply` (threaded).
    pub fn reference_matrixmultiply(&self) -> impl FnMut() {
        self.with_operands(
            |x| x,
            move |s, a, b, c| {
                let ([a_rs, a_cs], [b_rs, b_cs]) = (s.a_strides(), s.b_strides());
                // SAFETY: as above.
                unsafe {
                    matrixmultiply::sgemm(
                        s.m,
                        s.k,
                        s.n,
                        1.0,
                        a.as_ptr(),
                        a_rs as isize,
                        a_cs as isize,
                        b.as_ptr(),
                        b_rs as isize,
                        b_cs as isize,
                        0.0,
                        c.as_mut_ptr(),
                        s.n as isize,
                        1,
                    )
                }
            },
        )
    }
}

/// MLP 784-512, batch 128: the forward X W (128x784 . 784x512), and the
/// backward products with a transposed operand: dW = X^T dY (784x128 .
/// 128x512, A stored as X) and dX = dY W^T (128x512 . 512x784, B stored as W).
pub const MLP_SHAPES: [(&str, Shape); 3] = [
    ("mlp_fwd_128x784x512", Shape::new(128, 512, 784)),
    ("mlp_dw_784x128x512_At", Shape { a_transposed: true, ..Shape::new(784, 512, 128) }),
    ("mlp_dx_128x512x784_Bt", Shape { b_transposed: true, ..Shape::new(128, 784, 512) }),
];

/// The options that run bf16 widened to f32 while packed: `options` with
/// the AVX-512 f32 kernel where it would have used AVX512-BF16.
pub fn widened(options: GemmOptions) -> GemmOptions {
    match options.kernel.resolve() {
        KernelChoice::Avx512Bf16 | KernelChoice::AmxBf16 => GemmOptions { kernel: KernelChoice::Avx512, ..options },
        _ => options,
    }
}

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// CPU time used by this process so far, in seconds: on a machine shared with
/// other jobs, work per CPU-second is steadier than work per wall-second.
fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Whether to report flops per CPU-second times the thread count
/// (`BRASA_CLOCK=cpu`) instead of flops per wall-second.
fn use_cpu_clock() -> bool {
    std::env::var("BRASA_CLOCK").as_deref() == Ok("cpu")
}

/// Median GFLOP/s of each closure over `reps` rounds; the closures take
/// turns inside a round so that a noisy neighbour hurts them alike.
fn time_gflops(flops: f64, reps: usize, fs: &mut [Box<dyn FnMut() + '_>]) -> Vec<f64> {
    let cpu = use_cpu_clock();
    let threads = rayon::current_num_threads() as f64;
    let inner: Vec<usize> = fs
        .iter_mut()
        .map(|f| {
            f();
            let t = Instant::now();
            f();
            let once = t.elapsed().as_secs_f64().max(1e-7);
            ((0.03 / once) as usize).max(1)
        })
        .collect();
    let mut samples = vec![Vec::new(); fs.len()];
    let mut evict = std::env::var("BRASA_COLD").is_ok_and(|v| v == "1").then(|| vec![0u8; 64 << 20]);
    for round in 0..reps {
        for (i, f) in fs.iter_mut().enumerate() {
            let mut secs = 0.0;
            for _ in 0..inner[i] {
                if let Some(buf) = evict.as_mut() {
                    buf.fill(round as u8);
                    std::hint::black_box(&buf);
                }
                let (t, c0) = (Instant::now(), cpu_seconds());
                f();
                secs += if cpu { (cpu_seconds() - c0) / threads } else { t.elapsed().as_secs_f64() };
            }
            samples[i].push(flops * inner[i] as f64 / secs / 1e9);
        }
    }
    samples.into_iter().map(median).collect()
}

fn parse_shapes() -> Vec<Shape> {
    let spec = std::env::var("BRASA_SHAPES")
        .unwrap_or_else(|_| "256,256,256;512,512,512;1024,1024,1024;128,512,784;784,512,128a;128,784,512b".into());
    spec.split(';')
        .filter(|s| !s.is_empty())
        .map(|s| {
            let v: Vec<usize> =
                s.trim_end_matches(['a', 'b']).split(',').map(|x| x.trim().parse().expect("shape m,n,k")).collect();
            Shape { a_transposed: s.ends_with('a'), b_transposed: s.ends_with('b'), ..Shape::new(v[0], v[1], v[2]) }
        })
        .collect()
}

/// One timed product of the given dtype name, or `None` for an unknown one.
fn product(dtype: &str, shape: &Shape, options: GemmOptions) -> Option<Box<dyn FnMut()>> {
    Some(match dtype {
        "f32" => Box::new(shape.ours::<f32>(options, |x| x)),
        "bf16" => Box::new(shape.ours(options, bf16::from_f32)),
        "bf16w" => Box::new(shape.ours(widened(options), bf16::from_f32)),
        "f16" => Box::new(shape.ours(options, f16::from_f32)),
        _ => return None,
    })
}

fn main() {
    let reps: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(7);
    let kernel = match std::env::var("BRASA_KERNEL").as_deref() {
        Ok("amx") => KernelChoice::AmxBf16,
        Ok("avx512bf16") => KernelChoice::Avx512Bf16,
        Ok("avx512") => KernelChoice::Avx512,
        Ok("avx2") => KernelChoice::Avx2Fma,
        Ok("portable") => KernelChoice::Portable,
        _ => KernelChoice::Auto,
    };
    let blocking = match (env_usize("BRASA_MC"), env_usize("BRASA_KC"), env_usize("BRASA_NC")) {
        (None, None, None) => None,
        (mc, kc, nc) => Some(Blocking { mc: mc.unwrap_or(256), kc: kc.unwrap_or(256), nc: nc.unwrap_or(4080) }),
    };
    let parallelism = match env_usize("BRASA_THREADS") {
        Some(1) => Parallelism::Sequential,
        Some(t) => Parallelism::Threads(t),
        None => Parallelism::Auto,
    };
    let options = GemmOptions { parallelism, kernel, blocking };
    let refs = std::env::var("BRASA_REFS").map(|v| v != "0").unwrap_or(true);
    let dtypes_spec = std::env::var("BRASA_DTYPES").unwrap_or_else(|_| "f32".into());
    let dtypes: Vec<&str> = dtypes_spec.split(',').map(str::trim).filter(|d| !d.is_empty()).collect();
    let threads = rayon::current_num_threads();

    let peak_runs = if std::env::var("BRASA_PEAK").as_deref() == Ok("0") { 1 } else { 3 };
    let peak = median((0..peak_runs).map(|_| fma_peak_gflops(Duration::from_millis(300))).collect());
    println!("threads {threads}, options {options:?}, clock {}", if use_cpu_clock() { "cpu" } else { "wall" });
    println!("f32 FMA peak: {peak:.1} GFLOP/s; GFLOP/s medians of {reps} rounds");
    let mut header = format!("{:>22}", "shape (m n k)");
    for d in &dtypes {
        header += &format!(" {d:>9}");
    }
    println!("{header} {:>7} {:>9} {:>9}", "/peak", "gemm", "mm");
    for s in parse_shapes() {
        let mut fs: Vec<Box<dyn FnMut()>> = Vec::new();
        for d in &dtypes {
            match product(d, &s, options) {
                Some(f) => fs.push(f),
                None => {
                    eprintln!("unknown dtype {d} (f32, bf16, bf16w, f16)");
                    return;
                }
            }
        }
        if refs {
            fs.push(Box::new(s.reference_gemm(threads)));
            fs.push(Box::new(s.reference_matrixmultiply()));
        }
        let mut r = time_gflops(s.flops(), reps, &mut fs);
        r.resize(dtypes.len() + 2, f64::NAN);
        let tag = if s.a_transposed {
            " A^T"
        } else if s.b_transposed {
            " B^T"
        } else {
            ""
        };
        let mut line = format!("{:>22}", format!("{} {} {}{tag}", s.m, s.n, s.k));
        for x in &r[..dtypes.len()] {
            line += &format!(" {x:>9.1}");
        }
        let (g, mm) = (r[dtypes.len()], r[dtypes.len() + 1]);
        println!("{line} {:>7.3} {g:>9.1} {mm:>9.1}", r[0] / peak);
    }
}
