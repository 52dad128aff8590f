//! Memory formats of 4-d `[N, C, H, W]` tensors, PyTorch's
//! `memory_format`: the usual row-major layout (`contiguous_format`, NCHW)
//! or channels-last (`channels_last`, NHWC), where one pixel's channels lie
//! next to each other. The shape stays `[N, C, H, W]` either way; only the
//! strides differ. Convolutions on cuDNN take both as they are (tensor cores
//! prefer channels-last) and give their output in the input's format.
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
    fn other_ranks_are_refused() {
        let x = Tensor::zeros([2, 3, 4], DType::F32).unwrap();
        assert!(!x.is_channels_last());
        assert!(matches!(x.to_channels_last(), Err(TensorError::RankMismatch { .. })));
    }
}
