//! Matrix products: [`Tensor::matmul`] with PyTorch's rules (dot products,
//! matrix-vector, matrix-matrix and batched products with broadcast batch
//! dimensions). The shape rules live here; the product itself is the
//! device's ([`crate::backend::DeviceOps::matmul`]: `brasa_kernels::gemm` on
//! the host, reading transposed or narrowed operands in place).

use crate::backend::MatmulOperands;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::ops::common::same_device;
use crate::shape::{broadcast_shapes, Shape};
use crate::tensor::Tensor;

const OP: &str = "matmul";

impl Tensor {
    /// The matrix product of `self` and `rhs`, with PyTorch's rules:
    ///
    /// - 1-d · 1-d: the dot product, a 0-d tensor;
    /// - 2-d · 2-d: the matrix product `[m, k] · [k, n] → [m, n]`;
    /// - a 1-d operand is taken as a matrix (`[k]` on the left as `[1, k]`,
    ///   on the right as `[k, 1]`) and that dimension is removed from the
    ///   result;
    /// - otherwise a batched product: the last two dims are the matrices,
    ///   the others are batch dims broadcast against each other
    ///   (`[j, 1, m, k] · [l, k, n] → [j, l, m, n]`).
    ///
    /// Both operands must have the same floating-point dtype (f32, f64, f16
    /// or bf16; f16 and bf16 accumulate in f32) and live on the same device.
    /// Transposed, narrowed and broadcast operands are read in place.
    ///
    /// ```
    /// # use brasa_tensor::{Device, Tensor};
    /// let a = Tensor::from_vec(vec![1f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3])?;
    /// let b = Tensor::from_vec(vec![1f32, 0.0, -1.0], [3])?;
    /// assert_eq!(a.matmul(&b)?.to_vec::<f32>()?, [-2.0, -2.0]);
    /// assert_eq!(a.matmul(&a.t()?)?.dims(), &[2, 2]);
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.product(rhs, self.dtype())
    }

    /// [`Tensor::matmul`] with the result in `out_dtype` (PyTorch's
    /// `torch.mm(a, b, out_dtype=...)`): the operands' own dtype (a plain
    /// `matmul`), or f32 for f16 and bf16 operands — their f32 sums, never
    /// rounded to half precision. This is how attention multiplies half
    /// operands while keeping its scores in f32 (on the host, the bf16
    /// kernels read the operands as they are: no widened copies).
    ///
    /// ```
    /// # use brasa_tensor::{DType, Tensor};
    /// let a = Tensor::from_vec(vec![1.0f32, 1.0 / 256.0], [1, 2])?.to_dtype(DType::BF16)?;
    /// let b = Tensor::from_vec(vec![1.0f32, 1.0], [2, 1])?.to_dtype(DType::BF16)?;
    /// // 1 + 1/256 is not a bf16 value; the f32 result keeps it.
    /// assert_eq!(a.matmul(&b)?.to_dtype(DType::F32)?.to_vec::<f32>()?, [1.0]);
    /// assert_eq!(a.matmul_out_dtype(&b, DType::F32)?.to_vec::<f32>()?, [1.0 + 1.0 / 256.0]);
    /// assert!(a.matmul_out_dtype(&b, DType::F64).is_err());
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn matmul_out_dtype(&self, rhs: &Tensor, out_dtype: DType) -> Result<Tensor> {
        let half = matches!(self.dtype(), DType::F16 | DType::BF16);
        if out_dtype != self.dtype() && !(half && out_dtype == DType::F32) {
            return Err(TensorError::invalid(
                OP,
                format!(
                    "out_dtype {out_dtype} needs {} operands, or f16/bf16 operands for f32; got {} operands",
                    out_dtype,
                    self.dtype()
                ),
            ));
        }
        self.product(rhs, out_dtype)
    }

    /// The product with the result in `out_dtype` (checked by the callers:
    /// the operands' dtype, or f32 for half operands).
    fn product(&self, rhs: &Tensor, out_dtype: DType) -> Result<Tensor> {
        let _range = brasa_profile::record_op(OP, &[self.dims(), rhs.dims()]);
        let device = same_device(OP, &[self, rhs])?;
        if self.dtype() != rhs.dtype() {
            // PyTorch does not promote here either: the caller converts.
            return Err(TensorError::DTypeMismatch { op: OP, expected: self.dtype(), got: rhs.dtype() });
        }
        let dtype = self.dtype();
        if !dtype.is_float() {
            return Err(TensorError::UnsupportedDType {
                op: OP,
                dtype,
                needs: "floating-point operands (f32, f64, f16 or bf16)",
                hint: "",
            });
        }
        if self.rank() == 0 || rhs.rank() == 0 {
            return Err(TensorError::shape(
                OP,
                format!("both operands need at least one dimension, got shapes {:?} and {:?}", self.dims(), rhs.dims()),
            ));
        }
        let a = if self.rank() == 1 { self.unsqueeze(0)? } else { self.clone() };
        let b = if rhs.rank() == 1 { rhs.unsqueeze(1)? } else { rhs.clone() };
        let (ra, rb) = (a.rank(), b.rank());
        let (m, k) = (a.dims()[ra - 2], a.dims()[ra - 1]);
        let (k_rhs, n) = (b.dims()[rb - 2], b.dims()[rb - 1]);
        if k != k_rhs {
            return Err(TensorError::shape(
                OP,
                format!(
                    "cannot multiply {:?} by {:?}: inner dimensions {k} and {k_rhs} differ",
                    self.dims(),
                    rhs.dims()
                ),
            ));
        }
        let batch =
            broadcast_shapes(&Shape::from(&a.dims()[..ra - 2]), &Shape::from(&b.dims()[..rb - 2])).map_err(|_| {
                TensorError::shape(
                    OP,
                    format!(
                        "cannot multiply {:?} by {:?}: batch dimensions {:?} and {:?} do not broadcast",
                        self.dims(),
                        rhs.dims(),
                        &a.dims()[..ra - 2],
                        &b.dims()[..rb - 2]
                    ),
                )
            })?;
        let a_layout = broadcast_matrices(&a, &batch, [m, k])?;
        let b_layout = broadcast_matrices(&b, &batch, [k, n])?;
        // gemm reads non-negative strides only; negative ones are rare enough to copy.
        let (a, a_layout) = non_negative(&a, a_layout)?;
        let (b, b_layout) = non_negative(&b, b_layout)?;

        let a = a.with_layout(a_layout);
        let b = b.with_layout(b_layout);
        let operands = MatmulOperands { a: &a, b: &b, batch: batch.dims(), m, n, k };
        let backend = crate::backend::ops_for(device)?;
        let result = if out_dtype == dtype { backend.matmul(operands)? } else { backend.matmul_into_f32(operands)? };
        // Drop the dims a 1-d operand stood for; the memory is the same.
        let mut dims = batch.dims().to_vec();
        if self.rank() > 1 {
            dims.push(m);
        }
        if rhs.rank() > 1 {
            dims.push(n);
        }
        Ok(result.with_layout(Layout::contiguous(dims)?))
    }
}

/// `t`'s layout broadcast to `batch + matrix`, with the matrix dims unchanged.
fn broadcast_matrices(t: &Tensor, batch: &Shape, matrix: [usize; 2]) -> Result<Layout> {
    let mut dims = batch.dims().to_vec();
    dims.extend(matrix);
    Ok(t.layout().broadcast_as(dims)?)
}

/// The tensor and layout, or a contiguous copy when a stride is negative.
fn non_negative(t: &Tensor, layout: Layout) -> Result<(Tensor, Layout)> {
    if layout.strides().iter().all(|&s| s >= 0) {
        return Ok((t.clone(), layout));
    }
    let copy = t.with_layout(layout).contiguous()?;
    let layout = copy.layout().clone();
    Ok((copy, layout))
}

/// Dense row-major `[m, k] · [k, n]` written the obvious way, for tests.
#[cfg(test)]
pub(crate) fn naive_matmul<T: crate::WithDType>(a: &[T], b: &[T], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p].to_f64() * b[p * n + j].to_f64()).sum();
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Device};

    fn t(values: &[f32], shape: &[usize]) -> Tensor {
        Tensor::from_slice_on(values, shape, Device::CPU).unwrap()
    }

    #[test]
    fn vector_and_matrix_rules() {
        let a = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
        let v = t(&[1.0, 0.0, -1.0], &[3]);
        let dot = v.matmul(&v).unwrap();
        assert_eq!(dot.dims(), &[] as &[usize]);
        assert_eq!(dot.item::<f32>().unwrap(), 2.0);
        assert_eq!(a.matmul(&v).unwrap().to_vec::<f32>().unwrap(), [-2.0, -2.0]);
        let w = t(&[1.0, 1.0], &[2]);
        let wa = w.matmul(&a).unwrap();
        assert_eq!(wa.dims(), &[3]);
        assert_eq!(wa.to_vec::<f32>().unwrap(), [5.0, 7.0, 9.0]);
        let aat = a.matmul(&a.t().unwrap()).unwrap();
        assert_eq!(aat.to_vec::<f32>().unwrap(), [14.0, 32.0, 32.0, 77.0]);
        let ata = a.t().unwrap().matmul(&a).unwrap();
        let expected = naive_matmul(&[1.0f32, 4.0, 2.0, 5.0, 3.0, 6.0], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3, 2, 3);
        let got: Vec<f64> = ata.to_vec::<f32>().unwrap().into_iter().map(f64::from).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn batched_with_vector_and_folding() {
        // [2, 2, 3] · [3] → [2, 2]; [2, 2, 3] · [3, 1] folds the batch into rows.
        let x: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let a = t(&x, &[2, 2, 3]);
        let v = t(&[1.0, 1.0, 1.0], &[3]);
        assert_eq!(a.matmul(&v).unwrap().to_vec::<f32>().unwrap(), [3.0, 12.0, 21.0, 30.0]);
        let col = t(&[1.0, 1.0, 1.0], &[3, 1]);
        let r = a.matmul(&col).unwrap();
        assert_eq!(r.dims(), &[2, 2, 1]);
        // [3] · [2, 3, 2]: vector on the left of a batch.
        let b = t(&x, &[2, 3, 2]);
        let r = v.matmul(&b).unwrap();
        assert_eq!(r.dims(), &[2, 2]);
        assert_eq!(r.to_vec::<f32>().unwrap(), [6.0, 9.0, 24.0, 27.0]);
    }

    #[test]
    fn errors_name_the_shapes_and_dtypes() {
        let a = t(&[0.0; 6], &[2, 3]);
        let b = t(&[0.0; 20], &[4, 5]);
        assert_eq!(
            a.matmul(&b).unwrap_err().to_string(),
            "matmul: cannot multiply [2, 3] by [4, 5]: inner dimensions 3 and 4 differ"
        );
        let s = Tensor::scalar_on(1.0f32, Device::CPU).unwrap();
        let error = s.matmul(&a).unwrap_err();
        assert!(matches!(error, TensorError::Shape { op: "matmul", .. }), "{error:?}");
        let d = a.to_dtype(DType::F64).unwrap();
        let error = a.matmul(&d.t().unwrap()).unwrap_err();
        assert!(
            matches!(error, TensorError::DTypeMismatch { op: "matmul", expected: DType::F32, got: DType::F64 }),
            "{error:?}"
        );
        let i = a.to_dtype(DType::I64).unwrap();
        let error = i.matmul(&i.t().unwrap()).unwrap_err();
        assert!(matches!(error, TensorError::UnsupportedDType { op: "matmul", dtype: DType::I64, .. }), "{error:?}");
    }
}
