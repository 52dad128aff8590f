//! Convolution of channels-last images (`[height, width, channels]`, a
//! pixel's channels side by side) as a matrix product: [`im2row`] unfolds
//! each output pixel's receptive field into one row, tap after tap, each
//! tap a run of the pixel's channels, so that a 2-d convolution is
//! `rows [H_out·W_out, kH·kW·C] · weightᵀ [kH·kW·C, C_out]` — the weight in
//! its channels-last order (`[C_out, kH, kW, C]`), the product a
//! channels-last output. [`row2im`] is its adjoint (the input gradient's
//! fold). They are [`super::im2col`] and [`super::col2im`] for the other
//! memory format: the same entries, transposed, with the row's entries in
//! `(kh, kw, c)` order instead of `(c, kh, kw)`.
//!
//! ```
//! use brasa_kernels::conv::{im2row, Conv2dGeometry};
//!
//! // One 2×2 image of 2 channels, a 2×2 kernel, no padding: one row of
//! // every tap's two channels.
//! let g = Conv2dGeometry::new(2, (2, 2), (2, 2), (1, 1), (0, 0), (1, 1))?;
//! let image = [1, 10, 2, 20, 3, 30, 4, 40]; // [h][w][c]
//! let mut rows = [0; 8];
//! im2row(&g, &image, 0, [4, 2], &mut rows, 8)?;
//! assert_eq!(rows, image);
//! # Ok::<(), brasa_kernels::KernelError>(())
//! ```

use super::Conv2dGeometry;
use crate::error::{KernelError, Result};

/// The elements a row matrix of `geometry` with rows `row_stride` apart
/// spans (0 when it has none), after checking that a row fits.
fn rows_len(op: &str, g: &Conv2dGeometry, row_stride: usize) -> Result<usize> {
    let (k, p) = (g.col_rows(), g.col_cols());
    if row_stride < k {
        return Err(KernelError::ShapeMismatch {
            detail: format!("{op}: rows {row_stride} apart cannot hold {k} taps"),
        });
    }
    if k == 0 || p == 0 {
        return Ok(0);
    }
    (p - 1).checked_mul(row_stride).and_then(|x| x.checked_add(k)).ok_or(KernelError::Overflow { operand: "rows" })
}

/// The input coordinate a tap at `tap` (kernel index × dilation) of output
/// `o` reads, or `None` where it lands in the padding.
fn source(o: usize, stride: usize, tap: usize, padding: usize, input: usize) -> Option<usize> {
    (o * stride + tap).checked_sub(padding).filter(|&i| i < input)
}

/// Unfolds a channels-last image into the row matrix `rows`: row
/// `oh·W_out + ow` (rows `row_stride ≥ kH·kW·channels` apart; its first
/// `kH·kW·channels` entries are written) holds, for every tap `(kh, kw)` in
/// order, the `channels` values of the pixel the tap reads, zeros for a tap
/// in the padding.
///
/// The image's channels are contiguous: element `(h, w, c)` is
/// `image[offset + h·strides[0] + w·strides[1] + c]` (a channels-last
/// tensor's pixel strides, or a group's channels within wider pixels).
pub fn im2row<T: Copy + Default>(
    geometry: &Conv2dGeometry,
    image: &[T],
    offset: usize,
    strides: [usize; 2],
    rows: &mut [T],
    row_stride: usize,
) -> Result<()> {
    let g = geometry;
    let [stride_h, stride_w] = strides;
    g.check_image(image.len(), offset, [1, stride_h, stride_w])?;
    let required = rows_len("im2row", g, row_stride)?;
    if rows.len() < required {
        return Err(KernelError::OutOfBounds { operand: "rows", required, len: rows.len() });
    }
    if required == 0 {
        return Ok(());
    }
    let c = g.channels;
    let (out_w, (in_h, in_w), (kh, kw)) = (g.output.1, g.input, g.kernel);
    let zero = T::default();
    // A kernel row's taps read neighbouring pixels, whose channels then
    // follow one another in the image as in the row: one copy for them all.
    let taps_adjacent = g.dilation.1 == 1 && stride_w == c;
    for (pixel, row) in rows[..required].chunks_mut(row_stride).enumerate() {
        let (oh, ow) = (pixel / out_w, pixel % out_w);
        let row = &mut row[..kh * kw * c];
        for (i, taps) in row.chunks_exact_mut(kw * c).enumerate() {
            let Some(ih) = source(oh, g.stride.0, i * g.dilation.0, g.padding.0, in_h) else {
                taps.fill(zero);
                continue;
            };
            let base = offset + ih * stride_h;
            if taps_adjacent {
                // Taps j in lo..hi land inside the row of the image.
                let first = (ow * g.stride.1) as isize - g.padding.1 as isize;
                let lo = (-first).clamp(0, kw as isize) as usize;
                let hi = (in_w as isize - first).clamp(lo as isize, kw as isize) as usize;
                taps[..lo * c].fill(zero);
                taps[hi * c..].fill(zero);
                if lo < hi {
                    let start = base + (first + lo as isize) as usize * stride_w;
                    taps[lo * c..hi * c].copy_from_slice(&image[start..start + (hi - lo) * c]);
                }
                continue;
            }
            for (j, tap) in taps.chunks_exact_mut(c).enumerate() {
                match source(ow, g.stride.1, j * g.dilation.1, g.padding.1, in_w) {
                    Some(iw) => tap.copy_from_slice(&image[base + iw * stride_w..][..c]),
                    None => tap.fill(zero),
                }
            }
        }
    }
    Ok(())
}

/// Folds a row matrix back onto a dense channels-last image
/// (`[height, width, channels]`), adding every entry to the pixel channel
/// it was taken from (taps in the padding are dropped): the adjoint of
/// [`im2row`]. `image` is accumulated into, so a caller wanting just the
/// fold zeroes it first.
pub fn row2im<T: Copy + std::ops::AddAssign>(
    geometry: &Conv2dGeometry,
    rows: &[T],
    row_stride: usize,
    image: &mut [T],
) -> Result<()> {
    let g = geometry;
    let required = rows_len("row2im", g, row_stride)?;
    if rows.len() < required {
        return Err(KernelError::OutOfBounds { operand: "rows", required, len: rows.len() });
    }
    if image.len() < g.image_len() {
        return Err(KernelError::OutOfBounds { operand: "image", required: g.image_len(), len: image.len() });
    }
    if required == 0 {
        return Ok(());
    }
    let c = g.channels;
    let (out_w, (in_h, in_w), (kh, kw)) = (g.output.1, g.input, g.kernel);
    for (pixel, row) in rows[..required].chunks(row_stride).enumerate() {
        let (oh, ow) = (pixel / out_w, pixel % out_w);
        for (i, taps) in row[..kh * kw * c].chunks_exact(kw * c).enumerate() {
            let Some(ih) = source(oh, g.stride.0, i * g.dilation.0, g.padding.0, in_h) else { continue };
            for (j, tap) in taps.chunks_exact(c).enumerate() {
                if let Some(iw) = source(ow, g.stride.1, j * g.dilation.1, g.padding.1, in_w) {
                    let target = &mut image[(ih * in_w + iw) * c..][..c];
                    for (t, &v) in target.iter_mut().zip(tap) {
                        *t += v;
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{col2im, im2col};
    use super::*;
    use crate::test_data::xorshift;

    fn values(n: usize, seed: u64) -> Vec<f64> {
        xorshift(seed).take(n).map(|s| (s % 1000) as f64 / 100.0 - 5.0).collect()
    }

    /// `[c, h, w]` dense to `[h, w, c]` dense.
    fn to_channels_last(image: &[f64], c: usize, h: usize, w: usize) -> Vec<f64> {
        let mut out = vec![0.0; image.len()];
        for ci in 0..c {
            for y in 0..h {
                for x in 0..w {
                    out[(y * w + x) * c + ci] = image[(ci * h + y) * w + x];
                }
            }
        }
        out
    }

    /// Channels, then (height, width) pairs: input, kernel, stride,
    /// padding, dilation.
    type Case = (usize, (usize, usize), (usize, usize), (usize, usize), (usize, usize), (usize, usize));

    const CASES: [Case; 9] = [
        (2, (5, 6), (3, 3), (1, 1), (1, 1), (1, 1)),
        (1, (7, 7), (3, 2), (2, 3), (1, 0), (1, 2)),
        (3, (4, 9), (2, 4), (3, 1), (0, 2), (2, 1)),
        (1, (1, 1), (3, 3), (1, 1), (1, 1), (1, 1)),
        (2, (6, 5), (1, 1), (2, 2), (0, 0), (1, 1)),
        (4, (3, 3), (1, 1), (1, 1), (0, 0), (1, 1)),
        (2, (6, 7), (5, 5), (1, 1), (2, 2), (1, 1)),
        (5, (5, 8), (3, 3), (2, 2), (3, 3), (1, 1)),
        (3, (4, 5), (1, 3), (1, 1), (0, 1), (1, 1)),
    ];

    #[test]
    fn rows_are_im2col_s_columns_in_tap_major_order_and_row2im_folds_as_col2im() {
        for (seed, &(c, input, kernel, stride, padding, dilation)) in CASES.iter().enumerate() {
            let g = Conv2dGeometry::new(c, input, kernel, stride, padding, dilation).unwrap();
            let ((h, w), (kh, kw), p, k) = (input, kernel, g.col_cols(), g.col_rows());
            let image = values(g.image_len(), seed as u64);
            let mut col = vec![f64::NAN; g.col_len()];
            im2col(&g, &image, 0, [h * w, w, 1], &mut col).unwrap();
            let nhwc = to_channels_last(&image, c, h, w);
            // Rows 3 apart more than a row needs: the spare entries stay.
            let ld = k + 3;
            let mut rows = vec![f64::NAN; (p - 1) * ld + k];
            im2row(&g, &nhwc, 0, [w * c, c], &mut rows, ld).unwrap();
            for pixel in 0..p {
                for ci in 0..c {
                    for i in 0..kh {
                        for j in 0..kw {
                            let want = col[((ci * kh + i) * kw + j) * p + pixel];
                            let got = rows[pixel * ld + (i * kw + j) * c + ci];
                            assert_eq!(got, want, "case {seed}: pixel {pixel}, channel {ci}, tap ({i}, {j})");
                        }
                    }
                }
                if pixel + 1 < p {
                    assert!(rows[pixel * ld + k..(pixel + 1) * ld].iter().all(|v| v.is_nan()), "case {seed}");
                }
            }
            // The fold: row2im of the rows' transpose equals col2im of it.
            let dy = values(g.col_len(), seed as u64 + 50);
            let mut dy_rows = vec![0.0; (p - 1) * ld + k];
            for pixel in 0..p {
                for ci in 0..c {
                    for t in 0..kh * kw {
                        dy_rows[pixel * ld + t * c + ci] = dy[(ci * kh * kw + t) * p + pixel];
                    }
                }
            }
            let mut folded = vec![0.0; g.image_len()];
            col2im(&g, &dy, &mut folded).unwrap();
            let mut folded_rows = vec![0.0; g.image_len()];
            row2im(&g, &dy_rows, ld, &mut folded_rows).unwrap();
            // (Summed in another order: equal up to rounding.)
            for (got, want) in folded_rows.iter().zip(to_channels_last(&folded, c, h, w)) {
                assert!((got - want).abs() < 1e-12 * (1.0 + want.abs()), "case {seed}: {got} vs {want}");
            }
        }
    }

    #[test]
    fn a_group_s_channels_inside_wider_pixels() {
        // Channels 2..5 of an [h, w, 7] image with an offset: the image
        // strides are those of the whole pixel, the run is the group's.
        let (c_all, first) = (7, 2);
        let g = Conv2dGeometry::new(3, (4, 5), (3, 3), (1, 2), (1, 1), (1, 1)).unwrap();
        let (h, w) = (4, 5);
        let wide = values(9 + h * w * c_all, 3);
        let mut group = vec![0.0; 3 * h * w]; // [c, h, w]
        for ci in 0..3 {
            for y in 0..h {
                for x in 0..w {
                    group[(ci * h + y) * w + x] = wide[9 + (y * w + x) * c_all + first + ci];
                }
            }
        }
        let mut want = vec![0.0; g.col_rows() * g.col_cols()];
        im2row(&g, &to_channels_last(&group, 3, h, w), 0, [w * 3, 3], &mut want, g.col_rows()).unwrap();
        let mut got = vec![f64::NAN; want.len()];
        im2row(&g, &wide, 9 + first, [w * c_all, c_all], &mut got, g.col_rows()).unwrap();
        assert_eq!(got, want);
    }

    #[test]
    fn bad_views_are_errors() {
        let g = Conv2dGeometry::new(2, (3, 3), (2, 2), (1, 1), (0, 0), (1, 1)).unwrap();
        let (k, p) = (g.col_rows(), g.col_cols());
        let image = vec![0.0f32; 18];
        let mut rows = vec![0.0f32; k * p];
        assert!(im2row(&g, &image, 0, [6, 2], &mut rows, k).is_ok());
        assert!(matches!(im2row(&g, &image, 1, [6, 2], &mut rows, k), Err(KernelError::OutOfBounds { .. })));
        assert!(matches!(im2row(&g, &image, 0, [6, 2], &mut rows, k - 1), Err(KernelError::ShapeMismatch { .. })));
        let mut short = vec![0.0f32; k * p - 1];
        assert!(im2row(&g, &image, 0, [6, 2], &mut short, k).is_err());
        assert!(row2im(&g, &short, k, &mut [0.0f32; 18]).is_err());
        assert!(row2im(&g, &rows, k, &mut [0.0f32; 17]).is_err());
    }
}
