//! Matrix products with PyTorch's rules (1-d operands, broadcast batch
//! dims): `da = g · bᵀ`, `db = aᵀ · g`, summed back over broadcast batch dims.

use super::sum_to;
use crate::error::Result;
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

    /// `self · rhsᵀ + bias`, the linear layer in one node (bias `[out]`).
    pub fn linear(&self, weight: &Var, bias: Option<&Var>) -> Result<Var> {
        let y = self.matmul(&weight.t()?)?;
        match bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }
}
