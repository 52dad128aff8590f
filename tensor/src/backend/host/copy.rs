//! The host's copies and fills: dtype conversion into a new contiguous
//! tensor, strided copies between views, and fills of a view.

use super::strided::{offsets_vec, Cost, Plan, Transposed};
use crate::device::Device;
use crate::dispatch::dispatch_dtype;
use crate::dtype::{DType, WithDType};
use crate::error::Result;
use crate::layout::Layout;
use crate::storage::lock_storages;
use crate::tensor::Tensor;
use rayon::prelude::*;

/// See [`crate::backend::DeviceOps::cast`]; `device` is any host device
/// (moving between logical host devices is a copy in one address space).
///
/// Large casts run on rayon's threads, in chunks of the output, like the
/// element-wise ops: autocast casts every weight and every weight gradient
/// of a step, and on one thread those casts stayed the same length while
/// the products shrank with the cores (on 16 Xeon cores `wide_mlp`'s bf16
/// step ran at half its f32 speed).
pub(super) fn cast(x: &Tensor, device: Device, dtype: DType) -> Result<Tensor> {
    let out = Tensor::uninit_like(x, dtype, device)?;
    let plan = Plan::new(x.dims(), &[x.layout()]);
    // A transposing copy (to or from channels-last order) goes tile by tile:
    // 1.25–1.75× faster for f32 on a 2-core Xeon. Not a transposing cast,
    // which the per-element conversion, not memory, bounds (tiles were 15 %
    // slower there).
    let transposed = if x.dtype() == dtype { plan.transposed() } else { None };
    if let Some(transposed) = transposed {
        dispatch_dtype!(dtype, T => {
            let src = x.storage().read::<T>("copy")?;
            let starts = offsets_vec("copy", &transposed.batch)?;
            // SAFETY: `copy_transposed` writes every element of every
            // matrix, and the matrices tile the output; it reads none.
            return unsafe {
                out.init_with::<T>("copy", |dst| {
                    copy_transposed(&src, &transposed, &starts, dst);
                    Ok(())
                })
            };
        });
    }
    let stride = plan.inner_stride(0);
    dispatch_dtype!(x.dtype(), S => dispatch_dtype!(dtype, D => {
        let src = x.storage().read::<S>("copy")?;
        // SAFETY: `Plan::run` hands every row of the output to the closure,
        // which writes each of its elements (`convert_strided`), reading none.
        unsafe {
            out.init_with::<D>("copy", |dst| {
                plan.run(dst, Cost::Cheap, |starts, row| {
                    convert_strided(&src, starts[0], stride, row);
                    Ok(())
                })
            })
        }
    }))
}

/// See [`crate::backend::DeviceOps::copy_into`].
pub(super) fn copy_into(name: &'static str, dst: &Tensor, src: &Tensor) -> Result<()> {
    let mut locks = lock_storages(&[src.storage()], &[dst.storage()]);
    dispatch_dtype!(dst.dtype(), T => {
        // The storages differ (the op copies a sharing source first).
        let (to, reads) = locks.write::<T>(dst.storage(), name)?;
        copy_runs::<T>(reads.read::<T>(src.storage(), name)?, src, to, dst);
    });
    Ok(())
}

/// Copy between two layouts of the same shape, a contiguous run at a time
/// where both sides allow: runs as long as the largest length that divides
/// both sides' runs (a transposed-then-reshaped gradient copied into a
/// narrowed slice has runs of a head's width on one side and of the slice's
/// width on the other), element by element only when that length is 1.
/// Large copies run on rayon's threads, a group of runs each, where no two
/// elements of the destination share memory.
fn copy_runs<T: WithDType>(from: &[T], src: &Tensor, to: &mut [T], dst: &Tensor) {
    let dst_runs = dst.layout().contiguous_runs();
    let src_runs = src.layout().contiguous_runs();
    let common = gcd(dst_runs.run_len(), src_runs.run_len());
    if common > 1 {
        let chunks = move |runs: crate::layout::ContiguousRuns| {
            runs.flat_map(move |run| run.step_by(common).map(move |start| start..start + common))
        };
        let numel = dst.layout().numel();
        if numel < Cost::Cheap.parallel_threshold() || rayon::current_num_threads() < 2 || !distinct(dst.layout()) {
            for (d, s) in chunks(dst_runs).zip(chunks(src_runs)) {
                to[d].copy_from_slice(&from[s]);
            }
            return;
        }
        let starts: Vec<(usize, usize)> =
            chunks(dst_runs).zip(chunks(src_runs)).map(|(d, s)| (d.start, s.start)).collect();
        let out = SharedOut::new(to);
        starts.par_chunks((TASK_ELEMENTS / common).max(1)).for_each(|part| {
            for &(d, s) in part {
                // SAFETY: the destination's runs lie in its storage and no
                // two share an element (`distinct`), so each is written by
                // one task only.
                unsafe { out.run(d, common) }.copy_from_slice(&from[s..s + common]);
            }
        });
    } else {
        for (d, s) in dst.layout().offsets().zip(src.layout().offsets()) {
            to[d] = from[s];
        }
    }
}

/// Elements one task of a threaded copy or fill takes on.
const TASK_ELEMENTS: usize = 1 << 16;

/// Whether the layout's elements are all distinct places in memory: its
/// dims (those longer than 1), by increasing stride, each step past
/// everything the smaller ones span. Broadcast (stride 0) views fail.
fn distinct(layout: &Layout) -> bool {
    let mut dims: Vec<(usize, usize)> = layout
        .dims()
        .iter()
        .zip(layout.strides())
        .filter(|(&size, _)| size > 1)
        .map(|(&size, &stride)| (size, stride.unsigned_abs()))
        .collect();
    dims.sort_by_key(|&(_, stride)| stride);
    let mut span = 1usize;
    for (size, stride) in dims {
        if stride < span {
            return false;
        }
        span = match stride.checked_mul(size - 1).and_then(|s| s.checked_add(span)) {
            Some(span) => span,
            None => return false,
        };
    }
    true
}

/// A destination slice handed to several threads, each writing runs no
/// other thread writes.
struct SharedOut<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: tasks write disjoint runs (`run`'s contract); T crosses threads.
unsafe impl<T: Send> Sync for SharedOut<T> {}

impl<T> SharedOut<T> {
    fn new(slice: &mut [T]) -> Self {
        SharedOut { ptr: slice.as_mut_ptr(), len: slice.len() }
    }

    /// Elements `start..start + len` of the slice, checked against its
    /// length.
    ///
    /// # Safety
    /// No other live reference covers these elements.
    #[allow(clippy::mut_from_ref)]
    unsafe fn run(&self, start: usize, len: usize) -> &mut [T] {
        assert!(start.checked_add(len).is_some_and(|end| end <= self.len), "run outside the destination");
        // SAFETY: in bounds (just checked); exclusive by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}

/// The greatest common divisor (`gcd(0, n) = n`). Runs are products of
/// trailing dims, so one length usually divides the other; gcd covers any.
fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// See [`crate::backend::DeviceOps::fill`].
pub(super) fn fill(name: &'static str, dst: &Tensor, value: f64) -> Result<()> {
    dispatch_dtype!(dst.dtype(), T => {
        let value = T::from_f64(value);
        // Broadcast dims repeat their element: walk each one once.
        let layout = dst.layout().without_broadcast_dims();
        let mut data = dst.storage().write::<T>(name)?;
        let threaded = layout.numel() >= Cost::Cheap.parallel_threshold()
            && rayon::current_num_threads() > 1
            && distinct(&layout);
        if threaded {
            // Fresh zeros (a view's gradient, an accumulator) are the
            // common case: one long run, cut into tasks.
            let parts: Vec<(usize, usize)> = layout
                .contiguous_runs()
                .flat_map(|run| run.clone().step_by(TASK_ELEMENTS).map(move |at| (at, TASK_ELEMENTS.min(run.end - at))))
                .collect();
            let out = SharedOut::new(&mut data);
            parts.par_iter().for_each(|&(at, len)| {
                // SAFETY: the runs of a distinct layout share no element.
                unsafe { out.run(at, len) }.fill(value);
            });
        } else {
            for run in layout.contiguous_runs() {
                data[run].fill(value);
            }
        }
    });
    Ok(())
}

/// Copies the elements of `src` seen through `layout` into `dst` in row-major
/// order, converting their type.
pub(super) fn copy_strided<S: WithDType, D: WithDType>(src: &[S], layout: &Layout, dst: &mut [D]) {
    let mut written = 0;
    for run in layout.contiguous_runs() {
        let len = run.len();
        convert_strided(src, run.start, 1, &mut dst[written..written + len]);
        written += len;
    }
}

/// Writes `out[i] = src[start + i * stride]` converted to `D`: a copy when
/// the types are the same, a slice at a time (the vectorised half <-> f32
/// conversions) where the elements are contiguous. Every index must lie in
/// `src`.
pub(super) fn convert_strided<S: WithDType, D: WithDType>(src: &[S], start: usize, stride: isize, out: &mut [D]) {
    if stride == 1 {
        let run = &src[start..start + out.len()];
        if S::DTYPE == D::DTYPE {
            // SAFETY: S and D are the same type when their dtypes are equal.
            let same: &[D] = unsafe { std::slice::from_raw_parts(run.as_ptr() as *const D, run.len()) };
            out.copy_from_slice(same);
        } else if crate::convert_slice(run, out).is_err() {
            // `convert_slice` can only refuse unequal lengths, which these
            // are not. Kept as a fallback.
            for (o, i) in out.iter_mut().zip(run) {
                *o = i.cast::<D>();
            }
        }
    } else {
        let mut at = start as isize;
        for o in out.iter_mut() {
            *o = src[at as usize].cast::<D>();
            at += stride;
        }
    }
}

/// Writes the batch of matrices `t` describes, starting at `starts`, into
/// `out` (row-major, one matrix after another), a square tile at a time: the
/// source is read along its unit stride within a tile whose lines stay in
/// the L1 cache, where a row at a time would fetch a line per element.
/// Matrices, and blocks of rows within one, go to rayon's threads.
fn copy_transposed<T: WithDType>(src: &[T], t: &Transposed, starts: &[usize], out: &mut [T]) {
    const TILE: usize = 32;
    let (rows, cols) = (t.rows, t.cols);
    let tile_rows = |(block, part): (usize, &mut [T]), start: usize| {
        let first = block * TILE;
        for c0 in (0..cols).step_by(TILE) {
            let c1 = (c0 + TILE).min(cols);
            for (i, row) in part.chunks_exact_mut(cols).enumerate() {
                let at = start as isize + (first + i) as isize;
                for (c, o) in (c0..c1).zip(&mut row[c0..c1]) {
                    *o = src[(at + c as isize * t.col_stride) as usize];
                }
            }
        }
    };
    out.par_chunks_mut(rows * cols).zip(starts).for_each(|(matrix, &start)| {
        if matrix.len() < Cost::Cheap.parallel_threshold() {
            matrix.chunks_mut(TILE * cols).enumerate().for_each(|item| tile_rows(item, start));
        } else {
            matrix.par_chunks_mut(TILE * cols).enumerate().for_each(|item| tile_rows(item, start));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::{distinct, gcd};
    use crate::{DType, Tensor};

    /// The values of `t` in row-major order, through the contiguous path.
    fn values(t: &Tensor) -> Vec<f32> {
        t.contiguous().unwrap().to_vec::<f32>().unwrap()
    }

    #[test]
    fn channels_last_copies_go_tile_by_tile_and_keep_every_element() {
        // Row-major [N, C, H, W] into channels-last order (and back), sizes
        // that are and are not multiples of the tile, from an offset view,
        // copied (tiles) or converted (element by element): element
        // (n, c, h, w) holds its own row-major index.
        for [n, c, h, w] in [[2, 37, 5, 9], [1, 64, 8, 8], [3, 8, 1, 33], [2, 100, 7, 7]] {
            let numel = n * c * h * w;
            let wide = Tensor::arange(-5.0, numel as f64, 1.0, DType::F64).unwrap();
            let x =
                wide.narrow(0, 5, numel).unwrap().reshape(&[n as isize, c as isize, h as isize, w as isize]).unwrap();
            for dtype in [DType::F64, DType::F32] {
                let cl = x.to_dtype(dtype).unwrap().permute(&[0, 2, 3, 1]).unwrap().contiguous().unwrap();
                let got = cl.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
                let mut at = 0;
                for ni in 0..n {
                    for hi in 0..h {
                        for wi in 0..w {
                            for ci in 0..c {
                                assert_eq!(
                                    got[at],
                                    (((ni * c + ci) * h + hi) * w + wi) as f64,
                                    "[{n}, {c}, {h}, {w}] {dtype}"
                                );
                                at += 1;
                            }
                        }
                    }
                }
                // The same transposition while converting f64 → f32 (element
                // by element).
                let converted = x.permute(&[0, 2, 3, 1]).unwrap().to_dtype(dtype).unwrap();
                assert_eq!(converted.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(), got);
                // And back: the channels-last buffer, transposed to row-major.
                let back = cl.permute(&[0, 3, 1, 2]).unwrap().contiguous().unwrap();
                let back = back.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
                assert!(back.iter().enumerate().all(|(i, &v)| v == i as f64), "[{n}, {c}, {h}, {w}] {dtype} back");
            }
        }
    }

    #[test]
    fn gcd_of_run_lengths() {
        assert_eq!(gcd(256, 64), 64);
        assert_eq!(gcd(6, 4), 2);
        assert_eq!(gcd(7, 3), 1);
        assert_eq!(gcd(0, 5), 5);
    }

    #[test]
    fn copy_between_runs_of_different_lengths_keeps_every_element_in_place() {
        // Source runs of 6 (a transposed [2, 3, 4, 6] read as [2, 4, 3, 6]),
        // destination runs of 18 (a narrowed [2, 4, 30] viewed as [2, 4, 3, 6]).
        let source = Tensor::arange(0.0, 144.0, 1.0, DType::F32).unwrap().reshape(&[2, 3, 4, 6]).unwrap();
        let src = source.transpose(1, 2).unwrap();
        let big = Tensor::zeros([2, 4, 30], DType::F32).unwrap();
        let dst = big.narrow(2, 6, 18).unwrap().reshape(&[2, 4, 3, 6]).unwrap();
        dst.copy_(&src).unwrap();
        assert_eq!(values(&dst), values(&src));
        // `dst` is a view: the values landed in `big`.
        assert_eq!(values(&big.narrow(2, 6, 18).unwrap()), values(&src.reshape(&[2, 4, 18]).unwrap()));
        let untouched = [big.narrow(2, 0, 6).unwrap(), big.narrow(2, 24, 6).unwrap()];
        for part in untouched {
            assert!(values(&part).iter().all(|&v| v == 0.0));
        }
    }

    #[test]
    fn distinct_layouts_are_those_whose_elements_share_no_memory() {
        let m = Tensor::zeros([64, 48], DType::F32).unwrap();
        assert!(distinct(m.layout()));
        assert!(distinct(m.t().unwrap().layout()));
        assert!(distinct(m.narrow(1, 8, 16).unwrap().layout()));
        let row = Tensor::zeros([1, 48], DType::F32).unwrap();
        assert!(!distinct(row.expand([64, 48]).unwrap().layout()));
        assert!(distinct(row.expand([1, 48]).unwrap().layout()));
    }

    /// Copies and fills large enough for several threads, into views with
    /// gaps (the q/k/v slices of a packed projection's gradient), put every
    /// element in its place and leave the rest alone.
    #[test]
    fn threaded_copies_and_fills_of_views_touch_exactly_their_elements() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        pool.install(|| {
            let (rows, width) = (2048, 256);
            let big = Tensor::full([rows, 3 * width], 7.0, DType::F32).unwrap();
            let source = Tensor::arange(0.0, (rows * width) as f64, 1.0, DType::F32).unwrap();
            let grad = source.reshape(&[rows as isize, width as isize]).unwrap();
            big.narrow(1, width, width).unwrap().copy_(&grad).unwrap();
            // A transposed source into a transposed destination.
            let square = Tensor::zeros([768, 768], DType::F32).unwrap();
            let src = Tensor::arange(0.0, 768.0 * 768.0, 1.0, DType::F32).unwrap().reshape(&[768, 768]).unwrap();
            square.t().unwrap().copy_(&src.t().unwrap()).unwrap();
            assert_eq!(values(&square), values(&src));
            big.narrow(1, 0, width).unwrap().fill_(-1.0).unwrap();
            let all = values(&big);
            for r in 0..rows {
                for c in 0..3 * width {
                    let want = match c / width {
                        0 => -1.0,
                        1 => (r * width + c - width) as f32,
                        _ => 7.0,
                    };
                    assert_eq!(all[r * 3 * width + c], want, "({r}, {c})");
                }
            }
        });
    }
}
