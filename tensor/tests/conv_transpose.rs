//! Transposed and 1-d convolutions against naive f64 references:
//! `conv_transpose2d` against the direct scatter formula
//! `out[n, co, i·s − p + a·d, j·s − p + b·d] += x[n, ci, i, j]·w[ci, co', a, b]`
//! over stride / padding / output padding / dilation / groups / bias and
//! strided inputs, its input and weight gradients against the scatter's
//! adjoints, `conv1d` and `conv_transpose1d` against their 1-d loops, and
//! the error messages; on CUDA (when present) against the host.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_tensor::{Conv1dParams, ConvTranspose1dParams, ConvTranspose2dParams, DType, Device, Tensor, TensorError};
use proptest::prelude::*;

/// Values `k / 8`, `|k| <= 8`: exact in every float dtype.
fn values(len: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s % 17) as f64 - 8.0) / 8.0
        })
        .collect()
}

fn tensor(shape: &[usize], seed: u64) -> Tensor {
    let numel = shape.iter().product();
    Tensor::from_vec_on(values(numel, seed), shape.to_vec(), Device::CPU).unwrap()
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

/// The same logical 4-d tensor laid out otherwise: 0 contiguous, 1 with H
/// and W swapped in memory, 2 narrowed from a wider W.
fn laid_out(t: &Tensor, layout: u8) -> Tensor {
    let out = match layout {
        1 => t.transpose(2, 3).unwrap().contiguous().unwrap().transpose(2, 3).unwrap(),
        2 => {
            let d = t.dims();
            let wide = Tensor::zeros_on([d[0], d[1], d[2], d[3] + 2], t.dtype(), Device::CPU).unwrap();
            let view = wide.narrow(3, 1, d[3]).unwrap();
            view.copy_(t).unwrap();
            view
        }
        _ => t.clone(),
    };
    assert_eq!(out.dims(), t.dims());
    out
}

/// A transposed convolution's sizes for the naive loops.
#[derive(Clone, Copy, Debug)]
struct ConvT {
    n: usize,
    c_in: usize,
    c_out: usize,
    h: usize,
    w: usize,
    kh: usize,
    kw: usize,
    params: ConvTranspose2dParams,
}

impl ConvT {
    /// PyTorch's formula, in signed arithmetic so a too-large padding shows
    /// as a non-positive size.
    fn out(&self) -> (isize, isize) {
        let p = self.params;
        let size = |i: usize, k: usize, s: usize, pad: usize, op: usize, d: usize| {
            (i as isize - 1) * s as isize - 2 * pad as isize + (d * (k - 1)) as isize + op as isize + 1
        };
        (
            size(self.h, self.kh, p.stride.0, p.padding.0, p.output_padding.0, p.dilation.0),
            size(self.w, self.kw, p.stride.1, p.padding.1, p.output_padding.1, p.dilation.1),
        )
    }

    fn out_usize(&self) -> (usize, usize) {
        let (h, w) = self.out();
        (h as usize, w as usize)
    }

    fn input_shape(&self) -> [usize; 4] {
        [self.n, self.c_in, self.h, self.w]
    }

    fn weight_shape(&self) -> [usize; 4] {
        [self.c_in, self.c_out / self.params.groups, self.kh, self.kw]
    }

    fn output_shape(&self) -> [usize; 4] {
        let (h, w) = self.out_usize();
        [self.n, self.c_out, h, w]
    }

    /// Calls `f(x index, w index, out index)` for every product of the
    /// scatter that lands inside the output.
    fn for_each_tap(&self, mut f: impl FnMut(usize, usize, usize)) {
        let p = self.params;
        let (oh, ow) = self.out_usize();
        let (cig, cog) = (self.c_in / p.groups, self.c_out / p.groups);
        for n in 0..self.n {
            for ci in 0..self.c_in {
                let g = ci / cig;
                for i in 0..self.h {
                    for j in 0..self.w {
                        for co in 0..cog {
                            for a in 0..self.kh {
                                for b in 0..self.kw {
                                    let r = (i * p.stride.0 + a * p.dilation.0) as isize - p.padding.0 as isize;
                                    let c = (j * p.stride.1 + b * p.dilation.1) as isize - p.padding.1 as isize;
                                    if r < 0 || c < 0 || r as usize >= oh || c as usize >= ow {
                                        continue;
                                    }
                                    let x_at = ((n * self.c_in + ci) * self.h + i) * self.w + j;
                                    let w_at = ((ci * cog + co) * self.kh + a) * self.kw + b;
                                    let out_at = ((n * self.c_out + g * cog + co) * oh + r as usize) * ow + c as usize;
                                    f(x_at, w_at, out_at);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    fn forward(&self, x: &[f64], w: &[f64], bias: Option<&[f64]>) -> Vec<f64> {
        let mut y = vec![0.0; self.output_shape().iter().product()];
        self.for_each_tap(|xi, wi, yi| y[yi] += x[xi] * w[wi]);
        if let Some(b) = bias {
            let (oh, ow) = self.out_usize();
            for (k, v) in y.iter_mut().enumerate() {
                *v += b[(k / (oh * ow)) % self.c_out];
            }
        }
        y
    }

    fn backward_input(&self, gy: &[f64], w: &[f64]) -> Vec<f64> {
        let mut gx = vec![0.0; self.input_shape().iter().product()];
        self.for_each_tap(|xi, wi, yi| gx[xi] += gy[yi] * w[wi]);
        gx
    }

    fn backward_weight(&self, x: &[f64], gy: &[f64]) -> Vec<f64> {
        let mut gw = vec![0.0; self.weight_shape().iter().product()];
        self.for_each_tap(|xi, wi, yi| gw[wi] += gy[yi] * x[xi]);
        gw
    }
}

fn close(got: &[f64], expected: &[f64], tol: f64) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), expected.len());
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        prop_assert!((g - e).abs() <= tol * (1.0 + e.abs()), "element {}: got {}, expected {}", i, g, e);
    }
    Ok(())
}

fn case() -> impl Strategy<Value = (ConvT, bool, u8, u64)> {
    (
        (1usize..3, 1usize..4, 1usize..3, 1usize..3, 1usize..5, 1usize..5),
        (1usize..4, 1usize..4, 1usize..4, 1usize..4, 0usize..3, 0usize..3, 1usize..4, 1usize..4),
        (0usize..3, 0usize..3),
        any::<bool>(),
        0u8..3,
        any::<u64>(),
    )
        .prop_map(
            |((n, groups, cig, cog, h, w), (kh, kw, sh, sw, ph, pw, dh, dw), (oph, opw), bias, layout, seed)| {
                // An output padding PyTorch allows: below the stride or the dilation.
                let op = |o: usize, s: usize, d: usize| o % s.max(d);
                let params = ConvTranspose2dParams {
                    stride: (sh, sw),
                    padding: (ph, pw),
                    output_padding: (op(oph, sh, dh), op(opw, sw, dw)),
                    dilation: (dh, dw),
                    groups,
                };
                (ConvT { n, c_in: groups * cig, c_out: groups * cog, h, w, kh, kw, params }, bias, layout, seed)
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn conv_transpose2d_and_its_gradients_match_the_scatter((c, with_bias, layout, seed) in case()) {
        let (oh, ow) = c.out();
        let x = laid_out(&tensor(&c.input_shape(), seed), layout);
        let w = tensor(&c.weight_shape(), seed ^ 1);
        let b = tensor(&[c.c_out], seed ^ 2);
        let bias = with_bias.then_some(&b);
        let y = x.conv_transpose2d(&w, bias, c.params);
        if oh <= 0 || ow <= 0 {
            let error = y.unwrap_err();
            prop_assert!(matches!(error, TensorError::Shape { op: "conv_transpose2d", .. }), "{:?}", error);
            return Ok(());
        }
        let y = y.unwrap();
        prop_assert_eq!(y.dims(), &c.output_shape());
        let shape = c.params.output_shape(x.dims(), w.dims()).unwrap();
        prop_assert_eq!(shape.dims(), &c.output_shape());
        let (xs, ws) = (f64s(&x), f64s(&w));
        close(&f64s(&y), &c.forward(&xs, &ws, with_bias.then(|| f64s(&b)).as_deref()), 1e-12)?;

        // f32 takes the same path: values k/8 keep the sums close.
        let y32 = x.to_dtype(DType::F32).unwrap()
            .conv_transpose2d(&w.to_dtype(DType::F32).unwrap(), None, c.params).unwrap();
        close(&f64s(&y32), &c.forward(&xs, &ws, None), 1e-5)?;

        let gy = laid_out(&tensor(&c.output_shape(), seed ^ 3), layout);
        let gys = f64s(&gy);
        let gx = gy.conv_transpose2d_backward_input(&w, c.input_shape(), c.params).unwrap();
        prop_assert_eq!(gx.dims(), &c.input_shape());
        close(&f64s(&gx), &c.backward_input(&gys, &ws), 1e-12)?;
        let gw = x.conv_transpose2d_backward_weight(&gy, c.weight_shape(), c.params).unwrap();
        prop_assert_eq!(gw.dims(), &c.weight_shape());
        close(&f64s(&gw), &c.backward_weight(&xs, &gys), 1e-12)?;
        let gb = gy.conv2d_backward_bias().unwrap();
        let plane = (oh * ow) as usize;
        let expected: Vec<f64> = (0..c.c_out)
            .map(|co| (0..c.n).flat_map(|n| gys[(n * c.c_out + co) * plane..][..plane].iter()).sum())
            .collect();
        close(&f64s(&gb), &expected, 1e-12)?;
    }
}

#[test]
fn output_padding_and_groups_by_hand() {
    // Two groups of one input channel each, one output channel per group,
    // stride 2, output padding 1: each input pixel's 1x1 kernel lands at
    // even positions; the odd last row and column come from output padding.
    let x = Tensor::from_vec_on(vec![1.0f64, 2.0, 3.0, 4.0], [1, 2, 1, 2], Device::CPU).unwrap();
    let w = Tensor::from_vec_on(vec![10.0f64, 100.0], [2, 1, 1, 1], Device::CPU).unwrap();
    let p = ConvTranspose2dParams::new().with_stride((2, 2)).with_output_padding((1, 1)).with_groups(2);
    let y = x.conv_transpose2d(&w, None, p).unwrap();
    assert_eq!(y.dims(), &[1, 2, 2, 4]);
    #[rustfmt::skip]
    let expected = [
        10.0, 0.0, 20.0, 0.0,   0.0, 0.0, 0.0, 0.0,
        300.0, 0.0, 400.0, 0.0, 0.0, 0.0, 0.0, 0.0,
    ];
    assert_eq!(y.to_vec::<f64>().unwrap(), expected);
}

#[test]
fn unbatched_and_half_precision() {
    let c = ConvT {
        n: 1,
        c_in: 2,
        c_out: 3,
        h: 3,
        w: 2,
        kh: 2,
        kw: 3,
        params: ConvTranspose2dParams::new().with_stride((2, 1)).with_padding((1, 1)),
    };
    let x = tensor(&c.input_shape(), 5);
    let w = tensor(&c.weight_shape(), 6);
    let expected = c.forward(&f64s(&x), &f64s(&w), None);
    let y = x.squeeze(0).unwrap().conv_transpose2d(&w, None, c.params).unwrap();
    assert_eq!(y.dims(), &c.output_shape()[1..]);
    assert_eq!(f64s(&y), expected);
    let y16 = x.to_dtype(DType::BF16).unwrap().conv_transpose2d(&w.to_dtype(DType::BF16).unwrap(), None, c.params);
    let y16 = y16.unwrap();
    assert_eq!(y16.dtype(), DType::BF16);
    for (g, e) in f64s(&y16).iter().zip(&expected) {
        assert!((g - e).abs() <= 1e-2 * (1.0 + e.abs()), "bf16 {g} vs {e}");
    }
}

fn message(e: TensorError) -> String {
    e.to_string()
}

#[test]
fn conv_transpose2d_errors_name_the_problem() {
    let x = Tensor::zeros([1, 4, 3, 3], DType::F32).unwrap();
    let w = Tensor::zeros([4, 2, 3, 3], DType::F32).unwrap();
    let p = ConvTranspose2dParams::new();
    let e = |r: brasa_tensor::Result<Tensor>| message(r.unwrap_err());
    assert_eq!(
        e(Tensor::zeros([4, 3], DType::F32).unwrap().conv_transpose2d(&w, None, p)),
        "conv_transpose2d: expected a 4-d input [N, C_in, H, W], got shape [4, 3]"
    );
    assert_eq!(
        e(x.conv_transpose2d(&Tensor::zeros([4, 2, 3], DType::F32).unwrap(), None, p)),
        "conv_transpose2d: expected a 4-d weight [C_in, C_out / groups, kH, kW], got shape [4, 2, 3]"
    );
    assert_eq!(
        e(x.conv_transpose2d(&Tensor::zeros([3, 2, 3, 3], DType::F32).unwrap(), None, p)),
        "conv_transpose2d: input [1, 4, 3, 3] has 4 channels but weight [3, 2, 3, 3] expects 3 (its first dim)"
    );
    assert_eq!(
        e(x.conv_transpose2d(&w, None, p.with_groups(3))),
        "conv_transpose2d: input [1, 4, 3, 3] has 4 channels, which groups = 3 does not divide"
    );
    assert_eq!(e(x.conv_transpose2d(&w, None, p.with_groups(0))), "conv_transpose2d: groups must be positive, got 0");
    assert_eq!(
        e(x.conv_transpose2d(&w, None, p.with_stride((2, 2)).with_output_padding((0, 2)))),
        "conv_transpose2d: width: output_padding (2) must be smaller than either stride (2) or dilation (1)"
    );
    assert_eq!(
        e(x.conv_transpose2d(&w, None, p.with_stride((0, 1)))),
        "conv_transpose2d: height: kernel 3, stride 0 and dilation 1 must all be positive"
    );
    let message = e(x.conv_transpose2d(&w, None, p.with_padding((3, 0))));
    assert!(
        message.starts_with("conv_transpose2d: height: padding 3 on each side trims the whole output"),
        "{message}"
    );
    assert_eq!(
        e(x.conv_transpose2d(&w, Some(&Tensor::zeros([4], DType::F32).unwrap()), p)),
        "conv_transpose2d: expected a bias of shape [2] (C_out), got [4]"
    );
    assert!(matches!(
        x.conv_transpose2d(&w.to_dtype(DType::F64).unwrap(), None, p).unwrap_err(),
        TensorError::DTypeMismatch { .. }
    ));
    assert!(matches!(
        Tensor::zeros([1, 4, 3, 3], DType::I64).unwrap().conv_transpose2d(&w, None, p).unwrap_err(),
        TensorError::UnsupportedDType { .. }
    ));
    // A gradient of the wrong shape.
    assert_eq!(
        e(Tensor::zeros([1, 2, 4, 5], DType::F32).unwrap().conv_transpose2d_backward_input(&w, [1, 4, 3, 3], p)),
        "conv_transpose2d_backward_input: grad_output has shape [1, 2, 4, 5] but input [1, 4, 3, 3] and weight \
         [4, 2, 3, 3] give an output of shape [1, 2, 5, 5]"
    );
}

/// `conv1d` by its loops: `y[n, co, l] = Σ x[n, g·cig + c, l·s − p + k·d]·w[co, c, k]`.
#[allow(clippy::too_many_arguments)]
fn conv1d_naive(
    x: &[f64],
    w: &[f64],
    [n, c_in, l]: [usize; 3],
    [c_out, _, k]: [usize; 3],
    p: Conv1dParams,
) -> Vec<f64> {
    let out = (l + 2 * p.padding - p.dilation * (k - 1) - 1) / p.stride + 1;
    let (cig, cog) = (c_in / p.groups, c_out / p.groups);
    let mut y = vec![0.0; n * c_out * out];
    for b in 0..n {
        for co in 0..c_out {
            for o in 0..out {
                for c in 0..cig {
                    for t in 0..k {
                        let i = (o * p.stride + t * p.dilation) as isize - p.padding as isize;
                        if i >= 0 && (i as usize) < l {
                            let ci = (co / cog) * cig + c;
                            y[(b * c_out + co) * out + o] +=
                                x[(b * c_in + ci) * l + i as usize] * w[(co * cig + c) * k + t];
                        }
                    }
                }
            }
        }
    }
    y
}

/// `conv_transpose1d` by its scatter.
fn conv_transpose1d_naive(
    x: &[f64],
    w: &[f64],
    [n, c_in, l]: [usize; 3],
    [_, cog, k]: [usize; 3],
    p: ConvTranspose1dParams,
) -> Vec<f64> {
    let out = (l - 1) * p.stride + p.dilation * (k - 1) + p.output_padding + 1 - 2 * p.padding;
    let (cig, c_out) = (c_in / p.groups, cog * p.groups);
    let mut y = vec![0.0; n * c_out * out];
    for b in 0..n {
        for ci in 0..c_in {
            for i in 0..l {
                for co in 0..cog {
                    for t in 0..k {
                        let o = (i * p.stride + t * p.dilation) as isize - p.padding as isize;
                        if o >= 0 && (o as usize) < out {
                            y[(b * c_out + (ci / cig) * cog + co) * out + o as usize] +=
                                x[(b * c_in + ci) * l + i] * w[(ci * cog + co) * k + t];
                        }
                    }
                }
            }
        }
    }
    y
}

#[test]
fn conv1d_matches_its_loops() {
    let p = Conv1dParams::new().with_stride(2).with_padding(2).with_dilation(2).with_groups(2);
    let (xs, ws) = ([2, 4, 9], [6, 2, 3]);
    let x = tensor(&xs, 11);
    let w = tensor(&ws, 12);
    let b = tensor(&[6], 13);
    let y = x.conv1d(&w, Some(&b), p).unwrap();
    // (9 + 4 - 4 - 1) / 2 + 1 = 5.
    assert_eq!(y.dims(), &[2, 6, 5]);
    let mut expected = conv1d_naive(&f64s(&x), &f64s(&w), xs, ws, p);
    for (i, v) in expected.iter_mut().enumerate() {
        *v += f64s(&b)[(i / 5) % 6];
    }
    let got = f64s(&y);
    for (g, e) in got.iter().zip(&expected) {
        assert!((g - e).abs() <= 1e-12, "{g} vs {e}");
    }
    // A non-contiguous input (channels and length swapped in memory) and an
    // unbatched one give the same values.
    let strided = x.transpose(1, 2).unwrap().contiguous().unwrap().transpose(1, 2).unwrap();
    assert!(!strided.is_contiguous());
    assert_eq!(f64s(&strided.conv1d(&w, Some(&b), p).unwrap()), got);
    let one = x.narrow(0, 1, 1).unwrap().squeeze(0).unwrap().conv1d(&w, Some(&b), p).unwrap();
    assert_eq!(one.dims(), &[6, 5]);
    assert_eq!(f64s(&one), got[30..]);
}

#[test]
fn conv_transpose1d_matches_its_scatter() {
    for p in [
        ConvTranspose1dParams::new().with_stride(3).with_padding(1).with_output_padding(2).with_groups(2),
        ConvTranspose1dParams::new().with_dilation(3).with_output_padding(2).with_padding(2),
        ConvTranspose1dParams::new().with_stride(2).with_dilation(2).with_output_padding(1),
    ] {
        let (xs, ws) = ([2, 4, 5], [4, 3 - (p.groups - 1), 3]);
        let x = tensor(&xs, 21);
        let w = tensor(&ws, 22);
        let y = x.conv_transpose1d(&w, None, p).unwrap();
        let expected = conv_transpose1d_naive(&f64s(&x), &f64s(&w), xs, ws, p);
        assert_eq!(y.numel(), expected.len(), "{p:?}");
        for (g, e) in f64s(&y).iter().zip(&expected) {
            assert!((g - e).abs() <= 1e-12, "{p:?}: {g} vs {e}");
        }
    }
}

#[test]
fn one_d_errors_name_the_one_d_op() {
    let x = Tensor::zeros([2, 4, 9], DType::F32).unwrap();
    let e = |r: brasa_tensor::Result<Tensor>| r.unwrap_err().to_string();
    assert_eq!(
        e(x.conv1d(&Tensor::zeros([6, 4, 3, 3], DType::F32).unwrap(), None, Conv1dParams::new())),
        "conv1d: expected a 3-d weight [C_out, C_in / groups, k], got shape [6, 4, 3, 3]"
    );
    assert_eq!(
        e(Tensor::zeros([2, 4, 9, 1], DType::F32).unwrap().conv1d(
            &Tensor::zeros([6, 4, 3], DType::F32).unwrap(),
            None,
            Conv1dParams::new()
        )),
        "conv1d: expected a 3-d input [N, C_in, L], got shape [2, 4, 9, 1]"
    );
    let message = e(x.conv1d(&Tensor::zeros([6, 3, 3], DType::F32).unwrap(), None, Conv1dParams::new()));
    assert!(message.starts_with("conv1d: input [2, 4, 1, 9] has 4 channels but weight [6, 3, 1, 3]"), "{message}");
    assert!(message.ends_with("(as a 2-d convolution over a height of 1)"), "{message}");
    let w = Tensor::zeros([4, 2, 3], DType::F32).unwrap();
    assert_eq!(
        e(x.conv_transpose1d(&w, None, ConvTranspose1dParams::new().with_stride(2).with_output_padding(2))),
        "conv_transpose1d: width: output_padding (2) must be smaller than either stride (2) or dilation (1)"
    );
    let message = e(x.conv_transpose1d(&w, None, ConvTranspose1dParams::new().with_groups(3)));
    assert!(message.starts_with("conv_transpose1d: input [2, 4, 1, 9] has 4 channels, which groups = 3"), "{message}");
}

/// On `cuda:0` when this build and machine have one (else one line says
/// why it is skipped): the transposed and 1-d ops and the transposed
/// gradients give the host's values, output padding past the stride and
/// groups included.
#[test]
fn cuda_matches_the_host_when_present() {
    if brasa_tensor::cuda_device_count() == 0 {
        eprintln!(
            "skipped on CUDA: no CUDA device{}",
            if cfg!(feature = "cuda") { "" } else { " (built without the `cuda` feature)" }
        );
        return;
    }
    let dev = Device::cuda(0);
    let on = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to(dev).unwrap();
    let near = |got: &Tensor, want: &Tensor, what: &str| {
        let (g, w) = (f64s(&got.to(Device::CPU).unwrap()), f64s(want));
        assert_eq!(g.len(), w.len(), "{what}");
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{what}[{i}]: cuda {a}, host {b}");
        }
    };
    for p in [
        ConvTranspose2dParams::new()
            .with_stride((2, 2))
            .with_padding((1, 0))
            .with_output_padding((1, 1))
            .with_dilation((2, 1))
            .with_groups(2),
        ConvTranspose2dParams::new().with_padding((1, 1)).with_output_padding((2, 1)).with_dilation((3, 2)),
    ] {
        let (x, w, b) = (tensor(&[2, 4, 3, 4], 31), tensor(&[4, 3 - (p.groups - 1), 2, 3], 32), tensor(&[6], 33));
        let b = b.narrow(0, 0, (3 - (p.groups - 1)) * p.groups).unwrap();
        let y = x.conv_transpose2d(&w, Some(&b), p).unwrap();
        near(&on(&x).conv_transpose2d(&on(&w), Some(&on(&b)), p).unwrap(), &y, "conv_transpose2d");
        let g = tensor(y.dims(), 34);
        let gx = g.conv_transpose2d_backward_input(&w, x.dims(), p).unwrap();
        near(&on(&g).conv_transpose2d_backward_input(&on(&w), x.dims(), p).unwrap(), &gx, "backward_input");
        let gw = x.conv_transpose2d_backward_weight(&g, w.dims(), p).unwrap();
        near(&on(&x).conv_transpose2d_backward_weight(&on(&g), w.dims(), p).unwrap(), &gw, "backward_weight");
    }
    let (x, w) = (tensor(&[2, 4, 9], 41), tensor(&[6, 2, 3], 42));
    let p = Conv1dParams::new().with_stride(2).with_padding(1).with_dilation(2).with_groups(2);
    near(&on(&x).conv1d(&on(&w), None, p).unwrap(), &x.conv1d(&w, None, p).unwrap(), "conv1d");
    let wt = tensor(&[4, 3, 3], 43);
    let p = ConvTranspose1dParams::new().with_stride(2).with_padding(1).with_output_padding(1);
    near(&on(&x).conv_transpose1d(&on(&wt), None, p).unwrap(), &x.conv_transpose1d(&wt, None, p).unwrap(), "ct1d");
}
