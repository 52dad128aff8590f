//! cuDNN convolutions on `cuda:0` against the host's (`Device::Cpu`):
//! NCHW and channels-last, stride, padding, dilation, groups (depthwise
//! too), transposed and 1-d, odd sizes, batch 1; forward and both
//! gradients; f32 to 1e-5 relative (no TF32), bf16 and f16 within twice the
//! host's own low-precision error; benchmark mode's algorithm cache,
//! deterministic weight gradients, workspaces in the memory statistics.
//!
//! The settings in `brasa_tensor::cudnn` are process-wide, so everything
//! runs in one test, in order. Without a CUDA device, or without cuDNN, it
//! prints one line and passes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use brasa_tensor::{
    cudnn, memory, Conv1dParams, Conv2dParams, ConvTranspose1dParams, ConvTranspose2dParams, DType, Device, Generator,
    Tensor,
};

/// A host tensor of uniform values in [-1, 1) drawn from `seed`.
fn host(shape: &[usize], seed: u64) -> Tensor {
    let mut values = vec![0f32; shape.iter().product()];
    Generator::new(seed).fill_uniform_f32(&mut values, -1.0, 1.0).unwrap();
    Tensor::from_vec_on(values, shape.to_vec(), Device::CPU).unwrap()
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to(Device::CPU).unwrap().to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()
}

/// Largest absolute difference.
fn max_error(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter().zip(want).map(|(g, w)| (g - w).abs()).fold(0.0, f64::max)
}

/// `got` matches `want` to `rel` relative to `want`'s largest magnitude
/// (sums of mixed signs make element-wise relative error meaningless).
fn assert_close(got: &Tensor, want: &Tensor, rel: f64, what: &str) {
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    let (g, w) = (f64s(got), f64s(want));
    let scale = w.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-30);
    let err = max_error(&g, &w);
    assert!(err <= rel * scale, "{what}: max error {err:e} > {rel:e} x {scale:e}");
}

/// One 2-d convolution to check.
#[derive(Clone, Copy, Debug)]
struct Case {
    input: [usize; 4],
    c_out: usize,
    kernel: (usize, usize),
    params: Conv2dParams,
}

impl Case {
    fn weight(&self) -> [usize; 4] {
        [self.c_out, self.input[1] / self.params.groups, self.kernel.0, self.kernel.1]
    }
}

fn cases() -> Vec<Case> {
    let p = Conv2dParams::new;
    vec![
        // 3x3, padding 1: the common layer.
        Case { input: [2, 3, 8, 7], c_out: 9, kernel: (3, 3), params: p().with_padding((1, 1)) },
        // Odd sizes, uneven stride and padding, a rectangular kernel.
        Case { input: [3, 5, 11, 13], c_out: 6, kernel: (3, 5), params: p().with_stride((2, 3)).with_padding((2, 1)) },
        // Dilation.
        Case { input: [2, 4, 10, 9], c_out: 4, kernel: (3, 3), params: p().with_padding((2, 2)).with_dilation((2, 3)) },
        // Groups.
        Case {
            input: [2, 6, 7, 7],
            c_out: 4,
            kernel: (3, 3),
            params: p().with_stride((1, 2)).with_padding((1, 1)).with_groups(2),
        },
        // Depthwise.
        Case { input: [2, 8, 9, 9], c_out: 8, kernel: (3, 3), params: p().with_padding((1, 1)).with_groups(8) },
        // Batch 1, 1x1 kernel.
        Case { input: [1, 16, 5, 5], c_out: 32, kernel: (1, 1), params: p() },
    ]
}

/// Forward (with bias) and both gradients of `case` on `dev` against the
/// host, with the operands channels-last or not; the outputs (the weight
/// gradient too) keep the input's memory format.
fn check_case(dev: Device, case: Case, channels_last: bool, seed: u64) {
    let what = format!("{case:?} channels_last={channels_last}");
    let (x, w, b) = (host(&case.input, seed), host(&case.weight(), seed + 1), host(&[case.c_out], seed + 2));
    let y = x.conv2d(&w, Some(&b), case.params).unwrap();
    let gy = host(y.dims(), seed + 3);
    let gx = gy.conv2d_backward_input(&w, x.dims(), case.params).unwrap();
    let gw = x.conv2d_backward_weight(&gy, w.dims(), case.params).unwrap();

    let to = |t: &Tensor| {
        let t = t.to(dev).unwrap();
        if channels_last {
            t.to_channels_last().unwrap()
        } else {
            t
        }
    };
    let (dx_, dw_, db_, dgy) = (to(&x), to(&w), b.to(dev).unwrap(), to(&gy));
    let dy = dx_.conv2d(&dw_, Some(&db_), case.params).unwrap();
    assert_close(&dy, &y, 1e-5, &format!("forward {what}"));
    let dgx = dgy.conv2d_backward_input(&dw_, x.dims(), case.params).unwrap();
    assert_close(&dgx, &gx, 1e-5, &format!("input gradient {what}"));
    let dgw = dx_.conv2d_backward_weight(&dgy, w.dims(), case.params).unwrap();
    assert_close(&dgw, &gw, 1e-5, &format!("weight gradient {what}"));
    // The memory format is cuDNN's promise (im2col gives NCHW); the weight
    // gradient is channels-last with channels-last operands, as PyTorch's.
    if channels_last && cudnn::enabled() && case.input[1] > 1 && dy.dims()[2] * dy.dims()[3] > 1 {
        assert!(dy.is_channels_last() && !dy.is_contiguous(), "forward {what}: strides {:?}", dy.strides());
        assert!(dgx.is_channels_last() && !dgx.is_contiguous(), "input gradient {what}: strides {:?}", dgx.strides());
        assert!(dgw.is_channels_last(), "weight gradient {what}: strides {:?}", dgw.strides());
    }
    if !channels_last {
        assert!(dy.is_contiguous() && dgx.is_contiguous(), "{what}: NCHW in, NCHW out");
        assert!(dgw.is_contiguous(), "weight gradient {what}: strides {:?}", dgw.strides());
    }
}

fn transposed_and_one_d(dev: Device) {
    let p = ConvTranspose2dParams::new()
        .with_stride((2, 2))
        .with_padding((1, 0))
        .with_output_padding((1, 1))
        .with_dilation((2, 1))
        .with_groups(2);
    let (x, w, b) = (host(&[2, 4, 5, 6], 51), host(&[4, 3, 2, 3], 52), host(&[6], 53));
    let y = x.conv_transpose2d(&w, Some(&b), p).unwrap();
    let on = |t: &Tensor| t.to(dev).unwrap();
    assert_close(&on(&x).conv_transpose2d(&on(&w), Some(&on(&b)), p).unwrap(), &y, 1e-5, "conv_transpose2d");
    let g = host(y.dims(), 54);
    let gx = g.conv_transpose2d_backward_input(&w, x.dims(), p).unwrap();
    let dgx = on(&g).conv_transpose2d_backward_input(&on(&w), x.dims(), p).unwrap();
    assert_close(&dgx, &gx, 1e-5, "conv_transpose2d input gradient");
    let gw = x.conv_transpose2d_backward_weight(&g, w.dims(), p).unwrap();
    let dgw = on(&x).conv_transpose2d_backward_weight(&on(&g), w.dims(), p).unwrap();
    assert_close(&dgw, &gw, 1e-5, "conv_transpose2d weight gradient");

    let (x, w) = (host(&[2, 4, 19], 61), host(&[6, 2, 3], 62));
    let p = Conv1dParams::new().with_stride(2).with_padding(1).with_dilation(2).with_groups(2);
    assert_close(&on(&x).conv1d(&on(&w), None, p).unwrap(), &x.conv1d(&w, None, p).unwrap(), 1e-5, "conv1d");
    let wt = host(&[4, 3, 3], 63);
    let p = ConvTranspose1dParams::new().with_stride(2).with_padding(1).with_output_padding(1);
    let want = x.conv_transpose1d(&wt, None, p).unwrap();
    assert_close(&on(&x).conv_transpose1d(&on(&wt), None, p).unwrap(), &want, 1e-5, "conv_transpose1d");
}

/// cuDNN in `dtype` is within twice the error of the host's convolution in
/// `dtype` (the naive low-precision composition), both against f64.
fn low_precision(dev: Device, dtype: DType) {
    let case = cases()[1];
    // Inputs representable in `dtype`, so every side starts from the same
    // numbers.
    let x = host(&case.input, 71).to_dtype(dtype).unwrap();
    let w = host(&case.weight(), 72).to_dtype(dtype).unwrap();
    let x64 = x.to_dtype(DType::F64).unwrap();
    let w64 = w.to_dtype(DType::F64).unwrap();
    let reference = f64s(&x64.conv2d(&w64, None, case.params).unwrap());
    let naive = f64s(&x.conv2d(&w, None, case.params).unwrap());
    let ours = x.to(dev).unwrap().conv2d(&w.to(dev).unwrap(), None, case.params).unwrap();
    assert_eq!(ours.dtype(), dtype);
    let (e_ours, e_naive) = (max_error(&f64s(&ours), &reference), max_error(&naive, &reference));
    assert!(e_ours <= 2.0 * e_naive.max(1e-6), "{dtype:?} forward: cuDNN error {e_ours:e}, host {e_naive:e}");

    let gy = host(case.params.output_shape(&case.input, &case.weight()).unwrap().dims(), 73).to_dtype(dtype).unwrap();
    let gy64 = gy.to_dtype(DType::F64).unwrap();
    let reference = f64s(&x64.conv2d_backward_weight(&gy64, w.dims(), case.params).unwrap());
    let naive = f64s(&x.conv2d_backward_weight(&gy, w.dims(), case.params).unwrap());
    let ours = x.to(dev).unwrap().conv2d_backward_weight(&gy.to(dev).unwrap(), w.dims(), case.params).unwrap();
    let (e_ours, e_naive) = (max_error(&f64s(&ours), &reference), max_error(&naive, &reference));
    assert!(e_ours <= 2.0 * e_naive.max(1e-6), "{dtype:?} weight gradient: cuDNN error {e_ours:e}, host {e_naive:e}");
}

/// Benchmark mode: the first call of a configuration searches and
/// remembers one algorithm per direction; the same call again reuses it.
fn benchmark_cache(dev: Device) {
    cudnn::set_benchmark(true);
    let case = Case {
        input: [4, 12, 17, 15],
        c_out: 20,
        kernel: (3, 3),
        params: Conv2dParams::new().with_padding((1, 1)).with_stride((2, 1)),
    };
    // The graph API keeps plans, the legacy API algorithm choices.
    let count = if cudnn::graph_api() { cudnn::cached_graph_plan_count } else { cudnn::cached_algorithm_count };
    let before = count();
    check_case(dev, case, false, 81);
    assert_eq!(count(), before + 3, "one choice per direction");
    check_case(dev, case, false, 82);
    assert_eq!(count(), before + 3, "the second run reuses the choices");
    check_case(dev, case, true, 83);
    assert_eq!(count(), before + 6, "channels-last is its own configuration");
    cudnn::set_benchmark(false);
}

/// Deterministic mode: the weight gradient of a large batch (where
/// atomics would reorder the sums) is bit-identical over two runs, with
/// heuristics and with a benchmark search.
fn deterministic_weight_gradients(dev: Device) {
    cudnn::set_deterministic(true);
    let params = Conv2dParams::new().with_padding((1, 1));
    let x = host(&[32, 16, 24, 24], 91).to(dev).unwrap();
    let gy = host(&[32, 16, 24, 24], 92).to(dev).unwrap();
    for benchmark in [false, true] {
        cudnn::set_benchmark(benchmark);
        let run = || x.conv2d_backward_weight(&gy, [16, 16, 3, 3], params).unwrap().to_vec::<f32>().unwrap();
        let (a, b) = (run(), run());
        assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()), "benchmark={benchmark}: not bit-identical");
        let w = host(&[16, 16, 3, 3], 93).to(dev).unwrap();
        let run = || gy.conv2d_backward_input(&w, [32, 16, 24, 24], params).unwrap().to_vec::<f32>().unwrap();
        let (a, b) = (run(), run());
        assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()), "input gradient not bit-identical");
    }
    cudnn::set_benchmark(false);
    cudnn::set_deterministic(false);
}

/// Workspaces come from the caching allocator: while a convolution runs the
/// peak exceeds what the operands and the output hold, and once the output
/// is dropped everything is back.
fn workspace_memory(dev: Device) {
    let params = Conv2dParams::new().with_padding((2, 2));
    let x = host(&[8, 32, 40, 40], 101).to(dev).unwrap();
    let w = host(&[64, 32, 5, 5], 102).to(dev).unwrap();
    for benchmark in [false, true] {
        cudnn::set_benchmark(benchmark);
        brasa_tensor::synchronize(dev).unwrap();
        let baseline = memory::allocated(dev).unwrap();
        memory::reset_peak(dev).unwrap();
        let y = x.conv2d(&w, None, params).unwrap();
        let gw = x.conv2d_backward_weight(&y, w.dims(), params).unwrap();
        brasa_tensor::synchronize(dev).unwrap();
        let outputs = (y.numel() + gw.numel()) * 4;
        let peak = memory::max_allocated(dev).unwrap();
        assert!(peak >= baseline + outputs, "peak {peak} < baseline {baseline} + outputs {outputs}");
        if benchmark {
            // The search's workspace (the largest any algorithm asks for)
            // came from the allocator too.
            assert!(peak > baseline + outputs, "benchmark: no workspace in the statistics (peak {peak})");
        }
        drop((y, gw));
        brasa_tensor::synchronize(dev).unwrap();
        assert_eq!(memory::allocated(dev).unwrap(), baseline, "benchmark={benchmark}: workspace not freed");
        println!("benchmark={benchmark}: peak {} bytes over baseline, outputs {outputs}", peak - baseline);
    }
    cudnn::set_benchmark(false);
}

#[test]
fn cudnn_convolutions_match_the_host() {
    let Some(dev) = support::gpu() else { return };
    if !cudnn::is_available() {
        eprintln!("skipped: cuDNN unavailable ({})", cudnn::load_error().map(|e| e.to_string()).unwrap_or_default());
        return;
    }
    println!("cuDNN {:?}", cudnn::version());
    // Every check through the legacy API, then through the graph API.
    let default_api = cudnn::graph_api();
    for graph in [false, true] {
        cudnn::set_graph_api(graph);
        let plans = cudnn::cached_graph_plan_count();
        for (i, case) in cases().into_iter().enumerate() {
            for channels_last in [false, true] {
                check_case(dev, case, channels_last, 10 * i as u64);
            }
        }
        transposed_and_one_d(dev);
        low_precision(dev, DType::BF16);
        low_precision(dev, DType::F16);
        benchmark_cache(dev);
        deterministic_weight_gradients(dev);
        workspace_memory(dev);
        let planned = cudnn::cached_graph_plan_count() - plans;
        println!("graph API {graph}: {planned} execution plans made");
        if graph {
            assert!(planned > 0, "the graph API planned nothing: every convolution fell back to the legacy API");
        } else {
            assert_eq!(planned, 0, "the legacy API made graph plans");
        }
    }
    cudnn::set_graph_api(default_api);
    // Disabled: the im2col path, still the host's values.
    cudnn::set_enabled(false);
    check_case(dev, cases()[3], true, 111);
    cudnn::set_enabled(true);
}
