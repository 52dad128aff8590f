//! Products of f32, f16 or bf16 operands into an f32 C ([`gemm_into_f32_with`],
//! BLAS's `gemm_bf16bf16f32`): the accumulation the half-precision products
//! do anyway, without rounding C to the operands' type. A caller that sums
//! many products into one C (a weight gradient summed over images) keeps
//! the sum in f32 and rounds it once, at the end.

use super::driver;
use super::element::Bf16Pair;
use super::microkernel::{select, HasMicroKernels};
use super::pack::PackInto;
use super::product::{Plan, Product};
use super::{parallel_worth, product_dims, Bf16Route, GemmElement, GemmOptions, MatMut, MatRef, Parallelism};
use crate::error::Result;
use half::{bf16, f16};

/// An operand type whose products accumulate in f32: f32, f16, bf16.
pub trait GemmIntoF32: GemmElement<Scalar = f32> {
    #[doc(hidden)]
    fn into_f32_impl(
        options: &GemmOptions,
        alpha: f32,
        a: MatRef<'_, Self>,
        b: MatRef<'_, Self>,
        beta: f32,
        c: MatMut<'_, f32>,
    ) -> Result<()>;
}

impl GemmIntoF32 for f32 {
    fn into_f32_impl(
        options: &GemmOptions,
        alpha: f32,
        a: MatRef<'_, f32>,
        b: MatRef<'_, f32>,
        beta: f32,
        c: MatMut<'_, f32>,
    ) -> Result<()> {
        super::gemm_with(options, alpha, a, b, beta, c)
    }
}

impl GemmIntoF32 for f16 {
    fn into_f32_impl(
        options: &GemmOptions,
        alpha: f32,
        a: MatRef<'_, f16>,
        b: MatRef<'_, f16>,
        beta: f32,
        c: MatMut<'_, f32>,
    ) -> Result<()> {
        run::<f32, f16>(options, alpha, a, b, beta, c)
    }
}

impl GemmIntoF32 for bf16 {
    fn into_f32_impl(
        options: &GemmOptions,
        alpha: f32,
        a: MatRef<'_, bf16>,
        b: MatRef<'_, bf16>,
        beta: f32,
        c: MatMut<'_, f32>,
    ) -> Result<()> {
        // The routes of `gemm_with` for bf16.
        match Bf16Route::of(options.kernel.resolve(), c.rows(), c.cols(), a.cols()) {
            #[cfg(target_arch = "x86_64")]
            Bf16Route::Tiles => run_amx(options, alpha, a, b, beta, c),
            Bf16Route::Pairs => run::<Bf16Pair, bf16>(options, alpha, a, b, beta, c),
            Bf16Route::Widened => run::<f32, bf16>(options, alpha, a, b, beta, c),
        }
    }
}

/// `C = alpha * A * B + beta * C` with `A` and `B` of type `T` (f32, f16
/// or bf16) and `C` in f32: each element of C is the f32 sum of exact
/// products, never rounded to `T`. With `beta == 0`, C is not read.
///
/// ```
/// use brasa_kernels::gemm::{gemm_into_f32_with, GemmOptions, MatMut, MatRef};
/// use half::bf16;
///
/// let a: Vec<bf16> = [1.0f32, 2.0, 3.0, 4.0].map(bf16::from_f32).to_vec();
/// let mut c = vec![0.5f32; 4];
/// let (a, b) = (MatRef::row_major(&a, 2, 2)?, MatRef::row_major(&a, 2, 2)?);
/// gemm_into_f32_with(&GemmOptions::default(), 1.0, a, b, 1.0, MatMut::row_major(&mut c, 2, 2)?)?;
/// assert_eq!(c, [7.5, 10.5, 15.5, 22.5]);
/// # Ok::<(), brasa_kernels::KernelError>(())
/// ```
pub fn gemm_into_f32_with<T: GemmIntoF32>(
    options: &GemmOptions,
    alpha: f32,
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    beta: f32,
    c: MatMut<'_, f32>,
) -> Result<()> {
    T::into_f32_impl(options, alpha, a, b, beta, c)
}

/// One product with operands packed as `P` into the f32 C, on the threads
/// `options` allow (as one matrix of `gemm_with`).
fn run<P, S>(
    options: &GemmOptions,
    alpha: f32,
    a: MatRef<'_, S>,
    b: MatRef<'_, S>,
    beta: f32,
    mut c: MatMut<'_, f32>,
) -> Result<()>
where
    P: HasMicroKernels<f32>,
    S: PackInto<P>,
{
    let (m, n, k) = product_dims((a.rows(), a.cols()), (b.rows(), b.cols()), (c.rows(), c.cols()))?;
    let kernel = select::<f32, P>(options.kernel)?;
    let blocking = options.blocking.unwrap_or(kernel.blocking);
    blocking.validate()?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let plan = Plan { kernel, blocking, threads: threads(options, m, n, k, P::SPEED_VS_F32) };
    driver::gemm(&plan, Product { alpha, a, b, beta, c: c.raw() });
    Ok(())
}

/// Threads one product of this shape may use under `options`, on a kernel
/// `speed_vs_f32` times as fast as the f32 one.
fn threads(options: &GemmOptions, m: usize, n: usize, k: usize, speed_vs_f32: usize) -> usize {
    let flops = 2usize.saturating_mul(m).saturating_mul(n).saturating_mul(k);
    match options.parallelism {
        Parallelism::Sequential => 1,
        Parallelism::Threads(t) => t.max(1),
        Parallelism::Auto if parallel_worth(flops, speed_vs_f32) => rayon::current_num_threads(),
        Parallelism::Auto => 1,
    }
}

/// The bf16 product on AMX tiles (the caller checked the kernel choice).
#[cfg(target_arch = "x86_64")]
fn run_amx(
    options: &GemmOptions,
    alpha: f32,
    a: MatRef<'_, bf16>,
    b: MatRef<'_, bf16>,
    beta: f32,
    mut c: MatMut<'_, f32>,
) -> Result<()> {
    let (m, n, k) = product_dims((a.rows(), a.cols()), (b.rows(), b.cols()), (c.rows(), c.cols()))?;
    if let Some(blocking) = options.blocking {
        blocking.validate()?;
    }
    let kernel = super::amx_tile::TileKernel::amx();
    super::amx::gemm(
        kernel,
        threads(options, m, n, k, super::amx::SPEED_VS_F32),
        Product { alpha, a, b, beta, c: c.raw() },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::test_values::values;
    use crate::gemm::KernelChoice;

    /// The f64 product of the operands' exact values, plus beta * C.
    fn reference(m: usize, n: usize, k: usize, a: &[f32], b: &[f32], beta: f32, c: &[f32]) -> Vec<f64> {
        (0..m * n)
            .map(|ij| {
                let (i, j) = (ij / n, ij % n);
                let dot: f64 = (0..k).map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j])).sum();
                dot + f64::from(beta) * f64::from(c[ij])
            })
            .collect()
    }

    /// Every kernel this CPU runs, odd depths (a bf16 pair half missing),
    /// a transposed B, beta 0 (C's NaN not read) and 1: within f32 rounding
    /// of the exact sum (k terms of magnitude ≤ 1: |error| ≤ k · 2⁻²³ · k).
    #[test]
    fn half_operands_accumulate_into_f32() -> Result<()> {
        for kernel in KernelChoice::supported() {
            for (m, n, k) in [(1, 1, 1), (5, 7, 3), (33, 13, 27), (64, 40, 301)] {
                let a32: Vec<f32> = values(m * k, 1).iter().map(|&x| bf16::from_f32(x).to_f32()).collect();
                let b32: Vec<f32> = values(k * n, 2).iter().map(|&x| bf16::from_f32(x).to_f32()).collect();
                let a16: Vec<bf16> = a32.iter().map(|&x| bf16::from_f32(x)).collect();
                // B stored transposed (n x k): read through a transposed view.
                let bt: Vec<bf16> = (0..n * k).map(|jp| bf16::from_f32(b32[(jp % k) * n + jp / k])).collect();
                let options = GemmOptions { kernel, ..GemmOptions::default() };
                let tol = (k * k) as f64 * f64::from(f32::EPSILON) + 1e-6;
                for beta in [0.0f32, 1.0] {
                    let c0 = values(m * n, 3);
                    let mut c = if beta == 0.0 { vec![f32::NAN; m * n] } else { c0.clone() };
                    let (a, b) = (MatRef::row_major(&a16, m, k)?, MatRef::row_major(&bt, n, k)?.t());
                    gemm_into_f32_with(&options, 1.0, a, b, beta, MatMut::row_major(&mut c, m, n)?)?;
                    let want = reference(m, n, k, &a32, &b32, beta, &c0);
                    for (got, want) in c.iter().zip(&want) {
                        assert!((f64::from(*got) - want).abs() <= tol, "{kernel:?} {m}x{n}x{k}: {got} vs {want}");
                    }
                }
                // f16 operands, and f32 ones (the plain product).
                let a_h: Vec<f16> = a32.iter().map(|&x| f16::from_f32(x)).collect();
                let b_h: Vec<f16> = b32.iter().map(|&x| f16::from_f32(x)).collect();
                let mut c = vec![0.0f32; m * n];
                let (a, b) = (MatRef::row_major(&a_h, m, k)?, MatRef::row_major(&b_h, k, n)?);
                gemm_into_f32_with(&options, 2.0, a, b, 0.0, MatMut::row_major(&mut c, m, n)?)?;
                let want = reference(m, n, k, &a32, &b32, 0.0, &c);
                for (got, want) in c.iter().zip(&want) {
                    assert!((f64::from(*got) - 2.0 * want).abs() <= 2.0 * tol, "f16 {kernel:?}: {got} vs {want}");
                }
                let mut c32 = vec![0.0f32; m * n];
                let (a, b) = (MatRef::row_major(&a32, m, k)?, MatRef::row_major(&b32, k, n)?);
                gemm_into_f32_with(&options, 1.0, a, b, 0.0, MatMut::row_major(&mut c32, m, n)?)?;
                for (got, want) in c32.iter().zip(&want) {
                    assert!((f64::from(*got) - want).abs() <= tol, "f32 {kernel:?}: {got} vs {want}");
                }
            }
        }
        Ok(())
    }

    #[test]
    fn shapes_must_agree() {
        let a = vec![bf16::ONE; 6];
        let mut c = vec![0.0f32; 4];
        let (a23, a32) = (MatRef::row_major(&a, 2, 3).unwrap(), MatRef::row_major(&a, 3, 2).unwrap());
        let c22 = MatMut::row_major(&mut c, 2, 2).unwrap();
        assert!(gemm_into_f32_with(&GemmOptions::default(), 1.0, a23, a23, 0.0, c22).is_err());
        let c22 = MatMut::row_major(&mut c, 2, 2).unwrap();
        gemm_into_f32_with(&GemmOptions::default(), 1.0, a23, a32, 0.0, c22).unwrap();
        assert_eq!(c, [3.0; 4]);
    }
}
