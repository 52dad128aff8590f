//! Joining and splitting along a dim: `Tensor::cat`, `Tensor::stack`,
//! `split` and `chunk`.
//!
//! `cat` writes each input into its block of a new contiguous tensor with
//! one pass of run-to-run copies (a strided input is read in its own
//! contiguous runs, whatever their length). `split` and `chunk` return
//! views, no copy.

use crate::backend::for_device;
use crate::error::{Result, TensorError};
use crate::shape::{resolve_dim, DimIndex, Shape};
use crate::tensor::Tensor;

/// Errors unless every tensor has the first one's dtype, device and rank,
/// naming the first one that differs by its position in the list.
fn check_alike(op: &'static str, tensors: &[&Tensor]) -> Result<()> {
    let Some(first) = tensors.first() else {
        return Err(TensorError::invalid(op, "expected a non-empty list of tensors"));
    };
    for (i, t) in tensors.iter().enumerate().skip(1) {
        if t.dtype() != first.dtype() {
            return Err(TensorError::invalid(
                op,
                format!("tensor {i} has dtype {} but tensor 0 has dtype {}", t.dtype(), first.dtype()),
            ));
        }
        if t.device() != first.device() {
            return Err(TensorError::invalid(
                op,
                format!("tensor {i} is on {} but tensor 0 is on {}", t.device(), first.device()),
            ));
        }
        if t.rank() != first.rank() {
            return Err(TensorError::shape(
                op,
                format!(
                    "tensor {i} has shape {:?} ({} dims) but tensor 0 has shape {:?} ({} dims)",
                    t.dims(),
                    t.rank(),
                    first.dims(),
                    first.rank()
                ),
            ));
        }
    }
    Ok(())
}

impl Tensor {
    /// Concatenates `tensors` along `dim` into a new contiguous tensor. They
    /// must share dtype, device and rank, and have equal sizes in every other
    /// dim; an error names the first tensor (by position) that differs and
    /// how. 0-d tensors cannot be concatenated.
    pub fn cat(tensors: &[&Tensor], dim: impl DimIndex) -> Result<Tensor> {
        const OP: &str = "cat";
        let _range = brasa_profile::record_op(OP, &[]);
        check_alike(OP, tensors)?;
        let first = tensors[0];
        if first.rank() == 0 {
            return Err(TensorError::shape(OP, "cannot concatenate 0-d tensors; unsqueeze them or use stack"));
        }
        let d = resolve_dim(dim, first.rank(), OP)?;
        let mut total = 0usize;
        for (i, t) in tensors.iter().enumerate() {
            let differs = t.dims().iter().zip(first.dims()).enumerate().find(|&(axis, (a, b))| axis != d && a != b);
            if let Some((axis, (size, expected))) = differs {
                return Err(TensorError::shape(
                    OP,
                    format!(
                        "tensor {i} has shape {:?} but tensor 0 has shape {:?}: dim {axis} is {size}, expected {expected} \
                         (only dim {d} may differ)",
                        t.dims(),
                        first.dims()
                    ),
                ));
            }
            total =
                total.checked_add(t.dims()[d]).ok_or_else(|| TensorError::invalid(OP, "the total size overflows"))?;
        }
        let mut dims = first.dims().to_vec();
        dims[d] = total;
        let shape = Shape::from(dims);
        for_device(first.device())?.concat(tensors, d, &shape)
    }

    /// Stacks tensors of one shape along a new dim `dim` (which may be their
    /// rank, for a new last dim): `n` tensors of shape `[a, b]` stacked at
    /// dim 1 give `[a, n, b]`. An error names the first tensor (by position)
    /// whose shape, dtype or device differs.
    pub fn stack(tensors: &[&Tensor], dim: impl DimIndex) -> Result<Tensor> {
        const OP: &str = "stack";
        let _range = brasa_profile::record_op(OP, &[]);
        check_alike(OP, tensors)?;
        let first = tensors[0];
        for (i, t) in tensors.iter().enumerate() {
            if t.dims() != first.dims() {
                return Err(TensorError::shape(
                    OP,
                    format!(
                        "tensor {i} has shape {:?} but tensor 0 has shape {:?}; stack needs equal shapes",
                        t.dims(),
                        first.dims()
                    ),
                ));
            }
        }
        let d = resolve_dim(dim, first.rank() + 1, OP)?;
        let expanded = tensors.iter().map(|t| t.unsqueeze(d)).collect::<Result<Vec<_>>>()?;
        Tensor::cat(&expanded.iter().collect::<Vec<_>>(), d)
    }

    /// Views of consecutive pieces of `split_size` elements along `dim`; the
    /// last is shorter when the size does not divide evenly. A `split_size`
    /// of 0 is an error unless the dim is empty.
    pub fn split(&self, split_size: usize, dim: impl DimIndex) -> Result<Vec<Tensor>> {
        const OP: &str = "split";
        let d = resolve_dim(dim, self.rank(), OP)?;
        let size = self.dims()[d];
        if split_size == 0 {
            if size == 0 {
                return Ok(vec![self.clone()]);
            }
            return Err(TensorError::invalid(OP, format!("split_size 0 cannot split dim {d} of size {size}")));
        }
        if size == 0 {
            return Ok(vec![self.clone()]);
        }
        // An expanded dim can be far longer than memory allows pieces for.
        let pieces = size.div_ceil(split_size);
        let mut views = Vec::new();
        views.try_reserve_exact(pieces).map_err(|_| {
            TensorError::invalid(
                OP,
                format!("splitting dim {d} of size {size} into {pieces} pieces takes too much memory"),
            )
        })?;
        for start in (0..size).step_by(split_size) {
            views.push(self.narrow(d, start, split_size.min(size - start))?);
        }
        Ok(views)
    }

    /// Splits `dim` into `chunks` views as PyTorch does: pieces of
    /// `ceil(size / chunks)` elements, the last one shorter, so fewer than
    /// `chunks` pieces may come back (`chunk(4)` of 6 elements gives 3 of 2).
    /// `chunks` must be positive.
    pub fn chunk(&self, chunks: usize, dim: impl DimIndex) -> Result<Vec<Tensor>> {
        const OP: &str = "chunk";
        if chunks == 0 {
            return Err(TensorError::invalid(OP, "chunks must be at least 1, got 0"));
        }
        let d = resolve_dim(dim, self.rank(), OP)?;
        let size = self.dims()[d];
        self.split(size.div_ceil(chunks), d)
    }
}

#[cfg(test)]
mod tests {
    use crate::{DType, Device, Tensor};

    fn range(n: usize, shape: &[isize]) -> Tensor {
        Tensor::arange_on(0.0, n as f64, 1.0, DType::F32, Device::CPU).unwrap().reshape(shape).unwrap()
    }

    #[test]
    fn cat_stack_split_chunk() {
        let a = range(4, &[2, 2]);
        let b = range(6, &[2, 3]);
        let joined = Tensor::cat(&[&a, &b], 1).unwrap();
        assert_eq!(joined.to_vec::<f32>().unwrap(), [0.0, 1.0, 0.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 5.0]);
        let error = Tensor::cat(&[&a, &b], 0).unwrap_err().to_string();
        assert!(error.contains("tensor 1 has shape [2, 3]") && error.contains("dim 1 is 3, expected 2"), "{error}");
        let stacked = Tensor::stack(&[&a, &a.t().unwrap()], -1).unwrap();
        assert_eq!(stacked.dims(), [2, 2, 2]);
        assert_eq!(stacked.to_vec::<f32>().unwrap(), [0.0, 0.0, 1.0, 2.0, 2.0, 1.0, 3.0, 3.0]);
        let pieces = range(5, &[5]).split(2, 0).unwrap();
        assert_eq!(pieces.iter().map(|p| p.dims()[0]).collect::<Vec<_>>(), [2, 2, 1]);
        assert!(pieces[1].shares_storage_with(&pieces[0]));
        let chunks = range(6, &[6]).chunk(4, 0).unwrap();
        assert_eq!(chunks.iter().map(|p| p.dims()[0]).collect::<Vec<_>>(), [2, 2, 2]);
        assert!(Tensor::cat(&[], 0).is_err());
    }
}
