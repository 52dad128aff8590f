//! `MultiheadAttention` and `TransformerEncoderLayer` against hand
//! compositions of `Var` ops (PyTorch's arithmetic), with PyTorch's
//! parameter names and mask conventions; shapes in every layout; a training
//! step that lowers a loss; and the refusals.
//!
//! Tests share the global generator (layer initialisation); every check
//! whose numbers matter compares two computations from the same parameters.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::Var;
use brasa_nn::functional::{layer_norm, mse_loss, Reduction};
use brasa_nn::optim::{Optimizer, Sgd, SgdConfig};
use brasa_nn::{
    AttentionMasks, Module, ModuleExt, MultiheadAttention, MultiheadAttentionConfig, NnError, Result,
    TransformerActivation, TransformerEncoderLayer, TransformerEncoderLayerConfig,
};
use brasa_tensor::{DType, Tensor};

#[path = "support/fixtures.rs"]
mod fixtures;
use fixtures::{assert_close, invalid_message, tensor_f64, to_f64, DEV};

fn mha_f64(e: usize, h: usize, batch_first: bool) -> MultiheadAttention {
    let config = MultiheadAttentionConfig::new().batch_first(batch_first).dtype(DType::F64);
    let mha = MultiheadAttention::with_config(e, h, config, DEV).unwrap();
    // Non-zero biases, so a wrong bias slice shows.
    for (i, b) in [mha.in_proj_bias.as_ref().unwrap(), mha.out_proj.bias.as_ref().unwrap()].iter().enumerate() {
        b.tensor().copy_(&tensor_f64(b.dims(), 5.0 + i as f64).mul_scalar(0.1).unwrap()).unwrap();
    }
    mha
}

/// PyTorch's multi-head attention on batch-first inputs, by hand:
/// projections with slices of `in_proj_weight`, per-head
/// `softmax(q kᵀ/√d + bias) v`, heads concatenated, `out_proj`.
fn hand_mha(mha: &MultiheadAttention, q_in: &Var, kv_in: &Var, bias: Option<&Tensor>) -> Result<Var> {
    let (e, h) = (mha.embed_dim(), mha.num_heads());
    let d = e / h;
    let (w, b) = (&mha.in_proj_weight, mha.in_proj_bias.as_ref().unwrap());
    let project = |x: &Var, i: usize| -> Result<Var> {
        Ok(x.matmul(&w.narrow(0, i * e, e)?.t()?)?.add(&b.narrow(0, i * e, e)?)?)
    };
    let (n, l, s) = (q_in.dims()[0], q_in.dims()[1], kv_in.dims()[1]);
    let heads = |x: Var, len: usize| -> Result<Var> {
        Ok(x.reshape(&[n as isize, len as isize, h as isize, d as isize])?.permute(&[0, 2, 1, 3])?)
    };
    let (q, k, v) = (heads(project(q_in, 0)?, l)?, heads(project(kv_in, 1)?, s)?, heads(project(kv_in, 2)?, s)?);
    let mut scores = q.matmul(&k.transpose(-2, -1)?)?.mul_scalar(1.0 / (d as f64).sqrt())?;
    if let Some(bias) = bias {
        scores = scores.add(&Var::new(bias.clone()))?;
    }
    let merged =
        scores.softmax(-1)?.matmul(&v)?.permute(&[0, 2, 1, 3])?.reshape(&[n as isize, l as isize, e as isize])?;
    let out = &mha.out_proj;
    Ok(merged.matmul(&out.weight.t()?)?.add(out.bias.as_ref().unwrap())?)
}

fn input(shape: &[usize], salt: f64) -> Var {
    Var::new(tensor_f64(shape, salt).mul_scalar(0.5).unwrap())
}

#[test]
fn parameter_names_and_shapes_are_pytorchs() {
    let mha = MultiheadAttention::new(16, 4, DEV).unwrap();
    let named: Vec<(String, Vec<usize>)> =
        mha.named_parameters().into_iter().map(|(name, v)| (name, v.dims().to_vec())).collect();
    let want = [
        ("in_proj_weight", vec![48, 16]),
        ("in_proj_bias", vec![48]),
        ("out_proj.weight", vec![16, 16]),
        ("out_proj.bias", vec![16]),
    ];
    assert_eq!(named, want.iter().map(|(n, d)| (n.to_string(), d.clone())).collect::<Vec<_>>());
    // PyTorch's initialisation: zero biases, Xavier-uniform in_proj_weight.
    assert!(to_f64(mha.in_proj_bias.as_ref().unwrap()).iter().all(|&x| x == 0.0));
    let bound = (6.0f64 / (48.0 + 16.0)).sqrt();
    assert!(to_f64(&mha.in_proj_weight).iter().all(|x| x.abs() <= bound));
    let layer = TransformerEncoderLayer::new(16, 4, DEV).unwrap();
    let names: Vec<String> = layer.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "self_attn.in_proj_weight",
            "self_attn.in_proj_bias",
            "self_attn.out_proj.weight",
            "self_attn.out_proj.bias",
            "linear1.weight",
            "linear1.bias",
            "linear2.weight",
            "linear2.bias",
            "norm1.weight",
            "norm1.bias",
            "norm2.weight",
            "norm2.bias",
        ]
    );
    assert_eq!(layer.linear1.weight.dims(), &[2048, 16]);
}

#[test]
fn mha_shapes_in_every_layout() {
    let seq_first = MultiheadAttention::new(12, 3, DEV).unwrap();
    let x = Var::new(Tensor::randn([5, 2, 12], DType::F32).unwrap()); // [L, N, E]
    assert_eq!(seq_first.forward(&x).unwrap().dims(), &[5, 2, 12]);
    let memory = Var::new(Tensor::randn([7, 2, 12], DType::F32).unwrap()); // [S, N, E]
    assert_eq!(seq_first.attend(&x, &memory, &memory, &AttentionMasks::new()).unwrap().dims(), &[5, 2, 12]);
    let unbatched = Var::new(Tensor::randn([5, 12], DType::F32).unwrap());
    assert_eq!(seq_first.forward(&unbatched).unwrap().dims(), &[5, 12]);
    let batch_first =
        MultiheadAttention::with_config(12, 3, MultiheadAttentionConfig::new().batch_first(true), DEV).unwrap();
    let xb = Var::new(Tensor::randn([2, 5, 12], DType::F32).unwrap());
    assert_eq!(batch_first.forward(&xb).unwrap().dims(), &[2, 5, 12]);
}

/// Self-attention, cross-attention and seq-first layout equal the hand
/// composition, values and gradients of the input and of every parameter.
#[test]
fn mha_equals_hand_composition() {
    let mha = mha_f64(8, 2, true);
    let x = Var::param(tensor_f64(&[2, 5, 8], 0.3).mul_scalar(0.5).unwrap()).unwrap();
    let got = mha.forward(&x).unwrap();
    let want = hand_mha(&mha, &x, &x, None).unwrap();
    assert_close(&to_f64(&got), &to_f64(&want), 1e-12);
    // Gradients: the same loss through both.
    let grads = |out: &Var| -> Vec<Vec<f64>> {
        mha.zero_grad().unwrap();
        x.zero_grad(true).unwrap();
        out.mul(&input(out.dims(), 9.0)).unwrap().sum_all().unwrap().backward().unwrap();
        let mut all: Vec<Vec<f64>> =
            mha.parameters().iter().map(|p| p.grad().unwrap().to_vec::<f64>().unwrap()).collect();
        all.push(x.grad().unwrap().to_vec::<f64>().unwrap());
        all
    };
    let (g, w) = (grads(&got), grads(&want));
    for (a, b) in g.iter().zip(&w) {
        assert_close(a, b, 1e-11);
    }
    // Cross-attention with S ≠ L.
    let memory = input(&[2, 3, 8], 1.1);
    let got = mha.attend(&x, &memory, &memory, &AttentionMasks::new()).unwrap();
    assert_close(&to_f64(&got), &to_f64(&hand_mha(&mha, &x, &memory, None).unwrap()), 1e-12);
    // Sequence-first: the same numbers transposed.
    let seq_first = mha_f64(8, 2, false);
    for (a, b) in seq_first.parameters().iter().zip(mha.parameters()) {
        a.tensor().copy_(b.tensor()).unwrap();
    }
    let got = seq_first.forward(&x.transpose(0, 1).unwrap()).unwrap().transpose(0, 1).unwrap();
    assert_close(&to_f64(&got.contiguous().unwrap()), &to_f64(&hand_mha(&mha, &x, &x, None).unwrap()), 1e-12);
}

/// PyTorch's MHA mask convention (bool `true` = blocked, float added), the
/// two masks combined, per-head attn masks, and causal with padding.
#[test]
fn mha_masks_follow_pytorch() {
    let (n, h, l, s, e) = (2usize, 2usize, 4usize, 5usize, 8usize);
    let mha = mha_f64(e, h, true);
    let x = input(&[n, l, e], 0.7);
    let memory = input(&[n, s, e], 2.3);
    let ninf = f64::NEG_INFINITY;
    // Padding: sample 0 ignores keys 3 and 4, sample 1 key 0.
    let padding =
        Tensor::from_vec(vec![false, false, false, true, true, true, false, false, false, false], [n, s]).unwrap();
    let mut pad_bias = vec![0.0; n * s];
    for (i, &p) in padding.to_vec::<bool>().unwrap().iter().enumerate() {
        if p {
            pad_bias[i] = ninf;
        }
    }
    let pad_bias = Tensor::from_vec(pad_bias, [n, 1, 1, s]).unwrap();
    let masks = AttentionMasks::new().key_padding_mask(padding.clone());
    let got = mha.attend(&x, &memory, &memory, &masks).unwrap();
    assert_close(&to_f64(&got), &to_f64(&hand_mha(&mha, &x, &memory, Some(&pad_bias)).unwrap()), 1e-12);
    // A bool attn mask [L, S] (true = blocked) together with the padding.
    let blocked: Vec<bool> = (0..l * s).map(|i| i % 3 == 1).collect();
    let attn = Tensor::from_vec(blocked.clone(), [l, s]).unwrap();
    let attn_bias =
        Tensor::from_vec(blocked.iter().map(|&b| if b { ninf } else { 0.0 }).collect::<Vec<_>>(), [l, s]).unwrap();
    let both = pad_bias.add(&attn_bias).unwrap();
    let masks = AttentionMasks::new().key_padding_mask(padding.clone()).attn_mask(attn);
    let got = mha.attend(&x, &memory, &memory, &masks).unwrap();
    assert_close(&to_f64(&got), &to_f64(&hand_mha(&mha, &x, &memory, Some(&both)).unwrap()), 1e-12);
    // A float attn mask per sample and head [N·H, L, S], with bool padding.
    let float = tensor_f64(&[n * h, l, s], 4.4);
    let masks = AttentionMasks::new().key_padding_mask(padding.clone()).attn_mask(float.clone());
    let got = mha.attend(&x, &memory, &memory, &masks).unwrap();
    let want_bias = float.reshape(&[n as isize, h as isize, l as isize, s as isize]).unwrap().add(&pad_bias).unwrap();
    assert_close(&to_f64(&got), &to_f64(&hand_mha(&mha, &x, &memory, Some(&want_bias)).unwrap()), 1e-12);
    // Causal, alone and with padding, equals the explicit causal mask.
    let causal_bias =
        Tensor::from_vec((0..l * l).map(|i| if i % l > i / l { ninf } else { 0.0 }).collect::<Vec<_>>(), [l, l])
            .unwrap();
    let got = mha.attend(&x, &x, &x, &AttentionMasks::new().causal(true)).unwrap();
    assert_close(&to_f64(&got), &to_f64(&hand_mha(&mha, &x, &x, Some(&causal_bias)).unwrap()), 1e-12);
    let self_padding = Tensor::from_vec(vec![false, false, false, true, false, true, false, false], [n, l]).unwrap();
    let self_pad_bias = Tensor::from_vec(
        self_padding.to_vec::<bool>().unwrap().iter().map(|&p| if p { ninf } else { 0.0 }).collect::<Vec<_>>(),
        [n, 1, 1, l],
    )
    .unwrap();
    let masks = AttentionMasks::new().causal(true).key_padding_mask(self_padding);
    let got = mha.attend(&x, &x, &x, &masks).unwrap();
    let want = hand_mha(&mha, &x, &x, Some(&causal_bias.add(&self_pad_bias).unwrap())).unwrap();
    assert_close(&to_f64(&got), &to_f64(&want), 1e-12);
}

/// The encoder layer's arithmetic by hand (evaluation mode, no dropout).
fn hand_encoder(layer: &TransformerEncoderLayer, x: &Var, gelu: bool) -> Result<Var> {
    let norm =
        |n: &brasa_nn::LayerNorm, x: &Var| layer_norm(x, &[x.dims()[2]], n.weight.as_ref(), n.bias.as_ref(), 1e-5);
    let sa = |x: &Var| hand_mha(&layer.self_attn, x, x, None);
    let ff = |x: &Var| -> Result<Var> {
        let hidden = x.matmul(&layer.linear1.weight.t()?)?.add(layer.linear1.bias.as_ref().unwrap())?;
        let hidden = if gelu { hidden.gelu()? } else { hidden.relu()? };
        Ok(hidden.matmul(&layer.linear2.weight.t()?)?.add(layer.linear2.bias.as_ref().unwrap())?)
    };
    if layer.norm_first() {
        let x = x.add(&sa(&norm(&layer.norm1, x)?)?)?;
        Ok(x.add(&ff(&norm(&layer.norm2, &x)?)?)?)
    } else {
        let x = norm(&layer.norm1, &x.add(&sa(x)?)?)?;
        norm(&layer.norm2, &x.add(&ff(&x)?)?)
    }
}

#[test]
fn encoder_layer_pre_and_post_norm_equal_hand_composition() {
    let x = input(&[2, 5, 8], 0.9);
    let mut outputs = Vec::new();
    for (norm_first, activation) in [(false, TransformerActivation::Relu), (true, TransformerActivation::Gelu)] {
        let config = TransformerEncoderLayerConfig::new()
            .dim_feedforward(16)
            .batch_first(true)
            .norm_first(norm_first)
            .activation(activation)
            .dtype(DType::F64);
        let mut layer = TransformerEncoderLayer::with_config(8, 2, config, DEV).unwrap();
        layer.eval();
        // Norm parameters away from 1 and 0, so a missing norm shows.
        for (i, p) in
            [&layer.norm1.weight, &layer.norm1.bias, &layer.norm2.weight, &layer.norm2.bias].iter().enumerate()
        {
            let p = p.as_ref().unwrap();
            p.tensor()
                .copy_(&tensor_f64(p.dims(), i as f64).mul_scalar(0.3).unwrap().add_scalar(0.5).unwrap())
                .unwrap();
        }
        let got = layer.forward(&x).unwrap();
        assert_eq!(got.dims(), &[2, 5, 8]);
        let want = hand_encoder(&layer, &x, activation == TransformerActivation::Gelu).unwrap();
        assert_close(&to_f64(&got), &to_f64(&want), 1e-12);
        outputs.push(got);
    }
    // Pre- and post-norm differ (post-norm outputs are normalised rows).
    let post = to_f64(&outputs[0]);
    assert!(post.iter().zip(to_f64(&outputs[1])).any(|(a, b)| (a - b).abs() > 1e-3));
}

#[test]
fn encoder_layer_training_step_lowers_the_loss() {
    let config = TransformerEncoderLayerConfig::new().dim_feedforward(32).dropout(0.0).batch_first(true);
    let layer = TransformerEncoderLayer::with_config(16, 4, config, DEV).unwrap();
    let x = Var::new(tensor_f64(&[4, 6, 16], 0.2).to_dtype(DType::F32).unwrap());
    let target = Var::new(tensor_f64(&[4, 6, 16], 3.1).mul_scalar(0.5).unwrap().to_dtype(DType::F32).unwrap());
    let mut opt = Sgd::new(layer.parameters(), SgdConfig { lr: 0.05, ..Default::default() }).unwrap();
    let masks = AttentionMasks::new().causal(true);
    let mut losses = Vec::new();
    for _ in 0..5 {
        let loss = mse_loss(&layer.encode(&x, &masks).unwrap(), &target, Reduction::Mean).unwrap();
        losses.push(loss.item().unwrap());
        loss.backward().unwrap();
        assert!(layer.parameters().iter().all(|p| p.grad().is_some()), "every parameter got a gradient");
        opt.step().unwrap();
        opt.zero_grad().unwrap();
    }
    assert!(losses[4] < losses[0] * 0.95, "losses {losses:?}");
}

#[test]
fn dropout_only_in_training_mode() {
    let config = MultiheadAttentionConfig::new().dropout(0.5).batch_first(true).dtype(DType::F64);
    let mut mha = MultiheadAttention::with_config(8, 2, config, DEV).unwrap();
    let x = input(&[1, 6, 8], 0.1);
    let train = to_f64(&mha.forward(&x).unwrap());
    mha.eval();
    let eval = to_f64(&mha.forward(&x).unwrap());
    assert_close(&eval, &to_f64(&hand_mha(&mha, &x, &x, None).unwrap()), 1e-12);
    assert!(train.iter().zip(&eval).any(|(a, b)| (a - b).abs() > 1e-6), "dropout changed the training output");
}

fn err(result: Result<impl Sized>) -> NnError {
    match result {
        Err(e) => e,
        Ok(_) => panic!("expected an error"),
    }
}

#[test]
fn refusals_name_the_problem() {
    let (what, message) = invalid_message(err(MultiheadAttention::new(10, 3, DEV)));
    assert_eq!(what, "MultiheadAttention");
    assert!(message.contains("embed_dim (10)") && message.contains("num_heads (3)"), "{message}");
    let (_, message) = invalid_message(err(TransformerEncoderLayer::new(10, 4, DEV)));
    assert!(message.contains("num_heads (4)"), "{message}");
    let bad_dropout = MultiheadAttentionConfig::new().dropout(2.0);
    assert!(invalid_message(err(MultiheadAttention::with_config(8, 2, bad_dropout, DEV))).1.contains("dropout"));

    let mha = MultiheadAttention::with_config(8, 2, MultiheadAttentionConfig::new().batch_first(true), DEV).unwrap();
    let x = Var::new(Tensor::randn([2, 4, 8], DType::F32).unwrap());
    let wide = Var::new(Tensor::randn([2, 4, 6], DType::F32).unwrap());
    assert!(invalid_message(err(mha.forward(&wide))).1.contains("[2, 4, 6]"));
    let other_batch = Var::new(Tensor::randn([3, 4, 8], DType::F32).unwrap());
    assert!(invalid_message(err(mha.attend(&x, &other_batch, &other_batch, &AttentionMasks::new())))
        .1
        .contains("batch size"));
    let wrong_mask = AttentionMasks::new().attn_mask(Tensor::zeros([4, 5], DType::Bool).unwrap());
    let (_, message) = invalid_message(err(mha.attend(&x, &x, &x, &wrong_mask)));
    assert!(message.contains("attn_mask must be [4, 4] or [4, 4, 4]") && message.contains("[4, 5]"), "{message}");
    let wrong_padding = AttentionMasks::new().key_padding_mask(Tensor::zeros([2, 5], DType::Bool).unwrap());
    assert!(invalid_message(err(mha.attend(&x, &x, &x, &wrong_padding))).1.contains("key_padding_mask must be [2, 4]"));
    let int_mask = AttentionMasks::new().attn_mask(Tensor::zeros([4, 4], DType::I64).unwrap());
    assert!(invalid_message(err(mha.attend(&x, &x, &x, &int_mask))).1.contains("bool or floating point"));
}
