//! 2-d pooling loops over one `H x W` plane: max pooling (values and the flat
//! index of each maximum, as PyTorch returns them) and average pooling, with
//! their backward passes. [`Pool2dGeometry`] checks the sizes once; callers
//! split the `N·C` planes of a batch over threads.
//!
//! Padding follows PyTorch: it is at most half the kernel, so every window
//! holds at least one input element; max pooling ignores padded positions,
//! average pooling counts them in the divisor only when asked to.
//!
//! With `ceil_mode` ([`Pool2dGeometry::with_ceil_mode`]) the output size is
//! rounded up, as PyTorch's: a last window may run past the padded input and
//! is clipped to it, but it always starts inside the input or its left
//! padding, so it too holds an input element.

use crate::error::{KernelError, Result};
use std::ops::{Add, AddAssign, Div};

/// Sizes of one 2-d pooling of an `H x W` plane, checked when made; pairs
/// are (height, width).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2dGeometry {
    input: (usize, usize),
    kernel: (usize, usize),
    stride: (usize, usize),
    padding: (usize, usize),
    output: (usize, usize),
}

fn extent(
    axis: &str,
    input: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    ceil_mode: bool,
) -> std::result::Result<usize, String> {
    if kernel == 0 || stride == 0 {
        return Err(format!("{axis}: kernel {kernel} and stride {stride} must be positive"));
    }
    if padding > kernel / 2 {
        return Err(format!(
            "{axis}: padding {padding} must be at most half the kernel size {kernel} ({})",
            kernel / 2
        ));
    }
    if input == 0 {
        return Err(format!("{axis}: the input has size 0"));
    }
    let overflow = || format!("{axis}: overflow");
    let padded = padding.checked_mul(2).and_then(|x| x.checked_add(input)).ok_or_else(overflow)?;
    // PyTorch's pooling_output_shape: (padded - kernel) / stride + 1, the
    // division rounded up with ceil_mode (adding stride - 1 first).
    let rounding = if ceil_mode { stride - 1 } else { 0 };
    let reach = padded.checked_add(rounding).ok_or_else(overflow)?;
    if kernel > reach {
        return Err(format!(
            "{axis}: kernel {kernel} is larger than the padded input ({input} + 2 x {padding} = {padded})"
        ));
    }
    let mut out = (reach - kernel) / stride + 1;
    // Rounding up may add a window starting in the right padding or beyond:
    // PyTorch drops it, so the last window starts before input + padding
    // (in padded coordinates).
    if ceil_mode && (out - 1).checked_mul(stride).is_none_or(|start| start >= input + padding) {
        out -= 1;
    }
    Ok(out)
}

impl Pool2dGeometry {
    /// The geometry of pooling an `input.0 x input.1` plane, output sizes
    /// rounded down (PyTorch's `ceil_mode=False`).
    ///
    /// Fails when a kernel size or stride is zero, when padding exceeds half
    /// the kernel, when the input is empty, or when the kernel is larger than
    /// the padded input.
    pub fn new(
        input: (usize, usize),
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
    ) -> Result<Self> {
        Self::with_ceil_mode(input, kernel, stride, padding, false)
    }

    /// As [`Pool2dGeometry::new`], with output sizes rounded up when
    /// `ceil_mode` (PyTorch's `ceil_mode=True`): `ceil((H + 2p - k) / s) + 1`,
    /// less one if that last window would start at or past `H + p` (in the
    /// right padding). A last window running past the padded input is
    /// clipped; with `ceil_mode` a kernel may then exceed the padded input
    /// by less than the stride.
    pub fn with_ceil_mode(
        input: (usize, usize),
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
        ceil_mode: bool,
    ) -> Result<Self> {
        let out_h = extent("height", input.0, kernel.0, stride.0, padding.0, ceil_mode)
            .map_err(|detail| KernelError::ShapeMismatch { detail })?;
        let out_w = extent("width", input.1, kernel.1, stride.1, padding.1, ceil_mode)
            .map_err(|detail| KernelError::ShapeMismatch { detail })?;
        input.0.checked_mul(input.1).ok_or(KernelError::Overflow { operand: "input" })?;
        Ok(Pool2dGeometry { input, kernel, stride, padding, output: (out_h, out_w) })
    }

    /// Input (height, width).
    pub fn input(&self) -> (usize, usize) {
        self.input
    }
    /// Output (height, width).
    pub fn output(&self) -> (usize, usize) {
        self.output
    }
    /// Elements of an input plane.
    pub fn input_len(&self) -> usize {
        self.input.0 * self.input.1
    }
    /// Elements of an output plane.
    pub fn output_len(&self) -> usize {
        self.output.0 * self.output.1
    }

    /// The input rows (or columns) window `o` covers, clipped to the input,
    /// and the window's size including padding.
    fn window(o: usize, input: usize, kernel: usize, stride: usize, padding: usize) -> (usize, usize, usize) {
        // o·stride < input + padding by construction (with or without
        // ceil_mode), so the window starts inside the input or its left
        // padding, `end` > `start` and `hi` > `lo`; `end` ≥ `padding`
        // because both terms of the `min` are.
        let start = o * stride;
        let end = (start + kernel).min(input + 2 * padding);
        let lo = start.saturating_sub(padding);
        let hi = (end - padding).min(input);
        (lo, hi, end - start)
    }

    fn check_len(operand: &'static str, required: usize, len: usize) -> Result<()> {
        if len < required {
            return Err(KernelError::OutOfBounds { operand, required, len });
        }
        Ok(())
    }

    /// Checks a strided plane view against a slice of `len` elements.
    fn check_plane(&self, len: usize, offset: usize, strides: [usize; 2]) -> Result<()> {
        let overflow = KernelError::Overflow { operand: "input" };
        let last = (self.input.0 - 1)
            .checked_mul(strides[0])
            .and_then(|x| (self.input.1 - 1).checked_mul(strides[1]).and_then(|y| x.checked_add(y)))
            .and_then(|x| x.checked_add(offset))
            .ok_or(overflow)?;
        Self::check_len("input", last + 1, len)
    }
}

/// Max pooling of one plane. Element `(h, w)` of the input is
/// `input[offset + h·strides[0] + w·strides[1]]`; `out` and `indices` (the
/// flat index `h·W + w` of each maximum) are dense `H_out x W_out`.
///
/// Ties keep the first maximum in row-major order; a NaN wins over any
/// number (the last NaN of the window is reported), as in PyTorch.
pub fn max_pool2d_plane<T: Copy + PartialOrd>(
    geometry: &Pool2dGeometry,
    input: &[T],
    offset: usize,
    strides: [usize; 2],
    out: &mut [T],
    indices: &mut [i64],
) -> Result<()> {
    let g = geometry;
    g.check_plane(input.len(), offset, strides)?;
    Pool2dGeometry::check_len("output", g.output_len(), out.len())?;
    Pool2dGeometry::check_len("indices", g.output_len(), indices.len())?;
    let (out_h, out_w) = g.output;
    let in_w = g.input.1;
    for oh in 0..out_h {
        let (h_lo, h_hi, _) = Pool2dGeometry::window(oh, g.input.0, g.kernel.0, g.stride.0, g.padding.0);
        for ow in 0..out_w {
            let (w_lo, w_hi, _) = Pool2dGeometry::window(ow, in_w, g.kernel.1, g.stride.1, g.padding.1);
            // The winner is tracked by its position (an integer select,
            // a cmov) rather than by branching on a comparison that real
            // data makes a coin toss: mispredictions made this loop 5x slower.
            let mut best_at = offset + h_lo * strides[0] + w_lo * strides[1];
            let mut best_hw = h_lo * in_w + w_lo;
            for h in h_lo..h_hi {
                let row = offset + h * strides[0];
                for w in w_lo..w_hi {
                    let at = row + w * strides[1];
                    let (v, best) = (input[at], input[best_at]);
                    // `v != v` is true only for NaN.
                    #[allow(clippy::eq_op)]
                    let take = (v > best) | (v != v);
                    best_at = std::hint::select_unpredictable(take, at, best_at);
                    best_hw = std::hint::select_unpredictable(take, h * in_w + w, best_hw);
                }
            }
            out[oh * out_w + ow] = input[best_at];
            indices[oh * out_w + ow] = best_hw as i64;
        }
    }
    Ok(())
}

/// The backward pass of max pooling for one plane: `grad_input` (a dense
/// plane, fully written) is zero except where an index points, which
/// receives the sum of the gradients of the outputs it was the maximum of.
/// `grad_output` and `indices` are the pooled plane, element for element.
///
/// An index outside `grad_input`, or lengths that differ, are errors.
pub fn max_pool2d_backward_plane<T: Copy + Default + AddAssign>(
    grad_output: &[T],
    indices: &[i64],
    grad_input: &mut [T],
) -> Result<()> {
    if grad_output.len() != indices.len() {
        return Err(KernelError::ShapeMismatch {
            detail: format!("{} gradients but {} indices", grad_output.len(), indices.len()),
        });
    }
    grad_input.fill(T::default());
    let len = grad_input.len();
    for (&grad, &index) in grad_output.iter().zip(indices) {
        let slot = usize::try_from(index).ok().and_then(|i| grad_input.get_mut(i)).ok_or_else(|| {
            KernelError::ShapeMismatch { detail: format!("index {index} is outside an input plane of {len} elements") }
        })?;
        *slot += grad;
    }
    Ok(())
}

/// An element type average pooling can sum and divide: f32 and f64.
pub trait AvgPoolElement: Copy + Default + Add<Output = Self> + AddAssign + Div<Output = Self> + Send + Sync {
    /// A count as this type.
    fn from_count(count: usize) -> Self;
}

impl AvgPoolElement for f32 {
    fn from_count(count: usize) -> Self {
        count as f32
    }
}

impl AvgPoolElement for f64 {
    fn from_count(count: usize) -> Self {
        count as f64
    }
}

/// Divisor of one window: its full size including padding, or only the input
/// elements it covers.
fn divisor(count_include_pad: bool, rows: (usize, usize, usize), cols: (usize, usize, usize)) -> usize {
    if count_include_pad {
        rows.2 * cols.2
    } else {
        (rows.1 - rows.0) * (cols.1 - cols.0)
    }
}

/// Average pooling of one plane (strided as in [`max_pool2d_plane`]) into a
/// dense `H_out x W_out` output. With `count_include_pad`, padded positions
/// count as zeros in the average (PyTorch's default); without it, a window's
/// divisor is the number of input elements it covers.
pub fn avg_pool2d_plane<T: AvgPoolElement>(
    geometry: &Pool2dGeometry,
    input: &[T],
    offset: usize,
    strides: [usize; 2],
    out: &mut [T],
    count_include_pad: bool,
) -> Result<()> {
    let g = geometry;
    g.check_plane(input.len(), offset, strides)?;
    Pool2dGeometry::check_len("output", g.output_len(), out.len())?;
    let (out_h, out_w) = g.output;
    for oh in 0..out_h {
        let rows = Pool2dGeometry::window(oh, g.input.0, g.kernel.0, g.stride.0, g.padding.0);
        for ow in 0..out_w {
            let cols = Pool2dGeometry::window(ow, g.input.1, g.kernel.1, g.stride.1, g.padding.1);
            let mut sum = T::default();
            for h in rows.0..rows.1 {
                let row = offset + h * strides[0];
                for w in cols.0..cols.1 {
                    sum += input[row + w * strides[1]];
                }
            }
            out[oh * out_w + ow] = sum / T::from_count(divisor(count_include_pad, rows, cols));
        }
    }
    Ok(())
}

/// The backward pass of average pooling for one plane: every input element
/// receives, from each window covering it, that window's gradient divided by
/// the window's divisor. `grad_input` (dense `H x W`) is fully written.
pub fn avg_pool2d_backward_plane<T: AvgPoolElement>(
    geometry: &Pool2dGeometry,
    grad_output: &[T],
    grad_input: &mut [T],
    count_include_pad: bool,
) -> Result<()> {
    let g = geometry;
    Pool2dGeometry::check_len("grad_output", g.output_len(), grad_output.len())?;
    Pool2dGeometry::check_len("grad_input", g.input_len(), grad_input.len())?;
    let (out_h, out_w) = g.output;
    let in_w = g.input.1;
    let plane = &mut grad_input[..g.input_len()];
    plane.fill(T::default());
    for oh in 0..out_h {
        let rows = Pool2dGeometry::window(oh, g.input.0, g.kernel.0, g.stride.0, g.padding.0);
        for ow in 0..out_w {
            let cols = Pool2dGeometry::window(ow, in_w, g.kernel.1, g.stride.1, g.padding.1);
            let share = grad_output[oh * out_w + ow] / T::from_count(divisor(count_include_pad, rows, cols));
            for h in rows.0..rows.1 {
                for p in &mut plane[h * in_w + cols.0..h * in_w + cols.1] {
                    *p += share;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_and_errors() {
        let g = Pool2dGeometry::new((28, 28), (2, 2), (2, 2), (0, 0)).unwrap();
        assert_eq!(g.output(), (14, 14));
        let g = Pool2dGeometry::new((5, 7), (3, 3), (2, 1), (1, 1)).unwrap();
        assert_eq!(g.output(), (3, 7));
        let err = Pool2dGeometry::new((5, 5), (3, 3), (1, 1), (2, 0)).unwrap_err();
        assert_eq!(err.to_string(), "shape mismatch: height: padding 2 must be at most half the kernel size 3 (1)");
        assert!(Pool2dGeometry::new((5, 5), (0, 3), (1, 1), (0, 0)).is_err());
        assert!(Pool2dGeometry::new((5, 5), (3, 3), (1, 0), (0, 0)).is_err());
        assert!(Pool2dGeometry::new((0, 5), (1, 1), (1, 1), (0, 0)).is_err());
        assert!(Pool2dGeometry::new((2, 5), (3, 3), (1, 1), (0, 0)).is_err());
    }

    #[test]
    fn ceil_mode_output_sizes() {
        let ceil = |input, kernel, stride, padding| {
            Pool2dGeometry::with_ceil_mode((input, 1), (kernel, 1), (stride, 1), (padding, 0), true)
                .map(|g| g.output().0)
        };
        // (5 - 2) / 2 rounded up + 1 = 3: a last window [4, 6) clipped to [4, 5).
        assert_eq!(ceil(5, 2, 2, 0).unwrap(), 3);
        assert_eq!(Pool2dGeometry::new((5, 1), (2, 1), (2, 1), (0, 0)).unwrap().output(), (2, 1));
        // (5 + 2 - 2) / 2 rounded up + 1 = 4, but window 3 would start at 6
        // = H + p (only right padding): dropped.
        assert_eq!(ceil(5, 2, 2, 1).unwrap(), 3);
        // (6 + 2 - 3) / 2 rounded up + 1 = 4, window 3 starts at 6 < H + p.
        assert_eq!(ceil(6, 3, 2, 1).unwrap(), 4);
        // (5 + 2 - 3) / 2 = 2 exactly: rounding up changes nothing.
        assert_eq!(ceil(5, 3, 2, 1).unwrap(), 3);
        // A kernel past the input by less than the stride gives one window.
        assert_eq!(ceil(2, 3, 2, 0).unwrap(), 1);
        assert!(ceil(2, 4, 2, 0).is_err());
        assert!(Pool2dGeometry::new((2, 1), (3, 1), (2, 1), (0, 0)).is_err());
    }

    #[test]
    fn ceil_mode_clipped_window_divisors() {
        // One row of 6, kernel 3, stride 2, padding 1, ceil: windows over
        // padded positions [0,3) [2,5) [4,7) and [6,8) (clipped at
        // H + 2p = 8: input element 5 and one padded zero, divisor 2).
        let g = Pool2dGeometry::with_ceil_mode((1, 6), (1, 3), (1, 2), (0, 1), true).unwrap();
        assert_eq!(g.output(), (1, 4));
        let x = [1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut with_pad = [0.0; 4];
        avg_pool2d_plane(&g, &x, 0, [6, 1], &mut with_pad, true).unwrap();
        assert_eq!(with_pad, [1.0, 3.0, 5.0, 3.0]);
        let mut without = [0.0; 4];
        avg_pool2d_plane(&g, &x, 0, [6, 1], &mut without, false).unwrap();
        assert_eq!(without, [1.5, 3.0, 5.0, 6.0]);
        let (mut out, mut idx) = ([0.0; 4], [0i64; 4]);
        max_pool2d_plane(&g, &x, 0, [6, 1], &mut out, &mut idx).unwrap();
        assert_eq!((out, idx), ([2.0, 4.0, 6.0, 6.0], [1, 3, 5, 5]));
        let mut grad = [0.0; 6];
        avg_pool2d_backward_plane(&g, &[6.0; 4], &mut grad, true).unwrap();
        assert_eq!(grad, [2.0, 4.0, 2.0, 4.0, 2.0, 5.0]);
    }

    #[test]
    fn max_pool_values_indices_ties_and_nan() {
        // 3x4 plane, 2x2 kernel, stride 2, padding 1.
        let x = [1.0f32, 5.0, 2.0, 2.0, 3.0, 0.0, 7.0, 7.0, 4.0, 6.0, f32::NAN, 1.0];
        let g = Pool2dGeometry::new((3, 4), (2, 2), (2, 2), (1, 1)).unwrap();
        assert_eq!(g.output(), (2, 3));
        let mut out = [0.0f32; 6];
        let mut idx = [0i64; 6];
        max_pool2d_plane(&g, &x, 0, [4, 1], &mut out, &mut idx).unwrap();
        assert_eq!(&out[..3], &[1.0, 5.0, 2.0]);
        assert_eq!(&idx[..3], &[0, 1, 3]);
        assert_eq!((out[3], idx[3]), (4.0, 8));
        assert!(out[4].is_nan());
        assert_eq!(idx[4], 10);
        assert_eq!((out[5], idx[5]), (7.0, 7));
        let mut grad = [f32::NAN; 12];
        max_pool2d_backward_plane(&[1.0; 6], &idx, &mut grad).unwrap();
        assert_eq!(grad, [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0]);
        let err = max_pool2d_backward_plane(&[1.0; 6], &[0, 0, 0, 0, 0, 12], &mut grad).unwrap_err();
        assert_eq!(err.to_string(), "shape mismatch: index 12 is outside an input plane of 12 elements");
        assert!(max_pool2d_backward_plane(&[1.0; 6], &[0, 0, 0, 0, 0, -1], &mut grad).is_err());
        assert!(max_pool2d_backward_plane(&[1.0; 6], &[0, 0], &mut grad).is_err());
    }

    #[test]
    fn avg_pool_divisors() {
        let x = [1.0f64, 2.0, 3.0, 4.0];
        let g = Pool2dGeometry::new((2, 2), (2, 2), (1, 1), (1, 1)).unwrap();
        assert_eq!(g.output(), (3, 3));
        let mut with_pad = [0.0; 9];
        avg_pool2d_plane(&g, &x, 0, [2, 1], &mut with_pad, true).unwrap();
        assert_eq!(with_pad[0], 0.25);
        assert_eq!(with_pad[4], 2.5);
        let mut without = [0.0; 9];
        avg_pool2d_plane(&g, &x, 0, [2, 1], &mut without, false).unwrap();
        assert_eq!(without[0], 1.0);
        assert_eq!(without[1], 1.5);
        let mut grad = [0.0; 4];
        avg_pool2d_backward_plane(&g, &[1.0; 9], &mut grad, true).unwrap();
        assert_eq!(grad, [1.0; 4]);
        avg_pool2d_backward_plane(&g, &[1.0; 9], &mut grad, false).unwrap();
        let corner = 1.0 + 0.5 + 0.5 + 0.25;
        assert_eq!(grad, [corner; 4]);
    }
}
