//! The data movement of in-process collectives, on raw host addresses that
//! ranks lent each other. Reductions run in blocks: each block is read from
//! every rank's buffer, combined in an f32 (or f64) accumulator in rank
//! order, and written once to every destination, so every rank gets the
//! same bits and each byte crosses memory as few times as the algorithm
//! allows.

use crate::collective::ReduceOp;
use brasa_tensor::DType;
use half::{bf16, f16};

/// Elements per block: small enough for the accumulator to stay in L1.
const BLOCK: usize = 2048;

/// An element type the collectives move, with the accumulator it reduces in.
trait Element: Copy + Send + Sync + 'static {
    type Acc: Copy + Default + PartialOrd + std::ops::Add<Output = Self::Acc> + std::ops::Mul<Output = Self::Acc>;
    fn widen(self) -> Self::Acc;
    fn narrow(acc: Self::Acc) -> Self;
    fn acc_from_f64(value: f64) -> Self::Acc;
    fn acc_is_nan(acc: Self::Acc) -> bool;
}

/// `Element` for a type whose accumulator is `$acc`, widened and narrowed
/// by the given conversions.
macro_rules! element {
    ($t:ty, $acc:ty, $widen:expr, $narrow:expr) => {
        impl Element for $t {
            type Acc = $acc;
            fn widen(self) -> $acc {
                $widen(self)
            }
            fn narrow(acc: $acc) -> $t {
                $narrow(acc)
            }
            fn acc_from_f64(value: f64) -> $acc {
                value as $acc
            }
            fn acc_is_nan(acc: $acc) -> bool {
                acc.is_nan()
            }
        }
    };
}

element!(f32, f32, |x: f32| x, |a: f32| a);
element!(f64, f64, |x: f64| x, |a: f64| a);
element!(f16, f32, f16::to_f32, f16::from_f32);
element!(bf16, f32, bf16::to_f32, bf16::from_f32);

/// Combines `value` into `acc` (NaN wins for max and min, as in PyTorch).
#[inline(always)]
fn combine<T: Element>(op: ReduceOp, acc: T::Acc, value: T::Acc) -> T::Acc {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => acc + value,
        ReduceOp::Max => {
            if !T::acc_is_nan(acc) && (value > acc || T::acc_is_nan(value)) {
                value
            } else {
                acc
            }
        }
        ReduceOp::Min => {
            if !T::acc_is_nan(acc) && (value < acc || T::acc_is_nan(value)) {
                value
            } else {
                acc
            }
        }
    }
}

/// Reduces elements `range` of the `sources` buffers (element type `T`)
/// and writes the result at `range` shifted by `-dest_shift` into each of
/// `dests`.
///
/// # Safety
/// Every address points at host memory holding the touched elements; no
/// one else writes the source ranges or touches the destination ranges
/// while this runs (the collective's protocol guarantees it).
unsafe fn reduce_blocks<T: Element>(
    op: ReduceOp,
    world: usize,
    sources: &[usize],
    dests: &[usize],
    range: std::ops::Range<usize>,
    dest_shift: usize,
) {
    let mut acc = [T::Acc::default(); BLOCK];
    let scale = T::acc_from_f64(1.0 / world as f64);
    let mut start = range.start;
    while start < range.end {
        let len = BLOCK.min(range.end - start);
        let acc = &mut acc[..len];
        for (i, &source) in sources.iter().enumerate() {
            // SAFETY: the caller guarantees `source` holds elements `range`.
            let values = unsafe { std::slice::from_raw_parts((source as *const T).add(start), len) };
            if i == 0 {
                for (a, v) in acc.iter_mut().zip(values) {
                    *a = v.widen();
                }
            } else {
                for (a, v) in acc.iter_mut().zip(values) {
                    *a = combine::<T>(op, *a, v.widen());
                }
            }
        }
        if op == ReduceOp::Avg {
            for a in acc.iter_mut() {
                *a = *a * scale;
            }
        }
        for &dest in dests {
            // SAFETY: the caller guarantees exclusive access to this range of `dest`.
            let out = unsafe { std::slice::from_raw_parts_mut((dest as *mut T).add(start - dest_shift), len) };
            for (o, a) in out.iter_mut().zip(acc.iter()) {
                *o = T::narrow(*a);
            }
        }
        start += len;
    }
}

/// Dispatches [`reduce_blocks`] on the dtype.
///
/// # Safety
/// As for [`reduce_blocks`].
pub(crate) unsafe fn reduce(
    dtype: DType,
    op: ReduceOp,
    world: usize,
    sources: &[usize],
    dests: &[usize],
    range: std::ops::Range<usize>,
    dest_shift: usize,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match dtype {
            DType::F32 => reduce_blocks::<f32>(op, world, sources, dests, range, dest_shift),
            DType::F64 => reduce_blocks::<f64>(op, world, sources, dests, range, dest_shift),
            DType::F16 => reduce_blocks::<f16>(op, world, sources, dests, range, dest_shift),
            DType::BF16 => reduce_blocks::<bf16>(op, world, sources, dests, range, dest_shift),
            // Collective::validate admits float dtypes only.
            _ => {}
        }
    }
}

/// Copies `bytes` bytes from `source` to `dest` (distinct buffers).
///
/// # Safety
/// Both ranges are valid host memory, they do not overlap, and no one else
/// writes them while this runs.
pub(crate) unsafe fn copy(source: usize, dest: usize, bytes: usize) {
    if bytes == 0 || source == dest {
        return;
    }
    // SAFETY: forwarded from the caller.
    unsafe { std::ptr::copy_nonoverlapping(source as *const u8, dest as *mut u8, bytes) }
}

/// The part `[start, end)` of `len` elements that rank `rank` of `world`
/// handles, split evenly on 16-element (64-byte for f32) boundaries.
pub(crate) fn share(len: usize, rank: usize, world: usize) -> std::ops::Range<usize> {
    let units = len.div_ceil(16);
    let start = (units * rank / world * 16).min(len);
    let end = (units * (rank + 1) / world * 16).min(len);
    start..end
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_everything_once() {
        for len in [0, 1, 15, 16, 17, 1000, 4099] {
            for world in 1..=5 {
                let mut next = 0;
                for rank in 0..world {
                    let part = share(len, rank, world);
                    assert_eq!(part.start, next, "len {len} world {world}");
                    next = part.end;
                }
                assert_eq!(next, len);
            }
        }
    }

    #[test]
    fn max_and_min_let_nan_win() {
        assert!(combine::<f32>(ReduceOp::Max, 1.0, f32::NAN).is_nan());
        assert!(combine::<f32>(ReduceOp::Max, f32::NAN, 1.0).is_nan());
        assert!(combine::<f32>(ReduceOp::Min, f32::NAN, 1.0).is_nan());
        assert_eq!(combine::<f32>(ReduceOp::Min, 2.0, 1.0), 1.0);
        assert_eq!(combine::<f32>(ReduceOp::Max, 2.0, 1.0), 2.0);
    }
}
