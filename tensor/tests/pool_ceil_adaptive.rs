//! `ceil_mode` pooling ([`Pool2dParams`]) and adaptive pooling against an
//! independent f64 reference that follows PyTorch's formulas with signed
//! arithmetic (`pooling_output_shape`, the avg-pool divisor computed before
//! clipping, adaptive windows `floor(i·H/out) .. ceil((i+1)·H/out)`), plus
//! hand-worked cases, non-contiguous inputs and the errors.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_tensor::{DType, Device, Pool2dParams, Tensor, TensorError};
use proptest::prelude::*;

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

fn close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "lengths: got {got:?}, want {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "element {i}: got {g}, want {w}\ngot  {got:?}\nwant {want:?}");
    }
}

/// Distinct values (a permutation of `0..n` scaled), so maxima have no ties.
fn distinct(shape: &[usize], seed: usize) -> Tensor {
    let n: usize = shape.iter().product();
    // 7919 is prime, so i ↦ i·7919 + seed mod n is a permutation unless n divides 7919.
    let v: Vec<f64> = (0..n).map(|i| ((i * 7919 + seed) % n) as f64 * 0.25 - 3.0).collect();
    Tensor::from_vec_on(v, shape.to_vec(), Device::CPU).unwrap()
}

/// One axis of a PyTorch pooling: the output size (None when PyTorch
/// refuses) and, per output, (first input index, end, divisor with padding).
fn torch_axis(input: usize, k: usize, s: usize, p: usize, ceil: bool) -> Option<Vec<(usize, usize, usize)>> {
    let (input, k, s, p) = (input as i64, k as i64, s as i64, p as i64);
    let num = input + 2 * p - k + if ceil { s - 1 } else { 0 };
    let mut out = num.div_euclid(s) + 1;
    if ceil && (out - 1) * s >= input + p {
        out -= 1;
    }
    if out < 1 {
        return None;
    }
    Some(
        (0..out)
            .map(|o| {
                let start = o * s - p;
                let end = (start + k).min(input + p);
                let size = end - start;
                (start.max(0) as usize, end.min(input) as usize, size as usize)
            })
            .collect(),
    )
}

/// Max and avg pooling of `x` ([.., H, W] as f64, row-major) by the
/// reference: (max values, max indices, avg with count_include_pad, avg without).
type Pooled = (Vec<f64>, Vec<i64>, Vec<f64>, Vec<f64>);

fn torch_pool(
    x: &[f64],
    plane: (usize, usize),
    rows: &[(usize, usize, usize)],
    cols: &[(usize, usize, usize)],
) -> Pooled {
    let (h, w) = plane;
    let (mut mx, mut ix, mut inc, mut exc) = (vec![], vec![], vec![], vec![]);
    for q in 0..x.len() / (h * w) {
        let base = q * h * w;
        for &(r0, r1, rs) in rows {
            for &(c0, c1, cs) in cols {
                let (mut best, mut at, mut sum) = (f64::NEG_INFINITY, -1i64, 0.0);
                for r in r0..r1 {
                    for c in c0..c1 {
                        let v = x[base + r * w + c];
                        sum += v;
                        if v > best {
                            best = v;
                            at = (r * w + c) as i64;
                        }
                    }
                }
                mx.push(best);
                ix.push(at);
                inc.push(sum / (rs * cs) as f64);
                exc.push(sum / ((r1 - r0) * (c1 - c0)) as f64);
            }
        }
    }
    (mx, ix, inc, exc)
}

/// Adaptive windows per PyTorch, as (start, end, end - start).
fn torch_adaptive(input: usize, out: usize) -> Vec<(usize, usize, usize)> {
    (0..out)
        .map(|i| {
            let start = (i * input) / out;
            let end = ((i + 1) * input).div_ceil(out);
            (start, end, end - start)
        })
        .collect()
}

/// The input gradient of averaging windows, by hand: each element gets
/// grad / divisor from every window holding it.
fn avg_adjoint(
    grad: &[f64],
    plane: (usize, usize),
    rows: &[(usize, usize, usize)],
    cols: &[(usize, usize, usize)],
    include: bool,
) -> Vec<f64> {
    let (h, w) = plane;
    let per_plane = rows.len() * cols.len();
    let planes = grad.len() / per_plane;
    let mut out = vec![0.0; planes * h * w];
    for q in 0..planes {
        for (i, &(r0, r1, rs)) in rows.iter().enumerate() {
            for (j, &(c0, c1, cs)) in cols.iter().enumerate() {
                let divisor = if include { rs * cs } else { (r1 - r0) * (c1 - c0) };
                let share = grad[q * per_plane + i * cols.len() + j] / divisor as f64;
                for r in r0..r1 {
                    for c in c0..c1 {
                        out[q * h * w + r * w + c] += share;
                    }
                }
            }
        }
    }
    out
}

#[test]
fn ceil_mode_adds_a_clipped_window_without_padding() {
    // 5x5 of 0..25, kernel 2, stride 2: floor mode gives 2x2, ceil mode 3x3
    // whose last row and column of windows hold one input row / column.
    let x = Tensor::from_vec((0..25).map(|v| v as f64).collect(), [1, 1, 5, 5]).unwrap();
    let p = Pool2dParams::new((2, 2)).with_ceil_mode(true);
    let (values, indices) = x.max_pool2d_with(p).unwrap();
    assert_eq!(values.dims(), &[1, 1, 3, 3]);
    assert_eq!(f64s(&values), [6.0, 8.0, 9.0, 16.0, 18.0, 19.0, 21.0, 23.0, 24.0]);
    assert_eq!(indices.to_vec::<i64>().unwrap(), [6, 8, 9, 16, 18, 19, 21, 23, 24]);
    // No padding: the clipped windows divide by what they hold either way
    // (PyTorch clips the divisor at H + padding).
    let expected = [3.0, 5.0, 6.5, 13.0, 15.0, 16.5, 20.5, 22.5, 24.0];
    for include in [true, false] {
        close(&f64s(&x.avg_pool2d_with(p, include).unwrap()), &expected, 1e-12);
    }
    // ceil_mode off through the same entry point is the positional function.
    let floor = Pool2dParams::new((2, 2));
    assert_eq!(
        f64s(&x.avg_pool2d_with(floor, true).unwrap()),
        f64s(&x.avg_pool2d((2, 2), (2, 2), (0, 0), true).unwrap())
    );
    assert_eq!(x.max_pool2d_with(floor).unwrap().0.dims(), &[1, 1, 2, 2]);
}

#[test]
fn ceil_mode_with_padding_and_count_include_pad() {
    // One row of 1..=6, kernel 3, stride 2, padding 1, ceil: windows over
    // input columns [-1, 2) [1, 4) [3, 6) [5, 7): the last one ends at
    // W + p = 7, so it holds x[5] and one padded zero (divisor 2 with
    // count_include_pad, 1 without).
    let x = Tensor::from_vec((1..=6).map(|v| v as f64).collect(), [1, 1, 6]).unwrap();
    let p = Pool2dParams::new((1, 3)).with_stride((1, 2)).with_padding((0, 1)).with_ceil_mode(true);
    close(&f64s(&x.avg_pool2d_with(p, true).unwrap()), &[1.0, 3.0, 5.0, 3.0], 1e-12);
    close(&f64s(&x.avg_pool2d_with(p, false).unwrap()), &[1.5, 3.0, 5.0, 6.0], 1e-12);
    let (values, indices) = x.max_pool2d_with(p).unwrap();
    assert_eq!(f64s(&values), [2.0, 4.0, 6.0, 6.0]);
    assert_eq!(indices.to_vec::<i64>().unwrap(), [1, 3, 5, 5]);
    // Backward: x[5] gets 6/3 from window 2 and 6/2 from window 3.
    let g = Tensor::full([1, 1, 4], 6.0, DType::F64).unwrap();
    close(&f64s(&g.avg_pool2d_backward_with([1, 1, 6], p, true).unwrap()), &[2.0, 4.0, 2.0, 4.0, 2.0, 5.0], 1e-12);
    close(&f64s(&g.avg_pool2d_backward_with([1, 1, 6], p, false).unwrap()), &[3.0, 5.0, 2.0, 4.0, 2.0, 8.0], 1e-12);
    // A window that would start in the right padding is dropped: 5 wide,
    // kernel 2, stride 2, padding 1 gives 3 windows, not 4.
    let p = Pool2dParams::new((1, 2)).with_padding((0, 1)).with_ceil_mode(true);
    let x = Tensor::from_vec((1..=5).map(|v| v as f64).collect(), [1, 1, 5]).unwrap();
    close(&f64s(&x.avg_pool2d_with(p, true).unwrap()), &[0.5, 2.5, 4.5], 1e-12);
}

#[test]
fn ceil_mode_allows_a_kernel_past_the_input_by_less_than_the_stride() {
    let x = Tensor::from_vec(vec![1.0f64, 4.0, 2.0, 3.0], [1, 2, 2]).unwrap();
    let p = Pool2dParams::new((3, 3)).with_stride((2, 2)).with_ceil_mode(true);
    let (values, indices) = x.max_pool2d_with(p).unwrap();
    assert_eq!((f64s(&values), indices.to_vec::<i64>().unwrap()), (vec![4.0], vec![1]));
    // PyTorch's divisor: min(0 + 3, H + 0) - 0 = 2 per axis, so 4.
    close(&f64s(&x.avg_pool2d_with(p, true).unwrap()), &[2.5], 1e-12);
    let err = x.max_pool2d_with(p.with_ceil_mode(false)).unwrap_err();
    assert!(matches!(err, TensorError::Invalid { op: "max_pool2d", .. }), "{err:?}");
    // Which rule refused it is only in the words.
    assert!(err.to_string().contains("kernel 3 is larger than the padded input"), "{err}");
    let err = x.avg_pool2d_with(Pool2dParams::new((4, 4)).with_stride((2, 2)).with_ceil_mode(true), true);
    let err = err.unwrap_err().to_string();
    assert_eq!(
        err,
        "avg_pool2d: input [1, 2, 2] with kernel (4, 4), stride (2, 2), padding (0, 0), ceil_mode: height: kernel 4 \
         is larger than the padded input (2 + 2 x 0 = 2)"
    );
}

/// (input shape [C, H, W], kernel, stride, padding, ceil_mode).
type Case = (Vec<usize>, (usize, usize), (usize, usize), (usize, usize), bool);

fn ceil_case() -> impl Strategy<Value = Case> {
    (1usize..3, 1usize..9, 1usize..9, 1usize..5, 1usize..5, 1usize..4, 1usize..4, any::<bool>())
        .prop_flat_map(|(c, h, w, kh, kw, sh, sw, ceil)| {
            (Just((c, h, w, kh, kw, sh, sw, ceil)), 0..=kh / 2, 0..=kw / 2)
        })
        .prop_map(|((c, h, w, kh, kw, sh, sw, ceil), ph, pw)| (vec![c, h, w], (kh, kw), (sh, sw), (ph, pw), ceil))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Every geometry, with and without ceil_mode: sizes, values, indices,
    /// both divisors and the average's gradient against the reference; on
    /// a transposed (non-contiguous) input.
    #[test]
    fn pooling_with_params_matches_pytorch((shape, k, s, p, ceil) in ceil_case()) {
        let (c, h, w) = (shape[0], shape[1], shape[2]);
        // Laid out as [C, W, H] and transposed: a non-contiguous view.
        let x = distinct(&[c, w, h], 3).transpose(1, 2).unwrap();
        prop_assert!(h == 1 || w == 1 || !x.is_contiguous());
        let xv = f64s(&x);
        let params = Pool2dParams { kernel: k, stride: s, padding: p, ceil_mode: ceil };
        let (rows, cols) = (torch_axis(h, k.0, s.0, p.0, ceil), torch_axis(w, k.1, s.1, p.1, ceil));
        let (Some(rows), Some(cols)) = (rows, cols) else {
            prop_assert!(x.max_pool2d_with(params).is_err());
            prop_assert!(x.avg_pool2d_with(params, true).is_err());
            return Ok(());
        };
        let (mx, ix, inc, exc) = torch_pool(&xv, (h, w), &rows, &cols);
        let (values, indices) = x.max_pool2d_with(params).unwrap();
        prop_assert_eq!(values.dims(), &[c, rows.len(), cols.len()]);
        prop_assert_eq!(f64s(&values), mx);
        prop_assert_eq!(indices.to_vec::<i64>().unwrap(), ix);
        close(&f64s(&x.avg_pool2d_with(params, true).unwrap()), &inc, 1e-12);
        close(&f64s(&x.avg_pool2d_with(params, false).unwrap()), &exc, 1e-12);
        let g = distinct(&[c, rows.len(), cols.len()], 5);
        for include in [true, false] {
            let got = f64s(&g.avg_pool2d_backward_with(shape.clone(), params, include).unwrap());
            close(&got, &avg_adjoint(&f64s(&g), (h, w), &rows, &cols, include), 1e-12);
        }
        // f32 agrees with f64 (same windows on the host's f32 path).
        let x32 = x.to_dtype(DType::F32).unwrap();
        close(&f64s(&x32.avg_pool2d_with(params, false).unwrap()), &exc, 1e-6);
    }
}

#[test]
fn adaptive_avg_unequal_and_overlapping_windows() {
    // 1x5 → 1x3: windows [0, 2) [1, 4) [3, 5).
    let x = Tensor::from_vec((1..=5).map(|v| v as f64).collect(), [1, 1, 5]).unwrap();
    close(&f64s(&x.adaptive_avg_pool2d((1, 3)).unwrap()), &[1.5, 3.0, 4.5], 1e-12);
    // 3 → 5 (larger than the input): windows [0,1) [0,2) [1,2) [1,3) [2,3).
    let x = Tensor::from_vec(vec![1.0f64, 2.0, 4.0], [1, 1, 3]).unwrap();
    close(&f64s(&x.adaptive_avg_pool2d((1, 5)).unwrap()), &[1.0, 1.5, 2.0, 3.0, 4.0], 1e-12);
    // Its gradient: element 1 sits in windows 1 (size 2), 2 (1), 3 (2).
    let g = Tensor::ones([1, 1, 5], DType::F64).unwrap();
    close(&f64s(&g.adaptive_avg_pool2d_backward([1, 1, 3]).unwrap()), &[1.5, 2.0, 1.5], 1e-12);
}

#[test]
fn adaptive_pooling_matches_the_reference() {
    for (h, w, oh, ow) in [(7, 5, 3, 3), (5, 7, 3, 2), (3, 4, 5, 6), (6, 6, 1, 1), (4, 6, 4, 6), (7, 3, 2, 5)] {
        for batched in [false, true] {
            let shape: Vec<usize> = if batched { vec![2, 3, h, w] } else { vec![3, h, w] };
            // A non-contiguous input: the last two dims transposed.
            let mut stored = shape.clone();
            let r = stored.len();
            stored.swap(r - 1, r - 2);
            let x = distinct(&stored, 11).transpose(-1, -2).unwrap();
            assert!(!x.is_contiguous());
            let xv = f64s(&x);
            let (rows, cols) = (torch_adaptive(h, oh), torch_adaptive(w, ow));
            let (mx, ix, avg, _) = torch_pool(&xv, (h, w), &rows, &cols);
            let mut out_shape = shape.clone();
            out_shape[r - 2] = oh;
            out_shape[r - 1] = ow;
            let got = x.adaptive_avg_pool2d((oh, ow)).unwrap();
            assert_eq!(got.dims(), out_shape.as_slice());
            close(&f64s(&got), &avg, 1e-12);
            let (values, indices) = x.adaptive_max_pool2d((oh, ow)).unwrap();
            assert_eq!(values.dims(), out_shape.as_slice());
            assert_eq!(indices.dims(), out_shape.as_slice());
            assert_eq!(f64s(&values), mx, "{h}x{w} -> {oh}x{ow}");
            assert_eq!(indices.to_vec::<i64>().unwrap(), ix, "{h}x{w} -> {oh}x{ow}");
            // Gradients: the average's adjoint, and max's routing by index.
            let g = distinct(&out_shape, 2);
            let gx = f64s(&g.adaptive_avg_pool2d_backward(shape.clone()).unwrap());
            close(&gx, &avg_adjoint(&f64s(&g), (h, w), &rows, &cols, true), 1e-12);
            // f32 follows the f64 values.
            let x32 = x.to_dtype(DType::F32).unwrap();
            close(&f64s(&x32.adaptive_avg_pool2d((oh, ow)).unwrap()), &avg, 1e-6);
            assert_eq!(x32.adaptive_max_pool2d((oh, ow)).unwrap().1.to_vec::<i64>().unwrap(), ix);
        }
    }
}

#[test]
fn adaptive_max_ties_take_the_first_and_integers_work() {
    // 2x4 all equal, → 1x2: windows cols [0, 2) and [2, 4): the first cell wins.
    let x = Tensor::ones([1, 2, 4], DType::F32).unwrap();
    assert_eq!(x.adaptive_max_pool2d((1, 2)).unwrap().1.to_vec::<i64>().unwrap(), [0, 2]);
    // 3 → 2 with a tie across rows: windows rows [0, 2) and [1, 3).
    let x = Tensor::from_vec(vec![1i64, 5, 5], [1, 3, 1]).unwrap();
    let (values, indices) = x.adaptive_max_pool2d((2, 1)).unwrap();
    assert_eq!(values.dtype(), DType::I64);
    assert_eq!(values.to_vec::<i64>().unwrap(), [5, 5]);
    assert_eq!(indices.to_vec::<i64>().unwrap(), [1, 1]);
    // f16: values exact, h·W + w indices.
    let x = Tensor::from_vec(vec![0.5f64, -1.0, 2.0, 0.25, 3.0, 1.0], [1, 2, 3]).unwrap().to_dtype(DType::F16).unwrap();
    let (values, indices) = x.adaptive_max_pool2d((1, 2)).unwrap();
    assert_eq!(values.dtype(), DType::F16);
    assert_eq!(f64s(&values), [3.0, 3.0]);
    assert_eq!(indices.to_vec::<i64>().unwrap(), [4, 4]);
}

#[test]
fn adaptive_pooling_errors_name_the_problem() {
    let x = Tensor::zeros([2, 5, 5], DType::F32).unwrap();
    assert_eq!(
        x.adaptive_avg_pool2d((0, 3)).unwrap_err().to_string(),
        "adaptive_avg_pool2d: output_size (0, 3) must be positive in both dims (input [2, 5, 5])"
    );
    let err = x.adaptive_max_pool2d((3, 0)).unwrap_err().to_string();
    assert!(err.starts_with("adaptive_max_pool2d: output_size (3, 0) must be positive"), "{err}");
    // A 2-d input: 3-d or 4-d is needed (a `Shape` error naming the shape).
    let flat = Tensor::zeros([5, 5], DType::F32).unwrap();
    for (error, name) in [
        (flat.adaptive_avg_pool2d((2, 2)).unwrap_err(), "adaptive_avg_pool2d"),
        (flat.adaptive_max_pool2d((2, 2)).map(|r| r.0).unwrap_err(), "adaptive_max_pool2d"),
    ] {
        assert!(matches!(&error, TensorError::Shape { op, .. } if *op == name), "{error:?}");
        assert!(error.to_string().contains("got shape [5, 5]"), "{error}");
    }
    let empty = Tensor::zeros([1, 0, 5], DType::F32).unwrap();
    let error = empty.adaptive_avg_pool2d((2, 2)).unwrap_err();
    assert!(matches!(error, TensorError::Shape { op: "adaptive_avg_pool2d", .. }), "{error:?}");
    assert!(error.to_string().contains("empty plane"), "{error}");
    let ints = Tensor::zeros([1, 4, 4], DType::I64).unwrap();
    let error = ints.adaptive_avg_pool2d((2, 2)).unwrap_err();
    assert!(
        matches!(error, TensorError::UnsupportedDType { op: "adaptive_avg_pool2d", dtype: DType::I64, .. }),
        "{error:?}"
    );
    // bool is refused by name in an `Invalid` (not an `UnsupportedDType`).
    let bools = Tensor::zeros([1, 4, 4], DType::Bool).unwrap();
    let error = bools.adaptive_max_pool2d((2, 2)).map(|r| r.0).unwrap_err();
    assert!(matches!(error, TensorError::Invalid { op: "adaptive_max_pool2d", .. }), "{error:?}");
    assert!(error.to_string().contains("got bool"), "{error}");
    let g = Tensor::zeros([2, 3, 3], DType::F32).unwrap();
    assert_eq!(
        g.adaptive_avg_pool2d_backward([3, 5, 5]).unwrap_err().to_string(),
        "adaptive_avg_pool2d_backward: grad_output has shape [2, 3, 3], which does not pool an input of shape [3, \
         5, 5] (leading dims differ)"
    );
}

/// The same results on `cuda:0` as on the host (checked above against the
/// reference), for ceil-mode and adaptive pooling in f32, f64 and f16, forward
/// and backward; skipped with one line without a GPU.
#[test]
fn cuda_matches_host() {
    if brasa_tensor::cuda_device_count() == 0 {
        eprintln!(
            "skipped on CUDA: no CUDA device{}",
            if cfg!(feature = "cuda") { "" } else { " (built without the `cuda` feature)" }
        );
        return;
    }
    let gpu = Device::cuda(0);
    let on = |t: &Tensor| t.to(gpu).unwrap();
    let host = |t: &Tensor| f64s(&t.to(Device::CPU).unwrap());
    let params = [
        Pool2dParams::new((2, 2)).with_ceil_mode(true),
        Pool2dParams::new((3, 3)).with_stride((2, 2)).with_padding((1, 1)).with_ceil_mode(true),
        Pool2dParams::new((3, 2)).with_stride((2, 3)).with_padding((1, 1)).with_ceil_mode(true),
        Pool2dParams::new((4, 3)).with_stride((4, 3)).with_padding((0, 1)).with_ceil_mode(true),
    ];
    for dtype in [DType::F32, DType::F64, DType::F16] {
        let tol = if dtype == DType::F16 { 2e-3 } else { 1e-5 };
        // Non-contiguous: stored [N, C, W, H].
        let x = distinct(&[2, 3, 7, 6], 1).to_dtype(dtype).unwrap().transpose(-1, -2).unwrap();
        for p in params {
            let (v, i) = x.max_pool2d_with(p).unwrap();
            let (gv, gi) = on(&x).max_pool2d_with(p).unwrap();
            assert_eq!(host(&gv), f64s(&v), "{p:?} {dtype:?}");
            assert_eq!(gi.to(Device::CPU).unwrap().to_vec::<i64>().unwrap(), i.to_vec::<i64>().unwrap());
            let g = distinct(v.dims(), 2).to_dtype(dtype).unwrap();
            close(
                &host(&on(&g).max_pool2d_backward(&gi, x.shape().clone()).unwrap()),
                &f64s(&g.max_pool2d_backward(&i, x.shape().clone()).unwrap()),
                tol,
            );
            for include in [true, false] {
                close(
                    &host(&on(&x).avg_pool2d_with(p, include).unwrap()),
                    &f64s(&x.avg_pool2d_with(p, include).unwrap()),
                    tol,
                );
                let back = |g: &Tensor| g.avg_pool2d_backward_with(x.shape().clone(), p, include).unwrap();
                close(&host(&back(&on(&g))), &f64s(&back(&g)), tol);
            }
        }
        for out in [(3, 3), (5, 4), (9, 7), (1, 1)] {
            let (v, i) = x.adaptive_max_pool2d(out).unwrap();
            let (gv, gi) = on(&x).adaptive_max_pool2d(out).unwrap();
            assert_eq!(host(&gv), f64s(&v), "{out:?} {dtype:?}");
            assert_eq!(gi.to(Device::CPU).unwrap().to_vec::<i64>().unwrap(), i.to_vec::<i64>().unwrap());
            close(&host(&on(&x).adaptive_avg_pool2d(out).unwrap()), &f64s(&x.adaptive_avg_pool2d(out).unwrap()), tol);
            let g = distinct(v.dims(), 2).to_dtype(dtype).unwrap();
            let back = |g: &Tensor| g.adaptive_avg_pool2d_backward(x.shape().clone()).unwrap();
            close(&host(&back(&on(&g))), &f64s(&back(&g)), tol);
        }
    }
}
