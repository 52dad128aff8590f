//! How each [`ReduceOp`] and float dtype maps onto MPI: the datatype the
//! buffer is described as and the `MPI_Op` that combines it.
//!
//! - f32/f64 sum (and avg, which is a sum scaled afterwards) use MPI's own
//!   `MPI_SUM`: Open MPI's vectorised kernels.
//! - Max and min use user operations for every dtype, because MPI's
//!   `MPI_MAX`/`MPI_MIN` are plain comparisons that keep or drop a NaN
//!   depending on argument order; here NaN wins, as in the in-process
//!   backend and PyTorch.
//! - f16/bf16 have no MPI datatype: their buffers travel as `uint16_t`
//!   and user operations combine them. Each pairwise combination is
//!   computed in f32 and rounded back, as NCCL does for half types. The
//!   alternative, widening into an f32 scratch buffer and reducing that,
//!   would double the bytes on the wire and the memory, which is what
//!   reducing in 16 bits is meant to save. For 2 ranks the result is
//!   bit-identical to the in-process backend (one addition, one rounding);
//!   for more, each step rounds, so sums can differ by a few ulps.
//!
//! The user functions are `UnsafeUserOperation::commutative` (plain
//! `extern "C"` function pointers, no libffi), created once per
//! communicator on the MPI thread and freed before `MPI_Finalize`.

use crate::collective::ReduceOp;
use ::mpi::collective::{SystemOperation, UnsafeUserOperation};
use ::mpi::datatype::Equivalence;
use ::mpi::ffi::{MPI_Datatype, MPI_Op};
use ::mpi::raw::AsRaw;
use brasa_tensor::DType;
use half::{bf16, f16};
use std::os::raw::{c_int, c_void};

/// An element a user operation combines.
trait Element: Copy {
    fn is_nan(self) -> bool;
    fn greater(self, other: Self) -> bool;
    fn add(self, other: Self) -> Self;
}

impl Element for f32 {
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
    fn greater(self, other: f32) -> bool {
        self > other
    }
    fn add(self, other: f32) -> f32 {
        self + other
    }
}

impl Element for f64 {
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
    fn greater(self, other: f64) -> bool {
        self > other
    }
    fn add(self, other: f64) -> f64 {
        self + other
    }
}

impl Element for f16 {
    fn is_nan(self) -> bool {
        f16::is_nan(self)
    }
    fn greater(self, other: f16) -> bool {
        self.to_f32() > other.to_f32()
    }
    fn add(self, other: f16) -> f16 {
        f16::from_f32(self.to_f32() + other.to_f32())
    }
}

impl Element for bf16 {
    fn is_nan(self) -> bool {
        bf16::is_nan(self)
    }
    fn greater(self, other: bf16) -> bool {
        self.to_f32() > other.to_f32()
    }
    fn add(self, other: bf16) -> bf16 {
        bf16::from_f32(self.to_f32() + other.to_f32())
    }
}

/// `acc` combined with `value` (NaN wins for max and min, as in the
/// in-process kernels).
#[inline(always)]
fn combine<T: Element>(op: ReduceOp, value: T, acc: T) -> T {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => acc.add(value),
        ReduceOp::Max => {
            if !acc.is_nan() && (value.is_nan() || value.greater(acc)) {
                value
            } else {
                acc
            }
        }
        ReduceOp::Min => {
            if !acc.is_nan() && (value.is_nan() || acc.greater(value)) {
                value
            } else {
                acc
            }
        }
    }
}

/// Which reduction a monomorphised user function performs.
trait Kind {
    const OP: ReduceOp;
}
struct Sum;
struct Max;
struct Min;
impl Kind for Sum {
    const OP: ReduceOp = ReduceOp::Sum;
}
impl Kind for Max {
    const OP: ReduceOp = ReduceOp::Max;
}
impl Kind for Min {
    const OP: ReduceOp = ReduceOp::Min;
}

/// The MPI user function: `inout[i] = combine(in[i], inout[i])`.
///
/// # Safety
/// MPI calls it with `len` elements of `T` at `invec` and `inoutvec`
/// (the buffers of a reduction this operation was created for).
unsafe extern "C" fn user_function<T: Element, K: Kind>(
    invec: *mut c_void,
    inoutvec: *mut c_void,
    len: *mut c_int,
    _datatype: *mut MPI_Datatype,
) {
    // SAFETY: MPI passes a valid count; a negative one would be an MPI bug,
    // treated as nothing to do rather than a panic across the FFI boundary.
    let n = usize::try_from(unsafe { *len }).unwrap_or(0);
    if n == 0 {
        return;
    }
    // SAFETY: both buffers hold `n` elements of `T` (see the function's
    // contract); MPI gives distinct buffers for in and inout.
    let (input, acc) = unsafe {
        (std::slice::from_raw_parts(invec as *const T, n), std::slice::from_raw_parts_mut(inoutvec as *mut T, n))
    };
    for (a, v) in acc.iter_mut().zip(input) {
        *a = combine(K::OP, *v, *a);
    }
}

fn user_op<T: Element, K: Kind>() -> UnsafeUserOperation {
    // SAFETY: `user_function::<T, K>` reads and writes exactly `len`
    // elements of `T`; it is only used on buffers of `T` (see `Reductions::pick`).
    unsafe { UnsafeUserOperation::commutative(user_function::<T, K>) }
}

/// The user operations of one communicator.
pub(crate) struct Reductions {
    sum_f16: UnsafeUserOperation,
    sum_bf16: UnsafeUserOperation,
    max: [UnsafeUserOperation; 4],
    min: [UnsafeUserOperation; 4],
}

impl Reductions {
    /// Creates the operations (call on the MPI thread, after initialisation).
    pub(crate) fn new() -> Reductions {
        Reductions {
            sum_f16: user_op::<f16, Sum>(),
            sum_bf16: user_op::<bf16, Sum>(),
            max: [user_op::<f32, Max>(), user_op::<f64, Max>(), user_op::<f16, Max>(), user_op::<bf16, Max>()],
            min: [user_op::<f32, Min>(), user_op::<f64, Min>(), user_op::<f16, Min>(), user_op::<bf16, Min>()],
        }
    }

    /// The datatype and operation for reducing `dtype` with `op`, or `None`
    /// for a dtype that is not a float (refused before this by validation).
    pub(crate) fn pick(&self, dtype: DType, op: ReduceOp) -> Option<(MPI_Datatype, MPI_Op)> {
        let index = match dtype {
            DType::F32 => 0,
            DType::F64 => 1,
            DType::F16 => 2,
            DType::BF16 => 3,
            _ => return None,
        };
        let datatype = match dtype {
            DType::F32 => f32::equivalent_datatype().as_raw(),
            DType::F64 => f64::equivalent_datatype().as_raw(),
            _ => u16::equivalent_datatype().as_raw(),
        };
        let operation = match (op, dtype) {
            (ReduceOp::Sum | ReduceOp::Avg, DType::F16) => self.sum_f16.as_raw(),
            (ReduceOp::Sum | ReduceOp::Avg, DType::BF16) => self.sum_bf16.as_raw(),
            (ReduceOp::Sum | ReduceOp::Avg, _) => SystemOperation::sum().as_raw(),
            (ReduceOp::Max, _) => self.max[index].as_raw(),
            (ReduceOp::Min, _) => self.min[index].as_raw(),
        };
        Some((datatype, operation))
    }
}

/// The MPI datatype moving `dtype` elements as they are (bits, not
/// values): an unsigned integer of the element's size, so counts are in
/// elements (up to `i32::MAX` of them) rather than bytes.
pub(crate) fn copy_datatype(dtype: DType) -> MPI_Datatype {
    match dtype.size_in_bytes() {
        1 => u8::equivalent_datatype().as_raw(),
        2 => u16::equivalent_datatype().as_raw(),
        4 => u32::equivalent_datatype().as_raw(),
        _ => u64::equivalent_datatype().as_raw(),
    }
}

/// Divides the `n` elements of `dtype` at `bytes` by `world` (the second
/// half of an average), as the in-process kernels do: multiply by the
/// reciprocal in the dtype's accumulator.
pub(crate) fn scale_for_average(dtype: DType, bytes: &mut [u8], world: usize) {
    fn apply<T: bytemuck::Pod>(bytes: &mut [u8], f: impl Fn(T) -> T) {
        // Tensor storage is aligned for its dtype, but go through unaligned
        // reads and writes so a misaligned view cannot make this panic.
        let size = std::mem::size_of::<T>();
        for chunk in bytes.chunks_exact_mut(size) {
            let value: T = bytemuck::pod_read_unaligned(chunk);
            chunk.copy_from_slice(bytemuck::bytes_of(&f(value)));
        }
    }
    let inverse = 1.0 / world as f64;
    match dtype {
        DType::F32 => apply::<f32>(bytes, |x| x * inverse as f32),
        DType::F64 => apply::<f64>(bytes, |x| x * inverse),
        DType::F16 => apply::<f16>(bytes, |x| f16::from_f32(x.to_f32() * inverse as f32)),
        DType::BF16 => apply::<bf16>(bytes, |x| bf16::from_f32(x.to_f32() * inverse as f32)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_wins_max_and_min_in_every_order() {
        for (a, b) in [(1.0f32, f32::NAN), (f32::NAN, 1.0)] {
            assert!(combine(ReduceOp::Max, a, b).is_nan());
            assert!(combine(ReduceOp::Min, a, b).is_nan());
        }
        assert_eq!(combine(ReduceOp::Max, 2.0f64, 1.0), 2.0);
        assert_eq!(combine(ReduceOp::Min, 2.0f64, 1.0), 1.0);
        let (x, y) = (bf16::from_f32(-3.0), bf16::from_f32(5.0));
        assert_eq!(combine(ReduceOp::Max, x, y), y);
        assert_eq!(combine(ReduceOp::Min, x, y), x);
        assert_eq!(combine(ReduceOp::Sum, f16::from_f32(1.5), f16::from_f32(2.0)), f16::from_f32(3.5));
    }

    #[test]
    fn the_user_function_combines_elementwise() {
        let mut input = [1.0f32, f32::NAN, 7.0];
        let mut acc = [2.0f32, 3.0, 5.0];
        let mut len: c_int = 3;
        // SAFETY: three f32 in each buffer; the datatype is not read.
        unsafe {
            user_function::<f32, Max>(
                input.as_mut_ptr() as *mut c_void,
                acc.as_mut_ptr() as *mut c_void,
                &mut len,
                std::ptr::null_mut(),
            )
        };
        assert_eq!(acc[0], 2.0);
        assert!(acc[1].is_nan());
        assert_eq!(acc[2], 7.0);
    }

    #[test]
    fn averages_scale_every_dtype() {
        let mut bytes = bytemuck::cast_slice(&[3.0f32, -8.0]).to_vec();
        scale_for_average(DType::F32, &mut bytes, 2);
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&bytes), [1.5, -4.0]);
        let mut bytes = bytemuck::cast_slice(&[bf16::from_f32(6.0)]).to_vec();
        scale_for_average(DType::BF16, &mut bytes, 4);
        assert_eq!(bytemuck::cast_slice::<u8, bf16>(&bytes), [bf16::from_f32(1.5)]);
    }
}
