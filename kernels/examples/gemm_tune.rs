//! Measures our matrix product against the machine's FMA peak and the
//! reference crates, with medians of repeated runs.
//!
//! ```text
//! cargo run --release -p brasa-kernels --example gemm_tune -- [reps]
//! ```
//!
//! Environment knobs for tuning: `BRASA_MC`, `BRASA_KC`, `BRASA_NC` (blocking),
//! `BRASA_KERNEL` (`avx512`, `avx2`, `portable`), `BRASA_THREADS` (parts),
//! `BRASA_SHAPES` (`m,n,k;m,n,k;...`, `t` suffix on k = A transposed),
//! `BRASA_REFS=0` to skip the reference crates.

use brasa_kernels::gemm::{gemm_with, Blocking, GemmOptions, KernelChoice, MatMut, MatRef, Parallelism};
use brasa_kernels::peak::fma_peak_gflops;
use std::time::{Duration, Instant};

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
fn time_gflops(flops: f64, reps: usize, fs: &mut [&mut dyn FnMut()]) -> Vec<f64> {
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
    for _ in 0..reps {
        for (i, f) in fs.iter_mut().enumerate() {
            let (t, c0) = (Instant::now(), cpu_seconds());
            for _ in 0..inner[i] {
                f();
            }
            let secs = if cpu { (cpu_seconds() - c0) / threads } else { t.elapsed().as_secs_f64() };
            samples[i].push(flops * inner[i] as f64 / secs / 1e9);
        }
    }
    samples.into_iter().map(median).collect()
}

struct Shape {
    m: usize,
    n: usize,
    k: usize,
    a_transposed: bool,
    b_transposed: bool,
}

fn parse_shapes() -> Vec<Shape> {
    let spec = std::env::var("BRASA_SHAPES")
        .unwrap_or_else(|_| "256,256,256;512,512,512;1024,1024,1024;128,512,784;512,784,128a;128,784,512b".into());
    spec.split(';')
        .filter(|s| !s.is_empty())
        .map(|s| {
            let a_t = s.ends_with('a');
            let b_t = s.ends_with('b');
            let v: Vec<usize> =
                s.trim_end_matches(['a', 'b']).split(',').map(|x| x.trim().parse().expect("shape m,n,k")).collect();
            Shape { m: v[0], n: v[1], k: v[2], a_transposed: a_t, b_transposed: b_t }
        })
        .collect()
}

fn main() {
    let reps: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(7);
    let kernel = match std::env::var("BRASA_KERNEL").as_deref() {
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
    let threads = rayon::current_num_threads();

    let peak_runs = if std::env::var("BRASA_PEAK").as_deref() == Ok("0") { 1 } else { 3 };
    let peak = median((0..peak_runs).map(|_| fma_peak_gflops(Duration::from_millis(300))).collect());
    println!("threads {threads}, options {options:?}, clock {}", if use_cpu_clock() { "cpu" } else { "wall" });
    println!("f32 FMA peak: {peak:.1} GFLOP/s");
    println!("{:>22} {:>9} {:>7} {:>9} {:>9}", "shape (m n k)", "ours", "/peak", "gemm", "mm");
    for s in parse_shapes() {
        let (m, n, k) = (s.m, s.n, s.k);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 8.0).collect();
        let flops = 2.0 * (m * n * k) as f64;
        // A stored k x m when transposed (a backward product), B stored n x k.
        let (a_rs, a_cs) = if s.a_transposed { (1, m) } else { (k, 1) };
        let (b_rs, b_cs) = if s.b_transposed { (1, k) } else { (n, 1) };
        let c_cell = std::cell::RefCell::new(vec![0.0f32; m * n]);
        let mut ours = || {
            let av = MatRef::new(&a, 0, [m, k], [a_rs, a_cs]).unwrap();
            let bv = MatRef::new(&b, 0, [k, n], [b_rs, b_cs]).unwrap();
            let mut c = c_cell.borrow_mut();
            gemm_with(&options, 1.0, av, bv, 0.0, MatMut::row_major(&mut c, m, n).unwrap()).unwrap();
        };
        let mut reference_gemm = || {
            let mut c = c_cell.borrow_mut();
            // SAFETY: the pointers and strides describe the vectors above.
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    c.as_mut_ptr(),
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
            }
        };
        let mut reference_mm = || {
            let mut c = c_cell.borrow_mut();
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
                    c.as_mut_ptr(),
                    n as isize,
                    1,
                )
            }
        };
        let r = if refs {
            time_gflops(flops, reps, &mut [&mut ours, &mut reference_gemm, &mut reference_mm])
        } else {
            let mut r = time_gflops(flops, reps, &mut [&mut ours]);
            r.extend([f64::NAN, f64::NAN]);
            r
        };
        let (ours, g, mm) = (r[0], r[1], r[2]);
        let tag = if s.a_transposed {
            " A^T"
        } else if s.b_transposed {
            " B^T"
        } else {
            ""
        };
        println!("{:>22} {:>9.1} {:>7.3} {:>9.1} {:>9.1}", format!("{m} {n} {k}{tag}"), ours, ours / peak, g, mm);
    }
}
