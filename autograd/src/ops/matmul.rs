//! Matrix products with PyTorch's rules (1-d operands, broadcast batch
//! dims): `da = g · bᵀ`, `db = aᵀ · g`, summed back over broadcast batch dims.

use super::sum_to;
use crate::error::Result;
use crate::precision::autocast_inputs;
use crate::var::{record, Var};
use brasa_tensor::Tensor;

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
        if let Some(c) = autocast_inputs("matmul", &[self, rhs])? {
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
        if let Some(c) = autocast_inputs("linear", &inputs)? {
            return c[0].linear(&c[1], c.get(2));
        }
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
        let x2 = self.tensor().reshape(&[rows as isize, in_features as isize])?;
        let out = x2.matmul(&weight.tensor().t()?)?;
        if let Some(b) = bias {
            out.add_(b.tensor())?;
        }
        // The input's dims with the last (in_features, rank >= 1 checked above)
        // replaced by out_features.
        let mut out_dims: Vec<isize> = self.dims().iter().map(|&d| d as isize).collect();
        out_dims.pop();
        out_dims.push(out_features as isize);
        let out = out.reshape(&out_dims)?;
        let x_dims: Vec<isize> = self.dims().iter().map(|&d| d as isize).collect();
        let has_bias = bias.is_some();
        let saved = || vec![x2.clone(), weight.tensor().clone()];
        let inputs: Vec<&Var> = std::iter::once(self).chain(std::iter::once(weight)).chain(bias).collect();
        Ok(record("linear", &inputs, out, saved, move |c| {
            let (x, w) = (&c.saved[0], &c.saved[1]);
            let g = c.grad.reshape(&[rows as isize, out_features as isize])?;
            let gx = if c.needs(0) { Some(g.matmul(w)?.reshape(&x_dims)?) } else { None };
            let gw = if c.needs(1) { Some(g.t()?.matmul(x)?) } else { None };
            let mut grads = vec![gx, gw];
            if has_bias {
                grads.push(if c.needs(2) { Some(g.sum(&[0], false)?) } else { None });
            }
            Ok(grads)
        }))
    }
}
