//! Memory formats of 4-d `[N, C, H, W]` tensors, PyTorch's
//! `memory_format`: the usual row-major layout (`contiguous_format`, NCHW)
//! or channels-last (`channels_last`, NHWC), where one pixel's channels lie
//! next to each other. The shape stays `[N, C, H, W]` either way; only the
//! strides differ. Convolutions on cuDNN take both as they are (tensor cores
//! prefer channels-last) and give their output in the input's format.
//!
//! Any tensor whose elements fill their storage span without gaps or
//! overlaps, in some order of its dims, is *dense*
//! ([`Tensor::dense_dim_order`]): row-major and channels-last tensors are,
//! and so is a transposed matrix. Element-wise work on dense tensors that
//! share an order can walk their memory straight through (the fused
//! optimizers do), and [`Tensor::zeros_like_preserve_format`] makes a new
//! tensor in another's order (PyTorch's `memory_format=torch.preserve_format`).
//!
//! ```
//! # use brasa_tensor::{DType, Tensor};
//! let x = Tensor::arange(0.0, 24.0, 1.0, DType::F32)?.reshape(&[1, 2, 3, 4])?;
//! let y = x.to_channels_last()?;
//! assert_eq!(y.dims(), x.dims());
//! assert_eq!(y.strides(), &[24, 1, 8, 2]);
//! assert!(y.is_channels_last() && !y.is_contiguous());
//! assert_eq!(y.to_vec::<f32>()?, x.to_vec::<f32>()?); // same values
//! # Ok::<(), brasa_tensor::TensorError>(())
//! ```

use crate::error::Result;
use crate::ops::common::expect_rank;
use crate::tensor::Tensor;

impl Tensor {
    /// This 4-d `[N, C, H, W]` tensor with channels-last strides (those of
    /// a row-major `[N, H, W, C]`), PyTorch's
    /// `x.to(memory_format=torch.channels_last)`: the data is copied into
    /// that order, unless it already lies so (then this is `self`, sharing
    /// its storage). An error for any other rank.
    pub fn to_channels_last(&self) -> Result<Tensor> {
        expect_rank("to_channels_last", self, 4)?;
        if self.is_channels_last() {
            return Ok(self.clone());
        }
        // A strided copy in NHWC order, seen again as NCHW.
        self.permute(&[0, 2, 3, 1])?.contiguous()?.permute(&[0, 3, 1, 2])
    }

    /// The order of dims, outermost first, in which this tensor's elements
    /// lie one after another in memory (`[0, 2, 3, 1]` for a channels-last
    /// image, `[0, 1, …]` for a contiguous tensor): `self.permute(order)` is
    /// then a contiguous view of the same storage. `None` when there is no
    /// such order: a tensor with gaps (a slice of every other row), or one
    /// whose elements overlap (an expanded view).
    ///
    /// ```
    /// # use brasa_tensor::{DType, Tensor};
    /// let x = Tensor::zeros([2, 3, 4, 5], DType::F32)?;
    /// assert_eq!(x.dense_dim_order(), Some(vec![0, 1, 2, 3]));
    /// assert_eq!(x.to_channels_last()?.dense_dim_order(), Some(vec![0, 2, 3, 1]));
    /// assert_eq!(x.narrow(3, 0, 2)?.dense_dim_order(), None); // gaps
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn dense_dim_order(&self) -> Option<Vec<usize>> {
        let identity: Vec<usize> = (0..self.rank()).collect();
        if self.is_contiguous() {
            return Some(identity);
        }
        let strides = self.strides();
        let mut order = identity;
        // Outermost (largest stride) first; the sort is stable, so dims of
        // equal stride (only size-1 dims can tie with another) keep their
        // places.
        order.sort_by(|&a, &b| strides[b].cmp(&strides[a]));
        self.permute(&order).ok().filter(Tensor::is_contiguous).map(|_| order)
    }

    /// Zeros of this tensor's shape, dtype and device, laid out in this
    /// tensor's [`dense_dim_order`](Tensor::dense_dim_order) (a
    /// channels-last tensor gives channels-last zeros), or contiguous when
    /// it has none: PyTorch's `zeros_like(x,
    /// memory_format=torch.preserve_format)`. Optimizer state made this way
    /// walks memory in step with its parameter.
    ///
    /// ```
    /// # use brasa_tensor::{DType, Tensor};
    /// let w = Tensor::ones([8, 3, 3, 3], DType::F32)?.to_channels_last()?;
    /// let state = w.zeros_like_preserve_format()?;
    /// assert_eq!(state.strides(), w.strides());
    /// assert_eq!(state.dims(), w.dims());
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn zeros_like_preserve_format(&self) -> Result<Tensor> {
        match self.dense_dim_order() {
            Some(order) if !self.is_contiguous() => {
                let dims: Vec<usize> = order.iter().map(|&d| self.dims()[d]).collect();
                Tensor::zeros_on(dims, self.dtype(), self.device())?.permute(&inverse(&order))
            }
            _ => self.zeros_like(),
        }
    }

    /// A copy of this tensor (new storage, owned by nobody else) laid out
    /// in `like`'s [`dense_dim_order`](Tensor::dense_dim_order), or
    /// row-major when `like` has none; `like` has this tensor's shape. What
    /// autograd makes of a gradient for a channels-last weight.
    ///
    /// ```
    /// # use brasa_tensor::{DType, Tensor};
    /// let w = Tensor::zeros([8, 3, 3, 3], DType::F32)?.to_channels_last()?;
    /// let g = Tensor::ones([8, 3, 3, 3], DType::F32)?;
    /// let laid_out = g.copy_in_layout_of(&w)?;
    /// assert_eq!(laid_out.strides(), w.strides());
    /// assert_eq!(laid_out.to_vec::<f32>()?, g.to_vec::<f32>()?);
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn copy_in_layout_of(&self, like: &Tensor) -> Result<Tensor> {
        // `copy_to` always makes new, row-major storage (element-wise ops
        // would keep a channels-last operand's layout).
        let row_major_copy = |t: &Tensor| t.copy_to(t.device(), t.dtype());
        let order = like.dense_dim_order().filter(|_| !like.is_contiguous());
        match order {
            // A row-major copy of the permuted view is `like`'s layout once
            // permuted back.
            Some(order) if self.dims() == like.dims() => {
                row_major_copy(&self.permute(&order)?)?.permute(&inverse(&order))
            }
            _ => row_major_copy(self),
        }
    }

    /// Whether this 4-d tensor is channels-last and not also row-major (a
    /// tensor with one channel or a 1×1 image is both, and says nothing).
    pub(crate) fn is_strictly_channels_last(&self) -> bool {
        self.rank() == 4 && !self.is_contiguous() && self.is_channels_last()
    }

    /// Whether this is a 4-d tensor whose elements lie in channels-last
    /// order, one after another (PyTorch's
    /// `x.is_contiguous(memory_format=torch.channels_last)`): size-1 dims
    /// may have any stride, so a tensor with one channel or a 1×1 image can
    /// be both this and [`Tensor::is_contiguous`].
    pub fn is_channels_last(&self) -> bool {
        let (dims, strides) = (self.dims(), self.strides());
        if dims.len() != 4 {
            return false;
        }
        if self.numel() == 0 {
            return true;
        }
        // Innermost first: C, then W, H, N.
        let mut expected = 1isize;
        for dim in [1, 3, 2, 0] {
            if dims[dim] != 1 {
                if strides[dim] != expected {
                    return false;
                }
                expected = expected.saturating_mul(dims[dim] as isize);
            }
        }
        true
    }
}

/// NHWC as a permutation of NCHW's dims, and back.
pub(crate) const TO_NHWC: [usize; 4] = [0, 2, 3, 1];
pub(crate) const TO_NCHW: [usize; 4] = [0, 3, 1, 2];

/// The permutation that undoes `order` (`t.permute(order).permute(inverse)` is `t`).
fn inverse(order: &[usize]) -> Vec<usize> {
    let mut inverse = vec![0; order.len()];
    for (position, &dim) in order.iter().enumerate() {
        inverse[dim] = position;
    }
    inverse
}

/// Runs an element-wise `op` over `inputs` (all of one shape) so that its
/// result is channels-last when the first input is, as PyTorch's
/// element-wise outputs keep their input's memory format: `op` sees the
/// inputs as `[N, H, W, C]` views, where its row-major result is
/// channels-last once seen as `[N, C, H, W]` again. Otherwise `op` runs on
/// the inputs as they are (and its result is row-major). A channels-last
/// network (convolutions, batch norms, activations, residual additions)
/// thus stays channels-last instead of flipping layout at every op.
pub(crate) fn keeping_channels_last(
    inputs: &[&Tensor],
    op: impl FnOnce(&[&Tensor]) -> Result<Tensor>,
) -> Result<Tensor> {
    let Some(first) = inputs.first() else { return op(inputs) };
    if !first.is_strictly_channels_last() || inputs.iter().any(|t| t.dims() != first.dims()) {
        return op(inputs);
    }
    let nhwc = inputs.iter().map(|t| t.permute(&TO_NHWC)).collect::<Result<Vec<_>>>()?;
    let views: Vec<&Tensor> = nhwc.iter().collect();
    op(&views)?.permute(&TO_NCHW)
}

#[cfg(test)]
mod tests {
    use crate::{DType, Tensor, TensorError};

    fn image() -> Tensor {
        Tensor::arange(0.0, 120.0, 1.0, DType::F32).unwrap().reshape(&[2, 3, 4, 5]).unwrap()
    }

    #[test]
    fn channels_last_keeps_shape_and_values_with_nhwc_strides() {
        let x = image();
        assert!(x.is_contiguous() && !x.is_channels_last());
        let y = x.to_channels_last().unwrap();
        assert_eq!(y.dims(), &[2, 3, 4, 5]);
        assert_eq!(y.strides(), &[60, 1, 15, 3]);
        assert!(y.is_channels_last() && !y.is_contiguous());
        assert!(!y.shares_storage_with(&x));
        assert_eq!(y.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
        // Back to NCHW: contiguous() copies in row-major order again.
        let z = y.contiguous().unwrap();
        assert_eq!(z.strides(), &[60, 20, 5, 1]);
        assert_eq!(z.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
    }

    #[test]
    fn an_already_channels_last_tensor_is_returned_as_is() {
        let y = image().to_channels_last().unwrap();
        let again = y.to_channels_last().unwrap();
        assert!(again.shares_storage_with(&y));
        assert_eq!(again.strides(), y.strides());
    }

    #[test]
    fn size_one_dims_are_ambiguous_and_other_strides_are_neither() {
        // One channel: NCHW-contiguous and channels-last at once.
        let one = Tensor::zeros([2, 1, 3, 3], DType::F32).unwrap();
        assert!(one.is_contiguous() && one.is_channels_last());
        // A transposed view is neither.
        let t = image().transpose(2, 3).unwrap();
        assert!(!t.is_contiguous() && !t.is_channels_last());
        let cl = t.to_channels_last().unwrap();
        assert!(cl.is_channels_last());
        assert_eq!(cl.to_vec::<f32>().unwrap(), t.to_vec::<f32>().unwrap());
    }

    #[test]
    fn dense_orders_are_found_and_gaps_or_overlaps_have_none() {
        let x = image();
        assert_eq!(x.dense_dim_order(), Some(vec![0, 1, 2, 3]));
        let cl = x.to_channels_last().unwrap();
        let order = cl.dense_dim_order().unwrap();
        assert_eq!(order, vec![0, 2, 3, 1]);
        assert!(cl.permute(&order).unwrap().is_contiguous());
        // A transposed matrix is dense; a strided slice and a broadcast are not.
        let m = Tensor::zeros([3, 4], DType::F32).unwrap();
        assert_eq!(m.transpose(0, 1).unwrap().dense_dim_order(), Some(vec![1, 0]));
        assert_eq!(m.narrow(1, 0, 3).unwrap().dense_dim_order(), None);
        assert_eq!(Tensor::zeros([1, 4], DType::F32).unwrap().expand([3, 4]).unwrap().dense_dim_order(), None);
        // A view at an offset may still be dense (a parameter in a flat buffer).
        let flat = Tensor::zeros([30], DType::F32).unwrap();
        let view = flat.narrow(0, 6, 24).unwrap().reshape(&[2, 3, 4]).unwrap();
        assert_eq!(view.dense_dim_order(), Some(vec![0, 1, 2]));
        // Empty and 0-d tensors are contiguous.
        assert_eq!(Tensor::zeros([0, 3], DType::F32).unwrap().dense_dim_order(), Some(vec![0, 1]));
        assert_eq!(Tensor::zeros([], DType::F32).unwrap().dense_dim_order(), Some(vec![]));
    }

    #[test]
    fn zeros_preserving_the_format_follow_a_dense_order_else_are_contiguous() {
        let cl = image().to_channels_last().unwrap();
        let z = cl.zeros_like_preserve_format().unwrap();
        assert_eq!((z.dims(), z.strides()), (cl.dims(), cl.strides()));
        assert!(z.to_vec::<f32>().unwrap().iter().all(|&v| v == 0.0));
        let t = Tensor::ones([3, 4], DType::BF16).unwrap().transpose(0, 1).unwrap();
        let zt = t.zeros_like_preserve_format().unwrap();
        assert_eq!((zt.strides(), zt.dtype()), (t.strides(), DType::BF16));
        // Not dense: contiguous zeros.
        let gappy = image().narrow(3, 1, 3).unwrap();
        assert!(gappy.zeros_like_preserve_format().unwrap().is_contiguous());
    }

    #[test]
    fn copies_in_another_layout_are_fresh_storage() {
        let cl = image().to_channels_last().unwrap();
        for g in [image(), cl.clone()] {
            let copy = g.copy_in_layout_of(&cl).unwrap();
            assert_eq!(copy.strides(), cl.strides());
            assert!(!copy.shares_storage_with(&g), "a copy even when already laid out so");
            assert_eq!(copy.to_vec::<f32>().unwrap(), g.to_vec::<f32>().unwrap());
        }
        // A row-major `like`: a row-major copy.
        let copy = cl.copy_in_layout_of(&image()).unwrap();
        assert!(copy.is_contiguous() && !copy.shares_storage_with(&cl));
        assert_eq!(copy.to_vec::<f32>().unwrap(), image().to_vec::<f32>().unwrap());
    }

    #[test]
    fn element_wise_results_keep_channels_last() {
        let x = image().sub_scalar(60.0).unwrap();
        let cl = x.to_channels_last().unwrap();
        let bias = Tensor::from_vec(vec![1.0f32, -2.0, 0.5], [1, 3, 1, 1]).unwrap();
        let row_major = [
            x.relu().unwrap(),
            x.add(&x.mul_scalar(0.5).unwrap()).unwrap(),
            x.add(&bias).unwrap(),
            x.mul_scalar(3.0).unwrap(),
            x.to_dtype(DType::BF16).unwrap().to_dtype(DType::F32).unwrap(),
        ];
        let channels_last = [
            cl.relu().unwrap(),
            cl.add(&cl.mul_scalar(0.5).unwrap()).unwrap(),
            cl.add(&bias).unwrap(),
            cl.mul_scalar(3.0).unwrap(),
            cl.to_dtype(DType::BF16).unwrap().to_dtype(DType::F32).unwrap(),
        ];
        for (i, (a, b)) in row_major.iter().zip(&channels_last).enumerate() {
            assert!(a.is_contiguous(), "op {i}: row-major in, row-major out");
            assert!(b.is_channels_last() && !b.is_contiguous(), "op {i}: strides {:?}", b.strides());
            assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap(), "op {i}");
        }
        // The first operand decides: row-major first, row-major result.
        assert!(x.add(&cl).unwrap().is_contiguous());
        assert_eq!(x.add(&cl).unwrap().to_vec::<f32>().unwrap(), x.add(&x).unwrap().to_vec::<f32>().unwrap());
    }

    #[test]
    fn other_ranks_are_refused() {
        let x = Tensor::zeros([2, 3, 4], DType::F32).unwrap();
        assert!(!x.is_channels_last());
        assert!(matches!(x.to_channels_last(), Err(TensorError::RankMismatch { .. })));
    }
}
