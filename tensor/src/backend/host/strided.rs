//! The host's strided drivers: a walk over several operands of one shape
//! is planned once ([`Plan`]): size-1 dims are dropped and neighbouring dims
//! merged wherever every operand allows, so contiguous operands become one
//! row (one kernel call), a broadcast scalar a stride-0 row, and `[N, C] +
//! [C]` N rows of C. The drivers hand each row to a slice loop of
//! `brasa_kernels::elementwise`, on rayon's threads when the tensor is large.

use crate::dtype::WithDType;
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::storage::{lock_storages, Storage};
use crate::tensor::Tensor;
use brasa_kernels::elementwise::{Strided, StridedMut};
use brasa_kernels::scratch::try_with_capacity;
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
    /// Elements below which one thread does the whole op. Measured (one
    /// thread against rayon chunks, by size, with an example since removed)
    /// on the 2-core Zen 5 machine while other builds ran: a fork-join then costs ~20 µs,
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

    /// For a one-operand walk that reads a batch of transposed matrices —
    /// the last outer dim steps by 1 through the source and the rows step
    /// across it, as in copying a row-major `[N, C, H, W]` into
    /// channels-last order (`[N, H·W, C]` rows of C elements H·W apart) —
    /// that batch: each matrix's `rows` output rows of `cols` elements,
    /// element `(r, c)` at `start + r + c·col_stride` of the source, with a
    /// start per element of `batch`. `None` for any other walk, or one too
    /// small to be worth tiling.
    pub(crate) fn transposed(&self) -> Option<Transposed> {
        const SMALLEST: usize = 8;
        let (&(rows, strides), batch) = self.outer.split_last()?;
        let (cols, col_stride) = (self.inner_len, self.inner_strides[0]);
        if strides[0] != 1 || col_stride.unsigned_abs() <= 1 || rows < SMALLEST || cols < SMALLEST {
            return None;
        }
        let sizes: Vec<usize> = batch.iter().map(|&(size, _)| size).collect();
        let steps = batch.iter().map(|&(_, strides)| strides[0]).collect();
        // The outer dims of a valid layout make a valid layout.
        let batch = Layout::new(sizes, steps, self.base[0]).ok()?;
        Some(Transposed { rows, cols, col_stride, batch })
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

/// A walk that reads a batch of transposed matrices ([`Plan::transposed`]).
#[derive(Debug)]
pub(crate) struct Transposed {
    /// Output rows per matrix (a step of 1 through the source).
    pub rows: usize,
    /// Elements per output row.
    pub cols: usize,
    /// The source step between neighbouring elements of an output row.
    pub col_stride: isize,
    /// The matrices' first source elements: the outer dims' layout.
    pub batch: Layout,
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

/// Updates `dst` in place, row by row: `kernel(dst_row, operand_rows)`. The
/// operands have `dst`'s shape and dtype and do not share its storage (the
/// op copies an operand that does); the caller checks `dst` writable and
/// bumps its version. Allocates nothing from the device: a contiguous `dst`
/// is split into parallel chunks, any other is walked on this thread.
pub(crate) fn update_in_place<T: WithDType, const N: usize>(
    op: &'static str,
    dst: &Tensor,
    operands: [&Tensor; N],
    cost: Cost,
    kernel: impl Fn(StridedMut<'_, T>, [Strided<'_, T>; N]) -> std::result::Result<(), KernelError> + Sync,
) -> Result<()> {
    let reads: Vec<&Storage> = operands.iter().map(|t| &**t.storage()).collect();
    let mut locks = lock_storages(&reads, &[dst.storage()]);
    // No operand shares dst's storage (the op copied any that did): reading
    // one through `reads` would be an error.
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
        let span = data
            .get_mut(start..start + numel)
            .ok_or_else(|| TensorError::internal(op, format!("view {start}..{} outside its storage", start + numel)))?;
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

/// Every storage offset `layout` walks, in order: a list (of rows, planes,
/// outputs) as long as some of an op's shape, allocated fallibly, so that a
/// length the host cannot hold is a [`TensorError::ScratchTooLarge`] naming
/// `op`, not an abort.
pub(crate) fn offsets_vec(op: &'static str, layout: &Layout) -> Result<Vec<usize>> {
    let offsets = layout.offsets();
    let mut v = try_with_capacity(offsets.len()).map_err(|e| TensorError::scratch(op, e))?;
    v.extend(offsets);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::Shape;

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
}
