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
use crate::backend::merged_stride;
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

/// How one operand's matrices are handed to cuBLAS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BlasMatrix {
    /// `OP_T` when the matrix lies column by column.
    transposed: bool,
    /// The leading dimension.
    ld: i64,
}

/// The cuBLAS description of a `rows × cols` row-major view with strides
/// `(rs, cs)` as the column-major transpose cuBLAS reads, or `None` when
/// neither its rows nor its columns are contiguous (the caller copies it).
fn blas_matrix(rows: usize, cols: usize, rs: isize, cs: isize) -> Option<BlasMatrix> {
    let (rows, cols) = (rows as i64, cols as i64);
    let (rs, cs) = (rs as i64, cs as i64);
    // Rows contiguous: cuBLAS sees the transpose (cols × rows), leading dim
    // = the row stride, which must cover a row.
    if cols <= 1 || cs == 1 {
        let ld = if rows <= 1 { cols.max(1) } else { rs };
        if ld >= cols.max(1) {
            return Some(BlasMatrix { transposed: false, ld });
        }
    }
    // Columns contiguous: cuBLAS sees the matrix itself (rows × cols), read
    // transposed.
    if rows <= 1 || rs == 1 {
        let ld = if cols <= 1 { rows.max(1) } else { cs };
        if ld >= rows.max(1) {
            return Some(BlasMatrix { transposed: true, ld });
        }
    }
    None
}

/// An operand ready for one strided-batched call: its matrices as cuBLAS
/// reads them and the stride between batch entries (0 when shared).
struct Prepared {
    tensor: Tensor,
    matrix: BlasMatrix,
    batch_stride: i64,
}

/// `t` (`[batch.., rows, cols]`) as a [`Prepared`], copied to contiguous
/// memory first when its matrices or its batch cannot be described.
fn prepare(t: &Tensor, rows: usize, cols: usize) -> Result<Prepared> {
    let describe = |t: &Tensor| {
        let rank = t.rank();
        let s = t.layout().strides();
        let batch_dims = &t.dims()[..rank - 2];
        let batch_strides: Vec<usize> = s[..rank - 2].iter().map(|&x| x as usize).collect();
        let matrix = blas_matrix(rows, cols, s[rank - 2], s[rank - 1])?;
        let batch_stride = merged_stride(batch_dims, &batch_strides)?;
        Some((matrix, batch_stride as i64))
    };
    if let Some((matrix, batch_stride)) = describe(t) {
        return Ok(Prepared { tensor: t.clone(), matrix, batch_stride });
    }
    let copy = t.contiguous()?;
    let (matrix, batch_stride) =
        describe(&copy).ok_or_else(|| TensorError::internal(OP, "a contiguous operand has no cuBLAS description"))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_major_column_major_and_uncopyable_views() {
        // A contiguous [3, 4]: rows contiguous, ld 4.
        assert_eq!(blas_matrix(3, 4, 4, 1), Some(BlasMatrix { transposed: false, ld: 4 }));
        // Its transpose [4, 3] with strides (1, 4): columns contiguous.
        assert_eq!(blas_matrix(4, 3, 1, 4), Some(BlasMatrix { transposed: true, ld: 4 }));
        // A narrowed [3, 2] of a [3, 4]: rows contiguous, ld 4.
        assert_eq!(blas_matrix(3, 2, 4, 1), Some(BlasMatrix { transposed: false, ld: 4 }));
        // Vectors: a [1, k] row and a [k, 1] column with odd strides.
        assert_eq!(blas_matrix(1, 5, 99, 1), Some(BlasMatrix { transposed: false, ld: 5 }));
        assert_eq!(blas_matrix(5, 1, 1, 7), Some(BlasMatrix { transposed: false, ld: 1 }));
        // Every other element: neither rows nor columns contiguous.
        assert_eq!(blas_matrix(3, 4, 8, 2), None);
        // A broadcast row (stride 0 between rows) cannot be a leading dim.
        assert_eq!(blas_matrix(3, 4, 0, 1), None);
    }
}
