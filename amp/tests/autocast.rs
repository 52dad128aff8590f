//! autocast: the output dtype of every policy category under f16 and bf16,
//! backward in the forward's dtype, the parameter-cast cache, nesting,
//! overrides, what is not autocast, and f32 accumulation of half sums.

use brasa_amp::{
    autocast, autocast_disabled, autocast_policy, cached_casts, Autocast, AutocastGuard, Category, Policy, Result,
};
use brasa_autograd::Var;
use brasa_nn::functional::{
    batch_norm, binary_cross_entropy_with_logits, cross_entropy, l1_loss, layer_norm, mse_loss, nll_loss, Reduction,
};
use brasa_nn::{BatchNorm1d, LayerNorm, Linear, Module};
use brasa_tensor::{Conv2dParams, DType, Device, Tensor};

const LOW: [DType; 2] = [DType::F16, DType::BF16];

fn randn(dims: &[usize]) -> Result<Tensor> {
    Ok(Tensor::randn(dims, DType::F32)?)
}

fn param(dims: &[usize]) -> Result<Var> {
    Ok(Var::param(randn(dims)?)?)
}

fn input(dims: &[usize]) -> Result<Var> {
    Ok(Var::new(randn(dims)?))
}

/// A region that applies PyTorch's CUDA lists (with brasa's additions) to
/// every device: what a CUDA tensor gets by default, tested on host tensors.
fn cuda_lists(low: DType) -> AutocastGuard {
    Autocast::new(low).policy(Policy::cuda()).enter()
}

#[test]
fn lower_ops_run_in_the_low_dtype() -> Result<()> {
    for low in LOW {
        let _amp = autocast(low);
        let (x, w, b) = (input(&[4, 6])?, param(&[3, 6])?, param(&[3])?);
        assert_eq!(x.matmul(&w.t()?)?.dtype(), low, "matmul");
        assert_eq!(x.linear(&w, Some(&b))?.dtype(), low, "linear");
        let layer = Linear::new(6, 3, Device::CPU)?;
        assert_eq!(layer.forward(&x)?.dtype(), low, "Linear");
        let (img, k) = (input(&[2, 3, 5, 5])?, param(&[4, 3, 3, 3])?);
        assert_eq!(img.conv2d(&k, Some(&param(&[4])?), Conv2dParams::default())?.dtype(), low, "conv2d");
        // Attention computes in f32 inside and returns the low dtype; the
        // f32 leaves get f32 gradients.
        let (q, kv) = (param(&[2, 2, 5, 4])?, param(&[2, 2, 6, 4])?);
        let attn = q.scaled_dot_product_attention(&kv, &kv, &brasa_autograd::SdpaOptions::new())?;
        assert_eq!(attn.dtype(), low, "scaled_dot_product_attention");
        attn.to_dtype(DType::F32)?.sum_all()?.backward()?;
        assert_eq!(q.grad().map(|g| g.dtype()), Some(DType::F32));
        // addmm and baddbmm cast their input too (PyTorch 2.15 gives bf16
        // for an f32 input under CPU autocast), and the f32 leaves get f32
        // gradients.
        let (bias, m2) = (param(&[4, 3])?, param(&[6, 3])?);
        let mixed = bias.addmm(&x, &m2, 1.0, 1.0)?;
        assert_eq!(mixed.dtype(), low, "addmm");
        mixed.to_dtype(DType::F32)?.sum_all()?.backward()?;
        assert_eq!(bias.grad().map(|g| g.dtype()), Some(DType::F32));
        let (b1, b2) = (input(&[2, 4, 6])?, input(&[2, 6, 3])?);
        assert_eq!(param(&[4, 3])?.baddbmm(&b1, &b2, 1.0, 1.0)?.dtype(), low, "baddbmm");
        // Inputs already in the other half type are cast too (PyTorch does).
        let other = if low == DType::F16 { DType::BF16 } else { DType::F16 };
        let x_other = x.to_dtype(other)?;
        assert_eq!(x_other.matmul(&w.t()?)?.dtype(), low);
    }
    Ok(())
}

#[test]
fn addmm_with_mixed_dtypes_asks_the_policy() -> Result<()> {
    // PyTorch 2.15 (`torch.autocast("cpu", torch.bfloat16)`): an f32 input
    // with a bf16 and an f32 matrix gives bf16, and so does baddbmm with an
    // f16 batch; without autocast the mixed matrices are refused. Both
    // device lists put addmm and baddbmm in the low dtype.
    for policy in [Policy::cpu(), Policy::cuda()] {
        let _amp = Autocast::new(DType::BF16).policy(policy).enter();
        let (bias, m2) = (param(&[4, 3])?, param(&[6, 3])?);
        let m1 = Var::param(randn(&[4, 6])?.to_dtype(DType::BF16)?)?;
        let out = bias.addmm(&m1, &m2, 0.5, 2.0)?;
        assert_eq!(out.dtype(), DType::BF16, "addmm");
        out.to_dtype(DType::F32)?.sum_all()?.backward()?;
        let grads = [&bias, &m1, &m2].map(|v| v.grad().map(|g| g.dtype()));
        assert_eq!(grads, [Some(DType::F32), Some(DType::BF16), Some(DType::F32)], "each leaf in its own dtype");
        let batch = input(&[2, 4, 6])?.to_dtype(DType::F16)?;
        assert_eq!(param(&[4, 3])?.baddbmm(&batch, &input(&[2, 6, 3])?, 1.0, 1.0)?.dtype(), DType::BF16, "baddbmm");
    }
    // f64 is never autocast.
    let _amp = autocast(DType::BF16);
    let f64s = |dims: &[usize]| -> Result<Var> { Ok(Var::new(randn(dims)?.to_dtype(DType::F64)?)) };
    assert_eq!(f64s(&[4, 3])?.addmm(&f64s(&[4, 6])?, &f64s(&[6, 3])?, 1.0, 1.0)?.dtype(), DType::F64);
    Ok(())
}

#[test]
fn float32_ops_run_in_f32() -> Result<()> {
    for low in LOW {
        let _amp = cuda_lists(low);
        let h = input(&[4, 5])?.to_dtype(low)?; // an activation of a low op
        let pos = h.abs()?.add_scalar(0.5)?;
        let checks: Vec<(&str, Var)> = vec![
            ("softmax", h.softmax(-1)?),
            ("log_softmax", h.log_softmax(-1)?),
            ("exp", h.exp()?),
            ("log", pos.log()?),
            ("rsqrt", pos.rsqrt()?),
            ("powf", pos.powf(1.5)?),
            ("pow", pos.pow(&pos)?),
            ("sum", h.sum(&[1], false)?),
            ("sum_all", h.sum_all()?),
            ("mean", h.mean(&[0], false)?),
            ("mean_all", h.mean_all()?),
            ("var", h.var(&[1], 1, false)?),
            ("std", h.std(&[1], 1, false)?),
        ];
        for (name, out) in checks {
            assert_eq!(out.dtype(), DType::F32, "{name} under {low}");
        }
    }
    Ok(())
}

#[test]
fn losses_and_norms_run_in_f32() -> Result<()> {
    for low in LOW {
        let _amp = cuda_lists(low);
        let logits = input(&[6, 4])?.to_dtype(low)?;
        let classes = Tensor::from_vec(vec![0i64, 1, 2, 3, 0, 1], [6])?;
        assert_eq!(cross_entropy(&logits, &classes)?.dtype(), DType::F32, "cross_entropy");
        assert_eq!(nll_loss(&logits.log_softmax(-1)?.to_dtype(low)?, &classes)?.dtype(), DType::F32, "nll_loss");
        let target = input(&[6, 4])?; // f32 target meets a low prediction
        assert_eq!(mse_loss(&logits, &target, Reduction::Mean)?.dtype(), DType::F32, "mse_loss");
        assert_eq!(l1_loss(&logits, &target, Reduction::Sum)?.dtype(), DType::F32, "l1_loss");
        let probs = Var::new(Tensor::rand([6, 4], DType::F32)?);
        let bce = binary_cross_entropy_with_logits(&logits, &probs, Reduction::Mean, None)?;
        assert_eq!(bce.dtype(), DType::F32, "bce_with_logits");

        let (w, b) = (param(&[4])?, param(&[4])?);
        assert_eq!(layer_norm(&logits, &[4], Some(&w), Some(&b), 1e-5)?.dtype(), DType::F32, "layer_norm");
        assert_eq!(batch_norm(&logits, None, None, Some(&w), Some(&b), true, 0.1, 1e-5)?.dtype(), DType::F32);
        assert_eq!(LayerNorm::new([4], Device::CPU)?.forward(&logits)?.dtype(), DType::F32, "LayerNorm");
        assert_eq!(BatchNorm1d::new(4, Device::CPU)?.forward(&logits)?.dtype(), DType::F32, "BatchNorm1d");
    }
    Ok(())
}

/// As `torch.autocast(device_type="cpu")`: host tensors get PyTorch's CPU
/// lists by default, where softmax, exp/log and sums follow their inputs and
/// losses run in f32; a region can change either device type's table.
#[test]
fn host_tensors_get_the_cpu_lists_by_default() -> Result<()> {
    for low in LOW {
        let _amp = autocast(low);
        assert_eq!(autocast_policy(Device::CPU).as_deref(), Some(&Policy::cpu()));
        assert_eq!(autocast_policy(Device::cuda(0)).as_deref(), Some(&Policy::cuda()));
        let (x, w) = (input(&[4, 6])?, param(&[3, 6])?);
        let h = x.linear(&w, None)?;
        assert_eq!(h.dtype(), low, "linear is low precision on both lists");
        assert_eq!(h.softmax(-1)?.dtype(), low, "softmax follows its input on the CPU list");
        assert_eq!(h.log_softmax(-1)?.dtype(), low, "log_softmax too");
        assert_eq!(h.exp()?.dtype(), low, "exp too");
        assert_eq!(h.sum_all()?.dtype(), low, "sum too");
        assert_eq!(h.mean_all()?.dtype(), DType::F32, "mean: brasa's addition to both lists");
        let classes = Tensor::from_vec(vec![0i64, 1, 2, 0], [4])?;
        assert_eq!(cross_entropy(&h, &classes)?.dtype(), DType::F32, "losses are on the CPU f32 list");
        let (g, b) = (param(&[3])?, param(&[3])?);
        assert_eq!(layer_norm(&h, &[3], Some(&g), Some(&b), 1e-5)?.dtype(), low, "layer_norm is not on it");
    }
    // Overriding one device type's table leaves the other's.
    let _amp = Autocast::new(DType::BF16).cpu_policy(Policy::cuda()).enter();
    assert_eq!(autocast_policy(Device::CPU).as_deref(), Some(&Policy::cuda()));
    assert_eq!(input(&[2, 3])?.to_dtype(DType::BF16)?.softmax(-1)?.dtype(), DType::F32);
    let _inner = Autocast::new(DType::BF16).cuda_policy(Policy::empty()).enter();
    assert_eq!(autocast_policy(Device::CPU).as_deref(), Some(&Policy::cpu()), "a new region starts from the defaults");
    assert_eq!(autocast_policy(Device::cuda(0)).as_deref(), Some(&Policy::empty()));
    Ok(())
}

#[test]
fn promote_ops_take_the_widest_input() -> Result<()> {
    for low in LOW {
        let _amp = autocast(low);
        let (a32, a_low) = (input(&[2, 3])?, input(&[2, 3])?.to_dtype(low)?);
        assert_eq!(Var::cat(&[&a32, &a_low], 0)?.dtype(), DType::F32, "cat");
        assert_eq!(Var::stack(&[&a_low, &a32], 0)?.dtype(), DType::F32, "stack");
        assert_eq!(Var::cat(&[&a_low, &a_low], 1)?.dtype(), low, "cat of one dtype");
        let (f16, bf16) = (a32.to_dtype(DType::F16)?, a32.to_dtype(DType::BF16)?);
        assert_eq!(Var::stack(&[&f16, &bf16], 0)?.dtype(), DType::F32, "f16 with bf16");
    }
    Ok(())
}

#[test]
fn other_ops_follow_their_inputs() -> Result<()> {
    for low in LOW {
        let _amp = autocast(low);
        let x = input(&[3, 4])?;
        let h = x.to_dtype(low)?;
        assert_eq!(x.relu()?.dtype(), DType::F32);
        assert_eq!(h.relu()?.dtype(), low);
        assert_eq!(h.add(&h)?.dtype(), low);
        assert_eq!(h.tanh()?.dtype(), low);
        assert_eq!(x.mul_scalar(2.0)?.dtype(), DType::F32);
    }
    Ok(())
}

#[test]
fn explicit_dtypes_f64_and_in_place_ops_are_not_autocast() -> Result<()> {
    let _amp = autocast(DType::BF16);
    let x = input(&[2, 2])?;
    // An explicit conversion is what it says.
    assert_eq!(x.to_dtype(DType::F16)?.dtype(), DType::F16);
    // f64 is never autocast.
    let d = Var::new(Tensor::ones([2, 2], DType::F64)?);
    assert_eq!(d.matmul(&d)?.dtype(), DType::F64);
    assert_eq!(d.exp()?.dtype(), DType::F64);
    // In-place tensor ops keep the destination's dtype.
    let t = randn(&[2, 2])?;
    t.mul_scalar_(2.0)?;
    t.add_(&Tensor::ones([2, 2], DType::BF16)?)?;
    assert_eq!(t.dtype(), DType::F32);
    Ok(())
}

#[test]
fn backward_runs_in_the_forward_dtype_and_leaves_get_their_own() -> Result<()> {
    for low in LOW {
        let x = randn(&[5, 7])?;
        let w = param(&[7, 3])?;
        let y = {
            let _amp = autocast(low);
            Var::new(x.clone()).matmul(&w)?
        };
        assert_eq!(y.dtype(), low);
        let g = randn(&[5, 3])?.to_dtype(low)?;
        y.backward_opts(Some(&g), false)?;
        let grad = w.grad().expect("w has a gradient");
        assert_eq!(grad.dtype(), DType::F32, "the leaf's own dtype");
        // The gradient is the low-precision product xᵀ·g, made in `low`.
        let expected = x.to_dtype(low)?.t()?.matmul(&g)?.to_dtype(DType::F32)?;
        assert_eq!(grad.to_vec::<f32>()?, expected.to_vec::<f32>()?, "{low}");
    }
    Ok(())
}

#[test]
fn saved_tensors_are_low_precision() -> Result<()> {
    let w = param(&[64, 64])?;
    let x = input(&[32, 64])?;
    let f32_saved = x.matmul(&w)?.relu()?.sum_all()?.graph_stats().saved_bytes;
    let low_saved = {
        let _amp = autocast(DType::BF16);
        x.matmul(&w)?.relu()?.sum_all()?.graph_stats().saved_bytes
    };
    assert!(low_saved * 2 <= f32_saved + 64, "bf16 saves half: {low_saved} vs {f32_saved}");
    Ok(())
}

/// On the CPU, batch norm follows its half input (as in PyTorch): it saves
/// that input rather than an f32 copy, returns it in the half dtype, and
/// ReLU and pooling after it stay there. A convolution block (conv → batch
/// norm → ReLU → 2x2 max pool) then saves 6 bytes per activation under
/// bf16 (the bf16 normalised input, the bf16 ReLU output, an i64 index
/// per four activations) where f32 saves 10: 0.6x, against 0.95x when the
/// norm cast its input to f32.
#[test]
fn cpu_batch_norm_keeps_half_activations() -> Result<()> {
    use brasa_nn::{BatchNorm2d, Conv2d, Conv2dConfig, MaxPool2d, ModuleExt, Relu, Sequential};
    let block = Sequential::new()
        .push(Conv2d::with_config(3, 16, 3, Conv2dConfig::new().padding(1), Device::CPU)?)
        .push(BatchNorm2d::new(16, Device::CPU)?)
        .push(Relu)
        .push(MaxPool2d::new(2)?);
    let x = input(&[4, 3, 16, 16])?;
    let f32_saved = block.forward(&x)?.graph_stats().saved_bytes;
    let (y, bf16_saved) = {
        let _amp = autocast(DType::BF16);
        let y = block.forward(&x)?;
        let saved = y.graph_stats().saved_bytes;
        (y, saved)
    };
    assert_eq!(y.dtype(), DType::BF16, "batch norm, ReLU and pooling stay in bf16");
    let activations = 4 * 16 * 16 * 16;
    // f32: the norm's input and the ReLU's output (4 bytes each), indices.
    assert!(f32_saved >= activations * 10, "f32 saves {f32_saved}");
    // bf16: the input's cast (3 channels), the 16 channels twice in bf16,
    // the indices, and per-channel statistics and weights.
    assert!(bf16_saved <= activations * 6 + 4 * 3 * 16 * 16 * 2 + 4096, "bf16 saves {bf16_saved}");
    assert!(bf16_saved as f64 <= 0.65 * f32_saved as f64, "{bf16_saved} vs {f32_saved}");
    // Backward runs through the bf16 activations to the f32 parameters.
    y.to_dtype(DType::F32)?.sum_all()?.backward()?;
    for p in block.parameters() {
        assert_eq!(p.grad().expect("a gradient").dtype(), DType::F32);
    }
    Ok(())
}

#[test]
fn parameter_casts_are_cached_until_the_outermost_region_ends() -> Result<()> {
    let w = param(&[4, 4])?;
    let x = input(&[2, 4])?;
    {
        let _outer = autocast(DType::F16);
        let a = x.matmul(&w)?;
        let b = x.matmul(&w)?;
        assert_eq!(cached_casts(), 1, "one weight, one cast");
        {
            let _inner = autocast(DType::F16);
            x.matmul(&w)?;
            let _off = autocast_disabled();
            x.matmul(&w)?;
        }
        assert_eq!(cached_casts(), 1, "inner regions keep the cache");
        // Inputs (no grad) are not cached.
        let activation = x.matmul(&w)?.to_dtype(DType::F32)?;
        assert!(!activation.is_leaf());
        Var::new(randn(&[2, 4])?).matmul(&w)?;
        assert_eq!(cached_casts(), 1);
        // Each use has its own node: both backward passes reach w.
        a.to_dtype(DType::F32)?.sum_all()?.backward()?;
        let once = w.grad().unwrap().to_vec::<f32>()?;
        b.to_dtype(DType::F32)?.sum_all()?.backward()?;
        let twice = w.grad().unwrap().to_vec::<f32>()?;
        for (o, t) in once.iter().zip(&twice) {
            assert_eq!(2.0 * o, *t);
        }
    }
    assert_eq!(cached_casts(), 0, "cleared when the outermost region ends");
    {
        let _amp = Autocast::new(DType::F16).cache(false).enter();
        x.matmul(&w)?;
        assert_eq!(cached_casts(), 0, "cache off");
    }
    Ok(())
}

#[test]
fn linear_weight_gradients_are_f32_sums_of_the_half_operands() -> Result<()> {
    // The weight's gradient is not rounded to the low dtype and converted
    // back: it is the f32 sum of the low-precision products (exact products,
    // so only the f32 additions round), finer than any half value.
    for low in LOW {
        let (x, w, b) = (param(&[5, 40])?, param(&[3, 40])?, param(&[3])?);
        let g = randn(&[5, 3])?;
        {
            let _amp = autocast(low);
            let y = x.linear(&w, Some(&b))?;
            assert_eq!((y.dtype(), y.grad_fn_name()), (low, Some("linear")));
            assert_eq!(cached_casts(), 3, "x, w and b are parameters: their casts are cached");
            y.backward_with(&g)?;
        }
        let wide = |t: &Tensor| -> Result<Vec<f64>> { Ok(t.to_dtype(low)?.to_dtype(DType::F64)?.to_vec::<f64>()?) };
        let (gl, xl, wl) = (wide(&g)?, wide(x.tensor())?, wide(w.tensor())?);
        let grad = |v: &Var| -> Result<Vec<f32>> {
            let g = v.grad().expect("a gradient");
            assert_eq!(g.dtype(), DType::F32, "each parameter's gradient in its own dtype");
            Ok(g.to_vec::<f32>()?)
        };
        let (gw, gx, gb) = (grad(&w)?, grad(&x)?, grad(&b)?);
        let mut off_the_low_grid = 0;
        for o in 0..3 {
            for i in 0..40 {
                let terms: Vec<f64> = (0..5).map(|r| gl[r * 3 + o] * xl[r * 40 + i]).collect();
                let exact: f64 = terms.iter().sum();
                let magnitude: f64 = terms.iter().map(|t| t.abs()).sum();
                let got = f64::from(gw[o * 40 + i]);
                assert!((got - exact).abs() <= 1e-6 * magnitude + 1e-30, "{low} gW[{o},{i}] {got} vs {exact}");
                let on_grid = Tensor::from_vec(vec![gw[o * 40 + i]], [1])?.to_dtype(low)?.to_dtype(DType::F32)?;
                off_the_low_grid += usize::from(on_grid.to_vec::<f32>()?[0] != gw[o * 40 + i]);
            }
        }
        assert!(off_the_low_grid > 60, "{low}: only {off_the_low_grid} of 120 sums are finer than {low}");
        // The input's and the bias's gradients: computed in the low dtype.
        for r in 0..5 {
            for i in 0..40 {
                let exact: f64 = (0..3).map(|o| gl[r * 3 + o] * wl[o * 40 + i]).sum();
                let magnitude: f64 = (0..3).map(|o| (gl[r * 3 + o] * wl[o * 40 + i]).abs()).sum();
                let got = f64::from(gx[r * 40 + i]);
                assert!((got - exact).abs() <= 1e-2 * magnitude + 1e-6, "{low} gx[{r},{i}] {got} vs {exact}");
            }
        }
        for o in 0..3 {
            let exact: f64 = (0..5).map(|r| gl[r * 3 + o]).sum();
            let magnitude: f64 = (0..5).map(|r| gl[r * 3 + o].abs()).sum();
            assert!((f64::from(gb[o]) - exact).abs() <= 1e-2 * magnitude, "{low} gb[{o}]");
        }
    }
    Ok(())
}

#[test]
fn autocast_linear_matches_explicit_casts_whichever_inputs_need_gradients() -> Result<()> {
    // The linear node over the original inputs against the graph of
    // explicit casts it replaces: the same output and input/bias gradients
    // bit for bit, the weight's gradient the f32 sum that the explicit
    // graph rounds to bf16 (so within half a bf16 step of it).
    let g = randn(&[2, 3, 4])?;
    for (x_grad, w_grad, with_bias) in
        [(true, true, true), (false, true, true), (true, false, true), (true, true, false), (false, true, false)]
    {
        let x = Var::new(randn(&[2, 3, 5])?);
        x.requires_grad_(x_grad)?;
        let w = Var::new(randn(&[4, 5])?);
        w.requires_grad_(w_grad)?;
        let b = param(&[4])?;
        let bias = with_bias.then_some(&b);
        let grads = |v: &Var| v.grad().map(|g| g.to_vec::<f32>()).transpose();
        let autocast_out = {
            let _amp = autocast(DType::BF16);
            let y = x.linear(&w, bias)?;
            y.backward_with(&g)?;
            y.tensor().to_dtype(DType::F32)?.to_vec::<f32>()?
        };
        let autocast_grads = (grads(&x)?, grads(&w)?, grads(&b)?);
        for v in [&x, &w, &b] {
            v.zero_grad(true)?;
        }
        let cast = |v: &Var| v.to_dtype(DType::BF16);
        let explicit = cast(&x)?.linear(&cast(&w)?, bias.map(cast).transpose()?.as_ref())?;
        explicit.backward_with(&g)?;
        let case = format!("x grad {x_grad}, w grad {w_grad}, bias {with_bias}");
        assert_eq!(autocast_out, explicit.tensor().to_dtype(DType::F32)?.to_vec::<f32>()?, "{case}: output");
        assert_eq!(autocast_grads.0, grads(&x)?, "{case}: input gradient");
        assert_eq!(autocast_grads.2, grads(&b)?, "{case}: bias gradient");
        match (autocast_grads.1, grads(&w)?) {
            (Some(sums), Some(rounded)) => {
                for (s, r) in sums.iter().zip(&rounded) {
                    assert!((s - r).abs() <= r.abs() / 256.0, "{case}: weight gradient {s} vs {r}");
                }
            }
            (None, None) => assert!(!w_grad, "{case}"),
            other => panic!("{case}: weight gradients {other:?}"),
        }
    }
    Ok(())
}

#[test]
fn several_steps_in_one_region_train_with_fresh_casts() -> Result<()> {
    // The cache must not hand out a stale weight after an in-place update,
    // nor a graph node that a previous backward released.
    let w = Var::param(Tensor::from_vec(vec![1.0f32, 2.0], [2, 1])?)?;
    let x = Var::new(Tensor::from_vec(vec![1.0f32, 1.0], [1, 2])?);
    let _amp = autocast(DType::BF16);
    let mut outputs = Vec::new();
    for _ in 0..3 {
        let y = x.matmul(&w)?;
        outputs.push(y.to_dtype(DType::F32)?.item()?);
        y.to_dtype(DType::F32)?.sum_all()?.backward()?;
        let g = w.grad().unwrap();
        {
            let _no_grad = brasa_autograd::no_grad();
            w.tensor().sub_(&g)?; // an SGD step with lr 1
        }
        w.zero_grad(true)?;
    }
    assert_eq!(outputs, [3.0, 1.0, -1.0]);
    Ok(())
}

#[test]
fn disabled_region_runs_in_the_inputs_dtypes() -> Result<()> {
    let _amp = autocast(DType::F16);
    let (x, w) = (input(&[2, 3])?, param(&[3, 3])?);
    let _off = autocast_disabled();
    assert_eq!(x.matmul(&w)?.dtype(), DType::F32);
    let h = x.to_dtype(DType::F16)?;
    assert_eq!(h.softmax(-1)?.dtype(), DType::F16);
    Ok(())
}

#[test]
fn the_policy_can_be_overridden_per_op() -> Result<()> {
    let policy = Policy::default().with("softmax", Category::Follow).with("linear", Category::Float32);
    let _amp = Autocast::new(DType::BF16).policy(policy).enter();
    let x = input(&[2, 3])?;
    let h = x.to_dtype(DType::BF16)?;
    assert_eq!(h.softmax(-1)?.dtype(), DType::BF16, "overridden to follow");
    assert_eq!(x.linear(&param(&[2, 3])?, None)?.dtype(), DType::F32, "overridden to f32");
    assert_eq!(x.matmul(&param(&[3, 2])?)?.dtype(), DType::BF16, "the rest of the table stays");
    // PyTorch's exact CPU lists leave softmax to its input.
    let _cpu = Autocast::new(DType::BF16).policy(Policy::pytorch_cpu()).enter();
    assert_eq!(h.softmax(-1)?.dtype(), DType::BF16);
    assert_eq!(h.log_softmax(-1)?.dtype(), DType::BF16);
    Ok(())
}

#[test]
fn norms_take_half_inputs_with_f32_parameters() -> Result<()> {
    // Outside autocast: a half model with f32 norms (brasa_amp::to_half).
    for low in LOW {
        let x32 = randn(&[8, 4])?;
        let x = Var::param(x32.to_dtype(low)?)?;
        let (w, b) = (param(&[4])?, param(&[4])?);
        let (mean, var) = (Tensor::zeros([4], DType::F32)?, Tensor::ones([4], DType::F32)?);
        let y = batch_norm(&x, Some(&mean), Some(&var), Some(&w), Some(&b), true, 0.1, 1e-5)?;
        assert_eq!(y.dtype(), low, "batch_norm returns the input's dtype");
        assert_eq!(mean.dtype(), DType::F32);
        let z = layer_norm(&x, &[4], Some(&w), Some(&b), 1e-5)?;
        assert_eq!(z.dtype(), low);
        y.to_dtype(DType::F32)?.sum_all()?.add(&z.to_dtype(DType::F32)?.sum_all()?)?.backward()?;
        assert_eq!(w.grad().unwrap().dtype(), DType::F32);
        assert_eq!(x.grad().unwrap().dtype(), low);
        // The values match the f32 computation to the half type's precision.
        let reference = layer_norm(&Var::new(x.tensor().to_dtype(DType::F32)?), &[4], Some(&w), Some(&b), 1e-5)?;
        let (got, want) = (z.tensor().to_dtype(DType::F32)?.to_vec::<f32>()?, reference.tensor().to_vec::<f32>()?);
        for (g, r) in got.iter().zip(&want) {
            assert!((g - r).abs() <= 0.02 * r.abs().max(1.0), "{g} vs {r}");
        }
        // And in evaluation mode, from the f32 running statistics.
        let e = batch_norm(&x, Some(&mean), Some(&var), Some(&w), Some(&b), false, 0.1, 1e-5)?;
        assert_eq!(e.dtype(), low);
    }
    Ok(())
}

#[test]
fn half_sums_and_means_accumulate_in_f32() -> Result<()> {
    // 10,000 × 0.1: an f16 accumulator stalls at 256 (its spacing there is 0.25).
    let tenths = Tensor::full([10_000], 0.1, DType::F16)?;
    let sum = tenths.sum_all()?;
    assert_eq!(sum.dtype(), DType::F16, "the result keeps the input's dtype, as in PyTorch");
    let value = sum.to_dtype(DType::F32)?.item::<f32>()?;
    assert!((value - 999.76).abs() < 1.0, "{value}");
    let mean = tenths.mean_all()?.to_dtype(DType::F32)?.item::<f32>()?;
    assert!((mean - 0.1).abs() < 1e-3, "{mean}");
    // 70,000 ones: accurate in bf16 (rounded once: 70144), beyond f16's range (inf, as PyTorch's f16 sum).
    let ones = Tensor::ones([70_000], DType::BF16)?;
    assert_eq!(ones.sum_all()?.to_dtype(DType::F32)?.item::<f32>()?, 70144.0);
    assert_eq!(ones.mean_all()?.to_dtype(DType::F32)?.item::<f32>()?, 1.0);
    let ones16 = Tensor::ones([70_000], DType::F16)?;
    assert!(ones16.sum_all()?.to_dtype(DType::F32)?.item::<f32>()?.is_infinite());
    assert_eq!(ones16.mean_all()?.to_dtype(DType::F32)?.item::<f32>()?, 1.0, "the mean is in range");
    // Along a dim (the column plan) too.
    let cols = Tensor::full([4096, 3], 0.1, DType::BF16)?.sum(&[0], false)?;
    for v in cols.to_dtype(DType::F32)?.to_vec::<f32>()? {
        assert!((v - 409.6).abs() < 2.0, "{v}");
    }
    // Under autocast with the CUDA lists the Var sum is f32: 70,000 exactly.
    let _amp = cuda_lists(DType::F16);
    let x = Var::new(ones16);
    assert_eq!(x.sum_all()?.dtype(), DType::F32);
    assert_eq!(x.sum_all()?.item()?, 70000.0);
    Ok(())
}

/// A checkpointed segment recomputes under the autocast region its forward
/// ran in (without that, the recomputation would run in f32 and differ).
#[test]
fn checkpoint_recomputes_in_the_forward_dtype() -> brasa_amp::Result<()> {
    let w = brasa_autograd::Var::param(brasa_tensor::Tensor::randn([8, 8], brasa_tensor::DType::F32)?)?;
    let x = brasa_autograd::Var::new(brasa_tensor::Tensor::randn([4, 8], brasa_tensor::DType::F32)?);
    let w2 = w.clone();
    let loss = {
        let _amp = brasa_amp::autocast(brasa_tensor::DType::BF16);
        let h = brasa_autograd::checkpoint(move |xs| xs[0].matmul(&w2)?.relu(), &[&x])?;
        assert_eq!(h.dtype(), brasa_tensor::DType::BF16);
        h.to_dtype(brasa_tensor::DType::F32)?.sum_all()?
    };
    loss.backward()?;
    assert_eq!(w.grad().map(|g| g.dtype()), Some(brasa_tensor::DType::F32));
    Ok(())
}

#[test]
fn one_d_and_transposed_convolutions_ask_under_their_own_names() -> Result<()> {
    use brasa_tensor::{Conv1dParams, ConvTranspose1dParams, ConvTranspose2dParams};
    for low in LOW {
        let _amp = autocast(low);
        let (img, k) = (input(&[2, 3, 4, 4])?, param(&[3, 2, 3, 3])?);
        let y = img.conv_transpose2d(&k, Some(&param(&[2])?), ConvTranspose2dParams::default())?;
        assert_eq!(y.dtype(), low, "conv_transpose2d");
        let (seq, k1) = (input(&[2, 3, 6])?, param(&[4, 3, 2])?);
        assert_eq!(seq.conv1d(&k1, None, Conv1dParams::default())?.dtype(), low, "conv1d");
        let kt = param(&[3, 4, 2])?;
        assert_eq!(seq.conv_transpose1d(&kt, None, ConvTranspose1dParams::default())?.dtype(), low, "conv_transpose1d");
    }
    // Each asks under its own name: overriding one leaves conv2d alone.
    let policy = Policy::default()
        .with("conv1d", Category::Float32)
        .with("conv_transpose1d", Category::Float32)
        .with("conv_transpose2d", Category::Float32);
    let _amp = Autocast::new(DType::BF16).policy(policy).enter();
    let seq = input(&[1, 2, 5])?.to_dtype(DType::BF16)?;
    assert_eq!(seq.conv1d(&param(&[2, 2, 2])?, None, Conv1dParams::default())?.dtype(), DType::F32);
    let t = seq.conv_transpose1d(&param(&[2, 2, 2])?, None, ConvTranspose1dParams::default())?;
    assert_eq!(t.dtype(), DType::F32);
    let img = input(&[1, 2, 3, 3])?.to_dtype(DType::BF16)?;
    let t2 = img.conv_transpose2d(&param(&[2, 2, 2, 2])?, None, ConvTranspose2dParams::default())?;
    assert_eq!(t2.dtype(), DType::F32);
    assert_eq!(img.conv2d(&param(&[2, 2, 2, 2])?, None, Conv2dParams::default())?.dtype(), DType::BF16);
    Ok(())
}
