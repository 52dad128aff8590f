//! Matrix products with PyTorch's rules (1-d operands, broadcast batch
//! dims): `da = g · bᵀ`, `db = aᵀ · g`, summed back over broadcast batch dims.

use super::sum_to;
use crate::error::{AutogradError, Result};
use crate::op_names;
use crate::precision::{autocast_inputs, autocast_tensors};
use crate::var::{record, Var};
use brasa_tensor::{DType, Tensor};

/// `t` as at least a matrix: `[k]` becomes `[1, k]` on the left, `[k, 1]` on the right.
fn as_matrix(t: &Tensor, left: bool) -> Result<Tensor> {
    Ok(match (t.rank(), left) {
        (1, true) => t.unsqueeze(0)?,
        (1, false) => t.unsqueeze(1)?,
        _ => t.clone(),
    })
}

fn to_isize(dims: &[usize]) -> Vec<isize> {
    dims.iter().map(|&d| d as isize).collect()
}

impl Var {
    /// The matrix product (see `Tensor::matmul`).
    pub fn matmul(&self, rhs: &Var) -> Result<Var> {
        if let Some(c) = autocast_inputs(op_names::MATMUL, &[self, rhs])? {
            return c[0].matmul(&c[1]);
        }
        let out = self.tensor().matmul(rhs.tensor())?;
        let (ad, bd) = (self.dims().to_vec(), rhs.dims().to_vec());
        let (at, bt) = (self.dtype(), rhs.dtype());
        let saved = || vec![self.tensor().clone(), rhs.tensor().clone()];
        Ok(record("matmul", &[self, rhs], out, saved, move |c| {
            let a = as_matrix(&c.saved[0], true)?;
            let b = as_matrix(&c.saved[1], false)?;
            // The output gradient with the removed 1-d dims put back.
            let mut g = c.grad.clone();
            if ad.len() == 1 {
                g = g.unsqueeze(if bd.len() == 1 { 0 } else { g.rank().saturating_sub(1) })?;
            }
            if bd.len() == 1 {
                g = g.unsqueeze(g.rank())?;
            }
            let ga = if c.needs(0) {
                let full = g.matmul(&b.transpose(-2, -1)?)?;
                let promoted: Vec<usize> = a.dims().to_vec();
                Some(sum_to(&full, &promoted, at)?.reshape(&to_isize(&ad))?)
            } else {
                None
            };
            let gb = if c.needs(1) {
                let full = a.transpose(-2, -1)?.matmul(&g)?;
                let promoted: Vec<usize> = b.dims().to_vec();
                Some(sum_to(&full, &promoted, bt)?.reshape(&to_isize(&bd))?)
            } else {
                None
            };
            Ok(vec![ga, gb])
        }))
    }

    /// `self · weightᵀ + bias` over the last dimension (`weight` `[out, in]`,
    /// `bias` `[out]`), the linear layer in one node: the weight is read
    /// transposed without a copy, the bias is added in place, and backward
    /// computes `gx = g·W`, `gW = gᵀ·x` and `gb = Σ g` only for the inputs
    /// that need them.
    pub fn linear(&self, weight: &Var, bias: Option<&Var>) -> Result<Var> {
        let inputs: Vec<&Var> = [self, weight].into_iter().chain(bias).collect();
        // Under autocast the node is recorded over the original inputs with
        // their casts as operands, so backward can hand an f32 weight its
        // gradient as f32 sums (see `autocast_tensors`).
        let cast = autocast_tensors(op_names::LINEAR, &inputs)?;
        let (x, w, b) = match &cast {
            Some(c) => (&c[0], &c[1], c.get(2)),
            None => (self.tensor(), weight.tensor(), bias.map(Var::tensor)),
        };
        let wd = weight.dims().to_vec();
        let in_features = *self.dims().last().unwrap_or(&0);
        if wd.len() != 2 || self.rank() == 0 || wd[1] != in_features || bias.is_some_and(|b| b.dims() != [wd[0]]) {
            return Err(crate::AutogradError::Invalid {
                op: "linear",
                message: format!(
                    "input {:?} needs weight [out, {in_features}] and bias [out]; got weight {wd:?}{}",
                    self.dims(),
                    bias.map(|b| format!(" and bias {:?}", b.dims())).unwrap_or_default()
                ),
            });
        }
        let (out_features, rows) = (wd[0], self.numel() / in_features.max(1));
        let x2 = x.reshape(&[rows as isize, in_features as isize])?;
        let out = x2.matmul(&w.t()?)?;
        if let Some(b) = b {
            out.add_(b)?;
        }
        // The input's dims with the last (in_features, rank >= 1 checked above)
        // replaced by out_features.
        let mut out_dims: Vec<isize> = self.dims().iter().map(|&d| d as isize).collect();
        out_dims.pop();
        out_dims.push(out_features as isize);
        let out = out.reshape(&out_dims)?;
        let x_dims: Vec<isize> = self.dims().iter().map(|&d| d as isize).collect();
        // As PyTorch: the weight is kept only for the input's gradient and the
        // input only for the weight's (a frozen layer keeps no input; a first
        // layer, whose input needs no gradient, keeps no weight — under
        // autocast that weight is a half-precision copy).
        let (keep_x, keep_w) = (weight.requires_grad(), self.requires_grad());
        let saved = || {
            let mut saved = Vec::with_capacity(2);
            if keep_x {
                saved.push(x2.clone());
            }
            if keep_w {
                saved.push(w.clone());
            }
            saved
        };
        let (x_dtype, w_dtype, b_dtype) = (self.dtype(), weight.dtype(), bias.map(Var::dtype));
        let inputs: Vec<&Var> = std::iter::once(self).chain(std::iter::once(weight)).chain(bias).collect();
        Ok(record("linear", &inputs, out, saved, move |c| {
            let kept = |keep: bool, at: usize| {
                keep.then(|| c.saved.get(at)).flatten().ok_or_else(|| crate::AutogradError::Invalid {
                    op: "linear",
                    message: "internal: a gradient is needed that forward did not save for".into(),
                })
            };
            let g = c.grad.reshape(&[rows as isize, out_features as isize])?;
            // Each input's gradient in its own dtype (they differ under autocast).
            let own = |t: Tensor, dtype: DType| if t.dtype() == dtype { Ok(t) } else { t.to_dtype(dtype) };
            let gx = if c.needs(0) {
                Some(own(g.matmul(kept(keep_w, usize::from(keep_x))?)?, x_dtype)?.reshape(&x_dims)?)
            } else {
                None
            };
            let gw = if c.needs(1) {
                let (gt, x) = (g.t()?, kept(keep_x, 0)?);
                // Half operands summed straight into an f32 weight's gradient:
                // no rounding to half and no conversion pass, where the
                // device's kernels read half operands into f32 sums; others
                // (CUDA, which would widen both operands first) keep the
                // half product and its conversion.
                let widening = w_dtype == DType::F32
                    && matches!(gt.dtype(), DType::F16 | DType::BF16)
                    && gt.device().multiplies_half_into_f32();
                Some(if widening { gt.matmul_out_dtype(x, DType::F32)? } else { own(gt.matmul(x)?, w_dtype)? })
            } else {
                None
            };
            let mut grads = vec![gx, gw];
            if let Some(b_dtype) = b_dtype {
                grads.push(if c.needs(2) { Some(own(g.sum(&[0], false)?, b_dtype)?) } else { None });
            }
            Ok(grads)
        }))
    }

    /// The product of two matrices, `[n, m] · [m, p] -> [n, p]`
    /// (`torch.mm`): unlike [`Var::matmul`] no 1-d operand and no batch
    /// dims; an error names both shapes.
    ///
    /// ```
    /// use brasa_autograd::Var;
    /// use brasa_tensor::Tensor;
    /// let a = Var::new(Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], [2, 2])?);
    /// let b = Var::new(Tensor::from_vec(vec![1.0f64, 0.0, 0.0, 1.0], [2, 2])?);
    /// assert_eq!(a.mm(&b)?.tensor().to_vec::<f64>()?, [1.0, 2.0, 3.0, 4.0]);
    /// assert!(a.mm(&Var::new(Tensor::from_vec(vec![1.0f64; 3], [3])?)).is_err());
    /// # Ok::<(), brasa_autograd::AutogradError>(())
    /// ```
    pub fn mm(&self, mat2: &Var) -> Result<Var> {
        check_mm("mm", self.dims(), mat2.dims())?;
        self.matmul(mat2)
    }

    /// The batched product of `[b, n, m]` and `[b, m, p]` into `[b, n, p]`
    /// (`torch.bmm`): both 3-d with one batch size, no broadcasting; an
    /// error names both shapes.
    ///
    /// ```
    /// use brasa_autograd::Var;
    /// use brasa_tensor::{DType, Tensor};
    /// let a = Var::new(Tensor::ones([4, 2, 3], DType::F64)?);
    /// let b = Var::new(Tensor::ones([4, 3, 5], DType::F64)?);
    /// assert_eq!(a.bmm(&b)?.dims(), &[4, 2, 5]);
    /// assert!(a.bmm(&Var::new(Tensor::ones([1, 3, 5], DType::F64)?)).is_err());
    /// # Ok::<(), brasa_autograd::AutogradError>(())
    /// ```
    pub fn bmm(&self, mat2: &Var) -> Result<Var> {
        check_bmm("bmm", self.dims(), mat2.dims())?;
        self.matmul(mat2)
    }

    /// `beta · input + alpha · (mat1 · mat2)` (`torch.addmm`): `mat1` and
    /// `mat2` matrices as in [`Var::mm`], `input` (this `Var`) broadcastable
    /// to the `[n, p]` result. As in PyTorch, with `beta == 0` the input's
    /// values are ignored (a NaN there does not reach the result) and its
    /// gradient is zero.
    ///
    /// ```
    /// use brasa_autograd::Var;
    /// use brasa_tensor::Tensor;
    /// let bias = Var::new(Tensor::from_vec(vec![10.0f64, 20.0], [2])?);
    /// let m1 = Var::new(Tensor::from_vec(vec![1.0f64, 2.0], [1, 2])?);
    /// let m2 = Var::new(Tensor::from_vec(vec![1.0f64, 0.0, 0.0, 1.0], [2, 2])?);
    /// let out = bias.addmm(&m1, &m2, 0.5, 2.0)?;
    /// assert_eq!(out.tensor().to_vec::<f64>()?, [7.0, 14.0]);
    /// # Ok::<(), brasa_autograd::AutogradError>(())
    /// ```
    pub fn addmm(&self, mat1: &Var, mat2: &Var, beta: f64, alpha: f64) -> Result<Var> {
        // Under autocast all three operands take the policy's dtype, as
        // PyTorch casts them (a bf16 product added to an f32 input would
        // otherwise promote the result back to f32).
        if let Some(c) = autocast_inputs(op_names::ADDMM, &[self, mat1, mat2])? {
            return c[0].addmm(&c[1], &c[2], beta, alpha);
        }
        let out = check_mm("addmm", mat1.dims(), mat2.dims())?;
        check_input_broadcasts("addmm", self.dims(), &out)?;
        add_scaled(self, &mat1.matmul(mat2)?, beta, alpha)
    }

    /// `beta · input + alpha · (batch1 · batch2)` batched (`torch.baddbmm`):
    /// `batch1` `[b, n, m]` and `batch2` `[b, m, p]` as in [`Var::bmm`],
    /// `input` (this `Var`) broadcastable to `[b, n, p]`; `beta == 0`
    /// ignores the input as [`Var::addmm`] does.
    ///
    /// ```
    /// use brasa_autograd::Var;
    /// use brasa_tensor::{DType, Tensor};
    /// let input = Var::new(Tensor::ones([3, 1], DType::F64)?);
    /// let b1 = Var::new(Tensor::ones([2, 3, 4], DType::F64)?);
    /// let b2 = Var::new(Tensor::ones([2, 4, 5], DType::F64)?);
    /// let out = input.baddbmm(&b1, &b2, 1.0, 0.5)?;
    /// assert_eq!(out.dims(), &[2, 3, 5]);
    /// assert_eq!(out.tensor().to_vec::<f64>()?, vec![3.0; 30]);
    /// # Ok::<(), brasa_autograd::AutogradError>(())
    /// ```
    pub fn baddbmm(&self, batch1: &Var, batch2: &Var, beta: f64, alpha: f64) -> Result<Var> {
        if let Some(c) = autocast_inputs(op_names::BADDBMM, &[self, batch1, batch2])? {
            return c[0].baddbmm(&c[1], &c[2], beta, alpha);
        }
        let out = check_bmm("baddbmm", batch1.dims(), batch2.dims())?;
        check_input_broadcasts("baddbmm", self.dims(), &out)?;
        add_scaled(self, &batch1.matmul(batch2)?, beta, alpha)
    }
}

/// The `[n, p]` result shape of `mm`, or an error naming both shapes.
fn check_mm(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    if a.len() != 2 || b.len() != 2 {
        return Err(AutogradError::invalid(
            op,
            format!("expected two matrices (2-d), got shapes {a:?} and {b:?}; use matmul for other ranks"),
        ));
    }
    if a[1] != b[0] {
        return Err(AutogradError::invalid(
            op,
            format!("shapes {a:?} and {b:?} cannot be multiplied ({} columns vs {} rows)", a[1], b[0]),
        ));
    }
    Ok(vec![a[0], b[1]])
}

/// The `[b, n, p]` result shape of `bmm`, or an error naming both shapes.
fn check_bmm(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    if a.len() != 3 || b.len() != 3 {
        return Err(AutogradError::invalid(
            op,
            format!("expected two batches of matrices (3-d), got shapes {a:?} and {b:?}; use matmul to broadcast"),
        ));
    }
    if a[0] != b[0] {
        return Err(AutogradError::invalid(
            op,
            format!("batch sizes differ: shapes {a:?} and {b:?} ({} vs {}); bmm does not broadcast", a[0], b[0]),
        ));
    }
    if a[2] != b[1] {
        return Err(AutogradError::invalid(
            op,
            format!("shapes {a:?} and {b:?} cannot be multiplied ({} columns vs {} rows)", a[2], b[1]),
        ));
    }
    Ok(vec![a[0], a[1], b[2]])
}

/// Errors unless `input` broadcasts to `out` without growing it (PyTorch
/// expands the input to the product's shape, never the other way).
fn check_input_broadcasts(op: &'static str, input: &[usize], out: &[usize]) -> Result<()> {
    let fits = input.len() <= out.len() && input.iter().rev().zip(out.iter().rev()).all(|(&i, &o)| i == o || i == 1);
    if fits {
        Ok(())
    } else {
        Err(AutogradError::invalid(
            op,
            format!("input of shape {input:?} cannot be broadcast to the product's shape {out:?}"),
        ))
    }
}

/// `beta · input + alpha · product`, skipping the multiplies by 1. With
/// `beta == 0` the input's values are not read (PyTorch's rule: `0 · NaN`
/// must not reach the result) but it still gets a zero gradient.
fn add_scaled(input: &Var, product: &Var, beta: f64, alpha: f64) -> Result<Var> {
    let product = if alpha == 1.0 { product.clone() } else { product.mul_scalar(alpha)? };
    if beta == 0.0 {
        let (dims, dtype, device) = (input.dims().to_vec(), input.dtype(), input.device());
        let zero = Tensor::zeros_on([], product.dtype(), product.device())?;
        let ignored = record("input_times_zero", &[input], zero, Vec::new, move |_| {
            Ok(vec![Some(Tensor::zeros_on(dims.as_slice(), dtype, device)?)])
        });
        return product.add(&ignored);
    }
    let input = if beta == 1.0 { input.clone() } else { input.mul_scalar(beta)? };
    input.add(&product)
}
