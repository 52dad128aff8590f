//! Adaptive 2-d pooling, PyTorch's `adaptive_avg_pool2d` and
//! `adaptive_max_pool2d`: the caller names the output size and the windows
//! follow from it. Output row `i` of `out` over `H` input rows pools rows
//! `floor(i·H/out) .. ceil((i+1)·H/out)`, so windows may differ in size and
//! overlap, and an output larger than the input repeats rows.
//!
//! Both are composed from existing ops, so they run on every device with no
//! kernel of their own:
//!
//! - average pooling sums each window one axis at a time: `index_select`
//!   gathers every window's elements along the width (a window shorter than
//!   the longest points at a zero appended to the axis), a sum folds them,
//!   a division by the window's length averages; then the same along the
//!   height. The gradient spreads each output gradient, divided by its
//!   window's length, to the positions of the window the same way (each
//!   input position gathers the windows that hold it). Only additions of
//!   a window's own elements, never products with zeros: a NaN or an
//!   infinity reaches the outputs of its windows and no other, as in
//!   PyTorch's loops (two products with averaging matrices would spread it
//!   everywhere, as `0 · NaN = NaN`);
//! - max pooling gathers every window's elements (`index_select` over the
//!   flattened plane with a table of flat positions; a window shorter than
//!   the longest repeats its first row or column, which cannot change a
//!   maximum nor, coming after the original, which element is first), takes
//!   the `argmax`, and maps it back to the flat index `h·W + w` as
//!   [`Tensor::max_pool2d`] returns; [`Tensor::max_pool2d_backward`] then
//!   routes the gradient.

use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::ops::common::expect_float;
use crate::shape::Shape;
use crate::tensor::Tensor;

/// PyTorch's adaptive windows: `[start, end)` of each of `out` outputs over
/// `input` positions (`start = floor(i·input/out)`, `end =
/// ceil((i+1)·input/out)`). Computed in u128 so that `i·input` cannot
/// overflow.
fn windows(input: usize, out: usize) -> Vec<(usize, usize)> {
    let (n, m) = (input as u128, out as u128);
    (0..m)
        .map(|i| {
            let start = i * n / m;
            let end = ((i + 1) * n).div_ceil(m);
            // Both are at most `input`, so they fit a usize.
            (start as usize, end as usize)
        })
        .collect()
}

/// The checked shape of an adaptive pooling: the leading dims and the
/// plane's (height, width).
struct AdaptivePlan {
    lead: Vec<usize>,
    input: (usize, usize),
    output: (usize, usize),
}

impl AdaptivePlan {
    fn new(op: &'static str, input: &[usize], output: (usize, usize)) -> Result<Self> {
        if !(3..=4).contains(&input.len()) {
            return Err(TensorError::shape(
                op,
                format!("expected a 4-d input [N, C, H, W] or a 3-d input [C, H, W], got shape {input:?}"),
            ));
        }
        let (lead, plane) = input.split_at(input.len() - 2);
        if plane.contains(&0) {
            return Err(TensorError::shape(
                op,
                format!("input {input:?} has an empty plane: H and W must be positive"),
            ));
        }
        if output.0 == 0 || output.1 == 0 {
            return Err(TensorError::invalid(
                op,
                format!("output_size {output:?} must be positive in both dims (input {input:?})"),
            ));
        }
        Ok(AdaptivePlan { lead: lead.to_vec(), input: (plane[0], plane[1]), output })
    }

    fn output_shape(&self) -> Shape {
        Shape::from([self.lead.as_slice(), &[self.output.0, self.output.1]].concat())
    }
}

/// Along `dim` of `x`, result slot `r` is the sum of `x`'s slices at
/// `sources[r]` (the result has `sources.len()` slots there); slots may
/// sum different numbers of slices (a zero slice appended to `x` pads the
/// shorter lists). Sums only: a non-finite value reaches exactly the slots
/// that name it.
fn gather_sum(x: &Tensor, dim: usize, sources: &[Vec<usize>]) -> Result<Tensor> {
    let size = x.dims()[dim];
    let width = sources.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let mut zero_dims = x.dims().to_vec();
    zero_dims[dim] = 1;
    let padded = Tensor::cat(&[x, &Tensor::zeros_on(zero_dims, x.dtype(), x.device())?], dim as isize)?;
    let table: Vec<i64> =
        sources.iter().flat_map(|list| (0..width).map(move |a| list.get(a).copied().unwrap_or(size) as i64)).collect();
    let table = Tensor::from_vec_on(table, [sources.len() * width], x.device())?;
    // [.., slots·width, ..] → [.., slots, width, ..] → sum over width.
    let mut split: Vec<isize> = x.dims().iter().map(|&d| d as isize).collect();
    split.splice(dim..=dim, [sources.len() as isize, width as isize]);
    padded.index_select(dim as isize, &table)?.reshape(&split)?.sum(&[dim as isize + 1], false)
}

/// The window lengths along `dim` of an input of `rank` dims, shaped to
/// divide by (`[out, 1]` for the height, `[out]` for the width).
fn window_lengths(windows: &[(usize, usize)], dim: usize, rank: usize, like: &Tensor) -> Result<Tensor> {
    let lengths: Vec<f64> = windows.iter().map(|&(start, end)| (end - start) as f64).collect();
    let mut dims = vec![windows.len()];
    dims.extend(std::iter::repeat_n(1, rank - 1 - dim));
    Tensor::from_vec_on(lengths, dims, like.device())?.to_dtype(like.dtype())
}

/// Averages each of `windows` along `dim` of `x`.
fn average_windows(x: &Tensor, dim: usize, windows: &[(usize, usize)]) -> Result<Tensor> {
    let sources: Vec<Vec<usize>> = windows.iter().map(|&(start, end)| (start..end).collect()).collect();
    gather_sum(x, dim, &sources)?.div(&window_lengths(windows, dim, x.rank(), x)?)
}

/// The gradient of [`average_windows`] along `dim`: each output gradient
/// divided by its window's length, summed into every position it holds
/// (`input` positions).
fn spread_windows(g: &Tensor, dim: usize, windows: &[(usize, usize)], input: usize) -> Result<Tensor> {
    let shares = g.div(&window_lengths(windows, dim, g.rank(), g)?)?;
    let mut holders = vec![Vec::new(); input];
    for (i, &(start, end)) in windows.iter().enumerate() {
        for holder in &mut holders[start..end] {
            holder.push(i);
        }
    }
    gather_sum(&shares, dim, &holders)
}

/// f16 and bf16 are averaged in f32 (the matrices' `1/len` would otherwise
/// be rounded to 8 or 11 bits); f32 and f64 in themselves.
fn compute_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        other => other,
    }
}

impl Tensor {
    /// Adaptive average pooling of this `[N, C, H, W]` (or `[C, H, W]`)
    /// float input to `output_size` (height, width), PyTorch's
    /// `adaptive_avg_pool2d`: output `(i, j)` is the mean of input rows
    /// `floor(i·H/out_h) .. ceil((i+1)·H/out_h)` and the columns likewise,
    /// so windows may be unequal and overlap; an output larger than the
    /// input repeats elements. f16 and bf16 are computed in f32.
    ///
    /// Errors: a rank other than 3 or 4, an empty plane, an output size of
    /// zero, a non-float dtype.
    ///
    /// ```
    /// # use brasa_tensor::Tensor;
    /// let x = Tensor::from_vec((1..=5).map(|v| v as f32).collect(), [1, 1, 5])?;
    /// // Windows [0, 2), [1, 4), [3, 5).
    /// assert_eq!(x.adaptive_avg_pool2d((1, 3))?.to_vec::<f32>()?, [1.5, 3.0, 4.5]);
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn adaptive_avg_pool2d(&self, output_size: (usize, usize)) -> Result<Tensor> {
        const OP: &str = "adaptive_avg_pool2d";
        let _range = brasa_profile::record_op(OP, &[self.dims()]);
        expect_float(OP, self)?;
        let plan = AdaptivePlan::new(OP, self.dims(), output_size)?;
        let x = self.to_dtype(compute_dtype(self.dtype()))?;
        let rank = x.rank();
        // Width first, then height (each sums a window's elements, then divides).
        let pooled = average_windows(&x, rank - 1, &windows(plan.input.1, plan.output.1))?;
        average_windows(&pooled, rank - 2, &windows(plan.input.0, plan.output.0))?.to_dtype(self.dtype())
    }

    /// The gradient of [`Tensor::adaptive_avg_pool2d`] with respect to its
    /// input of `input_shape`, given this output gradient: each input
    /// element receives `grad / window size` from every window that holds
    /// it (and only from those: a non-finite gradient stays in its window).
    pub fn adaptive_avg_pool2d_backward(&self, input_shape: impl Into<Shape>) -> Result<Tensor> {
        const OP: &str = "adaptive_avg_pool2d_backward";
        let _range = brasa_profile::record_op(OP, &[self.dims()]);
        let input_shape = input_shape.into();
        expect_float(OP, self)?;
        let rank = self.rank();
        if rank < 2 {
            return Err(TensorError::shape(
                OP,
                format!("grad_output must be [N, C, out_h, out_w] or [C, out_h, out_w], got {:?}", self.dims()),
            ));
        }
        let output = (self.dims()[rank - 2], self.dims()[rank - 1]);
        let plan = AdaptivePlan::new(OP, input_shape.dims(), output)?;
        if self.dims() != plan.output_shape().dims() {
            return Err(TensorError::shape(
                OP,
                format!(
                    "grad_output has shape {:?}, which does not pool an input of shape {:?} (leading dims differ)",
                    self.dims(),
                    input_shape.dims()
                ),
            ));
        }
        let g = self.to_dtype(compute_dtype(self.dtype()))?;
        let rank = g.rank();
        let spread = spread_windows(&g, rank - 1, &windows(plan.input.1, plan.output.1), plan.input.1)?;
        spread_windows(&spread, rank - 2, &windows(plan.input.0, plan.output.0), plan.input.0)?.to_dtype(self.dtype())
    }

    /// Adaptive max pooling of this `[N, C, H, W]` (or `[C, H, W]`) input to
    /// `output_size` (height, width), PyTorch's `adaptive_max_pool2d` with
    /// its windows as in [`Tensor::adaptive_avg_pool2d`].
    ///
    /// Returns the maxima and, as i64, the flat index `h·W + w` of each in
    /// its input plane, as [`Tensor::max_pool2d`] does (so
    /// [`Tensor::max_pool2d_backward`] is the gradient). Ties go to the first
    /// maximum in row-major order. A NaN wins; when a window holds several,
    /// the index is the first one's (PyTorch's loop reports the last).
    /// Supports the float dtypes, i64 and u8.
    ///
    /// ```
    /// # use brasa_tensor::Tensor;
    /// let x = Tensor::from_vec(vec![3f32, 1.0, 4.0, 1.0, 5.0], [1, 1, 5])?;
    /// let (values, indices) = x.adaptive_max_pool2d((1, 3))?;
    /// assert_eq!(values.to_vec::<f32>()?, [3.0, 4.0, 5.0]);
    /// assert_eq!(indices.to_vec::<i64>()?, [0, 2, 4]);
    /// # Ok::<(), brasa_tensor::TensorError>(())
    /// ```
    pub fn adaptive_max_pool2d(&self, output_size: (usize, usize)) -> Result<(Tensor, Tensor)> {
        const OP: &str = "adaptive_max_pool2d";
        let _range = brasa_profile::record_op(OP, &[self.dims()]);
        if self.dtype() == DType::Bool {
            return Err(TensorError::invalid(OP, "needs a numeric tensor (float, i64 or u8), got bool"));
        }
        let plan = AdaptivePlan::new(OP, self.dims(), output_size)?;
        let (in_h, in_w) = plan.input;
        let (rows, cols) = (windows(in_h, plan.output.0), windows(in_w, plan.output.1));
        let longest = |w: &[(usize, usize)]| w.iter().map(|&(s, e)| e - s).max().unwrap_or(1);
        let (k_h, k_w) = (longest(&rows), longest(&cols));
        let window = k_h * k_w;
        let windows_count = rows.len() * cols.len();
        // Flat positions of every window's elements, [out_h, out_w, k_h·k_w]
        // row-major; a short window repeats its first row / column at the end.
        let mut table = Vec::with_capacity(windows_count * window);
        for &(h0, h1) in &rows {
            for &(w0, w1) in &cols {
                for a in 0..k_h {
                    let h = if h0 + a < h1 { h0 + a } else { h0 };
                    for b in 0..k_w {
                        let w = if w0 + b < w1 { w0 + b } else { w0 };
                        table.push((h * in_w + w) as i64);
                    }
                }
            }
        }
        let table = Tensor::from_vec_on(table, [windows_count * window], self.device())?;
        let lead: Vec<isize> = plan.lead.iter().map(|&d| d as isize).collect();
        let shape = |tail: &[isize]| [lead.as_slice(), tail].concat();
        let (out_h, out_w) = (plan.output.0 as isize, plan.output.1 as isize);
        // [.., H·W] → [.., out_h·out_w·window] → [.., out_h, out_w, window].
        let gathered = self
            .reshape(&shape(&[(in_h * in_w) as isize]))?
            .index_select(-1, &table)?
            .reshape(&shape(&[out_h, out_w, window as isize]))?;
        let values = gathered.max(&[-1], false)?;
        let at = gathered.argmax(&[-1], true)?;
        // The winner's flat position: the table, seen as [out_h, out_w,
        // window] and broadcast over the leading dims, gathered at `at`.
        let positions = table
            .reshape(&[out_h, out_w, window as isize])?
            .broadcast_as(gathered.shape().clone())?
            .gather(-1, &at)?
            .squeeze(-1)?;
        Ok((values, positions))
    }
}

#[cfg(test)]
mod tests {
    use super::windows;

    #[test]
    fn pytorch_windows() {
        assert_eq!(windows(7, 3), [(0, 3), (2, 5), (4, 7)]);
        assert_eq!(windows(5, 3), [(0, 2), (1, 4), (3, 5)]);
        assert_eq!(windows(3, 5), [(0, 1), (0, 2), (1, 2), (1, 3), (2, 3)]);
        assert_eq!(windows(4, 2), [(0, 2), (2, 4)]);
        assert_eq!(windows(4, 1), [(0, 4)]);
    }
}
