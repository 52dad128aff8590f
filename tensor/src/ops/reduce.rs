//! Reductions over a list of dims: `sum`, `mean`, `max`, `min`, `argmax`,
//! `argmin`, `var` and `std`, with `keepdim`, plus `sum_all`/`mean_all`.
//!
//! # Dtypes (PyTorch's rules)
//! - `sum` of integers or `bool` is `i64`; of floats, the input dtype.
//! - `mean`, `var` and `std` need a floating-point tensor.
//! - `f16`/`bf16` sums, means and variances accumulate in `f32` and are
//!   rounded to the input dtype once, at the end.
//! - `max`/`min` keep the dtype; `argmax`/`argmin` give `i64`.
//!
//! The dims are resolved and checked here; the device walks the data
//! ([`crate::backend::DeviceOps::reduce`]: on the host, rows, columns or a
//! transposing copy picked from the strides, with broadcast dims read once).

use crate::backend::{ops_for, ReduceOp};
use crate::error::{Result, TensorError};
use crate::ops::common::expect_float;
use crate::shape::resolve_dim;
use crate::tensor::Tensor;

/// Resolves `dims` (empty = all) into a mask over the tensor's dims; a dim
/// listed twice is an error.
fn reduced_mask(x: &Tensor, op: &'static str, dims: &[isize]) -> Result<Vec<bool>> {
    let rank = x.rank();
    if dims.is_empty() {
        return Ok(vec![true; rank]);
    }
    // A 0-d tensor accepts dim 0 or -1 (once), as in PyTorch: it reduces
    // like a tensor of shape [1] and keeps no dim.
    let mut mask = vec![false; rank.max(1)];
    for &dim in dims {
        let d = resolve_dim(dim, rank.max(1), op)?;
        if std::mem::replace(&mut mask[d], true) {
            return Err(TensorError::invalid(op, format!("dim {d} appears more than once in the dims {dims:?}")));
        }
    }
    mask.truncate(rank);
    Ok(mask)
}

/// Errors when a reduced dim is empty: max, min and their positions have no
/// value over nothing.
fn refuse_empty(x: &Tensor, op: &'static str, dims: &[isize]) -> Result<()> {
    let mask = reduced_mask(x, op, dims)?;
    if let Some(d) = mask.iter().zip(x.dims()).position(|(&reduced, &size)| reduced && size == 0) {
        return Err(TensorError::shape(
            op,
            format!(
                "cannot reduce dim {d} of size 0 (shape {:?}): the {op} of no elements is undefined; reduce other dims or check the input",
                x.dims()
            ),
        ));
    }
    Ok(())
}

/// `op` over `dims` of `x` by its device: sums, means and variances in
/// the accumulator dtype (f32 for f16/bf16/f32, f64, i64 for integers and
/// bool), max and min in `x`'s, positions in i64.
fn reduce(x: &Tensor, op: ReduceOp, name: &'static str, dims: &[isize], keepdim: bool) -> Result<Tensor> {
    let mask = reduced_mask(x, name, dims)?;
    let _range = brasa_profile::record_op(name, &[x.dims()]);
    ops_for(x.device())?.reduce(op, name, x, &mask, keepdim)
}

impl Tensor {
    /// The sum over `dims` (negative dims count from the end; an empty list
    /// reduces every dim). With `keepdim`, reduced dims stay as size 1.
    /// Integer and `bool` tensors sum into `i64`; `f16`/`bf16` accumulate in
    /// `f32`. Float sums are pairwise (accurate to about `log2(n)` roundings).
    pub fn sum(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        let out = reduce(self, ReduceOp::Sum, "sum", dims, keepdim)?;
        if self.dtype().is_float() {
            out.to_dtype(self.dtype())
        } else {
            Ok(out)
        }
    }

    /// The sum of every element as a 0-d tensor (see [`Tensor::sum`]).
    pub fn sum_all(&self) -> Result<Tensor> {
        self.sum(&[], false)
    }

    /// The mean over `dims` (empty = all), for floating-point tensors (an
    /// integer tensor is an error, as in PyTorch). `f16`/`bf16` accumulate in
    /// `f32`. The mean of no elements is NaN.
    pub fn mean(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        expect_float("mean", self)?;
        reduce(self, ReduceOp::Mean, "mean", dims, keepdim)?.to_dtype(self.dtype())
    }

    /// The mean of every element as a 0-d tensor (see [`Tensor::mean`]).
    pub fn mean_all(&self) -> Result<Tensor> {
        self.mean(&[], false)
    }

    /// The unbiased variance over `dims` (empty = all): `Σ(x - mean)² / (N - 1)`,
    /// PyTorch's default. See [`Tensor::var_with_correction`].
    pub fn var(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.var_with_correction(dims, 1, keepdim)
    }

    /// The variance over `dims` (empty = all): `Σ(x - mean)² / max(N - correction, 0)`
    /// (`correction` 1 is unbiased, 0 the population variance). Floating-point
    /// tensors only; computed in two passes (mean, then squared deviations),
    /// in `f32` for `f16`/`bf16`. A zero divisor gives inf or NaN, as in PyTorch.
    pub fn var_with_correction(&self, dims: &[isize], correction: usize, keepdim: bool) -> Result<Tensor> {
        self.variance("var", dims, correction, keepdim, false)
    }

    /// The unbiased standard deviation over `dims` (empty = all): the square
    /// root of [`Tensor::var`].
    pub fn std(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.std_with_correction(dims, 1, keepdim)
    }

    /// The standard deviation with a given `correction` (see
    /// [`Tensor::var_with_correction`]).
    pub fn std_with_correction(&self, dims: &[isize], correction: usize, keepdim: bool) -> Result<Tensor> {
        self.variance("std", dims, correction, keepdim, true)
    }

    fn variance(
        &self,
        op: &'static str,
        dims: &[isize],
        correction: usize,
        keepdim: bool,
        sqrt: bool,
    ) -> Result<Tensor> {
        expect_float(op, self)?;
        reduce(self, ReduceOp::Var { correction, sqrt }, op, dims, keepdim)?.to_dtype(self.dtype())
    }

    /// The largest value over `dims` (empty = all), in this tensor's dtype;
    /// NaN wins. Reducing a dim of size 0 is an error naming the dim.
    pub fn max(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        refuse_empty(self, "max", dims)?;
        reduce(self, ReduceOp::Max, "max", dims, keepdim)
    }

    /// The smallest value over `dims` (empty = all); NaN wins. Reducing a dim
    /// of size 0 is an error naming the dim.
    pub fn min(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        refuse_empty(self, "min", dims)?;
        reduce(self, ReduceOp::Min, "min", dims, keepdim)
    }

    /// The `i64` position of the largest value over `dims` (empty = all):
    /// the first one on ties and the first NaN if any, as in PyTorch. Over
    /// several dims the position is the row-major index within the reduced
    /// dims (the flat index when reducing all). A dim of size 0 is an error.
    pub fn argmax(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        refuse_empty(self, "argmax", dims)?;
        reduce(self, ReduceOp::ArgMax, "argmax", dims, keepdim)
    }

    /// The `i64` position of the smallest value over `dims` (see
    /// [`Tensor::argmax`]).
    pub fn argmin(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        refuse_empty(self, "argmin", dims)?;
        reduce(self, ReduceOp::ArgMin, "argmin", dims, keepdim)
    }
}

#[cfg(test)]
mod tests {
    use crate::{DType, Device, Tensor, TensorError};

    fn matrix() -> Tensor {
        Tensor::from_vec_on(vec![1f32, 5.0, 3.0, 4.0, 2.0, 6.0], [2, 3], Device::CPU).unwrap()
    }

    #[test]
    fn sums_along_rows_columns_and_all() {
        let m = matrix();
        assert_eq!(m.sum(&[1], false).unwrap().to_vec::<f32>().unwrap(), [9.0, 12.0]);
        assert_eq!(m.sum(&[0], true).unwrap().dims(), [1, 3]);
        assert_eq!(m.sum(&[-2], false).unwrap().to_vec::<f32>().unwrap(), [5.0, 7.0, 9.0]);
        assert_eq!(m.sum_all().unwrap().dims(), [] as [usize; 0]);
        assert_eq!(m.sum_all().unwrap().item::<f64>().unwrap(), 21.0);
        assert_eq!(m.t().unwrap().sum(&[1], false).unwrap().to_vec::<f32>().unwrap(), [5.0, 7.0, 9.0]);
        let ints = Tensor::from_vec_on(vec![true, false, true], [3], Device::CPU).unwrap();
        let count = ints.sum_all().unwrap();
        assert_eq!((count.dtype(), count.item::<i64>().unwrap()), (DType::I64, 2));
    }

    #[test]
    fn extrema_and_positions() {
        let m = matrix();
        assert_eq!(m.max(&[1], false).unwrap().to_vec::<f32>().unwrap(), [5.0, 6.0]);
        assert_eq!(m.min(&[0], false).unwrap().to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0]);
        assert_eq!(m.argmax(&[], false).unwrap().item::<i64>().unwrap(), 5);
        assert_eq!(m.argmin(&[1], true).unwrap().to_vec::<i64>().unwrap(), [0, 1]);
        let empty = Tensor::zeros_on([2, 0], DType::F32, Device::CPU).unwrap();
        let error = empty.max(&[1], false).unwrap_err();
        assert!(matches!(error, TensorError::Shape { op: "max", .. }), "{error:?}");
        assert_eq!(empty.max(&[0], false).unwrap().dims(), [0]);
    }

    #[test]
    fn mean_and_var_follow_pytorch() {
        let m = matrix();
        assert_eq!(m.mean(&[1], false).unwrap().to_vec::<f32>().unwrap(), [3.0, 4.0]);
        assert_eq!(m.var(&[1], false).unwrap().to_vec::<f32>().unwrap(), [4.0, 4.0]);
        assert_eq!(m.var_with_correction(&[0], 0, false).unwrap().to_vec::<f32>().unwrap(), [2.25, 2.25, 2.25]);
        assert_eq!(m.std(&[1], false).unwrap().to_vec::<f32>().unwrap(), [2.0, 2.0]);
        let ints = Tensor::from_vec_on(vec![1i64, 2], [2], Device::CPU).unwrap();
        let error = ints.mean(&[], false).unwrap_err();
        assert!(matches!(error, TensorError::UnsupportedDType { op: "mean", dtype: DType::I64, .. }), "{error:?}");
        let empty = Tensor::zeros_on([0], DType::F32, Device::CPU).unwrap();
        assert!(empty.mean_all().unwrap().item::<f32>().unwrap().is_nan());
        assert_eq!(empty.sum_all().unwrap().item::<f32>().unwrap(), 0.0);
        let error = m.sum(&[1, -1], false).unwrap_err();
        assert!(matches!(error, TensorError::Invalid { op: "sum", .. }), "{error:?}");
    }
}
