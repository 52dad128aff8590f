//! `DataParallel` against one device on the full batch: gradients, losses
//! and parameters after SGD-momentum, Adam and clipped steps, with 2 and 4
//! devices and batches that do not divide; balanced peak memory; failures
//! that are errors naming the replica, never hangs.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::Var;
use brasa_nn::functional::cross_entropy;
use brasa_nn::optim::{clip_grad_norm_, Adam, AdamConfig, AdamW, Optimizer, Sgd, SgdConfig};
use brasa_nn::{BatchNorm1d, Linear, Module, ModuleExt, NnError, Parameters, Sequential, StateDict, Tanh};
use brasa_parallel::{
    chunk_sizes, CommOptions, DataParallel, DataParallelConfig, LossReduction, ParallelError, Result,
};
use brasa_tensor::{memory, DType, Device, Tensor};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Tests share the process's devices and measure their memory: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn setup() -> std::sync::MutexGuard<'static, ()> {
    brasa_parallel::ensure_host_devices(4).unwrap();
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn devices(world: usize) -> Vec<Device> {
    (0..world).map(Device::cpu).collect()
}

fn config() -> DataParallelConfig {
    DataParallelConfig {
        comm: CommOptions::default().timeout(Duration::from_secs(20)),
        threads_per_device: Some(1),
        ..Default::default()
    }
}

const IN: usize = 6;
const CLASSES: usize = 3;

/// A small tanh MLP whose weights come from a formula, not the shared
/// random generator (tests run concurrently with other threads drawing).
fn mlp(device: Device) -> brasa_nn::Result<Sequential> {
    let model = Sequential::new()
        .push(Linear::new(IN, 16, device)?)
        .push(Tanh)
        .push(Linear::new(16, 12, device)?)
        .push(Tanh)
        .push(Linear::new(12, CLASSES, device)?);
    fill_deterministic(&model, 0.0)?;
    Ok(model)
}

/// Sets every parameter to a fixed pseudo-random pattern (`shift` varies it).
fn fill_deterministic(model: &impl ModuleExt, shift: f64) -> brasa_nn::Result<()> {
    for (p_index, param) in model.parameters().iter().enumerate() {
        let n = param.numel();
        let scale = 1.0 / (param.dims().last().copied().unwrap_or(1) as f64).sqrt();
        let values: Vec<f32> =
            (0..n).map(|i| ((((i * 37 + p_index * 101) % 97) as f64 / 48.5 - 1.0 + shift) * scale) as f32).collect();
        param.tensor().copy_(&Tensor::from_vec_on(values, param.dims().to_vec(), param.device())?)?;
    }
    Ok(())
}

/// Batch `seed` of `rows` rows on device 0.
fn batch(rows: usize, seed: usize) -> Result<(Tensor, Tensor)> {
    let x: Vec<f32> = (0..rows * IN).map(|i| (((i * 13 + seed * 29) % 41) as f32 / 20.0 - 1.0) * 1.5).collect();
    let y: Vec<i64> = (0..rows).map(|r| ((r * 7 + seed * 3) % CLASSES) as i64).collect();
    Ok((Tensor::from_vec_on(x, [rows, IN], Device::CPU)?, Tensor::from_vec_on(y, [rows], Device::CPU)?))
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).and_then(|t| t.to_vec::<f64>()).unwrap()
}

/// Asserts `got` ≈ `want` elementwise within `atol + rtol·|want|`.
fn assert_close(got: &Tensor, want: &Tensor, atol: f64, rtol: f64, what: &str) {
    assert_eq!(got.dims(), want.dims(), "{what}: shapes");
    for (i, (g, w)) in values(got).iter().zip(values(want)).enumerate() {
        assert!((g - w).abs() <= atol + rtol * w.abs(), "{what}[{i}]: {g} vs {w}");
    }
}

/// Every replica's parameters against the reference model's.
fn assert_params_match<O: Optimizer>(dp: &DataParallel<Sequential, O>, reference: &Sequential, atol: f64, what: &str) {
    let want = reference.named_parameters();
    for rank in 0..dp.world_size() {
        let got = dp.replica(rank).unwrap().named_parameters();
        assert_eq!(got.len(), want.len());
        for ((name, g), (_, w)) in got.iter().zip(&want) {
            assert_eq!(g.device(), Device::cpu(rank), "{what}: {name} lives on its replica's device");
            assert_close(g.tensor(), w.tensor(), atol, 1e-4, &format!("{what}: replica {rank} {name}"));
        }
    }
}

#[test]
fn gradients_and_loss_equal_one_device_on_the_full_batch() -> Result<()> {
    let _serial = setup();
    let reference = mlp(Device::CPU)?;
    // Even, uneven, and fewer rows than devices (the last device sits out).
    for (world, rows) in [(2, 8), (2, 11), (4, 8), (4, 11), (4, 5), (4, 3)] {
        let what = format!("{world} devices, {rows} rows");
        let mut dp =
            DataParallel::with_config(&devices(world), mlp, |params| Sgd::new(params, SgdConfig::default()), config())?;
        let (x, y) = batch(rows, world + rows)?;
        let loss = dp.forward_backward(&x, &y, cross_entropy)?;
        reference.zero_grad()?;
        let want = cross_entropy(&reference.forward(&Var::new(x.clone()))?, &y)?;
        want.backward()?;
        assert!(
            (loss - want.item()?).abs() <= 1e-5 * want.item()?.abs().max(1.0),
            "{what}: loss {loss} vs {}",
            want.item()?
        );
        let grads = dp.gradients()?;
        let reference_params = reference.named_parameters();
        assert_eq!(grads.len(), reference_params.len());
        for ((name, got), (want_name, param)) in grads.iter().zip(&reference_params) {
            assert_eq!(name, want_name);
            assert_close(got, &param.grad().unwrap(), 1e-6, 1e-4, &format!("{what}: grad {name}"));
        }
    }
    Ok(())
}

/// Trains `steps` batches with DataParallel and with one device, and
/// compares losses every step and parameters at the end.
fn train_and_compare<O: Optimizer>(
    world: usize,
    rows: usize,
    steps: usize,
    dp_config: DataParallelConfig,
    make_optimizer: impl Fn(Vec<Var>) -> brasa_nn::Result<O> + Copy,
    reference_step: impl Fn(&Sequential, &mut O) -> brasa_nn::Result<()>,
    what: &str,
) -> Result<DataParallel<Sequential, O>> {
    let mut dp = DataParallel::with_config(&devices(world), mlp, make_optimizer, dp_config)?;
    let reference = mlp(Device::CPU)?;
    let mut reference_opt = make_optimizer(reference.parameters())?;
    for step in 0..steps {
        let (x, y) = batch(rows, step)?;
        let loss = dp.step(&x, &y, cross_entropy)?;
        let want = cross_entropy(&reference.forward(&Var::new(x))?, &y)?;
        want.backward()?;
        reference_step(&reference, &mut reference_opt)?;
        reference_opt.zero_grad()?;
        let want = want.item()?;
        assert!((loss - want).abs() <= 1e-5 * want.abs().max(1.0), "{what} step {step}: loss {loss} vs {want}");
    }
    assert_params_match(&dp, &reference, 2e-5, what);
    Ok(dp)
}

fn plain_step<O: Optimizer>(_: &Sequential, opt: &mut O) -> brasa_nn::Result<()> {
    opt.step()
}

#[test]
fn sgd_momentum_steps_equal_one_device() -> Result<()> {
    let _serial = setup();
    let sgd = |params| {
        Sgd::new(params, SgdConfig { lr: 0.1, momentum: 0.9, nesterov: true, weight_decay: 1e-3, ..Default::default() })
    };
    for (world, rows) in [(2, 10), (2, 9), (4, 12), (4, 10)] {
        let what = format!("SGD, {world} devices, {rows} rows");
        let dp = train_and_compare(world, rows, 5, config(), sgd, plain_step, &what)?;
        // The momentum buffers are spread over the devices: each holds
        // exactly the elements it owns.
        for (rank, owned) in dp.owned_elements().into_iter().enumerate() {
            let opt = dp.optimizer(rank).unwrap();
            let buffers: Vec<&Tensor> = (0..opt.params().len()).map(|i| opt.momentum_buffer(i).unwrap()).collect();
            assert!(buffers.iter().all(|b| b.device() == Device::cpu(rank)));
            assert_eq!(buffers.iter().map(|b| b.numel()).sum::<usize>(), owned, "{what}: device {rank}");
        }
    }
    Ok(())
}

#[test]
fn adam_and_adamw_steps_equal_one_device() -> Result<()> {
    let _serial = setup();
    let adam = |params| Adam::new(params, AdamConfig { lr: 1e-2, weight_decay: 1e-2, ..Default::default() });
    let adamw = |params| AdamW::new(params, AdamConfig { lr: 1e-2, ..AdamConfig::adamw() });
    for (world, rows) in [(2, 16), (2, 7), (4, 16), (4, 13)] {
        train_and_compare(world, rows, 5, config(), adam, plain_step, &format!("Adam, {world} devices, {rows} rows"))?;
        train_and_compare(
            world,
            rows,
            4,
            config(),
            adamw,
            plain_step,
            &format!("AdamW, {world} devices, {rows} rows"),
        )?;
    }
    Ok(())
}

#[test]
fn clipping_uses_the_norm_of_the_whole_gradient() -> Result<()> {
    let _serial = setup();
    let max_norm = 0.05;
    let sgd = |params| Sgd::new(params, SgdConfig { lr: 0.5, momentum: 0.5, ..Default::default() });
    let clipped_step = |model: &Sequential, opt: &mut Sgd| {
        clip_grad_norm_(&model.parameters(), max_norm, 2.0)?;
        opt.step()
    };
    for world in [2, 4] {
        let dp_config = DataParallelConfig { max_grad_norm: Some(max_norm), ..config() };
        let dp = train_and_compare(world, 11, 4, dp_config, sgd, clipped_step, &format!("clipped, {world} devices"))?;
        let norm = dp.last_grad_norm().unwrap();
        assert!(norm > max_norm, "the test must clip: norm {norm}");
    }
    Ok(())
}

#[test]
fn sum_reduction_and_accumulated_micro_batches() -> Result<()> {
    let _serial = setup();
    let reference = mlp(Device::CPU)?;
    let sum_loss = |out: &Var, y: &Tensor| -> brasa_nn::Result<Var> {
        Ok(cross_entropy(out, y)?.mul_scalar(out.dims()[0] as f64)?)
    };
    let mut dp = DataParallel::with_config(
        &devices(4),
        mlp,
        |params| Sgd::new(params, SgdConfig { lr: 0.01, ..Default::default() }),
        DataParallelConfig { loss_reduction: LossReduction::Sum, ..config() },
    )?;
    let mut reference_opt = Sgd::new(reference.parameters(), SgdConfig { lr: 0.01, ..Default::default() })?;
    // Two micro-batches, one optimizer step: gradients add up.
    for (rows, seed) in [(9, 1), (6, 2)] {
        let (x, y) = batch(rows, seed)?;
        let loss = dp.forward_backward(&x, &y, sum_loss)?;
        let want = sum_loss(&reference.forward(&Var::new(x))?, &y)?;
        want.backward()?;
        assert!((loss - want.item()?).abs() <= 1e-4 * want.item()?.abs(), "sum loss {loss} vs {}", want.item()?);
    }
    dp.optimizer_step()?;
    reference_opt.step()?;
    assert_params_match(&dp, &reference, 2e-5, "two accumulated micro-batches");
    Ok(())
}

#[test]
fn predict_and_evaluate_match_one_device() -> Result<()> {
    let _serial = setup();
    let reference = mlp(Device::CPU)?;
    let dp = DataParallel::with_config(&devices(4), mlp, |p| Sgd::new(p, SgdConfig::default()), config())?;
    let (x, y) = batch(10, 3)?;
    let want = reference.forward(&Var::new(x.clone()))?;
    let got = dp.predict(&x, Device::cpu(1))?;
    assert_eq!(got.device(), Device::cpu(1));
    assert_close(&got, want.tensor(), 1e-6, 1e-5, "predict");
    let loss = dp.evaluate(&x, &y, cross_entropy)?;
    let want = cross_entropy(&want, &y)?.item()?;
    assert!((loss - want).abs() <= 1e-5 * want.abs(), "evaluate {loss} vs {want}");
    assert!(dp.gradients()?.iter().all(|(_, g)| values(g).iter().all(|v| *v == 0.0)), "no graph was recorded");
    Ok(())
}

#[test]
fn gradients_are_a_copy_and_leave_the_step_unchanged() -> Result<()> {
    let _serial = setup();
    let sgd = |params| Sgd::new(params, SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() });
    for (world, rows) in [(2, 9), (4, 10)] {
        let what = format!("{world} devices, {rows} rows");
        let (x, y) = batch(rows, 5)?;
        let mut inspected = DataParallel::with_config(&devices(world), mlp, sgd, config())?;
        let mut plain = DataParallel::with_config(&devices(world), mlp, sgd, config())?;
        inspected.forward_backward(&x, &y, cross_entropy)?;
        plain.forward_backward(&x, &y, cross_entropy)?;
        let grads = |dp: &DataParallel<Sequential, Sgd>| -> Result<Vec<Vec<f64>>> {
            Ok(dp.gradients()?.iter().map(|(_, g)| values(g)).collect())
        };
        let first = grads(&inspected)?;
        assert_eq!(grads(&inspected)?, first, "{what}: gradients() twice gives the same values");
        // The result is a copy: writing into it changes nothing.
        let live = inspected.module().parameters()[0].grad().unwrap();
        for (name, grad) in inspected.gradients()? {
            assert!(!grad.shares_storage_with(&live), "{what}: {name} is the live gradient");
            grad.fill_(1e3)?;
        }
        assert_eq!(grads(&inspected)?, first, "{what}: after writing into the copies");
        assert_eq!(grads(&plain)?, first, "{what}: equal to the uninspected run's");
        // The step applies each replica's share once, as without gradients().
        inspected.optimizer_step()?;
        plain.optimizer_step()?;
        for rank in 0..world {
            let got = inspected.replica(rank).unwrap().named_parameters();
            let want = plain.replica(rank).unwrap().named_parameters();
            for ((name, g), (_, w)) in got.iter().zip(&want) {
                assert_eq!(values(g.tensor()), values(w.tensor()), "{what}: replica {rank} {name} after the step");
            }
        }
    }
    Ok(())
}

#[test]
fn forward_gathers_outputs_on_device_zero_like_one_device() -> Result<()> {
    let _serial = setup();
    let reference = mlp(Device::CPU)?;
    let sgd = |params| Sgd::new(params, SgdConfig::default());
    // Uneven (10 over 4: 3, 3, 3, 1; 7 over 2), fewer rows than devices,
    // a batch of one, and a batch that lives on another device.
    for (world, rows, on) in [(2, 7, 0), (4, 10, 0), (4, 3, 0), (2, 1, 0), (4, 1, 0), (4, 6, 3)] {
        let what = format!("{world} devices, {rows} rows on cpu:{on}");
        let dp = DataParallel::with_config(&devices(world), mlp, sgd, config())?;
        let (x, _) = batch(rows, rows + world)?;
        let want = reference.forward(&Var::new(x.clone()))?;
        let got = dp.forward(&x.to(Device::cpu(on))?)?;
        assert_eq!(got.device(), Device::cpu(0), "{what}: gathered on device 0");
        assert_eq!(got.dims(), [rows, CLASSES], "{what}");
        assert_close(&got, want.tensor(), 1e-6, 1e-5, &format!("{what}: forward"));
        let dims = dp.predict(&x, Device::cpu(world - 1))?.dims().to_vec();
        assert_eq!(dims, [rows, CLASSES], "{what}: predict");
        assert!(
            dp.gradients()?.iter().all(|(_, g)| values(g).iter().all(|v| *v == 0.0)),
            "{what}: forward records no graph"
        );
    }
    Ok(())
}

/// A model whose output is not one row per input row.
#[derive(Parameters)]
struct MeanOverRows {
    inner: Linear,
}

impl Module for MeanOverRows {
    fn forward(&self, x: &Var) -> brasa_nn::Result<Var> {
        Ok(self.inner.forward(x)?.mean_all()?)
    }
}

#[test]
fn forward_errors_name_the_problem() -> Result<()> {
    let _serial = setup();
    let sgd = |params| Sgd::new(params, SgdConfig::default());
    let dp = DataParallel::with_config(&devices(2), mlp, sgd, config())?;
    let scalar = Tensor::full([], 1.0, DType::F32)?;
    let error = dp.forward(&scalar).unwrap_err();
    assert!(
        matches!(&error, ParallelError::Invalid { op: "DataParallel::forward", message } if message.contains("0-d")),
        "{error:?}"
    );
    let empty = Tensor::zeros([0, IN], DType::F32)?;
    let error = dp.forward(&empty).unwrap_err();
    assert!(
        matches!(&error, ParallelError::Invalid { op: "DataParallel::forward", message } if message.contains("empty")),
        "{error:?}"
    );
    let wide = Tensor::zeros([5, IN + 1], DType::F32)?;
    let error = dp.forward(&wide).unwrap_err();
    let ParallelError::Replica { op: "DataParallel::forward", rank: 0, device, source, .. } = &error else {
        panic!("expected replica 0's error, got {error:?}")
    };
    assert_eq!(*device, Device::cpu(0));
    // The replica's own error, kept whole, names the wrong size.
    assert!(source.to_string().contains(&(IN + 1).to_string()), "the error names the wrong size: {error}");

    let mean =
        |device: Device| -> brasa_nn::Result<MeanOverRows> { Ok(MeanOverRows { inner: Linear::new(IN, 2, device)? }) };
    let dp = DataParallel::with_config(&devices(2), mean, sgd, config())?;
    let error = dp.forward(&Tensor::zeros([3, IN], DType::F32)?).unwrap_err();
    // Replica 0 (2 of the 3 rows) is named; its error says what the model must return.
    assert!(
        matches!(&error, ParallelError::Replica { op: "DataParallel::forward", rank: 0, source, .. }
            if matches!(source.as_ref(), ParallelError::Invalid { op: "DataParallel::forward", message }
                if message.contains("one row per input row") && message.contains("2 input rows"))),
        "{error:?}"
    );
    Ok(())
}

#[test]
fn replicas_start_from_replica_zero_and_buffers_follow_device_zero() -> Result<()> {
    let _serial = setup();
    // A factory that draws different weights per device: replicas still start equal.
    let model = |device: Device| -> brasa_nn::Result<Sequential> {
        let model = Sequential::new().push(Linear::new(IN, 8, device)?).push(BatchNorm1d::new(8, device)?);
        fill_deterministic(&model, device.index() as f64 * 0.25)?;
        Ok(model)
    };
    let mut dp = DataParallel::with_config(&devices(3), model, |p| Sgd::new(p, SgdConfig::default()), config())?;
    let assert_replicas_equal = |dp: &DataParallel<Sequential, Sgd>, when: &str| {
        let reference = dp.replica(0).unwrap().state_dict();
        for rank in 1..3 {
            let state = dp.replica(rank).unwrap().state_dict();
            for name in reference.names() {
                let (a, b) = (reference.get(name).unwrap(), state.get(name).unwrap());
                assert_close(b, a, 0.0, 0.0, &format!("{when}: replica {rank} {name}"));
            }
        }
    };
    assert_replicas_equal(&dp, "built");
    let built = model(Device::cpu(0))?;
    for ((name, got), (_, want)) in dp.module().named_parameters().iter().zip(built.named_parameters()) {
        assert_close(got.tensor(), want.tensor(), 0.0, 0.0, &format!("replica 0 keeps its own {name}"));
    }
    let (x, _) = batch(9, 0)?;
    let mean_out = |out: &Var, _: &Tensor| -> brasa_nn::Result<Var> { Ok(out.mean_all()?) };
    dp.step(&x, &x, mean_out)?;
    assert_replicas_equal(&dp, "after a step");
    let state = |rank: usize| -> StateDict { dp.replica(rank).unwrap().state_dict() };
    let running_mean = state(0).get("1.running_mean").unwrap().clone();
    assert!(values(&running_mean).iter().any(|v| *v != 0.0), "the statistics moved");
    Ok(())
}

#[test]
fn frozen_parameters_start_as_replica_zero_and_stay() -> Result<()> {
    let _serial = setup();
    // Each device's factory draws other weights; the first layer is frozen.
    let model = |device: Device| -> brasa_nn::Result<Sequential> {
        let model = mlp(device)?;
        fill_deterministic(&model, device.index() as f64 * 0.5)?;
        for param in model.parameters().iter().take(2) {
            param.requires_grad_(false)?;
        }
        Ok(model)
    };
    let sgd = |params| Sgd::new(params, SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() });
    let mut dp = DataParallel::with_config(&devices(4), model, sgd, config())?;
    let reference = model(Device::CPU)?;
    let trainable: Vec<Var> = reference.parameters().into_iter().filter(Var::requires_grad).collect();
    assert_eq!(dp.owned_elements().iter().sum::<usize>(), trainable.iter().map(Var::numel).sum::<usize>());
    let mut opt = sgd(trainable)?;
    for step in 0..3 {
        let (x, y) = batch(10, step)?;
        dp.step(&x, &y, cross_entropy)?;
        cross_entropy(&reference.forward(&Var::new(x))?, &y)?.backward()?;
        opt.step()?;
        opt.zero_grad()?;
    }
    assert_params_match(&dp, &reference, 2e-5, "first layer frozen");
    let untouched = model(Device::CPU)?;
    for rank in 0..4 {
        let frozen = dp.replica(rank).unwrap().parameters()[0].tensor().clone();
        assert_close(&frozen, untouched.parameters()[0].tensor(), 0.0, 0.0, &format!("replica {rank} frozen weight"));
    }
    Ok(())
}

#[test]
fn peak_memory_is_balanced_across_devices() -> Result<()> {
    let _serial = setup();
    let world = 4;
    let model = |device: Device| -> brasa_nn::Result<Sequential> {
        Ok(Sequential::new()
            .push(Linear::new(256, 512, device)?)
            .push(Tanh)
            .push(Linear::new(512, 512, device)?)
            .push(Tanh)
            .push(Linear::new(512, 10, device)?))
    };
    let adam = |params| Adam::new(params, AdamConfig::default());
    let rows = 64;
    let x = Tensor::randn_on([rows, 256], DType::F32, Device::CPU)?;
    let y = Tensor::from_vec_on((0..rows).map(|i| (i % 10) as i64).collect::<Vec<_>>(), [rows], Device::CPU)?;
    let peaks_above = |run: &mut dyn FnMut() -> Result<()>, devices: &[Device]| -> Result<Vec<f64>> {
        let before: Vec<usize> = devices.iter().map(|&d| memory::allocated(d)).collect::<brasa_tensor::Result<_>>()?;
        for &d in devices {
            memory::reset_peak(d)?;
        }
        run()?;
        devices.iter().zip(before).map(|(&d, b)| Ok(memory::max_allocated(d)?.saturating_sub(b) as f64)).collect()
    };

    // Everything DataParallel allocates, construction excluded: device 0
    // holds the whole batch besides its share.
    let mut dp = DataParallel::with_config(&devices(world), model, adam, config())?;
    let peaks = peaks_above(
        &mut || {
            for _ in 0..3 {
                dp.step(&x, &y, cross_entropy)?;
            }
            Ok(())
        },
        &devices(world),
    )?;
    let live: Vec<f64> = devices(world).iter().map(|&d| memory::max_allocated(d).unwrap() as f64).collect();
    let mean_others = peaks[1..].iter().sum::<f64>() / (world - 1) as f64;
    let share = peaks[0] / mean_others;
    eprintln!("peaks above construction {peaks:?}, device 0 / mean of others = {share:.3}");
    assert!(share <= 1.1, "device 0 carries {share:.3}x the others' peak: {peaks:?}");
    // Totals (the model's flat buffers included) are as even.
    let total_share = live[0] / (live[1..].iter().sum::<f64>() / (world - 1) as f64);
    assert!(total_share <= 1.1, "total peak share {total_share:.3}: {live:?}");
    let max = live.iter().cloned().fold(0.0, f64::max);
    let min = live.iter().cloned().fold(f64::MAX, f64::min);
    assert!(max / min <= 1.15, "device peaks differ by more than 15%: {live:?}");
    drop(dp);

    // The same training on device 0 alone peaks higher than any device
    // above: each holds all parameters and gradients (plus the transient
    // gradient of the largest parameter, which backward adds into the flat
    // buffer), but only its quarter of Adam's moments. Replicated moments
    // would put a device above the single-device peak.
    let single = model(Device::CPU)?;
    let mut opt = adam(single.parameters())?;
    let single_peak = peaks_above(
        &mut || {
            for _ in 0..3 {
                cross_entropy(&single.forward(&Var::new(x.clone()))?, &y)?.backward()?;
                opt.step()?;
                opt.zero_grad()?;
            }
            Ok(())
        },
        &[Device::CPU],
    )?[0];
    let params = single.num_parameters() as f64 * 4.0;
    let single_total = single_peak + params;
    assert!(max < 0.85 * single_total, "a device's peak {max} vs {single_total} on one device");
    Ok(())
}

#[test]
fn a_failing_replica_is_an_error_naming_it_not_a_hang() -> Result<()> {
    let _serial = setup();
    let sgd = |params| Sgd::new(params, SgdConfig { lr: 0.1, ..Default::default() });
    let mut dp = DataParallel::with_config(&devices(4), mlp, sgd, config())?;
    let (x, y) = batch(8, 0)?;
    let fail_on_2 = |out: &Var, y: &Tensor| {
        if out.device() == Device::cpu(2) {
            return Err(NnError::invalid("test loss", "refusing to compute on cpu:2"));
        }
        cross_entropy(out, y)
    };
    let start = Instant::now();
    let error = dp.step(&x, &y, fail_on_2).unwrap_err();
    assert!(
        matches!(&error, ParallelError::Replica { rank: 2, device, source, .. }
            if *device == Device::cpu(2)
                && matches!(source.as_ref(), ParallelError::Nn(NnError::Invalid { what: "test loss", .. }))),
        "{error:?}"
    );
    let panic_on_1 = |out: &Var, y: &Tensor| {
        if out.device() == Device::cpu(1) {
            panic!("replica one blew up");
        }
        cross_entropy(out, y)
    };
    let error = dp.step(&x, &y, panic_on_1).unwrap_err();
    assert!(
        matches!(&error, ParallelError::Replica { rank: 1, source, .. }
            if matches!(source.as_ref(), ParallelError::RankPanicked { rank: 1, message } if message.contains("blew up"))),
        "{error}"
    );
    let error = dp.step(&x, &y.narrow(0, 0, 7)?, cross_entropy).unwrap_err();
    assert!(
        matches!(&error, ParallelError::Invalid { op: "DataParallel::forward_backward", message }
            if message.contains("8 rows") && message.contains("target 7")),
        "{error:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(10), "failures took {:?}", start.elapsed());

    // Nothing of the failed batches was kept: the next step is the first.
    dp.step(&x, &y, cross_entropy)?;
    let reference = mlp(Device::CPU)?;
    let mut opt = sgd(reference.parameters())?;
    cross_entropy(&reference.forward(&Var::new(x.clone()))?, &y)?.backward()?;
    opt.step()?;
    assert_params_match(&dp, &reference, 1e-6, "after failed steps");
    Ok(())
}

/// SGD that fails its step on one device.
struct FailingSgd {
    inner: Sgd,
    fail: bool,
}

impl Optimizer for FailingSgd {
    fn step(&mut self) -> brasa_nn::Result<()> {
        if self.fail {
            return Err(NnError::invalid("FailingSgd", "out of luck"));
        }
        self.inner.step()
    }
    fn lr(&self) -> f64 {
        self.inner.lr()
    }
    fn set_lr(&mut self, lr: f64) -> brasa_nn::Result<()> {
        self.inner.set_lr(lr)
    }
    fn params(&self) -> &[Var] {
        self.inner.params()
    }
    fn state_dict(&self) -> brasa_nn::Result<StateDict> {
        self.inner.state_dict()
    }
    fn load_state_dict(&mut self, state: &StateDict) -> brasa_nn::Result<()> {
        self.inner.load_state_dict(state)
    }
}

#[test]
fn a_failing_optimizer_step_breaks_the_group_at_once() -> Result<()> {
    let _serial = setup();
    let failing = |params: Vec<Var>| -> brasa_nn::Result<FailingSgd> {
        let fail = params[0].device() == Device::cpu(3);
        Ok(FailingSgd { inner: Sgd::new(params, SgdConfig::default())?, fail })
    };
    // A long timeout: the failure must not be found by waiting it out.
    let dp_config = DataParallelConfig { comm: CommOptions::default().timeout(Duration::from_secs(120)), ..config() };
    let mut dp = DataParallel::with_config(&devices(4), mlp, failing, dp_config)?;
    let (x, y) = batch(8, 0)?;
    let start = Instant::now();
    let error = dp.step(&x, &y, cross_entropy).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
    assert!(
        matches!(&error, ParallelError::Replica { op: "DataParallel::optimizer_step", rank: 3, source, .. }
            if matches!(source.as_ref(), ParallelError::Nn(NnError::Invalid { what: "FailingSgd", .. }))),
        "{error:?}"
    );
    // The next step is refused, with the failure as its source.
    let again = dp.step(&x, &y, cross_entropy).unwrap_err();
    assert!(
        matches!(&again, ParallelError::Unusable { op: "DataParallel::forward_backward", source }
            if matches!(source.as_ref(), ParallelError::Replica { rank: 3, .. })),
        "{again:?}"
    );
    Ok(())
}

#[test]
fn bad_construction_is_an_error() {
    let _serial = setup();
    let sgd = |params| Sgd::new(params, SgdConfig::default());
    let wrong_device = |_device: Device| mlp(Device::CPU);
    // Refusals before any replica runs are `Invalid`s whose message names
    // the replica and the devices.
    let error = DataParallel::with_config(&devices(2), wrong_device, sgd, config()).unwrap_err();
    assert!(
        matches!(&error, ParallelError::Invalid { op: "DataParallel::new", message }
            if message.contains("replica 1") && message.contains("cpu:0")),
        "{error:?}"
    );
    let different = |device: Device| -> brasa_nn::Result<Sequential> {
        let width = if device == Device::cpu(1) { 5 } else { 4 };
        Ok(Sequential::new().push(Linear::new(IN, width, device)?))
    };
    let error = DataParallel::with_config(&devices(2), different, sgd, config()).unwrap_err();
    assert!(
        matches!(&error, ParallelError::Invalid { op: "DataParallel::new", message }
            if message.contains("replica 1 on cpu:1 differs from replica 0")),
        "{error:?}"
    );
    let error = DataParallel::with_config(&[Device::cpu(1), Device::cpu(1)], mlp, sgd, config()).unwrap_err();
    assert!(
        matches!(&error, ParallelError::Invalid { op: "in_process_group", message } if message.contains("cpu:1")),
        "{error:?}"
    );
    let error = DataParallel::with_config(&[], mlp, sgd, config()).unwrap_err();
    assert!(
        matches!(&error, ParallelError::Invalid { op: "in_process_group", message }
            if message.contains("at least one device")),
        "{error:?}"
    );
    let failing_factory = |device: Device| -> brasa_nn::Result<Sequential> {
        if device == Device::cpu(1) {
            return Err(NnError::invalid("factory", "no model today"));
        }
        mlp(device)
    };
    let error = DataParallel::with_config(&devices(2), failing_factory, sgd, config()).unwrap_err();
    assert!(
        matches!(&error, ParallelError::Replica { op: "DataParallel::new", rank: 1, device, source, .. }
            if *device == Device::cpu(1)
                && matches!(source.as_ref(), ParallelError::Nn(NnError::Invalid { what: "factory", .. }))),
        "{error:?}"
    );
}

#[test]
fn shards_follow_torch_chunk_and_ownership_is_even() -> Result<()> {
    let _serial = setup();
    assert_eq!(chunk_sizes(10, 4), [3, 3, 3, 1]);
    let dp = DataParallel::with_config(&devices(4), mlp, |p| Sgd::new(p, SgdConfig::default()), config())?;
    let owned = dp.owned_elements();
    let total = mlp(Device::CPU)?.num_parameters();
    assert_eq!(owned.iter().sum::<usize>(), total);
    assert!(owned.iter().max().unwrap() - owned.iter().min().unwrap() <= 3, "{owned:?}");
    // A model with fewer elements than devices leaves some owning nothing:
    // they run no optimizer, and training still matches one device.
    let tiny = |device: Device| -> brasa_nn::Result<Linear> {
        let layer = Linear::new(1, 1, device)?;
        fill_deterministic(&layer, 0.0)?;
        Ok(layer)
    };
    let sgd = |p| Sgd::new(p, SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() });
    let mut dp = DataParallel::with_config(&devices(4), tiny, sgd, config())?;
    assert_eq!(dp.owned_elements(), [1, 1, 0, 0]);
    assert!(dp.optimizer(0).is_some() && dp.optimizer(2).is_none() && dp.optimizer(3).is_none());
    let reference = tiny(Device::CPU)?;
    let mut opt = sgd(reference.parameters())?;
    let x = Tensor::from_vec_on(vec![0.5f32, -1.0, 2.0, 1.5, -0.25, 3.0, 1.0], [7, 1], Device::CPU)?;
    let mse = |out: &Var, y: &Tensor| -> brasa_nn::Result<Var> {
        let error = out.sub(&Var::new(y.clone()))?;
        Ok(error.mul(&error)?.mean_all()?)
    };
    for _ in 0..3 {
        let loss = dp.step(&x, &x, mse)?;
        let want = mse(&reference.forward(&Var::new(x.clone()))?, &x)?;
        want.backward()?;
        opt.step()?;
        opt.zero_grad()?;
        assert!((loss - want.item()?).abs() <= 1e-5 * want.item()?.abs().max(1.0), "{loss} vs {}", want.item()?);
    }
    for ((name, got), (_, want)) in dp.module().named_parameters().iter().zip(reference.named_parameters()) {
        assert_close(got.tensor(), want.tensor(), 1e-6, 1e-5, name);
    }
    Ok(())
}
