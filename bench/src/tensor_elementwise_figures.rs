//! `tensor.*` elementwise figures: a large `a + b` as users write it (a new
//! output each call) against a STREAM-style add into a preallocated buffer,
//! the latency of a tiny `a + b`, and GELU's forward and fused backward on a
//! transformer feed-forward activation (`[2048, 1024]`, f32 and bf16).

use crate::measure::{median, time, try_time, BenchResult, Better, Figure, Options};
use brasa_tensor::{DType, Device, Tensor};
use std::hint::black_box;

/// Elements of each operand of the large add: 16M f32 = 64 MiB.
const LARGE: usize = 16 << 20;
/// Elements of each operand of the small add.
const SMALL: usize = 16;

/// All figures of the group that `options` asks for.
pub fn run(options: &Options) -> BenchResult<Vec<Figure>> {
    let mut figures = Vec::new();
    if options.wants("tensor.add_f32_16m_gbs") || options.wants("tensor.add_vs_stream") {
        let (tensor_gbs, stream_gbs) = large_add(options)?;
        figures.push(Figure::new("tensor.add_f32_16m_gbs", tensor_gbs, "GB/s", Better::Higher));
        figures.push(Figure::new("tensor.add_vs_stream", tensor_gbs / stream_gbs, "x", Better::Higher));
    }
    if options.wants("tensor.small_op_ns") {
        figures.push(Figure::new("tensor.small_op_ns", small_add_ns(options)?, "ns", Better::Lower));
    }
    for (dtype, forward, backward) in [
        (DType::F32, "tensor.gelu_f32_ms", "tensor.gelu_backward_f32_ms"),
        (DType::BF16, "tensor.gelu_bf16_ms", "tensor.gelu_backward_bf16_ms"),
    ] {
        if options.wants(forward) || options.wants(backward) {
            let (forward_ms, backward_ms) = gelu_ms(options, dtype)?;
            figures.push(Figure::new(forward, forward_ms, "ms", Better::Lower));
            figures.push(Figure::new(backward, backward_ms, "ms", Better::Lower));
        }
    }
    Ok(figures)
}

/// Bytes a large add moves: two operands read, one result written.
fn large_add_bytes() -> f64 {
    (3 * LARGE * std::mem::size_of::<f32>()) as f64
}

/// Median GB/s of `c = &a + &b` on 16M f32 (new output each call; the
/// caching allocator hands back the block the previous result freed) and of
/// a STREAM-style add into a preallocated buffer, split over the same number
/// of threads in the same number of chunks. Runs interleave so both see the
/// same machine state.
fn large_add(options: &Options) -> BenchResult<(f64, f64)> {
    let a = Tensor::rand_on([LARGE], DType::F32, Device::CPU)?;
    let b = Tensor::rand_on([LARGE], DType::F32, Device::CPU)?;
    let (va, vb) = (a.to_vec::<f32>()?, b.to_vec::<f32>()?);
    let mut out = vec![0.0f32; LARGE];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    for _ in 0..2 {
        black_box((&a + &b)?);
        stream_add(&va, &vb, &mut out, threads);
    }
    let reps = options.reps(15, 3);
    let (mut ours, mut stream) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for _ in 0..reps {
        ours.push(try_time(|| (&a + &b).map(|c| drop(black_box(c))))?);
        stream.push(time(|| stream_add(&va, &vb, black_box(&mut out), threads)));
    }
    let gbs = |seconds: f64| large_add_bytes() / seconds / 1e9;
    Ok((gbs(median(&mut ours)), gbs(median(&mut stream))))
}

/// `out = a + b` with a plain slice loop, `4 * threads` chunks on `threads`
/// scoped threads (the chunking brasa-tensor's elementwise driver uses).
fn stream_add(a: &[f32], b: &[f32], out: &mut [f32], threads: usize) {
    let chunk = out.len().div_ceil(threads * 4).next_multiple_of(64);
    let mut parts: Vec<_> = out.chunks_mut(chunk).zip(a.chunks(chunk)).zip(b.chunks(chunk)).collect();
    let per_thread = parts.len().div_ceil(threads);
    std::thread::scope(|scope| {
        while !parts.is_empty() {
            let mine: Vec<_> = parts.drain(..per_thread.min(parts.len())).collect();
            scope.spawn(move || {
                for ((o, x), y) in mine {
                    for ((o, x), y) in o.iter_mut().zip(x).zip(y) {
                        *o = x + y;
                    }
                }
            });
        }
    });
}

/// Median ns of one `&a + &b` on 16-element f32 tensors, result dropped.
fn small_add_ns(options: &Options) -> BenchResult<f64> {
    let a = Tensor::rand_on([SMALL], DType::F32, Device::CPU)?;
    let b = Tensor::rand_on([SMALL], DType::F32, Device::CPU)?;
    let calls = options.reps(20_000, 2_000);
    for _ in 0..calls {
        black_box((&a + &b)?);
    }
    let mut samples: Vec<f64> = (0..options.reps(21, 5))
        .map(|_| {
            let seconds = try_time(|| {
                for _ in 0..calls {
                    black_box((black_box(&a) + black_box(&b))?);
                }
                Ok::<(), brasa_tensor::TensorError>(())
            })?;
            Ok(seconds * 1e9 / calls as f64)
        })
        .collect::<BenchResult<_>>()?;
    Ok(median(&mut samples))
}

/// The shape of the GELU figures: 16 × 128 tokens of a 1024-wide feed-forward
/// layer.
const GELU_SHAPE: [usize; 2] = [2048, 1024];

/// Median ms of `x.gelu()` and of `grad.gelu_backward(&x)` (the fused
/// backward `Var::gelu` runs) on [`GELU_SHAPE`] in `dtype`, interleaved.
fn gelu_ms(options: &Options, dtype: DType) -> BenchResult<(f64, f64)> {
    let x = Tensor::randn_on(GELU_SHAPE, DType::F32, Device::CPU)?.mul_scalar(2.0)?.to_dtype(dtype)?;
    let grad = Tensor::randn_on(GELU_SHAPE, DType::F32, Device::CPU)?.to_dtype(dtype)?;
    black_box((x.gelu()?, grad.gelu_backward(&x)?));
    let reps = options.reps(21, 5);
    let (mut forward, mut backward) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for _ in 0..reps {
        forward.push(try_time(|| x.gelu().map(|y| drop(black_box(y))))? * 1e3);
        backward.push(try_time(|| grad.gelu_backward(&x).map(|g| drop(black_box(g))))? * 1e3);
    }
    Ok((median(&mut forward), median(&mut backward)))
}
