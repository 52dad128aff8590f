//! DistributedDataParallel over 2 and 4 in-process ranks gives the same
//! parameters as one process on the full batch, step for step: plain,
//! with no_sync accumulation, after the bucket rebuild, with bf16
//! compression, with unused parameters, and with uneven batches (join).

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::Var;
use brasa_nn::functional::cross_entropy;
use brasa_nn::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use brasa_nn::{Linear, Module, ModuleExt, Relu, Sequential};
use brasa_parallel::{
    run_in_process, CommOptions, Compression, DdpConfig, DistributedDataParallel, LaunchOptions, ParallelError, Result,
};
use brasa_tensor::{Device, Tensor};
use std::time::Duration;

const BATCH: usize = 24;
const INPUTS: usize = 6;
const CLASSES: usize = 3;

fn options() -> LaunchOptions {
    LaunchOptions { comm: CommOptions::default().timeout(Duration::from_secs(30)), threads_per_rank: Some(1) }
}

fn setup() {
    brasa_parallel::ensure_host_devices(4).unwrap();
}

fn model(dev: Device, init: &[Vec<f32>]) -> Result<Sequential> {
    let model = Sequential::new()
        .push(Linear::new(INPUTS, 16, dev)?)
        .push(Relu)
        .push(Linear::new(16, 16, dev)?)
        .push(Relu)
        .push(Linear::new(16, CLASSES, dev)?);
    if !init.is_empty() {
        for (p, values) in model.parameters().iter().zip(init) {
            p.tensor().copy_(&Tensor::from_slice_on(values, p.dims().to_vec(), dev)?)?;
        }
    }
    Ok(model)
}

fn values(params: &[Var]) -> Result<Vec<Vec<f32>>> {
    params.iter().map(|p| Ok(p.tensor().to_vec::<f32>()?)).collect()
}

/// Deterministic full batch for `step`: inputs and class targets.
fn batch(step: usize, dev: Device) -> Result<(Tensor, Tensor)> {
    let x: Vec<f32> = (0..BATCH * INPUTS).map(|i| (((i * 37 + step * 11) % 29) as f32 - 14.0) / 7.0).collect();
    let y: Vec<i64> = (0..BATCH).map(|i| ((i * 5 + step) % CLASSES) as i64).collect();
    Ok((Tensor::from_vec_on(x, [BATCH, INPUTS], dev)?, Tensor::from_vec_on(y, [BATCH], dev)?))
}

/// Rows of rank `rank`'s shard.
fn shard(t: &Tensor, rank: usize, world: usize) -> Result<Tensor> {
    let rows = t.dims()[0] / world;
    Ok(t.narrow(0, rank * rows, rows)?.contiguous()?)
}

#[derive(Clone, Copy)]
enum Opt {
    SgdMomentum,
    Adam,
}

fn optimizer(kind: Opt, params: Vec<Var>) -> Result<Box<dyn Optimizer>> {
    Ok(match kind {
        Opt::SgdMomentum => Box::new(Sgd::new(params, SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() })?),
        Opt::Adam => Box::new(Adam::new(params, AdamConfig { lr: 0.01, ..Default::default() })?),
    })
}

/// Initial parameters from a formula, not the global RNG (tests run
/// concurrently and draw from it).
fn initial() -> Result<Vec<Vec<f32>>> {
    let shapes = model(Device::cpu(0), &[])?.parameters();
    Ok(shapes
        .iter()
        .enumerate()
        .map(|(k, p)| {
            let scale = 1.0 / (p.dims().last().copied().unwrap_or(1) as f32).sqrt();
            (0..p.numel()).map(|i| (((i * 31 + k * 17) % 41) as f32 - 20.0) / 20.0 * scale).collect()
        })
        .collect())
}

/// One process, full batches (split in `micro` micro-batches whose
/// gradients are summed, as no_sync accumulation does): parameters after
/// every step.
fn reference(steps: usize, micro: usize, kind: Opt) -> Result<Vec<Vec<Vec<f32>>>> {
    let dev = Device::cpu(0);
    let m = model(dev, &initial()?)?;
    let mut opt = optimizer(kind, m.parameters())?;
    let mut trajectory = Vec::new();
    for step in 0..steps {
        for k in 0..micro {
            let (x, y) = batch(step * micro + k, dev)?;
            cross_entropy(&m.forward(&Var::new(x))?, &y)?.backward()?;
        }
        opt.step()?;
        opt.zero_grad()?;
        trajectory.push(values(&m.parameters())?);
    }
    Ok(trajectory)
}

fn assert_close(got: &[Vec<f32>], want: &[Vec<f32>], tolerance: f32, what: &str) {
    for (g, w) in got.iter().zip(want) {
        for (a, b) in g.iter().zip(w) {
            assert!((a - b).abs() <= tolerance * (1.0 + b.abs()), "{what}: {a} vs {b}");
        }
    }
}

fn train_ddp(
    world: usize,
    steps: usize,
    micro: usize,
    kind: Opt,
    config: DdpConfig,
) -> Result<Vec<Vec<Vec<Vec<f32>>>>> {
    let init = initial()?;
    run_in_process(world, &options(), |comm| {
        let dev = comm.device();
        let rank = comm.rank();
        let ddp = DistributedDataParallel::new(model(dev, &init)?, comm.clone(), config.clone())?;
        let mut opt = optimizer(kind, ddp.module().parameters())?;
        let mut trajectory = Vec::new();
        for step in 0..steps {
            for k in 0..micro {
                let (x, y) = batch(step * micro + k, dev)?;
                let (x, y) = (shard(&x, rank, world)?, shard(&y, rank, world)?);
                if k + 1 < micro {
                    let _local = ddp.no_sync();
                    cross_entropy(&ddp.forward(&Var::new(x))?, &y)?.backward()?;
                } else {
                    cross_entropy(&ddp.forward(&Var::new(x))?, &y)?.backward()?;
                }
            }
            opt.step()?;
            opt.zero_grad()?;
            trajectory.push(values(&ddp.module().parameters())?);
        }
        Ok(trajectory)
    })
}

#[test]
fn ddp_matches_one_process_step_for_step() -> Result<()> {
    setup();
    for kind in [Opt::SgdMomentum, Opt::Adam] {
        let want = reference(5, 1, kind)?;
        for world in [2, 4] {
            let ranks = train_ddp(world, 5, 1, kind, DdpConfig::default())?;
            for trajectory in &ranks {
                for (step, (got, want)) in trajectory.iter().zip(&want).enumerate() {
                    assert_close(got, want, 1e-5, &format!("world {world} step {step}"));
                }
            }
        }
    }
    Ok(())
}

#[test]
fn no_sync_accumulation_matches_summed_micro_batches() -> Result<()> {
    setup();
    let want = reference(3, 2, Opt::SgdMomentum)?;
    let ranks = train_ddp(2, 3, 2, Opt::SgdMomentum, DdpConfig::default())?;
    for trajectory in &ranks {
        assert_close(trajectory.last().unwrap(), want.last().unwrap(), 1e-5, "no_sync");
    }
    Ok(())
}

#[test]
fn small_buckets_rebuild_and_still_match() -> Result<()> {
    setup();
    let config = DdpConfig { first_bucket_bytes: 64, bucket_cap_bytes: 512, ..DdpConfig::default() };
    let want = reference(4, 1, Opt::SgdMomentum)?;
    let init = initial()?;
    let ranks = run_in_process(2, &options(), |comm| {
        let dev = comm.device();
        let rank = comm.rank();
        let ddp = DistributedDataParallel::new(model(dev, &init)?, comm.clone(), config.clone())?;
        let buckets_before = ddp.bucket_bytes().len();
        assert!(buckets_before >= 3, "{buckets_before} buckets");
        let mut opt = optimizer(Opt::SgdMomentum, ddp.module().parameters())?;
        for step in 0..4 {
            let (x, y) = batch(step, dev)?;
            cross_entropy(&ddp.forward(&Var::new(shard(&x, rank, 2)?))?, &shard(&y, rank, 2)?)?.backward()?;
            // Gradients are views of the buckets: every parameter's gradient
            // shares storage with the others of its bucket.
            let grads: Vec<Tensor> = ddp.module().parameters().iter().map(|p| p.grad().unwrap()).collect();
            let distinct: std::collections::HashSet<usize> =
                grads.iter().map(|g| std::sync::Arc::as_ptr(g.storage()) as usize).collect();
            assert_eq!(distinct.len(), ddp.bucket_bytes().len());
            if step > 0 {
                assert!(ddp.buckets_rebuilt());
            }
            let stats = ddp.stats();
            assert_eq!(stats.total_bytes, ddp.bucket_bytes().iter().sum::<usize>());
            assert!(stats.overlap() > 0.0 && stats.overlap() < 1.0, "overlap {}", stats.overlap());
            opt.step()?;
            opt.zero_grad()?;
        }
        values(&ddp.module().parameters())
    })?;
    for got in &ranks {
        assert_close(got, want.last().unwrap(), 1e-5, "rebuilt");
    }
    Ok(())
}

#[test]
fn bf16_compression_stays_close() -> Result<()> {
    setup();
    let want = reference(3, 1, Opt::SgdMomentum)?;
    let config = DdpConfig { compression: Compression::Bf16, ..DdpConfig::default() };
    let ranks = train_ddp(2, 3, 1, Opt::SgdMomentum, config)?;
    for trajectory in &ranks {
        assert_close(trajectory.last().unwrap(), want.last().unwrap(), 2e-2, "bf16");
    }
    // Both ranks hold the same bits (one result, written to every rank).
    assert_eq!(ranks[0], ranks[1]);
    Ok(())
}

/// A model with a head that forward skips.
#[derive(brasa_nn::Parameters)]
struct WithUnused {
    body: Sequential,
    unused_head: Linear,
}

impl Module for WithUnused {
    fn forward(&self, x: &Var) -> brasa_nn::Result<Var> {
        self.body.forward(x)
    }
}

#[test]
fn unused_parameters_are_named_or_tolerated() -> Result<()> {
    setup();
    let init = initial()?;
    let want = reference(2, 1, Opt::SgdMomentum)?;
    for find_unused in [false, true] {
        let config = DdpConfig { find_unused_parameters: find_unused, ..DdpConfig::default() };
        let outcome = run_in_process(2, &options(), |comm| {
            let dev = comm.device();
            let rank = comm.rank();
            let wrapped = WithUnused { body: model(dev, &init)?, unused_head: Linear::new(4, 4, dev)? };
            let ddp = DistributedDataParallel::new(wrapped, comm.clone(), config.clone())?;
            let mut opt = optimizer(Opt::SgdMomentum, ddp.module().body.parameters())?;
            for step in 0..2 {
                let (x, y) = batch(step, dev)?;
                let out = match ddp.forward(&Var::new(shard(&x, rank, 2)?)) {
                    Ok(out) => out,
                    Err(error) => return Ok(Err(error)),
                };
                cross_entropy(&out, &shard(&y, rank, 2)?)?.backward()?;
                opt.step()?;
                opt.zero_grad()?;
            }
            Ok(Ok(values(&ddp.module().body.parameters())?))
        })?;
        for result in outcome {
            match (find_unused, result) {
                (false, Err(ParallelError::UnusedParameters { names, .. })) => {
                    assert_eq!(names, ["unused_head.weight", "unused_head.bias"]);
                }
                (true, Ok(params)) => assert_close(&params, want.last().unwrap(), 1e-5, "find_unused"),
                (_, other) => panic!("find_unused={find_unused}: unexpected {other:?}"),
            }
        }
    }
    Ok(())
}

#[test]
fn uneven_batches_join_without_hanging() -> Result<()> {
    setup();
    let init = initial()?;
    let world = 2;
    // Rank 0 has 4 batches, rank 1 has 2.
    let ranks = run_in_process(world, &options(), |comm| {
        let dev = comm.device();
        let rank = comm.rank();
        let ddp = DistributedDataParallel::new(model(dev, &init)?, comm.clone(), DdpConfig::default())?;
        let mut opt = optimizer(Opt::SgdMomentum, ddp.module().parameters())?;
        let batches = if rank == 0 { 4 } else { 2 };
        ddp.join(|| {
            for step in 0..batches {
                let (x, y) = batch(step, dev)?;
                cross_entropy(&ddp.forward(&Var::new(shard(&x, rank, world)?))?, &shard(&y, rank, world)?)?
                    .backward()?;
                opt.step()?;
                opt.zero_grad()?;
            }
            Ok(())
        })?;
        values(&ddp.module().parameters())
    })?;
    // Reference: while both train, the mean of both shards' gradients; once
    // rank 1 joined, rank 0's gradient divided by the world size.
    let dev = Device::cpu(0);
    let m = model(dev, &init)?;
    let mut opt = optimizer(Opt::SgdMomentum, m.parameters())?;
    for step in 0..4 {
        let (x, y) = batch(step, dev)?;
        let active = if step < 2 { 2 } else { 1 };
        for r in 0..active {
            let loss = cross_entropy(&m.forward(&Var::new(shard(&x, r, world)?))?, &shard(&y, r, world)?)?;
            loss.mul_scalar(1.0 / world as f64)?.backward()?;
        }
        opt.step()?;
        opt.zero_grad()?;
    }
    assert_close(&ranks[0], &values(&m.parameters())?, 1e-5, "join");
    Ok(())
}

#[test]
fn different_models_on_different_ranks_are_an_error_naming_both() -> Result<()> {
    setup();
    let outcome = run_in_process(2, &options(), |comm| {
        let dev = comm.device();
        let width = if comm.rank() == 0 { 8 } else { 9 };
        let m = Linear::new(4, width, dev)?;
        Ok(DistributedDataParallel::new(m, comm.clone(), DdpConfig::default()).err())
    })?;
    let error = outcome[1].as_ref().expect("rank 1 refuses");
    // Rank 1 sets rank 0's model beside its own.
    assert!(
        matches!(error, ParallelError::Mismatch { op: "DistributedDataParallel::new", rank: 1, ours, peer: 1, theirs }
            if ours.contains("rank 0's model") && ours.contains("40 elements") && theirs.contains("45 elements")),
        "{error:?}"
    );
    Ok(())
}

#[test]
fn a_peer_failing_mid_training_is_an_error_not_a_hang() -> Result<()> {
    setup();
    let init = initial()?;
    let start = std::time::Instant::now();
    let outcome = run_in_process(2, &options(), |comm| {
        let dev = comm.device();
        let rank = comm.rank();
        let ddp = DistributedDataParallel::new(model(dev, &init)?, comm.clone(), DdpConfig::default())?;
        for step in 0..3 {
            if rank == 1 && step == 1 {
                return Ok(None); // leaves: its communicator drops
            }
            let (x, y) = batch(step, dev)?;
            // The failure shows in forward (the bucket rebuild broadcasts)
            // or in backward (the gradient all-reduce), whichever comes first.
            let output = match ddp.forward(&Var::new(shard(&x, rank, 2)?)) {
                Ok(output) => output,
                Err(error) => return Ok(Some(error)),
            };
            if let Err(error) = cross_entropy(&output, &shard(&y, rank, 2)?)?.backward() {
                return Ok(Some(ParallelError::find_in(&error).cloned().unwrap_or(ParallelError::Autograd(error))));
            }
        }
        Ok(None)
    })?;
    let error = outcome[0].clone().expect("rank 0 should fail");
    assert!(matches!(error, ParallelError::PeerFailed { peer: 1, .. }), "{error}");
    assert!(start.elapsed() < Duration::from_secs(20));
    Ok(())
}

/// A module of bare parameters with the given shapes and dtypes, whose
/// forward sums them into one scalar per row of the input.
#[derive(brasa_nn::Parameters)]
struct Bare {
    params: Vec<Var>,
}

impl Module for Bare {
    fn forward(&self, x: &Var) -> brasa_nn::Result<Var> {
        let mut out = x.sum(&[1], true)?;
        for p in &self.params {
            out = out.add(&p.to_dtype(x.dtype())?.sum_all()?)?;
        }
        Ok(out)
    }
}

fn bare(dev: Device, specs: &[(&[usize], brasa_tensor::DType)]) -> Result<Bare> {
    let params = specs
        .iter()
        .map(|(dims, dtype)| Ok(Var::param(Tensor::ones_on(dims.to_vec(), *dtype, dev)?)?))
        .collect::<Result<Vec<_>>>()?;
    Ok(Bare { params })
}

#[test]
fn models_that_differ_in_a_shape_dtype_or_order_are_refused_naming_the_parameter_and_ranks() -> Result<()> {
    use brasa_tensor::DType::{F32, F64};
    setup();
    type Spec = Vec<(&'static [usize], brasa_tensor::DType)>;
    // (rank 0's model, the other ranks' model, what the error must name)
    let cases: Vec<(Spec, Spec, Vec<&str>)> = vec![
        // Transposed: same count and elements, different shapes.
        (vec![(&[6, 2], F32)], vec![(&[2, 6], F32)], vec!["params.0", "[6, 2]", "[2, 6]"]),
        // Same shapes, another dtype.
        (vec![(&[3], F32), (&[4, 2], F32)], vec![(&[3], F32), (&[4, 2], F64)], vec!["params.1", "f32", "f64"]),
        // The same parameters in another order.
        (vec![(&[3], F32), (&[5], F32)], vec![(&[5], F32), (&[3], F32)], vec!["params.0", "[3]", "[5]"]),
        // Another rank count: one more dim of size 1.
        (vec![(&[4], F32)], vec![(&[4, 1], F32)], vec!["params.0", "[4]", "[4, 1]"]),
    ];
    for world in [2, 3] {
        for (first, other, needles) in &cases {
            let outcome = run_in_process(world, &options(), |comm| {
                let dev = comm.device();
                // The last rank differs (the others are like rank 0).
                let spec = if comm.rank() + 1 == world { other } else { first };
                let m = bare(dev, spec)?;
                Ok(DistributedDataParallel::new(m, comm.clone(), DdpConfig::default()).err())
            })?;
            for (rank, error) in outcome.iter().enumerate() {
                let error = error.as_ref().unwrap_or_else(|| panic!("rank {rank} of {world} accepted {other:?}"));
                let ParallelError::Mismatch { op: "DistributedDataParallel::new", rank: named, ours, peer, theirs } =
                    error
                else {
                    panic!("rank {rank} of {world}: {error:?}")
                };
                // Each rank names itself and the last rank (the last rank names rank 0).
                let last = world - 1;
                assert_eq!((*named, *peer), (rank, if rank == last { 0 } else { last }), "{error}");
                let both = format!("{ours} | {theirs}");
                for needle in needles {
                    assert!(both.contains(needle), "missing {needle:?}: {error:?}");
                }
            }
        }
    }
    // The same model everywhere is accepted, any shapes and dtypes.
    let same: Spec = vec![(&[2, 3, 4], F64), (&[1], F32), (&[7, 1], F32)];
    let outcome = run_in_process(2, &options(), |comm| {
        let m = bare(comm.device(), &same)?;
        Ok(DistributedDataParallel::new(m, comm.clone(), DdpConfig::default()).is_ok())
    })?;
    assert_eq!(outcome, [true, true]);
    Ok(())
}

#[test]
fn a_channels_last_parameter_is_refused_naming_it() -> Result<()> {
    setup();
    let outcome = run_in_process(2, &options(), |comm| {
        let mut m = bare(comm.device(), &[(&[4, 3, 3, 3], brasa_tensor::DType::F32)])?;
        m.to_channels_last()?;
        Ok(DistributedDataParallel::new(m, comm.clone(), DdpConfig::default()).err().map(|e| e.to_string()))
    })?;
    for (rank, error) in outcome.iter().enumerate() {
        let error = error.as_ref().unwrap_or_else(|| panic!("rank {rank} accepted a channels-last parameter"));
        assert!(error.contains("params.0") && error.contains("channels-last"), "rank {rank}: {error}");
    }
    Ok(())
}

#[test]
fn no_sync_guards_dropped_out_of_order_still_end_in_a_synchronised_step() -> Result<()> {
    setup();
    let init = initial()?;
    let want = reference(1, 3, Opt::SgdMomentum)?;
    for order in ["in order", "out of order"] {
        let ranks = run_in_process(2, &options(), |comm| {
            let dev = comm.device();
            let rank = comm.rank();
            let ddp = DistributedDataParallel::new(model(dev, &init)?, comm.clone(), DdpConfig::default())?;
            let mut opt = optimizer(Opt::SgdMomentum, ddp.module().parameters())?;
            let micro = |k: usize| -> Result<()> {
                let (x, y) = batch(k, dev)?;
                cross_entropy(&ddp.forward(&Var::new(shard(&x, rank, 2)?))?, &shard(&y, rank, 2)?)?.backward()?;
                Ok(())
            };
            let outer = ddp.no_sync();
            let inner = ddp.no_sync();
            micro(0)?;
            if order == "in order" {
                drop(inner);
                micro(1)?; // still inside `outer`: local
                drop(outer);
            } else {
                drop(outer);
                micro(1)?; // still inside `inner`: local
                drop(inner);
            }
            micro(2)?; // every guard gone: synchronised
            opt.step()?;
            values(&ddp.module().parameters())
        })?;
        for got in &ranks {
            assert_close(got, want.last().unwrap(), 1e-5, order);
        }
    }
    Ok(())
}

fn bn_model(dev: Device, init: &[Vec<f32>]) -> Result<Sequential> {
    let m = model(dev, init)?;
    Ok(Sequential::new().push(brasa_nn::BatchNorm1d::new(INPUTS, dev)?).push(m))
}

fn buffers(module: &impl ModuleExt) -> Result<Vec<Vec<f32>>> {
    module.named_buffers().iter().map(|(_, b)| Ok(b.to_dtype(brasa_tensor::DType::F32)?.to_vec::<f32>()?)).collect()
}

#[test]
fn after_join_every_rank_holds_the_same_parameters_and_buffers() -> Result<()> {
    setup();
    let init = initial()?;
    for world in [2, 3] {
        // Rank 0 runs out first, so the buffers it last saw are stale.
        let batches = |rank: usize| 2 + 2 * rank;
        let ranks = run_in_process(world, &options(), |comm| {
            let dev = comm.device();
            let rank = comm.rank();
            let ddp = DistributedDataParallel::new(bn_model(dev, &init)?, comm.clone(), DdpConfig::default())?;
            let mut opt = optimizer(Opt::SgdMomentum, ddp.module().parameters())?;
            let mine = ddp.join(|| {
                for step in 0..batches(rank) {
                    let (x, y) = batch(step, dev)?;
                    cross_entropy(&ddp.forward(&Var::new(shard(&x, rank, world)?))?, &shard(&y, rank, world)?)?
                        .backward()?;
                    opt.step()?;
                    opt.zero_grad()?;
                }
                Ok((values(&ddp.module().parameters())?, buffers(ddp.module())?))
            })?;
            Ok((mine, values(&ddp.module().parameters())?, buffers(ddp.module())?))
        })?;
        let last = &ranks[world - 1];
        for (rank, (_, params, bufs)) in ranks.iter().enumerate() {
            // The rank that trained last holds the final model.
            assert_eq!(params, &last.0 .0, "world {world}: rank {rank}'s parameters after join");
            assert_eq!(bufs, &last.0 .1, "world {world}: rank {rank}'s buffers after join");
        }
    }
    Ok(())
}

/// Linear, checkpointed Linear (recomputed in backward), Linear.
#[derive(brasa_nn::Parameters)]
struct Checkpointed {
    first: Linear,
    middle: Linear,
    last: Linear,
}

impl Checkpointed {
    fn new(dev: Device, init: &[Vec<f32>]) -> Result<Checkpointed> {
        let m = Checkpointed {
            first: Linear::new(INPUTS, 16, dev)?,
            middle: Linear::new(16, 16, dev)?,
            last: Linear::new(16, CLASSES, dev)?,
        };
        for (p, values) in m.parameters().iter().zip(init) {
            p.tensor().copy_(&Tensor::from_slice_on(values, p.dims().to_vec(), dev)?)?;
        }
        Ok(m)
    }
}

impl Module for Checkpointed {
    fn forward(&self, x: &Var) -> brasa_nn::Result<Var> {
        let h = self.first.forward(x)?.relu()?;
        let middle = self.middle.clone();
        let h = brasa_autograd::checkpoint(
            move |xs| {
                let out = middle.forward(&xs[0]).map_err(|e| match e {
                    brasa_nn::NnError::Autograd(e) => e,
                    other => panic!("{other}"),
                })?;
                out.relu()
            },
            &[&h],
        )?;
        self.last.forward(&h)
    }
}

#[test]
fn ddp_with_activation_checkpointing_matches_one_process() -> Result<()> {
    setup();
    let init = initial()?;
    let dev = Device::cpu(0);
    let reference = Checkpointed::new(dev, &init)?;
    let mut opt = optimizer(Opt::SgdMomentum, reference.parameters())?;
    let mut want = Vec::new();
    for step in 0..3 {
        let (x, y) = batch(step, dev)?;
        cross_entropy(&reference.forward(&Var::new(x))?, &y)?.backward()?;
        opt.step()?;
        opt.zero_grad()?;
        want.push(values(&reference.parameters())?);
    }
    for find_unused in [false, true] {
        for world in [2, 4] {
            let config = DdpConfig { find_unused_parameters: find_unused, ..DdpConfig::default() };
            let ranks = run_in_process(world, &options(), |comm| {
                let dev = comm.device();
                let rank = comm.rank();
                let ddp = DistributedDataParallel::new(Checkpointed::new(dev, &init)?, comm.clone(), config.clone())?;
                let mut opt = optimizer(Opt::SgdMomentum, ddp.module().parameters())?;
                let mut trajectory = Vec::new();
                for step in 0..3 {
                    let (x, y) = batch(step, dev)?;
                    let out = ddp.forward(&Var::new(shard(&x, rank, world)?))?;
                    cross_entropy(&out, &shard(&y, rank, world)?)?.backward()?;
                    opt.step()?;
                    opt.zero_grad()?;
                    trajectory.push(values(&ddp.module().parameters())?);
                }
                Ok(trajectory)
            })?;
            for trajectory in &ranks {
                for (step, (got, want)) in trajectory.iter().zip(&want).enumerate() {
                    let what = format!("find_unused={find_unused} world {world} step {step}");
                    assert_close(got, want, 1e-5, &what);
                }
            }
        }
    }
    Ok(())
}
