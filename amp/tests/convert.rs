//! to_half / to_bf16: norms stay in f32, master weights receive f32
//! gradients and are copied back into the half model after each step.

use brasa_amp::{to_bf16, to_half, AmpError, GradScaler, MasterOptimizer, Result};
use brasa_autograd::Var;
use brasa_nn::functional::cross_entropy;
use brasa_nn::optim::{Optimizer, Sgd, SgdConfig};
use brasa_nn::{
    BatchNorm1d, KeepFloat32, LayerNorm, Linear, Module, ModuleExt, Parameters, Relu, Sequential, Visitor, Walk,
};
use brasa_tensor::{DType, Device, Tensor};

const DEV: Device = Device::CPU;

/// The tests draw their models and data from the process-wide generator;
/// each holds this lock, so that one seeding it sees its own draws.
static GENERATOR: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn lock_generator() -> std::sync::MutexGuard<'static, ()> {
    GENERATOR.lock().unwrap_or_else(|e| e.into_inner())
}

fn model() -> Result<Sequential> {
    Ok(Sequential::new()
        .push(Linear::new(6, 8, DEV)?)
        .push(BatchNorm1d::new(8, DEV)?)
        .push(Relu)
        .push(Linear::new(8, 8, DEV)?)
        .push(LayerNorm::new([8], DEV)?)
        .push(Linear::new(8, 3, DEV)?))
}

fn dtypes(model: &Sequential) -> Vec<(String, DType)> {
    let mut all: Vec<(String, DType)> = model.named_parameters().into_iter().map(|(n, p)| (n, p.dtype())).collect();
    all.extend(model.named_buffers().into_iter().map(|(n, b)| (n, b.dtype())));
    all
}

#[test]
fn the_walk_reports_norm_layers() {
    let _generator = lock_generator();
    struct Kept(Vec<String>);
    impl Visitor for Kept {
        fn keep_float32(&mut self, module_path: &str) {
            self.0.push(module_path.to_string());
        }
    }
    let model = model().unwrap();
    let mut kept = Kept(Vec::new());
    model.visit(&mut Walk::new(&mut kept));
    assert_eq!(kept.0, ["1", "4"]);
    // The marker adds no parameter, buffer or state-dict entry.
    assert_eq!(model.state_dict().len(), 2 + 5 + 2 + 2 + 2);
}

#[test]
fn norms_stay_f32_and_everything_else_becomes_half() -> Result<()> {
    let _generator = lock_generator();
    for (half, convert) in [(DType::F16, to_half::<Sequential> as fn(&mut Sequential) -> _), (DType::BF16, to_bf16)] {
        let mut m = model()?;
        let originals = m.parameters();
        let masters = convert(&mut m)?;
        for (name, dtype) in dtypes(&m) {
            let expected = match name.as_str() {
                "1.num_batches_tracked" => DType::I64,
                n if n.starts_with("1.") || n.starts_with("4.") => DType::F32,
                _ => half,
            };
            assert_eq!(dtype, expected, "{name}");
        }
        // One master per parameter, f32, in order; the f32 originals are the masters.
        let master_params = masters.parameters();
        assert_eq!(master_params.len(), originals.len());
        for (i, (master, original)) in master_params.iter().zip(&originals).enumerate() {
            assert_eq!(master.dtype(), DType::F32);
            assert!(master.same_var(original), "parameter {i}");
        }
        let model_params = masters.model_parameters();
        assert!(model_params.iter().zip(m.parameters()).all(|(a, b)| a.same_var(&b)));
    }
    Ok(())
}

#[test]
fn to_dtype_still_converts_everything() -> Result<()> {
    let _generator = lock_generator();
    let mut m = model()?;
    m.to_dtype(DType::F16)?;
    assert!(dtypes(&m).iter().all(|(_, d)| *d == DType::F16 || *d == DType::I64));
    // Converting that model to half brings its norms back to f32.
    to_half(&mut m)?;
    assert_eq!(m.named_buffers()[0].1.dtype(), DType::F32, "1.running_mean");
    assert_eq!(m.parameters()[2].dtype(), DType::F32, "1.weight");
    Ok(())
}

#[test]
fn gradients_reach_the_masters_in_f32_and_steps_reach_the_model() -> Result<()> {
    let _generator = lock_generator();
    let mut m = model()?;
    let masters = to_half(&mut m)?;
    let sgd = Sgd::new(masters.parameters(), SgdConfig { lr: 0.1, ..Default::default() })?;
    let mut opt = MasterOptimizer::new(masters, sgd)?;
    let x = Var::new(Tensor::randn([16, 6], DType::F32)?.to_dtype(DType::F16)?);
    let y = Tensor::from_vec((0..16).map(|i| i % 3).collect::<Vec<i64>>(), [16])?;
    let out = m.forward(&x)?;
    assert_eq!(out.dtype(), DType::F16);
    cross_entropy(&out.to_dtype(DType::F32)?, &y)?.backward()?;
    for (model, master) in opt.masters().model_parameters().iter().zip(opt.masters().parameters()) {
        let grad = master.grad().expect("every master has a gradient");
        assert_eq!(grad.dtype(), DType::F32);
        if !model.same_var(&master) {
            assert!(model.grad().is_none(), "moved to the master");
        }
    }
    let before = m.parameters()[0].tensor().to_dtype(DType::F32)?.to_vec::<f32>()?;
    opt.step()?;
    let master = opt.masters().parameters()[0].tensor().to_dtype(DType::F16)?.to_dtype(DType::F32)?;
    let after = m.parameters()[0].tensor().to_dtype(DType::F32)?.to_vec::<f32>()?;
    assert_ne!(before, after, "the half weights follow the masters");
    assert_eq!(after, master.to_vec::<f32>()?);
    opt.zero_grad()?;
    assert!(opt.masters().parameters().iter().all(|p| p.grad().is_none()));
    Ok(())
}

#[test]
fn an_optimizer_of_the_half_parameters_is_refused() -> Result<()> {
    let _generator = lock_generator();
    let mut m = model()?;
    let masters = to_half(&mut m)?;
    let wrong = Sgd::new(m.parameters(), SgdConfig::default())?;
    let err = MasterOptimizer::new(masters, wrong).err().expect("refused");
    assert!(matches!(err, AmpError::Invalid { what: "MasterOptimizer::new", .. }), "{err:?}");
    // The advice is the point: build the optimizer on the masters.
    assert!(err.to_string().contains("MasterWeights::parameters"), "{err}");
    Ok(())
}

#[test]
fn shared_parameters_are_converted_once() -> Result<()> {
    let _generator = lock_generator();
    #[derive(Parameters)]
    struct Tied {
        a: Var,
        b: Var,
        norm_scale: Scale,
    }
    #[derive(Parameters)]
    struct Scale {
        weight: Var,
        keep: KeepFloat32,
    }
    let shared = Var::param(Tensor::ones([3], DType::F32)?)?;
    let mut tied = Tied {
        a: shared.clone(),
        b: shared,
        norm_scale: Scale { weight: Var::param(Tensor::ones([3], DType::F32)?)?, keep: KeepFloat32 },
    };
    let masters = to_half(&mut tied)?;
    assert!(tied.a.same_var(&tied.b));
    assert_eq!(tied.a.dtype(), DType::F16);
    assert_eq!(tied.norm_scale.weight.dtype(), DType::F32, "a custom layer with the marker");
    assert_eq!(masters.len(), 2);
    Ok(())
}

#[test]
fn half_training_with_masters_and_a_scaler_lowers_the_loss() -> Result<()> {
    let _generator = lock_generator();
    // A fixed draw (an unlucky one, rarely, left the loss above half after
    // 60 steps).
    brasa_tensor::manual_seed(7);
    let mut m = model()?;
    let x = Var::new(Tensor::randn([32, 6], DType::F32)?.to_dtype(DType::F16)?);
    let masters = to_half(&mut m)?;
    let sgd = Sgd::new(masters.parameters(), SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() })?;
    let mut opt = MasterOptimizer::new(masters, sgd)?;
    let mut scaler = GradScaler::new();
    let y = Tensor::from_vec((0..32).map(|i| (i * 7 % 3) as i64).collect::<Vec<i64>>(), [32])?;
    let mut losses = Vec::new();
    let mut skipped = 0;
    for _ in 0..60 {
        let loss = cross_entropy(&m.forward(&x)?.to_dtype(DType::F32)?, &y)?;
        losses.push(loss.item()?);
        scaler.scale(&loss)?.backward()?;
        skipped += !scaler.step(&mut opt)? as usize;
        scaler.update()?;
        opt.zero_grad()?;
    }
    // The loss is f32, so only the f16 activations' gradients carry the
    // scale: they stay in range and (nearly) every step is taken.
    assert!(skipped < 10, "{skipped} skipped");
    let (first, last) = (losses[0], *losses.last().unwrap());
    assert!(last < 0.5 * first, "loss {first} -> {last}");
    Ok(())
}

/// One SGD step on a fixed batch; the first layer's half weights before and after.
fn train_once(m: &Sequential, opt: &mut dyn Optimizer) -> Result<(Vec<f32>, Vec<f32>)> {
    let x = Var::new(Tensor::randn([16, 6], DType::F32)?.to_dtype(m.parameters()[0].dtype())?);
    let y = Tensor::from_vec((0..16).map(|i| i % 3).collect::<Vec<i64>>(), [16])?;
    let before = m.parameters()[0].tensor().to_dtype(DType::F32)?.to_vec::<f32>()?;
    cross_entropy(&m.forward(&x)?.to_dtype(DType::F32)?, &y)?.backward()?;
    opt.step()?;
    opt.zero_grad()?;
    let after = m.parameters()[0].tensor().to_dtype(DType::F32)?.to_vec::<f32>()?;
    Ok((before, after))
}

#[test]
fn converting_twice_keeps_the_masters_connected() -> Result<()> {
    let _generator = lock_generator();
    for second in [to_half::<Sequential> as fn(&mut Sequential) -> _, to_bf16] {
        let mut m = model()?;
        let first = to_half(&mut m)?;
        let again = second(&mut m)?;
        // The same masters: a second set would never see a gradient.
        assert_eq!(again.len(), first.len());
        assert!(again.parameters().iter().zip(first.parameters()).all(|(a, b)| a.same_var(&b)));
        let sgd = Sgd::new(again.parameters(), SgdConfig { lr: 0.5, ..Default::default() })?;
        let mut opt = MasterOptimizer::new(again, sgd)?;
        let (before, after) = train_once(&m, &mut opt)?;
        assert_ne!(before, after, "training after the second conversion changes the weights");
        assert!(opt.masters().parameters().iter().all(|p| p.grad().is_none()));
    }
    Ok(())
}

#[test]
fn converting_twice_with_the_first_masters_still_trains() -> Result<()> {
    let _generator = lock_generator();
    let mut m = model()?;
    let first = to_half(&mut m)?;
    to_half(&mut m)?;
    let sgd = Sgd::new(first.parameters(), SgdConfig { lr: 0.5, ..Default::default() })?;
    let mut opt = MasterOptimizer::new(first, sgd)?;
    let (before, after) = train_once(&m, &mut opt)?;
    assert_ne!(before, after);
    Ok(())
}
