//! Direct access to a contiguous host tensor's bytes, for code outside brasa
//! that moves memory itself: collectives (`brasa-parallel` exchanges ranks'
//! buffers through shared memory or MPI), file and network I/O.
//!
//! The guards hold the storage's lock for as long as they live (a read lock
//! for [`HostBytes`], the write lock for [`HostBytesMut`]), so no brasa op
//! can change or read the bytes underneath a writer. Taking the write guard
//! counts as an in-place change: autograd sees the storage's version move.
//!
//! ```
//! use brasa_tensor::{DType, Tensor};
//!
//! let t = Tensor::zeros([4], DType::F32)?;
//! {
//!     let mut bytes = t.host_bytes_mut()?;
//!     bytes[0..4].copy_from_slice(&2.5f32.to_ne_bytes());
//! }
//! assert_eq!(t.to_vec::<f32>()?, [2.5, 0.0, 0.0, 0.0]);
//! assert_eq!(t.host_bytes()?.len(), 16);
//! # Ok::<(), brasa_tensor::TensorError>(())
//! ```

use crate::error::{Result, TensorError};
use crate::storage::{ReadGuard, WriteGuard};
use crate::tensor::Tensor;
use std::ops::{Deref, DerefMut};

/// The bytes of a contiguous host tensor, read-locked while this lives.
pub struct HostBytes<'a> {
    bytes: ReadGuard<'a, u8>,
}

/// The bytes of a contiguous host tensor, write-locked while this lives.
pub struct HostBytesMut<'a> {
    bytes: WriteGuard<'a, u8>,
}

impl Deref for HostBytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Deref for HostBytesMut<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl DerefMut for HostBytesMut<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

impl HostBytesMut<'_> {
    /// The first byte, for code that hands the buffer to a transport (MPI,
    /// another thread of a collective) while it holds this guard.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.bytes.as_mut_ptr()
    }
}

impl HostBytes<'_> {
    /// The first byte.
    pub fn as_ptr(&self) -> *const u8 {
        self.bytes.as_ptr()
    }
}

impl Tensor {
    /// Checks that the tensor's elements are one host byte range and returns
    /// where it starts (in bytes from the storage's start) and its length.
    fn host_byte_range(&self, op: &'static str) -> Result<(usize, usize)> {
        if !crate::backend::runtime_for(self.device())?.values_on_host() {
            return Err(TensorError::invalid(
                op,
                format!("the tensor is on {}; only host tensors expose their bytes", self.device()),
            ));
        }
        if !self.is_contiguous() {
            return Err(TensorError::invalid(
                op,
                format!(
                    "the tensor (shape {:?}, strides {:?}) is not contiguous; call .contiguous() first",
                    self.dims(),
                    self.strides()
                ),
            ));
        }
        let size = self.dtype().size_in_bytes();
        Ok((self.layout().offset() * size, self.numel() * size))
    }

    /// The tensor's bytes (host, contiguous), read-locked while the guard lives.
    pub fn host_bytes(&self) -> Result<HostBytes<'_>> {
        const OP: &str = "host_bytes";
        let (start, len) = self.host_byte_range(OP)?;
        let bytes = self.storage().read_bytes(OP)?.narrow(OP, start..start + len)?;
        Ok(HostBytes { bytes })
    }

    /// The tensor's bytes (host, contiguous), write-locked while the guard
    /// lives. Counts as an in-place change (the version moves).
    pub fn host_bytes_mut(&self) -> Result<HostBytesMut<'_>> {
        const OP: &str = "host_bytes_mut";
        let (start, len) = self.host_byte_range(OP)?;
        let bytes = self.storage().write_bytes(OP)?.narrow(OP, start..start + len)?;
        self.storage().bump_version();
        Ok(HostBytesMut { bytes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    #[test]
    fn views_expose_their_own_range() -> Result<()> {
        let t = Tensor::arange(0.0, 8.0, 1.0, DType::F32)?;
        let tail = t.narrow(0, 4, 4)?;
        {
            let bytes = tail.host_bytes()?;
            assert_eq!(bytes.len(), 16);
            assert_eq!(f32::from_ne_bytes(bytes[0..4].try_into().unwrap()), 4.0);
        }
        let before = t.version();
        tail.host_bytes_mut()?[0..4].copy_from_slice(&(-1.0f32).to_ne_bytes());
        assert!(t.version() > before);
        assert_eq!(t.to_vec::<f32>()?[4], -1.0);
        Ok(())
    }

    #[test]
    fn strided_tensors_are_refused() -> Result<()> {
        let t = Tensor::zeros([2, 3], DType::F32)?.t()?;
        let err = t.host_bytes().err();
        assert!(matches!(err, Some(TensorError::Invalid { op: "host_bytes", .. })), "{err:?}");
        Ok(())
    }

    #[test]
    fn empty_tensors_have_no_bytes() -> Result<()> {
        let t = Tensor::zeros([0], DType::F64)?;
        assert!(t.host_bytes()?.is_empty());
        assert!(t.host_bytes_mut()?.is_empty());
        Ok(())
    }
}
