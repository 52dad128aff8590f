//! Work buffers whose size comes from the caller's shapes, allocated so that
//! a size the machine cannot hold is an `Err`, never an abort.
//!
//! `vec![value; n]` panics with "capacity overflow" when `n` elements do not
//! fit an `isize` of bytes, and aborts the process ("memory allocation of N
//! bytes failed") when the allocator refuses them. The functions here check
//! the byte size with `checked_mul` and reserve with
//! [`Vec::try_reserve_exact`]; filling costs what `vec!` costs.
//!
//! ```
//! use brasa_kernels::scratch::try_vec;
//!
//! let col = try_vec(6, 0.0f32)?;
//! assert_eq!(col, [0.0; 6]);
//! let err = try_vec(usize::MAX / 2, 0.0f32).unwrap_err();
//! assert_eq!(err.bytes(), (usize::MAX / 2) as u128 * 4);
//! # Ok::<(), brasa_kernels::scratch::ScratchError>(())
//! ```

use std::fmt;

/// A work buffer that could not be allocated: more bytes than a buffer can
/// address, or more than the host's allocator would give.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScratchError {
    elements: usize,
    element_bytes: usize,
}

impl ScratchError {
    /// The error for a buffer of `elements` elements of `T`.
    pub fn new<T>(elements: usize) -> ScratchError {
        ScratchError { elements, element_bytes: size_of::<T>() }
    }

    /// Elements asked for.
    pub fn elements(&self) -> usize {
        self.elements
    }

    /// Bytes of one element.
    pub fn element_bytes(&self) -> usize {
        self.element_bytes
    }

    /// Bytes asked for (a `u128`: the product may not fit a `usize`).
    pub fn bytes(&self) -> u128 {
        self.elements as u128 * self.element_bytes as u128
    }

    /// Whether the size is more than any buffer can address (`isize::MAX`
    /// bytes), rather than more than the allocator had.
    pub fn is_overflow(&self) -> bool {
        self.bytes() > isize::MAX as u128
    }
}

impl fmt::Display for ScratchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = if self.is_overflow() { "more than a buffer can address" } else { "the host is out of memory" };
        write!(
            f,
            "cannot allocate a work buffer of {} bytes ({} elements of {} bytes): {why}",
            self.bytes(),
            self.elements,
            self.element_bytes
        )
    }
}

impl std::error::Error for ScratchError {}

/// An empty vector with room for exactly `len` elements, or an error when
/// that many cannot be allocated.
pub fn try_with_capacity<T>(len: usize) -> Result<Vec<T>, ScratchError> {
    let mut v = Vec::new();
    try_reserve_total(&mut v, len)?;
    Ok(v)
}

/// `vec![value; len]`, or an error when `len` elements cannot be allocated.
pub fn try_vec<T: Clone>(len: usize, value: T) -> Result<Vec<T>, ScratchError> {
    let mut v = try_with_capacity(len)?;
    v.resize(len, value);
    Ok(v)
}

/// `v.resize(len, value)`, or an error (leaving `v` as it was) when `len`
/// elements cannot be allocated. For buffers reused across calls.
pub fn try_resize<T: Clone>(v: &mut Vec<T>, len: usize, value: T) -> Result<(), ScratchError> {
    try_reserve_total(v, len)?;
    v.resize(len, value);
    Ok(())
}

/// Makes room for `len` elements in all (not `len` more).
fn try_reserve_total<T>(v: &mut Vec<T>, len: usize) -> Result<(), ScratchError> {
    let error = || ScratchError::new::<T>(len);
    // `try_reserve_exact` checks the byte size too; checking here first
    // names the size even where `T` is zero-sized.
    len.checked_mul(size_of::<T>()).filter(|&bytes| bytes <= isize::MAX as usize).ok_or_else(error)?;
    v.try_reserve_exact(len.saturating_sub(v.len())).map_err(|_| error())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_that_fit_are_filled() {
        assert_eq!(try_vec(3, 7u8).unwrap(), [7, 7, 7]);
        assert!(try_vec::<f64>(0, 1.0).unwrap().is_empty());
        let mut v = vec![1u32; 2];
        try_resize(&mut v, 4, 9).unwrap();
        assert_eq!(v, [1, 1, 9, 9]);
        try_resize(&mut v, 1, 0).unwrap();
        assert_eq!(v, [1]);
        assert!(try_with_capacity::<u16>(10).unwrap().capacity() >= 10);
    }

    #[test]
    fn impossible_sizes_are_errors() {
        // Overflows isize in bytes: `vec!` would panic with "capacity overflow".
        let err = try_vec(usize::MAX, 0u64).unwrap_err();
        assert!(err.is_overflow());
        assert_eq!(err.bytes(), usize::MAX as u128 * 8);
        assert_eq!((err.elements(), err.element_bytes()), (usize::MAX, 8));
        // Fits isize but no machine has 2^60 bytes: `vec!` would abort.
        let err = try_vec(1usize << 58, 0f32).unwrap_err();
        assert!(!err.is_overflow());
        assert!(err.to_string().contains(&(1u128 << 60).to_string()), "{err}");
        let mut v = vec![1u8; 3];
        assert!(try_resize(&mut v, usize::MAX, 0).is_err());
        assert_eq!(v, [1, 1, 1]);
    }
}
