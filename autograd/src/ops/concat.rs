//! Concatenation, stacking and splitting: `cat` and `stack` hand each input
//! its slice of the gradient; `split` and `chunk` are `narrow`s.

use crate::error::{AutogradError, Result};
use crate::op_names;
use crate::precision::autocast_inputs;
use crate::var::{record, Var};
use brasa_tensor::{resolve_dim, DType, Tensor, TensorError};

impl Var {
    /// Concatenates along `dim` (see `Tensor::cat`); mixed dtypes promote
    /// to the common one, and each input's gradient comes back in its own
    /// dtype (as PyTorch's `cat_tensors_backward` does).
    pub fn cat(vars: &[&Var], dim: isize) -> Result<Var> {
        if let Some(c) = autocast_inputs(op_names::CAT, vars)? {
            return Var::cat(&c.iter().collect::<Vec<_>>(), dim);
        }
        let tensors: Vec<&Tensor> = vars.iter().map(|v| v.tensor()).collect();
        let out = Tensor::cat(&tensors, dim)?;
        let rank = vars.first().map(|v| v.rank()).unwrap_or(1);
        let d = resolve_dim(dim, rank, "cat").map_err(TensorError::from)?;
        let sizes: Vec<(usize, DType)> = vars.iter().map(|v| (v.dims()[d], v.dtype())).collect();
        Ok(record("cat", vars, out, Vec::new, move |c| {
            let mut start = 0;
            let mut grads = Vec::with_capacity(sizes.len());
            for (i, &(len, dtype)) in sizes.iter().enumerate() {
                grads.push(c.needs(i).then(|| c.grad.narrow(d, start, len)?.to_dtype(dtype)).transpose()?);
                start += len;
            }
            Ok(grads)
        }))
    }

    /// Stacks `Var`s of one shape along a new dim `dim`; mixed dtypes promote
    /// and each gradient comes back in its input's dtype, as for [`Var::cat`].
    pub fn stack(vars: &[&Var], dim: isize) -> Result<Var> {
        if let Some(c) = autocast_inputs(op_names::STACK, vars)? {
            return Var::stack(&c.iter().collect::<Vec<_>>(), dim);
        }
        let tensors: Vec<&Tensor> = vars.iter().map(|v| v.tensor()).collect();
        let out = Tensor::stack(&tensors, dim)?;
        let d = resolve_dim(dim, out.rank(), "stack").map_err(TensorError::from)?;
        let dtypes: Vec<DType> = vars.iter().map(|v| v.dtype()).collect();
        Ok(record("stack", vars, out, Vec::new, move |c| {
            dtypes
                .iter()
                .enumerate()
                .map(|(i, &dtype)| Ok(c.needs(i).then(|| c.grad.select(d, i)?.to_dtype(dtype)).transpose()?))
                .collect()
        }))
    }

    /// Consecutive pieces of `split_size` along `dim` (the last may be shorter).
    pub fn split(&self, split_size: usize, dim: isize) -> Result<Vec<Var>> {
        let d = resolve_dim(dim, self.rank(), "split").map_err(TensorError::from)?;
        let size = self.dims()[d];
        if split_size == 0 {
            return Err(AutogradError::invalid("split", "split_size must be positive"));
        }
        (0..size).step_by(split_size).map(|start| self.narrow(d, start, split_size.min(size - start))).collect()
    }

    /// `chunks` pieces of `ceil(size / chunks)` along `dim` (PyTorch's rule).
    pub fn chunk(&self, chunks: usize, dim: isize) -> Result<Vec<Var>> {
        let d = resolve_dim(dim, self.rank(), "chunk").map_err(TensorError::from)?;
        if chunks == 0 {
            return Err(AutogradError::invalid("chunk", "chunks must be positive"));
        }
        self.split(self.dims()[d].div_ceil(chunks).max(1), d as isize)
    }
}
