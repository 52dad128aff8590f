//! The host's reductions: one of three walks picked from the strides.
//!
//! - **rows**: the reduced elements of each output are one contiguous run
//!   (reducing the innermost dims of a contiguous tensor) — each output is a
//!   slice kernel call;
//! - **columns**: the innermost kept dim is contiguous (reducing an outer or
//!   middle dim) — the reduced rows are added element-wise into an
//!   accumulator row, which vectorises along the kept dim;
//! - otherwise the tensor is copied with the reduced dims moved last, and
//!   reduced as rows.
//!
//! Broadcast dims (stride 0, from `expand`) are read once: a reduced one
//! multiplies sums (and sums of squared deviations) by its size and changes
//! no max, min, mean or first position; a kept one gives equal outputs,
//! computed once and copied. So an expanded tensor costs what the tensor it
//! was expanded from does.
//!
//! Outputs are split over rayon's threads once the work reaches
//! [`PARALLEL_MIN_WORK`] elements; single long rows are split inside the
//! kernels.

use super::strided::offsets_vec;
use crate::backend::out_dims;
use crate::backend::output;
use crate::backend::ReduceOp;
use crate::dispatch::{dispatch_dtype, dispatch_float};
use crate::dtype::WithDType;
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::shape::Shape;
use crate::tensor::Tensor;
use brasa_kernels::reduce::{self as kernels, Accumulator, FloatAccumulator, ReduceElement};
use rayon::prelude::*;

/// See [`crate::backend::DeviceOps::reduce`].
pub(super) fn reduce(op: ReduceOp, name: &'static str, x: &Tensor, mask: &[bool], keepdim: bool) -> Result<Tensor> {
    let plan = plan(x, name, mask, keepdim)?;
    let not_float = || TensorError::not_float(name, x.dtype());
    match op {
        ReduceOp::Sum => {
            let sum = Sum { repeat: plan.repeat };
            dispatch_dtype!(x.dtype(), T => execute::<T, _>(name, &plan, &sum))
        }
        ReduceOp::Mean => {
            let mean = Mean { count: plan.count / plan.repeat };
            dispatch_float!(x.dtype(), T => execute::<T, _>(name, &plan, &mean), Err(not_float()))
        }
        ReduceOp::Var { correction, sqrt } => {
            let var = Var { count: plan.count, correction, sqrt, repeat: plan.repeat };
            dispatch_float!(x.dtype(), T => execute::<T, _>(name, &plan, &var), Err(not_float()))
        }
        ReduceOp::Max => dispatch_dtype!(x.dtype(), T => execute::<T, _>(name, &plan, &Extreme::<true>)),
        ReduceOp::Min => dispatch_dtype!(x.dtype(), T => execute::<T, _>(name, &plan, &Extreme::<false>)),
        ReduceOp::ArgMax => {
            let arg = ArgExtreme::<true> { positions: plan.positions.as_deref() };
            dispatch_dtype!(x.dtype(), T => execute::<T, _>(name, &plan, &arg))
        }
        ReduceOp::ArgMin => {
            let arg = ArgExtreme::<false> { positions: plan.positions.as_deref() };
            dispatch_dtype!(x.dtype(), T => execute::<T, _>(name, &plan, &arg))
        }
    }
}

/// Reductions reading fewer elements than this run on one thread. Measured
/// by timing sums over the last dim of `[n / 256, 256]` `f32` tensors on one
/// thread and on two (2-core Zen 5, release build): two threads lose below
/// 2^17 elements (a fork-join and waking the other core cost ~10 µs, as much
/// as summing 2^16 elements), break even at 2^17 and win from 2^18 (1.3x,
/// 1.65x at 2^19).
/// What [`reduce`] allocates before and around its kernel, without reading
/// `x`: the tensor it reduces from (a copy with the reduced dims last, or
/// `x` itself), the shape it computes and the shape it returns (a copy of
/// the computed result expanded along kept broadcast dims when they
/// differ). The meta backend allocates the same.
pub(in crate::backend) fn allocations(
    name: &'static str,
    x: &Tensor,
    mask: &[bool],
    keepdim: bool,
) -> Result<(Tensor, Shape, Shape)> {
    let plan = plan(x, name, mask, keepdim)?;
    Ok((plan.source, plan.computed_shape, plan.out_shape))
}

pub(crate) const PARALLEL_MIN_WORK: usize = 1 << 17;

/// Elements of input one parallel task reads at least.
const TASK_WORK: usize = 1 << 14;

/// Outputs along the contiguous kept dim handled per column-kernel call, so
/// the accumulator row stays in L1.
const COLUMN_BLOCK: usize = 1024;

/// The column plan is used from this width of the contiguous kept dim on.
/// Even at width 3 (`[1M, 3]` summed over dim 0) it costs about what the
/// alternative, a transposing copy of the whole input, does (~7 ms), and it
/// needs no extra memory, so every width qualifies.
const COLUMN_MIN_WIDTH: usize = 1;

/// Where each output's reduced elements lie in the source's storage.
enum Walk {
    /// The reduced set is empty: every output is the reduction of nothing.
    Empty,
    /// Output `i` reduces `src[bases[i] .. bases[i] + len]`; `bases` walks
    /// the offsets in output order.
    Rows { bases: Layout, len: usize },
    /// Outputs come in groups of `width` (one per offset of `outer`); output
    /// `k` of the group at `base` reduces `src[base + row_offsets[r] + k]`.
    Columns { outer: Layout, width: usize, row_offsets: Vec<usize> },
}

/// A resolved reduction: what to read, how, and the output's shape.
struct Plan {
    source: Tensor,
    walk: Walk,
    out_shape: Shape,
    /// The shape the walk fills: `out_shape` with 1 for the kept dims that
    /// are broadcast in the input (stride 0), whose outputs are all equal;
    /// the result is expanded to `out_shape` afterwards.
    computed_shape: Shape,
    /// Elements reduced into each output.
    count: usize,
    /// How many equal elements each element the walk reads stands for: the
    /// product of the reduced dims that are broadcast (stride 0) in the
    /// input, which the walk reads only once.
    repeat: usize,
    /// The reduced dims (size, and whether the walk skipped it as
    /// broadcast), to turn a position among the elements read into one
    /// among all reduced elements; `None` when nothing was skipped.
    positions: Option<Vec<(usize, bool)>>,
}

/// The row-major position among all reduced elements (of dims `dims`: size,
/// and whether the walk skipped it as broadcast) of the element at `read`
/// among those the walk reads. A skipped dim gets coordinate 0, the first of
/// its equal elements, so ties still go to the first position.
fn full_position(dims: &[(usize, bool)], read: usize) -> usize {
    let (mut rest, mut full, mut stride) = (read, 0usize, 1usize);
    for &(size, skipped) in dims.iter().rev() {
        if !skipped {
            full += rest % size * stride;
            rest /= size;
        }
        stride = stride.saturating_mul(size);
    }
    full
}

/// The dims of `x` kept (`!reduced`) or reduced, with their strides.
fn split_dims(x: &Tensor, mask: &[bool], reduced: bool) -> (Vec<usize>, Vec<isize>) {
    let layout = x.layout();
    layout
        .dims()
        .iter()
        .zip(layout.strides())
        .zip(mask)
        .filter(|(_, &m)| m == reduced)
        .map(|((&d, &s), _)| (d, s))
        .unzip()
}

/// The output dims: the kept dims, and 1 for each reduced dim with `keepdim`.
fn plan(x: &Tensor, op: &'static str, mask: &[bool], keepdim: bool) -> Result<Plan> {
    let mask = mask.to_vec();
    let out_shape = Shape::from(out_dims(x.dims(), &mask, keepdim));
    let count: usize = x.dims().iter().zip(&mask).filter(|(_, &m)| m).map(|(&d, _)| d).product();
    if count == 0 {
        let computed_shape = out_shape.clone();
        return Ok(Plan {
            source: x.clone(),
            walk: Walk::Empty,
            out_shape,
            computed_shape,
            count,
            repeat: 1,
            positions: None,
        });
    }
    // A broadcast dim (stride 0) holds one value repeated: read it once. A
    // reduced one scales sums (`repeat`) and is skipped by max, min and
    // mean; a kept one makes equal outputs, computed once and expanded.
    let mut view = x.clone();
    let mut repeat = 1usize;
    let mut positions = Vec::new();
    let mut skipped_reduced = false;
    for (d, (&size, &stride)) in x.dims().iter().zip(x.layout().strides()).enumerate() {
        let broadcast = stride == 0 && size > 1;
        if broadcast {
            view = view.narrow(d, 0, 1)?;
        }
        if mask[d] {
            positions.push((size, broadcast));
            if broadcast {
                repeat *= size;
                skipped_reduced = true;
            }
        }
    }
    let positions = skipped_reduced.then_some(positions);
    let computed_shape = Shape::from(out_dims(view.dims(), &mask, keepdim));
    let (walk, source) = walk(op, &view, &mask)?;
    Ok(Plan { source, walk, out_shape, computed_shape, count, repeat, positions })
}

/// How to read the reduced elements of `x` (no reduced dim empty), and from
/// which tensor: `x` itself, or a copy with the reduced dims moved last.
fn walk(op: &'static str, x: &Tensor, mask: &[bool]) -> Result<(Walk, Tensor)> {
    let layout = x.layout();
    let (kept_dims, kept_strides) = split_dims(x, mask, false);
    let (red_dims, red_strides) = split_dims(x, mask, true);
    let len: usize = red_dims.iter().product();
    let kept = Layout::new(kept_dims, kept_strides, layout.offset());
    let reduced = Layout::new(red_dims, red_strides, 0);
    if let (Ok(kept), Ok(reduced)) = (kept, reduced) {
        let reduced = reduced.coalesced();
        if len > 1 && reduced.strides() == [1] {
            return Ok((Walk::Rows { bases: kept, len }, x.clone()));
        }
        // The column kernels vectorise along the kept dim, also over a
        // single reduced element (a copy) where rows would be calls of one.
        let kept = kept.coalesced();
        let rank = kept.rank();
        if let (Some(&width), Some(&1)) = (kept.dims().last(), kept.strides().last()) {
            if width >= COLUMN_MIN_WIDTH {
                let outer = Layout::new(&kept.dims()[..rank - 1], kept.strides()[..rank - 1].to_vec(), kept.offset())?;
                let row_offsets = offsets_vec(op, &reduced)?;
                return Ok((Walk::Columns { outer, width, row_offsets }, x.clone()));
            }
        }
        if len == 1 {
            return Ok((Walk::Rows { bases: kept, len }, x.clone()));
        }
    }
    // Move the reduced dims last and copy: then every output is a row.
    let order: Vec<usize> = (0..mask.len()).filter(|&d| !mask[d]).chain((0..mask.len()).filter(|&d| mask[d])).collect();
    let source = x.permute(&order)?.contiguous()?;
    let outputs = x.numel() / len;
    let bases = Layout::new([outputs], vec![len as isize], source.layout().offset())?;
    Ok((Walk::Rows { bases, len }, source))
}

/// One reduction, as the driver calls it.
trait Reduction<T>: Sync {
    /// The output element type.
    type Out: WithDType;
    /// Reduces one contiguous run (empty only for reductions that allow it).
    fn row(&self, row: &[T]) -> Self::Out;
    /// `out[k]` reduces `src[base + row_offsets[r] + k]` over the rows.
    fn columns(&self, src: &[T], base: usize, row_offsets: &[usize], out: &mut [Self::Out]) -> Result<()>;
}

fn kernel_error(op: &'static str, error: brasa_kernels::KernelError) -> TensorError {
    TensorError::kernel(op, error)
}

/// Runs `reduction` over the plan into a fresh tensor of the output shape.
fn execute<T: WithDType, R: Reduction<T>>(op: &'static str, plan: &Plan, reduction: &R) -> Result<Tensor> {
    let source = &plan.source;
    let result = output(source.device(), R::Out::DTYPE, &plan.computed_shape)?;
    let src = source.storage().read::<T>(op)?;
    // SAFETY: every walk writes each output element and reads none: the empty
    // walk fills them; the row walk writes one per base (the plan has one per
    // output element); the column walk hands every `width`-group of the
    // output (one per offset of `outer`) to the column kernels, which set
    // each element of their block (`out[k] = ...`).
    let computed = unsafe {
        result.init_with::<R::Out>(op, |out| {
            if !out.is_empty() {
                match &plan.walk {
                    Walk::Empty => out.fill(reduction.row(&[])),
                    Walk::Rows { bases, len } => reduce_rows(op, &src, bases, *len, out, reduction)?,
                    Walk::Columns { outer, width, row_offsets } => {
                        reduce_columns(op, &src, outer, *width, row_offsets, out, reduction)?
                    }
                }
            }
            Ok(())
        })?
    };
    drop(src);
    if plan.computed_shape == plan.out_shape {
        return Ok(computed);
    }
    // Outputs along kept broadcast dims are equal: copy the one computed.
    computed.expand(plan.out_shape.clone())?.contiguous()
}

fn reduce_rows<T: WithDType, R: Reduction<T>>(
    op: &'static str,
    src: &[T],
    bases: &Layout,
    len: usize,
    out: &mut [R::Out],
    reduction: &R,
) -> Result<()> {
    // Every run lies in the storage: checked once here, so the slicing
    // below cannot fail.
    let end = bases.required_storage_len().saturating_sub(1).saturating_add(len);
    if end > src.len() {
        return Err(TensorError::internal(op, format!("rows reach element {end} of {}", src.len())));
    }
    if out.len() < 2 || out.len().saturating_mul(len) < PARALLEL_MIN_WORK {
        for (o, base) in out.iter_mut().zip(bases.offsets()) {
            *o = reduction.row(&src[base..base + len]);
        }
        return Ok(());
    }
    let bases = offsets_vec(op, bases)?;
    let per_task = TASK_WORK.div_ceil(len).max(1);
    out.par_chunks_mut(per_task).zip(bases.par_chunks(per_task)).for_each(|(out, bases)| {
        for (o, &base) in out.iter_mut().zip(bases) {
            *o = reduction.row(&src[base..base + len]);
        }
    });
    Ok(())
}

fn reduce_columns<T: WithDType, R: Reduction<T>>(
    op: &'static str,
    src: &[T],
    outer: &Layout,
    width: usize,
    row_offsets: &[usize],
    out: &mut [R::Out],
    reduction: &R,
) -> Result<()> {
    let block = |out: &mut [R::Out], base: usize| -> Result<()> {
        for (i, chunk) in out.chunks_mut(COLUMN_BLOCK).enumerate() {
            reduction.columns(src, base + i * COLUMN_BLOCK, row_offsets, chunk)?;
        }
        Ok(())
    };
    let work = out.len().saturating_mul(row_offsets.len());
    if work < PARALLEL_MIN_WORK {
        for (out, base) in out.chunks_mut(width).zip(outer.offsets()) {
            block(out, base)?;
        }
        return Ok(());
    }
    // Tasks are column blocks of every outer group.
    let bases = offsets_vec(op, outer)?;
    out.par_chunks_mut(width).zip(bases.par_iter()).try_for_each(|(out, &base)| {
        out.par_chunks_mut(COLUMN_BLOCK)
            .enumerate()
            .try_for_each(|(i, chunk)| reduction.columns(src, base + i * COLUMN_BLOCK, row_offsets, chunk))
    })
}

// ----- the reductions ------------------------------------------------------

/// Sums; each element read stands for `repeat` equal ones (`Plan::repeat`).
struct Sum {
    repeat: usize,
}

impl<T: ReduceElement> Reduction<T> for Sum
where
    T::Acc: WithDType,
{
    type Out = T::Acc;
    fn row(&self, row: &[T]) -> T::Acc {
        let sum = kernels::sum(row);
        if self.repeat == 1 {
            sum
        } else {
            sum.times(self.repeat)
        }
    }
    fn columns(&self, src: &[T], base: usize, row_offsets: &[usize], out: &mut [T::Acc]) -> Result<()> {
        kernels::sum_columns(src, base, row_offsets, out).map_err(|e| kernel_error("sum", e))?;
        if self.repeat != 1 {
            for o in out.iter_mut() {
                *o = o.times(self.repeat);
            }
        }
        Ok(())
    }
}

/// Means over `count` elements read: repeated (broadcast) elements change
/// neither the sum's share of each element nor the mean.
struct Mean {
    count: usize,
}

impl<T: ReduceElement> Reduction<T> for Mean
where
    T::Acc: WithDType + FloatAccumulator,
{
    type Out = T::Acc;
    fn row(&self, row: &[T]) -> T::Acc {
        kernels::sum(row) / <T::Acc as FloatAccumulator>::from_f64(self.count as f64)
    }
    fn columns(&self, src: &[T], base: usize, row_offsets: &[usize], out: &mut [T::Acc]) -> Result<()> {
        kernels::sum_columns(src, base, row_offsets, out).map_err(|e| kernel_error("mean", e))?;
        let count = <T::Acc as FloatAccumulator>::from_f64(self.count as f64);
        for o in out.iter_mut() {
            *o = *o / count;
        }
        Ok(())
    }
}

/// Variance with `correction` (Bessel's for 1), or standard deviation, over
/// `count` elements of which the walk reads one in `repeat` (the mean of the
/// elements read is the mean of all; each squared deviation counts `repeat`
/// times).
struct Var {
    count: usize,
    correction: usize,
    sqrt: bool,
    repeat: usize,
}

impl Var {
    fn finish<A: FloatAccumulator>(&self, squares: A) -> A {
        let squares = if self.repeat == 1 { squares } else { squares.times(self.repeat) };
        // PyTorch divides by max(N - correction, 0): a zero divisor gives inf or NaN.
        let divisor = A::from_f64(self.count.saturating_sub(self.correction) as f64);
        let var = squares / divisor;
        if self.sqrt {
            var.sqrt()
        } else {
            var
        }
    }
}

impl<T: ReduceElement> Reduction<T> for Var
where
    T::Acc: WithDType + FloatAccumulator,
{
    type Out = T::Acc;
    fn row(&self, row: &[T]) -> T::Acc {
        if row.is_empty() {
            return <T::Acc as FloatAccumulator>::NAN;
        }
        let mean = kernels::sum(row) / <T::Acc as FloatAccumulator>::from_f64(row.len() as f64);
        self.finish(kernels::sum_sq_dev(row, mean))
    }
    fn columns(&self, src: &[T], base: usize, row_offsets: &[usize], out: &mut [T::Acc]) -> Result<()> {
        let error = |e| kernel_error("var", e);
        let mut mean = vec![<T::Acc as Accumulator>::ZERO; out.len()];
        kernels::sum_columns(src, base, row_offsets, &mut mean).map_err(error)?;
        let count = <T::Acc as FloatAccumulator>::from_f64(row_offsets.len() as f64);
        for m in mean.iter_mut() {
            *m = *m / count;
        }
        kernels::sq_dev_columns(src, base, row_offsets, &mean, out).map_err(error)?;
        for o in out.iter_mut() {
            *o = self.finish(*o);
        }
        Ok(())
    }
}

/// Max (`MAX`) or min values.
struct Extreme<const MAX: bool>;

impl<T: ReduceElement + WithDType, const MAX: bool> Reduction<T> for Extreme<MAX> {
    type Out = T;
    fn row(&self, row: &[T]) -> T {
        // Never empty: empty reductions are refused before planning.
        let value = if MAX { kernels::max(row) } else { kernels::min(row) };
        value.unwrap_or(T::ZERO)
    }
    fn columns(&self, src: &[T], base: usize, row_offsets: &[usize], out: &mut [T]) -> Result<()> {
        let result = if MAX {
            kernels::max_columns(src, base, row_offsets, out)
        } else {
            kernels::min_columns(src, base, row_offsets, out)
        };
        result.map_err(|e| kernel_error(if MAX { "max" } else { "min" }, e))
    }
}

/// Argmax (`MAX`) or argmin; `positions` as in `Plan::positions`.
struct ArgExtreme<'a, const MAX: bool> {
    positions: Option<&'a [(usize, bool)]>,
}

impl<const MAX: bool> ArgExtreme<'_, MAX> {
    fn full(&self, read: usize) -> i64 {
        self.positions.map_or(read, |dims| full_position(dims, read)) as i64
    }
}

impl<T: ReduceElement, const MAX: bool> Reduction<T> for ArgExtreme<'_, MAX> {
    type Out = i64;
    fn row(&self, row: &[T]) -> i64 {
        let position = if MAX { kernels::argmax(row) } else { kernels::argmin(row) };
        position.map_or(0, |p| self.full(p))
    }
    fn columns(&self, src: &[T], base: usize, row_offsets: &[usize], out: &mut [i64]) -> Result<()> {
        let result = if MAX {
            kernels::argmax_columns(src, base, row_offsets, out)
        } else {
            kernels::argmin_columns(src, base, row_offsets, out)
        };
        result.map_err(|e| kernel_error(if MAX { "argmax" } else { "argmin" }, e))?;
        if self.positions.is_some() {
            for o in out.iter_mut() {
                *o = self.full(*o as usize);
            }
        }
        Ok(())
    }
}
