//! The layers of brasa-nn against PyTorch's behaviour: shapes, parameter
//! names, initialisation bounds, batch-norm running statistics computed by
//! hand, train/eval switching, gradients against finite differences, and
//! errors that name the layer and the shapes.
//!
//! Tests run in parallel in one process and share the global generator, so
//! every check whose numbers matter uses inputs from a formula.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{gradcheck, Var};
use brasa_nn::functional::{batch_norm, layer_norm};
use brasa_nn::{
    AvgPool2d, BatchNorm1d, BatchNorm2d, BatchNormConfig, Conv2d, Conv2dConfig, Dropout, Embedding, Flatten, Gelu,
    Identity, LayerNorm, LayerNormConfig, Linear, MaxPool2d, Module, ModuleExt, NnError, Relu, Result, Sequential,
    Sigmoid, Silu, Tanh,
};
use brasa_tensor::{DType, Tensor};

#[path = "support/fixtures.rs"]
mod fixtures;
use fixtures::{assert_close, invalid_message, tensor_f64, to_f64, values, DEV};

/// Per-channel mean, biased and unbiased variance of `[N, C, S]` data (S the
/// flattened spatial size), computed naively.
fn channel_stats(x: &[f64], n: usize, c: usize, s: usize) -> Vec<(f64, f64, f64)> {
    (0..c)
        .map(|ch| {
            let items: Vec<f64> =
                (0..n).flat_map(|b| (0..s).map(move |k| (b, k))).map(|(b, k)| x[(b * c + ch) * s + k]).collect();
            let m = items.len() as f64;
            let mean = items.iter().sum::<f64>() / m;
            let sq = items.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>();
            (mean, sq / m, sq / (m - 1.0))
        })
        .collect()
}

// ----- shapes -------------------------------------------------------------------------

#[test]
fn shapes_of_every_layer() -> Result<()> {
    let x = Var::new(Tensor::zeros([2, 3, 9, 8], DType::F32)?);
    let conv = Conv2d::with_config(3, 5, (3, 2), Conv2dConfig::new().stride(2).padding(1).dilation((1, 2)), DEV)?;
    // H: (9 + 2 - 1·2 - 1)/2 + 1 = 5; W: (8 + 2 - 2·1 - 1)/2 + 1 = 4.
    assert_eq!(conv.forward(&x)?.dims(), &[2, 5, 5, 4]);
    assert_eq!(MaxPool2d::new(2)?.forward(&x)?.dims(), &[2, 3, 4, 4]);
    assert_eq!(MaxPool2d::new(3)?.stride(1)?.padding(1)?.forward(&x)?.dims(), &[2, 3, 9, 8]);
    assert_eq!(AvgPool2d::new((3, 2))?.forward(&x)?.dims(), &[2, 3, 3, 4]);
    assert_eq!(Flatten::new().forward(&x)?.dims(), &[2, 216]);
    assert_eq!(Flatten::range(0, 1).forward(&x)?.dims(), &[6, 9, 8]);
    assert_eq!(Flatten::range(-2, -1).forward(&x)?.dims(), &[2, 3, 72]);
    assert_eq!(BatchNorm2d::new(3, DEV)?.forward(&x)?.dims(), &[2, 3, 9, 8]);
    assert_eq!(LayerNorm::new([9, 8], DEV)?.forward(&x)?.dims(), &[2, 3, 9, 8]);
    let seq = Var::new(Tensor::zeros([4, 6, 7], DType::F32)?);
    assert_eq!(BatchNorm1d::new(6, DEV)?.forward(&seq)?.dims(), &[4, 6, 7]);
    assert_eq!(BatchNorm1d::new(6, DEV)?.forward(&seq.select(2usize, 0)?)?.dims(), &[4, 6]);
    for layer in [&Relu as &dyn Module, &Gelu, &Gelu::tanh(), &Silu, &Tanh, &Sigmoid, &Identity] {
        assert_eq!(layer.forward(&seq)?.dims(), &[4, 6, 7]);
    }
    let table = Embedding::new(10, 4, DEV)?;
    assert_eq!((table.num_embeddings(), table.embedding_dim()), (10, 4));
    let ids = Var::new(Tensor::from_vec(vec![1i64, 9, 0, 1, 2, 3], [3, 2])?);
    assert_eq!(table.forward(&ids)?.dims(), &[3, 2, 4]);
    Ok(())
}

#[test]
fn activations_compute_their_functions() -> Result<()> {
    let xs = [-2.0f64, -0.5, 0.0, 0.7, 3.0];
    let x = Var::new(Tensor::from_vec(xs.to_vec(), [5])?);
    let erf_gelu = |v: f64| {
        // Φ by the Abramowitz-Stegun 7.1.26 erf (error < 1.5e-7).
        let z = v / 2f64.sqrt();
        let t = 1.0 / (1.0 + 0.327_591_1 * z.abs());
        let poly =
            t * (0.254_829_592 + t * (-0.284_496_736 + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
        let erf = (1.0 - poly * (-z * z).exp()).copysign(z);
        v * 0.5 * (1.0 + erf)
    };
    let tanh_gelu =
        |v: f64| 0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh());
    let sigmoid = |v: f64| 1.0 / (1.0 + (-v).exp());
    type Case<'a> = (&'a dyn Module, &'a dyn Fn(f64) -> f64);
    let cases: [Case; 6] = [
        (&Relu, &|v: f64| v.max(0.0)),
        (&Gelu, &erf_gelu),
        (&Gelu::tanh(), &tanh_gelu),
        (&Silu, &|v: f64| v * sigmoid(v)),
        (&Tanh, &|v: f64| v.tanh()),
        (&Sigmoid, &sigmoid),
    ];
    for (layer, f) in cases {
        let want: Vec<f64> = xs.iter().map(|&v| f(v)).collect();
        assert_close(&to_f64(&layer.forward(&x)?), &want, 1e-6);
    }
    Ok(())
}

// ----- names --------------------------------------------------------------------------

fn small_cnn() -> Result<Sequential> {
    Ok(Sequential::new()
        .push(Conv2d::new(3, 8, 3, DEV)?)
        .push(BatchNorm2d::new(8, DEV)?)
        .push(Relu)
        .push(MaxPool2d::new(2)?)
        .push(Flatten::new())
        .push(Linear::new(8 * 3 * 3, 10, DEV)?))
}

#[test]
fn sequential_names_follow_pytorch() -> Result<()> {
    let model = small_cnn()?;
    let params: Vec<(String, Vec<usize>)> =
        model.named_parameters().into_iter().map(|(name, p)| (name, p.dims().to_vec())).collect();
    let expected_params = [
        ("0.weight", vec![8, 3, 3, 3]),
        ("0.bias", vec![8]),
        ("1.weight", vec![8]),
        ("1.bias", vec![8]),
        ("5.weight", vec![10, 72]),
        ("5.bias", vec![10]),
    ];
    assert_eq!(params, expected_params.map(|(n, d)| (n.to_string(), d)));
    let buffers: Vec<(String, Vec<usize>, DType)> =
        model.named_buffers().into_iter().map(|(name, b)| (name, b.dims().to_vec(), b.dtype())).collect();
    assert_eq!(
        buffers,
        [
            ("1.running_mean".to_string(), vec![8], DType::F32),
            ("1.running_var".to_string(), vec![8], DType::F32),
            ("1.num_batches_tracked".to_string(), vec![], DType::I64),
        ]
    );
    let dict = model.state_dict();
    let mut names: Vec<&str> = dict.names().collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "0.bias",
            "0.weight",
            "1.bias",
            "1.num_batches_tracked",
            "1.running_mean",
            "1.running_var",
            "1.weight",
            "5.bias",
            "5.weight"
        ]
    );
    assert_eq!(model.num_parameters(), 8 * 27 + 8 + 8 + 8 + 720 + 10);
    // Every layer and the state dict share storage: an in-place change shows.
    dict.get("1.running_mean").unwrap().fill_(3.0)?;
    assert_eq!(model.named_buffers()[0].1.to_vec::<f32>()?, [3.0; 8]);
    Ok(())
}

#[test]
fn optional_parameters_and_buffers_disappear() -> Result<()> {
    let conv = Conv2d::with_config(2, 4, 1, Conv2dConfig::new().bias(false), DEV)?;
    assert_eq!(conv.named_parameters().len(), 1);
    let bn = BatchNorm1d::with_config(4, BatchNormConfig::new().affine(false).track_running_stats(false), DEV)?;
    assert!(bn.named_parameters().is_empty() && bn.named_buffers().is_empty());
    let ln = LayerNorm::with_config([4], LayerNormConfig::new().bias(false), DEV)?;
    let names: Vec<String> = ln.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["weight"]);
    let ln = LayerNorm::with_config([4], LayerNormConfig::new().elementwise_affine(false), DEV)?;
    assert_eq!(ln.num_parameters(), 0);
    for layer in [&Relu as &dyn Module, &Identity, &Flatten::new(), &MaxPool2d::new(2)?, &Dropout::new(0.1)?] {
        assert!(layer.named_parameters().is_empty() && layer.named_buffers().is_empty());
    }
    Ok(())
}

#[test]
fn to_dtype_keeps_the_batch_counter_integral() -> Result<()> {
    let mut model = small_cnn()?;
    model.to_dtype(DType::F64)?;
    for (name, buffer) in model.named_buffers() {
        let want = if name.ends_with("num_batches_tracked") { DType::I64 } else { DType::F64 };
        assert_eq!(buffer.dtype(), want, "{name}");
    }
    let y = model.forward(&Var::new(tensor_f64(&[2, 3, 8, 8], 0.5)))?;
    assert_eq!((y.dims(), y.dtype()), (&[2usize, 10][..], DType::F64));
    Ok(())
}

// ----- Sequential ---------------------------------------------------------------------

#[test]
fn sequential_runs_layers_in_order() -> Result<()> {
    let empty = Sequential::new();
    assert!(empty.is_empty() && empty.get(0).is_none());
    let x = Var::new(tensor_f64(&[3, 4], 1.0));
    assert_eq!(to_f64(&empty.forward(&x)?), to_f64(&x));

    let model = Sequential::new()
        .push(Linear::with_options(4, 5, true, DType::F64, DEV)?)
        .push(Tanh)
        .push(Linear::with_options(5, 2, false, DType::F64, DEV)?);
    assert_eq!(model.len(), 3);
    assert!(!model.is_empty());
    let by_hand = model[2].forward(&model[1].forward(&model.get(0).unwrap().forward(&x)?)?)?;
    assert_eq!(to_f64(&model.forward(&x)?), to_f64(&by_hand));
    assert_eq!(to_f64(&model.forward_range(&x, 0..2)?), to_f64(&Tanh.forward(&model[0].forward(&x)?)?));
    assert!(model.forward_range(&x, 1..4).is_err());
    assert_eq!(model.iter().count(), 3);
    let names: Vec<String> = model.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["0.weight", "0.bias", "2.weight"]);

    // Nested: names join with dots.
    let mut outer = Sequential::new().push(Identity).push(model);
    outer.append(Box::new(Relu));
    let names: Vec<String> = outer.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["1.0.weight", "1.0.bias", "1.2.weight"]);
    Ok(())
}

#[test]
fn eval_switches_dropout_and_batch_norm() -> Result<()> {
    let c = 3;
    let mut model = Sequential::new()
        .push(BatchNorm1d::with_config(c, BatchNormConfig::new().dtype(DType::F64), DEV)?)
        .push(Dropout::new(1.0)?);
    let x = Var::new(tensor_f64(&[4, c], 2.0));
    assert!(model.is_training());
    // Training: p = 1 drops everything, and the batch is counted.
    assert!(to_f64(&model.forward(&x)?).iter().all(|&v| v == 0.0));
    let counter = model.state_dict().get("0.num_batches_tracked").unwrap().clone();
    assert_eq!(counter.item::<i64>()?, 1);
    let running = model.state_dict().get("0.running_mean").unwrap().to_vec::<f64>()?;

    model.eval();
    assert!(!model.is_training());
    // Evaluation: dropout is the identity and batch norm uses the running statistics, unchanged.
    let y = to_f64(&model.forward(&x)?);
    let dict = model.state_dict();
    let (mean, var) =
        (dict.get("0.running_mean").unwrap().to_vec::<f64>()?, dict.get("0.running_var").unwrap().to_vec::<f64>()?);
    assert_eq!(mean, running);
    let xs = to_f64(&x);
    let want: Vec<f64> = (0..xs.len()).map(|i| (xs[i] - mean[i % c]) / (var[i % c] + 1e-5).sqrt()).collect();
    assert_close(&y, &want, 1e-12);
    assert_eq!(counter.item::<i64>()?, 1);

    model.train();
    assert!(model.is_training());
    assert!(to_f64(&model.forward(&x)?).iter().all(|&v| v == 0.0));
    assert_eq!(counter.item::<i64>()?, 2);
    Ok(())
}

// ----- batch norm numbers ---------------------------------------------------------------

#[test]
fn batch_norm_2d_training_and_running_statistics() -> Result<()> {
    let (n, c, h, w) = (3, 2, 2, 3);
    let s = h * w;
    let mut bn = BatchNorm2d::with_config(c, BatchNormConfig::new().dtype(DType::F64), DEV)?;
    bn.weight.as_ref().unwrap().tensor().copy_(&Tensor::from_vec(vec![1.5f64, -0.5], [2])?)?;
    bn.bias.as_ref().unwrap().tensor().copy_(&Tensor::from_vec(vec![0.25f64, 2.0], [2])?)?;
    let (gamma, beta) = ([1.5, -0.5], [0.25, 2.0]);
    let eps = 1e-5;

    let mut want_mean = [0.0; 2];
    let mut want_var = [1.0; 2];
    for step in 0..2 {
        let data = values(n * c * s, step as f64 + 0.3);
        let x = Var::new(Tensor::from_vec(data.clone(), [n, c, h, w])?);
        let y = to_f64(&bn.forward(&x)?);
        let stats = channel_stats(&data, n, c, s);
        let want: Vec<f64> = (0..data.len())
            .map(|i| {
                let ch = (i / s) % c;
                let (mean, biased, _) = stats[ch];
                (data[i] - mean) / (biased + eps).sqrt() * gamma[ch] + beta[ch]
            })
            .collect();
        assert_close(&y, &want, 1e-12);
        for ch in 0..c {
            // PyTorch: running = (1 - momentum)·running + momentum·batch, unbiased variance.
            want_mean[ch] = 0.9 * want_mean[ch] + 0.1 * stats[ch].0;
            want_var[ch] = 0.9 * want_var[ch] + 0.1 * stats[ch].2;
        }
        assert_close(&bn.running_mean.as_ref().unwrap().to_vec::<f64>()?, &want_mean, 1e-12);
        assert_close(&bn.running_var.as_ref().unwrap().to_vec::<f64>()?, &want_var, 1e-12);
        assert_eq!(bn.num_batches_tracked.as_ref().unwrap().item::<i64>()?, step + 1);
    }

    bn.eval();
    let before = bn.running_mean.as_ref().unwrap().to_vec::<f64>()?;
    let data = values(n * c * s, 7.0);
    let y = to_f64(&bn.forward(&Var::new(Tensor::from_vec(data.clone(), [n, c, h, w])?))?);
    let want: Vec<f64> = (0..data.len())
        .map(|i| {
            let ch = (i / s) % c;
            (data[i] - want_mean[ch]) / (want_var[ch] + eps).sqrt() * gamma[ch] + beta[ch]
        })
        .collect();
    assert_close(&y, &want, 1e-12);
    assert_eq!(bn.running_mean.as_ref().unwrap().to_vec::<f64>()?, before);
    assert_eq!(bn.num_batches_tracked.as_ref().unwrap().item::<i64>()?, 2);

    bn.reset_running_stats()?;
    assert_eq!(bn.running_mean.as_ref().unwrap().to_vec::<f64>()?, [0.0, 0.0]);
    assert_eq!(bn.running_var.as_ref().unwrap().to_vec::<f64>()?, [1.0, 1.0]);
    assert_eq!(bn.num_batches_tracked.as_ref().unwrap().item::<i64>()?, 0);
    Ok(())
}

#[test]
fn batch_norm_cumulative_average_without_momentum() -> Result<()> {
    let (n, c, l) = (4, 3, 2);
    let bn = BatchNorm1d::with_config(c, BatchNormConfig::new().momentum(None).dtype(DType::F64), DEV)?;
    let batches: Vec<Vec<f64>> = (0..3).map(|k| values(n * c * l, k as f64 * 1.7)).collect();
    for data in &batches {
        bn.forward(&Var::new(Tensor::from_vec(data.clone(), [n, c, l])?))?;
    }
    // Momentum None: running statistics are the plain average over batches.
    let stats: Vec<Vec<(f64, f64, f64)>> = batches.iter().map(|d| channel_stats(d, n, c, l)).collect();
    let want_mean: Vec<f64> = (0..c).map(|ch| stats.iter().map(|s| s[ch].0).sum::<f64>() / 3.0).collect();
    let want_var: Vec<f64> = (0..c).map(|ch| stats.iter().map(|s| s[ch].2).sum::<f64>() / 3.0).collect();
    assert_close(&bn.running_mean.as_ref().unwrap().to_vec::<f64>()?, &want_mean, 1e-12);
    assert_close(&bn.running_var.as_ref().unwrap().to_vec::<f64>()?, &want_var, 1e-12);
    Ok(())
}

#[test]
fn batch_norm_without_running_stats_uses_the_batch_in_eval() -> Result<()> {
    let mut bn = BatchNorm1d::with_config(2, BatchNormConfig::new().track_running_stats(false).dtype(DType::F64), DEV)?;
    let x = Var::new(tensor_f64(&[5, 2], 0.1));
    let train = to_f64(&bn.forward(&x)?);
    bn.eval();
    assert_eq!(to_f64(&bn.forward(&x)?), train);
    Ok(())
}

#[test]
fn batch_norm_of_half_inputs_computes_in_f32() -> Result<()> {
    let x64 = tensor_f64(&[6, 3, 4], 0.9);
    let want = to_f64(&batch_norm(&Var::new(x64.clone()), None, None, None, None, true, 0.1, 1e-5)?);
    for dtype in [DType::F16, DType::BF16, DType::F32] {
        let x = Var::new(x64.to_dtype(dtype)?);
        let y = batch_norm(&x, None, None, None, None, true, 0.1, 1e-5)?;
        assert_eq!(y.dtype(), dtype);
        let tol = if dtype == DType::F32 { 1e-5 } else { 2e-2 };
        assert_close(&to_f64(&y), &want, tol);
        let z = layer_norm(&x, &[4], None, None, 1e-5)?;
        assert_eq!(z.dtype(), dtype);
    }
    Ok(())
}

#[test]
fn batch_norm_saves_little_for_backward() -> Result<()> {
    let x = Var::param(Tensor::zeros([16, 8, 8, 8], DType::F32)?.add_scalar(1.0)?)?;
    let bn = BatchNorm2d::new(8, DEV)?;
    let y = bn.forward(&x)?;
    let stats = y.graph_stats();
    assert_eq!(stats.nodes, 1, "one node for the whole normalisation");
    let input_bytes = x.numel() * 4;
    // The input (already alive) plus per-channel statistics and the weight.
    assert!(stats.saved_bytes <= input_bytes + 3 * 8 * 4, "saved {} bytes", stats.saved_bytes);
    Ok(())
}

// ----- functional forms: numbers and gradients ------------------------------------------

#[test]
fn functional_batch_norm_matches_a_naive_reference() -> Result<()> {
    let (n, c, s) = (2, 3, 5);
    let data = values(n * c * s, 0.4);
    let x = Var::new(Tensor::from_vec(data.clone(), [n, c, s])?);
    let w = Var::new(Tensor::from_vec(vec![0.5f64, 1.0, -2.0], [3])?);
    let b = Var::new(Tensor::from_vec(vec![0.1f64, 0.0, 3.0], [3])?);
    let running_mean = Tensor::from_vec(vec![0.2f64, -0.1, 0.5], [3])?;
    let running_var = Tensor::from_vec(vec![1.5f64, 0.7, 2.0], [3])?;
    let eps = 1e-3;

    let stats = channel_stats(&data, n, c, s);
    let y = to_f64(&batch_norm(&x, Some(&running_mean), Some(&running_var), Some(&w), Some(&b), true, 0.3, eps)?);
    let (wv, bv) = ([0.5, 1.0, -2.0], [0.1, 0.0, 3.0]);
    let want: Vec<f64> = (0..data.len())
        .map(|i| {
            let ch = (i / s) % c;
            (data[i] - stats[ch].0) / (stats[ch].1 + eps).sqrt() * wv[ch] + bv[ch]
        })
        .collect();
    assert_close(&y, &want, 1e-12);
    let rm: Vec<f64> = [0.2, -0.1, 0.5].iter().zip(&stats).map(|(r, st)| 0.7 * r + 0.3 * st.0).collect();
    let rv: Vec<f64> = [1.5, 0.7, 2.0].iter().zip(&stats).map(|(r, st)| 0.7 * r + 0.3 * st.2).collect();
    assert_close(&running_mean.to_vec::<f64>()?, &rm, 1e-12);
    assert_close(&running_var.to_vec::<f64>()?, &rv, 1e-12);

    // Evaluation mode: the running statistics, untouched.
    let before = running_mean.to_vec::<f64>()?;
    let y = to_f64(&batch_norm(&x, Some(&running_mean), Some(&running_var), Some(&w), None, false, 0.3, eps)?);
    let want: Vec<f64> = (0..data.len())
        .map(|i| {
            let ch = (i / s) % c;
            (data[i] - rm[ch]) / (rv[ch] + eps).sqrt() * wv[ch]
        })
        .collect();
    assert_close(&y, &want, 1e-12);
    assert_eq!(running_mean.to_vec::<f64>()?, before);
    Ok(())
}

#[test]
fn functional_layer_norm_matches_a_naive_reference() -> Result<()> {
    let (rows, d0, d1) = (4, 2, 3);
    let width = d0 * d1;
    let data = values(rows * width, 1.1);
    let x = Var::new(Tensor::from_vec(data.clone(), [2, 2, d0, d1])?);
    let wv = values(width, 5.0);
    let bv = values(width, 9.0);
    let w = Var::new(Tensor::from_vec(wv.clone(), [d0, d1])?);
    let b = Var::new(Tensor::from_vec(bv.clone(), [d0, d1])?);
    let y = to_f64(&layer_norm(&x, &[d0, d1], Some(&w), Some(&b), 1e-5)?);
    let mut want = Vec::new();
    for r in 0..rows {
        let row = &data[r * width..(r + 1) * width];
        let mean = row.iter().sum::<f64>() / width as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / width as f64;
        want.extend(row.iter().enumerate().map(|(k, v)| (v - mean) / (var + 1e-5).sqrt() * wv[k] + bv[k]));
    }
    assert_close(&y, &want, 1e-12);
    Ok(())
}

#[test]
fn gradcheck_batch_norm_training_2d_and_4d() -> Result<()> {
    for shape in [vec![4usize, 3], vec![2, 3, 2, 2], vec![3, 3, 4]] {
        let x = tensor_f64(&shape, 0.2);
        let w = Tensor::from_vec(vec![0.8f64, -1.3, 1.7], [3])?;
        let b = Tensor::from_vec(vec![0.1f64, 0.4, -0.6], [3])?;
        gradcheck(
            |v| batch_norm(&v[0], None, None, Some(&v[1]), Some(&v[2]), true, 0.1, 1e-5).map_err(into_autograd),
            &[x.clone(), w.clone(), b],
            1e-6,
            1e-7,
            1e-5,
        )?;
        // Without affine parameters, and with running statistics being updated.
        let (rm, rv) = (Tensor::zeros([3], DType::F64)?, Tensor::ones([3], DType::F64)?);
        gradcheck(
            |v| batch_norm(&v[0], Some(&rm), Some(&rv), None, None, true, 0.1, 1e-5).map_err(into_autograd),
            std::slice::from_ref(&x),
            1e-6,
            1e-7,
            1e-5,
        )?;
        // Only a weight.
        gradcheck(
            |v| batch_norm(&v[0], None, None, Some(&v[1]), None, true, 0.1, 1e-5).map_err(into_autograd),
            &[x, w],
            1e-6,
            1e-7,
            1e-5,
        )?;
    }
    Ok(())
}

#[test]
fn gradcheck_batch_norm_evaluation() -> Result<()> {
    let x = tensor_f64(&[3, 2, 2, 2], 0.6);
    let rm = Tensor::from_vec(vec![0.3f64, -0.2], [2])?;
    let rv = Tensor::from_vec(vec![0.9f64, 1.4], [2])?;
    let w = Tensor::from_vec(vec![1.2f64, -0.7], [2])?;
    let b = Tensor::from_vec(vec![0.5f64, 0.05], [2])?;
    gradcheck(
        |v| batch_norm(&v[0], Some(&rm), Some(&rv), Some(&v[1]), Some(&v[2]), false, 0.1, 1e-5).map_err(into_autograd),
        &[x, w, b],
        1e-6,
        1e-7,
        1e-5,
    )?;
    Ok(())
}

#[test]
fn gradcheck_batch_norm_with_frozen_parameters() -> Result<()> {
    // A weight that needs no gradient (fine-tuning with frozen norms) takes other paths.
    let x = tensor_f64(&[4, 2, 3], 1.3);
    let frozen = Var::new(Tensor::from_vec(vec![0.6f64, -1.1], [2])?);
    let b = Tensor::from_vec(vec![0.2f64, -0.3], [2])?;
    let (rm, rv) = (Tensor::from_vec(vec![0.1f64, 0.2], [2])?, Tensor::from_vec(vec![1.3f64, 0.8], [2])?);
    for training in [true, false] {
        gradcheck(
            |v| {
                batch_norm(&v[0], Some(&rm), Some(&rv), Some(&frozen), Some(&v[1]), training, 0.0, 1e-5)
                    .map_err(into_autograd)
            },
            &[x.clone(), b.clone()],
            1e-6,
            1e-7,
            1e-5,
        )?;
        gradcheck(
            |v| {
                let input = Var::new(x.clone());
                batch_norm(&input, Some(&rm), Some(&rv), Some(&v[0]), Some(&frozen), training, 0.0, 1e-5)
                    .map_err(into_autograd)
            },
            std::slice::from_ref(&b),
            1e-6,
            1e-7,
            1e-5,
        )?;
    }
    Ok(())
}

#[test]
fn gradcheck_layer_norm() -> Result<()> {
    let x = tensor_f64(&[2, 3, 4], 0.8);
    let w = tensor_f64(&[3, 4], 2.5);
    let b = tensor_f64(&[3, 4], 4.5);
    gradcheck(
        |v| layer_norm(&v[0], &[3, 4], Some(&v[1]), Some(&v[2]), 1e-5).map_err(into_autograd),
        &[x.clone(), w.clone(), b.clone()],
        1e-6,
        1e-7,
        1e-5,
    )?;
    gradcheck(
        |v| layer_norm(&v[0], &[4], None, None, 1e-5).map_err(into_autograd),
        std::slice::from_ref(&x),
        1e-6,
        1e-7,
        1e-5,
    )?;
    gradcheck(
        |v| layer_norm(&v[0], &[3, 4], None, Some(&v[1]), 1e-5).map_err(into_autograd),
        &[x.clone(), b],
        1e-6,
        1e-7,
        1e-5,
    )?;
    // A non-contiguous input.
    let xt = x.transpose(1, 2)?;
    let w4 = w.reshape(&[-1])?.narrow(0, 0, 3)?.contiguous()?;
    gradcheck(
        |v| layer_norm(&v[0], &[3], Some(&v[1]), None, 1e-5).map_err(into_autograd),
        &[xt, w4],
        1e-6,
        1e-7,
        1e-5,
    )?;
    Ok(())
}

#[test]
fn layers_backpropagate_to_their_parameters() -> Result<()> {
    let ln = LayerNorm::with_config([4], LayerNormConfig::new().dtype(DType::F64), DEV)?;
    let x = Var::param(tensor_f64(&[3, 4], 0.1))?;
    ln.forward(&x)?.mul(&Var::new(tensor_f64(&[3, 4], 3.0)))?.sum_all()?.backward()?;
    assert_eq!(ln.weight.as_ref().unwrap().grad().unwrap().dims(), &[4]);
    assert_eq!(ln.bias.as_ref().unwrap().grad().unwrap().dims(), &[4]);
    assert_eq!(x.grad().unwrap().dims(), &[3, 4]);

    let conv = Conv2d::with_config(2, 3, 2, Conv2dConfig::new().dtype(DType::F64).padding(1), DEV)?;
    gradcheck(|v| conv.forward(&v[0]).map_err(into_autograd), &[tensor_f64(&[2, 2, 3, 3], 0.3)], 1e-6, 1e-7, 1e-5)?;
    conv.forward(&Var::new(tensor_f64(&[1, 2, 3, 3], 0.0)))?.sum_all()?.backward()?;
    assert_eq!(conv.weight.grad().unwrap().dims(), &[3, 2, 2, 2]);
    // Σ over a 4x4 output of one channel: the bias gradient is 16.
    assert_eq!(conv.bias.as_ref().unwrap().grad().unwrap().to_vec::<f64>()?, [16.0; 3]);

    let table = Embedding::with_dtype(5, 2, DType::F64, DEV)?;
    let ids = Var::new(Tensor::from_vec(vec![1i64, 3, 1], [3])?);
    let rows = table.forward(&ids)?;
    let weight = table.weight.tensor().to_vec::<f64>()?;
    assert_eq!(to_f64(&rows), [&weight[2..4], &weight[6..8], &weight[2..4]].concat());
    rows.sum_all()?.backward()?;
    assert_eq!(table.weight.grad().unwrap().to_vec::<f64>()?, [0.0, 0.0, 2.0, 2.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]);
    Ok(())
}

fn into_autograd(err: NnError) -> brasa_autograd::AutogradError {
    match err {
        NnError::Autograd(e) => e,
        NnError::Tensor(e) => e.into(),
        other => brasa_autograd::AutogradError::Invalid { op: "test", message: other.to_string() },
    }
}

// ----- initialisation -------------------------------------------------------------------

#[test]
fn conv2d_init_follows_pytorch_bounds() -> Result<()> {
    let conv = Conv2d::new(16, 32, 3, DEV)?;
    let bound = 1.0 / ((16 * 9) as f64).sqrt();
    let w = conv.weight.tensor().to_vec::<f32>()?;
    let b = conv.bias.as_ref().unwrap().tensor().to_vec::<f32>()?;
    assert_eq!(w.len(), 32 * 16 * 9);
    assert!(w.iter().chain(&b).all(|v| (v.abs() as f64) <= bound), "values beyond ±{bound}");
    // U(-b, b): the largest magnitude of 4,608 draws is close to b, the variance b²/3.
    let max = w.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
    assert!(max > 0.95 * bound, "max {max}, bound {bound}");
    let var = w.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / w.len() as f64;
    assert!((var / (bound * bound / 3.0) - 1.0).abs() < 0.1, "variance {var}");
    assert!(conv.weight.requires_grad() && conv.bias.as_ref().unwrap().requires_grad());

    // Groups shrink fan_in.
    let grouped = Conv2d::with_config(16, 32, (3, 1), Conv2dConfig::new().groups(4), DEV)?;
    let bound = 1.0 / ((4 * 3) as f64).sqrt();
    assert_eq!(grouped.weight.dims(), &[32, 4, 3, 1]);
    assert!(grouped.weight.tensor().to_vec::<f32>()?.iter().all(|v| (v.abs() as f64) <= bound));

    let bn = BatchNorm2d::new(4, DEV)?;
    assert_eq!(bn.weight.as_ref().unwrap().tensor().to_vec::<f32>()?, [1.0; 4]);
    assert_eq!(bn.bias.as_ref().unwrap().tensor().to_vec::<f32>()?, [0.0; 4]);
    assert_eq!(bn.running_mean.as_ref().unwrap().to_vec::<f32>()?, [0.0; 4]);
    assert_eq!(bn.running_var.as_ref().unwrap().to_vec::<f32>()?, [1.0; 4]);
    let table = Embedding::new(200, 50, DEV)?;
    let e = table.weight.tensor().to_vec::<f32>()?;
    let var = e.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / e.len() as f64;
    assert!((var - 1.0).abs() < 0.1, "N(0, 1) variance {var}");
    Ok(())
}

// ----- errors -----------------------------------------------------------------------------

#[test]
fn wrong_inputs_are_errors_naming_layer_and_shape() -> Result<()> {
    let conv = Conv2d::new(3, 8, 3, DEV)?;
    let (what, message) = invalid_message(conv.forward(&Var::new(Tensor::zeros([2, 5], DType::F32)?)).unwrap_err());
    assert_eq!(what, "Conv2d");
    assert!(message.contains("[2, 5]"), "{message}");
    let (what, message) =
        invalid_message(conv.forward(&Var::new(Tensor::zeros([2, 4, 8, 8], DType::F32)?)).unwrap_err());
    assert_eq!(what, "Conv2d");
    assert!(message.contains("[2, 4, 8, 8]") && message.contains("3 input channels"), "{message}");

    let bn = BatchNorm2d::new(4, DEV)?;
    let (what, message) = invalid_message(bn.forward(&Var::new(Tensor::zeros([2, 4, 8], DType::F32)?)).unwrap_err());
    assert_eq!(what, "BatchNorm2d");
    assert!(message.contains("[2, 4, 8]") && message.contains("[N, C, H, W]"), "{message}");
    let (what, message) = invalid_message(bn.forward(&Var::new(Tensor::zeros([2, 3, 8, 8], DType::F32)?)).unwrap_err());
    assert_eq!(what, "BatchNorm2d");
    assert!(message.contains("[2, 3, 8, 8]") && message.contains("4 channels"), "{message}");
    // One value per channel cannot be normalised in training, and is not counted.
    let (_, message) = invalid_message(bn.forward(&Var::new(Tensor::zeros([1, 4, 1, 1], DType::F32)?)).unwrap_err());
    assert!(message.contains("more than 1 value per channel"), "{message}");
    assert_eq!(bn.num_batches_tracked.as_ref().unwrap().item::<i64>()?, 0);

    let bn1 = BatchNorm1d::new(4, DEV)?;
    let (what, message) = invalid_message(bn1.forward(&Var::new(Tensor::zeros([4], DType::F32)?)).unwrap_err());
    assert_eq!(what, "BatchNorm1d");
    assert!(message.contains("[4]"), "{message}");

    let ln = LayerNorm::new([3, 4], DEV)?;
    let (what, message) = invalid_message(ln.forward(&Var::new(Tensor::zeros([2, 4, 3], DType::F32)?)).unwrap_err());
    assert_eq!(what, "LayerNorm");
    assert!(message.contains("[3, 4]") && message.contains("[2, 4, 3]"), "{message}");

    let pool = MaxPool2d::new(2)?;
    let (what, message) = invalid_message(pool.forward(&Var::new(Tensor::zeros([2, 4], DType::F32)?)).unwrap_err());
    assert_eq!(what, "MaxPool2d");
    assert!(message.contains("[2, 4]"), "{message}");
    let (what, _) =
        invalid_message(Flatten::range(2, 1).forward(&Var::new(Tensor::zeros([2, 4, 3], DType::F32)?)).unwrap_err());
    assert_eq!(what, "Flatten");
    let (what, _) =
        invalid_message(Flatten::range(1, 5).forward(&Var::new(Tensor::zeros([2, 4], DType::F32)?)).unwrap_err());
    assert_eq!(what, "Flatten");

    let table = Embedding::new(5, 2, DEV)?;
    let (what, message) = invalid_message(table.forward(&Var::new(Tensor::zeros([3], DType::F32)?)).unwrap_err());
    assert_eq!(what, "Embedding");
    assert!(message.contains("i64"), "{message}");
    assert!(table.forward(&Var::new(Tensor::from_vec(vec![5i64], [1])?)).is_err(), "id out of range");
    Ok(())
}

#[test]
fn bad_configurations_are_errors() {
    assert_eq!(invalid_message(Dropout::new(1.5).unwrap_err()).0, "Dropout");
    assert_eq!(invalid_message(MaxPool2d::new(0).unwrap_err()).0, "MaxPool2d");
    assert_eq!(invalid_message(MaxPool2d::new(2).unwrap().padding(2).unwrap_err()).0, "MaxPool2d");
    assert_eq!(invalid_message(AvgPool2d::new(3).unwrap().stride(0).unwrap_err()).0, "AvgPool2d");
    assert_eq!(invalid_message(BatchNorm2d::new(0, DEV).unwrap_err()).0, "BatchNorm2d");
    assert_eq!(
        invalid_message(BatchNorm1d::with_config(3, BatchNormConfig::new().momentum(Some(2.0)), DEV).unwrap_err()).0,
        "BatchNorm1d"
    );
    assert_eq!(invalid_message(LayerNorm::new([0], DEV).unwrap_err()).0, "LayerNorm");
    let (what, message) =
        invalid_message(Conv2d::with_config(6, 4, 3, Conv2dConfig::new().groups(4), DEV).unwrap_err());
    assert_eq!(what, "Conv2d");
    assert!(message.contains("groups (4)"), "{message}");
    // Functional forms check their arguments too.
    let x = Var::new(Tensor::zeros([4, 3], DType::F64).unwrap());
    let w = Var::new(Tensor::ones([2], DType::F64).unwrap());
    assert_eq!(
        invalid_message(batch_norm(&x, None, None, Some(&w), None, true, 0.1, 1e-5).unwrap_err()).0,
        "batch_norm"
    );
    assert_eq!(invalid_message(batch_norm(&x, None, None, None, None, false, 0.1, 1e-5).unwrap_err()).0, "batch_norm");
    assert_eq!(invalid_message(layer_norm(&x, &[4], None, None, 1e-5).unwrap_err()).0, "layer_norm");
    assert_eq!(invalid_message(layer_norm(&x, &[3], Some(&w), None, 1e-5).unwrap_err()).0, "layer_norm");
}

#[test]
fn dropout_scales_kept_elements() -> Result<()> {
    let dropout = Dropout::new(0.25)?;
    assert_eq!(dropout.p(), 0.25);
    let y = to_f64(&dropout.forward(&Var::new(Tensor::ones([1000], DType::F64)?))?);
    assert!(y.iter().all(|&v| v == 0.0 || (v - 4.0 / 3.0).abs() < 1e-12));
    let kept = y.iter().filter(|&&v| v != 0.0).count();
    assert!((650..=850).contains(&kept), "kept {kept} of 1000 at p = 0.25");
    Ok(())
}
