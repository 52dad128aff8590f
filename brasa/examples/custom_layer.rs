//! Extending brasa with your own layer: a differentiable operation written by
//! hand through [`Function`], checked against finite differences with
//! [`gradcheck`], wrapped in a `#[derive(Parameters)]` layer that holds a
//! `Linear` and a parameter of its own, and trained on the bundled digits.
//!
//! ```text
//! cargo run --release --example custom_layer
//! ```
//!
//! The operation is PReLU, a leaky ReLU whose negative slope is learned (one
//! slope per feature): `y = max(x, 0) + a · min(x, 0)`. Its forward runs on
//! plain tensors and saves what backward needs; its backward returns one
//! gradient per input. Everything else (recording the graph, calling the
//! backward, releasing the saved tensors, type and shape checks) is brasa's.

use brasa::autograd::apply;
use brasa::nn::data::{DataLoader, Digits, TensorDataset};
use brasa::prelude::*;
use std::time::Instant;

type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The operation, with a hand-written backward. Inputs: `x` of shape
/// `[batch, features]` and the slopes `a` of shape `[features]`.
struct PReluOp;

impl Function for PReluOp {
    fn name(&self) -> &'static str {
        "prelu"
    }

    fn forward(&mut self, ctx: &mut FunctionCtx, inputs: &[Tensor]) -> brasa::autograd::Result<Tensor> {
        let (x, a) = (&inputs[0], &inputs[1]);
        // Backward needs the input (where it is negative, and by how much)
        // and the slopes; nothing else is kept alive.
        ctx.save_for_backward(x);
        ctx.save_for_backward(a);
        let negative_part = x.clamp(None, Some(0.0))?; // min(x, 0)
        Ok(x.relu()?.add(&negative_part.mul(a)?)?) // `a` broadcasts over the batch
    }

    fn backward(
        &mut self,
        saved: &[Tensor],
        grad: &Tensor,
        needs: &[bool],
    ) -> brasa::autograd::Result<Vec<Option<Tensor>>> {
        let (x, a) = (&saved[0], &saved[1]);
        // dy/dx is 1 where x > 0 and a elsewhere.
        let grad_x = if needs[0] {
            let one = Tensor::ones_on([], x.dtype(), x.device())?;
            Some(grad.mul(&x.gt_scalar(0.0)?.where_cond(&one, a)?)?)
        } else {
            None
        };
        // dy/da is min(x, 0); `a` was broadcast over the batch in forward, so
        // its gradient sums over the batch dimension.
        let grad_a = if needs[1] { Some(grad.mul(&x.clamp(None, Some(0.0))?)?.sum(&[0], false)?) } else { None };
        Ok(vec![grad_x, grad_a])
    }
}

/// `PReLU(Linear(x))`: a layer whose parameters are found by the derive:
/// the `Linear`'s (as `linear.weight`, `linear.bias`) and the `Var` field.
#[derive(Parameters)]
struct PReluLinear {
    linear: Linear,
    /// One learned negative slope per output feature (PyTorch's default start: 0.25).
    slope: Var,
}

impl PReluLinear {
    fn new(in_features: usize, out_features: usize, dev: Device) -> brasa::nn::Result<PReluLinear> {
        let slope = Var::param(Tensor::full_on([out_features], 0.25, DType::F32, dev)?)?;
        Ok(PReluLinear { linear: Linear::new(in_features, out_features, dev)?, slope })
    }
}

impl Module for PReluLinear {
    fn forward(&self, x: &Var) -> brasa::nn::Result<Var> {
        let h = self.linear.forward(x)?;
        Ok(apply(PReluOp, &[&h, &self.slope])?)
    }
}

/// The model: custom layers compose like built-in ones (names nest).
#[derive(Parameters)]
struct DigitsNet {
    hidden: PReluLinear,
    out: Linear,
}

impl Module for DigitsNet {
    fn forward(&self, x: &Var) -> brasa::nn::Result<Var> {
        self.out.forward(&self.hidden.forward(x)?)
    }
}

/// Accuracy on a whole dataset, without a graph.
fn accuracy(model: &DigitsNet, data: &TensorDataset) -> brasa::nn::Result<f64> {
    let _no_grad = no_grad();
    let logits = model.forward(&Var::new(data.features().clone()))?;
    let predicted = logits.tensor().argmax(&[-1], false)?;
    let correct = predicted.eq(data.labels())?.to_dtype(DType::F64)?.sum_all()?.item::<f64>()?;
    Ok(correct / data.len() as f64)
}

fn main() -> AnyResult<()> {
    let dev = Device::CPU;
    manual_seed(0);

    // 1. Check the hand-written backward against central differences, in f64,
    //    for both inputs (the activations and the slopes).
    let x = Tensor::randn([6, 5], DType::F64)?;
    let a = Tensor::uniform_on([5], 0.1, 0.5, DType::F64, Device::CPU)?;
    let verdict = gradcheck(|v| apply(PReluOp, &[&v[0], &v[1]]), &[x, a], 1e-6, 1e-8, 1e-6);
    match &verdict {
        Ok(()) => println!("gradcheck(prelu, f64, eps 1e-6): passed for x [6, 5] and a [5]"),
        Err(e) => println!("gradcheck(prelu, f64, eps 1e-6): FAILED: {e}"),
    }
    verdict?;

    // 2. The layer's parameters are found by walking its fields.
    let model = DigitsNet { hidden: PReluLinear::new(64, 128, dev)?, out: Linear::new(128, 10, dev)? };
    println!("parameters found by #[derive(Parameters)]:");
    for (name, param) in model.named_parameters() {
        println!("  {name:<20} {:?}", param.dims());
    }

    // 3. Train it on the digits like any other model.
    let (epochs, batch_size, lr) = (10, 32, 2e-3);
    let (train, test) = Digits::load()?.train_test()?;
    let loader = DataLoader::builder(train.clone()).batch_size(batch_size).shuffle(true).seed(0).device(dev).build()?;
    let mut opt = Adam::new(model.parameters(), AdamConfig { lr, ..Default::default() })?;
    println!(
        "training on digits: {} train / {} test samples, {} parameters, Adam lr {lr}, batch {batch_size}",
        train.len(),
        test.len(),
        model.num_parameters()
    );
    let started = Instant::now();
    for epoch in 0..epochs {
        let (mut loss_sum, mut seen) = (0.0, 0usize);
        for batch in loader.epoch(epoch as u64) {
            let (x, y) = batch?;
            let loss = cross_entropy(&model.forward(&Var::new(x))?, &y)?;
            loss.backward()?; // runs PReluOp::backward for the hidden layer
            opt.step()?;
            opt.zero_grad()?;
            loss_sum += loss.item()? * y.numel() as f64;
            seen += y.numel();
        }
        println!(
            "epoch {:>2}/{epochs}  loss {:.4}  val_acc {:.4}",
            epoch + 1,
            loss_sum / seen as f64,
            accuracy(&model, &test)?
        );
    }
    let slopes = model.hidden.slope.tensor().to_vec::<f32>()?;
    let (lo, hi) = slopes.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &s| (lo.min(s), hi.max(s)));
    let mean = slopes.iter().sum::<f32>() / slopes.len() as f32;
    println!("learned slopes: mean {mean:.3}, min {lo:.3}, max {hi:.3} (all started at 0.25)");
    println!("trained in {:.2} s", started.elapsed().as_secs_f64());
    println!("test_accuracy={:.4}", accuracy(&model, &test)?);
    Ok(())
}
