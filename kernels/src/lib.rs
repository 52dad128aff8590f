//! CPU kernels for brasa: packed, register-blocked matrix products with
//! runtime CPU-feature dispatch, and a probe of the machine's FMA peak.
//!
//! The matrix products ([`gemm`]) compute `C = alpha * A * B + beta * C` for
//! f32, f64, f16 and bf16 (the last two accumulate in f32), single or
//! batched, on strided views so that transposed operands need no copy. They
//! follow BLIS: operands are packed into cache-sized panels, an AVX-512,
//! AVX2+FMA or portable micro-kernel is picked at run time, and large
//! products are split over rayon's threads. Bad input (shapes that do not
//! fit, a view past the end of its slice) is an `Err`, never a panic.
//!
//! ```
//! use brasa_kernels::gemm::{gemm_f32, MatMut, MatRef};
//!
//! // A is 2x3 row-major; B is given as its transpose's storage (3x2 view of a 2x3 buffer).
//! let a = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
//! let bt = [1.0f32, 0.0, 1.0, 0.0, 1.0, 0.0];
//! let mut c = [f32::NAN; 4]; // beta = 0: C is overwritten, NaN and all
//! let a = MatRef::row_major(&a, 2, 3)?;
//! let b = MatRef::row_major(&bt, 2, 3)?.t(); // 3x2, no copy
//! gemm_f32(1.0, a, b, 0.0, MatMut::row_major(&mut c, 2, 2)?)?;
//! assert_eq!(c, [4.0, 2.0, 10.0, 5.0]);
//! # Ok::<(), brasa_kernels::KernelError>(())
//! ```
//!
//! [`peak::fma_peak_gflops`] measures the f32 FMA peak of this machine, the
//! denominator of brasa's "fraction of peak" figures.
//!
//! # Cargo features
//! - `cuda`: `cuda_ptx`, the CUDA kernels (`kernels/cuda/*.cu`) as PTX
//!   text, compiled by `cargo xtask kernels` and committed, so the feature
//!   needs no CUDA toolkit and adds no dependency. brasa-tensor's CUDA
//!   backend loads and launches them (and runs matrix products on cuBLAS).

#![deny(unsafe_op_in_unsafe_fn)]

pub mod attention;
pub mod batch_norm;
pub mod conv;
pub mod convert;
pub mod cpu_features;
#[cfg(feature = "cuda")]
pub mod cuda_ptx;
pub mod elementwise;
mod error;
pub mod gemm;
pub mod index;
mod math;
pub mod norm;
pub mod optim;
pub mod peak;
pub mod pool;
pub mod reduce;
pub mod scalar;
pub mod scratch;
#[cfg(test)]
mod test_data;
mod widest;

pub use error::{KernelError, Result};
