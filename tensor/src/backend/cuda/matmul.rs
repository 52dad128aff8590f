//! Matrix products on cuBLAS (`cublasGemmStridedBatchedEx`): f32 and f64 in
//! their own precision (TF32 is not used), f16 and bf16 with f32
//! accumulation, as PyTorch's defaults. Transposed operands are cuBLAS flags,
//! not copies; a batch that steps evenly (or is broadcast, stride 0) is one
//! strided-batched call.
//!
//! cuBLAS is column-major. brasa's row-major `C = A·B` is computed as
//! `Cᵀ = Bᵀ·Aᵀ`: a row-major matrix read column-major is its transpose, so
//! each operand is passed as it lies in memory, with `OP_N` when its rows
//! are contiguous (unit column stride) and `OP_T` when its columns are.

use super::{address, output_address, CudaOps};
use crate::backend::args::{blas_operand, BlasMatrix, BlasOperand};
use crate::backend::output;
use crate::backend::MatmulOperands;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::shape::Shape;
use crate::tensor::Tensor;
use cudarc::cublas::result::gemm_strided_batched_ex;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use std::ffi::c_void;

const OP: &str = "matmul";

/// An operand ready for one strided-batched call: its matrices as cuBLAS
/// reads them and the stride between batch entries (0 when shared).
struct Prepared {
    tensor: Tensor,
    matrix: BlasMatrix,
    batch_stride: i64,
}

/// `t` (`[batch.., rows, cols]`) as a [`Prepared`], copied to contiguous
/// memory first when its matrices or its batch cannot be described.
/// (A meta device imitating CUDA makes the same copies: `meta/cuda.rs`.)
fn prepare(t: &Tensor, rows: usize, cols: usize) -> Result<Prepared> {
    if let Some(BlasOperand { matrix, batch_stride }) = blas_operand(t, rows, cols) {
        return Ok(Prepared { tensor: t.clone(), matrix, batch_stride });
    }
    let copy = t.contiguous()?;
    let BlasOperand { matrix, batch_stride } = blas_operand(&copy, rows, cols)
        .ok_or_else(|| TensorError::internal(OP, "a contiguous operand has no cuBLAS description"))?;
    Ok(Prepared { tensor: copy, matrix, batch_stride })
}

fn operation(transposed: bool) -> cublasOperation_t {
    if transposed {
        cublasOperation_t::CUBLAS_OP_T
    } else {
        cublasOperation_t::CUBLAS_OP_N
    }
}

/// The cuBLAS element and compute types of `dtype`.
fn blas_types(dtype: DType) -> Result<(cudaDataType, cublasComputeType_t)> {
    match dtype {
        DType::F32 => Ok((cudaDataType::CUDA_R_32F, cublasComputeType_t::CUBLAS_COMPUTE_32F)),
        DType::F64 => Ok((cudaDataType::CUDA_R_64F, cublasComputeType_t::CUBLAS_COMPUTE_64F)),
        DType::F16 => Ok((cudaDataType::CUDA_R_16F, cublasComputeType_t::CUBLAS_COMPUTE_32F)),
        DType::BF16 => Ok((cudaDataType::CUDA_R_16BF, cublasComputeType_t::CUBLAS_COMPUTE_32F)),
        other => Err(TensorError::invalid(OP, format!("unsupported dtype {other}"))),
    }
}

pub(super) fn matmul(backend: &CudaOps, operands: MatmulOperands<'_>) -> Result<Tensor> {
    let MatmulOperands { a, b, batch, m, n, k } = operands;
    let mut full = batch.to_vec();
    full.extend([m, n]);
    let out = output(a.device(), a.dtype(), &Shape::from(full))?;
    let out = match out.if_empty() {
        Ok(empty) => return Ok(empty),
        Err(out) => out,
    };
    let batch_count: usize = batch.iter().product();
    let too_big = |what: &str, v: usize| {
        TensorError::invalid(OP, format!("{what} {v} exceeds cuBLAS's 32-bit sizes; split the product"))
    };
    let int = |what: &str, v: usize| i32::try_from(v).map_err(|_| too_big(what, v));
    let (m32, n32, k32, batch32) = (int("m", m)?, int("n", n)?, int("k", k)?, int("batch", batch_count)?);
    let (pa, pb) = (prepare(a, m, k)?, prepare(b, k, n)?);
    let (data_type, compute) = blas_types(a.dtype())?;
    let blas = backend.blas(OP)?;
    let (a_at, b_at, c_at) = (address(OP, &pa.tensor)?, address(OP, &pb.tensor)?, output_address(OP, &out)?);
    let ld = |v: i64, what: &str| i32::try_from(v).map_err(|_| too_big(what, v as usize));
    let (lda, ldb) = (ld(pa.matrix.ld, "leading dimension")?, ld(pb.matrix.ld, "leading dimension")?);
    let (alpha32, beta32, alpha64, beta64) = (1.0f32, 0.0f32, 1.0f64, 0.0f64);
    let (alpha, beta): (*const c_void, *const c_void) = if a.dtype() == DType::F64 {
        (&alpha64 as *const f64 as *const c_void, &beta64 as *const f64 as *const c_void)
    } else {
        (&alpha32 as *const f32 as *const c_void, &beta32 as *const f32 as *const c_void)
    };
    // The raw cuBLAS call does not make the device's context current itself.
    backend.context.bind_to_thread().map_err(|e| backend.call_error(OP, "binding the CUDA context", e))?;
    let span = backend.launch_span("cublasGemmStridedBatchedEx");
    // Cᵀ (n × m, ld n) = Bᵀ (n × k) · Aᵀ (k × m).
    // SAFETY: the handle is bound to this device's stream; the pointers
    // address the operands' views, whose matrices and batch strides were
    // described from their layouts (within their storages), and the new
    // contiguous output of batch·m·n elements; alpha and beta point at host
    // scalars of the compute type, alive for the call.
    unsafe {
        gemm_strided_batched_ex(
            *blas.handle(),
            operation(pb.matrix.transposed),
            operation(pa.matrix.transposed),
            n32,
            m32,
            k32,
            alpha,
            b_at as *const c_void,
            data_type,
            ldb,
            pb.batch_stride,
            a_at as *const c_void,
            data_type,
            lda,
            pa.batch_stride,
            beta,
            c_at as *mut c_void,
            data_type,
            n32,
            (m * n) as i64,
            batch32,
            compute,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| backend.call_error(OP, "cublasGemmStridedBatchedEx", e))?;
    drop(span);
    // SAFETY: the product writes every element of the output (beta = 0:
    // cuBLAS does not read C), before later work on this stream reads it.
    Ok(unsafe { out.assume_init() })
}
