//! `AutoMicroBatch` on limited logical host devices: a batch that does not
//! fit is split, and the parameters equal the unsplit step's on an
//! unlimited device; the split is kept; autocast and the GradScaler see the
//! whole batch; other failures are returned; thrashing splits further.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa::nn::optim::{AutoMicroBatchConfig, SplitReport};
use brasa::prelude::*;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

const HOST_DEVICES: usize = 48;
static NEXT_DEVICE: AtomicUsize = AtomicUsize::new(1);
const FEATURES: usize = 64;
const HIDDEN: usize = 64;
/// Many narrow layers: activations, not parameters, make the peak, so
/// halving the batch nearly halves it.
const LAYERS: usize = 16;
const CLASSES: usize = 10;
/// Every activation stays under 1 MiB (the allocator's small pool, 2-MiB
/// segments), so a limit between two peaks separates them.
const ROWS: usize = 1000;

/// A fresh logical host device with `limit` bytes (None: unlimited) and
/// expandable segments (memory reserved page by page, so that a limit
/// between two peaks separates them).
fn fresh_device(limit: Option<usize>) -> Device {
    fresh_device_with(limit, true)
}

fn fresh_device_with(limit: Option<usize>, expandable_segments: bool) -> Device {
    brasa::tensor::set_host_device_count(HOST_DEVICES).unwrap();
    let index = NEXT_DEVICE.fetch_add(1, Ordering::Relaxed);
    assert!(index < HOST_DEVICES, "raise HOST_DEVICES");
    let config = brasa::alloc::AllocatorConfig::builder().expandable_segments(expandable_segments).build().unwrap();
    brasa::tensor::set_host_allocator_config(index, Some(config)).unwrap();
    brasa::tensor::set_host_memory_limit(index, limit).unwrap();
    Device::cpu(index)
}

/// The same MLP on every device: weights from a formula, not the RNG
/// (tests run on several threads at once).
fn mlp(device: Device, dtype: DType) -> Sequential {
    let mut model = Sequential::new().push(Linear::new(FEATURES, HIDDEN, device).unwrap()).push(Relu);
    for _ in 1..LAYERS {
        model = model.push(Linear::new(HIDDEN, HIDDEN, device).unwrap()).push(Relu);
    }
    let mut model = model.push(Linear::new(HIDDEN, CLASSES, device).unwrap());
    model.to_dtype(dtype).unwrap();
    let _no_grad = no_grad();
    for (p, param) in model.parameters().iter().enumerate() {
        let shape = param.shape().dims().to_vec();
        let fan_in = *shape.last().unwrap() as f64;
        let values: Vec<f64> =
            (0..param.numel()).map(|i| ((i * 7 + p * 13) as f64 * 0.37).sin() / fan_in.sqrt()).collect();
        param.tensor().copy_(&Tensor::from_vec_on(values, shape, device).unwrap().to_dtype(dtype).unwrap()).unwrap();
    }
    drop(_no_grad);
    model
}

fn data(device: Device, dtype: DType, rows: usize) -> (Tensor, Tensor) {
    let x: Vec<f64> = (0..rows * FEATURES).map(|i| ((i * 31) as f64 * 0.013).sin()).collect();
    let y: Vec<i64> = (0..rows).map(|i| (i % CLASSES) as i64).collect();
    // Converted on cpu:0, so that the limited device only ever holds the result.
    let x = Tensor::from_vec_on(x, [rows, FEATURES], Device::cpu(0)).unwrap().to_dtype(dtype).unwrap();
    (x.to(device).unwrap(), Tensor::from_vec_on(y, [rows], device).unwrap())
}

#[derive(Clone, Copy, Debug)]
enum Opt {
    SgdMomentum,
    AdamW,
}

fn optimizer(kind: Opt, model: &Sequential) -> Box<dyn Optimizer> {
    match kind {
        Opt::SgdMomentum => {
            Box::new(Sgd::new(model.parameters(), SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() }).unwrap())
        }
        Opt::AdamW => Box::new(AdamW::new(model.parameters(), AdamConfig { lr: 1e-3, ..Default::default() }).unwrap()),
    }
}

fn loss_of(model: &Sequential, data: &(Tensor, Tensor), rows: Range<usize>) -> Result<Var, NnError> {
    let len = rows.len();
    cross_entropy(&model.forward(&Var::new(data.0.narrow(0, rows.start, len)?))?, &data.1.narrow(0, rows.start, len)?)
}

fn values(model: &Sequential) -> Vec<Vec<f64>> {
    model.parameters().iter().map(|p| p.tensor().to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap()).collect()
}

fn max_difference(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    a.iter().flatten().zip(b.iter().flatten()).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

/// `steps` steps of `AutoMicroBatch` starting with `micro_batches`: the
/// parameters, each step's report and the device's peaks.
#[derive(Clone, Copy)]
struct Run {
    dtype: DType,
    kind: Opt,
    rows: usize,
    steps: usize,
    bf16_autocast: bool,
}

fn train(device: Device, run: Run, micro_batches: usize) -> (Vec<Vec<f64>>, Vec<SplitReport>, usize, usize) {
    let Run { dtype, kind, rows: batch, steps, bf16_autocast } = run;
    let model = mlp(device, dtype);
    let data = data(device, dtype, batch);
    let mut opt = optimizer(kind, &model);
    let config = AutoMicroBatchConfig { initial_micro_batches: micro_batches, ..Default::default() };
    let mut auto = AutoMicroBatch::with_config(config).unwrap();
    let reports = (0..steps)
        .map(|_| {
            auto.step(batch, opt.as_mut(), |rows| {
                let _autocast = bf16_autocast.then(|| autocast(DType::BF16));
                loss_of(&model, &data, rows)
            })
            .unwrap()
        })
        .collect();
    (values(&model), reports, memory::max_allocated(device).unwrap(), memory::max_reserved(device).unwrap())
}

/// A limit below the whole batch's peak allocated bytes (so it cannot
/// fit) and well above the halves' (a quarter of what splitting saves
/// left as room for the allocator's rounding and fragmentation).
fn limit_between(halves_allocated: usize, whole_allocated: usize) -> usize {
    assert!(halves_allocated < whole_allocated, "halves {halves_allocated}, whole {whole_allocated}");
    whole_allocated - (whole_allocated - halves_allocated) / 4
}

#[test]
fn a_batch_that_does_not_fit_is_split_and_steps_as_the_whole_batch() {
    for (dtype, tolerance) in [(DType::F64, 1e-12), (DType::F32, 1e-6)] {
        for kind in [Opt::SgdMomentum, Opt::AdamW] {
            let label = format!("{dtype:?} {kind:?}");
            let run = Run { dtype, kind, rows: ROWS, steps: 2, bf16_autocast: false };
            let (unsplit, reports, whole_allocated, _) = train(fresh_device(None), run, 1);
            assert!(reports.iter().all(|r| r.micro_batches == 1 && r.retries.is_empty()), "{label}");
            let (halves, _, halves_allocated, _) = train(fresh_device(None), run, 2);
            assert!(max_difference(&unsplit, &halves) <= tolerance, "{label}");
            let limit = limit_between(halves_allocated, whole_allocated);

            let (split, reports, _, reserved) = train(fresh_device(Some(limit)), run, 1);
            assert!(reserved <= limit, "{label}");
            assert_eq!(reports[0].retries.len(), 1, "{label}: {}", reports[0]);
            assert_eq!(reports[0].retries[0].micro_batches, 1, "{label}");
            assert!(reports[0].retries[0].out_of_memory.is_some(), "{label}");
            assert_eq!(reports[0].micro_batches, 2, "{label}");
            assert!(reports[1..].iter().all(|r| r.retries.is_empty() && r.micro_batches >= 2), "{label}: kept");
            let difference = max_difference(&unsplit, &split);
            assert!(difference <= tolerance, "{label}: {difference} from the unsplit steps");
            assert!(reports[0].to_string().contains("out of memory on cpu:"), "{}", reports[0]);
        }
    }
}

/// Hand-written accumulation of `count` equal micro-batches, under bf16
/// autocast: what the wrapper must do once it has settled on `count`.
fn hand_written_autocast(device: Device, run: Run, count: usize) -> Vec<Vec<f64>> {
    let model = mlp(device, run.dtype);
    let data = data(device, run.dtype, run.rows);
    let mut opt = optimizer(run.kind, &model);
    for _ in 0..run.steps {
        for index in 0..count {
            let rows = index * run.rows / count..(index + 1) * run.rows / count;
            let loss = {
                let _autocast = autocast(DType::BF16);
                loss_of(&model, &data, rows).unwrap()
            };
            loss.mul_scalar(1.0 / count as f64).unwrap().backward().unwrap();
        }
        opt.step().unwrap();
        opt.zero_grad().unwrap();
    }
    values(&model)
}

#[test]
fn under_autocast_the_split_equals_hand_written_accumulation() {
    // bf16 activations are half the size: more rows, so that the peaks lie
    // several of the allocator's 2-MiB segments apart.
    let run = Run { dtype: DType::F32, kind: Opt::AdamW, rows: 4 * ROWS, steps: 2, bf16_autocast: true };
    let (_, _, whole_allocated, _) = train(fresh_device(None), Run { steps: 1, ..run }, 1);
    let (_, _, halves_allocated, _) = train(fresh_device(None), Run { steps: 1, ..run }, 2);
    let limit = limit_between(halves_allocated, whole_allocated);
    let (split, reports, _, _) = train(fresh_device(Some(limit)), run, 1);
    assert_eq!(reports[0].retries.len(), 1, "{}", reports[0]);
    assert!(reports.iter().all(|r| r.micro_batches == 2), "{reports:?}");
    let by_hand = hand_written_autocast(fresh_device(None), run, 2);
    assert_eq!(split, by_hand, "split under autocast differs from accumulation by hand");
}

#[test]
fn a_grad_scaler_skips_the_step_for_every_micro_batch() {
    let device = fresh_device(None);
    let model = mlp(device, DType::F32);
    let data = data(device, DType::F32, ROWS);
    let mut opt = optimizer(Opt::SgdMomentum, &model);
    let before = values(&model);
    let mut scaler = GradScaler::new();
    let auto_config = AutoMicroBatchConfig { initial_micro_batches: 4, ..Default::default() };
    let mut auto = AutoMicroBatch::with_config(auto_config).unwrap();
    let report = auto
        .accumulate(ROWS, opt.as_mut(), |rows| {
            // The third micro-batch's gradients overflow.
            let overflow = if rows.start == ROWS / 2 { f64::INFINITY } else { 1.0 };
            let loss = loss_of(&model, &data, rows)?.mul_scalar(overflow)?;
            Ok::<_, NnError>(scaler.scale(&loss)?)
        })
        .unwrap();
    assert_eq!(report.micro_batches, 4);
    assert!(!scaler.step(opt.as_mut()).unwrap(), "an overflowing micro-batch must skip the whole step");
    scaler.update().unwrap();
    opt.zero_grad().unwrap();
    assert_eq!(values(&model), before);
    assert!(scaler.get_scale() < 65536.0);
}

#[test]
fn a_failure_that_is_not_out_of_memory_is_returned_as_it_is() {
    let device = fresh_device(None);
    let model = mlp(device, DType::F32);
    let data = data(device, DType::F32, ROWS);
    let mut opt = optimizer(Opt::SgdMomentum, &model);
    let mut auto =
        AutoMicroBatch::with_config(AutoMicroBatchConfig { initial_micro_batches: 2, ..Default::default() }).unwrap();
    let error = auto
        .step(ROWS, opt.as_mut(), |rows| {
            if rows.start > 0 {
                // A shape error in the second micro-batch.
                return cross_entropy(&Var::new(Tensor::zeros_on([3, 4], DType::F32, device)?), &data.1);
            }
            loss_of(&model, &data, rows)
        })
        .unwrap_err();
    assert!(matches!(error, NnError::Tensor(_) | NnError::Invalid { .. }), "{error:?}");
    assert!(error.as_out_of_memory().is_none());
    assert!(model.parameters().iter().all(|p| p.grad().is_none()), "the first micro-batch's gradients are dropped");
    assert_eq!(auto.micro_batches(), 2);
    assert_eq!(auto.retries(), 0);
}

#[test]
fn an_out_of_memory_at_one_row_per_micro_batch_is_an_error() {
    let limit = 4 << 20;
    let device = fresh_device(Some(limit));
    let model = Linear::new(4, 2, device).unwrap();
    let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.1, ..Default::default() }).unwrap();
    let x = Tensor::zeros_on([4, 4], DType::F32, device).unwrap();
    let mut auto = AutoMicroBatch::new();
    let error = auto
        .step(4, &mut opt, |rows| {
            // Whatever the rows, more than the device holds.
            let _huge = Tensor::zeros_on([limit], DType::F32, device)?;
            Ok::<_, NnError>(model.forward(&Var::new(x.narrow(0, rows.start, rows.len())?))?.sum_all()?)
        })
        .unwrap_err();
    assert!(matches!(error, NnError::MicroBatch { .. }), "{error:?}");
    assert!(error.as_out_of_memory().is_some(), "the out of memory stays reachable: {error}");
    assert!(error.to_string().contains("micro-batch of 1 row"), "{error}");
    assert_eq!(auto.retries(), 2, "1 -> 2 -> 4 micro-batches of 4 rows");
}

#[test]
fn steps_in_which_the_allocator_thrashes_split_further() {
    let limit = 64 << 20;
    let device = fresh_device_with(Some(limit), false);
    let model = Linear::new(4, 2, device).unwrap();
    let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.1, ..Default::default() }).unwrap();
    let x = Tensor::zeros_on([8, 4], DType::F32, device).unwrap();
    let mut auto = AutoMicroBatch::new();
    let mut thrashing = Vec::new();
    let mut calls = 0;
    for _ in 0..3 {
        let report = auto
            .step(8, &mut opt, |rows| {
                // A block the cache can serve, then one 2 MiB larger than any
                // before (48 MiB, 50, ...): it fits only once the cache is freed.
                calls += 1;
                drop(Tensor::zeros_on([(20 + 2 * calls) << 18], DType::F32, device)?);
                drop(Tensor::zeros_on([(46 + 2 * calls) << 18], DType::F32, device)?);
                Ok::<_, NnError>(model.forward(&Var::new(x.narrow(0, rows.start, rows.len())?))?.sum_all()?)
            })
            .unwrap();
        assert!(report.retries.is_empty());
        thrashing.push((report.micro_batches, report.split_for_thrashing));
    }
    assert_eq!(thrashing, [(1, false), (1, true), (2, false)]);
}

#[test]
fn checkpointed_micro_batches_equal_hand_written_accumulation() {
    use brasa::autograd::{checkpoint, AutogradError};
    use std::sync::Arc;
    let device = fresh_device(None);
    let run = Run { dtype: DType::F32, kind: Opt::SgdMomentum, rows: ROWS, steps: 2, bf16_autocast: false };
    let data = data(device, run.dtype, run.rows);
    // The model's forward, recomputed in backward (checkpointing).
    let checkpointed = |model: &Arc<Sequential>, rows: Range<usize>| -> Result<Var, NnError> {
        let model = Arc::clone(model);
        let input = Var::new(data.0.narrow(0, rows.start, rows.len())?);
        let logits = checkpoint(move |x| model.forward(&x[0]).map_err(AutogradError::external), &[&input])?;
        cross_entropy(&logits, &data.1.narrow(0, rows.start, rows.len())?)
    };
    let (by_hand, wrapped) = (Arc::new(mlp(device, run.dtype)), Arc::new(mlp(device, run.dtype)));
    let (mut hand_opt, mut auto_opt) = (optimizer(run.kind, &by_hand), optimizer(run.kind, &wrapped));
    let config = AutoMicroBatchConfig { initial_micro_batches: 2, ..Default::default() };
    let mut auto = AutoMicroBatch::with_config(config).unwrap();
    for _ in 0..run.steps {
        for half in [0..ROWS / 2, ROWS / 2..ROWS] {
            checkpointed(&by_hand, half).unwrap().mul_scalar(0.5).unwrap().backward().unwrap();
        }
        hand_opt.step().unwrap();
        hand_opt.zero_grad().unwrap();
        auto.step(ROWS, auto_opt.as_mut(), |rows| checkpointed(&wrapped, rows)).unwrap();
    }
    assert_eq!(values(&wrapped), values(&by_hand));
}
