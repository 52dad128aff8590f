//! A NaN or an infinity stays in its windows: for every pooling op and its
//! gradient, a non-finite value placed at each input (or output-gradient)
//! position in turn changes exactly the outputs whose window holds that
//! position, as PyTorch's loops do, and leaves every other output bit for
//! bit as it was. Which windows hold a position is found from the op
//! itself, by raising that position by a large finite amount. On the host,
//! and on `cuda:0` when there is one (skipped with one line otherwise).

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_tensor::{DType, Device, Pool2dParams, Tensor};

const SHAPE: [usize; 4] = [2, 2, 5, 4];

fn values(t: &Tensor) -> Vec<f64> {
    t.to(Device::CPU).unwrap().to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

/// The host, and `cuda:0` when present.
fn devices() -> Vec<Device> {
    if brasa_tensor::cuda_device_count() == 0 {
        eprintln!(
            "skipped on CUDA: no CUDA device{}",
            if cfg!(feature = "cuda") { "" } else { " (built without the `cuda` feature)" }
        );
        return vec![Device::CPU];
    }
    vec![Device::CPU, Device::cuda(0)]
}

/// Finite, distinct values of `shape` as `dtype`.
fn base(shape: &[usize], dtype: DType) -> Vec<f64> {
    let n: usize = shape.iter().product();
    (0..n)
        .map(|i| ((i * 37) % n) as f64 * 0.125 - 2.0)
        .collect::<Vec<_>>()
        .into_iter()
        .map(|v| round(v, dtype))
        .collect()
}

fn round(v: f64, dtype: DType) -> f64 {
    Tensor::from_vec(vec![v], [1])
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec::<f64>()
        .unwrap()[0]
}

fn tensor(v: &[f64], shape: &[usize], dtype: DType, device: Device) -> Tensor {
    Tensor::from_vec_on(v.to_vec(), shape.to_vec(), device).unwrap().to_dtype(dtype).unwrap()
}

/// Same bits, NaN equal to NaN.
fn same(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Puts NaN, +inf and -inf at every position of an input of `shape` in
/// turn and checks that `op` changes only the outputs whose window holds
/// it (NaN there for a NaN, non-finite for +inf), every other output
/// unchanged. `what` names the case.
fn sweep(what: &str, shape: &[usize], dtype: DType, op: &dyn Fn(&Tensor) -> Tensor) {
    for device in devices() {
        sweep_on(&format!("{what} on {device}"), shape, dtype, device, op);
    }
}

fn sweep_on(what: &str, shape: &[usize], dtype: DType, device: Device, op: &dyn Fn(&Tensor) -> Tensor) {
    let clean = base(shape, dtype);
    let baseline = values(&op(&tensor(&clean, shape, dtype, device)));
    for position in 0..clean.len() {
        let mut bumped = clean.clone();
        bumped[position] += 1000.0;
        let bumped = values(&op(&tensor(&bumped, shape, dtype, device)));
        let holds: Vec<bool> = bumped.iter().zip(&baseline).map(|(b, a)| !same(*a, *b)).collect();
        for poison in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let mut poisoned = clean.clone();
            poisoned[position] = poison;
            let got = values(&op(&tensor(&poisoned, shape, dtype, device)));
            for (o, ((g, b), held)) in got.iter().zip(&baseline).zip(&holds).enumerate() {
                let here = format!("{what} {dtype}: {poison} at input {position}, output {o}");
                if !held {
                    assert!(same(*g, *b), "{here} is outside the windows but changed from {b} to {g}");
                } else if poison.is_nan() {
                    assert!(g.is_nan(), "{here}: {g}, want NaN");
                } else if poison > 0.0 {
                    assert!(!g.is_finite(), "{here}: {g}, want non-finite");
                }
            }
        }
    }
}

fn pool_params() -> Vec<Pool2dParams> {
    let mut all = Vec::new();
    for (kernel, stride) in [((2, 2), (2, 2)), ((3, 3), (1, 1)), ((3, 2), (2, 1)), ((1, 1), (2, 2))] {
        for padding in [(0, 0), (1, 1)] {
            for ceil in [false, true] {
                if padding.0 * 2 <= kernel.0 && padding.1 * 2 <= kernel.1 {
                    all.push(Pool2dParams::new(kernel).with_stride(stride).with_padding(padding).with_ceil_mode(ceil));
                }
            }
        }
    }
    all
}

const ADAPTIVE_SIZES: [(usize, usize); 6] = [(1, 1), (2, 3), (3, 2), (5, 4), (7, 5), (4, 9)];

#[test]
fn adaptive_average_pooling_keeps_a_nan_in_its_windows() {
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        for size in ADAPTIVE_SIZES {
            sweep(&format!("adaptive_avg_pool2d {size:?}"), &SHAPE, dtype, &|x| x.adaptive_avg_pool2d(size).unwrap());
        }
    }
    // 3-d input.
    sweep("adaptive_avg_pool2d [C, H, W]", &[3, 4, 6], DType::F32, &|x| x.adaptive_avg_pool2d((3, 4)).unwrap());
}

#[test]
fn adaptive_average_pooling_gradient_keeps_a_nan_in_its_windows() {
    for dtype in [DType::F32, DType::F64] {
        for size in ADAPTIVE_SIZES {
            let grad_shape = [SHAPE[0], SHAPE[1], size.0, size.1];
            sweep(&format!("adaptive_avg_pool2d_backward {size:?}"), &grad_shape, dtype, &|g| {
                g.adaptive_avg_pool2d_backward(SHAPE).unwrap()
            });
        }
    }
}

#[test]
fn adaptive_max_pooling_keeps_a_nan_in_its_windows() {
    for dtype in [DType::F32, DType::F64] {
        for size in ADAPTIVE_SIZES {
            sweep(&format!("adaptive_max_pool2d {size:?}"), &SHAPE, dtype, &|x| x.adaptive_max_pool2d(size).unwrap().0);
        }
    }
}

#[test]
fn max_and_average_pooling_keep_a_nan_in_their_windows() {
    for dtype in [DType::F32, DType::F64] {
        for params in pool_params() {
            sweep(&format!("max_pool2d {params:?}"), &SHAPE, dtype, &|x| x.max_pool2d_with(params).unwrap().0);
            for include_pad in [false, true] {
                sweep(&format!("avg_pool2d {params:?} count_include_pad {include_pad}"), &SHAPE, dtype, &|x| {
                    x.avg_pool2d_with(params, include_pad).unwrap()
                });
            }
        }
    }
}

#[test]
fn max_and_average_pooling_gradients_keep_a_nan_in_their_windows() {
    for params in pool_params() {
        let x = tensor(&base(&SHAPE, DType::F64), &SHAPE, DType::F64, Device::CPU);
        let (out, indices) = x.max_pool2d_with(params).unwrap();
        let grad_shape = out.dims().to_vec();
        sweep(&format!("max_pool2d_backward {params:?}"), &grad_shape, DType::F64, &|g| {
            g.max_pool2d_backward(&indices.to(g.device()).unwrap(), SHAPE).unwrap()
        });
        for include_pad in [false, true] {
            sweep(&format!("avg_pool2d_backward {params:?} {include_pad}"), &grad_shape, DType::F64, &|g| {
                g.avg_pool2d_backward_with(SHAPE, params, include_pad).unwrap()
            });
        }
    }
}
