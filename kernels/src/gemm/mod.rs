//! Matrix products: `C = alpha * A * B + beta * C` for f32, f64, f16 and bf16,
//! single or batched, on any strided views.
//!
//! The operands are [`MatRef`] / [`MatMut`] views (a slice, an offset, a
//! shape and strides), so a transposed or strided operand is passed as a view
//! and never copied by the caller: packing reads it in whatever order it is
//! stored. f16 and bf16 operands accumulate in f32 and their C is rounded
//! once, at the end: f16 ones (and bf16 ones on CPUs without AVX512-BF16)
//! are widened to f32 while they are packed; bf16 ones on CPUs with it stay
//! bf16, packed in pairs for its dot-product instruction.
//! [`gemm_into_f32_with`] keeps such a C in f32 (no rounding at all).
//!
//! `beta == 0` follows BLAS: C is overwritten without being read, so NaN or
//! infinity already in C does not reach the result.
//!
//! The work is BLIS's: packed panels sized for the caches ([`Blocking`]),
//! a register-blocked micro-kernel picked at run time for the CPU
//! ([`KernelChoice`]), and rayon threads over disjoint parts of C for
//! products large enough to pay for them ([`Parallelism`]).
//!
//! On CPUs with AMX (Sapphire Rapids and later Xeons), bf16 products large
//! enough to pay for it run on AMX tiles instead, with their own packing and
//! a 32 x 32 tile of C held in tile registers over the whole depth
//! ([`KernelChoice::AmxBf16`]).

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod amx_pack;
#[cfg(target_arch = "x86_64")]
mod amx_tile;
mod blocking;
mod buffer;
mod driver;
mod element;
mod into_f32;
mod matrix;
mod microkernel;
#[cfg(target_arch = "x86_64")]
mod microkernel_avx2;
#[cfg(target_arch = "x86_64")]
mod microkernel_avx512;
mod microkernel_portable;
#[cfg(target_arch = "x86_64")]
mod microkernel_x86;
mod pack;
#[cfg(target_arch = "x86_64")]
mod pack_avx2;
#[cfg(target_arch = "x86_64")]
mod pack_avx512;
#[cfg(target_arch = "x86_64")]
mod pack_simd;
mod parallel;
mod product;
#[cfg(test)]
mod test_values;

#[cfg(target_arch = "x86_64")]
pub(crate) use amx_tile::amx_peak_thread;
pub use blocking::Blocking;
pub use into_f32::{gemm_into_f32_with, GemmIntoF32};
pub use matrix::{BatchMut, BatchRef, MatMut, MatRef};
pub use microkernel::KernelChoice;

use crate::error::{KernelError, Result};
use buffer::{try_with_buffer, Slot, MAX_CACHED_WORKSPACE};
use element::{Bf16Pair, Compute, Narrow, PackSource, Packed};
use half::{bf16, f16};
use matrix::RawMut;
use microkernel::{select, HasMicroKernels};
use pack::PackInto;
use product::{Plan, Product};
use rayon::prelude::*;

/// Products below this many floating-point operations (`2 m n k`) of f32
/// work run on one thread: handing work to the pool's threads and waiting
/// for them costs tens of microseconds when they have gone to sleep between
/// ops (more in a virtual machine), more than such products gain. Faster
/// kernels count their flops as less work (`parallel_worth`). Measured with
/// the `deep_mlp` workload (`brasa-bench --workload-worker deep_mlp:f32`,
/// 128 x 256 x 256 products of 16.8 MFLOP, 2-core AMD EPYC): 2 threads win
/// in f32 (26-31K against 24-25K samples/s); in bf16, whose kernel is twice
/// as fast, one thread wins (37K against 26-28K). `gemm_tune`, which calls
/// its products back to back and so finds the threads awake, shows gains
/// from 2 threads at a quarter of this.
pub const PARALLEL_THRESHOLD_FLOPS: usize = 16_000_000;

/// Batches of independent products below [`PARALLEL_THRESHOLD_FLOPS`] in
/// all still go to the pool's threads, whole matrices each, from this much
/// work on: unlike one product shared out, they need no synchronisation
/// between the threads inside the call, so only the fork and join are paid.
/// Attention's per-head products (`train_gpt`'s CPU configuration: 48
/// products of 64 x 64 x 32, 12.6 MFLOP per call) ran on one core below
/// the shared-product threshold.
pub const PARALLEL_BATCH_THRESHOLD_FLOPS: usize = 4_000_000;

/// Whether `flops` on a kernel `speed_vs_f32` times as fast as the f32 one
/// are worth the pool's threads: at least [`PARALLEL_THRESHOLD_FLOPS`] of
/// f32-equivalent work.
pub(crate) fn parallel_worth(flops: usize, speed_vs_f32: usize) -> bool {
    flops / speed_vs_f32.max(1) >= PARALLEL_THRESHOLD_FLOPS
}

/// [`parallel_worth`] for a batch of independent products of `flops` in
/// all, shared out whole: [`PARALLEL_BATCH_THRESHOLD_FLOPS`].
pub(crate) fn batch_parallel_worth(flops: usize, speed_vs_f32: usize) -> bool {
    flops / speed_vs_f32.max(1) >= PARALLEL_BATCH_THRESHOLD_FLOPS
}

/// How many threads a product may use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Parallelism {
    /// All threads of the current rayon pool, for products of at least
    /// [`PARALLEL_THRESHOLD_FLOPS`] of f32-equivalent work (a bf16 product on
    /// the dot-product instruction counts half its flops, on AMX tiles a
    /// quarter); one thread below that, except that a batch of matrices
    /// with [`PARALLEL_BATCH_THRESHOLD_FLOPS`] in all shares its matrices
    /// out to the threads.
    #[default]
    Auto,
    /// The calling thread only.
    Sequential,
    /// Up to this many parts on the current rayon pool, whatever the size.
    Threads(usize),
}

/// Knobs of a product; `GemmOptions::default()` is what [`gemm_f32`] and
/// friends use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GemmOptions {
    /// Threading.
    pub parallelism: Parallelism,
    /// Which micro-kernel runs; forcing one the CPU lacks is an error.
    pub kernel: KernelChoice,
    /// Cache blocking; `None` takes the kernel's measured default.
    pub blocking: Option<Blocking>,
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// An element type the products support: f32, f64, f16, bf16.
pub trait GemmElement: Copy + Send + Sync + 'static + sealed::Sealed {
    /// Type of `alpha`, `beta` and of the accumulation: f64 for f64, f32
    /// otherwise.
    type Scalar: Copy + Send + Sync + 'static;

    #[doc(hidden)]
    fn batched_impl(
        options: &GemmOptions,
        alpha: Self::Scalar,
        a: BatchRef<'_, Self>,
        b: BatchRef<'_, Self>,
        beta: Self::Scalar,
        c: BatchMut<'_, Self>,
    ) -> Result<()>;
}

/// The per-type entry of the products: the packed type and the output path.
macro_rules! gemm_element {
    ($($t:ty => $scalar:ty, packed $packed:ty, $path:expr;)*) => {$(
        impl GemmElement for $t {
            type Scalar = $scalar;
            fn batched_impl(
                options: &GemmOptions,
                alpha: $scalar,
                a: BatchRef<'_, $t>,
                b: BatchRef<'_, $t>,
                beta: $scalar,
                c: BatchMut<'_, $t>,
            ) -> Result<()> {
                run_batched::<$scalar, $packed, _, _>(options, alpha, a, b, beta, c, $path)
            }
        }
    )*};
}

gemm_element! {
    f32 => f32, packed f32, Direct;
    f64 => f64, packed f64, Direct;
    f16 => f32, packed f32, Widened;
}

impl GemmElement for bf16 {
    type Scalar = f32;
    fn batched_impl(
        options: &GemmOptions,
        alpha: f32,
        a: BatchRef<'_, bf16>,
        b: BatchRef<'_, bf16>,
        beta: f32,
        c: BatchMut<'_, bf16>,
    ) -> Result<()> {
        // All routes accumulate exact products in f32 and round C once.
        match Bf16Route::of(options.kernel.resolve(), c.rows(), c.cols(), a.cols()) {
            #[cfg(target_arch = "x86_64")]
            Bf16Route::Tiles => run_batched::<f32, Bf16Pair, _, _>(options, alpha, a, b, beta, c, WidenedAmx),
            Bf16Route::Pairs => run_batched::<f32, Bf16Pair, _, _>(options, alpha, a, b, beta, c, Widened),
            Bf16Route::Widened => run_batched::<f32, f32, _, _>(options, alpha, a, b, beta, c, Widened),
        }
    }
}

/// Where a bf16 product runs, for a bf16 C and an f32 one alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bf16Route {
    /// AMX tiles ([`KernelChoice::AmxBf16`], products worth them).
    #[cfg(target_arch = "x86_64")]
    Tiles,
    /// bf16 pairs for the AVX512-BF16 dot-product instruction.
    Pairs,
    /// The f32 kernel, operands widened while packed.
    Widened,
}

impl Bf16Route {
    /// The route of an `m x n x k` product under `kernel` (resolved).
    fn of(kernel: KernelChoice, m: usize, n: usize, k: usize) -> Bf16Route {
        match kernel {
            #[cfg(target_arch = "x86_64")]
            KernelChoice::AmxBf16 if amx::worth_tiles(m, n, k) => Bf16Route::Tiles,
            KernelChoice::Avx512Bf16 => Bf16Route::Pairs,
            // CPUs without AVX512-BF16, and AMX CPUs off the tiles: there
            // the f32 kernel beats the dot-product instruction, which runs
            // at half the FMA rate on these Xeons (one core: 0.42-0.47 of
            // the f32 peak against 0.45-0.88 for the f32 kernel on the
            // workloads' small shapes).
            _ => Bf16Route::Widened,
        }
    }
}

/// `C = alpha * A * B + beta * C` with the given options.
///
/// `A` is `m x k`, `B` is `k x n`, `C` is `m x n`; any other shapes are an
/// error, as is a forced kernel this CPU cannot run.
pub fn gemm_with<T: GemmElement>(
    options: &GemmOptions,
    alpha: T::Scalar,
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    beta: T::Scalar,
    c: MatMut<'_, T>,
) -> Result<()> {
    T::batched_impl(options, alpha, a.into(), b.into(), beta, c.into())
}

/// `C = alpha * A * B + beta * C` with default options.
pub fn gemm<T: GemmElement>(
    alpha: T::Scalar,
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    beta: T::Scalar,
    c: MatMut<'_, T>,
) -> Result<()> {
    gemm_with(&GemmOptions::default(), alpha, a, b, beta, c)
}

/// For every batch index `i`: `C[i] = alpha * A[i] * B[i] + beta * C[i]`.
///
/// `A` and `B` either have as many matrices as `C` or one, which is then used
/// for every index (as is any matrix repeated with batch stride 0).
pub fn batched_gemm_with<T: GemmElement>(
    options: &GemmOptions,
    alpha: T::Scalar,
    a: BatchRef<'_, T>,
    b: BatchRef<'_, T>,
    beta: T::Scalar,
    c: BatchMut<'_, T>,
) -> Result<()> {
    T::batched_impl(options, alpha, a, b, beta, c)
}

/// [`batched_gemm_with`] with default options.
pub fn batched_gemm<T: GemmElement>(
    alpha: T::Scalar,
    a: BatchRef<'_, T>,
    b: BatchRef<'_, T>,
    beta: T::Scalar,
    c: BatchMut<'_, T>,
) -> Result<()> {
    batched_gemm_with(&GemmOptions::default(), alpha, a, b, beta, c)
}

/// The per-type functions: `gemm_f32`, `batched_gemm_f32` and so on.
macro_rules! typed_gemm {
    ($($t:ident => $scalar:ty, $single:ident, $batched:ident, $note:literal;)*) => {$(
        #[doc = concat!(stringify!($t), " `C = alpha * A * B + beta * C`", $note, ".")]
        pub fn $single(
            alpha: $scalar,
            a: MatRef<'_, $t>,
            b: MatRef<'_, $t>,
            beta: $scalar,
            c: MatMut<'_, $t>,
        ) -> Result<()> {
            gemm(alpha, a, b, beta, c)
        }

        #[doc = concat!("Batched ", stringify!($t), " product", $note, "; see [`batched_gemm_with`].")]
        pub fn $batched(
            alpha: $scalar,
            a: BatchRef<'_, $t>,
            b: BatchRef<'_, $t>,
            beta: $scalar,
            c: BatchMut<'_, $t>,
        ) -> Result<()> {
            batched_gemm(alpha, a, b, beta, c)
        }
    )*};
}

typed_gemm! {
    f32 => f32, gemm_f32, batched_gemm_f32, "";
    f64 => f64, gemm_f64, batched_gemm_f64, "";
    f16 => f32, gemm_f16, batched_gemm_f16, ", accumulated in f32";
    bf16 => f32, gemm_bf16, batched_gemm_bf16, ", accumulated in f32";
}

/// C of the compute type itself: the kernels write it in place.
struct Direct;

/// C of a narrow type: accumulate in an f32 workspace, round at the end.
struct Widened;

/// A narrow C on AMX tiles, rounded at each tile's store (the bf16
/// dispatch sends only products worth the tiles here).
#[cfg(target_arch = "x86_64")]
struct WidenedAmx;

/// How one product's C of type `S` is reached from the compute type `T`,
/// with operands packed as `P`.
trait OutputPath<T: Compute, P: Packed, S>: Sync {
    fn run(&self, plan: &Plan<T, P>, p: Product<'_, T, S, S>) -> Result<()>;

    /// How many times the f32 kernel's speed this path reaches on an
    /// `m x n x k` product (see [`parallel_worth`]).
    fn speed_vs_f32(&self, _m: usize, _n: usize, _k: usize) -> usize {
        P::SPEED_VS_F32
    }
}

impl<T: Compute + Packed + PackInto<T>> OutputPath<T, T, T> for Direct {
    fn run(&self, plan: &Plan<T, T>, p: Product<'_, T, T>) -> Result<()> {
        driver::gemm(plan, p);
        Ok(())
    }
}

impl<S: Narrow + PackInto<P>, P: Packed> OutputPath<f32, P, S> for Widened {
    fn run(&self, plan: &Plan<f32, P>, p: Product<'_, f32, S, S>) -> Result<()> {
        through_f32_workspace(p, plan.threads, |p| {
            driver::gemm(plan, p);
            Ok(())
        })
    }
}

#[cfg(target_arch = "x86_64")]
impl OutputPath<f32, Bf16Pair, bf16> for WidenedAmx {
    fn run(&self, plan: &Plan<f32, Bf16Pair>, p: Product<'_, f32, bf16, bf16>) -> Result<()> {
        debug_assert!(amx::worth_tiles(p.c.rows, p.c.cols, p.a.cols()));
        amx::gemm(amx_tile::TileKernel::amx(), plan.threads, p)
    }

    fn speed_vs_f32(&self, _m: usize, _n: usize, _k: usize) -> usize {
        amx::SPEED_VS_F32
    }
}

/// Runs `compute` on an f32 workspace standing for the narrow C of `p`:
/// widened from C first when beta is not 0, rounded into C after.
///
/// A C whose workspace would outgrow the cached one is done in bands of
/// whole rows (or columns, for a column-major C) that fit it, each band its
/// own product: a fresh workspace of tens of MiB costs a page fault per
/// 4 KiB on first touch (wide_mlp's 2048 x 3072 weight gradient spent about
/// a third of its time there), more than packing the other operand again
/// for each band.
fn through_f32_workspace<S: Narrow>(
    p: Product<'_, f32, S, S>,
    threads: usize,
    compute: impl Fn(Product<'_, f32, S, f32>) -> Result<()>,
) -> Result<()> {
    let (m, n) = (p.c.rows, p.c.cols);
    let fits = MAX_CACHED_WORKSPACE / size_of::<f32>();
    let row_major = p.c.col_stride == 1 && p.c.row_stride != 1;
    let (bands, band_len) = if row_major { (m, n) } else { (n, m) };
    let per_band = (fits / band_len.max(1)).max(1);
    if per_band >= bands {
        return in_f32_workspace(p, threads, &compute);
    }
    let k = p.a.cols();
    for lo in (0..bands).step_by(per_band) {
        let len = per_band.min(bands - lo);
        let band = if row_major {
            // SAFETY: rows lo..lo + len are inside C.
            let c = unsafe { p.c.sub(lo, 0, len, n) };
            Product { a: p.a.sub(lo, 0, len, k), c, ..p }
        } else {
            // SAFETY: columns lo..lo + len are inside C.
            let c = unsafe { p.c.sub(0, lo, m, len) };
            Product { b: p.b.sub(0, lo, k, len), c, ..p }
        };
        in_f32_workspace(band, threads, &compute)?;
    }
    Ok(())
}

/// A workspace of at least this many elements is widened and rounded on
/// the product's threads (the element-wise ops' threshold for cheap work):
/// one thread rounding wide_mlp's 2048 x 3072 weight gradient took a fifth
/// of the product's time on 2 cores.
const PARALLEL_CONVERT_MIN: usize = 1 << 18;

/// [`through_f32_workspace`] for one band.
fn in_f32_workspace<S: Narrow>(
    p: Product<'_, f32, S, S>,
    threads: usize,
    compute: &impl Fn(Product<'_, f32, S, f32>) -> Result<()>,
) -> Result<()> {
    let (c, beta) = (p.c, p.beta);
    let (m, n) = (c.rows, c.cols);
    if m == 0 || n == 0 {
        return Ok(());
    }
    // The f32 workspace is laid out like C (row- or column-major), so
    // that C's rows (or columns) and the workspace's are both contiguous
    // runs, widened and rounded as slices.
    let row_major = c.col_stride == 1 && c.row_stride != 1;
    let (runs, run_len) = if row_major { (m, n) } else { (n, m) };
    let (run_stride, step) = if row_major { (c.row_stride, c.col_stride) } else { (c.col_stride, c.row_stride) };
    // Runs in groups, a few per thread, when the workspace is large enough.
    let parallel = threads > 1 && m * n >= PARALLEL_CONVERT_MIN;
    let group = if parallel { runs.div_ceil(threads * 4) * run_len } else { runs * run_len };
    // Closures take the whole view (which is Sync), not its raw pointer.
    let out = &c;
    // A cached workspace: with beta = 0 its (stale) contents are unused.
    // It grows with C (twice C's bytes), so it may not be there to have.
    try_with_buffer::<f32, _>(Slot::C, m * n, |work| {
        if beta != 0.0 {
            let widen = |(g, part): (usize, &mut [f32])| {
                let first = g * group / run_len;
                for (r, dst) in part.chunks_exact_mut(run_len).enumerate() {
                    // SAFETY: run first + r of the checked output view starts
                    // there and has `run_len` elements `step` apart.
                    unsafe { widen_run(out.ptr.add((first + r) * run_stride), step, dst) };
                }
            };
            if parallel {
                work.par_chunks_mut(group).enumerate().for_each(widen);
            } else {
                work.chunks_mut(group).enumerate().for_each(widen);
            }
        }
        let (row_stride, col_stride) = if row_major { (n, 1) } else { (1, m) };
        let work_view = RawMut { ptr: work.as_mut_ptr(), rows: m, cols: n, row_stride, col_stride };
        compute(p.with_c(work_view))?;
        debug_assert_eq!(work.len(), runs * run_len);
        let narrow = |(g, part): (usize, &[f32])| {
            let first = g * group / run_len;
            for (r, run) in part.chunks_exact(run_len).enumerate() {
                // SAFETY: as above; each run of C is written by one group
                // only, and nothing else reads or writes this product's C.
                unsafe { narrow_run(run, out.ptr.add((first + r) * run_stride), step) };
            }
        };
        if parallel {
            work.par_chunks(group).enumerate().for_each(narrow);
        } else {
            work.chunks(group).enumerate().for_each(narrow);
        }
        Ok(())
    })?
}

/// Widens `out.len()` elements read `step` apart from `src` into `out`.
///
/// # Safety
/// Those elements are readable.
unsafe fn widen_run<S: PackSource<f32>>(src: *const S, step: usize, out: &mut [f32]) {
    if step == 1 {
        // SAFETY: the run is contiguous and readable (caller's contract).
        S::convert_slice(unsafe { std::slice::from_raw_parts(src, out.len()) }, out);
    } else {
        for (i, o) in out.iter_mut().enumerate() {
            // SAFETY: element i of the run (caller's contract).
            *o = unsafe { *src.add(i * step) }.to_compute();
        }
    }
}

/// Rounds `run` into the elements `step` apart from `dst`.
///
/// # Safety
/// Those `run.len()` elements are writable and not otherwise borrowed.
unsafe fn narrow_run<S: Narrow>(run: &[f32], dst: *mut S, step: usize) {
    if step == 1 {
        // SAFETY: the run is contiguous, writable and ours (caller's contract).
        S::narrow_slice(run, unsafe { std::slice::from_raw_parts_mut(dst, run.len()) });
    } else {
        for (i, &x) in run.iter().enumerate() {
            // SAFETY: element i of the run (caller's contract).
            unsafe { *dst.add(i * step) = S::narrow(x) };
        }
    }
}

/// `(m, n, k)` of `C = A · B` from the `(rows, cols)` of A, B and C, or the
/// error naming all three when they do not fit together.
fn product_dims(a: (usize, usize), b: (usize, usize), c: (usize, usize)) -> Result<(usize, usize, usize)> {
    let (m, n, k) = (c.0, c.1, a.1);
    if a.0 == m && b.1 == n && b.0 == k {
        return Ok((m, n, k));
    }
    Err(KernelError::ShapeMismatch {
        detail: format!(
            "a is {}x{}, b is {}x{}, c is {}x{}: need a {m}xk, b kx{n}, c {m}x{n}",
            a.0, a.1, b.0, b.1, c.0, c.1
        ),
    })
}

fn run_batched<T, P, S, Path>(
    options: &GemmOptions,
    alpha: T,
    a: BatchRef<'_, S>,
    b: BatchRef<'_, S>,
    beta: T,
    mut c: BatchMut<'_, S>,
    path: Path,
) -> Result<()>
where
    T: Compute,
    P: HasMicroKernels<T>,
    S: Send + Sync,
    Path: OutputPath<T, P, S>,
{
    let (m, n, k) = product_dims((a.rows(), a.cols()), (b.rows(), b.cols()), (c.rows(), c.cols()))?;
    let batch = c.batch();
    for (name, count) in [("a", a.batch()), ("b", b.batch())] {
        if count != batch && count != 1 {
            return Err(KernelError::ShapeMismatch {
                detail: format!("{name} has {count} matrices, c has {batch}: need {batch} or 1"),
            });
        }
    }
    let kernel = select::<T, P>(options.kernel)?;
    let blocking = options.blocking.unwrap_or(kernel.blocking);
    blocking.validate()?;
    if batch == 0 || m == 0 || n == 0 {
        return Ok(());
    }
    let flops = 2usize.saturating_mul(m).saturating_mul(n).saturating_mul(k);
    let speed = path.speed_vs_f32(m, n, k);
    let pool = rayon::current_num_threads();
    let (item_threads, across_batch) = match options.parallelism {
        Parallelism::Sequential => (1, false),
        Parallelism::Threads(t) => (t.max(1), false),
        Parallelism::Auto if parallel_worth(flops, speed) => (pool, false),
        // Small matrices, many of them: one thread per matrix.
        Parallelism::Auto => (1, pool > 1 && batch > 1 && batch_parallel_worth(flops.saturating_mul(batch), speed)),
    };
    let plan = Plan { kernel, blocking, threads: item_threads };
    let (c_raw, c_stride) = c.raw();
    let one = |i: usize| {
        // SAFETY: matrix i of the checked batch view starts i * c_stride
        // elements after matrix 0, and the matrices are disjoint.
        let ci = unsafe { c_raw.offset(i * c_stride) };
        path.run(&plan, Product { alpha, a: a.item(i), b: b.item(i), beta, c: ci })
    };
    if across_batch {
        (0..batch).into_par_iter().try_for_each(one)
    } else {
        (0..batch).try_for_each(one)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrow_c_larger_than_the_workspace_goes_in_bands() {
        // C of 1.1M elements: its f32 workspace (4.4 MB) outgrows the cached
        // one; C of 300K: one workspace, widened and rounded by groups of
        // runs on several threads. Operands k/8 with small k: every sum is
        // exact in f32, so C is the exact result rounded once, whichever
        // band or thread computed it.
        for (m, n, k) in [(1100, 1000, 6), (600, 500, 6)] {
            let a: Vec<bf16> = (0..m * k).map(|i| bf16::from_f32(((i * 7 % 9) as f32 - 4.0) / 8.0)).collect();
            let b: Vec<bf16> = (0..k * n).map(|i| bf16::from_f32(((i * 5 % 7) as f32 - 3.0) / 8.0)).collect();
            let c0: Vec<bf16> = (0..m * n).map(|i| bf16::from_f32((i % 5) as f32)).collect();
            let exact = |i: usize, j: usize, c: f32, beta: f32| {
                let dot: f32 = (0..k).map(|p| a[i * k + p].to_f32() * b[p * n + j].to_f32()).sum();
                bf16::from_f32(dot + beta * c)
            };
            for parallelism in [Parallelism::Auto, Parallelism::Threads(3)] {
                let options = GemmOptions { parallelism, ..GemmOptions::default() };
                for (col_major, beta) in [(false, 0.0f32), (true, 1.0), (false, 1.0), (true, 0.0)] {
                    let mut c = c0.clone();
                    let view =
                        if col_major { MatMut::col_major(&mut c, m, n) } else { MatMut::row_major(&mut c, m, n) }
                            .unwrap();
                    let (x, y) = (MatRef::row_major(&a, m, k).unwrap(), MatRef::row_major(&b, k, n).unwrap());
                    gemm_with(&options, 1.0, x, y, beta, view).unwrap();
                    let all_right = (0..m).all(|i| {
                        (0..n).all(|j| {
                            let at = if col_major { i + j * m } else { i * n + j };
                            c[at] == exact(i, j, c0[at].to_f32(), beta)
                        })
                    });
                    assert!(all_right, "{m}x{n} {parallelism:?} col_major {col_major} beta {beta}");
                }
            }
        }
    }

    #[test]
    fn faster_kernels_count_their_flops_as_less_work() {
        // deep_mlp's 128 x 256 x 256 products: threaded in f32, not in bf16.
        let flops = 2 * 128 * 256 * 256;
        assert!(parallel_worth(flops, f32::SPEED_VS_F32));
        assert!(!parallel_worth(flops, Bf16Pair::SPEED_VS_F32));
        assert!(batch_parallel_worth(PARALLEL_BATCH_THRESHOLD_FLOPS, 1));
        assert!(!batch_parallel_worth(PARALLEL_BATCH_THRESHOLD_FLOPS, Bf16Pair::SPEED_VS_F32));
        assert!(parallel_worth(4 * flops, Bf16Pair::SPEED_VS_F32));
        assert!(!parallel_worth(PARALLEL_THRESHOLD_FLOPS - 1, 1));
        assert!(parallel_worth(usize::MAX, 0), "a zero speed is read as 1, never a division by zero");
    }
}
