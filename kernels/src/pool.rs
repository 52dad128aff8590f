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
use crate::scalar::FloatElement;
use crate::widest::{on_widest, WideLoop};
use half::{bf16, f16};
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

/// An element max pooling can compare, through a key that orders as the
/// element does (NaN included) and compares cheaply: f16 and bf16 widen to
/// f32 (their own comparisons branch on signs and NaN, which made bf16
/// pooling 3x slower than f32's); every other type is its own key.
pub trait MaxPoolElement: Copy + Send + Sync {
    /// What is compared.
    type Key: Copy + PartialOrd;
    /// The key of this element.
    fn key(self) -> Self::Key;
}

macro_rules! own_key {
    ($($t:ty),*) => {$(
        impl MaxPoolElement for $t {
            type Key = $t;
            #[inline(always)]
            fn key(self) -> $t {
                self
            }
        }
    )*};
}

own_key!(f32, f64, i8, i16, i32, i64, u8, u16, u32, u64, bool);

impl MaxPoolElement for bf16 {
    type Key = f32;
    #[inline(always)]
    fn key(self) -> f32 {
        crate::convert::bf16_to_f32(self)
    }
}

impl MaxPoolElement for f16 {
    type Key = f32;
    #[inline(always)]
    fn key(self) -> f32 {
        self.to_f32()
    }
}

/// Whether `v` (a key) takes the place of the best so far: a larger value,
/// or a NaN (`v != v` only for NaN), so that a NaN wins over any number.
#[inline(always)]
#[allow(clippy::eq_op)]
fn takes_over<K: PartialOrd>(v: K, best: K) -> bool {
    (v > best) | (v != v)
}

/// Max pooling of one plane. Element `(h, w)` of the input is
/// `input[offset + h·strides[0] + w·strides[1]]`; `out` and `indices` (the
/// flat index `h·W + w` of each maximum) are dense `H_out x W_out`.
///
/// Ties keep the first maximum in row-major order; a NaN wins over any
/// number (the last NaN of the window is reported), as in PyTorch.
pub fn max_pool2d_plane<T: MaxPoolElement>(
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
    if g.kernel == (2, 2) && g.stride == (2, 2) && g.padding == (0, 0) && strides[1] == 1 {
        // Whole windows (no ceil-mode clipping): checked by `new`, which
        // rounds 2·out ≤ input down, and by `check_plane` for the rows.
        if 2 * out_h <= g.input.0 && 2 * out_w <= in_w {
            on_widest(MaxPool2x2 { g, input, offset, row_stride: strides[0], out, indices });
            return Ok(());
        }
    }
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
                    let take = takes_over(input[at].key(), input[best_at].key());
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

/// [`max_pool2d_plane`] for the usual 2x2 windows with stride 2 over
/// dense rows (`row_stride` apart), every window inside the plane: the
/// four candidates are read from two row slices, with no index checks in
/// the loop, and compared by key. Also compiled for AVX-512 and AVX2
/// ([`on_widest`]): one 32x32 plane 0.9 -> 0.15 µs in f32 and 1.0-1.5 ->
/// 0.15 µs in bf16 on one AMD EPYC core with AVX-512.
struct MaxPool2x2<'a, T> {
    g: &'a Pool2dGeometry,
    input: &'a [T],
    offset: usize,
    row_stride: usize,
    out: &'a mut [T],
    indices: &'a mut [i64],
}

impl<T: MaxPoolElement> WideLoop for MaxPool2x2<'_, T> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let MaxPool2x2 { g, input, offset, row_stride, out, indices } = self;
        let (out_h, out_w) = g.output;
        let in_w = g.input.1;
        let step = [0, 1, in_w as i64, in_w as i64 + 1];
        for (oh, (out_row, index_row)) in out.chunks_exact_mut(out_w).zip(indices.chunks_exact_mut(out_w)).enumerate() {
            if oh == out_h {
                break;
            }
            let top = offset + 2 * oh * row_stride;
            let (r0, r1) = (&input[top..top + 2 * out_w], &input[top + row_stride..top + row_stride + 2 * out_w]);
            let base = (2 * oh * in_w) as i64;
            let windows = r0.chunks_exact(2).zip(r1.chunks_exact(2));
            for (ow, ((o, index), (p0, p1))) in out_row.iter_mut().zip(index_row.iter_mut()).zip(windows).enumerate() {
                let candidates = [p0[0], p0[1], p1[0], p1[1]];
                let (mut best, mut best_key, mut at) = (candidates[0], candidates[0].key(), 0);
                for (&v, &s) in candidates[1..].iter().zip(&step[1..]) {
                    let key = v.key();
                    let take = takes_over(key, best_key);
                    best = std::hint::select_unpredictable(take, v, best);
                    best_key = std::hint::select_unpredictable(take, key, best_key);
                    at = std::hint::select_unpredictable(take, s, at);
                }
                *o = best;
                *index = base + 2 * ow as i64 + at;
            }
        }
    }
}

/// The backward pass of max pooling for one plane: `grad_input` (a dense
/// plane, fully written) is zero except where an index points, which
/// receives the sum of the gradients of the outputs it was the maximum of.
/// `grad_output` and `indices` are the pooled plane, element for element.
///
/// An index outside `grad_input`, or lengths that differ, are errors.
pub fn max_pool2d_backward_plane<T: FloatElement + Default>(
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
        *slot = T::store(slot.load() + grad.load());
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
    fn bf16_gradients_sum_as_half_adds_them() {
        // Overlapping windows: indices repeat, so gradients add up.
        let grads: Vec<bf16> = (0..64).map(|i| bf16::from_f32((i as f32 - 31.5) * 0.37)).collect();
        let indices: Vec<i64> = (0..64).map(|i| (i * 7 % 13) as i64).collect();
        let mut got = vec![bf16::from_f32(f32::NAN); 16];
        max_pool2d_backward_plane(&grads, &indices, &mut got).unwrap();
        let mut want = [bf16::ZERO; 16];
        for (&g, &i) in grads.iter().zip(&indices) {
            want[i as usize] += g;
        }
        assert_eq!(
            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }

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

    /// Max pooling from the definition, on f64 values: the first maximum in
    /// row-major order, or the last NaN.
    fn naive_max_pool(g: &Pool2dGeometry, plane: &dyn Fn(usize, usize) -> f64) -> (Vec<f64>, Vec<i64>) {
        let (mut out, mut idx) = (Vec::new(), Vec::new());
        for oh in 0..g.output.0 {
            for ow in 0..g.output.1 {
                let (h0, h1, _) = Pool2dGeometry::window(oh, g.input.0, g.kernel.0, g.stride.0, g.padding.0);
                let (w0, w1, _) = Pool2dGeometry::window(ow, g.input.1, g.kernel.1, g.stride.1, g.padding.1);
                let mut best: Option<(f64, usize)> = None;
                for h in h0..h1 {
                    for w in w0..w1 {
                        let v = plane(h, w);
                        if best.is_none_or(|(b, _)| v > b || v.is_nan()) {
                            best = Some((v, h * g.input.1 + w));
                        }
                    }
                }
                let (v, at) = best.unwrap();
                out.push(v);
                idx.push(at as i64);
            }
        }
        (out, idx)
    }

    /// The 2x2 / stride 2 loop agrees with the definition on f32 and bf16
    /// (ties and NaNs included), for planes of odd and even sizes read with
    /// an offset and a row stride wider than the row, and with ceil mode
    /// (whose clipped last windows take the general loop).
    #[test]
    fn max_pool_2x2_matches_the_definition() {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        for (h, w, ceil) in [(2, 2, false), (5, 7, false), (8, 6, false), (5, 7, true), (2, 3, false), (16, 32, false)]
        {
            let (row_stride, offset) = (w + 3, 5);
            let data: Vec<f64> = (0..offset + h * row_stride)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    // Few distinct values (ties), and some NaNs.
                    if seed.is_multiple_of(23) {
                        f64::NAN
                    } else {
                        (seed % 7) as f64 - 3.0
                    }
                })
                .collect();
            let g = Pool2dGeometry::with_ceil_mode((h, w), (2, 2), (2, 2), (0, 0), ceil).unwrap();
            let (want, want_idx) = naive_max_pool(&g, &|r, c| data[offset + r * row_stride + c]);
            let n = g.output_len();
            let x32: Vec<f32> = data.iter().map(|&v| v as f32).collect();
            let (mut out, mut idx) = (vec![0.0f32; n], vec![-1i64; n]);
            max_pool2d_plane(&g, &x32, offset, [row_stride, 1], &mut out, &mut idx).unwrap();
            assert_eq!(idx, want_idx, "f32 {h}x{w} ceil {ceil}");
            assert!(out.iter().zip(&want).all(|(&o, &v)| o as f64 == v || o.is_nan() && v.is_nan()));
            let x16: Vec<bf16> = data.iter().map(|&v| bf16::from_f64(v)).collect();
            let (mut out, mut idx) = (vec![bf16::ZERO; n], vec![-1i64; n]);
            max_pool2d_plane(&g, &x16, offset, [row_stride, 1], &mut out, &mut idx).unwrap();
            assert_eq!(idx, want_idx, "bf16 {h}x{w} ceil {ceil}");
            assert!(out.iter().zip(&want).all(|(&o, &v)| o.to_f64() == v || o.is_nan() && v.is_nan()));
            if !ceil {
                // The baseline loop too, which the dispatch skips on AVX-512 CPUs.
                let (mut base, mut base_idx) = (vec![bf16::ZERO; n], vec![-1i64; n]);
                MaxPool2x2 { g: &g, input: &x16, offset, row_stride, out: &mut base, indices: &mut base_idx }.run();
                assert_eq!(base_idx, want_idx, "baseline bf16 {h}x{w}");
                assert!(base.iter().zip(&out).all(|(b, o)| b.to_bits() == o.to_bits()));
            }
        }
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
