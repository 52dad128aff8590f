//! `Var::scaled_dot_product_attention` against the naive composition
//! `softmax(q·kᵀ·scale + mask)·v` built from `Var` ops (forward and the three
//! gradients), with bool, float, broadcast and causal masks, chunks that do
//! not divide L, L ≠ S, a given scale, non-contiguous inputs, dropout
//! replayed from the generator, f64 gradchecks, and the refusals.
//!
//! Inputs are deterministic (no global generator). The two dropout tests
//! draw from it; they hold [`GENERATOR`] so that, running in parallel, one
//! cannot move the generator under the other's checks.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{gradcheck, AutogradError, Result, SdpaOptions, Var};
use brasa_tensor::{manual_seed, rng_state, set_rng_state, DType, Device, FusedAttentionConfig, Tensor};

/// Held by every test that draws from the process-wide generator.
static GENERATOR: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Deterministic values in about ±1.
fn filled(shape: &[usize], salt: f64, dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let values: Vec<f64> = (0..n).map(|i| ((i as f64 * 0.731 + salt).sin() * 1.3).sin()).collect();
    Tensor::from_vec(values, shape).unwrap().to_dtype(dtype).unwrap()
}

/// A bool mask `[l, s]` (true = attend) with a pseudo-random pattern; every
/// row keeps at least one key unless `empty_row` names it.
fn bool_mask(l: usize, s: usize, empty_row: Option<usize>) -> Tensor {
    let values: Vec<bool> = (0..l * s)
        .map(|i| {
            let (row, col) = (i / s, i % s);
            if Some(row) == empty_row {
                return false;
            }
            col == row % s || (i * 7 + 3) % 5 < 3
        })
        .collect();
    Tensor::from_vec(values, [l, s]).unwrap()
}

/// The additive form of a bool mask (0 where attended, −∞ elsewhere).
fn additive(mask: &Tensor, dtype: DType) -> Tensor {
    let zero = Tensor::zeros([], dtype).unwrap();
    let ninf = Tensor::full([], f64::NEG_INFINITY, dtype).unwrap();
    mask.where_cond(&zero, &ninf).unwrap()
}

/// The causal mask `[l, s]` as a bool tensor (key j ≤ query i).
fn causal_mask(l: usize, s: usize) -> Tensor {
    let values: Vec<bool> = (0..l * s).map(|i| i % s <= i / s).collect();
    Tensor::from_vec(values, [l, s]).unwrap()
}

/// The naive composition; `bias` is an additive mask, `drop` the dropout
/// multiplier applied to the softmax.
fn naive(q: &Var, k: &Var, v: &Var, scale: f64, bias: Option<&Tensor>, drop: Option<&Tensor>) -> Result<Var> {
    let mut scores = q.matmul(&k.transpose(-2, -1)?)?.mul_scalar(scale)?;
    if let Some(b) = bias {
        scores = scores.add(&Var::new(b.clone()))?;
    }
    let mut p = scores.softmax(-1)?;
    if let Some(d) = drop {
        p = p.mul(&Var::new(d.clone()))?;
    }
    p.matmul(v)
}

/// The output and the gradients of q, k, v of `f` for the loss Σ out ∘ w.
fn run(f: impl Fn(&Var, &Var, &Var) -> Result<Var>, inputs: [&Tensor; 3]) -> (Tensor, Vec<Tensor>) {
    let vars: Vec<Var> = inputs.iter().map(|t| Var::param((*t).clone()).unwrap()).collect();
    let out = f(&vars[0], &vars[1], &vars[2]).unwrap();
    let w = filled(out.dims(), 0.5, out.dtype());
    out.mul(&Var::new(w)).unwrap().sum_all().unwrap().backward().unwrap();
    (out.tensor().clone(), vars.iter().map(|v| v.grad().unwrap()).collect())
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.dims(), b.dims());
    let f64s = |t: &Tensor| t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap();
    let (a, b) = (f64s(a), f64s(b));
    a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

/// sdpa with `options` equals the naive composition with `bias`.
fn assert_matches_naive(inputs: [&Tensor; 3], options: &SdpaOptions, scale: f64, bias: Option<&Tensor>, tol: f64) {
    let (out, grads) = run(|q, k, v| q.scaled_dot_product_attention(k, v, options), inputs);
    let (want, want_grads) = run(|q, k, v| naive(q, k, v, scale, bias, None), inputs);
    let d = max_diff(&out, &want);
    assert!(d <= tol, "output differs by {d}");
    for (name, (g, w)) in ["q", "k", "v"].iter().zip(grads.iter().zip(&want_grads)) {
        let d = max_diff(g, w);
        assert!(d <= tol, "d{name} differs by {d}");
    }
}

fn qkv(batch: &[usize], l: usize, s: usize, e: usize, ev: usize, dtype: DType) -> [Tensor; 3] {
    let dims = |rows: usize, cols: usize| [batch, &[rows, cols]].concat();
    [filled(&dims(l, e), 0.1, dtype), filled(&dims(s, e), 1.7, dtype), filled(&dims(s, ev), 2.9, dtype)]
}

#[test]
fn plain_matches_naive_across_chunk_sizes() {
    let [q, k, v] = qkv(&[2, 3], 7, 9, 5, 4, DType::F64);
    let scale = 1.0 / 5f64.sqrt();
    for chunk in [1, 3, 7, 100] {
        assert_matches_naive([&q, &k, &v], &SdpaOptions::new().chunk_rows(chunk), scale, None, 1e-12);
    }
    // The default chunk, and a batch of rank 1 and rank 0.
    assert_matches_naive([&q, &k, &v], &SdpaOptions::new(), scale, None, 1e-12);
    let [q, k, v] = qkv(&[4], 6, 3, 2, 5, DType::F64);
    assert_matches_naive([&q, &k, &v], &SdpaOptions::new().chunk_rows(4), 1.0 / 2f64.sqrt(), None, 1e-12);
    let [q, k, v] = qkv(&[], 5, 8, 3, 3, DType::F64);
    assert_matches_naive([&q, &k, &v], &SdpaOptions::new().chunk_rows(2), 1.0 / 3f64.sqrt(), None, 1e-12);
}

#[test]
fn given_scale() {
    let [q, k, v] = qkv(&[2, 2], 5, 6, 4, 4, DType::F64);
    assert_matches_naive([&q, &k, &v], &SdpaOptions::new().scale(0.3).chunk_rows(2), 0.3, None, 1e-12);
}

#[test]
fn bool_and_float_masks_broadcast() {
    let [q, k, v] = qkv(&[2, 3], 7, 9, 5, 4, DType::F64);
    let scale = 1.0 / 5f64.sqrt();
    // A bool mask [L, S] broadcast over batch and heads.
    let mask = bool_mask(7, 9, None);
    let options = SdpaOptions::new().attn_mask(mask.clone()).chunk_rows(3);
    assert_matches_naive([&q, &k, &v], &options, scale, Some(&additive(&mask, DType::F64)), 1e-12);
    // A float mask per head [3, 1, 9] (broadcast over batch and queries).
    let float = filled(&[3, 1, 9], 4.2, DType::F64).mul_scalar(2.0).unwrap();
    let options = SdpaOptions::new().attn_mask(float.clone()).chunk_rows(4);
    assert_matches_naive([&q, &k, &v], &options, scale, Some(&float), 1e-12);
    // A full float mask [2, 3, 7, 9] with −∞ entries, in f32 (converted).
    let full = additive(&bool_mask(7, 9, None), DType::F64).add(&filled(&[2, 3, 7, 9], 0.3, DType::F64)).unwrap();
    let options = SdpaOptions::new().attn_mask(full.to_dtype(DType::F32).unwrap()).chunk_rows(5);
    let rounded = full.to_dtype(DType::F32).unwrap().to_dtype(DType::F64).unwrap();
    assert_matches_naive([&q, &k, &v], &options, scale, Some(&rounded), 1e-12);
    // A bool mask per query row only [7, 1].
    let rows = Tensor::from_vec(vec![true, false, true, true, false, true, true], [7, 1]).unwrap();
    let both = rows.where_cond(&bool_mask(7, 9, None), &Tensor::ones([], DType::Bool).unwrap()).unwrap();
    let options = SdpaOptions::new().attn_mask(both.clone()).chunk_rows(2);
    assert_matches_naive([&q, &k, &v], &options, scale, Some(&additive(&both, DType::F64)), 1e-12);
}

#[test]
fn causal_top_left_square_and_not() {
    for (l, s) in [(7, 7), (7, 9), (9, 5)] {
        let [q, k, v] = qkv(&[2, 2], l, s, 4, 3, DType::F64);
        let bias = additive(&causal_mask(l, s), DType::F64);
        for chunk in [1, 2, 4, 50] {
            let options = SdpaOptions::new().causal(true).chunk_rows(chunk);
            assert_matches_naive([&q, &k, &v], &options, 0.5, Some(&bias), 1e-12);
        }
    }
}

#[test]
fn the_hosts_fused_kernel_matches_naive_like_the_composition() {
    // No chunk_rows: f64 runs the host's fused kernel (a head at a time,
    // blocks of 64 query rows), so the cases above again, and more rows
    // than one block.
    let [q, k, v] = qkv(&[2, 3], 7, 9, 5, 4, DType::F64);
    let scale = 1.0 / 5f64.sqrt();
    let fused = q.fused_attention(&k, &v, &FusedAttentionConfig::new(scale)).unwrap();
    assert!(fused.is_some(), "the host runs f64 attention on its fused kernel");
    let mask = bool_mask(7, 9, None);
    let options = SdpaOptions::new().attn_mask(mask.clone());
    assert_matches_naive([&q, &k, &v], &options, scale, Some(&additive(&mask, DType::F64)), 1e-12);
    let float = filled(&[3, 1, 9], 4.2, DType::F64).mul_scalar(2.0).unwrap();
    assert_matches_naive([&q, &k, &v], &SdpaOptions::new().attn_mask(float.clone()), scale, Some(&float), 1e-12);
    for (l, s) in [(7, 9), (9, 5), (70, 130), (130, 70)] {
        let [q, k, v] = qkv(&[2, 2], l, s, 4, 3, DType::F64);
        let bias = additive(&causal_mask(l, s), DType::F64);
        assert_matches_naive([&q, &k, &v], &SdpaOptions::new().causal(true), 0.5, Some(&bias), 1e-12);
        assert_matches_naive([&q, &k, &v], &SdpaOptions::new(), 0.5, None, 1e-12);
    }
}

#[test]
fn f32_matches_naive_loosely() {
    let [q, k, v] = qkv(&[2, 4], 33, 40, 16, 8, DType::F32);
    let scale = 0.25;
    assert_matches_naive([&q, &k, &v], &SdpaOptions::new().chunk_rows(10), scale, None, 2e-5);
    let bias = additive(&causal_mask(33, 40), DType::F32);
    assert_matches_naive([&q, &k, &v], &SdpaOptions::new().causal(true), scale, Some(&bias), 2e-5);
}

#[test]
fn non_contiguous_inputs() {
    // [N, L, H, E] transposed to [N, H, L, E], as attention layers do.
    let q = filled(&[2, 7, 3, 5], 0.2, DType::F64).transpose(1, 2).unwrap();
    let k = filled(&[2, 6, 3, 5], 1.2, DType::F64).transpose(1, 2).unwrap();
    let v = filled(&[2, 3, 4, 6], 2.2, DType::F64).transpose(-2, -1).unwrap();
    assert!(!q.is_contiguous() && !k.is_contiguous() && !v.is_contiguous());
    let mask = bool_mask(7, 6, None);
    let options = SdpaOptions::new().attn_mask(mask.clone()).chunk_rows(3);
    assert_matches_naive([&q, &k, &v], &options, 1.0 / 5f64.sqrt(), Some(&additive(&mask, DType::F64)), 1e-12);
}

/// A query row that sees no key: output 0 and zero gradients from it,
/// where the naive composition gives NaN; the other rows are unchanged.
#[test]
fn fully_masked_row_gives_zero() {
    // Composed (chunk_rows) and on the host's fused kernel.
    for options in [SdpaOptions::new().chunk_rows(2), SdpaOptions::new()] {
        fully_masked_row_gives_zero_with(options.attn_mask(bool_mask(5, 4, Some(2))));
    }
}

fn fully_masked_row_gives_zero_with(options: SdpaOptions) {
    let [q, k, v] = qkv(&[1, 2], 5, 4, 3, 3, DType::F64);
    let mask = bool_mask(5, 4, Some(2));
    let (out, grads) = run(|q, k, v| q.scaled_dot_product_attention(k, v, &options), [&q, &k, &v]);
    let (naive_out, _) =
        run(|q, k, v| naive(q, k, v, 1.0 / 3f64.sqrt(), Some(&additive(&mask, DType::F64)), None), [&q, &k, &v]);
    let row = |t: &Tensor, i: usize| t.narrow(-2, i, 1).unwrap().to_vec::<f64>().unwrap();
    assert!(row(&naive_out, 2).iter().all(|x| x.is_nan()), "the naive composition gives NaN there");
    assert!(row(&out, 2).iter().all(|&x| x == 0.0));
    assert!(row(&grads[0], 2).iter().all(|&x| x == 0.0));
    for i in [0, 1, 3, 4] {
        let d = row(&out, i).iter().zip(row(&naive_out, i)).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(d < 1e-12, "row {i} differs by {d}");
    }
    assert!(grads.iter().all(|g| g.to_vec::<f64>().unwrap().iter().all(|x| x.is_finite())));
    // With the empty row left out of the loss, the gradients equal the
    // naive ones (which are then finite everywhere).
    let kept_rows = [0usize, 1, 3, 4];
    let loss_without_row = |f: &dyn Fn(&Var, &Var, &Var) -> Result<Var>| {
        let vars: Vec<Var> = [&q, &k, &v].iter().map(|t| Var::param((*t).clone()).unwrap()).collect();
        let out = f(&vars[0], &vars[1], &vars[2]).unwrap();
        let w = filled(out.dims(), 0.5, DType::F64);
        let rows: Vec<Var> = kept_rows.iter().map(|&i| out.narrow(-2, i, 1).unwrap()).collect();
        let weights: Vec<Tensor> = kept_rows.iter().map(|&i| w.narrow(-2, i, 1).unwrap()).collect();
        let picked = Var::cat(&rows.iter().collect::<Vec<_>>(), -2).unwrap();
        let weights = Tensor::cat(&weights.iter().collect::<Vec<_>>(), -2).unwrap();
        picked.mul(&Var::new(weights)).unwrap().sum_all().unwrap().backward().unwrap();
        vars.iter().map(|v| v.grad().unwrap()).collect::<Vec<_>>()
    };
    let bias = additive(&mask, DType::F64);
    let want = loss_without_row(&|q, k, v| naive(q, k, v, 1.0 / 3f64.sqrt(), Some(&bias), None));
    let got = loss_without_row(&|q, k, v| q.scaled_dot_product_attention(k, v, &options));
    for (g, w) in got.iter().zip(&want) {
        let d = max_diff(g, w);
        assert!(d < 1e-12, "gradient differs by {d}");
    }
}

/// Dropout: the forward and backward use the masks the generator gives
/// from the state before the call, drawn chunk by chunk; afterwards the
/// generator is where the forward left it.
#[test]
fn dropout_replays_the_forward_masks() {
    let _generator = GENERATOR.lock().unwrap_or_else(|e| e.into_inner());
    let [q, k, v] = qkv(&[2, 2], 7, 6, 4, 3, DType::F64);
    let p = 0.3;
    for causal in [false, true] {
        manual_seed(11);
        let before = rng_state();
        let options = SdpaOptions::new().dropout_p(p).causal(causal).chunk_rows(3);
        let vars: Vec<Var> = [&q, &k, &v].iter().map(|t| Var::param((*t).clone()).unwrap()).collect();
        let out = vars[0].scaled_dot_product_attention(&vars[1], &vars[2], &options).unwrap();
        let after_forward = rng_state();
        assert_ne!(before, after_forward, "the forward drew its masks");
        let w = filled(out.dims(), 0.5, DType::F64);
        out.mul(&Var::new(w.clone())).unwrap().sum_all().unwrap().backward().unwrap();
        assert_eq!(rng_state(), after_forward, "backward restored the caller's generator");

        // The same masks, drawn as the op draws them: per chunk of 3 rows,
        // over the keys that chunk sees (all of them, or up to its last row).
        set_rng_state(before);
        let mut blocks = Vec::new();
        for start in (0..7).step_by(3) {
            let rows = 3.min(7 - start);
            let keys = if causal { (start + rows).min(6) } else { 6 };
            let keep = Tensor::bernoulli_on([2, 2, rows, keys], 1.0 - p, DType::F64, Device::CPU).unwrap();
            let full = Tensor::zeros([2, 2, rows, 6], DType::F64).unwrap();
            full.narrow(-1, 0, keys).unwrap().copy_(&keep).unwrap();
            blocks.push(full.mul_scalar(1.0 / (1.0 - p)).unwrap());
        }
        let drop = Tensor::cat(&blocks.iter().collect::<Vec<_>>(), -2).unwrap();
        let kept = drop.to_vec::<f64>().unwrap().iter().filter(|&&x| x == 0.0).count();
        assert!(kept > 0 && kept < drop.numel(), "some weights dropped, not all");
        let bias = causal.then(|| additive(&causal_mask(7, 6), DType::F64));
        let (want, want_grads) = run(|q, k, v| naive(q, k, v, 0.5, bias.as_ref(), Some(&drop)), [&q, &k, &v]);
        assert!(max_diff(out.tensor(), &want) < 1e-12);
        for (var, w) in vars.iter().zip(&want_grads) {
            let d = max_diff(&var.grad().unwrap(), w);
            assert!(d < 1e-12, "gradient differs by {d}");
        }
    }
}

#[test]
fn dropout_one_drops_everything() {
    let _generator = GENERATOR.lock().unwrap_or_else(|e| e.into_inner());
    let [q, k, v] = qkv(&[1, 1], 4, 4, 2, 2, DType::F64);
    let (out, grads) =
        run(|q, k, v| q.scaled_dot_product_attention(k, v, &SdpaOptions::new().dropout_p(1.0)), [&q, &k, &v]);
    assert!(out.to_vec::<f64>().unwrap().iter().all(|&x| x == 0.0));
    assert!(grads.iter().all(|g| g.to_vec::<f64>().unwrap().iter().all(|&x| x == 0.0)));
}

#[test]
fn gradcheck_plain_masked_causal() {
    let [q, k, v] = qkv(&[2, 1], 5, 4, 3, 2, DType::F64);
    let check = |options: SdpaOptions| {
        let f = |x: &[Var]| x[0].scaled_dot_product_attention(&x[1], &x[2], &options);
        if let Err(e) = gradcheck(f, &[q.clone(), k.clone(), v.clone()], 1e-6, 1e-6, 1e-5) {
            panic!("{e}");
        }
    };
    check(SdpaOptions::new().chunk_rows(2));
    check(SdpaOptions::new().attn_mask(bool_mask(5, 4, None)).chunk_rows(3));
    check(SdpaOptions::new().attn_mask(filled(&[5, 4], 3.3, DType::F64)).scale(0.7));
    check(SdpaOptions::new().causal(true).chunk_rows(2));
}

/// bf16 and f16 inputs: products of half operands into f32 sums, the
/// scores and their softmax in f32, probabilities and score gradients
/// rounded to the inputs' dtype as operands. Output and gradients stay
/// within half precision of the f64 composition on the same (rounded)
/// inputs: plain, with a scale that is not a power of two, causal, and
/// with an additive mask; chunks of several sizes.
#[test]
fn half_inputs_compute_in_f32() {
    let [q, k, v] = qkv(&[2, 2], 6, 5, 4, 4, DType::F64);
    let mask = filled(&[6, 5], 3.3, DType::F64);
    for dtype in [DType::BF16, DType::F16] {
        let half = |t: &Tensor| t.to_dtype(dtype).unwrap();
        let widen = |t: &Tensor| half(t).to_dtype(DType::F64).unwrap();
        let cases: [(SdpaOptions, f64, Option<Tensor>); 4] = [
            (SdpaOptions::new().chunk_rows(4), 0.5, None),
            (SdpaOptions::new().scale(0.37).chunk_rows(5), 0.37, None),
            (SdpaOptions::new().causal(true).chunk_rows(2), 0.5, Some(additive(&causal_mask(6, 5), DType::F64))),
            (SdpaOptions::new().attn_mask(half(&mask)), 0.5, Some(widen(&mask))),
        ];
        for (options, scale, bias) in cases {
            let (out, grads) =
                run(|q, k, v| q.scaled_dot_product_attention(k, v, &options), [&half(&q), &half(&k), &half(&v)]);
            assert_eq!(out.dtype(), dtype);
            assert!(grads.iter().all(|g| g.dtype() == dtype));
            let (want, want_grads) =
                run(|q, k, v| naive(q, k, v, scale, bias.as_ref(), None), [&widen(&q), &widen(&k), &widen(&v)]);
            // Largest seen: bf16 0.003 (output) and 0.006 (gradients), f16 0.0006.
            let tol = if dtype == DType::BF16 { 8e-3 } else { 1.5e-3 };
            let d = max_diff(&out, &want);
            assert!(d < tol, "{dtype} {options:?}: output differs by {d}");
            for (name, (g, w)) in ["q", "k", "v"].iter().zip(grads.iter().zip(&want_grads)) {
                let d = max_diff(g, w);
                assert!(d < 2.0 * tol, "{dtype} {options:?}: grad {name} differs by {d}");
            }
        }
    }
}

fn message(result: Result<Var>) -> String {
    match result {
        Err(e @ AutogradError::Invalid { op: "scaled_dot_product_attention", .. }) => e.to_string(),
        Err(e) => panic!("expected an Invalid error of scaled_dot_product_attention, got {e:?}"),
        Ok(_) => panic!("expected an error"),
    }
}

/// Each refusal is an [`AutogradError::Invalid`] of the op (checked by
/// `message`); what the message names is the point of the test.
#[test]
fn refusals_name_the_problem() {
    let [q, k, v] = qkv(&[2, 3], 4, 5, 6, 6, DType::F64);
    let (q, k, v) = (Var::new(q), Var::new(k), Var::new(v));
    let both = SdpaOptions::new().causal(true).attn_mask(bool_mask(4, 5, None));
    assert!(message(q.scaled_dot_product_attention(&k, &v, &both)).contains("attn_mask and is_causal"));
    let wrong = SdpaOptions::new().attn_mask(bool_mask(4, 4, None));
    let m = message(q.scaled_dot_product_attention(&k, &v, &wrong));
    assert!(m.contains("[4, 4]") && m.contains("[2, 3, 4, 5]"), "{m}");
    let too_many = SdpaOptions::new().attn_mask(Tensor::ones([1, 2, 3, 4, 5], DType::Bool).unwrap());
    assert!(message(q.scaled_dot_product_attention(&k, &v, &too_many)).contains("does not broadcast"));
    let ints = SdpaOptions::new().attn_mask(Tensor::ones([4, 5], DType::I64).unwrap());
    assert!(message(q.scaled_dot_product_attention(&k, &v, &ints)).contains("bool or floating point"));
    let short_k = Var::new(filled(&[2, 3, 5, 4], 0.0, DType::F64));
    assert!(message(q.scaled_dot_product_attention(&short_k, &v, &SdpaOptions::new())).contains("key must be"));
    let other_batch = Var::new(filled(&[2, 2, 5, 6], 0.0, DType::F64));
    assert!(message(q.scaled_dot_product_attention(&other_batch, &v, &SdpaOptions::new())).contains("leading"));
    let f32_v = Var::new(filled(&[2, 3, 5, 6], 0.0, DType::F32));
    assert!(message(q.scaled_dot_product_attention(&k, &f32_v, &SdpaOptions::new())).contains("dtype"));
    let bad_p = SdpaOptions::new().dropout_p(1.5);
    assert!(message(q.scaled_dot_product_attention(&k, &v, &bad_p)).contains("dropout_p"));
    let vector = Var::new(filled(&[6], 0.0, DType::F64));
    assert!(message(vector.scaled_dot_product_attention(&vector, &vector, &SdpaOptions::new())).contains("rank"));
}
