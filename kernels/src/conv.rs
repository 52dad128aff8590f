//! Convolution as a matrix product: [`im2col`] unfolds the receptive fields of
//! an image into the columns of a matrix, so that a 2-d convolution of one
//! image is one gemm (`weight [C_out, C_in·kH·kW] · col [C_in·kH·kW, H_out·W_out]`),
//! and [`col2im`] is its adjoint: it folds the columns back onto the image,
//! summing where receptive fields overlap (the gradient with respect to the
//! input).
//!
//! For channels-last images, [`im2row`] and [`row2im`] do the same with a
//! row per output pixel (the product then writes a channels-last output).
//!
//! Both work on one image (or one group of its channels) at a time; callers
//! split a batch over threads. [`Conv2dGeometry`] checks the sizes once, so
//! the loops need no further checks than the slice indexing Rust does anyway.

use crate::error::{KernelError, Result};
use crate::scratch::try_with_capacity;

mod channels_last;
pub use channels_last::{im2row, row2im};

/// Sizes of one 2-d convolution of a `[channels, height, width]` image,
/// checked when made: the output has at least one row and one column, every
/// size and step is positive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dGeometry {
    channels: usize,
    input: (usize, usize),
    kernel: (usize, usize),
    stride: (usize, usize),
    padding: (usize, usize),
    dilation: (usize, usize),
    output: (usize, usize),
}

/// Output extent of one spatial dimension, or a message saying why there is none.
fn output_extent(
    axis: &str,
    input: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
) -> std::result::Result<usize, String> {
    if kernel == 0 || stride == 0 || dilation == 0 {
        return Err(format!("{axis}: kernel {kernel}, stride {stride} and dilation {dilation} must all be positive"));
    }
    let too_big = || format!("{axis}: sizes overflow usize");
    let effective = (kernel - 1).checked_mul(dilation).and_then(|x| x.checked_add(1)).ok_or_else(too_big)?;
    let padded = padding.checked_mul(2).and_then(|x| x.checked_add(input)).ok_or_else(too_big)?;
    if effective > padded {
        return Err(format!(
            "{axis}: kernel {kernel} with dilation {dilation} spans {effective}, more than the padded input \
             ({input} + 2 x {padding} = {padded})"
        ));
    }
    Ok((padded - effective) / stride + 1)
}

impl Conv2dGeometry {
    /// The geometry of a convolution of a `[channels, input.0, input.1]` image
    /// with a `kernel.0 x kernel.1` kernel; pairs are (height, width).
    ///
    /// Fails when a kernel size, stride or dilation is zero, or when the
    /// dilated kernel is larger than the padded input.
    pub fn new(
        channels: usize,
        input: (usize, usize),
        kernel: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
        dilation: (usize, usize),
    ) -> Result<Self> {
        let extent = |axis, i, k, s, p, d| output_extent(axis, i, k, s, p, d);
        let out_h = extent("height", input.0, kernel.0, stride.0, padding.0, dilation.0)
            .map_err(|detail| KernelError::ShapeMismatch { detail })?;
        let out_w = extent("width", input.1, kernel.1, stride.1, padding.1, dilation.1)
            .map_err(|detail| KernelError::ShapeMismatch { detail })?;
        let geometry = Conv2dGeometry { channels, input, kernel, stride, padding, dilation, output: (out_h, out_w) };
        // The column matrix must be addressable: then every size derived
        // from the geometry (`col_rows`, `col_len`, ...) fits a usize.
        let overflow = KernelError::Overflow { operand: "col" };
        let col_rows = channels.checked_mul(kernel.0).and_then(|x| x.checked_mul(kernel.1)).ok_or(overflow.clone())?;
        let col_cols = out_h.checked_mul(out_w).ok_or(overflow.clone())?;
        col_rows.checked_mul(col_cols).ok_or(overflow)?;
        Ok(geometry)
    }

    /// Input channels.
    pub fn channels(&self) -> usize {
        self.channels
    }
    /// Input (height, width).
    pub fn input(&self) -> (usize, usize) {
        self.input
    }
    /// Kernel (height, width).
    pub fn kernel(&self) -> (usize, usize) {
        self.kernel
    }
    /// Output (height, width).
    pub fn output(&self) -> (usize, usize) {
        self.output
    }

    /// Rows of the column matrix: `channels · kH · kW`.
    pub fn col_rows(&self) -> usize {
        self.channels * self.kernel.0 * self.kernel.1
    }

    /// Columns of the column matrix: `H_out · W_out`.
    pub fn col_cols(&self) -> usize {
        self.output.0 * self.output.1
    }

    /// Elements of the column matrix.
    pub fn col_len(&self) -> usize {
        self.col_rows() * self.col_cols()
    }

    /// Elements of a dense `[channels, height, width]` image.
    pub fn image_len(&self) -> usize {
        self.channels * self.input.0 * self.input.1
    }

    /// Whether the column matrix is the image itself (a 1x1 kernel, stride 1,
    /// no padding): then a convolution is a plain matrix product.
    pub fn is_pointwise(&self) -> bool {
        self.kernel == (1, 1) && self.stride == (1, 1) && self.padding == (0, 0)
    }

    /// The outputs `lo..hi` of one dimension whose tap at `tap` (kernel index
    /// times dilation) lands inside the input: `o * stride + tap - padding`
    /// in `0..input`.
    fn valid_outputs(output: usize, input: usize, stride: usize, padding: usize, tap: usize) -> (usize, usize) {
        let lo = if tap >= padding { 0 } else { (padding - tap).div_ceil(stride) };
        let hi = if input + padding <= tap { 0 } else { (input + padding - tap).div_ceil(stride) };
        let hi = hi.min(output);
        (lo.min(hi), hi)
    }

    /// For every kernel column `j`, the output columns whose tap lands inside
    /// the input. (Up to four times the bytes of an f32 column matrix of one
    /// output column: an error, not an abort, when that is too much.)
    fn column_ranges(&self) -> Result<Vec<(usize, usize)>> {
        let mut ranges = try_with_capacity(self.kernel.1)?;
        ranges.extend((0..self.kernel.1).map(|j| {
            Self::valid_outputs(self.output.1, self.input.1, self.stride.1, self.padding.1, j * self.dilation.1)
        }));
        Ok(ranges)
    }

    /// Checks a strided image view against a slice of `len` elements.
    fn check_image(&self, len: usize, offset: usize, strides: [usize; 3]) -> Result<()> {
        let dims = [self.channels, self.input.0, self.input.1];
        if dims.contains(&0) {
            return Ok(());
        }
        let overflow = KernelError::Overflow { operand: "image" };
        let mut last = offset;
        for (d, s) in dims.into_iter().zip(strides) {
            last = (d - 1).checked_mul(s).and_then(|x| x.checked_add(last)).ok_or(overflow.clone())?;
        }
        if last >= len {
            return Err(KernelError::OutOfBounds { operand: "image", required: last + 1, len });
        }
        Ok(())
    }
}

/// Unfolds an image into the column matrix `col` (row-major
/// `[channels·kH·kW, H_out·W_out]`; its first [`Conv2dGeometry::col_len`]
/// elements are written, taps that land in the padding as zero).
///
/// The image is strided: element `(c, h, w)` is
/// `image[offset + c·strides[0] + h·strides[1] + w·strides[2]]`.
pub fn im2col<T: Copy + Default>(
    geometry: &Conv2dGeometry,
    image: &[T],
    offset: usize,
    strides: [usize; 3],
    col: &mut [T],
) -> Result<()> {
    im2col_with_row_stride(geometry, image, offset, strides, col, geometry.col_cols())
}

/// The elements a column matrix of `geometry` with rows `row_stride` apart
/// spans (0 when it has none).
fn strided_col_len(g: &Conv2dGeometry, row_stride: usize) -> Result<usize> {
    if g.col_len() == 0 {
        return Ok(0);
    }
    (g.col_rows() - 1)
        .checked_mul(row_stride)
        .and_then(|x| x.checked_add(g.col_cols()))
        .ok_or(KernelError::Overflow { operand: "col" })
}

/// [`im2col`] into a column matrix whose rows lie `row_stride` elements
/// apart (`row_stride ≥ H_out·W_out`): the columns of one image inside a
/// wider matrix that holds several images side by side, so that one
/// product covers them all.
pub fn im2col_with_row_stride<T: Copy + Default>(
    geometry: &Conv2dGeometry,
    image: &[T],
    offset: usize,
    strides: [usize; 3],
    col: &mut [T],
    row_stride: usize,
) -> Result<()> {
    let g = geometry;
    g.check_image(image.len(), offset, strides)?;
    let (out_h, out_w) = g.output;
    let cols = g.col_cols();
    if row_stride < cols {
        return Err(KernelError::ShapeMismatch {
            detail: format!("im2col: rows {row_stride} apart cannot hold {cols} columns"),
        });
    }
    let required = strided_col_len(g, row_stride)?;
    if col.len() < required {
        return Err(KernelError::OutOfBounds { operand: "col", required, len: col.len() });
    }
    if g.col_len() == 0 {
        return Ok(());
    }
    let column_ranges = g.column_ranges()?;
    let zero = T::default();
    let [stride_c, stride_h, stride_w] = strides;
    let (step_h, step_w) = g.stride;
    let mut rows = col[..required].chunks_mut(row_stride).map(|row| &mut row[..cols]);
    let in_w = g.input.1;
    let same_width = step_h == 1 && step_w == 1 && stride_w == 1 && stride_h == in_w && out_w == in_w;
    for c in 0..g.channels {
        for i in 0..g.kernel.0 {
            let tap_h = i * g.dilation.0;
            let (oh_lo, oh_hi) = Conv2dGeometry::valid_outputs(out_h, g.input.0, step_h, g.padding.0, tap_h);
            for (j, &(ow_lo, ow_hi)) in column_ranges.iter().enumerate() {
                let Some(row) = rows.next() else { return Ok(()) };
                let tap_w = j * g.dilation.1;
                if same_width && ow_lo < ow_hi && oh_lo < oh_hi {
                    // Output rows as long as the input's, stride 1, dense
                    // rows: the valid rows of this tap are one run of the
                    // image shifted by the tap, copied at once; what the run
                    // brings in from beside the rows (or what lies past the
                    // image's ends) is the padding, zeroed after.
                    let base = offset + c * stride_c;
                    let first =
                        (base + (oh_lo + tap_h) * in_w + tap_w) as isize - (g.padding.0 * in_w + g.padding.1) as isize;
                    let (lo, hi) = (oh_lo * out_w, oh_hi * out_w);
                    let src_lo = first.max(0) as usize;
                    let src_hi = ((first + (hi - lo) as isize) as usize).min(image.len());
                    let dst_lo = lo + (src_lo as isize - first) as usize;
                    row[..lo].fill(zero);
                    row[hi..].fill(zero);
                    row[lo..dst_lo].fill(zero);
                    row[dst_lo..dst_lo + (src_hi - src_lo)].copy_from_slice(&image[src_lo..src_hi]);
                    row[dst_lo + (src_hi - src_lo)..hi].fill(zero);
                    for segment in row[lo..hi].chunks_exact_mut(out_w) {
                        segment[..ow_lo].fill(zero);
                        segment[ow_hi..].fill(zero);
                    }
                    continue;
                }
                for (oh, segment) in row.chunks_exact_mut(out_w).enumerate() {
                    if oh < oh_lo || oh >= oh_hi {
                        segment.fill(zero);
                        continue;
                    }
                    segment[..ow_lo].fill(zero);
                    segment[ow_hi..].fill(zero);
                    if ow_lo == ow_hi {
                        continue;
                    }
                    // In range by `valid_outputs`: no underflow, inside the image.
                    let ih = oh * step_h + tap_h - g.padding.0;
                    let iw = ow_lo * step_w + tap_w - g.padding.1;
                    let base = offset + c * stride_c + ih * stride_h;
                    let valid = &mut segment[ow_lo..ow_hi];
                    if step_w == 1 && stride_w == 1 {
                        valid.copy_from_slice(&image[base + iw..base + iw + valid.len()]);
                    } else {
                        let step = step_w * stride_w;
                        let start = base + iw * stride_w;
                        for (k, out) in valid.iter_mut().enumerate() {
                            *out = image[start + k * step];
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// Folds a column matrix back onto a dense `[channels, height, width]` image,
/// adding every column entry to the pixel it was taken from (entries of taps
/// in the padding are dropped): the adjoint of [`im2col`]. `image` is
/// accumulated into, so a caller wanting just the fold zeroes it first.
pub fn col2im<T: Copy + std::ops::AddAssign>(geometry: &Conv2dGeometry, col: &[T], image: &mut [T]) -> Result<()> {
    col2im_with_row_stride(geometry, col, geometry.col_cols(), image)
}

/// [`col2im`] from a column matrix whose rows lie `row_stride` elements
/// apart (the adjoint of [`im2col_with_row_stride`]).
pub fn col2im_with_row_stride<T: Copy + std::ops::AddAssign>(
    geometry: &Conv2dGeometry,
    col: &[T],
    row_stride: usize,
    image: &mut [T],
) -> Result<()> {
    let g = geometry;
    let cols = g.col_cols();
    if row_stride < cols {
        return Err(KernelError::ShapeMismatch {
            detail: format!("col2im: rows {row_stride} apart cannot hold {cols} columns"),
        });
    }
    let required = strided_col_len(g, row_stride)?;
    if col.len() < required {
        return Err(KernelError::OutOfBounds { operand: "col", required, len: col.len() });
    }
    if image.len() < g.image_len() {
        return Err(KernelError::OutOfBounds { operand: "image", required: g.image_len(), len: image.len() });
    }
    let (out_h, out_w) = g.output;
    let (in_h, in_w) = g.input;
    if g.col_len() == 0 {
        return Ok(());
    }
    let column_ranges = g.column_ranges()?;
    let (step_h, step_w) = g.stride;
    let mut rows = col[..required].chunks(row_stride).map(|row| &row[..cols]);
    for c in 0..g.channels {
        for i in 0..g.kernel.0 {
            let tap_h = i * g.dilation.0;
            let (oh_lo, oh_hi) = Conv2dGeometry::valid_outputs(out_h, in_h, step_h, g.padding.0, tap_h);
            for (j, &(ow_lo, ow_hi)) in column_ranges.iter().enumerate() {
                let Some(row) = rows.next() else { return Ok(()) };
                if ow_lo == ow_hi {
                    continue;
                }
                let tap_w = j * g.dilation.1;
                for oh in oh_lo..oh_hi {
                    let ih = oh * step_h + tap_h - g.padding.0;
                    let iw = ow_lo * step_w + tap_w - g.padding.1;
                    let base = (c * in_h + ih) * in_w;
                    let valid = &row[oh * out_w + ow_lo..oh * out_w + ow_hi];
                    if step_w == 1 {
                        let pixels = &mut image[base + iw..base + iw + valid.len()];
                        for (p, &v) in pixels.iter_mut().zip(valid) {
                            *p += v;
                        }
                    } else {
                        for (k, &v) in valid.iter().enumerate() {
                            image[base + iw + k * step_w] += v;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_data::xorshift;

    /// im2col written from the definition.
    fn naive_im2col(g: &Conv2dGeometry, image: &[f64]) -> Vec<f64> {
        let (c, (h, w), (kh, kw)) = (g.channels, g.input, g.kernel);
        let (oh, ow) = g.output;
        let mut col = vec![0.0; g.col_len()];
        for ci in 0..c {
            for i in 0..kh {
                for j in 0..kw {
                    let r = (ci * kh + i) * kw + j;
                    for y in 0..oh {
                        for x in 0..ow {
                            let ih = (y * g.stride.0 + i * g.dilation.0) as isize - g.padding.0 as isize;
                            let iw = (x * g.stride.1 + j * g.dilation.1) as isize - g.padding.1 as isize;
                            if ih >= 0 && iw >= 0 && (ih as usize) < h && (iw as usize) < w {
                                col[r * oh * ow + y * ow + x] = image[(ci * h + ih as usize) * w + iw as usize];
                            }
                        }
                    }
                }
            }
        }
        col
    }

    fn values(n: usize, seed: u64) -> Vec<f64> {
        xorshift(seed).take(n).map(|s| (s % 1000) as f64 / 100.0 - 5.0).collect()
    }

    #[test]
    fn geometry_sizes_and_errors() {
        let g = Conv2dGeometry::new(3, (28, 28), (3, 3), (1, 1), (1, 1), (1, 1)).unwrap();
        assert_eq!(g.output(), (28, 28));
        assert_eq!((g.col_rows(), g.col_cols()), (27, 784));
        let g = Conv2dGeometry::new(1, (7, 9), (3, 2), (2, 3), (0, 1), (2, 1)).unwrap();
        assert_eq!(g.output(), ((7 - 5) / 2 + 1, (9 + 2 - 2) / 3 + 1));
        let err = Conv2dGeometry::new(1, (4, 4), (5, 5), (1, 1), (0, 0), (1, 1)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "shape mismatch: height: kernel 5 with dilation 1 spans 5, more than the padded input (4 + 2 x 0 = 4)"
        );
        assert!(Conv2dGeometry::new(1, (4, 4), (1, 1), (0, 1), (0, 0), (1, 1)).is_err());
        assert!(Conv2dGeometry::new(1, (4, 4), (1, 0), (1, 1), (0, 0), (1, 1)).is_err());
        assert!(Conv2dGeometry::new(1, (4, 4), (1, 1), (1, 1), (0, 0), (1, 0)).is_err());
        assert!(Conv2dGeometry::new(2, (1, 1), (1, 1), (1, 1), (0, 0), (1, 1)).unwrap().is_pointwise());
    }

    #[test]
    fn im2col_matches_definition_and_col2im_is_its_adjoint() {
        let cases = [
            (2, (5, 6), (3, 3), (1, 1), (1, 1), (1, 1)),
            (1, (7, 7), (3, 2), (2, 3), (1, 0), (1, 2)),
            (3, (4, 9), (2, 4), (3, 1), (0, 2), (2, 1)),
            (1, (1, 1), (3, 3), (1, 1), (1, 1), (1, 1)),
            (2, (6, 5), (1, 1), (2, 2), (0, 0), (1, 1)),
            (1, (3, 3), (1, 1), (1, 1), (0, 0), (1, 1)),
            // Output rows as wide as the input's (one copy per tap): a 5x5
            // kernel, a dilated one, padding in one dimension only.
            (2, (6, 7), (5, 5), (1, 1), (2, 2), (1, 1)),
            (2, (5, 8), (3, 3), (1, 1), (2, 2), (2, 2)),
            (3, (4, 5), (1, 3), (1, 1), (0, 1), (1, 1)),
            (1, (6, 4), (3, 1), (1, 1), (1, 0), (1, 1)),
        ];
        for (seed, &(c, input, kernel, stride, padding, dilation)) in cases.iter().enumerate() {
            let g = Conv2dGeometry::new(c, input, kernel, stride, padding, dilation).unwrap();
            let image = values(g.image_len(), seed as u64);
            let mut col = vec![f64::NAN; g.col_len()];
            let (h, w) = input;
            im2col(&g, &image, 0, [h * w, w, 1], &mut col).unwrap();
            assert_eq!(col, naive_im2col(&g, &image), "case {seed}");
            // <im2col(x), y> == <x, col2im(y)>
            let y = values(g.col_len(), seed as u64 + 100);
            let mut folded = vec![0.0; g.image_len()];
            col2im(&g, &y, &mut folded).unwrap();
            let lhs: f64 = col.iter().zip(&y).map(|(a, b)| a * b).sum();
            let rhs: f64 = image.iter().zip(&folded).map(|(a, b)| a * b).sum();
            assert!((lhs - rhs).abs() < 1e-9 * (1.0 + lhs.abs()), "case {seed}: {lhs} vs {rhs}");
        }
    }

    #[test]
    fn same_width_copies_leave_no_neighbour_in_the_padding() {
        // The image inside a larger buffer of NaNs, channels apart: a run
        // copied at once reads past the rows' ends, which must come out 0.
        let g = Conv2dGeometry::new(3, (4, 6), (3, 3), (1, 1), (1, 1), (1, 1)).unwrap();
        let (channel_stride, offset) = (40, 7);
        let mut buffer = vec![f64::NAN; offset + 3 * channel_stride];
        let dense = values(g.image_len(), 9);
        for c in 0..3 {
            buffer[offset + c * channel_stride..][..24].copy_from_slice(&dense[c * 24..][..24]);
        }
        let mut col = vec![f64::NAN; g.col_len()];
        im2col(&g, &buffer, offset, [channel_stride, 6, 1], &mut col).unwrap();
        assert_eq!(col, naive_im2col(&g, &dense));
    }

    #[test]
    fn columns_of_several_images_side_by_side_equal_each_image_s_own() {
        // Two images' columns in one matrix of rows 2·P + 3 apart (3 spare
        // columns at the end stay untouched), for a plain and a strided,
        // dilated geometry; folding each block back equals col2im of it.
        for (c, input, kernel, stride, padding, dilation) in
            [(2, (5, 6), (3, 3), (1, 1), (1, 1), (1, 1)), (3, (7, 5), (2, 3), (2, 1), (1, 0), (1, 2))]
        {
            let g = Conv2dGeometry::new(c, input, kernel, stride, padding, dilation).unwrap();
            let (rows, p) = (g.col_rows(), g.col_cols());
            let ld = 2 * p + 3;
            let images = [values(g.image_len(), 1), values(g.image_len(), 2)];
            let (h, w) = input;
            let mut wide = vec![f64::NAN; (rows - 1) * ld + 2 * p];
            for (b, image) in images.iter().enumerate() {
                im2col_with_row_stride(&g, image, 0, [h * w, w, 1], &mut wide[b * p..], ld).unwrap();
            }
            for (b, image) in images.iter().enumerate() {
                let own = naive_im2col(&g, image);
                for r in 0..rows {
                    assert_eq!(&wide[r * ld + b * p..r * ld + (b + 1) * p], &own[r * p..(r + 1) * p], "row {r}");
                }
                let (mut from_wide, mut from_own) = (vec![0.0; g.image_len()], vec![0.0; g.image_len()]);
                col2im_with_row_stride(&g, &wide[b * p..], ld, &mut from_wide).unwrap();
                col2im(&g, &own, &mut from_own).unwrap();
                assert_eq!(from_wide, from_own);
            }
            for r in 0..rows - 1 {
                assert!(wide[r * ld + 2 * p..(r + 1) * ld].iter().all(|v| v.is_nan()), "spare columns of row {r}");
            }
            // Rows closer than a row's columns, or a matrix too short: errors.
            assert!(im2col_with_row_stride(&g, &images[0], 0, [h * w, w, 1], &mut wide, p - 1).is_err());
            let mut short = vec![0.0; (rows - 1) * ld + p - 1];
            assert!(im2col_with_row_stride(&g, &images[0], 0, [h * w, w, 1], &mut short, ld).is_err());
            let mut folded = vec![0.0; g.image_len()];
            assert!(col2im_with_row_stride(&g, &short, ld, &mut folded).is_err());
        }
    }

    #[test]
    fn im2col_reads_strided_images() {
        // A [2, 3, 4] image stored as [4, 3, 2] transposed (w outermost) with an offset.
        let g = Conv2dGeometry::new(2, (3, 4), (2, 2), (1, 2), (1, 0), (1, 1)).unwrap();
        let dense = values(24, 7);
        let mut stored = vec![0.0; 30];
        for c in 0..2 {
            for h in 0..3 {
                for w in 0..4 {
                    stored[5 + w * 6 + h * 2 + c] = dense[(c * 3 + h) * 4 + w];
                }
            }
        }
        let mut col = vec![0.0; g.col_len()];
        im2col(&g, &stored, 5, [1, 2, 6], &mut col).unwrap();
        assert_eq!(col, naive_im2col(&g, &dense));
    }

    #[test]
    fn bad_views_are_errors() {
        let g = Conv2dGeometry::new(2, (3, 3), (2, 2), (1, 1), (0, 0), (1, 1)).unwrap();
        let image = vec![0.0f32; 18];
        let mut col = vec![0.0f32; g.col_len()];
        assert!(im2col(&g, &image, 0, [9, 3, 1], &mut col).is_ok());
        assert!(matches!(im2col(&g, &image, 1, [9, 3, 1], &mut col), Err(KernelError::OutOfBounds { .. })));
        let mut short = vec![0.0f32; g.col_len() - 1];
        assert!(im2col(&g, &image, 0, [9, 3, 1], &mut short).is_err());
        let mut small_image = vec![0.0f32; 17];
        assert!(col2im(&g, &col, &mut small_image).is_err());
        assert!(col2im(&g, &short, &mut [0.0f32; 18]).is_err());
    }
}
