//! Matrix products against a naive triple loop and against `matrixmultiply`,
//! on every micro-kernel this CPU supports, every storage order, edge tiles,
//! alpha/beta variants, narrow types and batches.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_kernels::gemm::{
    batched_gemm_bf16, batched_gemm_f32, batched_gemm_with, gemm_bf16, gemm_f16, gemm_f32, gemm_f64, gemm_with,
    BatchMut, BatchRef, Blocking, GemmOptions, KernelChoice, MatMut, MatRef, Parallelism,
};
use brasa_kernels::KernelError;
use half::{bf16, f16};
use proptest::prelude::*;

/// How a matrix is laid out in its buffer.
#[derive(Clone, Copy, Debug)]
enum Storage {
    RowMajor,
    ColMajor,
    /// Row-major with padding between rows and elements, after an offset.
    Strided,
    /// Column-major with a padded column stride, after an offset.
    PaddedCols,
}

const STORAGES: [Storage; 4] = [Storage::RowMajor, Storage::ColMajor, Storage::Strided, Storage::PaddedCols];

/// A dense logical matrix plus the buffer that stores it in some order.
struct Stored<T> {
    buf: Vec<T>,
    offset: usize,
    dims: [usize; 2],
    strides: [usize; 2],
}

impl<T: Copy> Stored<T> {
    fn new(rows: usize, cols: usize, storage: Storage, fill: T, value: impl Fn(usize, usize) -> T) -> Self {
        let (offset, strides) = match storage {
            Storage::RowMajor => (0, [cols, 1]),
            Storage::ColMajor => (0, [1, rows]),
            Storage::Strided => (5, [2 * cols + 3, 2]),
            Storage::PaddedCols => (2, [1, rows + 7]),
        };
        let len = offset + rows.saturating_sub(1) * strides[0] + cols.saturating_sub(1) * strides[1] + 1;
        let mut buf = vec![fill; len];
        for i in 0..rows {
            for j in 0..cols {
                buf[offset + i * strides[0] + j * strides[1]] = value(i, j);
            }
        }
        Stored { buf, offset, dims: [rows, cols], strides }
    }
    fn view(&self) -> MatRef<'_, T> {
        MatRef::new(&self.buf, self.offset, self.dims, self.strides).unwrap()
    }
    fn view_mut(&mut self) -> MatMut<'_, T> {
        MatMut::new(&mut self.buf, self.offset, self.dims, self.strides).unwrap()
    }
    fn at(&self, i: usize, j: usize) -> T {
        self.buf[self.offset + i * self.strides[0] + j * self.strides[1]]
    }
}

/// Small deterministic pseudo-random values in [-1, 1).
fn value(seed: u64, i: usize, j: usize) -> f64 {
    let mut x = seed ^ ((i as u64) << 32) ^ (j as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    (x % 2048) as f64 / 1024.0 - 1.0
}

/// `alpha * A * B + beta * C0` in f64, with beta = 0 ignoring C0.
fn naive(
    alpha: f64,
    a: impl Fn(usize, usize) -> f64,
    b: impl Fn(usize, usize) -> f64,
    beta: f64,
    c0: impl Fn(usize, usize) -> f64,
    (m, n, k): (usize, usize, usize),
) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k).map(|p| a(i, p) * b(p, j)).sum();
            out[i * n + j] = alpha * dot + if beta == 0.0 { 0.0 } else { beta * c0(i, j) };
        }
    }
    out
}

#[derive(Clone, Debug)]
struct Case {
    m: usize,
    n: usize,
    k: usize,
    sa: Storage,
    sb: Storage,
    sc: Storage,
    alpha: f64,
    beta: f64,
    seed: u64,
}

fn case_strategy(max: usize) -> impl Strategy<Value = Case> {
    (
        (0..=max, 0..=max, 0..=max),
        (0..4usize, 0..4usize, 0..4usize),
        prop::sample::select(vec![1.0, 0.5, -2.0, 0.0]),
        prop::sample::select(vec![0.0, 1.0, -0.75]),
        any::<u64>(),
    )
        .prop_map(|((m, n, k), (sa, sb, sc), alpha, beta, seed)| Case {
            m,
            n,
            k,
            sa: STORAGES[sa],
            sb: STORAGES[sb],
            sc: STORAGES[sc],
            alpha,
            beta,
            seed,
        })
}

/// Options that exercise every code path: each supported kernel (for bf16
/// both the AVX512-BF16 one and the ones that widen to f32), small blocks
/// (several blocks per loop; an odd depth block, which bf16 pairs round up),
/// forced threads.
fn option_sets() -> Vec<GemmOptions> {
    let mut sets = vec![GemmOptions::default()];
    for kernel in KernelChoice::supported() {
        sets.push(GemmOptions { kernel, parallelism: Parallelism::Sequential, blocking: None });
        sets.push(GemmOptions {
            kernel,
            parallelism: Parallelism::Threads(3),
            blocking: Some(Blocking { mc: 16, kc: 8, nc: 24 }),
        });
        sets.push(GemmOptions {
            kernel,
            parallelism: Parallelism::Sequential,
            blocking: Some(Blocking { mc: 40, kc: 7, nc: 30 }),
        });
    }
    sets
}

fn check_f32(case: &Case, options: &GemmOptions) -> Result<(), TestCaseError> {
    let Case { m, n, k, seed, .. } = *case;
    let a = Stored::new(m, k, case.sa, f32::NAN, |i, j| value(seed, i, j) as f32);
    let b = Stored::new(k, n, case.sb, f32::NAN, |i, j| value(seed + 1, i, j) as f32);
    // C starts as NaN where beta = 0: BLAS semantics must ignore it.
    let c_init = |i, j| if case.beta == 0.0 { f32::NAN } else { value(seed + 2, i, j) as f32 };
    let mut c = Stored::new(m, n, case.sc, -7.0f32, c_init);
    let want = naive(
        case.alpha,
        |i, j| a.at(i, j) as f64,
        |i, j| b.at(i, j) as f64,
        case.beta,
        |i, j| c.at(i, j) as f64,
        (m, n, k),
    );
    gemm_with(options, case.alpha as f32, a.view(), b.view(), case.beta as f32, c.view_mut()).unwrap();
    let tol = 1e-5 * (k as f64 + 1.0) * (case.alpha.abs() + 1.0);
    for i in 0..m {
        for j in 0..n {
            let got = c.at(i, j) as f64;
            prop_assert!(
                (got - want[i * n + j]).abs() <= tol,
                "({i},{j}) got {got}, want {} with {options:?}",
                want[i * n + j]
            );
        }
    }
    // Elements of the buffer outside the view are untouched.
    let inside: usize = m * n;
    let untouched = c.buf.iter().filter(|&&x| x == -7.0).count();
    prop_assert_eq!(untouched, c.buf.len() - inside);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn f32_matches_naive_on_every_path(case in case_strategy(70)) {
        for options in option_sets() {
            check_f32(&case, &options)?;
        }
    }

    #[test]
    fn bf16_matches_f64_reference_on_every_path(case in case_strategy(70)) {
        for options in option_sets() {
            check_bf16(&case, &options)?;
        }
    }

    #[test]
    fn f64_matches_naive(case in case_strategy(50)) {
        let Case { m, n, k, seed, .. } = case;
        let a = Stored::new(m, k, case.sa, f64::NAN, |i, j| value(seed, i, j));
        let b = Stored::new(k, n, case.sb, f64::NAN, |i, j| value(seed + 1, i, j));
        let c_init = |i, j| if case.beta == 0.0 { f64::NAN } else { value(seed + 2, i, j) };
        let want = {
            let c = Stored::new(m, n, case.sc, 0.0, c_init);
            naive(case.alpha, |i, j| a.at(i, j), |i, j| b.at(i, j), case.beta, |i, j| c.at(i, j), (m, n, k))
        };
        for options in option_sets() {
            let mut c = Stored::new(m, n, case.sc, 0.0, c_init);
            gemm_with(&options, case.alpha, a.view(), b.view(), case.beta, c.view_mut()).unwrap();
            for i in 0..m {
                for j in 0..n {
                    let got = c.at(i, j);
                    prop_assert!((got - want[i * n + j]).abs() <= 1e-12 * (k as f64 + 1.0) * 3.0,
                        "({i},{j}) got {got}, want {} with {options:?}", want[i * n + j]);
                }
            }
        }
    }

    #[test]
    fn f16_matches_naive_within_rounding(case in case_strategy(40)) {
        let Case { m, n, k, seed, .. } = case;
        let av = |i, j| value(seed, i, j);
        let bv = |i, j| value(seed + 1, i, j);
        let cv = |i, j| if case.beta == 0.0 { f64::NAN } else { value(seed + 2, i, j) };

        let a = Stored::new(m, k, case.sa, f16::NAN, |i, j| f16::from_f64(av(i, j)));
        let b = Stored::new(k, n, case.sb, f16::NAN, |i, j| f16::from_f64(bv(i, j)));
        let mut c = Stored::new(m, n, case.sc, f16::ZERO, |i, j| f16::from_f64(cv(i, j)));
        let want = naive(case.alpha, |i, j| a.at(i, j).to_f64(), |i, j| b.at(i, j).to_f64(),
            case.beta, |i, j| c.at(i, j).to_f64(), (m, n, k));
        gemm_f16(case.alpha as f32, a.view(), b.view(), case.beta as f32, c.view_mut()).unwrap();
        for i in 0..m {
            for j in 0..n {
                let (got, w) = (c.at(i, j).to_f64(), want[i * n + j]);
                // One f16 rounding of the result, plus f32 accumulation.
                prop_assert!((got - w).abs() <= w.abs() * 1e-3 + 1e-4 * (k as f64 + 1.0), "f16 ({i},{j}) {got} vs {w}");
            }
        }
    }

    #[test]
    fn agrees_with_matrixmultiply(m in 1usize..90, n in 1usize..90, k in 1usize..90, seed in any::<u64>()) {
        let a: Vec<f32> = (0..m * k).map(|x| value(seed, x, 0) as f32).collect();
        let b: Vec<f32> = (0..k * n).map(|x| value(seed, 0, x) as f32).collect();
        let mut ours = vec![0.0f32; m * n];
        let mut theirs = vec![0.0f32; m * n];
        gemm_f32(1.0, MatRef::row_major(&a, m, k).unwrap(), MatRef::row_major(&b, k, n).unwrap(), 0.0,
            MatMut::row_major(&mut ours, m, n).unwrap()).unwrap();
        // SAFETY: the pointers and strides describe the vectors above.
        unsafe {
            matrixmultiply::sgemm(m, k, n, 1.0, a.as_ptr(), k as isize, 1, b.as_ptr(), n as isize, 1,
                0.0, theirs.as_mut_ptr(), n as isize, 1);
        }
        for (x, y) in ours.iter().zip(&theirs) {
            prop_assert!((x - y).abs() <= 1e-5 * k as f32, "{x} vs {y}");
        }
    }
}

#[test]
fn larger_than_one_block_in_every_loop() {
    // 300 x 290 x 530 crosses the default kc and mc and leaves edge tiles,
    // with all three storage orders of C and a transposed A.
    let (m, n, k) = (300, 290, 530);
    for sc in [Storage::RowMajor, Storage::ColMajor, Storage::Strided] {
        let case =
            Case { m, n, k, sa: Storage::ColMajor, sb: Storage::RowMajor, sc, alpha: 1.5, beta: -0.75, seed: 42 };
        check_f32(&case, &GemmOptions::default()).unwrap();
        check_f32(&case, &GemmOptions { parallelism: Parallelism::Threads(2), ..GemmOptions::default() }).unwrap();
    }
}

#[test]
fn zero_sized_dimensions() {
    // k = 0: C = beta * C.
    let a: [f32; 0] = [];
    let mut c = [2.0f32, f32::NAN, 4.0, 5.0];
    let av = MatRef::row_major(&a, 2, 0).unwrap();
    let bv = MatRef::row_major(&a, 0, 2).unwrap();
    gemm_f32(1.0, av, bv, 0.5, MatMut::row_major(&mut c, 2, 2).unwrap()).unwrap();
    assert_eq!(&c[..1], &[1.0]);
    assert!(c[1].is_nan());
    assert_eq!(&c[2..], &[2.0, 2.5]);
    gemm_f32(1.0, av, bv, 0.0, MatMut::row_major(&mut c, 2, 2).unwrap()).unwrap();
    assert_eq!(c, [0.0; 4]);
    // m = 0 or n = 0: nothing to do, nothing touched.
    let x = [1.0f32; 6];
    let mut empty: [f32; 0] = [];
    gemm_f32(
        1.0,
        MatRef::row_major(&x, 0, 3).unwrap(),
        MatRef::row_major(&x, 3, 2).unwrap(),
        0.0,
        MatMut::row_major(&mut empty, 0, 2).unwrap(),
    )
    .unwrap();
    gemm_f32(
        1.0,
        MatRef::row_major(&x, 2, 3).unwrap(),
        MatRef::row_major(&x, 3, 0).unwrap(),
        0.0,
        MatMut::row_major(&mut empty, 2, 0).unwrap(),
    )
    .unwrap();
}

#[test]
fn one_by_one() {
    let mut c = [10.0f64];
    gemm_f64(
        2.0,
        MatRef::row_major(&[3.0], 1, 1).unwrap(),
        MatRef::row_major(&[4.0], 1, 1).unwrap(),
        0.5,
        MatMut::row_major(&mut c, 1, 1).unwrap(),
    )
    .unwrap();
    assert_eq!(c, [29.0]);
}

#[test]
fn alpha_zero_scales_c_without_reading_a_or_b() {
    let a = [f32::NAN; 6];
    let mut c = [1.0f32, 2.0, 3.0, 4.0];
    gemm_f32(
        0.0,
        MatRef::row_major(&a, 2, 3).unwrap(),
        MatRef::row_major(&a, 3, 2).unwrap(),
        3.0,
        MatMut::row_major(&mut c, 2, 2).unwrap(),
    )
    .unwrap();
    assert_eq!(c, [3.0, 6.0, 9.0, 12.0]);
}

#[test]
fn batched_with_broadcast_matches_single_products() {
    let (batch, m, n, k) = (5, 13, 17, 9);
    let a: Vec<f32> = (0..batch * m * k).map(|x| value(1, x, 0) as f32).collect();
    let w: Vec<f32> = (0..k * n).map(|x| value(2, x, 0) as f32).collect(); // one B for all
    let mut c = vec![f32::NAN; batch * m * n];
    let av = BatchRef::new(&a, 0, [batch, m, k], [m * k, k, 1]).unwrap();
    let bv = BatchRef::new(&w, 0, [batch, k, n], [0, n, 1]).unwrap();
    batched_gemm_f32(1.0, av, bv, 0.0, BatchMut::new(&mut c, 0, [batch, m, n], [m * n, n, 1]).unwrap()).unwrap();
    for t in 0..batch {
        let mut single = vec![0.0f32; m * n];
        gemm_f32(
            1.0,
            MatRef::row_major(&a[t * m * k..], m, k).unwrap(),
            MatRef::row_major(&w, k, n).unwrap(),
            0.0,
            MatMut::row_major(&mut single, m, n).unwrap(),
        )
        .unwrap();
        assert_eq!(&c[t * m * n..(t + 1) * m * n], &single[..], "batch {t}");
    }
    // A batch of one also broadcasts; run across the batch on threads.
    let mut c2 = vec![0.0f32; batch * m * n];
    let one_b = BatchRef::new(&w, 0, [1, k, n], [0, n, 1]).unwrap();
    for parallelism in [Parallelism::Auto, Parallelism::Sequential, Parallelism::Threads(2)] {
        let options = GemmOptions { parallelism, ..GemmOptions::default() };
        batched_gemm_with(
            &options,
            1.0,
            av,
            one_b,
            0.0,
            BatchMut::new(&mut c2, 0, [batch, m, n], [m * n, n, 1]).unwrap(),
        )
        .unwrap();
        assert_eq!(c, c2);
    }
}

#[test]
fn many_small_matrices_run_across_the_batch() {
    // 300 products of 24^3: each below the threshold for threads, together
    // above it, so `Auto` spreads the batch over the pool.
    let (batch, m, n, k) = (300, 24, 24, 24);
    let a: Vec<f64> = (0..batch * m * k).map(|x| value(5, x, 0)).collect();
    let b: Vec<f64> = (0..batch * k * n).map(|x| value(6, x, 0)).collect();
    let mut c = vec![f64::NAN; batch * m * n];
    let av = BatchRef::new(&a, 0, [batch, m, k], [m * k, k, 1]).unwrap();
    let bv = BatchRef::new(&b, 0, [batch, k, n], [k * n, 1, k]).unwrap(); // column-major B
    batched_gemm_with(
        &GemmOptions::default(),
        2.0,
        av,
        bv,
        0.0,
        BatchMut::new(&mut c, 0, [batch, m, n], [m * n, n, 1]).unwrap(),
    )
    .unwrap();
    for t in (0..batch).step_by(37) {
        for i in 0..m {
            for j in 0..n {
                let want: f64 = 2.0 * (0..k).map(|p| a[t * m * k + i * k + p] * b[t * k * n + j * k + p]).sum::<f64>();
                assert!((c[t * m * n + i * n + j] - want).abs() < 1e-12, "{t} ({i},{j})");
            }
        }
    }
}

#[test]
fn half_types_on_every_path() {
    // Several depth blocks (k = 41 > kc = 8) and threads, for the f32
    // workspace path of f16 and bf16.
    let (m, n, k) = (37, 29, 41);
    for options in option_sets() {
        let a = Stored::new(m, k, Storage::RowMajor, bf16::NAN, |i, j| bf16::from_f64(value(7, i, j)));
        let b = Stored::new(k, n, Storage::ColMajor, bf16::NAN, |i, j| bf16::from_f64(value(8, i, j)));
        let mut c = Stored::new(m, n, Storage::Strided, bf16::ZERO, |i, j| bf16::from_f64(value(9, i, j)));
        let want = naive(
            1.0,
            |i, j| a.at(i, j).to_f64(),
            |i, j| b.at(i, j).to_f64(),
            0.5,
            |i, j| c.at(i, j).to_f64(),
            (m, n, k),
        );
        gemm_with(&options, 1.0, a.view(), b.view(), 0.5, c.view_mut()).unwrap();
        let a16 = Stored::new(m, k, Storage::ColMajor, f16::NAN, |i, j| f16::from_f64(value(7, i, j)));
        let b16 = Stored::new(k, n, Storage::RowMajor, f16::NAN, |i, j| f16::from_f64(value(8, i, j)));
        let mut c16 = Stored::new(m, n, Storage::RowMajor, f16::NAN, |_, _| f16::NAN);
        let want16 = naive(1.0, |i, j| a16.at(i, j).to_f64(), |i, j| b16.at(i, j).to_f64(), 0.0, |_, _| 0.0, (m, n, k));
        gemm_with(&options, 1.0, a16.view(), b16.view(), 0.0, c16.view_mut()).unwrap();
        for i in 0..m {
            for j in 0..n {
                let (got, w) = (c.at(i, j).to_f64(), want[i * n + j]);
                assert!((got - w).abs() <= w.abs() * 8e-3 + 1e-3, "bf16 ({i},{j}) {got} vs {w} {options:?}");
                let (got, w) = (c16.at(i, j).to_f64(), want16[i * n + j]);
                assert!((got - w).abs() <= w.abs() * 1e-3 + 1e-3, "f16 ({i},{j}) {got} vs {w} {options:?}");
            }
        }
    }
}

#[test]
fn batched_transposed_bf16() {
    // C[t] = A[t] * B[t]^T with B stored row-major n x k: the backward shape.
    let (batch, m, n, k) = (3, 8, 6, 20);
    let a: Vec<bf16> = (0..batch * m * k).map(|x| bf16::from_f64(value(3, x, 0))).collect();
    let b: Vec<bf16> = (0..batch * n * k).map(|x| bf16::from_f64(value(4, x, 0))).collect();
    let mut c = vec![bf16::ZERO; batch * m * n];
    let av = BatchRef::new(&a, 0, [batch, m, k], [m * k, k, 1]).unwrap();
    let bv = BatchRef::new(&b, 0, [batch, n, k], [n * k, k, 1]).unwrap().t();
    batched_gemm_bf16(1.0, av, bv, 0.0, BatchMut::new(&mut c, 0, [batch, m, n], [m * n, n, 1]).unwrap()).unwrap();
    for t in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let want: f64 =
                    (0..k).map(|p| a[t * m * k + i * k + p].to_f64() * b[t * n * k + j * k + p].to_f64()).sum();
                let got = c[t * m * n + i * n + j].to_f64();
                assert!((got - want).abs() <= want.abs() * 8e-3 + 1e-3, "{t} ({i},{j}) {got} vs {want}");
            }
        }
    }
}

#[test]
fn bad_input_is_an_error() {
    let x = [0.0f32; 64];
    let mut y = [0.0f32; 64];
    // Inner dimensions differ.
    let err = gemm_f32(
        1.0,
        MatRef::row_major(&x, 2, 3).unwrap(),
        MatRef::row_major(&x, 4, 2).unwrap(),
        0.0,
        MatMut::row_major(&mut y, 2, 2).unwrap(),
    )
    .unwrap_err();
    assert!(matches!(err, KernelError::ShapeMismatch { .. }), "{err}");
    assert!(err.to_string().contains("a is 2x3, b is 4x2"), "{err}");
    // C of the wrong shape.
    assert!(gemm_f32(
        1.0,
        MatRef::row_major(&x, 2, 3).unwrap(),
        MatRef::row_major(&x, 3, 2).unwrap(),
        0.0,
        MatMut::row_major(&mut y, 3, 2).unwrap()
    )
    .is_err());
    // A view past the end of its slice, an aliased output.
    assert!(matches!(MatRef::row_major(&x, 9, 8), Err(KernelError::OutOfBounds { required: 72, len: 64, .. })));
    assert!(matches!(MatMut::new(&mut y, 0, [4, 4], [1, 1]), Err(KernelError::OverlappingOutput { .. })));
    // Zero blocking.
    let options = GemmOptions { blocking: Some(Blocking { mc: 0, kc: 8, nc: 8 }), ..GemmOptions::default() };
    assert!(matches!(
        gemm_with(
            &options,
            1.0,
            MatRef::row_major(&x, 2, 2).unwrap(),
            MatRef::row_major(&x, 2, 2).unwrap(),
            0.0,
            MatMut::row_major(&mut y, 2, 2).unwrap()
        ),
        Err(KernelError::InvalidBlocking { .. })
    ));
    // Batch counts that neither match nor broadcast.
    let a = BatchRef::new(&x, 0, [3, 2, 2], [4, 2, 1]).unwrap();
    let b = BatchRef::new(&x, 0, [2, 2, 2], [4, 2, 1]).unwrap();
    let c = BatchMut::new(&mut y, 0, [3, 2, 2], [4, 2, 1]).unwrap();
    assert!(matches!(batched_gemm_f32(1.0, a, b, 0.0, c), Err(KernelError::ShapeMismatch { .. })));
    // A kernel this CPU lacks, where there is one.
    for kernel in [KernelChoice::Avx512, KernelChoice::Avx2Fma] {
        let options = GemmOptions { kernel, ..GemmOptions::default() };
        let r = gemm_with(
            &options,
            1.0,
            MatRef::row_major(&x, 2, 2).unwrap(),
            MatRef::row_major(&x, 2, 2).unwrap(),
            0.0,
            MatMut::row_major(&mut y, 2, 2).unwrap(),
        );
        assert_eq!(r.is_ok(), kernel.is_supported());
    }
}

/// A bf16 pattern no product writes (a signalling NaN with a payload): marks
/// buffer elements outside C's view.
const BF16_OUTSIDE: u16 = 0x7fa5;

/// Checks a bf16 product against an f64 reference from the same bf16
/// inputs. Products of bf16 are exact in f32 and accumulate in f32, and C
/// is rounded once to bf16: the error is at most half a bf16 ulp of the
/// result (2^-8 of it) plus the f32 accumulation error, a few f32 ulps of
/// the magnitude sum `|alpha| sum |a b| + |beta c|` per term.
fn check_bf16(case: &Case, options: &GemmOptions) -> Result<(), TestCaseError> {
    let Case { m, n, k, seed, .. } = *case;
    let a = Stored::new(m, k, case.sa, bf16::NAN, |i, j| bf16::from_f64(value(seed, i, j)));
    let b = Stored::new(k, n, case.sb, bf16::NAN, |i, j| bf16::from_f64(value(seed + 1, i, j)));
    // C starts as NaN where beta = 0: BLAS semantics must ignore it.
    let c_init = |i, j| if case.beta == 0.0 { bf16::NAN } else { bf16::from_f64(value(seed + 2, i, j)) };
    let mut c = Stored::new(m, n, case.sc, bf16::from_bits(BF16_OUTSIDE), c_init);
    let (a64, b64, c64) = (|i, j| a.at(i, j).to_f64(), |i, j| b.at(i, j).to_f64(), |i, j| c.at(i, j).to_f64());
    let want = naive(case.alpha, a64, b64, case.beta, c64, (m, n, k));
    let magnitude = naive(
        case.alpha.abs(),
        |i, j| a64(i, j).abs(),
        |i, j| b64(i, j).abs(),
        case.beta.abs(),
        |i, j| c64(i, j).abs(),
        (m, n, k),
    );
    let (alpha, beta) = (case.alpha as f32, case.beta as f32);
    if *options == GemmOptions::default() {
        gemm_bf16(alpha, a.view(), b.view(), beta, c.view_mut()).unwrap();
    } else {
        gemm_with(options, alpha, a.view(), b.view(), beta, c.view_mut()).unwrap();
    }
    for i in 0..m {
        for j in 0..n {
            let (got, w, mag) = (c.at(i, j).to_f64(), want[i * n + j], magnitude[i * n + j]);
            let tol = w.abs() / 256.0 + mag * (k as f64 + 2.0) * 2f64.powi(-22);
            prop_assert!((got - w).abs() <= tol, "({i},{j}) got {got}, want {w} (tol {tol:e}) {case:?} {options:?}");
        }
    }
    let untouched = c.buf.iter().filter(|x| x.to_bits() == BF16_OUTSIDE).count();
    prop_assert_eq!(untouched, c.buf.len() - m * n, "elements outside the view were written");
    Ok(())
}

#[test]
fn bf16_dispatch_follows_the_cpu() {
    #[cfg(target_arch = "x86_64")]
    {
        let native = std::arch::is_x86_feature_detected!("avx512bf16")
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw");
        assert_eq!(KernelChoice::Avx512Bf16.is_supported(), native);
        let auto = KernelChoice::Auto.resolve();
        assert_eq!(matches!(auto, KernelChoice::Avx512Bf16 | KernelChoice::AmxBf16), native);
        // AMX only where AVX512-BF16 is too (its small products run there).
        assert!(!KernelChoice::AmxBf16.is_supported() || native);
    }
    // Forcing the AVX512-BF16 kernel is an error exactly where it is missing.
    let x = [bf16::ONE; 4];
    let mut y = [bf16::ZERO; 4];
    let options = GemmOptions { kernel: KernelChoice::Avx512Bf16, ..GemmOptions::default() };
    let r = gemm_with(
        &options,
        1.0,
        MatRef::row_major(&x, 2, 2).unwrap(),
        MatRef::row_major(&x, 2, 2).unwrap(),
        0.0,
        MatMut::row_major(&mut y, 2, 2).unwrap(),
    );
    assert_eq!(r.is_ok(), KernelChoice::Avx512Bf16.is_supported());
    if r.is_ok() {
        assert_eq!(y, [bf16::from_f32(2.0); 4]);
    } else {
        assert!(matches!(r, Err(KernelError::UnsupportedKernel { .. })));
    }
}

#[test]
fn bf16_edge_shapes_on_every_path() {
    // Rows around the 32-row tile, columns around the 12-column one, depths
    // of one, odd and even pair counts; every storage, alpha and beta.
    let mut seed = 0u64;
    for m in [1, 2, 15, 32, 33, 65] {
        for n in [1, 11, 12, 13, 25] {
            for k in [1, 2, 3, 17, 64, 257] {
                seed += 1;
                let s = seed as usize;
                let case = Case {
                    m,
                    n,
                    k,
                    sa: STORAGES[s % 4],
                    sb: STORAGES[(s / 4) % 4],
                    sc: STORAGES[(s / 16) % 4],
                    alpha: [1.0, -2.0, 0.5][s % 3],
                    beta: [0.0, 1.0, -0.75][(s / 3) % 3],
                    seed,
                };
                for options in option_sets() {
                    check_bf16(&case, &options).unwrap();
                }
            }
        }
    }
}

#[test]
fn bf16_edges_of_products_large_enough_for_tiles() {
    // Above the AMX threshold (2 MFLOP), with edges around its 32 x 32
    // tile and 32-deep steps: on AMX CPUs these run on tiles, elsewhere on
    // the other kernels, against the same f64 reference.
    let shapes = [(65, 70, 257), (100, 33, 400), (16, 260, 300), (130, 130, 65), (47, 47, 511)];
    for (s, (m, n, k)) in shapes.into_iter().enumerate() {
        let case = Case {
            m,
            n,
            k,
            sa: STORAGES[s % 4],
            sb: STORAGES[(s + 1) % 4],
            sc: STORAGES[(s + 2) % 4],
            alpha: [1.0, -2.0, 0.5][s % 3],
            beta: [0.0, 1.0, -0.75][s % 3],
            seed: 40 + s as u64,
        };
        for options in option_sets() {
            check_bf16(&case, &options).unwrap();
        }
    }
}

#[test]
fn bf16_larger_than_one_block_in_every_loop() {
    // Depth 1100 crosses the bf16 kernel's 512-deep blocks; rows cross mc.
    for sc in [Storage::RowMajor, Storage::ColMajor] {
        let case = Case {
            m: 300,
            n: 290,
            k: 1100,
            sa: Storage::ColMajor,
            sb: Storage::RowMajor,
            sc,
            alpha: 1.5,
            beta: -0.75,
            seed: 9,
        };
        for kernel in KernelChoice::supported() {
            for parallelism in [Parallelism::Auto, Parallelism::Sequential] {
                check_bf16(&case, &GemmOptions { kernel, parallelism, blocking: None }).unwrap();
            }
        }
    }
}

#[test]
fn bf16_is_rounded_once_from_exact_f32_sums() {
    // Values with three significant bits: every product and partial sum is
    // exact in f32, so each path must give the exact result rounded once to
    // bf16 (ties to even), bit for bit, even when its depth blocks add into
    // C one after another. A partial sum rounded to bf16 would show.
    let v = |i: usize, j: usize, salt: usize| bf16::from_f32(((i * 7 + j * 3 + salt) % 17) as f32 / 8.0 - 1.0);
    // The last shape is large enough for AMX tiles where the CPU has them.
    let shapes = [(33, 13, 301), (5, 40, 64), (64, 12, 1), (40, 25, 9), (64, 40, 600)];
    for (s, (m, n, k)) in shapes.into_iter().enumerate() {
        let a = Stored::new(m, k, STORAGES[s % 4], bf16::NAN, |i, j| v(i, j, 0));
        let b = Stored::new(k, n, STORAGES[(s + 1) % 4], bf16::NAN, |i, j| v(i, j, 5));
        let c0 = Stored::new(m, n, Storage::RowMajor, bf16::NAN, |i, j| v(i, j, 11));
        let exact = naive(
            0.5,
            |i, j| a.at(i, j).to_f64(),
            |i, j| b.at(i, j).to_f64(),
            0.25,
            |i, j| c0.at(i, j).to_f64(),
            (m, n, k),
        );
        for options in option_sets() {
            let mut c = Stored::new(m, n, STORAGES[(s + 2) % 4], bf16::NAN, |i, j| c0.at(i, j));
            gemm_with(&options, 0.5, a.view(), b.view(), 0.25, c.view_mut()).unwrap();
            for i in 0..m {
                for j in 0..n {
                    let want = bf16::from_f32(exact[i * n + j] as f32);
                    assert_eq!(c.at(i, j).to_bits(), want.to_bits(), "{m}x{n}x{k} ({i},{j}) {options:?}");
                }
            }
        }
    }
}

#[test]
fn batched_bf16_on_every_path() {
    // A batch of row-major A times one B broadcast to every index (batch
    // stride 0) and stored as its transpose, into a padded C; odd depth.
    let (batch, m, n, k) = (4, 19, 14, 23);
    let a: Vec<bf16> = (0..batch * m * k).map(|x| bf16::from_f64(value(11, x, 0))).collect();
    let w: Vec<bf16> = (0..n * k).map(|x| bf16::from_f64(value(12, x, 0))).collect();
    let c_rs = n + 3;
    let c_init: Vec<bf16> = (0..batch * m * c_rs).map(|x| bf16::from_f64(value(13, x, 0))).collect();
    let (alpha, beta) = (-1.5f32, 0.5f32);
    for options in option_sets() {
        let mut c = c_init.clone();
        let av = BatchRef::new(&a, 0, [batch, m, k], [m * k, k, 1]).unwrap();
        let bv = BatchRef::new(&w, 0, [batch, n, k], [0, k, 1]).unwrap().t();
        let cv = BatchMut::new(&mut c, 0, [batch, m, n], [m * c_rs, c_rs, 1]).unwrap();
        batched_gemm_with(&options, alpha, av, bv, beta, cv).unwrap();
        for t in 0..batch {
            for i in 0..m {
                for j in 0..c_rs {
                    let at = t * m * c_rs + i * c_rs + j;
                    if j >= n {
                        assert_eq!(c[at], c_init[at], "padding written at {t} ({i},{j})");
                        continue;
                    }
                    let terms = (0..k).map(|p| a[t * m * k + i * k + p].to_f64() * w[j * k + p].to_f64());
                    let (dot, mag) = terms.fold((0.0, 0.0), |(s, g), x| (s + x, g + x.abs()));
                    let want = alpha as f64 * dot + beta as f64 * c_init[at].to_f64();
                    let mag = alpha.abs() as f64 * mag + beta.abs() as f64 * c_init[at].to_f64().abs();
                    let tol = want.abs() / 256.0 + mag * (k as f64 + 2.0) * 2f64.powi(-22);
                    let got = c[at].to_f64();
                    assert!((got - want).abs() <= tol, "{t} ({i},{j}) {got} vs {want} {options:?}");
                }
            }
        }
    }
}
