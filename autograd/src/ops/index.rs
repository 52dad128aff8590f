//! Indexing: `index_select`, `gather` and `embedding` (optionally with a
//! padding row that gets no gradient), whose gradients are scatter-adds
//! into zeros (repeated indices accumulate).

use crate::error::{AutogradError, Result};
use crate::var::{record, Var};
use brasa_tensor::{resolve_dim, Tensor, TensorError};

/// `indices` (1-d) as an index tensor of `shape` for scatter along `dim`.
fn spread(indices: &Tensor, dim: usize, shape: &[usize]) -> Result<Tensor> {
    let mut view = vec![1isize; shape.len()];
    view[dim] = indices.numel() as isize;
    Ok(indices.reshape(&view)?.broadcast_as(shape)?.contiguous()?)
}

impl Var {
    /// The slices `indices[j]` of `dim` (a 0-d or 1-d `i64` tensor).
    pub fn index_select(&self, dim: isize, indices: &Tensor) -> Result<Var> {
        let d = resolve_dim(dim, self.rank(), "index_select").map_err(TensorError::from)?;
        let out = self.tensor().index_select(d, indices)?;
        let shape = self.dims().to_vec();
        let indices = indices.clone();
        Ok(record(
            "index_select",
            &[self],
            out,
            || vec![indices],
            move |c| {
                let g = c.grad.contiguous()?;
                let index = spread(&c.saved[0], d, g.dims())?;
                // Into fresh zeros in place (`scatter_add` would copy them first).
                let grad = g.new_zeros(shape.clone())?;
                grad.scatter_add_(d, &index, &g)?;
                Ok(vec![Some(grad)])
            },
        ))
    }

    /// PyTorch's `gather` along `dim` with an `i64` index of this rank.
    pub fn gather(&self, dim: isize, index: &Tensor) -> Result<Var> {
        let d = resolve_dim(dim, self.rank(), "gather").map_err(TensorError::from)?;
        let out = self.tensor().gather(d, index)?;
        let shape = self.dims().to_vec();
        let index = index.clone();
        Ok(record(
            "gather",
            &[self],
            out,
            || vec![index],
            move |c| {
                let g = c.grad.contiguous()?;
                let grad = g.new_zeros(shape.clone())?;
                grad.scatter_add_(d, &c.saved[0], &g)?;
                Ok(vec![Some(grad)])
            },
        ))
    }

    /// Rows of `weight` (`[vocabulary, dim]`) for `ids` (`i64`, any shape).
    pub fn embedding(weight: &Var, ids: &Tensor) -> Result<Var> {
        Var::embedding_padded(weight, ids, None)
    }

    /// [`Var::embedding`] where the row `padding_idx`, if given, gets no
    /// gradient: its lookups still return the row, but backward leaves it
    /// out (PyTorch's `F.embedding(..., padding_idx=p)`). `padding_idx` must
    /// be a row of `weight`.
    ///
    /// ```
    /// use brasa_autograd::Var;
    /// use brasa_tensor::Tensor;
    ///
    /// let w = Var::param(Tensor::ones([3, 2], brasa_tensor::DType::F64)?)?;
    /// let ids = Tensor::from_vec(vec![0i64, 2, 2], [3])?;
    /// Var::embedding_padded(&w, &ids, Some(2))?.sum_all()?.backward()?;
    /// assert_eq!(w.grad().unwrap().to_vec::<f64>()?, [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
    /// # Ok::<(), brasa_autograd::AutogradError>(())
    /// ```
    pub fn embedding_padded(weight: &Var, ids: &Tensor, padding_idx: Option<usize>) -> Result<Var> {
        if let Some(p) = padding_idx {
            let vocabulary = weight.dims().first().copied().unwrap_or(0);
            if p >= vocabulary {
                return Err(AutogradError::invalid(
                    "embedding",
                    format!(
                        "padding_idx {p} is out of range for a weight of shape {:?} ({vocabulary} rows)",
                        weight.dims()
                    ),
                ));
            }
        }
        let out = Tensor::embedding(weight.tensor(), ids)?;
        let shape = weight.dims().to_vec();
        let ids = ids.clone();
        Ok(record(
            "embedding",
            &[weight],
            out,
            || vec![ids],
            move |c| {
                let width = shape.get(1).copied().unwrap_or(1);
                let g = c.grad.reshape(&[-1, width as isize])?.contiguous()?;
                let flat = c.saved[0].reshape(&[-1])?;
                let index = spread(&flat, 0, g.dims())?;
                let grad = g.new_zeros(shape.clone())?;
                grad.scatter_add_(0, &index, &g)?;
                if let Some(p) = padding_idx {
                    // A fresh tensor: zeroing its row in place touches nothing else.
                    grad.narrow(0, p, 1)?.zero_()?;
                }
                Ok(vec![Some(grad)])
            },
        ))
    }
}
