//! End to end: a model whose f16 gradients underflow trains once the loss
//! is scaled, and the digits trained under bf16 autocast reach the f32
//! model's accuracy.

use brasa_amp::{autocast, GradScaler, Result};
use brasa_autograd::Var;
use brasa_nn::data::Digits;
use brasa_nn::functional::{cross_entropy, mse_loss, Reduction};
use brasa_nn::optim::{Optimizer, Sgd, SgdConfig};
use brasa_nn::{Linear, Module, ModuleExt, Relu, Sequential};
use brasa_tensor::{DType, Device, Tensor};

const DEV: Device = Device::CPU;

/// A regression whose loss is multiplied by 1e-8 (and the learning rate
/// divided by as much): the gradients reaching the f16 activations are
/// ~1e-9, below f16's smallest subnormal (6e-8), so they flush to zero.
struct Tiny {
    model: Linear,
    x: Var,
    y: Var,
}

const LOSS_FACTOR: f64 = 1e-8;

impl Tiny {
    fn new() -> Result<Tiny> {
        let model = Linear::new(8, 1, DEV)?;
        let x = Tensor::randn([64, 8], DType::F32)?;
        let w_true = Tensor::from_vec(vec![0.5f32, -1.0, 2.0, 0.0, 1.5, -0.5, 1.0, -2.0], [8, 1])?;
        let y = x.matmul(&w_true)?;
        Ok(Tiny { model, x: Var::new(x), y: Var::new(y) })
    }

    fn loss(&self) -> Result<Var> {
        let _amp = autocast(DType::F16);
        let prediction = self.model.forward(&self.x)?;
        assert_eq!(prediction.dtype(), DType::F16);
        Ok(mse_loss(&prediction, &self.y, Reduction::Mean)?.mul_scalar(LOSS_FACTOR)?)
    }

    fn optimizer(&self) -> Result<Sgd> {
        Ok(Sgd::new(self.model.parameters(), SgdConfig { lr: 0.1 / LOSS_FACTOR, ..Default::default() })?)
    }
}

#[test]
fn f16_gradients_underflow_without_scaling() -> Result<()> {
    let tiny = Tiny::new()?;
    let mut opt = tiny.optimizer()?;
    let first = tiny.loss()?;
    first.backward()?;
    let grads: Vec<f32> =
        tiny.model.parameters().iter().flat_map(|p| p.grad().unwrap().to_vec::<f32>().unwrap()).collect();
    assert!(grads.iter().all(|&g| g == 0.0), "every gradient flushed to zero: {grads:?}");
    opt.step()?;
    opt.zero_grad()?;
    for _ in 0..5 {
        tiny.loss()?.backward()?;
        opt.step()?;
        opt.zero_grad()?;
    }
    assert_eq!(tiny.loss()?.item()?, first.item()?, "nothing was learned");
    Ok(())
}

#[test]
fn the_same_model_trains_with_a_grad_scaler() -> Result<()> {
    let tiny = Tiny::new()?;
    let mut opt = tiny.optimizer()?;
    let mut scaler = GradScaler::new();
    let first = tiny.loss()?.item()?;
    for _ in 0..60 {
        let loss = tiny.loss()?;
        scaler.scale(&loss)?.backward()?;
        scaler.step(&mut opt)?;
        scaler.update()?;
        opt.zero_grad()?;
    }
    let last = tiny.loss()?.item()?;
    assert!(last < 0.05 * first, "loss {first:e} -> {last:e}");
    Ok(())
}

fn digits_mlp() -> Result<Sequential> {
    Ok(Sequential::new().push(Linear::new(64, 64, DEV)?).push(Relu).push(Linear::new(64, 10, DEV)?))
}

/// Trains `model` on the digits' training split (fixed batch order) and
/// returns its accuracy on the test split, in percent, both under `amp`.
fn train_digits(model: &Sequential, amp: Option<DType>) -> Result<f64> {
    let (train, test) = Digits::load()?.train_test()?;
    let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() })?;
    let (n, batch) = (train.features().dims()[0], 32);
    for _epoch in 0..8 {
        for start in (0..n).step_by(batch) {
            let len = batch.min(n - start);
            let x = Var::new(train.features().narrow(0, start, len)?);
            let y = train.labels().narrow(0, start, len)?;
            let loss = {
                let _amp = amp.map(autocast);
                cross_entropy(&model.forward(&x)?, &y)?
            };
            assert_eq!(loss.dtype(), DType::F32);
            loss.backward()?;
            opt.step()?;
            opt.zero_grad()?;
        }
    }
    let logits = {
        let _amp = amp.map(autocast);
        let _no_grad = brasa_autograd::no_grad();
        model.forward(&Var::new(test.features().clone()))?
    };
    let predicted = logits.tensor().argmax(&[1], false)?;
    let correct = predicted.eq(test.labels())?.to_dtype(DType::F32)?.sum_all()?.item::<f32>()?;
    Ok(100.0 * correct as f64 / test.labels().numel() as f64)
}

#[test]
fn digits_under_bf16_autocast_reach_f32_accuracy() -> Result<()> {
    let f32_model = digits_mlp()?;
    let bf16_model = digits_mlp()?;
    bf16_model.load_state_dict(&f32_model.state_dict(), true)?; // the same start
    let f32_accuracy = train_digits(&f32_model, None)?;
    let bf16_accuracy = train_digits(&bf16_model, Some(DType::BF16))?;
    eprintln!("digits: f32 {f32_accuracy:.2}%, bf16 autocast {bf16_accuracy:.2}%");
    assert!(bf16_model.parameters().iter().all(|p| p.dtype() == DType::F32), "parameters stay f32");
    assert!(f32_accuracy > 90.0, "f32 accuracy {f32_accuracy:.2}%");
    assert!((bf16_accuracy - f32_accuracy).abs() <= 1.0, "bf16 {bf16_accuracy:.2}% vs f32 {f32_accuracy:.2}%");
    Ok(())
}
