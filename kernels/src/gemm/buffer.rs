//! Packing buffers: 64-byte aligned, zero-initialised, cached per thread.
//!
//! Each thread that runs part of a product keeps its two packing buffers
//! (and, for f16 / bf16 products, the f32 workspace of C up to
//! [`MAX_CACHED_WORKSPACE`]) between calls, so a training loop that
//! multiplies the same shapes every step allocates nothing after the first
//! step. A buffer is taken out of the thread-local slot while in use, which
//! keeps nested or re-entrant calls (a rayon worker stealing another
//! product's task) correct: they simply allocate their own.

use super::element::Packed;
use crate::scratch::ScratchError;
use std::alloc::{self, Layout};
use std::cell::Cell;
use std::ptr::NonNull;

const ALIGN: usize = 64;

/// An owned, aligned, zero-initialised byte buffer.
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    bytes: usize,
}

// SAFETY: the buffer is plain owned memory with no thread affinity.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// A buffer of `bytes`, or `None` when the size does not make a layout
    /// or the allocator refuses it.
    fn try_zeroed(bytes: usize) -> Option<AlignedBuf> {
        let bytes = bytes.max(ALIGN).checked_next_multiple_of(ALIGN)?;
        let layout = Layout::from_size_align(bytes, ALIGN).ok()?;
        // SAFETY: `layout` has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        NonNull::new(raw).map(|ptr| AlignedBuf { ptr, bytes })
    }

    /// The first `len` elements as a slice of `T`.
    fn as_mut_slice<T: Packed>(&mut self, len: usize) -> &mut [T] {
        assert!(len * size_of::<T>() <= self.bytes);
        // SAFETY: the allocation holds at least `len * size_of::<T>()` bytes,
        // is aligned to 64 >= align_of::<T>(), and was zero-initialised; any
        // bit pattern is a valid `T` (the `Packed` contract), so the memory
        // is always valid `T`s, whatever type used the buffer before.
        // `&mut self` makes the slice unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().cast::<T>(), len) }
    }
}

fn layout(bytes: usize) -> Layout {
    Layout::from_size_align(bytes, ALIGN).unwrap_or_else(|_| alloc::handle_alloc_error(Layout::new::<u8>()))
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), layout(self.bytes)) }
    }
}

thread_local! {
    static PACK_A: Cell<Option<AlignedBuf>> = const { Cell::new(None) };
    static PACK_B: Cell<Option<AlignedBuf>> = const { Cell::new(None) };
    static WORK_C: Cell<Option<AlignedBuf>> = const { Cell::new(None) };
}

/// Which of a thread's cached buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    /// Packed blocks of A.
    A,
    /// Packed panels of B.
    B,
    /// The f32 workspace of a narrow C.
    C,
}

/// The largest C workspace kept between calls, in bytes (a 1024 x 1024 f32
/// C): packing buffers are bounded by the blocking, C is not. A larger one is
/// allocated per call, which its product's cost dwarfs.
pub(crate) const MAX_CACHED_WORKSPACE: usize = 4 << 20;

/// The largest packing buffer kept between calls, in bytes. The blocked
/// driver's are bounded by its blocking (at most about 4 MiB); the AMX
/// driver packs whole operands, which grow with the problem.
pub(crate) const MAX_CACHED_PACK: usize = 16 << 20;

/// Runs `f` with this thread's cached buffer `slot`, grown to `len`
/// elements if needed; aborts as `Vec` does when the allocator refuses. For
/// the packing buffers, which the blocking bounds (and which are no larger
/// than the operands).
pub(crate) fn with_buffer<T: Packed, R>(slot: Slot, len: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
    match try_with_buffer(slot, len, f) {
        Ok(r) => r,
        Err(_) => alloc::handle_alloc_error(layout(len.saturating_mul(size_of::<T>()))),
    }
}

/// Runs `f` with this thread's cached buffer `slot`, grown to `len`
/// elements if needed, or an error (not an abort) when `len` elements cannot
/// be had: for the C workspace, which grows with the problem.
pub(crate) fn try_with_buffer<T: Packed, R>(
    slot: Slot,
    len: usize,
    f: impl FnOnce(&mut [T]) -> R,
) -> Result<R, ScratchError> {
    let key = match slot {
        Slot::A => &PACK_A,
        Slot::B => &PACK_B,
        Slot::C => &WORK_C,
    };
    let error = || ScratchError::new::<T>(len);
    let bytes = len.checked_mul(size_of::<T>()).ok_or_else(error)?;
    let mut buf = match key.with(Cell::take) {
        Some(buf) if buf.bytes >= bytes => buf,
        _ => AlignedBuf::try_zeroed(bytes).ok_or_else(error)?,
    };
    let r = f(buf.as_mut_slice(len));
    let keep = if slot == Slot::C { MAX_CACHED_WORKSPACE } else { MAX_CACHED_PACK };
    if buf.bytes <= keep {
        key.with(|s| s.set(Some(buf)));
    }
    Ok(r)
}

/// Runs `f` with this thread's packing buffers for A (`a_len` elements) and
/// B (`b_len` elements).
pub(crate) fn with_pack_buffers<T: Packed, R>(
    a_len: usize,
    b_len: usize,
    f: impl FnOnce(&mut [T], &mut [T]) -> R,
) -> R {
    with_buffer(Slot::A, a_len, |a| with_buffer(Slot::B, b_len, |b| f(a, b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_reused() {
        let first = with_pack_buffers::<f32, _>(100, 50, |a, b| {
            assert_eq!(a.as_ptr() as usize % ALIGN, 0);
            assert_eq!(b.as_ptr() as usize % ALIGN, 0);
            assert_eq!((a.len(), b.len()), (100, 50));
            a.fill(1.0);
            a.as_ptr() as usize
        });
        let second = with_pack_buffers::<f64, _>(10, 5, |a, _| a.as_ptr() as usize);
        assert_eq!(first, second, "a smaller request reuses the cached buffer");
        // A C workspace is kept up to the limit.
        let len = MAX_CACHED_WORKSPACE / 4;
        let first = with_buffer::<f32, _>(Slot::C, len, |w| w.as_ptr() as usize);
        assert_eq!(first, with_buffer::<f32, _>(Slot::C, 8, |w| w.as_ptr() as usize));
        assert_eq!(with_buffer::<f32, _>(Slot::C, len + 1, |w| w.len()), len + 1);
        assert_eq!(try_with_buffer::<f32, _>(Slot::C, 8, |w| w.len()), Ok(8));
        // Sizes no allocator gives are errors, not aborts.
        let err = try_with_buffer::<f32, _>(Slot::C, usize::MAX / 2, |w| w.len()).unwrap_err();
        assert_eq!(err.elements(), usize::MAX / 2);
        assert!(try_with_buffer::<f32, _>(Slot::C, 1 << 58, |w| w.len()).is_err());
        // Nested use allocates a fresh pair instead of aliasing.
        with_pack_buffers::<f32, _>(8, 8, |outer, _| {
            let outer_ptr = outer.as_ptr() as usize;
            with_pack_buffers::<f32, _>(8, 8, |inner, _| {
                assert_ne!(outer_ptr, inner.as_ptr() as usize);
            });
        });
    }
}
