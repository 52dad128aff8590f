//! Joining and splitting along a dim: `Tensor::cat`, `Tensor::stack`,
//! `split` and `chunk`.
//!
//! `cat` writes each input into its block of a new contiguous tensor with
//! one pass of run-to-run copies (a strided input is read in its own
//! contiguous runs, whatever their length). `split` and `chunk` return
//! views, no copy.

use crate::backend::ops_for;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::shape::{resolve_dim, DimIndex, Shape};
use crate::tensor::Tensor;

/// Errors unless every tensor has the first one's device and rank, naming
/// the first one that differs by its position in the list; returns the
/// dtype they promote to together (`torch.cat`'s rule: [`DType::promote`]
/// over all inputs, the 0-d rule does not arise since cat refuses 0-d).
fn check_alike(op: &'static str, tensors: &[&Tensor]) -> Result<DType> {
    let Some(first) = tensors.first() else {
        return Err(TensorError::invalid(op, "expected a non-empty list of tensors"));
    };
    let mut dtype = first.dtype();
    for (i, t) in tensors.iter().enumerate().skip(1) {
        dtype = DType::promote(dtype, t.dtype());
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
    Ok(dtype)
}

impl Tensor {
    /// Concatenates `tensors` along `dim` into a new contiguous tensor. They
    /// must share device and rank, and have equal sizes in every other dim;
    /// an error names the first tensor (by position) that differs and how.
    /// Mixed dtypes promote to the common one as in `torch.cat` (f32 with
    /// bf16 gives f32, f16 with bf16 gives f32, i64 with f16 gives f16).
    /// 0-d tensors cannot be concatenated.
    ///
    /// ```
    /// use brasa_tensor::{DType, Device, Tensor};
    /// let a = Tensor::from_vec_on(vec![1.0f32, 2.0], [2], Device::CPU)?;
    /// let b = Tensor::from_vec_on(vec![3.0f32], [1], Device::CPU)?.to_dtype(DType::BF16)?;
    /// let joined = Tensor::cat(&[&a, &b], 0)?;
    /// assert_eq!(joined.dtype(), DType::F32);
    /// assert_eq!(joined.to_vec::<f32>()?, [1.0, 2.0, 3.0]);
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn cat(tensors: &[&Tensor], dim: impl DimIndex) -> Result<Tensor> {
        const OP: &str = "cat";
        let _range = brasa_profile::record_op(OP, &[]);
        let dtype = check_alike(OP, tensors)?;
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
        if tensors.iter().all(|t| t.dtype() == dtype) {
            return ops_for(first.device())?.concat(tensors, d, &shape);
        }
        // The backend joins tensors of one dtype: convert the others first
        // (the ones already in `dtype` are not copied by `to_dtype`).
        let converted = tensors.iter().map(|t| t.to_dtype(dtype)).collect::<Result<Vec<_>>>()?;
        ops_for(first.device())?.concat(&converted.iter().collect::<Vec<_>>(), d, &shape)
    }

    /// Stacks tensors of one shape along a new dim `dim` (which may be their
    /// rank, for a new last dim): `n` tensors of shape `[a, b]` stacked at
    /// dim 1 give `[a, n, b]`. Mixed dtypes promote as in [`Tensor::cat`].
    /// An error names the first tensor (by position) whose shape or device
    /// differs.
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
    use crate::{DType, Device, Tensor, TensorError};

    fn range(n: usize, shape: &[isize]) -> Tensor {
        Tensor::arange_on(0.0, n as f64, 1.0, DType::F32, Device::CPU).unwrap().reshape(shape).unwrap()
    }

    #[test]
    fn cat_stack_split_chunk() {
        let a = range(4, &[2, 2]);
        let b = range(6, &[2, 3]);
        let joined = Tensor::cat(&[&a, &b], 1).unwrap();
        assert_eq!(joined.to_vec::<f32>().unwrap(), [0.0, 1.0, 0.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 5.0]);
        let error = Tensor::cat(&[&a, &b], 0).unwrap_err();
        assert!(matches!(error, TensorError::Shape { op: "cat", .. }), "{error:?}");
        // It names the tensor of the list, its shape and the dim that differs.
        let error = error.to_string();
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

    #[test]
    fn mixed_dtypes_promote_like_torch_cat() {
        let a = range(4, &[2, 2]);
        // bf16 holds these small integers exactly.
        let b = range(6, &[2, 3]).to_dtype(DType::BF16).unwrap();
        let joined = Tensor::cat(&[&a, &b], 1).unwrap();
        assert_eq!(joined.dtype(), DType::F32);
        assert_eq!(joined.to_vec::<f32>().unwrap(), [0.0, 1.0, 0.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 5.0]);
        // Promotion over all inputs, not pairwise with the first: f16 with
        // bf16 is f32, then f64 wins; and the order does not matter.
        let h = range(2, &[2, 1]).to_dtype(DType::F16).unwrap();
        let d = range(2, &[2, 1]).to_dtype(DType::F64).unwrap();
        let bf = range(2, &[2, 1]).to_dtype(DType::BF16).unwrap();
        assert_eq!(Tensor::cat(&[&h, &bf], 1).unwrap().dtype(), DType::F32);
        let all = Tensor::cat(&[&h, &bf, &d], 1).unwrap();
        assert_eq!(all.dtype(), DType::F64);
        assert_eq!(all.to_vec::<f64>().unwrap(), [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
        // Integers with floats take the float; bool with i64 takes i64.
        let i = Tensor::from_vec_on(vec![7i64, -2], [2, 1], Device::CPU).unwrap();
        let ih = Tensor::cat(&[&i, &h], 0).unwrap();
        assert_eq!(ih.dtype(), DType::F16);
        assert_eq!(ih.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(), [7.0, -2.0, 0.0, 1.0]);
        let flags = Tensor::from_vec_on(vec![true, false], [2, 1], Device::CPU).unwrap();
        assert_eq!(Tensor::cat(&[&flags, &i], 0).unwrap().to_vec::<i64>().unwrap(), [1, 0, 7, -2]);
        // A non-contiguous input of another dtype.
        let t = range(6, &[2, 3]).to_dtype(DType::F64).unwrap().t().unwrap();
        assert!(!t.is_contiguous());
        let mixed = Tensor::cat(&[&t, &range(3, &[3, 1])], 1).unwrap();
        assert_eq!(mixed.dtype(), DType::F64);
        assert_eq!(mixed.to_vec::<f64>().unwrap(), [0.0, 3.0, 0.0, 1.0, 4.0, 1.0, 2.0, 5.0, 2.0]);
        // stack promotes too.
        let s = Tensor::stack(&[&a, &a.to_dtype(DType::F64).unwrap()], 0).unwrap();
        assert_eq!((s.dtype(), s.dims()), (DType::F64, &[2usize, 2, 2][..]));
        assert_eq!(s.to_vec::<f64>().unwrap(), [0.0, 1.0, 2.0, 3.0, 0.0, 1.0, 2.0, 3.0]);
        // Shapes are still checked with mixed dtypes.
        let error = Tensor::cat(&[&a, &b], 0).unwrap_err();
        assert!(matches!(error, TensorError::Shape { op: "cat", .. }), "{error:?}");
        let error = Tensor::stack(&[&a, &b], 0).unwrap_err();
        assert!(matches!(error, TensorError::Shape { op: "stack", .. }), "{error:?}");
    }
}
