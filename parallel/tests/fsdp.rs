//! FullyShardedDataParallel over 2 and 4 in-process ranks gives the same
//! parameters as one process on the full batch, step for step (SGD with
//! momentum and AdamW; with checkpointed units; with no_sync accumulation;
//! with tied weights; with bf16 mixed precision against the same mixed
//! precision on one process); its state dicts round-trip exactly; a rank
//! that fails ends every rank in an `Err`.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{no_grad, Var};
use brasa_nn::functional::cross_entropy;
use brasa_nn::optim::{AdamConfig, AdamW, Optimizer, Sgd, SgdConfig};
use brasa_nn::{Linear, Module, ModuleExt, Sequential, StateDict, Tanh};
use brasa_parallel::{
    run_in_process, CommOptions, FsdpConfig, FullyShardedDataParallel, LaunchOptions, MixedPrecision, ParallelError,
    Result,
};
use brasa_tensor::{DType, Device, Tensor};
use std::time::{Duration, Instant};

const BATCH: usize = 24;
const INPUTS: usize = 6;
const CLASSES: usize = 3;

fn options() -> LaunchOptions {
    LaunchOptions { comm: CommOptions::default().timeout(Duration::from_secs(30)), threads_per_rank: Some(1) }
}

/// The tests share logical host devices `cpu:0..4`; the memory test
/// watches every allocation on them, so they run one at a time.
static DEVICES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn setup() -> std::sync::MutexGuard<'static, ()> {
    brasa_parallel::ensure_host_devices(4).unwrap();
    DEVICES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Five layers (three with parameters, of odd sizes so that shards cut
/// parameters in the middle). With `tied`, six: the first layer and the
/// fifth share their weight (`Var`), as a language model's embedding and
/// head do.
fn model(dev: Device, tied: bool) -> Result<Sequential> {
    let seq = if tied {
        let head = Linear::new(INPUTS, 7, dev)?;
        let bias = Var::param(Tensor::zeros_on([7], DType::F32, dev)?)?;
        let lead = Linear { weight: head.weight.clone(), bias: Some(bias) };
        Sequential::new()
            .push(lead)
            .push(Tanh)
            .push(Linear::new(7, INPUTS, dev)?)
            .push(Tanh)
            .push(head)
            .push(Linear::new(7, CLASSES, dev)?)
    } else {
        Sequential::new()
            .push(Linear::new(INPUTS, 7, dev)?)
            .push(Tanh)
            .push(Linear::new(7, INPUTS, dev)?)
            .push(Tanh)
            .push(Linear::new(INPUTS, CLASSES, dev)?)
    };
    let params = seq.parameters();
    let _no_grad = no_grad();
    for (k, p) in params.iter().enumerate() {
        let scale = 1.0 / (p.dims().last().copied().unwrap_or(1) as f32).sqrt();
        let values: Vec<f32> =
            (0..p.numel()).map(|i| (((i * 31 + k * 17) % 41) as f32 - 20.0) / 20.0 * scale).collect();
        p.tensor().copy_(&Tensor::from_vec_on(values, p.dims().to_vec(), dev)?)?;
    }
    Ok(seq)
}

/// Deterministic full batch for `step`: inputs and class targets.
fn batch(step: usize, dev: Device) -> Result<(Tensor, Tensor)> {
    let x: Vec<f32> = (0..BATCH * INPUTS).map(|i| (((i * 37 + step * 11) % 29) as f32 - 14.0) / 7.0).collect();
    let y: Vec<i64> = (0..BATCH).map(|i| ((i * 5 + step) % CLASSES) as i64).collect();
    Ok((Tensor::from_vec_on(x, [BATCH, INPUTS], dev)?, Tensor::from_vec_on(y, [BATCH], dev)?))
}

/// Rows of rank `rank`'s part.
fn rows(t: &Tensor, rank: usize, world: usize) -> Result<Tensor> {
    let n = t.dims()[0] / world;
    Ok(t.narrow(0, rank * n, n)?.contiguous()?)
}

#[derive(Clone, Copy, Debug)]
enum Opt {
    SgdMomentum,
    AdamW,
}

fn optimizer(kind: Opt, params: Vec<Var>) -> Result<Box<dyn Optimizer>> {
    Ok(match kind {
        Opt::SgdMomentum => Box::new(Sgd::new(params, SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() })?),
        Opt::AdamW => Box::new(AdamW::new(params, AdamConfig { lr: 0.01, weight_decay: 0.1, ..Default::default() })?),
    })
}

/// A model's parameters (and, where clipped, the total norm) by name.
type State = Vec<(String, Vec<f32>)>;

/// The unsharded model's state dict as name → values.
fn values(dict: &StateDict) -> Result<Vec<(String, Vec<f32>)>> {
    let mut out: Vec<(String, Vec<f32>)> = dict
        .iter()
        .map(|(n, t)| Ok((n.to_string(), t.to_dtype(DType::F32)?.to_vec::<f32>()?)))
        .collect::<Result<_>>()?;
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

#[derive(Clone, Copy)]
struct Case {
    world: usize,
    steps: usize,
    micro: usize,
    kind: Opt,
    tied: bool,
    clip: Option<f64>,
    precision: Precision,
}

/// How the ranks compute (the reference alike).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Precision {
    F32,
    /// Under bf16 autocast.
    Autocast,
    /// bf16 inputs on bf16 gathered parameters (`MixedPrecision::bf16()`;
    /// its reference is `reference_bf16`).
    Bf16,
}

impl Case {
    fn new(world: usize, kind: Opt) -> Case {
        Case { world, steps: 4, micro: 1, kind, tied: false, clip: None, precision: Precision::F32 }
    }
}

/// The loss of `forward` on `x` against `y`, under autocast when `precision` says so.
fn loss_of(precision: Precision, forward: impl FnOnce(Var) -> Result<Var>, x: Tensor, y: &Tensor) -> Result<Var> {
    let _bf16 = (precision == Precision::Autocast).then(|| brasa_amp::autocast(DType::BF16));
    Ok(cross_entropy(&forward(Var::new(x))?, y)?)
}

/// One process on full batches (`micro` micro-batches summed): the
/// parameters after every step.
fn reference(case: Case) -> Result<Vec<State>> {
    let dev = Device::cpu(0);
    let m = model(dev, case.tied)?;
    let mut opt = optimizer(case.kind, m.parameters())?;
    let mut trajectory = Vec::new();
    for step in 0..case.steps {
        for k in 0..case.micro {
            let (x, y) = batch(step * case.micro + k, dev)?;
            loss_of(case.precision, |x| Ok(m.forward(&x)?), x, &y)?.backward()?;
        }
        let norm = match case.clip {
            Some(max) => Some(brasa_nn::optim::clip_grad_norm_(&m.parameters(), max, 2.0)? as f32),
            None => None,
        };
        opt.step()?;
        opt.zero_grad()?;
        let mut state = values(&m.state_dict())?;
        state.extend(norm.map(|n| ("total norm".to_string(), vec![n])));
        trajectory.push(state);
    }
    Ok(trajectory)
}

/// Every rank's full state dict after every step (gathered on rank 0).
fn train_fsdp(case: Case, config: FsdpConfig) -> Result<Vec<State>> {
    let ranks = run_in_process(case.world, &options(), |comm| {
        let dev = comm.device();
        let (rank, world) = (comm.rank(), comm.world_size());
        let fsdp = FullyShardedDataParallel::new(model(dev, case.tied)?, comm.clone(), config.clone())?;
        let mut opt = optimizer(case.kind, fsdp.parameters())?;
        let mut trajectory = Vec::new();
        for step in 0..case.steps {
            for k in 0..case.micro {
                let (x, y) = batch(step * case.micro + k, dev)?;
                let (x, y) = (rows(&x, rank, world)?, rows(&y, rank, world)?);
                let x = if case.precision == Precision::Bf16 { x.to_dtype(DType::BF16)? } else { x };
                let _local = (k + 1 < case.micro).then(|| fsdp.no_sync());
                let forward = |x: Var| {
                    let logits = fsdp.forward(&x)?;
                    if case.precision == Precision::Bf16 {
                        assert_eq!(logits.dtype(), DType::BF16);
                    }
                    Ok(logits)
                };
                loss_of(case.precision, forward, x, &y)?.backward()?;
            }
            if case.precision == Precision::Bf16 {
                // Gathered in bf16: two bytes per element.
                let stats = fsdp.stats();
                let per_step: usize = fsdp.unit_numels().iter().sum::<usize>() * 2;
                assert!(stats.all_gather_bytes >= per_step, "{stats:?}");
                assert_eq!(stats.all_gather_bytes % per_step.min(2), 0);
            }
            let norm = match case.clip {
                Some(max) => Some(fsdp.clip_grad_norm(max)? as f32),
                None => None,
            };
            opt.step()?;
            opt.zero_grad()?;
            for shard in fsdp.parameters() {
                assert_eq!(shard.dtype(), DType::F32, "master shards stay f32");
            }
            if let Some(dict) = fsdp.full_state_dict()? {
                let mut state = values(&dict)?;
                state.extend(norm.map(|n| ("total norm".to_string(), vec![n])));
                trajectory.push(state);
            }
        }
        Ok(trajectory)
    })?;
    Ok(ranks.into_iter().next().unwrap())
}

fn assert_close(got: &[(String, Vec<f32>)], want: &[(String, Vec<f32>)], tolerance: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: entries");
    for ((gn, g), (wn, w)) in got.iter().zip(want) {
        assert_eq!(gn, wn, "{what}");
        assert_eq!(g.len(), w.len(), "{what}: {gn}");
        for (a, b) in g.iter().zip(w) {
            assert!((a - b).abs() <= tolerance * (1.0 + b.abs()), "{what}: {gn}: {a} vs {b}");
        }
    }
}

fn check(case: Case, config: FsdpConfig, tolerance: f32) -> Result<()> {
    let want = reference(case)?;
    let got = train_fsdp(case, config)?;
    assert_eq!(got.len(), case.steps);
    for (step, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_close(g, w, tolerance, &format!("world {} {:?} step {step}", case.world, case.kind));
    }
    Ok(())
}

#[test]
fn fsdp_matches_one_process_step_for_step() -> Result<()> {
    let _devices = setup();
    for kind in [Opt::SgdMomentum, Opt::AdamW] {
        for world in [2, 4] {
            check(Case::new(world, kind), FsdpConfig::default(), 1e-5)?;
        }
    }
    Ok(())
}

#[test]
fn without_resharding_or_prefetch_it_still_matches() -> Result<()> {
    let _devices = setup();
    let config = FsdpConfig { reshard_after_forward: false, prefetch: false, ..FsdpConfig::default() };
    check(Case::new(2, Opt::SgdMomentum), config, 1e-5)
}

#[test]
fn checkpointed_units_match() -> Result<()> {
    let _devices = setup();
    let config = FsdpConfig { checkpoint: true, ..FsdpConfig::default() };
    check(Case::new(2, Opt::AdamW), config.clone(), 1e-5)?;
    check(Case::new(4, Opt::SgdMomentum), config, 1e-5)
}

#[test]
fn no_sync_accumulation_matches_summed_micro_batches() -> Result<()> {
    let _devices = setup();
    check(Case { micro: 2, ..Case::new(2, Opt::SgdMomentum) }, FsdpConfig::default(), 1e-5)?;
    check(Case { micro: 3, ..Case::new(4, Opt::AdamW) }, FsdpConfig::default(), 1e-5)
}

#[test]
fn tied_weights_form_a_shared_unit_and_match() -> Result<()> {
    let _devices = setup();
    let units = run_in_process(2, &options(), |comm| {
        let fsdp = FullyShardedDataParallel::new(model(comm.device(), true)?, comm.clone(), FsdpConfig::default())?;
        Ok(fsdp.units())
    })?;
    let shared = units[0].iter().find(|(name, _)| name == "shared").expect("a shared unit");
    assert_eq!(shared.1, ["0.weight"]);
    check(Case { tied: true, ..Case::new(2, Opt::AdamW) }, FsdpConfig::default(), 1e-5)?;
    check(
        Case { tied: true, ..Case::new(4, Opt::SgdMomentum) },
        FsdpConfig { checkpoint: true, ..FsdpConfig::default() },
        1e-5,
    )
}

#[test]
fn global_norm_clipping_matches_one_process() -> Result<()> {
    let _devices = setup();
    check(Case { clip: Some(0.05), ..Case::new(4, Opt::SgdMomentum) }, FsdpConfig::default(), 1e-5)
}

/// One process with FSDP's mixed precision: bf16 copies of f32 master
/// weights for forward and backward, gradients widened to f32 for the step.
fn reference_bf16(case: Case) -> Result<Vec<State>> {
    let dev = Device::cpu(0);
    let master = model(dev, false)?;
    let mut opt = optimizer(case.kind, master.parameters())?;
    let mut trajectory = Vec::new();
    for step in 0..case.steps {
        let mut compute = model(dev, false)?;
        compute.to_dtype(DType::BF16)?;
        {
            let _no_grad = no_grad();
            for (c, m) in compute.parameters().iter().zip(master.parameters()) {
                c.tensor().copy_(m.tensor())?; // rounds to bf16
            }
        }
        let (x, y) = batch(step, dev)?;
        cross_entropy(&compute.forward(&Var::new(x.to_dtype(DType::BF16)?))?, &y)?.backward()?;
        for (m, c) in master.parameters().iter().zip(compute.parameters()) {
            m.set_grad(Some(c.grad().unwrap().to_dtype(DType::F32)?))?;
        }
        opt.step()?;
        opt.zero_grad()?;
        trajectory.push(values(&master.state_dict())?);
    }
    Ok(trajectory)
}

#[test]
fn bf16_mixed_precision_matches_the_same_mixed_precision_on_one_process() -> Result<()> {
    let _devices = setup();
    // SGD: unlike Adam, its step scales with the gradient, so a wrong
    // reduction (a sum for a mean) shows.
    let case = Case::new(2, Opt::SgdMomentum);
    let want = reference_bf16(case)?;
    let config = FsdpConfig { mixed_precision: Some(MixedPrecision::bf16()), ..FsdpConfig::default() };
    let got = train_fsdp(Case { precision: Precision::Bf16, ..case }, config)?;
    // bf16 keeps 8 bits: each rank's half-batch gradient and the full
    // batch's round differently; the steps agree to bf16's precision.
    for (step, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_close(g, w, 2e-2, &format!("bf16 step {step}"));
    }
    Ok(())
}

#[test]
fn full_and_sharded_state_dicts_round_trip_exactly() -> Result<()> {
    let _devices = setup();
    let dir = std::env::temp_dir().join(format!("brasa-fsdp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.clone();
    let trained = run_in_process(2, &options(), move |comm| {
        let dev = comm.device();
        let fsdp = FullyShardedDataParallel::new(model(dev, false)?, comm.clone(), FsdpConfig::default())?;
        let mut opt = optimizer(Opt::AdamW, fsdp.parameters())?;
        let (x, y) = batch(0, dev)?;
        cross_entropy(&fsdp.forward(&Var::new(rows(&x, comm.rank(), 2)?))?, &rows(&y, comm.rank(), 2)?)?.backward()?;
        opt.step()?;
        // Sharded: per rank, to a file and back into a fresh model.
        let file = path.join(format!("rank{}.safetensors", comm.rank()));
        fsdp.sharded_state_dict()?.save(&file)?;
        let fresh = FullyShardedDataParallel::new(model(dev, false)?, comm.clone(), FsdpConfig::default())?;
        fresh.load_sharded_state_dict(&StateDict::load(&file)?)?;
        for (a, b) in fsdp.parameters().iter().zip(fresh.parameters()) {
            assert_eq!(a.tensor().to_vec::<f32>()?, b.tensor().to_vec::<f32>()?);
        }
        // Another rank's file is refused, naming the rank.
        let other = path.join(format!("rank{}.safetensors", 1 - comm.rank()));
        comm.barrier()?;
        let error = fresh.load_sharded_state_dict(&StateDict::load(&other)?).unwrap_err();
        assert!(
            matches!(&error, ParallelError::Invalid { op: "FullyShardedDataParallel::load_sharded_state_dict", message }
                if message.contains("fsdp.rank")),
            "{error:?}"
        );
        // Full: gathered on rank 0, then loaded into a model of another layout.
        let full = fsdp.full_state_dict()?;
        Ok((
            full.map(|d| values(&d)).transpose()?,
            fsdp.parameters().iter().map(|p| p.tensor().to_vec::<f32>()).collect::<std::result::Result<Vec<_>, _>>()?,
        ))
    })?;
    let full = trained[0].0.clone().unwrap();
    assert!(trained[1].0.is_none());
    // Into the unsharded model, exactly.
    let plain = model(Device::cpu(0), false)?;
    let mut dict = StateDict::new();
    for (name, v) in &full {
        let shape = plain.state_dict().get(name).unwrap().dims().to_vec();
        dict.insert(name.clone(), Tensor::from_vec(v.clone(), shape)?);
    }
    plain.load_state_dict(&dict, true)?;
    assert_eq!(values(&plain.state_dict())?, full);
    // And back into a sharded model on 4 ranks: its full dict is the same.
    dict.save(dir.join("full.safetensors"))?;
    let file = dir.join("full.safetensors");
    let again = run_in_process(4, &options(), move |comm| {
        let dev = comm.device();
        let fsdp = FullyShardedDataParallel::new(model(dev, false)?, comm.clone(), FsdpConfig::default())?;
        fsdp.load_full_state_dict(&StateDict::load(&file)?)?;
        let mut wrong = StateDict::load(&file)?;
        wrong.insert("9.weight", Tensor::zeros_on([1], DType::F32, dev)?);
        let error = fsdp.load_full_state_dict(&wrong).unwrap_err();
        assert!(
            matches!(&error, ParallelError::Invalid { op: "FullyShardedDataParallel::load_full_state_dict", message }
                if message.contains("9.weight")),
            "{error:?}"
        );
        fsdp.full_state_dict()?.map(|d| values(&d)).transpose()
    })?;
    assert_eq!(again[0].as_ref().unwrap(), &full);
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}

#[test]
fn a_failing_rank_ends_every_rank_in_an_err() -> Result<()> {
    let _devices = setup();
    let options =
        LaunchOptions { comm: CommOptions::default().timeout(Duration::from_secs(3)), threads_per_rank: Some(1) };
    let started = Instant::now();
    let outcome = run_in_process(2, &options, |comm| {
        let dev = comm.device();
        let fsdp = FullyShardedDataParallel::new(model(dev, false)?, comm.clone(), FsdpConfig::default())?;
        if comm.rank() == 1 {
            return Err(ParallelError::invalid("test", "rank 1 gives up"));
        }
        let (x, y) = batch(0, dev)?;
        cross_entropy(&fsdp.forward(&Var::new(rows(&x, 0, 2)?))?, &rows(&y, 0, 2)?)?.backward()?;
        Ok(())
    });
    assert!(outcome.is_err());
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
    Ok(())
}

#[test]
fn bad_models_are_refused_with_the_reason() -> Result<()> {
    let _devices = setup();
    let errors = run_in_process(2, &options(), |comm| {
        let dev = comm.device();
        let frozen = model(dev, false)?;
        frozen.parameters()[0].requires_grad_(false)?;
        let a = FullyShardedDataParallel::new(frozen, comm.clone(), FsdpConfig::default()).err().unwrap();
        let elsewhere = model(Device::cpu((comm.rank() + 1) % 2), false)?;
        let b = FullyShardedDataParallel::new(elsewhere, comm.clone(), FsdpConfig::default()).err().unwrap();
        let c = FullyShardedDataParallel::new(Sequential::new(), comm.clone(), FsdpConfig::default()).err().unwrap();
        Ok([a, b, c])
    })?;
    // Each an `Invalid` of the constructor whose message gives the reason
    // (and, for a model elsewhere, the remedy).
    let refused = |error: &ParallelError, words: &[&str]| {
        assert!(
            matches!(error, ParallelError::Invalid { op: "FullyShardedDataParallel::new", message }
                if words.iter().all(|w| message.contains(w))),
            "expected {words:?}: {error:?}"
        );
    };
    refused(&errors[0][0], &["0.weight", "require grad"]);
    refused(&errors[0][1], &["move the model"]);
    refused(&errors[0][2], &["no layers"]);
    Ok(())
}

/// The peak, from now on, of the bytes a device holds in parameters,
/// gradients and optimizer state together, as its allocator reports them.
struct ModelStatesPeak {
    device: Device,
    counts: std::sync::Arc<std::sync::Mutex<(i64, i64)>>,
}

impl ModelStatesPeak {
    fn watch(device: Device) -> Result<ModelStatesPeak> {
        use brasa_alloc::{MemoryCategory, TraceAction, TraceEntry};
        let counts = std::sync::Arc::new(std::sync::Mutex::new((0i64, 0i64)));
        let seen = counts.clone();
        let counted = |c: MemoryCategory| {
            matches!(c, MemoryCategory::Parameter | MemoryCategory::Gradient | MemoryCategory::OptimizerState)
        };
        let observer = move |entry: &TraceEntry| {
            let delta = match entry.action {
                TraceAction::Alloc if counted(entry.category) => entry.size as i64,
                TraceAction::FreeCompleted if counted(entry.category) => -(entry.size as i64),
                TraceAction::Retag { from } => match (counted(from), counted(entry.category)) {
                    (false, true) => entry.size as i64,
                    (true, false) => -(entry.size as i64),
                    _ => 0,
                },
                _ => 0,
            };
            let mut c = seen.lock().unwrap();
            c.0 += delta;
            c.1 = c.1.max(c.0);
        };
        brasa_tensor::memory::set_observer(device, Some(std::sync::Arc::new(observer)))?;
        Ok(ModelStatesPeak { device, counts })
    }

    /// Peak above what was held when watching started.
    fn peak(&self) -> usize {
        self.counts.lock().unwrap().1 as usize
    }
}

impl Drop for ModelStatesPeak {
    fn drop(&mut self) {
        let _ = brasa_tensor::memory::set_observer(self.device, None);
    }
}

#[test]
fn peak_model_states_are_a_shard_of_the_model_plus_the_gathered_units() -> Result<()> {
    let _devices = setup();
    const UNITS: usize = 8;
    const WIDTH: usize = 128;
    for world in [2, 4] {
        let peaks = run_in_process(world, &options(), |comm| {
            let dev = comm.device();
            let mut seq = Sequential::new();
            for _ in 0..UNITS {
                seq = seq.push(Linear::new(WIDTH, WIDTH, dev)?).push(Tanh);
            }
            let fsdp = FullyShardedDataParallel::new(seq, comm.clone(), FsdpConfig::default())?;
            let mut opt = optimizer(Opt::SgdMomentum, fsdp.parameters())?;
            let x = Var::new(Tensor::randn_on([4, WIDTH], DType::F32, dev)?);
            let y = Tensor::zeros_on([4], DType::I64, dev)?;
            // Step 1 makes the momentum; the peak is watched from step 2.
            cross_entropy(&fsdp.forward(&x)?, &y)?.backward()?;
            opt.step()?;
            opt.zero_grad()?;
            let shards: usize = fsdp.parameters().iter().map(|p| p.tensor().storage().size_in_bytes()).sum();
            let watch = ModelStatesPeak::watch(dev)?;
            for _ in 0..2 {
                cross_entropy(&fsdp.forward(&x)?, &y)?.backward()?;
                opt.step()?;
                opt.zero_grad()?;
            }
            Ok((watch.peak(), shards, fsdp.unit_numels()[0] * 4))
        })?;
        for (rank, &(extra, shards, unit)) in peaks.iter().enumerate() {
            // Held before watching: shards and momentum (2 × shards).
            let held = 2 * shards;
            let total = held + extra;
            // Exactly, at the peak (the backward of unit 1): units 1 and 0
            // gathered (running, prefetched), unit 1's unsharded gradients
            // and unit 2's (its reduce-scatter in flight), and the
            // averaged shards of units 7..2 (each a 512-byte-rounded block
            // of the small pool).
            let shard_block = (shards / UNITS).div_ceil(512) * 512;
            let want = held + 4 * unit + (UNITS - 2) * shard_block;
            assert_eq!(total, want, "world {world} rank {rank}");
            // The formula a plan may count on (every shard's gradient):
            let high = held + shards + 4 * unit;
            assert!(total <= high);
            // And against every rank holding everything (DDP: P + G + K·P).
            let everything = 3 * shards * world;
            assert!((total as f64) < everything as f64 * (1.0 / world as f64 + 4.0 / UNITS as f64) * 1.05);
        }
    }
    Ok(())
}

#[test]
fn most_communication_overlaps_computation() -> Result<()> {
    let _devices = setup();
    let stats = run_in_process(2, &options(), |comm| {
        let dev = comm.device();
        let mut seq = Sequential::new();
        for _ in 0..8 {
            seq = seq.push(Linear::new(64, 64, dev)?).push(Tanh);
        }
        let fsdp = FullyShardedDataParallel::new(seq, comm.clone(), FsdpConfig::default())?;
        let x = Var::new(Tensor::randn_on([8, 64], DType::F32, dev)?);
        let y = Tensor::zeros_on([8], DType::I64, dev)?;
        for _ in 0..2 {
            cross_entropy(&fsdp.forward(&x)?, &y)?.backward()?;
        }
        let unprefetched = {
            let config = FsdpConfig { prefetch: false, ..FsdpConfig::default() };
            let mut seq = Sequential::new();
            for _ in 0..8 {
                seq = seq.push(Linear::new(64, 64, dev)?).push(Tanh);
            }
            let plain = FullyShardedDataParallel::new(seq, comm.clone(), config)?;
            cross_entropy(&plain.forward(&x)?, &y)?.backward()?;
            plain.stats()
        };
        Ok((fsdp.stats(), unprefetched))
    })?;
    let (stats, unprefetched) = &stats[0];
    // 8 gathers in forward (the first one exposed), 7 in backward (the
    // last unit stays gathered), 8 reduce-scatters (the last one exposed).
    assert_eq!(stats.all_gathers, 15, "{stats:?}");
    assert_eq!(stats.reduce_scatters, 8, "{stats:?}");
    assert_eq!(stats.order_changes, 0);
    let unit = stats.all_gather_bytes / 15;
    assert_eq!(stats.prefetched_bytes, 14 * unit);
    assert_eq!(stats.overlapped_reduce_bytes, 7 * unit);
    assert!(stats.overlap() >= 0.9, "{}", stats.overlap());
    // Without prefetch only the reductions overlap.
    assert_eq!(unprefetched.prefetched_bytes, 0);
    assert!(unprefetched.overlap() < 0.35, "{}", unprefetched.overlap());
    Ok(())
}

#[test]
fn an_inf_on_one_rank_makes_every_rank_skip_the_step() -> Result<()> {
    use brasa_amp::{GradScaler, GradScalerConfig};
    let _devices = setup();
    let outcomes = run_in_process(2, &options(), |comm| {
        let dev = comm.device();
        let fsdp = FullyShardedDataParallel::new(model(dev, false)?, comm.clone(), FsdpConfig::default())?;
        let mut opt = optimizer(Opt::SgdMomentum, fsdp.parameters())?;
        let mut scaler = GradScaler::with_config(GradScalerConfig { init_scale: 1024.0, ..Default::default() })
            .map_err(|e| ParallelError::invalid("test", e.to_string()))?;
        let before: Vec<Vec<f32>> =
            fsdp.parameters().iter().map(|p| p.tensor().to_vec::<f32>()).collect::<std::result::Result<_, _>>()?;
        let (x, y) = batch(0, dev)?;
        let loss = cross_entropy(&fsdp.forward(&Var::new(rows(&x, comm.rank(), 2)?))?, &rows(&y, comm.rank(), 2)?)?;
        let amp = |e: brasa_amp::AmpError| ParallelError::invalid("test", e.to_string());
        scaler.scale(&loss).map_err(amp)?.backward()?;
        if comm.rank() == 1 {
            // An overflow only rank 1's shard sees.
            fsdp.parameters()[0].grad().unwrap().narrow(0, 0, 1)?.fill_(f64::INFINITY)?;
        }
        scaler.unscale_(opt.as_ref()).map_err(amp)?;
        let mine = scaler.found_inf(opt.as_ref()) == Some(true);
        scaler.set_found_inf(opt.as_ref(), fsdp.any_rank_nonfinite(mine)?).map_err(amp)?;
        let stepped = scaler.step(opt.as_mut()).map_err(amp)?;
        scaler.update().map_err(amp)?;
        let after: Vec<Vec<f32>> =
            fsdp.parameters().iter().map(|p| p.tensor().to_vec::<f32>()).collect::<std::result::Result<_, _>>()?;
        Ok((mine, stepped, before == after, scaler.get_scale()))
    })?;
    assert_eq!(outcomes[0], (false, false, true, 512.0));
    assert_eq!(outcomes[1], (true, false, true, 512.0));
    Ok(())
}

#[test]
fn autocast_inside_fsdp_matches_autocast_on_one_process() -> Result<()> {
    let _devices = setup();
    let case = Case { precision: Precision::Autocast, ..Case::new(2, Opt::SgdMomentum) };
    check(case, FsdpConfig::default(), 2e-2)
}

/// Identity in forward; its backward fails while `FAIL` is set.
struct FailingBackward;

static FAIL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl brasa_autograd::Function for FailingBackward {
    fn forward(&mut self, _ctx: &mut brasa_autograd::FunctionCtx, inputs: &[Tensor]) -> brasa_autograd::Result<Tensor> {
        Ok(inputs[0].clone())
    }
    fn backward(&mut self, _: &[Tensor], grad: &Tensor, _: &[bool]) -> brasa_autograd::Result<Vec<Option<Tensor>>> {
        if FAIL.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(brasa_autograd::AutogradError::invalid("test", "this backward fails"));
        }
        Ok(vec![Some(grad.clone())])
    }
}

#[derive(brasa_nn::Parameters)]
struct FailingLayer;

impl Module for FailingLayer {
    fn forward(&self, x: &Var) -> brasa_nn::Result<Var> {
        Ok(brasa_autograd::apply(FailingBackward, &[x])?)
    }
}

#[test]
fn a_backward_that_fails_midway_leaves_the_next_step_whole() -> Result<()> {
    let _devices = setup();
    let case = Case::new(2, Opt::SgdMomentum);
    let want = reference(case)?;
    let got = run_in_process(2, &options(), |comm| {
        let dev = comm.device();
        let (rank, world) = (comm.rank(), comm.world_size());
        // The failing layer sits between the second and third linear
        // layers: backward fails after the last unit's gradients were
        // reduce-scattered, with the first units still gathered.
        let mut layers = model(dev, false)?.into_layers();
        layers.insert(4, Box::new(FailingLayer));
        let mut seq = Sequential::new();
        for layer in layers {
            seq.append(layer);
        }
        let fsdp = FullyShardedDataParallel::new(seq, comm.clone(), FsdpConfig::default())?;
        let mut opt = optimizer(case.kind, fsdp.parameters())?;
        let (x, y) = batch(0, dev)?;
        FAIL.store(true, std::sync::atomic::Ordering::SeqCst);
        let failed =
            cross_entropy(&fsdp.forward(&Var::new(rows(&x, rank, world)?))?, &rows(&y, rank, world)?)?.backward();
        comm.barrier()?;
        FAIL.store(false, std::sync::atomic::Ordering::SeqCst);
        assert!(failed.is_err());
        opt.zero_grad()?;
        let mut trajectory = Vec::new();
        for step in 0..case.steps {
            let (x, y) = batch(step, dev)?;
            cross_entropy(&fsdp.forward(&Var::new(rows(&x, rank, world)?))?, &rows(&y, rank, world)?)?.backward()?;
            opt.step()?;
            opt.zero_grad()?;
            if let Some(dict) = fsdp.full_state_dict()? {
                // The failing layer shifted the later layers' names by one.
                let renamed = dict.iter().map(|(name, t)| {
                    let (index, rest) = name.split_once('.').unwrap();
                    let index: usize = index.parse().unwrap();
                    (format!("{}.{rest}", if index > 4 { index - 1 } else { index }), t.clone())
                });
                let mut fixed = StateDict::new();
                for (name, t) in renamed {
                    fixed.insert(name, t);
                }
                trajectory.push(values(&fixed)?);
            }
        }
        Ok(trajectory)
    })?;
    for (step, (g, w)) in got[0].iter().zip(&want).enumerate() {
        assert_close(g, w, 1e-5, &format!("after a failed backward, step {step}"));
    }
    Ok(())
}

#[test]
fn shard_masks_pick_the_selected_parameters_elements() -> Result<()> {
    let _devices = setup();
    let plain = model(Device::cpu(0), false)?;
    let matrices: usize = plain.parameters().iter().filter(|p| p.rank() == 2).map(|p| p.numel()).sum();
    let all: usize = plain.num_parameters();
    for world in [2, 4] {
        let counts = run_in_process(world, &options(), |comm| {
            let fsdp =
                FullyShardedDataParallel::new(model(comm.device(), false)?, comm.clone(), FsdpConfig::default())?;
            let masks = fsdp.shard_masks(|_, dims| dims.len() == 2)?;
            let biases = fsdp.shard_masks(|name, _| name.ends_with("bias"))?;
            let mut picked = (0.0, 0.0, 0.0);
            for ((mask, bias), shard) in masks.iter().zip(&biases).zip(fsdp.parameters()) {
                assert_eq!(mask.dims(), shard.dims());
                picked.0 += mask.sum_all()?.item::<f64>()?;
                picked.1 += bias.sum_all()?.item::<f64>()?;
                // Never both.
                picked.2 += mask.mul(bias)?.sum_all()?.item::<f64>()?;
            }
            Ok(picked)
        })?;
        let total = |f: fn(&(f64, f64, f64)) -> f64| counts.iter().map(f).sum::<f64>() as usize;
        assert_eq!(total(|c| c.0), matrices, "world {world}");
        assert_eq!(total(|c| c.0) + total(|c| c.1), all, "world {world}");
        assert_eq!(total(|c| c.2), 0);
    }
    Ok(())
}
