//! The 1-d and transposed convolution layers against PyTorch's behaviour:
//! parameter shapes, names and counts, output shapes (output padding,
//! groups, unbatched inputs), initialisation bounds (PyTorch's fan_in of a
//! transposed weight comes from its second dim), the forward equal to the
//! op on the layer's parameters, gradients against finite differences, a
//! training step that lowers a loss, and errors naming the layer.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{gradcheck, Var};
use brasa_nn::functional::{mse_loss, Reduction};
use brasa_nn::optim::{Optimizer, Sgd, SgdConfig};
use brasa_nn::{
    Conv1d, Conv1dConfig, ConvTranspose1d, ConvTranspose1dConfig, ConvTranspose2d, ConvTranspose2dConfig, Module,
    ModuleExt, NnError, Relu, Result, Sequential,
};
use brasa_tensor::{manual_seed, DType, Tensor};

#[path = "support/fixtures.rs"]
mod fixtures;
use fixtures::{assert_close, invalid_message, tensor_f64, to_f64, DEV};

fn zeros(shape: &[usize]) -> Var {
    Var::new(Tensor::zeros(shape, DType::F32).unwrap())
}

fn names(m: &impl ModuleExt) -> Vec<String> {
    m.named_parameters().into_iter().map(|(n, _)| n).collect()
}

fn into_autograd(err: NnError) -> brasa_autograd::AutogradError {
    match err {
        NnError::Autograd(e) => e,
        NnError::Tensor(e) => e.into(),
        other => brasa_autograd::AutogradError::Invalid { op: "test", message: other.to_string() },
    }
}

#[test]
fn shapes_names_and_parameter_counts() -> Result<()> {
    let config = ConvTranspose2dConfig::new().stride((2, 3)).padding((1, 0)).output_padding((1, 2)).groups(2);
    let up = ConvTranspose2d::with_config(4, 6, (3, 2), config, DEV)?;
    assert_eq!(up.weight.dims(), &[4, 3, 3, 2]);
    assert_eq!(up.bias.as_ref().unwrap().dims(), &[6]);
    assert_eq!((up.in_channels(), up.out_channels(), up.kernel_size()), (4, 6, (3, 2)));
    assert_eq!(names(&up), ["weight", "bias"]);
    assert_eq!(up.num_parameters(), 4 * 3 * 3 * 2 + 6);
    assert_eq!(up.state_dict().names().collect::<Vec<_>>(), ["weight", "bias"]);
    // H: (5-1)*2 - 2 + 2 + 1 + 1 = 10; W: (4-1)*3 + 1 + 2 + 1 = 13.
    assert_eq!(up.forward(&zeros(&[2, 4, 5, 4]))?.dims(), &[2, 6, 10, 13]);
    assert_eq!(up.forward(&zeros(&[4, 5, 4]))?.dims(), &[6, 10, 13]);

    let conv = Conv1d::with_config(6, 4, 3, Conv1dConfig::new().stride(2).padding(1).dilation(2).groups(2), DEV)?;
    assert_eq!(conv.weight.dims(), &[4, 3, 3]);
    assert_eq!((conv.in_channels(), conv.out_channels(), conv.kernel_size()), (6, 4, 3));
    assert_eq!(conv.num_parameters(), 4 * 3 * 3 + 4);
    // (11 + 2 - 4 - 1) / 2 + 1 = 5.
    assert_eq!(conv.forward(&zeros(&[3, 6, 11]))?.dims(), &[3, 4, 5]);
    assert_eq!(conv.forward(&zeros(&[6, 11]))?.dims(), &[4, 5]);

    let t = ConvTranspose1d::with_config(4, 2, 4, ConvTranspose1dConfig::new().stride(3).bias(false), DEV)?;
    assert_eq!(t.weight.dims(), &[4, 2, 4]);
    assert!(t.bias.is_none());
    assert_eq!(names(&t), ["weight"]);
    assert_eq!(t.num_parameters(), 32);
    // (5-1)*3 + 3 + 1 = 16.
    assert_eq!(t.forward(&zeros(&[2, 4, 5]))?.dims(), &[2, 2, 16]);
    Ok(())
}

#[test]
fn transposed_init_takes_fan_in_from_the_second_dim() -> Result<()> {
    // PyTorch: fan_in = weight.size(1) * k = (out_channels / groups) * k.
    let up = ConvTranspose2d::with_config(32, 8, 3, ConvTranspose2dConfig::new().groups(2), DEV)?;
    let bound = 1.0 / ((4 * 9) as f64).sqrt();
    let w = up.weight.tensor().to_vec::<f32>()?;
    let b = up.bias.as_ref().unwrap().tensor().to_vec::<f32>()?;
    assert!(w.iter().chain(&b).all(|v| (v.abs() as f64) <= bound), "values beyond ±{bound}");
    // 32·4·9 = 1,152 draws of U(-b, b): the largest is close to b, which
    // the fan_in of the first dim (16·9) would not reach.
    let max = w.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
    assert!(max > 0.9 * bound, "max {max}, bound {bound}");
    let one = ConvTranspose1d::new(16, 5, 2, DEV)?;
    let bound = 1.0 / ((5 * 2) as f64).sqrt();
    let w = one.weight.tensor().to_vec::<f32>()?;
    assert!(w.iter().all(|v| (v.abs() as f64) <= bound) && w.iter().any(|v| v.abs() as f64 > 0.9 * bound));
    let conv = Conv1d::new(5, 16, 2, DEV)?;
    let w = conv.weight.tensor().to_vec::<f32>()?;
    assert!(w.iter().all(|v| (v.abs() as f64) <= bound) && w.iter().any(|v| v.abs() as f64 > 0.9 * bound));
    Ok(())
}

#[test]
fn forward_is_the_op_on_the_parameters_and_gradchecks() -> Result<()> {
    let config = ConvTranspose2dConfig::new().stride(2).padding(1).output_padding(1).dtype(DType::F64);
    let up = ConvTranspose2d::with_config(2, 3, 3, config, DEV)?;
    let x = tensor_f64(&[2, 2, 3, 3], 0.4);
    let want = x.conv_transpose2d(up.weight.tensor(), up.bias.as_ref().map(|b| b.tensor()), up.params)?;
    assert_close(&to_f64(&up.forward(&Var::new(x.clone()))?), &want.to_vec::<f64>()?, 0.0);
    gradcheck(|v| up.forward(&v[0]).map_err(into_autograd), &[x], 1e-6, 1e-7, 1e-5)?;
    // The bias gradient of a sum is the number of output pixels per channel.
    up.forward(&Var::new(tensor_f64(&[1, 2, 3, 3], 0.0)))?.sum_all()?.backward()?;
    assert_eq!(up.bias.as_ref().unwrap().grad().unwrap().to_vec::<f64>()?, [36.0; 3]);
    assert_eq!(up.weight.grad().unwrap().dims(), &[2, 3, 3, 3]);

    let conv = Conv1d::with_config(2, 3, 2, Conv1dConfig::new().padding(1).dtype(DType::F64), DEV)?;
    gradcheck(|v| conv.forward(&v[0]).map_err(into_autograd), &[tensor_f64(&[2, 2, 5], 0.7)], 1e-6, 1e-7, 1e-5)?;
    let t =
        ConvTranspose1d::with_config(2, 4, 3, ConvTranspose1dConfig::new().stride(2).groups(2).dtype(DType::F64), DEV)?;
    gradcheck(|v| t.forward(&v[0]).map_err(into_autograd), &[tensor_f64(&[2, 2, 4], 0.9)], 1e-6, 1e-7, 1e-5)?;
    Ok(())
}

#[test]
fn a_training_step_lowers_the_loss() -> Result<()> {
    manual_seed(11);
    // An encoder-decoder over sequences: Conv1d down by 2, ConvTranspose1d back up.
    let model = Sequential::new()
        .push(Conv1d::with_config(2, 8, 3, Conv1dConfig::new().stride(2).padding(1), DEV)?)
        .push(Relu)
        .push(ConvTranspose1d::with_config(
            8,
            2,
            3,
            ConvTranspose1dConfig::new().stride(2).padding(1).output_padding(1),
            DEV,
        )?);
    let x = Var::new(tensor_f64(&[4, 2, 16], 0.2).to_dtype(DType::F32)?);
    let target = Var::new(tensor_f64(&[4, 2, 16], 1.3).to_dtype(DType::F32)?);
    let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() })?;
    let mut losses = Vec::new();
    for _ in 0..20 {
        let loss = mse_loss(&model.forward(&x)?, &target, Reduction::Mean)?;
        losses.push(loss.item()?);
        opt.zero_grad()?;
        loss.backward()?;
        opt.step()?;
    }
    assert!(losses[19] < 0.8 * losses[0], "losses {losses:?}");

    // One step of a 2-d upsampler lowers its loss too.
    let up = ConvTranspose2d::with_config(3, 2, 4, ConvTranspose2dConfig::new().stride(2).padding(1), DEV)?;
    let img = Var::new(tensor_f64(&[2, 3, 4, 4], 0.5).to_dtype(DType::F32)?);
    let goal = Var::new(tensor_f64(&[2, 2, 8, 8], 2.1).to_dtype(DType::F32)?);
    let mut opt = Sgd::new(up.parameters(), SgdConfig { lr: 0.02, ..Default::default() })?;
    let before = mse_loss(&up.forward(&img)?, &goal, Reduction::Mean)?;
    before.backward()?;
    opt.step()?;
    let after = mse_loss(&up.forward(&img)?, &goal, Reduction::Mean)?;
    assert!(after.item()? < before.item()?, "{} then {}", before.item()?, after.item()?);
    Ok(())
}

#[test]
fn bad_configurations_and_inputs_name_the_layer() -> Result<()> {
    let err = |r: Result<ConvTranspose2d>| invalid_message(r.unwrap_err());
    let (what, message) =
        err(ConvTranspose2d::with_config(4, 4, 3, ConvTranspose2dConfig::new().stride(2).output_padding((0, 2)), DEV));
    assert_eq!(what, "ConvTranspose2d");
    assert_eq!(
        message,
        "output_padding [0, 2] must be smaller than either stride [2, 2] or dilation [1, 1] in each dim"
    );
    let (_, message) = err(ConvTranspose2d::with_config(4, 6, 3, ConvTranspose2dConfig::new().groups(4), DEV));
    assert_eq!(message, "in_channels (4) and out_channels (6) must both be divisible by groups (4)");
    let (_, message) = err(ConvTranspose2d::new(4, 4, (3, 0), DEV));
    assert_eq!(message, "kernel size must be positive, got [3, 0]");
    let (_, message) = err(ConvTranspose2d::with_config(4, 4, 3, ConvTranspose2dConfig::new().dtype(DType::I64), DEV));
    assert_eq!(message, "parameters must be floating point, got i64");
    // Output padding past the stride is allowed below the dilation, as in PyTorch.
    assert!(
        ConvTranspose2d::with_config(4, 4, 3, ConvTranspose2dConfig::new().dilation(3).output_padding(2), DEV).is_ok()
    );

    let (what, message) =
        invalid_message(Conv1d::with_config(3, 4, 3, Conv1dConfig::new().stride(0), DEV).unwrap_err());
    assert_eq!(
        (what, message.as_str()),
        ("Conv1d", "stride and dilation must be positive, got stride [0] and dilation [1]")
    );
    let (what, _) = invalid_message(
        ConvTranspose1d::with_config(3, 4, 3, ConvTranspose1dConfig::new().output_padding(1), DEV).unwrap_err(),
    );
    assert_eq!(what, "ConvTranspose1d");

    let conv = Conv1d::new(3, 8, 3, DEV)?;
    let (what, message) = invalid_message(conv.forward(&zeros(&[2, 3, 4, 5])).unwrap_err());
    assert_eq!(what, "Conv1d");
    assert_eq!(message, "expected an input of shape [N, 3, L] or [3, L], got [2, 3, 4, 5] (rank 4)");
    let up = ConvTranspose2d::new(3, 8, 3, DEV)?;
    let (what, message) = invalid_message(up.forward(&zeros(&[2, 4, 5, 5])).unwrap_err());
    assert_eq!(what, "ConvTranspose2d");
    assert_eq!(message, "expected 3 input channels, got 4 in an input of shape [2, 4, 5, 5] (weight [3, 8, 3, 3])");
    Ok(())
}
