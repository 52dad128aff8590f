//! Reductions over a list of dims: `sum`, `mean`, `max`, `min`, `argmax`,
//! `argmin`, `var` and `std`, with `keepdim`, plus `sum_all`/`mean_all`.
//!
//! # Dtypes (PyTorch's rules)
//! - `sum` of integers or `bool` is `i64`; of floats, the input dtype.
//! - `mean`, `var` and `std` need a floating-point tensor.
//! - `f16`/`bf16` sums, means and variances accumulate in `f32` and are
//!   rounded to the input dtype once, at the end.
//! - `max`/`min` keep the dtype; `argmax`/`argmin` give `i64`.
//!
//! # How the data is walked
//! The dims are split into kept and reduced ones, and one of three plans is
//! picked from the strides:
//! - **rows**: the reduced elements of each output are one contiguous run
//!   (reducing the innermost dims of a contiguous tensor) — each output is a
//!   slice kernel call;
//! - **columns**: the innermost kept dim is contiguous (reducing an outer or
//!   middle dim) — the reduced rows are added element-wise into an
//!   accumulator row, which vectorises along the kept dim;
//! - otherwise the tensor is copied with the reduced dims moved last, and
//!   reduced as rows.
//!
//! Outputs are split over rayon's threads once the work reaches
//! [`PARALLEL_MIN_WORK`] elements; single long rows are split inside the
//! kernels.

use crate::dispatch::{dispatch_dtype, dispatch_float};
use crate::dtype::{DType, WithDType};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::ops::common::{expect_float, output};
use crate::shape::{resolve_dim, Shape};
use crate::storage::lock_storages;
use crate::tensor::Tensor;
use brasa_kernels::reduce::{self as kernels, Accumulator, FloatAccumulator, ReduceElement};
use rayon::prelude::*;

/// Reductions reading fewer elements than this run on one thread. Measured
/// by timing sums over the last dim of `[n / 256, 256]` `f32` tensors on one
/// thread and on two (2-core Zen 5, release build): two threads lose below
/// 2^17 elements (a fork-join and waking the other core cost ~10 µs, as much
/// as summing 2^16 elements), break even at 2^17 and win from 2^18 (1.3x,
/// 1.65x at 2^19).
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
    /// Elements reduced into each output.
    count: usize,
}

/// Resolves `dims` (empty = all) into a mask over the tensor's dims; a dim
/// listed twice is an error.
fn reduced_mask(x: &Tensor, op: &'static str, dims: &[isize]) -> Result<Vec<bool>> {
    let rank = x.rank();
    if dims.is_empty() {
        return Ok(vec![true; rank]);
    }
    let mut mask = vec![false; rank];
    for &dim in dims {
        // A 0-d tensor accepts dim 0 or -1, as in PyTorch.
        let d = resolve_dim(dim, rank.max(1), op)?;
        if rank == 0 {
            continue;
        }
        if std::mem::replace(&mut mask[d], true) {
            return Err(TensorError::invalid(op, format!("dim {d} appears more than once in the dims {dims:?}")));
        }
    }
    Ok(mask)
}

fn plan(x: &Tensor, op: &'static str, dims: &[isize], keepdim: bool) -> Result<Plan> {
    let mask = reduced_mask(x, op, dims)?;
    let layout = x.layout();
    let (mut kept_dims, mut kept_strides, mut red_dims, mut red_strides, mut out_dims) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for ((&size, &stride), &reduced) in layout.dims().iter().zip(layout.strides()).zip(&mask) {
        if reduced {
            red_dims.push(size);
            red_strides.push(stride);
            if keepdim {
                out_dims.push(1);
            }
        } else {
            kept_dims.push(size);
            kept_strides.push(stride);
            out_dims.push(size);
        }
    }
    let out_shape = Shape::from(out_dims);
    let count: usize = red_dims.iter().product();
    if count == 0 {
        return Ok(Plan { source: x.clone(), walk: Walk::Empty, out_shape, count });
    }
    let kept = Layout::new(kept_dims, kept_strides, layout.offset());
    let reduced = Layout::new(red_dims, red_strides, 0);
    if let (Ok(kept), Ok(reduced)) = (kept, reduced) {
        let reduced = reduced.coalesced();
        if reduced.numel() == 1 || reduced.strides() == [1] {
            return Ok(Plan { source: x.clone(), walk: Walk::Rows { bases: kept, len: count }, out_shape, count });
        }
        let kept = kept.coalesced();
        let rank = kept.rank();
        if let (Some(&width), Some(&1)) = (kept.dims().last(), kept.strides().last()) {
            if width >= COLUMN_MIN_WIDTH {
                let outer = Layout::new(&kept.dims()[..rank - 1], kept.strides()[..rank - 1].to_vec(), kept.offset())?;
                let row_offsets = reduced.offsets().collect();
                let walk = Walk::Columns { outer, width, row_offsets };
                return Ok(Plan { source: x.clone(), walk, out_shape, count });
            }
        }
    }
    // Move the reduced dims last and copy: then every output is a row.
    let order: Vec<usize> = (0..mask.len()).filter(|&d| !mask[d]).chain((0..mask.len()).filter(|&d| mask[d])).collect();
    let source = x.permute(&order)?.contiguous()?;
    let outputs = x.numel() / count;
    let bases = Layout::new([outputs], vec![count as isize], source.layout().offset())?;
    Ok(Plan { source, walk: Walk::Rows { bases, len: count }, out_shape, count })
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

/// The error for a float-only reduction of another dtype (checked before, so
/// this only guards against misuse).
fn not_float(op: &'static str, dtype: DType) -> TensorError {
    TensorError::invalid(op, format!("needs a floating-point tensor, got {dtype}"))
}

fn kernel_error(op: &'static str, error: brasa_kernels::KernelError) -> TensorError {
    TensorError::invalid(op, format!("internal layout error: {error}"))
}

/// Runs `reduction` over the plan into a fresh tensor of the output shape.
fn execute<T: WithDType, R: Reduction<T>>(op: &'static str, plan: &Plan, reduction: &R) -> Result<Tensor> {
    let _range = brasa_profile::record_op(op, &[]);
    let source = &plan.source;
    let storage = output(source.device(), R::Out::DTYPE, &plan.out_shape)?;
    {
        // SAFETY: the storage is new and ours alone.
        let out = unsafe { storage.host_slice_mut::<R::Out>(op)? };
        let _guard = lock_storages(&[source.storage()], &[]);
        // SAFETY: the read lock is held while `src` lives.
        let src = unsafe { source.storage().host_slice::<T>(op)? };
        if !out.is_empty() {
            match &plan.walk {
                Walk::Empty => out.fill(reduction.row(&[])),
                Walk::Rows { bases, len } => reduce_rows(op, src, bases, *len, out, reduction)?,
                Walk::Columns { outer, width, row_offsets } => {
                    reduce_columns(op, src, outer, *width, row_offsets, out, reduction)?
                }
            }
        }
    }
    Ok(Tensor::from_storage(storage, plan.out_shape.clone()))
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
        return Err(TensorError::invalid(op, format!("internal: rows reach element {end} of {}", src.len())));
    }
    if out.len() < 2 || out.len().saturating_mul(len) < PARALLEL_MIN_WORK {
        for (o, base) in out.iter_mut().zip(bases.offsets()) {
            *o = reduction.row(&src[base..base + len]);
        }
        return Ok(());
    }
    let bases: Vec<usize> = bases.offsets().collect();
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
    let _ = op;
    // Tasks are column blocks of every outer group.
    let bases: Vec<usize> = outer.offsets().collect();
    out.par_chunks_mut(width).zip(bases.par_iter()).try_for_each(|(out, &base)| {
        out.par_chunks_mut(COLUMN_BLOCK)
            .enumerate()
            .try_for_each(|(i, chunk)| reduction.columns(src, base + i * COLUMN_BLOCK, row_offsets, chunk))
    })
}

// ----- the reductions ------------------------------------------------------

struct Sum;

impl<T: ReduceElement> Reduction<T> for Sum
where
    T::Acc: WithDType,
{
    type Out = T::Acc;
    fn row(&self, row: &[T]) -> T::Acc {
        kernels::sum(row)
    }
    fn columns(&self, src: &[T], base: usize, row_offsets: &[usize], out: &mut [T::Acc]) -> Result<()> {
        kernels::sum_columns(src, base, row_offsets, out).map_err(|e| kernel_error("sum", e))
    }
}

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

/// Variance with `correction` (Bessel's for 1), or standard deviation.
struct Var {
    count: usize,
    correction: usize,
    sqrt: bool,
}

impl Var {
    fn finish<A: FloatAccumulator>(&self, squares: A) -> A {
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

/// Argmax (`MAX`) or argmin.
struct ArgExtreme<const MAX: bool>;

impl<T: ReduceElement, const MAX: bool> Reduction<T> for ArgExtreme<MAX> {
    type Out = i64;
    fn row(&self, row: &[T]) -> i64 {
        let position = if MAX { kernels::argmax(row) } else { kernels::argmin(row) };
        position.map_or(0, |p| p as i64)
    }
    fn columns(&self, src: &[T], base: usize, row_offsets: &[usize], out: &mut [i64]) -> Result<()> {
        let result = if MAX {
            kernels::argmax_columns(src, base, row_offsets, out)
        } else {
            kernels::argmin_columns(src, base, row_offsets, out)
        };
        result.map_err(|e| kernel_error(if MAX { "argmax" } else { "argmin" }, e))
    }
}

/// Errors when a reduced dim is empty: max, min and their positions have no
/// value over nothing.
fn refuse_empty(x: &Tensor, op: &'static str, dims: &[isize]) -> Result<()> {
    let mask = reduced_mask(x, op, dims)?;
    if let Some(d) = mask.iter().zip(x.dims()).position(|(&reduced, &size)| reduced && size == 0) {
        return Err(TensorError::shape(
            op,
            format!(
                "cannot reduce dim {d} of size 0 (shape {:?}): the {op} of no elements is undefined; reduce other dims or check the input",
                x.dims()
            ),
        ));
    }
    Ok(())
}

impl Tensor {
    /// The sum over `dims` (negative dims count from the end; an empty list
    /// reduces every dim). With `keepdim`, reduced dims stay as size 1.
    /// Integer and `bool` tensors sum into `i64`; `f16`/`bf16` accumulate in
    /// `f32`. Float sums are pairwise (accurate to about `log2(n)` roundings).
    pub fn sum(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        let plan = plan(self, "sum", dims, keepdim)?;
        let out = dispatch_dtype!(self.dtype(), T => execute::<T, _>("sum", &plan, &Sum)?);
        if self.dtype().is_float() {
            out.to_dtype(self.dtype())
        } else {
            Ok(out)
        }
    }

    /// The sum of every element as a 0-d tensor (see [`Tensor::sum`]).
    pub fn sum_all(&self) -> Result<Tensor> {
        self.sum(&[], false)
    }

    /// The mean over `dims` (empty = all), for floating-point tensors (an
    /// integer tensor is an error, as in PyTorch). `f16`/`bf16` accumulate in
    /// `f32`. The mean of no elements is NaN.
    pub fn mean(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        expect_float("mean", self)?;
        let plan = plan(self, "mean", dims, keepdim)?;
        let mean = Mean { count: plan.count };
        dispatch_float!(self.dtype(), T => execute::<T, _>("mean", &plan, &mean)?.to_dtype(self.dtype()), Err(not_float("mean", self.dtype())))
    }

    /// The mean of every element as a 0-d tensor (see [`Tensor::mean`]).
    pub fn mean_all(&self) -> Result<Tensor> {
        self.mean(&[], false)
    }

    /// The unbiased variance over `dims` (empty = all): `Σ(x - mean)² / (N - 1)`,
    /// PyTorch's default. See [`Tensor::var_with_correction`].
    pub fn var(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.var_with_correction(dims, 1, keepdim)
    }

    /// The variance over `dims` (empty = all): `Σ(x - mean)² / max(N - correction, 0)`
    /// (`correction` 1 is unbiased, 0 the population variance). Floating-point
    /// tensors only; computed in two passes (mean, then squared deviations),
    /// in `f32` for `f16`/`bf16`. A zero divisor gives inf or NaN, as in PyTorch.
    pub fn var_with_correction(&self, dims: &[isize], correction: usize, keepdim: bool) -> Result<Tensor> {
        self.variance("var", dims, correction, keepdim, false)
    }

    /// The unbiased standard deviation over `dims` (empty = all): the square
    /// root of [`Tensor::var`].
    pub fn std(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.std_with_correction(dims, 1, keepdim)
    }

    /// The standard deviation with a given `correction` (see
    /// [`Tensor::var_with_correction`]).
    pub fn std_with_correction(&self, dims: &[isize], correction: usize, keepdim: bool) -> Result<Tensor> {
        self.variance("std", dims, correction, keepdim, true)
    }

    fn variance(
        &self,
        op: &'static str,
        dims: &[isize],
        correction: usize,
        keepdim: bool,
        sqrt: bool,
    ) -> Result<Tensor> {
        expect_float(op, self)?;
        let plan = plan(self, op, dims, keepdim)?;
        let var = Var { count: plan.count, correction, sqrt };
        dispatch_float!(self.dtype(), T => execute::<T, _>(op, &plan, &var)?.to_dtype(self.dtype()), Err(not_float(op, self.dtype())))
    }

    /// The largest value over `dims` (empty = all), in this tensor's dtype;
    /// NaN wins. Reducing a dim of size 0 is an error naming the dim.
    pub fn max(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        refuse_empty(self, "max", dims)?;
        let plan = plan(self, "max", dims, keepdim)?;
        dispatch_dtype!(self.dtype(), T => execute::<T, _>("max", &plan, &Extreme::<true>))
    }

    /// The smallest value over `dims` (empty = all); NaN wins. Reducing a dim
    /// of size 0 is an error naming the dim.
    pub fn min(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        refuse_empty(self, "min", dims)?;
        let plan = plan(self, "min", dims, keepdim)?;
        dispatch_dtype!(self.dtype(), T => execute::<T, _>("min", &plan, &Extreme::<false>))
    }

    /// The `i64` position of the largest value over `dims` (empty = all):
    /// the first one on ties and the first NaN if any, as in PyTorch. Over
    /// several dims the position is the row-major index within the reduced
    /// dims (the flat index when reducing all). A dim of size 0 is an error.
    pub fn argmax(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        refuse_empty(self, "argmax", dims)?;
        let plan = plan(self, "argmax", dims, keepdim)?;
        dispatch_dtype!(self.dtype(), T => execute::<T, _>("argmax", &plan, &ArgExtreme::<true>))
    }

    /// The `i64` position of the smallest value over `dims` (see
    /// [`Tensor::argmax`]).
    pub fn argmin(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        refuse_empty(self, "argmin", dims)?;
        let plan = plan(self, "argmin", dims, keepdim)?;
        dispatch_dtype!(self.dtype(), T => execute::<T, _>("argmin", &plan, &ArgExtreme::<false>))
    }
}

#[cfg(test)]
mod tests {
    use crate::{DType, Device, Tensor};

    fn matrix() -> Tensor {
        Tensor::from_vec_on(vec![1f32, 5.0, 3.0, 4.0, 2.0, 6.0], [2, 3], Device::CPU).unwrap()
    }

    #[test]
    fn sums_along_rows_columns_and_all() {
        let m = matrix();
        assert_eq!(m.sum(&[1], false).unwrap().to_vec::<f32>().unwrap(), [9.0, 12.0]);
        assert_eq!(m.sum(&[0], true).unwrap().dims(), [1, 3]);
        assert_eq!(m.sum(&[-2], false).unwrap().to_vec::<f32>().unwrap(), [5.0, 7.0, 9.0]);
        assert_eq!(m.sum_all().unwrap().dims(), [] as [usize; 0]);
        assert_eq!(m.sum_all().unwrap().item::<f64>().unwrap(), 21.0);
        assert_eq!(m.t().unwrap().sum(&[1], false).unwrap().to_vec::<f32>().unwrap(), [5.0, 7.0, 9.0]);
        let ints = Tensor::from_vec_on(vec![true, false, true], [3], Device::CPU).unwrap();
        let count = ints.sum_all().unwrap();
        assert_eq!((count.dtype(), count.item::<i64>().unwrap()), (DType::I64, 2));
    }

    #[test]
    fn extrema_and_positions() {
        let m = matrix();
        assert_eq!(m.max(&[1], false).unwrap().to_vec::<f32>().unwrap(), [5.0, 6.0]);
        assert_eq!(m.min(&[0], false).unwrap().to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0]);
        assert_eq!(m.argmax(&[], false).unwrap().item::<i64>().unwrap(), 5);
        assert_eq!(m.argmin(&[1], true).unwrap().to_vec::<i64>().unwrap(), [0, 1]);
        let empty = Tensor::zeros_on([2, 0], DType::F32, Device::CPU).unwrap();
        let error = empty.max(&[1], false).unwrap_err().to_string();
        assert!(error.contains("dim 1 of size 0"), "{error}");
        assert_eq!(empty.max(&[0], false).unwrap().dims(), [0]);
    }

    #[test]
    fn mean_and_var_follow_pytorch() {
        let m = matrix();
        assert_eq!(m.mean(&[1], false).unwrap().to_vec::<f32>().unwrap(), [3.0, 4.0]);
        assert_eq!(m.var(&[1], false).unwrap().to_vec::<f32>().unwrap(), [4.0, 4.0]);
        assert_eq!(m.var_with_correction(&[0], 0, false).unwrap().to_vec::<f32>().unwrap(), [2.25, 2.25, 2.25]);
        assert_eq!(m.std(&[1], false).unwrap().to_vec::<f32>().unwrap(), [2.0, 2.0]);
        let ints = Tensor::from_vec_on(vec![1i64, 2], [2], Device::CPU).unwrap();
        let error = ints.mean(&[], false).unwrap_err().to_string();
        assert!(error.contains("mean") && error.contains("i64"), "{error}");
        let empty = Tensor::zeros_on([0], DType::F32, Device::CPU).unwrap();
        assert!(empty.mean_all().unwrap().item::<f32>().unwrap().is_nan());
        assert_eq!(empty.sum_all().unwrap().item::<f32>().unwrap(), 0.0);
        let error = m.sum(&[1, -1], false).unwrap_err().to_string();
        assert!(error.contains("more than once"), "{error}");
    }
}
