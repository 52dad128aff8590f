//! Convolution and pooling against naive references: `conv2d` against the
//! seven-loop definition over stride / padding / dilation / groups and
//! strided inputs; its input and weight gradients against the naive adjoint
//! and against finite differences of `sum(conv2d(x, w) * r)`; max and
//! average pooling (and their backward passes) against direct loops and
//! finite differences; and the error messages.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_tensor::{set_host_device_count, Conv2dParams, DType, Device, KernelError, Tensor, TensorError};
use proptest::prelude::*;

fn init() {
    set_host_device_count(2).unwrap();
}

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

fn tensor(shape: &[usize], dtype: DType, seed: u64) -> Tensor {
    init();
    let numel = shape.iter().product();
    Tensor::from_vec_on(values(numel, seed), shape.to_vec(), Device::CPU).unwrap().to_dtype(dtype).unwrap()
}

/// The same logical 4-d tensor laid out otherwise: 0 contiguous, 1 with H
/// and W swapped in memory, 2 narrowed from a wider W, 3 with channels last.
fn laid_out(t: &Tensor, layout: u8) -> Tensor {
    let copy = |dims: &[usize], perm: &[usize], back: &[usize]| {
        let stored = t.permute(perm).unwrap().contiguous().unwrap();
        assert_eq!(stored.dims(), dims);
        stored.permute(back).unwrap()
    };
    let d = t.dims().to_vec();
    let out = match layout {
        1 => copy(&[d[0], d[1], d[3], d[2]], &[0, 1, 3, 2], &[0, 1, 3, 2]),
        2 => {
            let wide = Tensor::zeros_on([d[0], d[1], d[2], d[3] + 2], t.dtype(), Device::CPU).unwrap();
            let view = wide.narrow(3, 1, d[3]).unwrap();
            view.copy_(t).unwrap();
            view
        }
        3 => copy(&[d[0], d[2], d[3], d[1]], &[0, 2, 3, 1], &[0, 3, 1, 2]),
        _ => t.clone(),
    };
    assert_eq!(out.dims(), t.dims());
    out
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

/// The convolution's geometry for the naive loops.
#[derive(Clone, Copy, Debug)]
struct Conv {
    n: usize,
    c_in: usize,
    c_out: usize,
    h: usize,
    w: usize,
    kh: usize,
    kw: usize,
    params: Conv2dParams,
}

impl Conv {
    fn out(&self) -> (usize, usize) {
        let p = self.params;
        let oh = (self.h + 2 * p.padding.0 - p.dilation.0 * (self.kh - 1) - 1) / p.stride.0 + 1;
        let ow = (self.w + 2 * p.padding.1 - p.dilation.1 * (self.kw - 1) - 1) / p.stride.1 + 1;
        (oh, ow)
    }

    fn valid(&self) -> bool {
        let p = self.params;
        p.dilation.0 * (self.kh - 1) < self.h + 2 * p.padding.0
            && p.dilation.1 * (self.kw - 1) < self.w + 2 * p.padding.1
    }

    fn input_shape(&self) -> [usize; 4] {
        [self.n, self.c_in, self.h, self.w]
    }

    fn weight_shape(&self) -> [usize; 4] {
        [self.c_out, self.c_in / self.params.groups, self.kh, self.kw]
    }

    fn output_shape(&self) -> [usize; 4] {
        let (oh, ow) = self.out();
        [self.n, self.c_out, oh, ow]
    }

    /// Calls `f(n, co, ci, oh, ow, ih, iw, i, j)` for every tap of the
    /// convolution that lands inside the input: the seven loops of the
    /// definition (plus the two over the kernel).
    fn for_each_tap(&self, mut f: impl FnMut([usize; 9])) {
        let p = self.params;
        let (oh_n, ow_n) = self.out();
        let (cig, cog) = (self.c_in / p.groups, self.c_out / p.groups);
        for n in 0..self.n {
            for co in 0..self.c_out {
                let g = co / cog;
                for oh in 0..oh_n {
                    for ow in 0..ow_n {
                        for c in 0..cig {
                            for i in 0..self.kh {
                                for j in 0..self.kw {
                                    let ih = (oh * p.stride.0 + i * p.dilation.0) as isize - p.padding.0 as isize;
                                    let iw = (ow * p.stride.1 + j * p.dilation.1) as isize - p.padding.1 as isize;
                                    if ih >= 0 && iw >= 0 && (ih as usize) < self.h && (iw as usize) < self.w {
                                        f([n, co, g * cig + c, oh, ow, ih as usize, iw as usize, i, j]);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    fn input_at(&self, [n, c, h, w]: [usize; 4]) -> usize {
        ((n * self.c_in + c) * self.h + h) * self.w + w
    }

    fn weight_at(&self, co: usize, ci: usize, i: usize, j: usize) -> usize {
        let cig = self.c_in / self.params.groups;
        ((co * cig + ci % cig) * self.kh + i) * self.kw + j
    }

    fn output_at(&self, n: usize, co: usize, oh: usize, ow: usize) -> usize {
        let (oh_n, ow_n) = self.out();
        ((n * self.c_out + co) * oh_n + oh) * ow_n + ow
    }

    fn forward(&self, x: &[f64], w: &[f64], b: Option<&[f64]>) -> Vec<f64> {
        let mut y = vec![0.0; self.output_shape().iter().product()];
        self.for_each_tap(|[n, co, ci, oh, ow, ih, iw, i, j]| {
            y[self.output_at(n, co, oh, ow)] += x[self.input_at([n, ci, ih, iw])] * w[self.weight_at(co, ci, i, j)];
        });
        if let Some(b) = b {
            let (oh, ow) = self.out();
            for (k, v) in y.iter_mut().enumerate() {
                *v += b[(k / (oh * ow)) % self.c_out];
            }
        }
        y
    }

    /// The adjoint of `forward` in x: scatter every tap's product back.
    fn backward_input(&self, gy: &[f64], w: &[f64]) -> Vec<f64> {
        let mut gx = vec![0.0; self.input_shape().iter().product()];
        self.for_each_tap(|[n, co, ci, oh, ow, ih, iw, i, j]| {
            gx[self.input_at([n, ci, ih, iw])] += gy[self.output_at(n, co, oh, ow)] * w[self.weight_at(co, ci, i, j)];
        });
        gx
    }

    /// The adjoint of `forward` in w.
    fn backward_weight(&self, x: &[f64], gy: &[f64]) -> Vec<f64> {
        let mut gw = vec![0.0; self.weight_shape().iter().product()];
        self.for_each_tap(|[n, co, ci, oh, ow, ih, iw, i, j]| {
            gw[self.weight_at(co, ci, i, j)] += gy[self.output_at(n, co, oh, ow)] * x[self.input_at([n, ci, ih, iw])];
        });
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

fn conv_case() -> impl Strategy<Value = (Conv, bool, u8, u8, u64)> {
    conv_case_of(0..4, 1..8)
}

/// Convolutions of `batch` images of `size`·`size`-ish planes.
fn conv_case_of(
    batch: std::ops::Range<usize>,
    size: std::ops::Range<usize>,
) -> impl Strategy<Value = (Conv, bool, u8, u8, u64)> {
    (
        (batch, 1usize..4, 1usize..4, 1usize..4, size.clone(), size),
        (1usize..4, 1usize..4, 1usize..4, 1usize..4, 0usize..3, 0usize..3, 1usize..3, 1usize..3),
        any::<bool>(),
        0u8..4,
        0u8..4,
        any::<u64>(),
    )
        .prop_map(|((n, groups, cig, cog, h, w), (kh, kw, sh, sw, ph, pw, dh, dw), bias, xl, wl, seed)| {
            let params = Conv2dParams { stride: (sh, sw), padding: (ph, pw), dilation: (dh, dw), groups };
            (Conv { n, c_in: groups * cig, c_out: groups * cog, h, w, kh, kw, params }, bias, xl, wl, seed)
        })
        .prop_filter("the dilated kernel must fit the padded input", |(c, ..)| c.valid())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn conv2d_and_its_gradients_match_the_definition((c, with_bias, x_layout, w_layout, seed) in conv_case()) {
        check_against_the_definition(&c, with_bias, x_layout, w_layout, seed)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Batches large enough, and planes small enough, that the host puts
    /// several images side by side in one product (and, with two threads,
    /// gives each thread blocks of them): the same results as the
    /// definition, for every layout of the input and of the gradient.
    #[test]
    fn conv2d_over_blocks_of_images_matches_the_definition(
        (c, with_bias, x_layout, w_layout, seed) in conv_case_of(5..14, 1..6)
    ) {
        check_against_the_definition(&c, with_bias, x_layout, w_layout, seed)?;
    }
}

fn check_against_the_definition(
    c: &Conv,
    with_bias: bool,
    x_layout: u8,
    w_layout: u8,
    seed: u64,
) -> Result<(), TestCaseError> {
    {
        // The values are multiples of 1/64 after one product: every sum
        // here is exact in f32, so a half-precision result is the exact one
        // rounded once (half an ulp: at most 2^-8 relative in bf16, 2^-11 in f16),
        // as the products, the folded input gradient and the weight
        // gradient summed over images all accumulate in f32.
        for dtype in [DType::F64, DType::F32, DType::BF16, DType::F16] {
            let x = laid_out(&tensor(&c.input_shape(), dtype, seed), x_layout);
            let w = laid_out(&tensor(&c.weight_shape(), dtype, seed + 1), w_layout);
            let b = tensor(&[c.c_out], dtype, seed + 2);
            let bias = with_bias.then_some(&b);
            let y = x.conv2d(&w, bias, c.params).unwrap();
            prop_assert_eq!(y.dims(), &c.output_shape());
            // PyTorch's memory-format rule: channels-last out when either
            // operand is channels-last and not also row-major.
            let strictly = |t: &Tensor| !t.is_contiguous() && t.is_channels_last();
            let format_of = |a: &Tensor, b: &Tensor| strictly(a) || strictly(b);
            prop_assert_eq!(y.is_channels_last(), format_of(&x, &w) || y.is_channels_last() && y.is_contiguous());
            let (xv, wv, bv) = (f64s(&x), f64s(&w), f64s(&b));
            let tol = match dtype {
                DType::F64 => 1e-12,
                DType::F32 => 1e-5,
                DType::BF16 => 2f64.powi(-8),
                _ => 2f64.powi(-11),
            };
            close(&f64s(&y), &c.forward(&xv, &wv, with_bias.then_some(&bv)), tol)?;

            // The output gradient in a layout of its own.
            let gy = laid_out(&tensor(&c.output_shape(), dtype, seed + 3), (seed % 4) as u8);
            let gyv = f64s(&gy);
            let gx = gy.conv2d_backward_input(&w, c.input_shape(), c.params).unwrap();
            prop_assert_eq!(gx.dims(), &c.input_shape());
            prop_assert_eq!(gx.is_channels_last(), format_of(&gy, &w) || gx.is_channels_last() && gx.is_contiguous());
            close(&f64s(&gx), &c.backward_input(&gyv, &wv), tol)?;
            let gw = x.conv2d_backward_weight(&gy, c.weight_shape(), c.params).unwrap();
            prop_assert_eq!(gw.dims(), &c.weight_shape());
            prop_assert_eq!(gw.is_channels_last(), format_of(&x, &gy) || gw.is_channels_last() && gw.is_contiguous());
            close(&f64s(&gw), &c.backward_weight(&xv, &gyv), tol)?;
            let gb = gy.conv2d_backward_bias().unwrap();
            let mut sums = vec![0.0; c.c_out];
            let plane = gyv.len() / (c.n * c.c_out).max(1);
            for (k, v) in gyv.iter().enumerate() {
                sums[(k / plane) % c.c_out] += v;
            }
            close(&f64s(&gb), &sums, tol)?;
        }
    }
    Ok(())
}

/// `sum(conv2d(x, w) * r)` in f64.
fn loss(x: &Tensor, w: &Tensor, r: &[f64], params: Conv2dParams) -> f64 {
    f64s(&x.conv2d(w, None, params).unwrap()).iter().zip(r).map(|(a, b)| a * b).sum()
}

/// `t` with element `index` (row-major) moved by `delta`.
fn nudged(t: &Tensor, index: usize, delta: f64) -> Tensor {
    let mut v = f64s(t);
    v[index] += delta;
    Tensor::from_vec_on(v, t.dims().to_vec(), Device::CPU).unwrap()
}

fn random_f64(shape: &[usize], seed: u64) -> Tensor {
    // Continuous values, unlike `values`, so that nothing is accidentally exact.
    let v: Vec<f64> =
        values(shape.iter().product(), seed).iter().enumerate().map(|(i, x)| x + (i as f64).sin() * 0.01).collect();
    init();
    Tensor::from_vec_on(v, shape.to_vec(), Device::CPU).unwrap()
}

#[test]
fn conv2d_gradients_match_finite_differences() {
    let configs = [
        Conv {
            n: 2,
            c_in: 3,
            c_out: 4,
            h: 6,
            w: 5,
            kh: 3,
            kw: 3,
            params: Conv2dParams::default().with_padding((1, 1)),
        },
        Conv {
            n: 1,
            c_in: 4,
            c_out: 2,
            h: 7,
            w: 8,
            kh: 2,
            kw: 3,
            params: Conv2dParams { stride: (2, 3), padding: (1, 2), dilation: (2, 1), groups: 2 },
        },
        Conv { n: 3, c_in: 2, c_out: 6, h: 4, w: 4, kh: 1, kw: 1, params: Conv2dParams::default().with_groups(2) },
    ];
    for (seed, c) in configs.iter().enumerate() {
        let seed = seed as u64 * 10;
        let x = random_f64(&c.input_shape(), seed);
        let w = random_f64(&c.weight_shape(), seed + 1);
        let r = f64s(&random_f64(&c.output_shape(), seed + 2));
        let rt = Tensor::from_vec_on(r.clone(), c.output_shape().to_vec(), Device::CPU).unwrap();
        let gx = f64s(&rt.conv2d_backward_input(&w, c.input_shape(), c.params).unwrap());
        let gw = f64s(&x.conv2d_backward_weight(&rt, c.weight_shape(), c.params).unwrap());
        let h = 1e-4;
        for index in (0..x.numel()).step_by(7) {
            let fd = (loss(&nudged(&x, index, h), &w, &r, c.params) - loss(&nudged(&x, index, -h), &w, &r, c.params))
                / (2.0 * h);
            assert!((fd - gx[index]).abs() < 1e-7 * (1.0 + fd.abs()), "{c:?} dx[{index}]: fd {fd}, op {}", gx[index]);
        }
        for index in (0..w.numel()).step_by(3) {
            let fd = (loss(&x, &nudged(&w, index, h), &r, c.params) - loss(&x, &nudged(&w, index, -h), &r, c.params))
                / (2.0 * h);
            assert!((fd - gw[index]).abs() < 1e-7 * (1.0 + fd.abs()), "{c:?} dw[{index}]: fd {fd}, op {}", gw[index]);
        }
    }
}

/// A layer of the size training meets (the second convolution of a small
/// CNN, four images so that both the per-image and the all-threads splits
/// run): half-precision operands give the exact results rounded once. The
/// values are multiples of 1/8, so every product and sum is exact in f32
/// (the weight gradient sums 4 x 256 x 1/64-granular terms: < 2^17, 23
/// bits); a bf16 result is off by at most half an ulp (2^-8 relative), an
/// f16 one by 2^-11.
#[test]
fn half_precision_conv_rounds_exact_sums_once() {
    let c = Conv {
        n: 4,
        c_in: 32,
        c_out: 64,
        h: 16,
        w: 16,
        kh: 3,
        kw: 3,
        params: Conv2dParams::default().with_padding((1, 1)),
    };
    for (dtype, tol) in [(DType::BF16, 2f64.powi(-8)), (DType::F16, 2f64.powi(-11))] {
        let x = tensor(&c.input_shape(), dtype, 1);
        let w = tensor(&c.weight_shape(), dtype, 2);
        let b = tensor(&[c.c_out], dtype, 3);
        let (xv, wv, bv) = (f64s(&x), f64s(&w), f64s(&b));
        let y = x.conv2d(&w, Some(&b), c.params).unwrap();
        assert_eq!(y.dtype(), dtype);
        close(&f64s(&y), &c.forward(&xv, &wv, Some(&bv)), tol).unwrap();
        let gy = tensor(&c.output_shape(), dtype, 4);
        let gyv = f64s(&gy);
        let gx = gy.conv2d_backward_input(&w, c.input_shape(), c.params).unwrap();
        assert_eq!(gx.dtype(), dtype);
        close(&f64s(&gx), &c.backward_input(&gyv, &wv), tol).unwrap();
        let gw = x.conv2d_backward_weight(&gy, c.weight_shape(), c.params).unwrap();
        assert_eq!(gw.dtype(), dtype);
        close(&f64s(&gw), &c.backward_weight(&xv, &gyv), tol).unwrap();
        let gb = gy.conv2d_backward_bias().unwrap();
        assert_eq!(gb.dtype(), dtype);
        let plane = 16 * 16;
        let mut sums = vec![0.0; c.c_out];
        for (k, v) in gyv.iter().enumerate() {
            sums[(k / plane) % c.c_out] += v;
        }
        close(&f64s(&gb), &sums, tol).unwrap();
    }
}

#[test]
fn unbatched_and_empty_convolutions() {
    let x = tensor(&[2, 4, 4], DType::F32, 1);
    let w = tensor(&[3, 2, 3, 3], DType::F32, 2);
    let y = x.conv2d(&w, None, Conv2dParams::default()).unwrap();
    assert_eq!(y.dims(), &[3, 2, 2]);
    let batched = x.unsqueeze(0).unwrap().conv2d(&w, None, Conv2dParams::default()).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), batched.to_vec::<f32>().unwrap());
    // No images; no output channels; no input channels (the output is the bias).
    let none = tensor(&[0, 2, 4, 4], DType::F32, 3).conv2d(&w, None, Conv2dParams::default()).unwrap();
    assert_eq!(none.dims(), &[0, 3, 2, 2]);
    let no_out = x.conv2d(&tensor(&[0, 2, 3, 3], DType::F32, 4), None, Conv2dParams::default()).unwrap();
    assert_eq!(no_out.dims(), &[0, 2, 2]);
    let b = tensor(&[3], DType::F32, 5);
    let no_in = tensor(&[1, 0, 4, 4], DType::F32, 6)
        .conv2d(&tensor(&[3, 0, 3, 3], DType::F32, 7), Some(&b), Conv2dParams::default())
        .unwrap();
    let bv = b.to_vec::<f32>().unwrap();
    assert_eq!(no_in.to_vec::<f32>().unwrap(), [[bv[0]; 4], [bv[1]; 4], [bv[2]; 4]].concat());
    let gw = tensor(&[0, 2, 4, 4], DType::F64, 8)
        .conv2d_backward_weight(&tensor(&[0, 3, 2, 2], DType::F64, 9), [3, 2, 3, 3], Conv2dParams::default())
        .unwrap();
    assert_eq!(gw.to_vec::<f64>().unwrap(), [0.0; 54]);
}

/// The message of `result`'s error, after checking that the error is a
/// [`TensorError::Shape`] of `op` (the variant says no more than that: the
/// shapes are in the message).
fn shape_message<T: std::fmt::Debug>(result: brasa_tensor::Result<T>, op: &str) -> String {
    let error = result.unwrap_err();
    assert!(matches!(&error, TensorError::Shape { op: o, .. } if *o == op), "{error:?}");
    error.to_string()
}

/// The message of `result`'s error, after checking that the error is a
/// [`TensorError::Invalid`] of `op`.
fn invalid_message<T: std::fmt::Debug>(result: brasa_tensor::Result<T>, op: &str) -> String {
    let error = result.unwrap_err();
    assert!(matches!(&error, TensorError::Invalid { op: o, .. } if *o == op), "{error:?}");
    error.to_string()
}

#[test]
fn conv_errors_name_shapes_dtypes_and_devices() {
    let p = Conv2dParams::default();
    let x = tensor(&[1, 3, 5, 5], DType::F32, 0);
    let w = tensor(&[4, 3, 3, 3], DType::F32, 0);
    assert_eq!(
        shape_message(x.conv2d(&tensor(&[4, 2, 3, 3], DType::F32, 0), None, p), "conv2d"),
        "conv2d: input [1, 3, 5, 5] has 3 channels but weight [4, 2, 3, 3] with groups = 1 expects 2 x 1 = 2"
    );
    assert_eq!(
        shape_message(x.conv2d(&tensor(&[4, 1, 3, 3], DType::F32, 0), None, p.with_groups(3)), "conv2d"),
        "conv2d: weight [4, 1, 3, 3] has 4 output channels, which groups = 3 does not divide"
    );
    assert_eq!(
        invalid_message(x.conv2d(&w, None, p.with_groups(0)), "conv2d"),
        "conv2d: groups must be positive, got 0"
    );
    assert_eq!(
        shape_message(x.conv2d(&tensor(&[4, 3, 7, 3], DType::F32, 0), None, p), "conv2d"),
        "conv2d: input [1, 3, 5, 5] and weight [4, 3, 7, 3] with stride (1, 1), padding (0, 0), dilation (1, 1): \
         height: kernel 7 with dilation 1 spans 7, more than the padded input (5 + 2 x 0 = 5)"
    );
    let message = shape_message(x.conv2d(&w, None, p.with_stride((0, 1))), "conv2d");
    assert!(message.contains("stride 0"), "{message}");
    let message = shape_message(x.conv2d(&w, None, p.with_dilation((1, 0))), "conv2d");
    assert!(message.contains("dilation 0"), "{message}");
    assert_eq!(
        shape_message(tensor(&[5, 5], DType::F32, 0).conv2d(&w, None, p), "conv2d"),
        "conv2d: expected a 4-d input [N, C_in, H, W], got shape [5, 5]"
    );
    assert_eq!(
        shape_message(x.conv2d(&tensor(&[4, 3, 3], DType::F32, 0), None, p), "conv2d"),
        "conv2d: expected a 4-d weight [C_out, C_in / groups, kH, kW], got shape [4, 3, 3]"
    );
    assert_eq!(
        shape_message(x.conv2d(&w, Some(&tensor(&[3], DType::F32, 0)), p), "conv2d"),
        "conv2d: expected a bias of shape [4] (C_out), got [3]"
    );
    let error = x.conv2d(&w.to_dtype(DType::F64).unwrap(), None, p).unwrap_err();
    assert!(
        matches!(error, TensorError::DTypeMismatch { op: "conv2d", expected: DType::F32, got: DType::F64 }),
        "{error:?}"
    );
    let error = x.to_dtype(DType::I64).unwrap().conv2d(&w, None, p).unwrap_err();
    assert!(matches!(error, TensorError::UnsupportedDType { op: "conv2d", dtype: DType::I64, .. }), "{error:?}");
    let error = x.conv2d(&w.to(Device::cpu(1)).unwrap(), None, p).unwrap_err();
    assert!(
        matches!(error, TensorError::DeviceMismatch { op: "conv2d", lhs: Device::Cpu(0), rhs: Device::Cpu(1) }),
        "{error:?}"
    );
    // The message says how to fix it.
    assert_eq!(
        error.to_string(),
        "conv2d: operands are on different devices, cpu:0 and cpu:1; move one with .to(&device)"
    );
    let gy = tensor(&[1, 4, 3, 3], DType::F32, 0);
    assert_eq!(
        shape_message(gy.conv2d_backward_input(&w, [1, 3, 6, 6], p), "conv2d_backward_input"),
        "conv2d_backward_input: grad_output has shape [1, 4, 3, 3] but input [1, 3, 6, 6] and weight [4, 3, 3, 3] \
         give an output of shape [1, 4, 4, 4]"
    );
    assert_eq!(
        shape_message(x.conv2d_backward_weight(&gy, [4, 3, 2, 2], p), "conv2d_backward_weight"),
        "conv2d_backward_weight: grad_output has shape [1, 4, 3, 3] but input [1, 3, 5, 5] and weight [4, 3, 2, 2] \
         give an output of shape [1, 4, 4, 4]"
    );
    let error = gy.conv2d_backward_bias().unwrap().conv2d_backward_bias().unwrap_err();
    assert!(
        matches!(&error, TensorError::RankMismatch { op: "conv2d_backward_bias", expected: 4, got } if got == &[4]),
        "{error:?}"
    );
    // Operands together on the second logical device work there.
    let y1 = x.to(Device::cpu(1)).unwrap().conv2d(&w.to(Device::cpu(1)).unwrap(), None, p).unwrap();
    assert_eq!(y1.device(), Device::cpu(1));
}

// ----- pooling ---------------------------------------------------------------------------------------

/// Pooling windows written out: for output `(oh, ow)`, the input positions
/// (clipped to the plane) and the window's padded size.
fn windows(
    (h, w): (usize, usize),
    k: (usize, usize),
    s: (usize, usize),
    p: (usize, usize),
) -> Vec<(Vec<(usize, usize)>, usize)> {
    let oh = (h + 2 * p.0 - k.0) / s.0 + 1;
    let ow = (w + 2 * p.1 - k.1) / s.1 + 1;
    let mut out = Vec::new();
    for y in 0..oh {
        for x in 0..ow {
            let mut cells = Vec::new();
            for i in 0..k.0 {
                for j in 0..k.1 {
                    let (r, c) = ((y * s.0 + i) as isize - p.0 as isize, (x * s.1 + j) as isize - p.1 as isize);
                    if r >= 0 && c >= 0 && (r as usize) < h && (c as usize) < w {
                        cells.push((r as usize, c as usize));
                    }
                }
            }
            out.push((cells, k.0 * k.1));
        }
    }
    out
}

#[derive(Clone, Debug)]
struct Pool {
    shape: Vec<usize>,
    kernel: (usize, usize),
    stride: (usize, usize),
    padding: (usize, usize),
}

fn pool_case() -> impl Strategy<Value = (Pool, u8, u64)> {
    (
        prop::collection::vec(0usize..3, 1..=2),
        1usize..7,
        1usize..7,
        1usize..4,
        1usize..4,
        1usize..3,
        1usize..3,
        0u8..4,
        any::<u64>(),
    )
        .prop_flat_map(|(lead, h, w, kh, kw, sh, sw, layout, seed)| {
            (Just((lead, h, w, kh, kw, sh, sw, layout, seed)), 0..=kh / 2, 0..=kw / 2)
        })
        .prop_map(|((lead, h, w, kh, kw, sh, sw, layout, seed), ph, pw)| {
            let shape = [lead, vec![h, w]].concat();
            (Pool { shape, kernel: (kh, kw), stride: (sh, sw), padding: (ph, pw) }, layout, seed)
        })
        .prop_filter("the kernel must fit the padded input", |(p, ..)| {
            let r = p.shape.len();
            p.kernel.0 <= p.shape[r - 2] + 2 * p.padding.0 && p.kernel.1 <= p.shape[r - 1] + 2 * p.padding.1
        })
}

/// A pooling input laid out as `layout` (see `laid_out`), of any rank 3 or 4.
fn pool_input(shape: &[usize], dtype: DType, layout: u8, seed: u64) -> Tensor {
    let t = tensor(shape, dtype, seed);
    if shape.len() == 4 {
        laid_out(&t, layout)
    } else {
        laid_out(&t.unsqueeze(0).unwrap(), layout).squeeze(0).unwrap()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn pooling_matches_direct_loops((p, layout, seed) in pool_case()) {
        let rank = p.shape.len();
        let plane = (p.shape[rank - 2], p.shape[rank - 1]);
        let wins = windows(plane, p.kernel, p.stride, p.padding);
        for dtype in [DType::F32, DType::F64, DType::F16, DType::I64] {
            let x = pool_input(&p.shape, dtype, layout, seed);
            let xv = f64s(&x);
            let planes = xv.len() / (plane.0 * plane.1);
            let (values, indices) = x.max_pool2d(p.kernel, p.stride, p.padding).unwrap();
            prop_assert_eq!(values.dtype(), dtype);
            prop_assert_eq!(indices.dtype(), DType::I64);
            let (vv, iv) = (f64s(&values), indices.to_vec::<i64>().unwrap());
            prop_assert_eq!(vv.len(), planes * wins.len());
            for q in 0..planes {
                let base = q * plane.0 * plane.1;
                for (o, (cells, _)) in wins.iter().enumerate() {
                    // The first maximum in row-major order.
                    let (mut best, mut at) = (f64::NEG_INFINITY, usize::MAX);
                    for &(r, c) in cells {
                        let v = xv[base + r * plane.1 + c];
                        if at == usize::MAX || v > best {
                            best = v;
                            at = r * plane.1 + c;
                        }
                    }
                    prop_assert_eq!(vv[q * wins.len() + o], best);
                    prop_assert_eq!(iv[q * wins.len() + o], at as i64);
                }
            }
            if dtype == DType::I64 {
                continue;
            }
            for include in [true, false] {
                let avg = f64s(&x.avg_pool2d(p.kernel, p.stride, p.padding, include).unwrap());
                let tol = if dtype == DType::F16 { 1e-3 } else { 1e-6 };
                for q in 0..planes {
                    let base = q * plane.0 * plane.1;
                    for (o, (cells, full)) in wins.iter().enumerate() {
                        let sum: f64 = cells.iter().map(|&(r, c)| xv[base + r * plane.1 + c]).sum();
                        let expected = sum / if include { *full } else { cells.len() } as f64;
                        let got = avg[q * wins.len() + o];
                        prop_assert!((got - expected).abs() <= tol * (1.0 + expected.abs()), "{} vs {}", got, expected);
                    }
                }
                // Backward: the adjoint of the average, scattered by hand.
                let gy = tensor(values.dims(), dtype, seed + 7);
                let gyv = f64s(&gy);
                let gx = f64s(&gy.avg_pool2d_backward(p.shape.clone(), p.kernel, p.stride, p.padding, include).unwrap());
                let mut expected = vec![0.0; xv.len()];
                for q in 0..planes {
                    for (o, (cells, full)) in wins.iter().enumerate() {
                        let share = gyv[q * wins.len() + o] / if include { *full } else { cells.len() } as f64;
                        for &(r, c) in cells {
                            expected[q * plane.0 * plane.1 + r * plane.1 + c] += share;
                        }
                    }
                }
                close(&gx, &expected, if dtype == DType::F16 { 4e-3 } else { 1e-6 })?;
            }
            // Max backward: the gradient lands where the indices point.
            let gy = tensor(values.dims(), dtype, seed + 9);
            let gyv = f64s(&gy);
            let gx = f64s(&gy.max_pool2d_backward(&indices, p.shape.clone()).unwrap());
            let mut expected = vec![0.0; xv.len()];
            for (k, (&g, &i)) in gyv.iter().zip(&iv).enumerate() {
                expected[(k / wins.len()) * plane.0 * plane.1 + i as usize] += g;
            }
            close(&gx, &expected, if dtype == DType::F16 { 4e-3 } else { 1e-6 })?;
        }
    }
}

#[test]
fn pooling_gradients_match_finite_differences() {
    // Distinct values, far apart compared with the step, so the maxima do not move.
    let shape = [2, 2, 5, 6];
    let numel: usize = shape.iter().product();
    let v: Vec<f64> = (0..numel).map(|i| ((i * 37) % numel) as f64 * 0.1).collect();
    init();
    let x = Tensor::from_vec_on(v, shape.to_vec(), Device::CPU).unwrap();
    let (k, s, p) = ((3, 2), (2, 1), (1, 1));
    let (values, indices) = x.max_pool2d(k, s, p).unwrap();
    let r = random_f64(values.dims(), 3);
    let rv = f64s(&r);
    let dot = |t: &Tensor| f64s(t).iter().zip(&rv).map(|(a, b)| a * b).sum::<f64>();
    let gmax = f64s(&r.max_pool2d_backward(&indices, shape).unwrap());
    let gavg = f64s(&r.avg_pool2d_backward(shape, k, s, p, false).unwrap());
    let h = 1e-3;
    for index in 0..numel {
        let (up, down) = (nudged(&x, index, h), nudged(&x, index, -h));
        let fd_max = (dot(&up.max_pool2d(k, s, p).unwrap().0) - dot(&down.max_pool2d(k, s, p).unwrap().0)) / (2.0 * h);
        assert!((fd_max - gmax[index]).abs() < 1e-8, "max dx[{index}]: fd {fd_max}, op {}", gmax[index]);
        let fd_avg =
            (dot(&up.avg_pool2d(k, s, p, false).unwrap()) - dot(&down.avg_pool2d(k, s, p, false).unwrap())) / (2.0 * h);
        assert!((fd_avg - gavg[index]).abs() < 1e-8, "avg dx[{index}]: fd {fd_avg}, op {}", gavg[index]);
    }
}

#[test]
fn max_pool_ties_and_nan_follow_pytorch() {
    init();
    let x = Tensor::from_vec_on(vec![2.0f32, 2.0, 1.0, f32::NAN, 3.0, f32::NAN], [1, 1, 2, 3], Device::CPU).unwrap();
    let (v, i) = x.max_pool2d((1, 3), (1, 3), (0, 0)).unwrap();
    let v = v.to_vec::<f32>().unwrap();
    assert_eq!(v[0], 2.0);
    assert!(v[1].is_nan());
    assert_eq!(i.to_vec::<i64>().unwrap(), [0, 5]);
}

#[test]
fn pool_errors_name_the_values() {
    let x = tensor(&[1, 2, 5, 5], DType::F32, 0);
    assert_eq!(
        invalid_message(x.avg_pool2d((2, 2), (2, 2), (0, 2), true), "avg_pool2d"),
        "avg_pool2d: input [1, 2, 5, 5] with kernel (2, 2), stride (2, 2), padding (0, 2): width: padding 2 must be \
         at most half the kernel size 2 (1)"
    );
    assert_eq!(
        invalid_message(x.max_pool2d((6, 2), (1, 1), (0, 0)), "max_pool2d"),
        "max_pool2d: input [1, 2, 5, 5] with kernel (6, 2), stride (1, 1), padding (0, 0): height: kernel 6 is larger \
         than the padded input (5 + 2 x 0 = 5)"
    );
    let message = invalid_message(x.max_pool2d((2, 2), (0, 2), (0, 0)), "max_pool2d");
    assert!(message.contains("stride 0 must be positive"), "{message}");
    let message =
        invalid_message(tensor(&[1, 2, 0, 5], DType::F32, 0).max_pool2d((1, 1), (1, 1), (0, 0)), "max_pool2d");
    assert!(message.contains("the input has size 0"), "{message}");
    // bool has no order: refused by name (an `Invalid`, not an `UnsupportedDType`).
    let bools = x.to_dtype(DType::Bool).unwrap();
    invalid_message(bools.max_pool2d((2, 2), (2, 2), (0, 0)), "max_pool2d");
    let error = x.to_dtype(DType::I64).unwrap().avg_pool2d((2, 2), (2, 2), (0, 0), true).unwrap_err();
    assert!(matches!(error, TensorError::UnsupportedDType { op: "avg_pool2d", dtype: DType::I64, .. }), "{error:?}");
    let (v, i) = x.max_pool2d((2, 2), (2, 2), (0, 0)).unwrap();
    let error = v.max_pool2d_backward(&i.to_dtype(DType::F32).unwrap(), [1, 2, 5, 5]).unwrap_err();
    assert!(
        matches!(
            error,
            TensorError::DTypeMismatch { op: "max_pool2d_backward", expected: DType::I64, got: DType::F32 }
        ),
        "{error:?}"
    );
    assert_eq!(
        shape_message(v.max_pool2d_backward(&i.narrow(3, 0, 1).unwrap(), [1, 2, 5, 5]), "max_pool2d_backward"),
        "max_pool2d_backward: indices have shape [1, 2, 2, 1] but grad_output has shape [1, 2, 2, 2]"
    );
    let message = shape_message(v.max_pool2d_backward(&i, [1, 3, 5, 5]), "max_pool2d_backward");
    assert!(message.contains("input shape [1, 3, 5, 5] does not fit"), "{message}");
    // Indices that point outside the input plane are an error, not a wild write.
    let wild = v.max_pool2d_backward(&i, [1, 2, 2, 2]).unwrap_err();
    assert!(
        matches!(
            &wild,
            TensorError::Kernel { op: "max_pool2d_backward", source: KernelError::ShapeMismatch { detail } }
                if detail.ends_with(" is outside an input plane of 4 elements")
        ),
        "{wild:?}"
    );
    assert_eq!(
        shape_message(v.avg_pool2d_backward([1, 2, 6, 6], (2, 2), (2, 2), (0, 0), true), "avg_pool2d_backward"),
        "avg_pool2d_backward: grad_output has shape [1, 2, 2, 2] but pooling an input of shape [1, 2, 6, 6] gives [1, 2, 3, 3]"
    );
    let error = v.max_pool2d_backward(&i.to(Device::cpu(1)).unwrap(), [1, 2, 5, 5]).unwrap_err();
    assert!(
        matches!(
            error,
            TensorError::DeviceMismatch { op: "max_pool2d_backward", lhs: Device::Cpu(0), rhs: Device::Cpu(1) }
        ),
        "{error:?}"
    );
}
