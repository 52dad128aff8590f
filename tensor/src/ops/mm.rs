//! PyTorch's strict matrix products on tensors: `mm` (two matrices),
//! `bmm` (two batches of matrices of one batch size), and their fused forms
//! `addmm` and `baddbmm` (`beta · input + alpha · product`). They check
//! PyTorch's shape rules (no 1-d operands, no broadcast batch) and then
//! leave the product to [`Tensor::matmul`].

use crate::error::{Result, TensorError};
use crate::ops::common::{expect_dtype, same_device};
use crate::tensor::Tensor;

/// The `[n, p]` shape of `a · b` for matrices, or an error naming both shapes.
fn mm_shape(op: &'static str, a: &[usize], b: &[usize]) -> Result<[usize; 2]> {
    if a.len() != 2 || b.len() != 2 {
        return Err(TensorError::shape(
            op,
            format!("expected two matrices (2-d), got shapes {a:?} and {b:?}; use matmul for other ranks"),
        ));
    }
    if a[1] != b[0] {
        return Err(TensorError::shape(
            op,
            format!("shapes {a:?} and {b:?} cannot be multiplied ({} columns vs {} rows)", a[1], b[0]),
        ));
    }
    Ok([a[0], b[1]])
}

/// The `[b, n, p]` shape of a batched product, or an error naming both shapes.
fn bmm_shape(op: &'static str, a: &[usize], b: &[usize]) -> Result<[usize; 3]> {
    if a.len() != 3 || b.len() != 3 {
        return Err(TensorError::shape(
            op,
            format!("expected two batches of matrices (3-d), got shapes {a:?} and {b:?}; use matmul to broadcast"),
        ));
    }
    if a[0] != b[0] {
        return Err(TensorError::shape(
            op,
            format!("batch sizes differ: shapes {a:?} and {b:?} ({} vs {}); {op} does not broadcast", a[0], b[0]),
        ));
    }
    if a[2] != b[1] {
        return Err(TensorError::shape(
            op,
            format!("shapes {a:?} and {b:?} cannot be multiplied ({} columns vs {} rows)", a[2], b[1]),
        ));
    }
    Ok([a[0], a[1], b[2]])
}

/// `beta · input + alpha · (a · b)` once the product's shape `out` is
/// known: `input` must broadcast to `out` without growing it and have the
/// operands' dtype. With `beta == 0` the input's values are not read (a NaN
/// there does not reach the result), as in PyTorch.
fn add_scaled_product(
    op: &'static str,
    input: &Tensor,
    a: &Tensor,
    b: &Tensor,
    out: &[usize],
    beta: f64,
    alpha: f64,
) -> Result<Tensor> {
    same_device(op, &[input, a, b])?;
    expect_dtype(op, input, a.dtype())?;
    let dims = input.dims();
    let fits = dims.len() <= out.len() && dims.iter().rev().zip(out.iter().rev()).all(|(&i, &o)| i == o || i == 1);
    if !fits {
        return Err(TensorError::shape(
            op,
            format!("input of shape {dims:?} cannot be broadcast to the product's shape {out:?}"),
        ));
    }
    let product = a.matmul(b)?;
    let product = if alpha == 1.0 { product } else { product.mul_scalar(alpha)? };
    if beta == 0.0 {
        return Ok(product);
    }
    let input = if beta == 1.0 { input.clone() } else { input.mul_scalar(beta)? };
    input.add(&product)
}

impl Tensor {
    /// The product of two matrices, `[n, m] · [m, p] → [n, p]` (`torch.mm`):
    /// unlike [`Tensor::matmul`] no 1-d operand and no batch dims. Errors
    /// name both shapes.
    ///
    /// ```
    /// use brasa_tensor::Tensor;
    /// let a = Tensor::from_vec(vec![1f32, 2.0, 3.0, 4.0], [2, 2])?;
    /// let b = Tensor::from_vec(vec![0f32, 1.0, 1.0, 0.0], [2, 2])?;
    /// assert_eq!(a.mm(&b)?.to_vec::<f32>()?, [2.0, 1.0, 4.0, 3.0]);
    /// assert!(a.mm(&Tensor::from_vec(vec![1f32, 1.0], [2])?).is_err());
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn mm(&self, mat2: &Tensor) -> Result<Tensor> {
        mm_shape("mm", self.dims(), mat2.dims())?;
        self.matmul(mat2)
    }

    /// The batched product `[b, n, m] · [b, m, p] → [b, n, p]`
    /// (`torch.bmm`): both 3-d with one batch size, no broadcasting. Errors
    /// name both shapes.
    pub fn bmm(&self, mat2: &Tensor) -> Result<Tensor> {
        bmm_shape("bmm", self.dims(), mat2.dims())?;
        self.matmul(mat2)
    }

    /// `beta · self + alpha · (mat1 · mat2)` (`torch.addmm`): `mat1` and
    /// `mat2` matrices as in [`Tensor::mm`], this tensor (the `input`) of
    /// their dtype and broadcastable to the `[n, p]` product. With `beta ==
    /// 0` the input's values are ignored (NaN and infinity included), as in
    /// PyTorch.
    ///
    /// ```
    /// use brasa_tensor::Tensor;
    /// let bias = Tensor::from_vec(vec![10f32, 20.0], [2])?;
    /// let m1 = Tensor::from_vec(vec![1f32, 2.0], [1, 2])?;
    /// let m2 = Tensor::from_vec(vec![1f32, 0.0, 0.0, 1.0], [2, 2])?;
    /// assert_eq!(bias.addmm(&m1, &m2, 0.5, 2.0)?.to_vec::<f32>()?, [7.0, 14.0]);
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn addmm(&self, mat1: &Tensor, mat2: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
        const OP: &str = "addmm";
        let out = mm_shape(OP, mat1.dims(), mat2.dims())?;
        add_scaled_product(OP, self, mat1, mat2, &out, beta, alpha)
    }

    /// `beta · self + alpha · (batch1 · batch2)` batched (`torch.baddbmm`):
    /// `batch1` `[b, n, m]` and `batch2` `[b, m, p]` as in [`Tensor::bmm`],
    /// this tensor broadcastable to `[b, n, p]`; `beta == 0` ignores it as
    /// [`Tensor::addmm`] does.
    pub fn baddbmm(&self, batch1: &Tensor, batch2: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
        const OP: &str = "baddbmm";
        let out = bmm_shape(OP, batch1.dims(), batch2.dims())?;
        add_scaled_product(OP, self, batch1, batch2, &out, beta, alpha)
    }
}
