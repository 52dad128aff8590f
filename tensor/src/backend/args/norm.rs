//! Normalisation operands: the gradients' inputs of layer and batch norm.

use crate::tensor::Tensor;

/// The operands of [`crate::backend::DeviceOps::layer_norm_backward`], all
/// contiguous and of one compute dtype (f32 or f64).
pub(crate) struct LayerNormBackward<'a> {
    /// The output's gradient, `[rows, width]`.
    pub grad: &'a Tensor,
    /// The input, `[rows, width]`.
    pub x: &'a Tensor,
    /// Each row's mean, `[rows]`, as the forward returned it.
    pub mean: &'a Tensor,
    /// Each row's `1/√(var + eps)`, `[rows]`.
    pub rstd: &'a Tensor,
    /// The affine weight, `[width]`, if the forward had one.
    pub weight: Option<&'a Tensor>,
}

/// The operands of [`crate::backend::DeviceOps::batch_norm_backward_elemt`]:
/// `dy` and `x` contiguous `[N, C, S]` of one float dtype, the rest
/// contiguous `[C]` in its compute dtype (f64 for f64, f32 otherwise).
pub(crate) struct BatchNormBackwardElemt<'a> {
    /// The output's gradient.
    pub dy: &'a Tensor,
    /// The forward's input.
    pub x: &'a Tensor,
    /// Each channel's mean.
    pub mean: &'a Tensor,
    /// `invstd · weight` per channel.
    pub scale: &'a Tensor,
    /// `Σdy / M` per channel (0 with running statistics).
    pub mean_dy: &'a Tensor,
    /// `invstd² · Σdy(x − mean) / M` per channel (0 with running statistics).
    pub k: &'a Tensor,
}

/// How the CUDA backend splits batch norm's two per-channel reductions
/// (`batch_norm_stats`, `batch_norm_backward_reduce`) of an input seen as
/// `[rows, C, 1]` — a channels-last activation as `[N·H·W, C, 1]`, a 2-d
/// `[N, C]` as `[N, C, 1]`. A block per channel would read such an input with
/// a stride of `C` elements; instead blocks of 32 channels × 8 row lanes
/// each fold one piece of `rows_per_piece` rows, writing a partial result
/// per piece and channel into a temporary `[2, pieces, C]` of the compute
/// dtype, and a second kernel folds the pieces in order (`norm.cu`). The
/// meta device imitating a CUDA device allocates that temporary from this
/// same rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RowPieces {
    /// Rows per piece; the last piece may be shorter, none is empty.
    pub rows_per_piece: usize,
    /// How many pieces cover the rows.
    pub pieces: usize,
}

impl RowPieces {
    /// Elements of the temporary of partial results, `[2, pieces, C]`.
    pub fn partial_len(self, channels: usize) -> usize {
        2 * self.pieces * channels
    }
}

/// The pieces for an input `[n, c, s]` (`None`: `s ≠ 1`, nothing to fold,
/// or no channels; the block-per-channel kernels run).
pub(crate) fn batch_norm_row_pieces([rows, channels, spatial]: [usize; 3]) -> Option<RowPieces> {
    // A few hundred blocks of 256 threads fill a large GPU; each lane of a
    // piece folds at least 8 rows.
    const BLOCKS: usize = 512;
    const MIN_ROWS: usize = 64;
    const MAX_PIECES: usize = 65_535;
    if spatial != 1 || rows == 0 || channels == 0 {
        return None;
    }
    let across = channels.div_ceil(32);
    let wanted = (BLOCKS / across).clamp(1, rows.div_ceil(MIN_ROWS)).min(MAX_PIECES);
    let rows_per_piece = rows.div_ceil(wanted);
    Some(RowPieces { rows_per_piece, pieces: rows.div_ceil(rows_per_piece) })
}

#[cfg(test)]
mod tests {
    use super::{batch_norm_row_pieces, RowPieces};

    #[test]
    fn channels_last_activations_are_folded_in_pieces() {
        // ResNet-18's first stage at batch 128 on 32×32 images: 131,072
        // rows of 64 channels, two tiles of 32 channels, 256 pieces.
        let p = batch_norm_row_pieces([131_072, 64, 1]).unwrap();
        assert_eq!(p, RowPieces { rows_per_piece: 512, pieces: 256 });
        assert_eq!(p.partial_len(64), 2 * 256 * 64);
        // Its last stage: 2,048 rows of 512 channels (16 tiles, 32 pieces).
        assert_eq!(batch_norm_row_pieces([2_048, 512, 1]), Some(RowPieces { rows_per_piece: 64, pieces: 32 }));
        // Few rows: one piece; an uneven split leaves a shorter last piece.
        assert_eq!(batch_norm_row_pieces([10, 3, 1]), Some(RowPieces { rows_per_piece: 10, pieces: 1 }));
        assert_eq!(batch_norm_row_pieces([450, 2, 1]), Some(RowPieces { rows_per_piece: 57, pieces: 8 }));
        // Very many channels still get one piece of every row.
        assert_eq!(batch_norm_row_pieces([100, 1 << 20, 1]), Some(RowPieces { rows_per_piece: 100, pieces: 1 }));
        // Row-major [N, C, S] with S > 1, no rows or no channels: the
        // block-per-channel kernels.
        assert_eq!(batch_norm_row_pieces([128, 64, 1024]), None);
        assert_eq!(batch_norm_row_pieces([0, 64, 1]), None);
        assert_eq!(batch_norm_row_pieces([64, 0, 1]), None);
    }

    /// The fold `norm.cu`'s `batch_norm_stats_rows` and
    /// `batch_norm_stats_merge` run, written out sequentially in f64: each
    /// (piece, lane) pair runs Welford's update over its rows, the lanes of
    /// a piece and then the pieces are joined by Chan's merge. Returns each
    /// channel's mean and biased variance, and how often each row was read.
    fn fold_like_the_kernels(x: &[f64], rows: usize, channels: usize, p: RowPieces) -> (Vec<(f64, f64)>, Vec<usize>) {
        const LANES: usize = 8;
        type Moments = (usize, f64, f64);
        fn merge(a: Moments, b: Moments) -> Moments {
            if b.0 == 0 {
                return a;
            }
            if a.0 == 0 {
                return b;
            }
            let count = a.0 + b.0;
            let delta = b.1 - a.1;
            let share_b = b.0 as f64 / count as f64;
            (count, a.1 + delta * share_b, a.2 + b.2 + delta * delta * (a.0 as f64 * share_b))
        }
        let mut reads = vec![0; rows * channels];
        let mut out = Vec::new();
        for ch in 0..channels {
            let mut pieces = Vec::new();
            for piece in 0..p.pieces {
                let (start, end) = (piece * p.rows_per_piece, ((piece + 1) * p.rows_per_piece).min(rows));
                let mut joined: Moments = (0, 0.0, 0.0);
                for lane in 0..LANES {
                    let mut m: Moments = (0, 0.0, 0.0);
                    for r in (start + lane..end).step_by(LANES) {
                        let v = x[r * channels + ch];
                        reads[r * channels + ch] += 1;
                        m.0 += 1;
                        let delta = v - m.1;
                        m.1 += delta / m.0 as f64;
                        m.2 += delta * (v - m.1);
                    }
                    joined = merge(joined, m);
                }
                assert_eq!(joined.0, end - start, "piece {piece} holds its rows");
                pieces.push(joined);
            }
            // The merge kernel: lane l joins pieces l, l + 8, …; then the lanes.
            let mut total: Moments = (0, 0.0, 0.0);
            for lane in 0..LANES {
                let mut m: Moments = (0, 0.0, 0.0);
                for piece in (lane..p.pieces).step_by(LANES) {
                    m = merge(m, pieces[piece]);
                }
                total = merge(total, m);
            }
            out.push((total.1, total.2 / total.0 as f64));
        }
        (out, reads)
    }

    #[test]
    fn the_kernels_fold_reads_every_row_once_and_gives_the_two_pass_moments() {
        for (rows, channels) in [(450, 2), (84, 40), (1_000, 3), (7, 33), (131_072 / 64, 5)] {
            let x: Vec<f64> = (0..rows * channels).map(|i| 50.0 + ((i * 37) % 101) as f64 / 10.0).collect();
            let p = batch_norm_row_pieces([rows, channels, 1]).unwrap();
            let (moments, reads) = fold_like_the_kernels(&x, rows, channels, p);
            assert!(reads.iter().all(|&r| r == 1), "[{rows}, {channels}]: every element read once");
            for (ch, (mean, var)) in moments.into_iter().enumerate() {
                let column: Vec<f64> = (0..rows).map(|r| x[r * channels + ch]).collect();
                let want_mean = column.iter().sum::<f64>() / rows as f64;
                let want_var = column.iter().map(|v| (v - want_mean).powi(2)).sum::<f64>() / rows as f64;
                assert!((mean - want_mean).abs() <= 1e-12 * want_mean.abs(), "[{rows}, {channels}] mean {ch}");
                assert!((var - want_var).abs() <= 1e-10 * want_var.max(1.0), "[{rows}, {channels}] var {ch}");
            }
        }
    }
}
