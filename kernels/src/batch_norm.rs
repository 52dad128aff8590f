//! Batch normalisation's per-channel passes over an `[N, C, S]` tensor
//! (PyTorch's `batch_norm_stats`, `batch_norm_elemt`,
//! `batch_norm_backward_reduce` and `batch_norm_backward_elemt`): channel `c`
//! is the `N` runs of `S` contiguous elements at `(n · C + c) · S`.
//!
//! The elements may be f32, f64, f16 or bf16; each is widened as it is read
//! and the arithmetic runs in its compute type (f32, f64 for f64), so a
//! half-precision input needs no widened copy and its output is rounded
//! once. Sums are pairwise within a run (`crate::reduce::sum`) and added
//! run by run; the variance is two-pass within each run (`Σ(x − mean)²` after the run's
//! mean), the runs merged with Chan et al.'s update. The element-wise
//! passes run compiled for AVX-512 or AVX2 where the CPU has it. An input
//! of spatial size 1 (`[rows, C]`: a 2-d input, or a channels-last
//! activation) has runs of one element: the `*_rows` passes take it row by
//! row, across the channels, with sums over a fixed tree of rows
//! ([`row_tree_sum`]).
//!
//! ```
//! use brasa_kernels::batch_norm::{channel_stats, elemt_run, ChannelLayout};
//! // N = 2, C = 1, S = 2: one channel holding 1, 2, 3, 4.
//! let x = [1.0f32, 2.0, 3.0, 4.0];
//! let layout = ChannelLayout { batch: 2, channels: 1, spatial: 2 };
//! let (mean, var) = channel_stats(&x, layout, 0)?;
//! assert_eq!((mean, var), (2.5, 1.25));
//! let mut y = [0.0f32; 2];
//! elemt_run(&x[..2], mean, 2.0, 1.0, &mut y)?;
//! assert_eq!(y, [-2.0, 0.0]);
//! # Ok::<(), brasa_kernels::KernelError>(())
//! ```

use crate::error::{KernelError, Result};
use crate::reduce::{sum, sum_sq_dev};
use crate::scalar::{Accumulator, Float, ReduceElement, BLOCK};
use crate::widest::{on_widest_if, WideLoop};

/// The shape of an `[N, C, S]` tensor, seen channel by channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelLayout {
    /// `N`.
    pub batch: usize,
    /// `C`.
    pub channels: usize,
    /// `S`: the product of the dims after the channel's.
    pub spatial: usize,
}

impl ChannelLayout {
    /// Elements of the whole tensor.
    pub fn len(&self) -> usize {
        self.batch * self.channels * self.spatial
    }

    /// Whether the tensor is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements per channel: `N · S`.
    pub fn per_channel(&self) -> usize {
        self.batch * self.spatial
    }

    /// The runs of channel `c` in a slice of `len()` elements.
    fn runs<'a, T>(&self, data: &'a [T], c: usize) -> impl Iterator<Item = &'a [T]> + 'a {
        let (channels, spatial) = (self.channels, self.spatial);
        (0..self.batch).map(move |n| &data[(n * channels + c) * spatial..][..spatial])
    }

    fn check(&self, what: &str, len: usize, c: usize) -> Result<()> {
        if len != self.len() {
            return Err(KernelError::ShapeMismatch {
                detail: format!("batch_norm: {what} has {len} elements, the layout {self:?} needs {}", self.len()),
            });
        }
        if c >= self.channels && !self.is_empty() {
            return Err(KernelError::ShapeMismatch { detail: format!("batch_norm: channel {c} of {}", self.channels) });
        }
        Ok(())
    }
}

fn check_run(what: &str, len: usize, run: usize) -> Result<()> {
    if len == run {
        Ok(())
    } else {
        Err(KernelError::ShapeMismatch { detail: format!("batch_norm: {what} has {len} elements, the run has {run}") })
    }
}

/// Channel `c`'s mean and biased variance over its `N · S` elements (0 and
/// 0 for an empty channel).
pub fn channel_stats<T: ReduceElement>(x: &[T], layout: ChannelLayout, c: usize) -> Result<(T::Acc, T::Acc)>
where
    T::Acc: Float,
{
    layout.check("x", x.len(), c)?;
    let count = layout.per_channel();
    if count == 0 {
        return Ok((T::Acc::ZERO, T::Acc::ZERO));
    }
    // Each run two-pass on its own (its second pass reads it from L1), the
    // runs' (count, mean, Σ(x − mean)²) then merged one by one with Chan et
    // al.'s update, which keeps the two-pass accuracy.
    let run_len = T::Acc::from_f64(layout.spatial as f64);
    let (mut seen, mut mean, mut m2) = (T::Acc::ZERO, T::Acc::ZERO, T::Acc::ZERO);
    for run in layout.runs(x, c) {
        let run_mean = sum(run) / run_len;
        let run_m2 = sum_sq_dev(run, run_mean);
        let total = seen + run_len;
        let delta = run_mean - mean;
        mean = mean + delta * (run_len / total);
        m2 = m2 + run_m2 + delta * delta * (seen * run_len / total);
        seen = total;
    }
    let count = T::Acc::from_f64(count as f64);
    Ok((mean, m2 / count))
}

/// One run of the forward: `out = (x − mean) · scale + shift`, rounded once
/// to `T` (`scale = invstd · weight`, `shift = bias`).
pub fn elemt_run<T: ReduceElement>(x: &[T], mean: T::Acc, scale: T::Acc, shift: T::Acc, out: &mut [T]) -> Result<()>
where
    T::Acc: Float,
{
    check_run("out", out.len(), x.len())?;
    on_widest_if(vectorised::<T>(), Elemt { x, mean, scale, shift, out });
    Ok(())
}

/// Channel `c`'s `(Σ dy, Σ dy · (x − mean))`: the bias's gradient and,
/// times `invstd`, the weight's.
pub fn channel_backward_reduce<T: ReduceElement>(
    dy: &[T],
    x: &[T],
    layout: ChannelLayout,
    c: usize,
    mean: T::Acc,
) -> Result<(T::Acc, T::Acc)>
where
    T::Acc: Float,
{
    layout.check("dy", dy.len(), c)?;
    layout.check("x", x.len(), c)?;
    let mut sum_dy = T::Acc::ZERO;
    let mut sum_dy_xmu = T::Acc::ZERO;
    for (g, v) in layout.runs(dy, c).zip(layout.runs(x, c)) {
        sum_dy = sum_dy.add(sum(g));
        sum_dy_xmu = sum_dy_xmu.add(dot_centred(g, v, mean));
    }
    Ok((sum_dy, sum_dy_xmu))
}

/// `Σ g · (x − mean)` over one run: blocks widened on the stack, summed in
/// 16 lanes per block (hiding the add latency), blocks added in order.
fn dot_centred<T: ReduceElement>(g: &[T], x: &[T], mean: T::Acc) -> T::Acc
where
    T::Acc: Float,
{
    const LANES: usize = 16;
    let (mut gb, mut xb) = ([T::Acc::ZERO; BLOCK], [T::Acc::ZERO; BLOCK]);
    let mut total = T::Acc::ZERO;
    for (g, x) in g.chunks(BLOCK).zip(x.chunks(BLOCK)) {
        let (g, x) = (T::widen(g, &mut gb), T::widen(x, &mut xb));
        let mut lanes = [T::Acc::ZERO; LANES];
        let (gc, xc) = (g.chunks_exact(LANES), x.chunks_exact(LANES));
        let (g_rest, x_rest) = (gc.remainder(), xc.remainder());
        for (gs, xs) in gc.zip(xc) {
            for ((lane, &a), &b) in lanes.iter_mut().zip(gs).zip(xs) {
                *lane = lane.add(a * (b - mean));
            }
        }
        let mut block = lanes.iter().fold(T::Acc::ZERO, |acc, &l| acc.add(l));
        for (&a, &b) in g_rest.iter().zip(x_rest) {
            block = block.add(a * (b - mean));
        }
        total = total.add(block);
    }
    total
}

/// One run of the input's gradient in training mode:
/// `dx = scale · (dy − mean_dy − (x − mean) · k)`, with `scale = invstd · w`,
/// `mean_dy = Σdy / M` and `k = invstd² · Σdy(x − mean) / M`.
#[allow(clippy::too_many_arguments)] // the per-channel scalars of one formula
pub fn backward_elemt_run<T: ReduceElement>(
    dy: &[T],
    x: &[T],
    mean: T::Acc,
    scale: T::Acc,
    mean_dy: T::Acc,
    k: T::Acc,
    out: &mut [T],
) -> Result<()>
where
    T::Acc: Float,
{
    check_run("x", x.len(), dy.len())?;
    check_run("out", out.len(), dy.len())?;
    on_widest_if(vectorised::<T>(), BackwardElemt { dy, x, mean, scale, mean_dy, k, out });
    Ok(())
}

/// Whether a pass over `T` runs compiled for AVX-512 or AVX2 when the CPU
/// has it: for the half types (the baseline x86-64 build widens 4 lanes at
/// a time and rounds through its select): one AMD EPYC core's forward and
/// backward passes over a `[64, 32, 32, 32]` bf16 tensor 0.48 -> 0.36 ms
/// and 0.84-0.87 -> 0.52-0.54 ms (`elemt_run`, `backward_elemt_run`). f32
/// passes ran no faster and stay in the baseline build.
///
/// The channel sums stay there too: at AVX-512's width their 16
/// spelled-out lanes are one register, one chain of dependent additions,
/// and ran slower than 4 SSE registers; more lanes cost more in folding
/// them per block than they saved.
fn vectorised<T: ReduceElement>() -> bool {
    size_of::<T>() < size_of::<T::Acc>()
}

struct Elemt<'a, T: ReduceElement> {
    x: &'a [T],
    mean: T::Acc,
    scale: T::Acc,
    shift: T::Acc,
    out: &'a mut [T],
}

impl<T: ReduceElement> WideLoop for Elemt<'_, T>
where
    T::Acc: Float,
{
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let Elemt { x, mean, scale, shift, out } = self;
        // By blocks widened and rounded on the stack: both vectorise (the
        // rounding of a half type does not, element by element).
        let (mut xb, mut ob) = ([T::Acc::ZERO; BLOCK], [T::Acc::ZERO; BLOCK]);
        for (xs, os) in x.chunks(BLOCK).zip(out.chunks_mut(BLOCK)) {
            let xs = T::widen(xs, &mut xb);
            for (o, &v) in ob.iter_mut().zip(xs) {
                *o = (v - mean) * scale + shift;
            }
            T::narrow_block(&ob[..xs.len()], os);
        }
    }
}

struct BackwardElemt<'a, T: ReduceElement> {
    dy: &'a [T],
    x: &'a [T],
    mean: T::Acc,
    scale: T::Acc,
    mean_dy: T::Acc,
    k: T::Acc,
    out: &'a mut [T],
}

impl<T: ReduceElement> WideLoop for BackwardElemt<'_, T>
where
    T::Acc: Float,
{
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let BackwardElemt { dy, x, mean, scale, mean_dy, k, out } = self;
        // By blocks, as `Elemt`.
        let (mut gb, mut xb, mut ob) = ([T::Acc::ZERO; BLOCK], [T::Acc::ZERO; BLOCK], [T::Acc::ZERO; BLOCK]);
        for ((gs, xs), os) in dy.chunks(BLOCK).zip(x.chunks(BLOCK)).zip(out.chunks_mut(BLOCK)) {
            let (gs, xs) = (T::widen(gs, &mut gb), T::widen(xs, &mut xb));
            for ((o, &g), &v) in ob.iter_mut().zip(gs).zip(xs) {
                *o = scale * (g - mean_dy - (v - mean) * k);
            }
            T::narrow_block(&ob[..gs.len()], os);
        }
    }
}

// ----- `[rows, C]` inputs (spatial size 1) -----------------------------------
//
// A 2-d input, or a channels-last activation seen as `[N·H·W, C]`, has runs
// of one element: channel by channel, every element would be its own run
// and its own call. These passes go row by row instead, across the
// channels (`C` = the per-channel slices' length); the sums are added over
// fixed trees of rows (`row_tree_sum`), so results do not depend on the
// number of threads.

/// Rows summed one after another at the leaves of [`row_tree_sum`]: few
/// enough that a leaf's sequential sum keeps f32's accuracy (the leaves are
/// then added pairwise).
pub const ROWS_PER_LEAF: usize = 16;

/// Elements below which [`row_tree_sum`] does not split its work over threads.
const ROWS_PARALLEL_ELEMENTS: usize = 1 << 15;

/// The sum over rows `0..rows` of `leaf(range, sums)` (which adds the rows
/// of `range` into `sums`, `channels` long): leaves of
/// [`ROWS_PER_LEAF`] rows, halves added pairwise, the halves of large
/// ranges on two threads. The tree depends only on `rows`.
pub fn row_tree_sum<A: Float, F>(rows: usize, channels: usize, leaf: &F) -> Result<Vec<A>>
where
    F: Fn(std::ops::Range<usize>, &mut [A]) -> Result<()> + Sync,
{
    fn go<A: Float, F>(lo: usize, hi: usize, channels: usize, leaf: &F) -> Result<Vec<A>>
    where
        F: Fn(std::ops::Range<usize>, &mut [A]) -> Result<()> + Sync,
    {
        if hi - lo <= ROWS_PER_LEAF {
            let mut sums = vec![A::ZERO; channels];
            leaf(lo..hi, &mut sums)?;
            return Ok(sums);
        }
        let mid = lo + (hi - lo) / 2;
        let (a, b) = if (hi - lo) * channels >= ROWS_PARALLEL_ELEMENTS {
            rayon::join(|| go(lo, mid, channels, leaf), || go(mid, hi, channels, leaf))
        } else {
            (go(lo, mid, channels, leaf), go(mid, hi, channels, leaf))
        };
        let (mut a, b) = (a?, b?);
        for (x, y) in a.iter_mut().zip(b) {
            *x = Accumulator::add(*x, y);
        }
        Ok(a)
    }
    go(0, rows, channels, leaf)
}

/// `rows` of `x` (`[rows, C]` with `C = sums.len()`), checked.
fn rows_of<'a, T>(what: &str, x: &'a [T], channels: usize, rows: std::ops::Range<usize>) -> Result<&'a [T]> {
    x.get(rows.start * channels..rows.end * channels).ok_or_else(|| KernelError::ShapeMismatch {
        detail: format!("batch_norm: {what} has {} elements, rows {rows:?} of {channels} need more", x.len()),
    })
}

/// Adds rows `rows` of `x` (`[rows, C]`) into `sums` (`[C]`).
pub fn add_rows<T: ReduceElement>(x: &[T], rows: std::ops::Range<usize>, sums: &mut [T::Acc]) -> Result<()>
where
    T::Acc: Float,
{
    let c = sums.len();
    let mut xb = [T::Acc::ZERO; BLOCK];
    for row in rows_of("x", x, c, rows)?.chunks_exact(c.max(1)) {
        // A row by blocks of channels widened on the stack (the block itself
        // where `T` is its own accumulator): no allocation, no copy of f32.
        for (xs, ss) in row.chunks(BLOCK).zip(sums.chunks_mut(BLOCK)) {
            for (s, &v) in ss.iter_mut().zip(T::widen(xs, &mut xb)) {
                *s = s.add(v);
            }
        }
    }
    Ok(())
}

/// Adds `(x − mean)²` of rows `rows` of `x` into `sums`.
pub fn add_sq_dev_rows<T: ReduceElement>(
    x: &[T],
    rows: std::ops::Range<usize>,
    mean: &[T::Acc],
    sums: &mut [T::Acc],
) -> Result<()>
where
    T::Acc: Float,
{
    let c = sums.len();
    check_run("mean", mean.len(), c)?;
    let mut xb = [T::Acc::ZERO; BLOCK];
    for row in rows_of("x", x, c, rows)?.chunks_exact(c.max(1)) {
        for ((xs, ss), ms) in row.chunks(BLOCK).zip(sums.chunks_mut(BLOCK)).zip(mean.chunks(BLOCK)) {
            for ((s, &v), &m) in ss.iter_mut().zip(T::widen(xs, &mut xb)).zip(ms) {
                let d = v - m;
                *s = s.add(d * d);
            }
        }
    }
    Ok(())
}

/// Adds `dy` and `dy · (x − mean)` of rows `rows` into the first and the
/// second half of `sums` (`[2·C]`).
pub fn add_backward_rows<T: ReduceElement>(
    dy: &[T],
    x: &[T],
    rows: std::ops::Range<usize>,
    mean: &[T::Acc],
    sums: &mut [T::Acc],
) -> Result<()>
where
    T::Acc: Float,
{
    let c = mean.len();
    check_run("sums", sums.len(), 2 * c)?;
    let (sum_dy, sum_dy_xmu) = sums.split_at_mut(c);
    let (mut gb, mut xb) = ([T::Acc::ZERO; BLOCK], [T::Acc::ZERO; BLOCK]);
    let (gs, xs) = (rows_of("dy", dy, c, rows.clone())?, rows_of("x", x, c, rows)?);
    for (g, v) in gs.chunks_exact(c.max(1)).zip(xs.chunks_exact(c.max(1))) {
        let blocks = g.chunks(BLOCK).zip(v.chunks(BLOCK)).zip(mean.chunks(BLOCK));
        for (((gc, vc), ms), (sd, sdx)) in blocks.zip(sum_dy.chunks_mut(BLOCK).zip(sum_dy_xmu.chunks_mut(BLOCK))) {
            let (gw, xw) = (T::widen(gc, &mut gb), T::widen(vc, &mut xb));
            for ((((sd, sdx), &g), &v), &m) in sd.iter_mut().zip(sdx.iter_mut()).zip(gw).zip(xw).zip(ms) {
                *sd = sd.add(g);
                *sdx = sdx.add(g * (v - m));
            }
        }
    }
    Ok(())
}

/// The forward over whole rows (`[rows, C]`, `C = mean.len()`): `out =
/// (x − mean) · scale + shift` per channel, rounded once to `T`.
pub fn elemt_rows<T: ReduceElement>(
    x: &[T],
    mean: &[T::Acc],
    scale: &[T::Acc],
    shift: &[T::Acc],
    out: &mut [T],
) -> Result<()>
where
    T::Acc: Float,
{
    let c = mean.len();
    check_run("scale", scale.len(), c)?;
    check_run("shift", shift.len(), c)?;
    check_run("out", out.len(), x.len())?;
    let (mut xb, mut yb) = ([T::Acc::ZERO; BLOCK], [T::Acc::ZERO; BLOCK]);
    for (row, o) in x.chunks_exact(c.max(1)).zip(out.chunks_exact_mut(c.max(1))) {
        for (at, (xs, os)) in row.chunks(BLOCK).zip(o.chunks_mut(BLOCK)).enumerate() {
            let at = at * BLOCK;
            let (m, sc, sh) = (&mean[at..], &scale[at..], &shift[at..]);
            let xw = T::widen(xs, &mut xb);
            for (ch, (y, &v)) in yb.iter_mut().zip(xw).enumerate() {
                *y = (v - m[ch]) * sc[ch] + sh[ch];
            }
            T::narrow_block(&yb[..xw.len()], os);
        }
    }
    Ok(())
}

/// The input's gradient over whole rows: `dx = scale · (dy − mean_dy − (x
/// − mean) · k)` per channel (see [`backward_elemt_run`]).
#[allow(clippy::too_many_arguments)] // the per-channel vectors of one formula
pub fn backward_elemt_rows<T: ReduceElement>(
    dy: &[T],
    x: &[T],
    mean: &[T::Acc],
    scale: &[T::Acc],
    mean_dy: &[T::Acc],
    k: &[T::Acc],
    out: &mut [T],
) -> Result<()>
where
    T::Acc: Float,
{
    let c = mean.len();
    for (what, len) in [("scale", scale.len()), ("mean_dy", mean_dy.len()), ("k", k.len())] {
        check_run(what, len, c)?;
    }
    check_run("x", x.len(), dy.len())?;
    check_run("out", out.len(), dy.len())?;
    let (mut gb, mut xb, mut yb) = ([T::Acc::ZERO; BLOCK], [T::Acc::ZERO; BLOCK], [T::Acc::ZERO; BLOCK]);
    let rows = dy.chunks_exact(c.max(1)).zip(x.chunks_exact(c.max(1))).zip(out.chunks_exact_mut(c.max(1)));
    for ((g, v), o) in rows {
        let blocks = g.chunks(BLOCK).zip(v.chunks(BLOCK)).zip(o.chunks_mut(BLOCK));
        for (at, ((gs, vs), os)) in blocks.enumerate() {
            let at = at * BLOCK;
            let (gw, xw) = (T::widen(gs, &mut gb), T::widen(vs, &mut xb));
            for (ch, y) in yb[..gw.len()].iter_mut().enumerate() {
                let i = at + ch;
                *y = scale[i] * (gw[ch] - mean_dy[i] - (xw[ch] - mean[i]) * k[i]);
            }
            T::narrow_block(&yb[..gw.len()], os);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_data::xorshift;
    use half::bf16;

    fn data(n: usize, seed: u64) -> Vec<f64> {
        xorshift(seed).take(n).map(|s| (s % 20_001) as f64 / 1000.0 - 3.0).collect()
    }

    /// The row-by-row passes of a `[rows, C]` input against the channel
    /// passes of the same input seen as `[rows, C, 1]`, in f32 and bf16,
    /// with more rows than one leaf and a channel count that is not a
    /// multiple of anything.
    #[test]
    fn row_passes_match_the_channel_passes() -> Result<()> {
        fn check<T: ReduceElement<Acc = f32>>(x: &[T], g: &[T], layout: ChannelLayout, tol: f32) -> Result<()> {
            let (rows, c) = (layout.batch, layout.channels);
            let sums = row_tree_sum(rows, c, &|r, s: &mut [f32]| add_rows(x, r, s))?;
            let mean: Vec<f32> = sums.iter().map(|v| v / rows as f32).collect();
            let sq = row_tree_sum(rows, c, &|r, s: &mut [f32]| add_sq_dev_rows(x, r, &mean, s))?;
            let both = row_tree_sum(rows, 2 * c, &|r, s: &mut [f32]| add_backward_rows(g, x, r, &mean, s))?;
            let (scale, shift, k): (Vec<f32>, Vec<f32>, Vec<f32>) =
                ((0..c).map(|i| 0.5 + i as f32).collect(), (0..c).map(|i| i as f32 - 2.0).collect(), vec![0.01; c]);
            let (mut y, mut dx) = (vec![T::from_acc(0.0); rows * c], vec![T::from_acc(0.0); rows * c]);
            elemt_rows(x, &mean, &scale, &shift, &mut y)?;
            backward_elemt_rows(g, x, &mean, &scale, &shift, &k, &mut dx)?;
            let close = |a: f32, b: f32| (a - b).abs() <= tol * b.abs().max(1.0);
            for ch in 0..c {
                let (m, v) = channel_stats(x, layout, ch)?;
                assert!(close(mean[ch], m) && close(sq[ch] / rows as f32, v), "channel {ch}: stats");
                let (sd, sdx) = channel_backward_reduce(g, x, layout, ch, mean[ch])?;
                assert!(
                    close(both[ch], sd) && close(both[c + ch], sdx),
                    "channel {ch} of {c}: backward sums {} {} vs {sd} {sdx}",
                    both[ch],
                    both[c + ch]
                );
                for r in 0..rows {
                    let at = r * c + ch;
                    let (mut yy, mut dd) = ([T::from_acc(0.0)], [T::from_acc(0.0)]);
                    elemt_run(&x[at..at + 1], mean[ch], scale[ch], shift[ch], &mut yy)?;
                    backward_elemt_run(&g[at..at + 1], &x[at..at + 1], mean[ch], scale[ch], shift[ch], k[ch], &mut dd)?;
                    assert_eq!((y[at].to_acc(), dx[at].to_acc()), (yy[0].to_acc(), dd[0].to_acc()), "({r}, {ch})");
                }
            }
            Ok(())
        }
        // Fewer channels than a block of the row loops, and more (300: a
        // whole block and a partial one). Sums are compared to `tol`; the
        // 300-channel case has channels whose Σ dy·(x − mean) cancels to
        // below 1 from terms near 50, where the two summation orders differ
        // by about 2e-5: 1e-4 there.
        for (rows, c, tol) in [(203, 7, 1e-5), (37, 300, 1e-4)] {
            let layout = ChannelLayout { batch: rows, channels: c, spatial: 1 };
            let x64: Vec<f64> = data(rows * c, 3).iter().map(|v| 50.0 + v / 4.0).collect();
            let g64 = data(rows * c, 4);
            let (x32, g32): (Vec<f32>, Vec<f32>) =
                (x64.iter().map(|&v| v as f32).collect(), g64.iter().map(|&v| v as f32).collect());
            check(&x32, &g32, layout, tol)?;
            let xb: Vec<bf16> = x64.iter().map(|&v| bf16::from_f64(v)).collect();
            let gb: Vec<bf16> = g64.iter().map(|&v| bf16::from_f64(v)).collect();
            check(&xb, &gb, layout, tol)?;
            // A slice shorter than the rows asked for is an error.
            assert!(add_rows(&x32[..10], 0..3, &mut vec![0.0f32; c]).is_err());
        }
        Ok(())
    }

    /// Statistics and both backward formulas against f64 references, in
    /// f64, f32 and bf16 storage, with runs longer and shorter than a block.
    #[test]
    fn channel_passes_match_f64_references() -> Result<()> {
        for layout in [
            ChannelLayout { batch: 3, channels: 4, spatial: 300 },
            ChannelLayout { batch: 5, channels: 2, spatial: 1 },
            ChannelLayout { batch: 1, channels: 3, spatial: 17 },
        ] {
            // A large mean over a small spread: the two-pass variance keeps it.
            let x64: Vec<f64> = data(layout.len(), 1).iter().map(|v| 100.0 + v / 8.0).collect();
            let g64 = data(layout.len(), 2);
            let x32: Vec<f32> = x64.iter().map(|&v| v as f32).collect();
            let g32: Vec<f32> = g64.iter().map(|&v| v as f32).collect();
            let xb: Vec<bf16> = x64.iter().map(|&v| bf16::from_f64(v)).collect();
            let gb: Vec<bf16> = g64.iter().map(|&v| bf16::from_f64(v)).collect();
            for c in 0..layout.channels {
                // References on the values each storage holds.
                let reference = |x: &[f64], g: &[f64]| {
                    let xs: Vec<f64> = layout.runs(x, c).flatten().copied().collect();
                    let gs: Vec<f64> = layout.runs(g, c).flatten().copied().collect();
                    let m = xs.len() as f64;
                    let mean = xs.iter().sum::<f64>() / m;
                    let var = xs.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / m;
                    let sum_dy = gs.iter().sum::<f64>();
                    let dot = gs.iter().zip(&xs).map(|(g, v)| g * (v - mean)).sum::<f64>();
                    (mean, var, sum_dy, dot)
                };
                let (mean, var) = channel_stats(&x64, layout, c)?;
                let (sd, dot) = channel_backward_reduce(&g64, &x64, layout, c, mean)?;
                let want = reference(&x64, &g64);
                assert!((mean - want.0).abs() < 1e-12 && (var - want.1).abs() < 1e-12, "f64 {layout:?}");
                assert!((sd - want.2).abs() < 1e-9 && (dot - want.3).abs() < 1e-9, "f64 {layout:?}");

                let (mean, var) = channel_stats(&x32, layout, c)?;
                let (sd, dot) = channel_backward_reduce(&g32, &x32, layout, c, mean)?;
                let wide = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
                let want = reference(&wide(&x32), &wide(&g32));
                assert!((f64::from(mean) - want.0).abs() < 1e-4, "f32 mean {mean} vs {}", want.0);
                assert!((f64::from(var) - want.1).abs() < 1e-4 * want.1.max(1e-3), "f32 var {var} vs {}", want.1);
                // The centred dot carries the f32 rounding of x and of the
                // mean, each relative to |x|: bound it by ε · Σ|g|·|x|.
                let scale: f64 = layout
                    .runs(&g64, c)
                    .flatten()
                    .zip(layout.runs(&x64, c).flatten())
                    .map(|(g, x)| (g * x).abs())
                    .sum();
                let dot_tol = 4.0 * f64::from(f32::EPSILON) * scale;
                assert!((f64::from(sd) - want.2).abs() < 1e-3, "f32 sum {sd} vs {}", want.2);
                assert!((f64::from(dot) - want.3).abs() < dot_tol, "f32 dot {dot} vs {} (tol {dot_tol})", want.3);

                let (mean, var) = channel_stats(&xb, layout, c)?;
                let (sd, _) = channel_backward_reduce(&gb, &xb, layout, c, mean)?;
                let wide = |v: &[bf16]| v.iter().map(|&x| x.to_f64()).collect::<Vec<_>>();
                let want = reference(&wide(&xb), &wide(&gb));
                assert!((f64::from(mean) - want.0).abs() < 1e-4 && (f64::from(var) - want.1).abs() < 1e-3, "bf16");
                assert!((f64::from(sd) - want.2).abs() < 1e-3, "bf16 sum {sd} vs {}", want.2);
            }
        }
        Ok(())
    }

    #[test]
    fn runs_are_rounded_once() -> Result<()> {
        let x = [bf16::from_f32(1.0), bf16::from_f32(3.0)];
        let mut out = [bf16::ZERO; 2];
        // (x - 2) / 3 + 0.5: 1/6 and 5/6, each rounded once from f32.
        elemt_run(&x, 2.0, 1.0 / 3.0, 0.5, &mut out)?;
        assert_eq!(out, [bf16::from_f32((1.0f32 - 2.0) * (1.0 / 3.0) + 0.5), bf16::from_f32(1.0 / 3.0 + 0.5)]);
        let mut dx = [0.0f64; 2];
        backward_elemt_run(&[1.0, 2.0], &[1.0, 3.0], 2.0, 2.0, 0.5, 0.25, &mut dx)?;
        assert_eq!(dx, [2.0 * (1.0 - 0.5 + 0.25), 2.0 * (2.0 - 0.5 - 0.25)]);
        Ok(())
    }

    /// The dispatched (AVX-512 or AVX2 where the CPU has it) element-wise
    /// passes against the baseline build of the same loop, bit for bit.
    #[test]
    fn vectorised_passes_match_the_baseline_loop() {
        fn both<T: ReduceElement + PartialEq + std::fmt::Debug>(x: &[T], g: &[T])
        where
            T::Acc: Float,
        {
            let (mean, scale, shift) = (T::Acc::from_f64(0.37), T::Acc::from_f64(1.3), T::Acc::from_f64(-0.2));
            let (mut fast, mut base) = (vec![x[0]; x.len()], vec![x[0]; x.len()]);
            crate::widest::on_widest(Elemt { x, mean, scale, shift, out: &mut fast });
            Elemt { x, mean, scale, shift, out: &mut base }.run();
            assert_eq!(fast, base, "elemt");
            let (mean_dy, k) = (T::Acc::from_f64(0.01), T::Acc::from_f64(0.7));
            crate::widest::on_widest(BackwardElemt { dy: g, x, mean, scale, mean_dy, k, out: &mut fast });
            BackwardElemt { dy: g, x, mean, scale, mean_dy, k, out: &mut base }.run();
            assert_eq!(fast, base, "backward_elemt");
        }
        // Longer than a block, with a ragged tail.
        let (x, g) = (data(1000, 3), data(1000, 4));
        both(&x.iter().map(|&v| v as f32).collect::<Vec<_>>(), &g.iter().map(|&v| v as f32).collect::<Vec<_>>());
        both(
            &x.iter().map(|&v| bf16::from_f64(v)).collect::<Vec<_>>(),
            &g.iter().map(|&v| bf16::from_f64(v)).collect::<Vec<_>>(),
        );
        both(&x, &g);
    }

    #[test]
    fn shapes_are_checked() {
        let layout = ChannelLayout { batch: 2, channels: 2, spatial: 2 };
        assert!(channel_stats(&[0.0f32; 7], layout, 0).is_err());
        assert!(channel_stats(&[0.0f32; 8], layout, 2).is_err());
        assert!(elemt_run(&[0.0f32; 2], 0.0, 1.0, 0.0, &mut [0.0; 3]).is_err());
        assert!(backward_elemt_run(&[0.0f32; 2], &[0.0; 1], 0.0, 1.0, 0.0, 0.0, &mut [0.0; 2]).is_err());
        let empty = ChannelLayout { batch: 0, channels: 2, spatial: 2 };
        assert_eq!(channel_stats::<f32>(&[], empty, 0).unwrap(), (0.0, 0.0));
    }
}
