//! `Pipeline`: GPipe and 1F1B over 2 and 4 logical host devices give the
//! unsplit model's gradients and, after several optimizer steps, its
//! parameters; dropout follows the documented per-micro-batch streams;
//! autocast and the GradScaler work on stage threads; 1F1B's stage-0
//! activation peak is bounded by p micro-batches where GPipe's grows with
//! m; failures are errors naming the stage and micro-batch on every stage,
//! well within the timeout.
//!
//! The tests share the process-wide random generator and the allocator's
//! per-device peaks, so they take one lock and run one at a time.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_amp::{autocast, GradScaler};
use brasa_autograd::Var;
use brasa_nn::functional::cross_entropy;
use brasa_nn::optim::{Optimizer, Sgd, SgdConfig};
use brasa_nn::{Dropout, Linear, Module, ModuleExt, Parameters, Relu, Sequential, Tanh, Walk, WalkMut};
use brasa_parallel::pipeline::{Action, Partition, Pipeline, PipelineConfig, PipelineRng, Schedule};
use brasa_parallel::{ensure_host_devices, ParallelError};
use brasa_tensor::{rng_state, set_rng_state, DType, Device, Generator, GeneratorState, Tensor};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

type TestResult<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    ensure_host_devices(4).unwrap();
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn uniform(generator: &mut Generator, dims: &[usize], bound: f32) -> TestResult<Tensor> {
    let mut values = vec![0f32; dims.iter().product()];
    generator.fill_uniform_f32(&mut values, -bound, bound)?;
    Ok(Tensor::from_vec_on(values, dims, Device::cpu(0))?)
}

fn linear(generator: &mut Generator, inputs: usize, outputs: usize) -> TestResult<Linear> {
    let bound = 1.0 / (inputs as f32).sqrt();
    Ok(Linear {
        weight: Var::param(uniform(generator, &[outputs, inputs], bound)?)?,
        bias: Some(Var::param(uniform(generator, &[outputs], bound)?)?),
    })
}

/// 8 layers: Linear/Tanh pairs 12 → 24 → 24 → 24 → 5, the same numbers
/// for the same `seed` (a local generator, not the process-wide one).
fn mlp(seed: u64) -> TestResult<Sequential> {
    let mut g = Generator::new(seed);
    Ok(Sequential::new()
        .push(linear(&mut g, 12, 24)?)
        .push(Tanh)
        .push(linear(&mut g, 24, 24)?)
        .push(Tanh)
        .push(linear(&mut g, 24, 24)?)
        .push(Relu)
        .push(linear(&mut g, 24, 24)?)
        .push(linear(&mut g, 24, 5)?))
}

fn data(rows: usize, seed: u64) -> TestResult<(Tensor, Tensor)> {
    let mut g = Generator::new(seed);
    let x = uniform(&mut g, &[rows, 12], 1.0)?;
    let labels: Vec<i64> = (0..rows).map(|i| ((i * 7 + seed as usize) % 5) as i64).collect();
    Ok((x, Tensor::from_vec_on(labels, [rows], Device::cpu(0))?))
}

fn boundaries(stages: usize) -> Partition {
    match stages {
        2 => Partition::Boundaries(vec![4]),
        4 => Partition::Boundaries(vec![2, 4, 6]),
        _ => Partition::Boundaries(vec![]),
    }
}

fn loss_fn(out: &Var, y: &Tensor) -> brasa_nn::Result<Var> {
    cross_entropy(out, y)
}

/// Asserts `got` is `want` within `atol + rtol·|want|` element-wise.
fn assert_close(got: &Tensor, want: &Tensor, atol: f32, rtol: f32, what: &str) {
    let got = got.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    let want = want.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= atol + rtol * w.abs(), "{what}[{i}]: {g} vs {w}");
    }
}

fn grads(params: &[Var]) -> Vec<Tensor> {
    params.iter().map(|p| p.grad().expect("every parameter has a gradient")).collect()
}

#[test]
fn gpipe_and_1f1b_match_the_unsplit_model_for_p_2_4_and_m_1_4_8() -> TestResult {
    let _serial = serial();
    let (x, y) = data(16, 1)?;
    let sgd = SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() };
    for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
        for stages in [2, 4] {
            for m in [1, 4, 8] {
                let what = format!("{} p={stages} m={m}", schedule.name());
                let reference = mlp(7)?;
                let mut reference_opt = Sgd::new(reference.parameters(), sgd)?;
                let config = PipelineConfig::new(boundaries(stages), m).schedule(schedule).rng(PipelineRng::Shared);
                let mut pipe = Pipeline::new(mlp(7)?, loss_fn, config)?;
                let mut opt = Sgd::new(pipe.parameters(), sgd)?;
                // The stages' parameters live on their devices.
                assert_eq!(pipe.stage_parameters(stages - 1)[0].device(), Device::cpu(stages - 1));
                for step in 0..4 {
                    let want = cross_entropy(&reference.forward(&Var::new(x.clone()))?, &y)?;
                    want.backward()?;
                    let got = pipe.step(&x, &y)?;
                    assert!((got - want.item()?).abs() < 1e-5, "{what} step {step}: loss {got} vs {}", want.item()?);
                    if step == 0 {
                        for (i, (g, w)) in
                            grads(&pipe.parameters()).iter().zip(grads(&reference.parameters())).enumerate()
                        {
                            assert_close(g, &w, 1e-6, 1e-4, &format!("{what} grad {i}"));
                        }
                    }
                    opt.step()?;
                    opt.zero_grad()?;
                    reference_opt.step()?;
                    reference_opt.zero_grad()?;
                }
                for (i, (p, r)) in pipe.parameters().iter().zip(reference.parameters()).enumerate() {
                    assert_close(p.tensor(), r.tensor(), 1e-5, 1e-4, &format!("{what} param {i} after 4 steps"));
                }
                let report = pipe.report().expect("a report");
                assert_eq!(report.stages.len(), stages);
                assert!(report.stages.iter().all(|s| s.spans.len() == 2 * m && s.error.is_none()));
            }
        }
    }
    Ok(())
}

#[test]
fn a_micro_batch_count_that_does_not_divide_the_batch_splits_like_tensor_split() -> TestResult {
    let _serial = serial();
    let (x, y) = data(10, 2)?;
    let reference = mlp(3)?;
    cross_entropy(&reference.forward(&Var::new(x.clone()))?, &y)?.backward()?;
    let mut pipe = Pipeline::new(mlp(3)?, loss_fn, PipelineConfig::new(boundaries(2), 4).rng(PipelineRng::Shared))?;
    pipe.step(&x, &y)?; // micro-batches of 3, 3, 2, 2 rows, losses weighted 3/10, 3/10, 2/10, 2/10
    for (g, w) in grads(&pipe.parameters()).iter().zip(grads(&reference.parameters())) {
        assert_close(g, &w, 1e-6, 1e-4, "uneven micro-batches");
    }
    let too_many = Pipeline::new(mlp(3)?, loss_fn, PipelineConfig::new(boundaries(2), 11))?.step(&x, &y).unwrap_err();
    assert!(
        matches!(&too_many, ParallelError::Invalid { op: "Pipeline::step", message }
            if message.contains("10 rows") && message.contains("11 micro-batches")),
        "{too_many:?}"
    );
    let zero = Pipeline::new(mlp(3)?, loss_fn, PipelineConfig::new(boundaries(2), 0)).unwrap_err();
    assert!(
        matches!(&zero, ParallelError::Invalid { op: "Pipeline::new", message } if message.contains("at least 1")),
        "{zero:?}"
    );
    Ok(())
}

/// 12 → 24 → dropout → 24 → dropout → 5: dropout on both stages.
fn dropout_mlp(seed: u64) -> TestResult<Sequential> {
    let mut g = Generator::new(seed);
    Ok(Sequential::new()
        .push(linear(&mut g, 12, 24)?)
        .push(Dropout::new(0.3)?)
        .push(Tanh)
        .push(linear(&mut g, 24, 24)?)
        .push(Dropout::new(0.3)?)
        .push(linear(&mut g, 24, 5)?))
}

#[test]
fn dropout_draws_the_documented_stream_of_each_micro_batch() -> TestResult {
    let _serial = serial();
    let (x, y) = data(12, 4)?;
    for (schedule, checkpoint) in
        [(Schedule::OneFOneB, vec![]), (Schedule::GPipe, vec![]), (Schedule::OneFOneB, vec![0, 1])]
    {
        let m = 3;
        let config = PipelineConfig::new(Partition::Boundaries(vec![3]), m).schedule(schedule).checkpoint(checkpoint);
        let mut pipe = Pipeline::new(dropout_mlp(5)?, loss_fn, config)?;
        let base = GeneratorState { seed: 99, offset: 1234 };
        set_rng_state(base);
        pipe.step(&x, &y)?;
        let stride = 1u64 << 40;
        assert_eq!(rng_state(), GeneratorState { seed: 99, offset: 1234 + m as u64 * stride });
        // The same micro-batches one after another on one device, each from
        // its documented state, weighted by its share of the batch.
        let reference = dropout_mlp(5)?;
        for j in 0..m {
            set_rng_state(GeneratorState { seed: 99, offset: 1234 + j as u64 * stride });
            let xj = Var::new(x.narrow(0, 4 * j, 4)?);
            let loss = cross_entropy(&reference.forward(&xj)?, &y.narrow(0, 4 * j, 4)?)?;
            loss.mul_scalar(4.0 / 12.0)?.backward()?;
        }
        for (i, (g, w)) in grads(&pipe.parameters()).iter().zip(grads(&reference.parameters())).enumerate() {
            assert_close(g, &w, 1e-6, 1e-4, &format!("{schedule:?} dropout grad {i}"));
        }
        // And not what a single stream for the whole batch gives.
        let whole = dropout_mlp(5)?;
        set_rng_state(base);
        cross_entropy(&whole.forward(&Var::new(x.clone()))?, &y)?.backward()?;
        let differs = grads(&pipe.parameters()).iter().zip(grads(&whole.parameters())).any(|(g, w)| {
            let (g, w) = (g.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
            g.iter().zip(&w).any(|(a, b)| (a - b).abs() > 1e-4)
        });
        assert!(differs, "the masks should depend on the micro-batch streams");
    }
    Ok(())
}

#[test]
fn checkpointed_stages_give_the_same_gradients() -> TestResult {
    let _serial = serial();
    let (x, y) = data(16, 5)?;
    let reference = mlp(11)?;
    cross_entropy(&reference.forward(&Var::new(x.clone()))?, &y)?.backward()?;
    let config = PipelineConfig::new(boundaries(4), 4).checkpoint(vec![0, 2]);
    let mut pipe = Pipeline::new(mlp(11)?, loss_fn, config)?;
    pipe.step(&x, &y)?;
    for (g, w) in grads(&pipe.parameters()).iter().zip(grads(&reference.parameters())) {
        assert_close(g, &w, 1e-6, 1e-4, "checkpointed");
    }
    Ok(())
}

#[test]
fn autocast_and_the_grad_scaler_work_on_the_stage_threads() -> TestResult {
    let _serial = serial();
    let (x, y) = data(16, 6)?;
    let m = 4;
    // The reference: the same micro-batches one after another under bf16 autocast.
    let reference = mlp(13)?;
    let mut scaler_ref = GradScaler::new();
    let mut opt_ref = Sgd::new(reference.parameters(), SgdConfig { lr: 0.1, ..Default::default() })?;
    {
        let _amp = autocast(DType::BF16);
        for j in 0..m {
            let out = reference.forward(&Var::new(x.narrow(0, 4 * j, 4)?))?;
            assert_eq!(out.dtype(), DType::BF16);
            let loss = cross_entropy(&out, &y.narrow(0, 4 * j, 4)?)?.mul_scalar(0.25)?;
            scaler_ref.scale(&loss)?.backward()?;
        }
    }
    let f32_model = mlp(13)?;
    cross_entropy(&f32_model.forward(&Var::new(x.clone()))?, &y)?.backward()?;

    let mut pipe = Pipeline::new(mlp(13)?, loss_fn, PipelineConfig::new(boundaries(2), m))?;
    let mut scaler = GradScaler::new();
    let mut opt = Sgd::new(pipe.parameters(), SgdConfig { lr: 0.1, ..Default::default() })?;
    {
        let _amp = autocast(DType::BF16);
        pipe.step_scaled(&x, &y, scaler.get_scale())?;
    }
    let (mut err_amp, mut err_f32) = (0f32, 0f32);
    for ((g, r), f) in
        grads(&pipe.parameters()).iter().zip(grads(&reference.parameters())).zip(grads(&f32_model.parameters()))
    {
        let scale = scaler.get_scale() as f32;
        let (g, r, f) = (g.to_vec::<f32>()?, r.to_vec::<f32>()?, f.to_vec::<f32>()?);
        for ((g, r), f) in g.iter().zip(&r).zip(&f) {
            err_amp = err_amp.max((g - r).abs() / scale);
            err_f32 = err_f32.max((g / scale - f).abs());
        }
    }
    // Bitwise the bf16 reference (same casts, same order); clearly not f32.
    assert!(err_amp <= 1e-6, "pipeline vs bf16 reference: {err_amp}");
    assert!(err_f32 > 1e-4, "the stages did not compute in bf16 (difference to f32 only {err_f32})");
    assert!(scaler.step(&mut opt)?);
    assert!(scaler_ref.step(&mut opt_ref)?);
    scaler.update()?;
    for (p, r) in pipe.parameters().iter().zip(reference.parameters()) {
        assert_close(p.tensor(), r.tensor(), 1e-6, 1e-5, "after a scaled step");
    }
    Ok(())
}

/// Stage 0 is wide and saves a lot per micro-batch (Linear, Relu, Tanh of
/// 2048 features); its parameters are small.
fn wide(seed: u64) -> TestResult<Sequential> {
    let mut g = Generator::new(seed);
    Ok(Sequential::new()
        .push(linear(&mut g, 16, 2048)?)
        .push(Relu)
        .push(Tanh)
        .push(linear(&mut g, 2048, 32)?)
        .push(Relu)
        .push(linear(&mut g, 32, 10)?))
}

fn stage0_activation_peak(schedule: Schedule, partition: Partition, m: usize, rows: usize) -> TestResult<usize> {
    let mut g = Generator::new(9);
    let x = uniform(&mut g, &[rows, 16], 1.0)?;
    let y = Tensor::from_vec_on((0..rows as i64).map(|i| i % 10).collect::<Vec<_>>(), [rows], Device::cpu(0))?;
    let config = PipelineConfig::new(partition, m).schedule(schedule).rng(PipelineRng::Shared);
    let mut pipe = Pipeline::new(wide(1)?, loss_fn, config)?;
    pipe.step(&x, &y)?; // gradients exist from here on: the next step measures activations
    let mut peak = 0;
    for _ in 0..2 {
        pipe.step(&x, &y)?;
        peak = peak.max(pipe.report().expect("a report").stages[0].activation_peak_bytes);
    }
    Ok(peak)
}

#[test]
fn one_f_one_b_holds_p_micro_batches_on_stage_0_and_gpipe_holds_m() -> TestResult {
    let _serial = serial();
    const ROWS: usize = 64; // per micro-batch
                            // Peak = transient + k · unit for k micro-batches held: unit and
                            // transient (backward's temporaries) from GPipe with 1 and 2.
    let one = stage0_activation_peak(Schedule::GPipe, Partition::Boundaries(vec![3]), 1, ROWS)? as f64;
    let two = stage0_activation_peak(Schedule::GPipe, Partition::Boundaries(vec![3]), 2, 2 * ROWS)? as f64;
    let unit = two - one;
    let transient = one - unit;
    assert!(unit > 0.5 * (64 * 2048 * 4) as f64, "one micro-batch {one} B, two {two} B");
    for (stages, partition) in [(2, Partition::Boundaries(vec![3])), (4, Partition::Boundaries(vec![3, 4, 5]))] {
        let m = 8;
        let gpipe = stage0_activation_peak(Schedule::GPipe, partition.clone(), m, m * ROWS)? as f64;
        let ofob = stage0_activation_peak(Schedule::OneFOneB, partition, m, m * ROWS)? as f64;
        let held = |peak: f64| (peak - transient) / unit;
        let what = format!(
            "p={stages} m={m}: unit {unit} B, transient {transient} B; GPipe {gpipe} B ({:.2} units), 1F1B {ofob} B ({:.2} units)",
            held(gpipe),
            held(ofob)
        );
        assert!(held(ofob) <= stages as f64 + 0.25, "1F1B above p micro-batches: {what}");
        assert!(held(gpipe) >= m as f64 - 0.25 && held(gpipe) <= m as f64 + 0.25, "GPipe not m micro-batches: {what}");
    }
    Ok(())
}

/// A layer that fails (an `Err`, or a panic) on its `nth` call.
struct FailOn {
    nth: usize,
    panic: bool,
    calls: AtomicUsize,
}

impl Parameters for FailOn {
    fn visit(&self, _walk: &mut Walk<'_>) {}
    fn visit_mut(&mut self, _walk: &mut WalkMut<'_>) -> brasa_nn::Result<()> {
        Ok(())
    }
}

impl Module for FailOn {
    fn forward(&self, input: &Var) -> brasa_nn::Result<Var> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == self.nth {
            if self.panic {
                panic!("FailOn was told to panic");
            }
            return Err(brasa_nn::NnError::invalid("FailOn", "was told to fail"));
        }
        Ok(input.clone())
    }
}

#[test]
fn a_failing_stage_is_an_error_on_every_stage_within_the_timeout() -> TestResult {
    let _serial = serial();
    let (x, y) = data(16, 7)?;
    for panic in [false, true] {
        for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
            // Layer 4 (the failing one) is stage 2 of 4; it fails on micro-batch 2.
            let mut g = Generator::new(1);
            let layers = Sequential::new()
                .push(linear(&mut g, 12, 24)?)
                .push(Tanh)
                .push(linear(&mut g, 24, 24)?)
                .push(Tanh)
                .push(FailOn { nth: 2, panic, calls: AtomicUsize::new(0) })
                .push(linear(&mut g, 24, 24)?)
                .push(linear(&mut g, 24, 5)?);
            let timeout = Duration::from_secs(20);
            let config =
                PipelineConfig::new(Partition::Boundaries(vec![2, 4, 5]), 4).schedule(schedule).timeout(timeout);
            let mut pipe = Pipeline::new(layers, loss_fn, config)?;
            let start = Instant::now();
            let error = pipe.step(&x, &y).unwrap_err();
            assert!(start.elapsed() < Duration::from_secs(5), "took {:?}", start.elapsed());
            let ParallelError::Stage { stage, micro_batch, ref action, ref source, .. } = error else {
                panic!("not a stage error: {error}");
            };
            assert_eq!((stage, micro_batch), (2, Some(2)), "{error}");
            // An error knows the input it got; a panic only the action.
            let want = if panic { "forward" } else { "forward (input [4, 24] from stage 1)" };
            assert_eq!(action, want, "{error}");
            match (&**source, panic) {
                (ParallelError::RankPanicked { rank: 2, message }, true) => assert!(message.contains("told to panic")),
                (ParallelError::Nn(e), false) => {
                    assert!(matches!(e, brasa_nn::NnError::Invalid { what: "FailOn", .. }), "{e:?}")
                }
                (other, _) => panic!("unexpected source {other:?}"),
            }
            let report = pipe.report().expect("a report after a failed step");
            for s in &report.stages {
                assert!(s.error.is_some(), "stage {} did not fail: {report}", s.stage);
            }
        }
    }
    Ok(())
}

#[test]
fn a_stage_output_that_does_not_fit_the_next_stage_names_both() -> TestResult {
    let _serial = serial();
    let mut g = Generator::new(2);
    let model = Sequential::new().push(linear(&mut g, 12, 16)?).push(linear(&mut g, 32, 5)?);
    let mut pipe = Pipeline::new(model, loss_fn, PipelineConfig::new(Partition::Boundaries(vec![1]), 2))?;
    let (x, y) = data(8, 1)?;
    let error = pipe.step(&x, &y).unwrap_err();
    let ParallelError::Stage { stage: 1, device, action, micro_batch: Some(0), .. } = &error else {
        panic!("expected stage 1's error in micro-batch 0, got {error:?}")
    };
    assert_eq!((*device, action.as_str()), (Device::cpu(1), "forward (input [4, 16] from stage 0)"), "{error}");
    Ok(())
}

#[test]
fn a_slow_stage_makes_its_neighbours_time_out() -> TestResult {
    let _serial = serial();
    struct Slow;
    impl Parameters for Slow {
        fn visit(&self, _walk: &mut Walk<'_>) {}
        fn visit_mut(&mut self, _walk: &mut WalkMut<'_>) -> brasa_nn::Result<()> {
            Ok(())
        }
    }
    impl Module for Slow {
        fn forward(&self, input: &Var) -> brasa_nn::Result<Var> {
            std::thread::sleep(Duration::from_millis(800));
            Ok(input.clone())
        }
    }
    let mut g = Generator::new(2);
    let model = Sequential::new().push(Slow).push(linear(&mut g, 12, 5)?);
    let config = PipelineConfig::new(Partition::Boundaries(vec![1]), 1).timeout(Duration::from_millis(200));
    let mut pipe = Pipeline::new(model, loss_fn, config)?;
    let (x, y) = data(4, 1)?;
    let error = pipe.step(&x, &y).unwrap_err();
    // Stage 1 waited for stage 0 past the timeout.
    assert!(
        matches!(&error, ParallelError::Stage { stage: 1, source, .. }
            if matches!(source.as_ref(), ParallelError::Timeout { rank: 1, timeout, waiting_for, .. }
                if *timeout == Duration::from_millis(200) && waiting_for == &[0])),
        "{error:?}"
    );
    Ok(())
}

#[test]
fn stages_balance_by_parameter_bytes_and_forward_time() -> TestResult {
    let _serial = serial();
    let model = wide(3)?;
    let by_bytes = Partition::ParameterBytes { stages: 2 }.ranges(&model)?;
    // 16·2048 + 2048 and 2048·32 + 32 + 32·10 + 10 parameters: the cut goes after layer 2 or 3.
    assert_eq!(by_bytes.len(), 2);
    assert!(by_bytes[0].end == 3 || by_bytes[0].end == 2 || by_bytes[0].end == 1, "{by_bytes:?}");
    let sample = Tensor::ones_on([64, 16], DType::F32, Device::cpu(0))?;
    let by_time = Partition::ForwardTime { stages: 3, sample }.ranges(&model)?;
    assert_eq!(by_time.len(), 3);
    assert_eq!(by_time.first().map(|r| r.start), Some(0));
    assert_eq!(by_time.last().map(|r| r.end), Some(6));
    assert!(by_time.windows(2).all(|w| w[0].end == w[1].start && w[0].start < w[0].end));
    let bad = Partition::Boundaries(vec![3, 3]).ranges(&model).unwrap_err();
    assert!(
        matches!(&bad, ParallelError::Invalid { op: "Pipeline::new", message } if message.contains("strictly increasing")),
        "{bad:?}"
    );
    let schedule = Schedule::OneFOneB.actions(0, 2, 2);
    assert_eq!(schedule, [Action::Forward(0), Action::Forward(1), Action::Backward(0), Action::Backward(1)]);
    Ok(())
}

#[test]
fn each_forward_and_backward_is_a_profiler_range_on_its_stage_thread() -> TestResult {
    let _serial = serial();
    let (x, y) = data(8, 3)?;
    let mut pipe = Pipeline::new(mlp(1)?, loss_fn, PipelineConfig::new(boundaries(2), 4))?;
    let profiler = brasa_profile::Profiler::builder().start()?;
    pipe.step(&x, &y)?;
    let result = profiler.stop();
    let table = result.key_averages();
    for stage in 0..2 {
        for j in 0..4 {
            for kind in ["forward", "backward"] {
                let name = format!("pipeline stage {stage} {kind} mb {j}");
                assert_eq!(table.get(&name).map(|row| row.count), Some(1), "{name}");
            }
        }
    }
    let trace = std::env::temp_dir().join(format!("brasa-pipeline-trace-{}.json", std::process::id()));
    result.export_chrome_trace(&trace)?;
    let text = std::fs::read_to_string(&trace)?;
    std::fs::remove_file(&trace)?;
    assert!(text.contains("brasa-pipeline-stage0") && text.contains("brasa-pipeline-stage1"));
    let report = pipe.report().expect("a report");
    assert!(report.bubble() > 0.0 && report.bubble() < 1.0, "{report}");
    assert!(report.stages.iter().all(|s| s.peak_bytes > 0 && !s.busy.is_zero()), "{report}");
    Ok(())
}

/// Halves its input: a stage of this alone has no parameters.
struct Halve;

impl Parameters for Halve {
    fn visit(&self, _walk: &mut Walk<'_>) {}
    fn visit_mut(&mut self, _walk: &mut WalkMut<'_>) -> brasa_nn::Result<()> {
        Ok(())
    }
}

impl Module for Halve {
    fn forward(&self, x: &Var) -> brasa_nn::Result<Var> {
        Ok(x.mul_scalar(0.5)?)
    }
}

#[test]
fn stages_without_parameters_are_legitimate() -> TestResult {
    let _serial = serial();
    let (x, y) = data(8, 4)?;
    let with_halves = |seed: u64| -> TestResult<Sequential> {
        let mut g = Generator::new(seed);
        Ok(Sequential::new()
            .push(Halve)
            .push(Tanh)
            .push(linear(&mut g, 12, 24)?)
            .push(Tanh)
            .push(Halve)
            .push(linear(&mut g, 24, 5)?))
    };
    // Parameterless stages first, in the middle and last.
    let partitions = [vec![1], vec![2], vec![2, 4], vec![1, 2, 5], vec![4, 5]];
    for (schedule, checkpoint) in [(Schedule::GPipe, false), (Schedule::OneFOneB, false), (Schedule::OneFOneB, true)] {
        for boundaries in partitions.clone() {
            let what = format!("{} checkpoint {checkpoint} boundaries {boundaries:?}", schedule.name());
            let reference = with_halves(11)?;
            cross_entropy(&reference.forward(&Var::new(x.clone()))?, &y)?.backward()?;
            let every_stage = if checkpoint { (0..=boundaries.len()).collect() } else { Vec::new() };
            let config = PipelineConfig::new(Partition::Boundaries(boundaries.clone()), 2)
                .schedule(schedule)
                .checkpoint(every_stage)
                .rng(PipelineRng::Shared)
                .threads_per_stage(1);
            let mut pipe = Pipeline::new(with_halves(11)?, loss_fn, config)?;
            let loss = pipe.step(&x, &y).map_err(|e| format!("{what}: {e}"))?;
            assert!(loss.is_finite(), "{what}");
            for (i, (g, w)) in grads(&pipe.parameters()).iter().zip(grads(&reference.parameters())).enumerate() {
                assert_close(g, &w, 1e-6, 1e-4, &format!("{what} grad {i}"));
            }
        }
    }
    Ok(())
}
