//! The machinery shared by the elementwise op families (unary, binary,
//! compare, in-place arithmetic): dtype rules, broadcasting of operands, and
//! drivers that walk strided tensors row by row and hand each row to a slice
//! loop of `brasa_kernels::elementwise`, on rayon's threads when the tensor
//! is large.
//!
//! A walk over several operands of one shape is planned once ([`Plan`]):
//! size-1 dims are dropped and neighbouring dims merged wherever every
//! operand allows, so contiguous operands become one row (one kernel call),
//! a broadcast scalar a stride-0 row, and `[N, C] + [C]` N rows of C.

use crate::dispatch::dispatch_dtype;
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::shape::{broadcast_shapes, Shape};
use crate::storage::{lock_storages, Storage};
use crate::tensor::Tensor;
use brasa_kernels::elementwise::{Strided, StridedMut};
use brasa_kernels::KernelError;
use rayon::prelude::*;
use std::ops::Range;

/// How much work one element takes, which sets when going parallel pays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cost {
    /// A few arithmetic instructions per element: memory bound.
    Cheap,
    /// A transcendental function per element (exp, tanh, erf, pow).
    Expensive,
}

impl Cost {
    /// Elements below which one thread does the whole op. Measured with
    /// `cargo run --release -p brasa-tensor --example elementwise_speed --
    /// --thresholds` (one thread against rayon chunks, by size) on the 2-core
    /// Zen 5 machine while other builds ran: a fork-join then costs ~20 µs,
    /// and the parallel loop first won at 256K-512K elements for an f32 add
    /// and at 32K for exp. On an idle machine the crossovers are lower, but a
    /// loaded one is the common case during training (data loading threads).
    pub(crate) fn parallel_threshold(self) -> usize {
        match self {
            Cost::Cheap => 1 << 18,
            Cost::Expensive => 1 << 15,
        }
    }
}

/// Kernel failures mean the op built a wrong view: an internal error, but an
/// error (never a panic), naming the op.
pub(crate) fn kernel_error(op: &'static str) -> impl Fn(KernelError) -> TensorError {
    move |source| TensorError::kernel(op, source)
}

/// The most operands one [`Plan`] walks together.
const MAX_OPERANDS: usize = 4;

/// A row-major walk of up to four same-shape layouts, reduced to as few dims
/// as possible: rows of `inner_len` elements, each operand stepping by its
/// inner stride, and outer dims walked like an odometer.
#[derive(Debug)]
pub(crate) struct Plan {
    /// Outer dims, outermost first: size and one stride per operand.
    outer: Vec<(usize, [isize; MAX_OPERANDS])>,
    inner_len: usize,
    inner_strides: [isize; MAX_OPERANDS],
    base: [usize; MAX_OPERANDS],
    numel: usize,
}

impl Plan {
    /// Plans a walk over `layouts`, which must all have shape `dims`.
    pub(crate) fn new(dims: &[usize], layouts: &[&Layout]) -> Plan {
        debug_assert!(layouts.len() <= MAX_OPERANDS && layouts.iter().all(|l| l.dims() == dims));
        let n = layouts.len().min(MAX_OPERANDS);
        let mut base = [0usize; MAX_OPERANDS];
        for (b, l) in base.iter_mut().zip(layouts) {
            *b = l.offset();
        }
        let numel = dims.iter().product::<usize>();
        // The innermost dim so far is kept apart, so that a walk that merges
        // into one row (the common case) allocates nothing.
        let mut outer: Vec<(usize, [isize; MAX_OPERANDS])> = Vec::new();
        let mut inner: Option<(usize, [isize; MAX_OPERANDS])> = None;
        if numel > 0 {
            for (d, &size) in dims.iter().enumerate() {
                if size == 1 {
                    continue;
                }
                let mut strides = [0isize; MAX_OPERANDS];
                for (s, l) in strides.iter_mut().zip(layouts) {
                    *s = l.strides()[d];
                }
                if let Some((outer_size, outer_strides)) = inner.as_mut() {
                    // The outer dim steps exactly over this one in every operand.
                    let mergeable = (0..n).all(|k| Some(outer_strides[k]) == strides[k].checked_mul(size as isize))
                        && outer_size.checked_mul(size).is_some();
                    if mergeable {
                        *outer_size *= size;
                        *outer_strides = strides;
                        continue;
                    }
                }
                outer.extend(inner.replace((size, strides)));
            }
        }
        let (inner_len, inner_strides) = inner.unwrap_or((if numel == 0 { 0 } else { 1 }, [0; MAX_OPERANDS]));
        Plan { outer, inner_len, inner_strides, base, numel }
    }

    /// The inner stride of operand `k`.
    pub(crate) fn inner_stride(&self, k: usize) -> isize {
        self.inner_strides.get(k).copied().unwrap_or(0)
    }

    /// Calls `row(position, len, starts)` for the rows (or parts of rows) that
    /// make up logical elements `range`: `position` counts from
    /// `range.start`, `starts[k]` is operand `k`'s storage offset of the
    /// row's first element.
    pub(crate) fn for_each_row(
        &self,
        range: Range<usize>,
        mut row: impl FnMut(usize, usize, [usize; MAX_OPERANDS]) -> Result<()>,
    ) -> Result<()> {
        let end = range.end.min(self.numel);
        if range.start >= end {
            return Ok(());
        }
        let len = self.inner_len;
        let mut column = range.start % len;
        // Odometer over the outer dims, positioned at row range.start / len.
        let mut index = vec![0usize; self.outer.len()];
        let mut offsets = [0isize; MAX_OPERANDS];
        for (o, &b) in offsets.iter_mut().zip(&self.base) {
            *o = b as isize;
        }
        let mut rest = range.start / len;
        for (i, (size, strides)) in index.iter_mut().zip(&self.outer).rev() {
            *i = rest % size;
            rest /= size;
            for (o, s) in offsets.iter_mut().zip(strides) {
                *o += *i as isize * s;
            }
        }
        let mut position = range.start;
        while position < end {
            let take = (len - column).min(end - position);
            let mut starts = [0usize; MAX_OPERANDS];
            for k in 0..MAX_OPERANDS {
                // Within the layout's bounds, hence non-negative.
                starts[k] = (offsets[k] + column as isize * self.inner_strides[k]) as usize;
            }
            row(position - range.start, take, starts)?;
            position += take;
            column = 0;
            for (i, (size, strides)) in index.iter_mut().zip(&self.outer).rev() {
                *i += 1;
                for (o, s) in offsets.iter_mut().zip(strides) {
                    *o += s;
                }
                if *i < *size {
                    break;
                }
                for (o, s) in offsets.iter_mut().zip(strides) {
                    *o -= s * *size as isize;
                }
                *i = 0;
            }
        }
        Ok(())
    }

    /// Runs `row(starts, out)` over every row, with `out` the matching part of
    /// the contiguous output `dst` (`dst.len()` = the plan's element count);
    /// on rayon's threads, in chunks of output, when the output is large.
    pub(crate) fn run<D: Send>(
        &self,
        dst: &mut [D],
        cost: Cost,
        row: impl Fn([usize; MAX_OPERANDS], &mut [D]) -> Result<()> + Sync,
    ) -> Result<()> {
        let run_chunk = |first: usize, chunk: &mut [D]| {
            self.for_each_row(first..first + chunk.len(), |at, len, starts| row(starts, &mut chunk[at..at + len]))
        };
        let threads = rayon::current_num_threads();
        let threshold = cost.parallel_threshold();
        if dst.len() < threshold || threads < 2 {
            return run_chunk(0, dst);
        }
        // A few chunks per thread evens out uneven progress; whole cache lines
        // per chunk keep threads off each other's lines.
        let chunk = dst.len().div_ceil(threads * 4).max(threshold / 2).next_multiple_of(64);
        dst.par_chunks_mut(chunk).enumerate().try_for_each(|(i, part)| run_chunk(i * chunk, part))
    }
}

/// The operand's elements as a kernel operand for a row starting at `start`.
#[inline]
pub(crate) fn operand<'a, T: Copy>(
    data: &'a [T],
    plan: &Plan,
    k: usize,
    starts: &[usize; MAX_OPERANDS],
) -> Strided<'a, T> {
    Strided::new(data, starts[k], plan.inner_stride(k))
}

// ----- dtype rules ------------------------------------------------------------

/// bool < integral < floating.
fn category(dtype: DType) -> u8 {
    if dtype.is_float() {
        2
    } else if dtype.is_integral() {
        1
    } else {
        0
    }
}

/// The dtype a binary op between `a` and `b` computes in: [`DType::promote`],
/// with PyTorch's rule for zero-dimensional tensors: a 0-d operand does not
/// widen a dimensioned one of the same or a higher category (`f16 tensor +
/// 0-d f32 tensor → f16`), and decides the dtype when its category is higher
/// (`i64 tensor + 0-d f64 tensor → f64`).
pub(crate) fn result_dtype(a: &Tensor, b: &Tensor) -> DType {
    match (a.rank() == 0, b.rank() == 0) {
        (true, false) => zero_dim_rule(b.dtype(), a.dtype()),
        (false, true) => zero_dim_rule(a.dtype(), b.dtype()),
        _ => DType::promote(a.dtype(), b.dtype()),
    }
}

fn zero_dim_rule(dimensioned: DType, zero_dim: DType) -> DType {
    if category(zero_dim) > category(dimensioned) {
        zero_dim
    } else {
        dimensioned
    }
}

/// Whether a scalar acts as an integer (Python `int`) rather than a float in
/// the op's dtype rule: finite with no fractional part.
pub(crate) fn is_integral(value: f64) -> bool {
    value.is_finite() && value.fract() == 0.0
}

/// The dtype an op between a tensor of `dtype` and Rust scalars computes in.
/// Rust has one scalar type here (f64), so its value stands in for Python's
/// int/float distinction: float tensors keep their dtype; integer and bool
/// tensors keep an integer dtype (bool becomes i64) when every scalar is
/// integral, and go to f32 (PyTorch's default float) otherwise.
pub(crate) fn scalar_result_dtype(dtype: DType, scalars: &[f64]) -> DType {
    if dtype.is_float() {
        dtype
    } else if scalars.iter().all(|&s| is_integral(s)) {
        if dtype.is_bool() {
            DType::I64
        } else {
            dtype
        }
    } else {
        DType::F32
    }
}

/// Errors unless a result of `computed` can be stored in `into` without
/// changing category (PyTorch's rule for in-place ops and `out=`).
pub(crate) fn check_can_cast(op: &'static str, computed: DType, into: DType) -> Result<()> {
    if category(computed) <= category(into) {
        Ok(())
    } else {
        Err(TensorError::invalid(
            op,
            format!("the result has dtype {computed}, which cannot be stored in place in a tensor of dtype {into}"),
        ))
    }
}

// ----- operands ---------------------------------------------------------------

/// The broadcast shape of `shapes`, as an error of `op` when they do not fit.
pub(crate) fn broadcast_all(op: &'static str, shapes: &[&Shape]) -> Result<Shape> {
    let mut shape = shapes.first().map(|s| (*s).clone()).unwrap_or_else(Shape::scalar);
    for s in shapes.iter().skip(1) {
        shape = broadcast_shapes(&shape, s).map_err(|source| TensorError::OpLayout { op, source: source.into() })?;
    }
    Ok(shape)
}

/// `tensor` converted to `dtype` (a copy only when it differs) and seen
/// through `shape` by broadcasting.
pub(crate) fn prepare(op: &'static str, tensor: &Tensor, dtype: DType, shape: &Shape) -> Result<Tensor> {
    let converted = tensor.to_dtype(dtype)?;
    if converted.shape() == shape {
        return Ok(converted);
    }
    converted.broadcast_as(shape.clone()).map_err(|error| match error {
        TensorError::Layout(source) => TensorError::OpLayout { op, source: source.into() },
        other => other,
    })
}

/// `src` broadcast to `dst`'s shape, converted to its dtype, and copied when
/// it shares `dst`'s storage (so reading it while `dst` is written is safe).
pub(crate) fn prepare_in_place(op: &'static str, dst: &Tensor, src: &Tensor) -> Result<Tensor> {
    if src.device() != dst.device() {
        return Err(TensorError::DeviceMismatch { op, lhs: dst.device(), rhs: src.device() });
    }
    check_can_cast(op, result_dtype(dst, src), dst.dtype())?;
    let src = src.broadcast_as(dst.shape().clone()).map_err(|_| {
        TensorError::shape(
            op,
            format!(
                "operand of shape {:?} cannot be broadcast to the destination's shape {:?}",
                src.dims(),
                dst.dims()
            ),
        )
    })?;
    if src.dtype() != dst.dtype() || src.shares_storage_with(dst) {
        src.copy_to(dst.device(), dst.dtype())
    } else {
        Ok(src)
    }
}

// ----- out-of-place drivers ----------------------------------------------------

/// A new contiguous tensor of dtype `D` with `out[i] = kernel(x)[i]`, the
/// kernel called once per row.
pub(crate) fn map_unary<S: WithDType, D: WithDType>(
    op: &'static str,
    x: &Tensor,
    cost: Cost,
    kernel: impl Fn(Strided<'_, S>, &mut [D]) -> std::result::Result<(), KernelError> + Sync,
) -> Result<Tensor> {
    let _range = brasa_profile::record_op(op, &[x.dims()]);
    let src = x.storage().read::<S>(op)?;
    let out = Tensor::uninit_like(x, D::DTYPE, x.device())?;
    let plan = Plan::new(x.dims(), &[x.layout()]);
    // SAFETY: `Plan::run` hands every row of the output to the kernel, which
    // writes each element of its row (the element-wise kernels' contract).
    unsafe {
        out.init_with::<D>(op, |dst| {
            plan.run(dst, cost, |starts, row| kernel(operand(&src, &plan, 0, &starts), row).map_err(kernel_error(op)))
        })
    }
}

/// A new contiguous tensor with `out[i] = kernel(a, b)[i]`; `a` and `b` have
/// the same shape (already broadcast).
pub(crate) fn map_binary<A: WithDType, B: WithDType, D: WithDType>(
    op: &'static str,
    a: &Tensor,
    b: &Tensor,
    cost: Cost,
    kernel: impl Fn(Strided<'_, A>, Strided<'_, B>, &mut [D]) -> std::result::Result<(), KernelError> + Sync,
) -> Result<Tensor> {
    let _range = brasa_profile::record_op(op, &[a.dims(), b.dims()]);
    let locks = lock_storages(&[a.storage(), b.storage()], &[]);
    let (da, db) = (locks.read::<A>(a.storage(), op)?, locks.read::<B>(b.storage(), op)?);
    let out = Tensor::uninit_like(a, D::DTYPE, a.device())?;
    let plan = Plan::new(a.dims(), &[a.layout(), b.layout()]);
    // SAFETY: `Plan::run` hands every row of the output to the kernel, which
    // writes each element of its row (the element-wise kernels' contract).
    unsafe {
        out.init_with::<D>(op, |dst| {
            plan.run(dst, cost, |starts, row| {
                kernel(operand(da, &plan, 0, &starts), operand(db, &plan, 1, &starts), row).map_err(kernel_error(op))
            })
        })
    }
}

/// A new contiguous tensor with `out[i] = kernel(a, b, c)[i]`; the operands
/// have the same shape (already broadcast).
pub(crate) fn map_ternary<A: WithDType, B: WithDType, C: WithDType, D: WithDType>(
    op: &'static str,
    [a, b, c]: [&Tensor; 3],
    cost: Cost,
    kernel: impl Fn(Strided<'_, A>, Strided<'_, B>, Strided<'_, C>, &mut [D]) -> std::result::Result<(), KernelError> + Sync,
) -> Result<Tensor> {
    let _range = brasa_profile::record_op(op, &[a.dims(), b.dims(), c.dims()]);
    let locks = lock_storages(&[a.storage(), b.storage(), c.storage()], &[]);
    let (da, db, dc) =
        (locks.read::<A>(a.storage(), op)?, locks.read::<B>(b.storage(), op)?, locks.read::<C>(c.storage(), op)?);
    let out = Tensor::uninit_like(a, D::DTYPE, a.device())?;
    let plan = Plan::new(a.dims(), &[a.layout(), b.layout(), c.layout()]);
    // SAFETY: `Plan::run` hands every row of the output to the kernel, which
    // writes each element of its row (the element-wise kernels' contract).
    unsafe {
        out.init_with::<D>(op, |dst| {
            plan.run(dst, cost, |starts, row| {
                let (x, y, z) =
                    (operand(da, &plan, 0, &starts), operand(db, &plan, 1, &starts), operand(dc, &plan, 2, &starts));
                kernel(x, y, z, row).map_err(kernel_error(op))
            })
        })
    }
}

// ----- in-place driver ------------------------------------------------------------

/// Updates `dst` in place, row by row: `kernel(dst_row, operand_rows)`. The
/// operands have `dst`'s shape and dtype and do not share its storage (see
/// [`prepare_in_place`]); the caller checks `dst` writable and bumps its version. Allocates nothing from
/// the device: a contiguous `dst` is split into parallel chunks, any other
/// is walked on this thread.
pub(crate) fn update_in_place<T: WithDType, const N: usize>(
    op: &'static str,
    dst: &Tensor,
    operands: [&Tensor; N],
    cost: Cost,
    kernel: impl Fn(StridedMut<'_, T>, [Strided<'_, T>; N]) -> std::result::Result<(), KernelError> + Sync,
) -> Result<()> {
    let reads: Vec<&Storage> = operands.iter().map(|t| &**t.storage()).collect();
    let mut locks = lock_storages(&reads, &[dst.storage()]);
    // No operand shares dst's storage (see `prepare_in_place`): reading one
    // through `reads` would be an error.
    let (data, reads) = locks.write::<T>(dst.storage(), op)?;
    let mut sources: [&[T]; N] = [&[]; N];
    for (s, t) in sources.iter_mut().zip(operands) {
        *s = reads.read::<T>(t.storage(), op)?;
    }
    let numel = dst.numel();
    if numel == 0 {
        // Nothing to write; the version still counts the in-place op (as PyTorch's does).
    } else if dst.is_contiguous() {
        let start = dst.layout().offset();
        let span = data.get_mut(start..start + numel).ok_or_else(|| {
            TensorError::invalid(op, format!("internal error: view {start}..{} outside its storage", start + numel))
        })?;
        let layouts: Vec<&Layout> = operands.iter().map(|t| t.layout()).collect();
        let plan = Plan::new(dst.dims(), &layouts);
        plan.run(span, cost, |starts, row| {
            let ops: [Strided<'_, T>; N] = std::array::from_fn(|k| operand(sources[k], &plan, k, &starts));
            kernel(StridedMut::contiguous(row), ops).map_err(kernel_error(op))
        })?;
    } else {
        let layouts: Vec<&Layout> = std::iter::once(dst.layout()).chain(operands.iter().map(|t| t.layout())).collect();
        let plan = Plan::new(dst.dims(), &layouts);
        let dst_stride = plan.inner_stride(0);
        plan.for_each_row(0..numel, |_, len, starts| {
            let ops: [Strided<'_, T>; N] = std::array::from_fn(|k| operand(sources[k], &plan, k + 1, &starts));
            kernel(StridedMut::new(&mut *data, starts[0], dst_stride, len), ops).map_err(kernel_error(op))
        })?;
    }
    Ok(())
}

// ----- dtype dispatch ------------------------------------------------------------

/// Integer arithmetic as PyTorch does it: two's-complement wrapping.
pub(crate) trait IntElement: WithDType + Ord {
    fn wrapping_add(self, other: Self) -> Self;
    fn wrapping_sub(self, other: Self) -> Self;
    fn wrapping_mul(self, other: Self) -> Self;
    fn wrapping_abs(self) -> Self;
    /// `self^exponent`, wrapping; a negative exponent gives the truncated
    /// quotient `1 / self^|exponent|` (0 unless self is ±1; 0 for 0), as
    /// PyTorch's integer `pow` of two tensors does. At most 64 squarings,
    /// whatever the exponent (`i64::MIN` included).
    fn int_pow(self, exponent: Self) -> Self;
}

macro_rules! impl_int_element {
    ($t:ty, $negative:expr) => {
        impl IntElement for $t {
            #[inline(always)]
            fn wrapping_add(self, other: Self) -> Self {
                <$t>::wrapping_add(self, other)
            }
            #[inline(always)]
            fn wrapping_sub(self, other: Self) -> Self {
                <$t>::wrapping_sub(self, other)
            }
            #[inline(always)]
            fn wrapping_mul(self, other: Self) -> Self {
                <$t>::wrapping_mul(self, other)
            }
            #[inline(always)]
            fn wrapping_abs(self) -> Self {
                let negative: fn($t) -> bool = $negative;
                if negative(self) {
                    <$t>::wrapping_neg(self)
                } else {
                    self
                }
            }
            #[inline]
            fn int_pow(self, exponent: Self) -> Self {
                let negative: fn($t) -> bool = $negative;
                if negative(exponent) {
                    // Only the parity of the exponent matters for -1; negating
                    // it instead would leave i64::MIN negative, forever.
                    return match self.to_i64() {
                        1 => 1 as $t,
                        -1 if exponent.to_i64() & 1 == 0 => 1 as $t,
                        -1 => self,
                        _ => 0 as $t,
                    };
                }
                let (mut base, mut e, mut acc) = (self, exponent.to_i64() as u64, 1 as $t);
                while e > 0 {
                    if e & 1 == 1 {
                        acc = acc.wrapping_mul(base);
                    }
                    base = base.wrapping_mul(base);
                    e >>= 1;
                }
                acc
            }
        }
    };
}

impl_int_element!(i64, |x| x < 0);
impl_int_element!(u8, |_| false);

/// A tensor of `shape` whose every element is `value` in `dtype`, as a
/// stride-0 view of one element (for scalar operands of binary ops).
pub(crate) fn scalar_like(value: f64, dtype: DType, reference: &Tensor) -> Result<Tensor> {
    dispatch_dtype!(dtype, T => Tensor::scalar_on(T::from_f64(value), reference.device()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(plan: &Plan, range: Range<usize>) -> Vec<(usize, usize, [usize; MAX_OPERANDS])> {
        let mut out = Vec::new();
        plan.for_each_row(range, |at, len, starts| {
            out.push((at, len, starts));
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn contiguous_and_scalar_operands_collapse_to_one_row() {
        let a = Layout::contiguous([2, 3, 4]).unwrap();
        let s = Layout::contiguous_with_offset(Shape::scalar(), 5).unwrap().broadcast_as([2, 3, 4]).unwrap();
        let plan = Plan::new(&[2, 3, 4], &[&a, &s]);
        assert!(plan.outer.is_empty());
        assert_eq!((plan.inner_len, plan.inner_stride(0), plan.inner_stride(1)), (24, 1, 0));
        assert_eq!(rows(&plan, 3..10), [(0, 7, [3, 5, 0, 0])]);
    }

    #[test]
    fn row_broadcast_walks_rows_and_splits_at_chunk_edges() {
        let a = Layout::contiguous([3, 4]).unwrap();
        let bias = Layout::contiguous([4]).unwrap().broadcast_as([3, 4]).unwrap();
        let plan = Plan::new(&[3, 4], &[&a, &bias]);
        assert_eq!(plan.outer.len(), 1);
        assert_eq!(rows(&plan, 2..11), [(0, 2, [2, 2, 0, 0]), (2, 4, [4, 0, 0, 0]), (6, 3, [8, 0, 0, 0])]);
        // A transposed operand keeps its strides.
        let t = Layout::contiguous([4, 3]).unwrap().transpose(0, 1).unwrap();
        let plan = Plan::new(&[3, 4], &[&a, &t]);
        assert_eq!(rows(&plan, 4..8), [(0, 4, [4, 1, 0, 0])]);
        assert_eq!(plan.inner_stride(1), 3);
    }

    #[test]
    fn empty_and_zero_dim_plans() {
        let e = Layout::contiguous([2, 0, 3]).unwrap();
        assert!(rows(&Plan::new(&[2, 0, 3], &[&e]), 0..6).is_empty());
        let z = Layout::contiguous_with_offset(Shape::scalar(), 7).unwrap();
        assert_eq!(rows(&Plan::new(&[], &[&z]), 0..1), [(0, 1, [7, 0, 0, 0])]);
    }

    #[test]
    fn dtype_rules() {
        use DType::*;
        assert_eq!(scalar_result_dtype(I64, &[2.0]), I64);
        assert_eq!(scalar_result_dtype(Bool, &[2.0]), I64);
        assert_eq!(scalar_result_dtype(U8, &[0.5]), F32);
        assert_eq!(scalar_result_dtype(U8, &[f64::INFINITY]), F32);
        assert_eq!(scalar_result_dtype(F16, &[0.5]), F16);
        assert!(check_can_cast("add_", F32, I64).unwrap_err().to_string().contains("dtype f32"));
        check_can_cast("add_", F64, F16).unwrap();
        assert_eq!(3i64.int_pow(4), 81);
        assert_eq!(2u8.int_pow(9), 0, "wraps");
        assert_eq!((-1i64).int_pow(-3), -1);
        assert_eq!((-1i64).int_pow(-4), 1);
        assert_eq!((-1i64).int_pow(i64::MIN), 1, "even, and returns");
        assert_eq!((-1i64).int_pow(i64::MAX), -1);
        assert_eq!(2i64.int_pow(i64::MIN), 0);
        assert_eq!(0i64.int_pow(-1), 0);
        assert_eq!(1i64.int_pow(i64::MIN), 1);
        assert_eq!(2i64.int_pow(-1), 0);
        assert_eq!(3i64.int_pow(64), 3i64.wrapping_pow(64), "wraps");
        assert_eq!(i64::MIN.wrapping_abs(), i64::MIN);
    }
}
