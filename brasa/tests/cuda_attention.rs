//! Fused attention on CUDA (feature `cuda`, a GPU present) against the f64
//! composition on the host, forward and every gradient, with
//! FlashAttention-2's criterion: the fused kernels' error against f64 is at
//! most twice the error of the naive composition in the same half dtype
//! (`q·kᵀ`, softmax and `p·v` each rounded to f16/bf16, as PyTorch's math
//! backend computes it). Over head dims (64, 128, and widths that are
//! zero-padded or not multiples of 8), lengths (L = 1, S not a multiple of
//! the tile, L ≠ S), bool and additive masks, causal, batch and head
//! counts; dropout through the identity-value trick (the output reveals
//! the kept probabilities, so the mask is known and the gradients can be
//! checked). Skips with one line where there is no GPU.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa::autograd::{SdpaOptions, Var};
use brasa::tensor::{cuda_device_count, manual_seed, rng_state, set_rng_state, DType, Device, Tensor};

const GPU: Device = Device::cuda(0);

/// The generator is process-wide: tests that seed it and replay its state
/// take turns (libtest runs them on several threads).
static GENERATOR: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// This test's turn with the generator, or `None` (said once) without a GPU.
fn gpu() -> Option<std::sync::MutexGuard<'static, ()>> {
    if cuda_device_count() == 0 {
        eprintln!("skipped: no CUDA device (or no driver)");
        return None;
    }
    Some(GENERATOR.lock().unwrap_or_else(|e| e.into_inner()))
}

/// What one case runs.
#[derive(Clone, Debug)]
struct Case {
    dims: Vec<usize>,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
    causal: bool,
    /// 0: none, 1: bool `[L, S]`, 2: additive broadcast over heads `[N, 1, L, S]`.
    mask: u8,
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to(Device::CPU).unwrap().to_vec::<f64>().unwrap()
}

fn max_error(a: &[f64], reference: &[f64]) -> f64 {
    assert_eq!(a.len(), reference.len());
    a.iter().zip(reference).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

/// The case's mask on the host (f64 for additive), every row keeping at
/// least one key.
fn mask_for(case: &Case) -> Option<Tensor> {
    let (l, s) = (case.l, case.s);
    match case.mask {
        1 => {
            let keep: Vec<u8> = (0..l * s).map(|i| u8::from(i % s == 0 || (i * 7 + i / s * 3) % 5 != 0)).collect();
            Some(Tensor::from_vec(keep, [l, s]).unwrap().to_dtype(DType::Bool).unwrap())
        }
        2 => {
            let n = case.dims[0];
            let add: Vec<f64> = (0..n * l * s).map(|i| ((i * 13) % 11) as f64 / 4.0 - 1.0).collect();
            Some(Tensor::from_vec(add, [n, 1, l, s]).unwrap())
        }
        _ => None,
    }
}

/// Output and the gradients of q, k, v.
fn run(q: &Tensor, k: &Tensor, v: &Tensor, grad: &Tensor, options: &SdpaOptions) -> [Vec<f64>; 4] {
    let (q, k, v) = (Var::param(q.clone()).unwrap(), Var::param(k.clone()).unwrap(), Var::param(v.clone()).unwrap());
    let out = q.scaled_dot_product_attention(&k, &v, options).unwrap();
    out.backward_with(grad).unwrap();
    [values(out.tensor()), values(&q.grad().unwrap()), values(&k.grad().unwrap()), values(&v.grad().unwrap())]
}

/// The naive composition in `q`'s dtype, every product and the softmax
/// rounded to it.
fn run_naive(q: &Tensor, k: &Tensor, v: &Tensor, grad: &Tensor, case: &Case, scale: f64) -> [Vec<f64>; 4] {
    let (q, k, v) = (Var::param(q.clone()).unwrap(), Var::param(k.clone()).unwrap(), Var::param(v.clone()).unwrap());
    let dtype = q.dtype();
    let mut scores = q.matmul(&k.transpose(-2, -1).unwrap()).unwrap().mul_scalar(scale).unwrap();
    let hidden = |allowed: &Tensor| {
        allowed
            .where_cond(
                &Tensor::zeros([], DType::F64).unwrap(),
                &Tensor::full([], f64::NEG_INFINITY, DType::F64).unwrap(),
            )
            .unwrap()
    };
    let additive = match (mask_for(case), case.causal) {
        (Some(m), _) if m.dtype() == DType::Bool => Some(hidden(&m)),
        (Some(m), _) => Some(m),
        (None, true) => {
            let i =
                Tensor::arange(0.0, case.l as f64, 1.0, DType::I64).unwrap().reshape(&[case.l as isize, 1]).unwrap();
            let j =
                Tensor::arange(0.0, case.s as f64, 1.0, DType::I64).unwrap().reshape(&[1, case.s as isize]).unwrap();
            Some(hidden(&j.le(&i).unwrap()))
        }
        (None, false) => None,
    };
    if let Some(m) = additive {
        scores = scores.add(&Var::new(m.to_dtype(dtype).unwrap())).unwrap();
    }
    let out = scores.softmax(-1).unwrap().matmul(&v).unwrap();
    out.backward_with(grad).unwrap();
    [values(out.tensor()), values(&q.grad().unwrap()), values(&k.grad().unwrap()), values(&v.grad().unwrap())]
}

fn check_case(case: &Case, dtype: DType, seed: u64) {
    manual_seed(seed);
    let mut qd = case.dims.clone();
    qd.extend([case.l, case.e]);
    let mut kd = case.dims.clone();
    kd.extend([case.s, case.e]);
    let mut vd = case.dims.clone();
    vd.extend([case.s, case.ev]);
    let mut od = case.dims.clone();
    od.extend([case.l, case.ev]);
    // Operands exactly representable in the half dtype, so all three runs
    // see the same numbers.
    let make = |d: &[usize]| Tensor::randn(d, DType::F32).unwrap().to_dtype(dtype).unwrap();
    let (q, k, v, g) = (make(&qd), make(&kd), make(&vd), make(&od));
    let scale = 1.0 / (case.e as f64).sqrt();
    let mut options = SdpaOptions::new().causal(case.causal);
    if let Some(m) = mask_for(case) {
        options = options.attn_mask(m);
    }
    let f64s = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
    let reference = run(&f64s(&q), &f64s(&k), &f64s(&v), &f64s(&g), &options);
    let naive = run_naive(&q, &k, &v, &g, case, scale);
    let gpu_options = match &options.attn_mask {
        Some(m) => SdpaOptions { attn_mask: Some(m.to(GPU).unwrap()), ..options.clone() },
        None => options.clone(),
    };
    let on_gpu = |t: &Tensor| t.to(GPU).unwrap();
    let fused = run(&on_gpu(&q), &on_gpu(&k), &on_gpu(&v), &on_gpu(&g), &gpu_options);
    for (i, name) in ["out", "dq", "dk", "dv"].iter().enumerate() {
        let (ours, theirs) = (max_error(&fused[i], &reference[i]), max_error(&naive[i], &reference[i]));
        assert!(fused[i].iter().all(|x| x.is_finite()), "{case:?} {dtype} {name}: not finite");
        assert!(
            ours <= 2.0 * theirs + 1e-6,
            "{case:?} {dtype} {name}: fused error {ours:.3e} > 2 × naive {theirs:.3e}"
        );
    }
}

#[test]
fn fused_attention_meets_flash_attention_2s_criterion() {
    let Some(_turn) = gpu() else {
        return;
    };
    let c = |dims: &[usize], l, s, e, ev, causal, mask| Case { dims: dims.to_vec(), l, s, e, ev, causal, mask };
    let cases = [
        c(&[2, 3], 128, 128, 64, 64, false, 0),
        c(&[2, 3], 128, 128, 64, 64, true, 0),
        c(&[1, 2], 100, 100, 128, 128, false, 0),
        c(&[1, 2], 100, 100, 128, 128, true, 0),
        c(&[3], 1, 37, 64, 64, false, 0),
        c(&[2, 2], 77, 200, 64, 64, false, 0),
        c(&[2, 2], 200, 77, 128, 128, true, 0),
        c(&[1, 4], 65, 129, 40, 40, false, 0),
        c(&[1, 2], 64, 64, 96, 72, false, 0),
        c(&[1, 1, 2], 33, 47, 64, 64, false, 0),
        c(&[], 50, 70, 32, 32, true, 0),
        c(&[2, 2], 96, 80, 64, 64, false, 1),
        c(&[2, 3], 70, 90, 128, 128, false, 2),
    ];
    for (i, case) in cases.iter().enumerate() {
        for dtype in [DType::BF16, DType::F16] {
            check_case(case, dtype, 100 + i as u64);
        }
    }
}

#[test]
fn rows_that_see_no_key_give_zero_and_no_nan() {
    let Some(_turn) = gpu() else {
        return;
    };
    manual_seed(3);
    let (l, s, e) = (20, 30, 64);
    let q = Tensor::randn_on([1, 2, l, e], DType::BF16, GPU).unwrap();
    let k = Tensor::randn_on([1, 2, s, e], DType::BF16, GPU).unwrap();
    let v = Tensor::randn_on([1, 2, s, e], DType::BF16, GPU).unwrap();
    // Row 5 sees nothing.
    let keep: Vec<u8> = (0..l * s).map(|i| u8::from(i / s != 5)).collect();
    let mask = Tensor::from_vec(keep, [l, s]).unwrap().to_dtype(DType::Bool).unwrap().to(GPU).unwrap();
    let (qv, kv, vv) = (Var::param(q).unwrap(), Var::param(k).unwrap(), Var::param(v).unwrap());
    let out = qv.scaled_dot_product_attention(&kv, &vv, &SdpaOptions::new().attn_mask(mask)).unwrap();
    out.sum_all().unwrap().backward().unwrap();
    let o = values(out.tensor());
    assert!(o.iter().all(|x| x.is_finite()));
    for h in 0..2 {
        assert!(o[(h * l + 5) * e..(h * l + 6) * e].iter().all(|&x| x == 0.0));
    }
    let dq = values(&qv.grad().unwrap());
    assert!(dq.iter().all(|x| x.is_finite()));
    assert!(dq[5 * e..6 * e].iter().all(|&x| x == 0.0));
    assert!(values(&kv.grad().unwrap()).iter().chain(&values(&vv.grad().unwrap())).all(|x| x.is_finite()));
}

/// With `v = I` (S = Ev) the output is the dropped, rescaled probabilities,
/// so the kept set is visible; the gradients must be those of the f64
/// composition with that mask, and a replay from the same generator state
/// must drop the same weights.
#[test]
fn dropout_keeps_one_mask_for_forward_and_backward() {
    let Some(_turn) = gpu() else {
        return;
    };
    manual_seed(11);
    let (n, h, l, s, p) = (2, 2, 48, 64, 0.3);
    let q = Tensor::randn([n, h, l, 64], DType::F32).unwrap().to_dtype(DType::BF16).unwrap();
    let k = Tensor::randn([n, h, s, 64], DType::F32).unwrap().to_dtype(DType::BF16).unwrap();
    let eye = Tensor::eye(s, DType::BF16).unwrap().broadcast_as([n, h, s, s]).unwrap().contiguous().unwrap();
    let g = Tensor::randn([n, h, l, s], DType::F32).unwrap().to_dtype(DType::BF16).unwrap();
    let options = SdpaOptions::new().dropout_p(p);
    let state = rng_state();
    let fused = run(&q.to(GPU).unwrap(), &k.to(GPU).unwrap(), &eye.to(GPU).unwrap(), &g.to(GPU).unwrap(), &options);
    set_rng_state(state);
    let again = run(&q.to(GPU).unwrap(), &k.to(GPU).unwrap(), &eye.to(GPU).unwrap(), &g.to(GPU).unwrap(), &options);
    assert_eq!(fused, again, "the same generator state must drop the same weights");
    let kept: Vec<f64> = fused[0].iter().map(|&x| f64::from(u8::from(x != 0.0))).collect();
    let rate = 1.0 - kept.iter().sum::<f64>() / kept.len() as f64;
    assert!((rate - p).abs() < 0.03, "dropped {rate:.3} of the weights, expected about {p}");
    // The f64 composition with that mask.
    let f64s = |t: &Tensor| Var::param(t.to_dtype(DType::F64).unwrap()).unwrap();
    let (qv, kv, vv) = (f64s(&q), f64s(&k), f64s(&eye));
    let keep = Var::new(Tensor::from_vec(kept, [n, h, l, s]).unwrap().mul_scalar(1.0 / (1.0 - p)).unwrap());
    let scores = qv.matmul(&kv.transpose(-2, -1).unwrap()).unwrap().mul_scalar(1.0 / 8.0).unwrap();
    let out = scores.softmax(-1).unwrap().mul(&keep).unwrap().matmul(&vv).unwrap();
    out.backward_with(&g.to_dtype(DType::F64).unwrap()).unwrap();
    let reference = [values(out.tensor()), values(&qv.grad().unwrap()), values(&kv.grad().unwrap())];
    for (i, name) in ["out", "dq", "dk"].iter().enumerate() {
        let scale = reference[i].iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let error = max_error(&fused[i], &reference[i]);
        assert!(error <= 2e-2 * scale, "{name}: error {error:.3e} against a largest value of {scale:.3e}");
    }
}

/// A bf16 `MultiheadAttention` runs the fused kernels: the profile names
/// them.
#[test]
fn multihead_attention_uses_the_fused_kernel_in_bf16() {
    let Some(_turn) = gpu() else {
        return;
    };
    use brasa::nn::{AttentionMasks, MultiheadAttention, MultiheadAttentionConfig};
    use brasa::profile::Profiler;
    manual_seed(5);
    let config = MultiheadAttentionConfig::new().dtype(DType::BF16).batch_first(true);
    let mha = MultiheadAttention::with_config(128, 2, config, GPU).unwrap();
    let x = Var::new(Tensor::randn_on([2, 40, 128], DType::BF16, GPU).unwrap());
    let profiler = Profiler::builder().start().unwrap();
    let out = mha.attend(&x, &x, &x, &AttentionMasks::new().causal(true)).unwrap();
    out.sum_all().unwrap().backward().unwrap();
    let result = profiler.stop();
    let names: Vec<String> = result.key_averages().rows().iter().map(|r| r.name.clone()).collect();
    assert!(names.iter().any(|n| n == "fused_attention"), "{names:?}");
    assert!(names.iter().any(|n| n == "fused_attention_backward"), "{names:?}");
}
