//! `AutoMicroBatch` among DDP ranks: an out of memory on one rank only
//! makes every rank retry with the same split, nobody hangs, and the
//! parameters equal one process's unsplit steps on the whole batch (plain
//! DDP and ZeRO-2); a rank that fails for another reason ends every rank's
//! step in an `Err`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::{no_grad, Var};
use brasa_nn::functional::cross_entropy;
use brasa_nn::optim::{AdamConfig, AdamW, AutoMicroBatch, Optimizer, SplitReport};
use brasa_nn::{Linear, Module, ModuleExt, NnError, Relu, Sequential};
use brasa_parallel::{
    run_on_devices, CommOptions, Communicator, DdpConfig, DistributedDataParallel, LaunchOptions, ZeroOptimizer,
    ZeroStage,
};
use brasa_tensor::{memory, DType, Device, Tensor};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const HOST_DEVICES: usize = 32;
static NEXT_DEVICE: AtomicUsize = AtomicUsize::new(1);
const FEATURES: usize = 64;
const HIDDEN: usize = 64;
const LAYERS: usize = 16;
const CLASSES: usize = 10;
/// Rows per rank; activations stay in the allocator's small pool.
const ROWS: usize = 1000;
const STEPS: usize = 2;

fn options() -> LaunchOptions {
    LaunchOptions { comm: CommOptions::default().timeout(Duration::from_secs(30)), threads_per_rank: Some(1) }
}

fn fresh_device(limit: Option<usize>) -> Device {
    brasa_tensor::set_host_device_count(HOST_DEVICES).unwrap();
    let index = NEXT_DEVICE.fetch_add(1, Ordering::Relaxed);
    assert!(index < HOST_DEVICES, "raise HOST_DEVICES");
    let config = brasa_alloc::AllocatorConfig::builder().expandable_segments(true).build().unwrap();
    brasa_tensor::set_host_allocator_config(index, Some(config)).unwrap();
    brasa_tensor::set_host_memory_limit(index, limit).unwrap();
    Device::cpu(index)
}

/// The same f64 MLP everywhere (weights from a formula).
fn mlp(device: Device) -> Sequential {
    let mut model = Sequential::new().push(Linear::new(FEATURES, HIDDEN, device).unwrap()).push(Relu);
    for _ in 1..LAYERS {
        model = model.push(Linear::new(HIDDEN, HIDDEN, device).unwrap()).push(Relu);
    }
    let mut model = model.push(Linear::new(HIDDEN, CLASSES, device).unwrap());
    model.to_dtype(DType::F64).unwrap();
    let _no_grad = no_grad();
    for (p, param) in model.parameters().iter().enumerate() {
        let shape = param.shape().dims().to_vec();
        let fan_in = *shape.last().unwrap() as f64;
        let values: Vec<f64> =
            (0..param.numel()).map(|i| ((i * 7 + p * 13) as f64 * 0.37).sin() / fan_in.sqrt()).collect();
        param.tensor().copy_(&Tensor::from_vec_on(values, shape, device).unwrap()).unwrap();
    }
    model
}

/// Rows `range` of the whole batch (every rank's rows), on `device`.
fn data(device: Device, range: Range<usize>) -> (Tensor, Tensor) {
    let x: Vec<f64> = range
        .clone()
        .flat_map(|r| (0..FEATURES).map(move |c| ((r * FEATURES + c) * 31) as f64 * 0.013))
        .map(f64::sin)
        .collect();
    let y: Vec<i64> = range.clone().map(|r| (r % CLASSES) as i64).collect();
    (
        Tensor::from_vec_on(x, [range.len(), FEATURES], device).unwrap(),
        Tensor::from_vec_on(y, [range.len()], device).unwrap(),
    )
}

fn values(params: &[Var]) -> Vec<Vec<f64>> {
    params.iter().map(|p| p.tensor().to_vec::<f64>().unwrap()).collect()
}

fn max_difference(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    a.iter().flatten().zip(b.iter().flatten()).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

/// One process, the whole batch (both ranks' rows), unsplit.
fn single_process() -> Vec<Vec<f64>> {
    let device = fresh_device(None);
    let model = mlp(device);
    let (x, y) = data(device, 0..2 * ROWS);
    let mut opt = AdamW::new(model.parameters(), AdamConfig { lr: 1e-3, ..Default::default() }).unwrap();
    for _ in 0..STEPS {
        cross_entropy(&model.forward(&Var::new(x.clone())).unwrap(), &y).unwrap().backward().unwrap();
        opt.step().unwrap();
        opt.zero_grad().unwrap();
    }
    values(&model.parameters())
}

struct RankRun {
    params: Vec<Vec<f64>>,
    reports: Vec<SplitReport>,
    peak: usize,
}

/// A rank's steps under `AutoMicroBatch` starting from `micro_batches`;
/// `fail_at`: the step at which rank 1's closure returns a non-memory error.
fn rank_main(
    comm: Communicator,
    zero: Option<ZeroStage>,
    micro_batches: usize,
    fail_at: Option<usize>,
) -> brasa_parallel::Result<std::result::Result<RankRun, NnError>> {
    let device = comm.device();
    let rank = comm.rank();
    let config = DdpConfig { zero, bucket_cap_bytes: 64 << 10, ..DdpConfig::default() };
    let ddp = DistributedDataParallel::new(mlp(device), comm, config)?;
    let adam = AdamConfig { lr: 1e-3, ..Default::default() };
    let mut opt: Box<dyn Optimizer> = match zero {
        None => Box::new(AdamW::new(ddp.module().parameters(), adam)?),
        Some(_) => Box::new(ZeroOptimizer::new(&ddp, |shards| AdamW::new(shards, adam))?),
    };
    let (x, y) = data(device, rank * ROWS..(rank + 1) * ROWS);
    let config = brasa_nn::optim::AutoMicroBatchConfig { initial_micro_batches: micro_batches, ..Default::default() };
    let mut auto = AutoMicroBatch::with_config(config)?;
    let mut reports = Vec::new();
    for step in 0..STEPS {
        let outcome = auto.step_with_peers(ROWS, opt.as_mut(), &ddp, |rows| {
            if fail_at == Some(step) && rank == 1 {
                return Err(brasa_parallel::ParallelError::from(NnError::invalid(
                    "test",
                    "rank 1 fails for a reason of its own",
                )));
            }
            let len = rows.len();
            let logits = ddp.forward(&Var::new(x.narrow(0, rows.start, len)?))?;
            Ok::<_, brasa_parallel::ParallelError>(cross_entropy(&logits, &y.narrow(0, rows.start, len)?)?)
        });
        match outcome {
            Ok(report) => reports.push(report),
            Err(error) => return Ok(Err(error)),
        }
    }
    let params = values(&ddp.module().parameters());
    Ok(Ok(RankRun { params, reports, peak: memory::max_allocated(device)? }))
}

fn ddp_runs(devices: &[Device], zero: Option<ZeroStage>, micro_batches: usize) -> Vec<RankRun> {
    run_on_devices(devices, &options(), |comm| rank_main(comm, zero, micro_batches, None))
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap())
        .collect()
}

fn an_out_of_memory_on_one_rank_makes_every_rank_split(zero: Option<ZeroStage>) {
    let reference = single_process();
    // Peaks of rank 0 with the whole batch and with halves, on unlimited devices.
    let whole = ddp_runs(&[fresh_device(None), fresh_device(None)], zero, 1);
    let halves = ddp_runs(&[fresh_device(None), fresh_device(None)], zero, 2);
    assert!(max_difference(&whole[0].params, &reference) <= 1e-12, "DDP differs from one process");
    assert!(halves[0].peak < whole[0].peak);
    let limit = whole[0].peak - (whole[0].peak - halves[0].peak) / 4;
    // Only rank 0 is limited: only it runs out of memory.
    let runs = ddp_runs(&[fresh_device(Some(limit)), fresh_device(None)], zero, 1);
    for (rank, run) in runs.iter().enumerate() {
        let first = &run.reports[0];
        assert_eq!(first.retries.len(), 1, "rank {rank}: {first}");
        assert_eq!(first.retries[0].out_of_memory.is_some(), rank == 0, "rank {rank}: {first}");
        assert!(run.reports.iter().all(|r| r.micro_batches == 2), "rank {rank}");
        assert!(run.reports[1..].iter().all(|r| r.retries.is_empty()), "rank {rank}: the split is kept");
        let difference = max_difference(&run.params, &reference);
        assert!(difference <= 1e-12, "rank {rank}: {difference} from one process's unsplit steps");
    }
    assert!(runs[1].reports[0].to_string().contains("another rank ran out of memory"), "{}", runs[1].reports[0]);
}

#[test]
fn ddp_ranks_split_together() {
    an_out_of_memory_on_one_rank_makes_every_rank_split(None);
}

#[test]
fn zero2_ranks_split_together() {
    an_out_of_memory_on_one_rank_makes_every_rank_split(Some(ZeroStage::Two));
}

#[test]
fn a_rank_that_fails_otherwise_ends_every_rank_in_an_err() {
    // Failing in the first step: rank 0 hears of it through the agreement.
    // Failing in the second: rank 0 is inside the bucket rebuild's
    // broadcast, rank 1 in the agreement; the collectives' signatures
    // differ and both ranks end in an error instead of waiting.
    for (fail_at, clean) in [(0, true), (1, false)] {
        let devices = [fresh_device(None), fresh_device(None)];
        let outcomes = run_on_devices(&devices, &options(), |comm| {
            let outcome = rank_main(comm, None, 2, Some(fail_at));
            Ok(match outcome {
                Ok(Ok(_)) => None,
                Ok(Err(error)) => Some(error),
                Err(error) => Some(NnError::from(error)),
            })
        })
        .unwrap();
        // Rank 1's step ends in the error its closure returned.
        let own = outcomes[1].as_ref().expect("rank 1 fails");
        assert!(matches!(own, NnError::Invalid { what: "test", .. }), "{own:?}");
        let peer = outcomes[0].as_ref().expect("rank 0 ends in an error too");
        if clean {
            // Rank 0 names the rank that failed and where.
            assert!(
                matches!(peer, NnError::MicroBatch { message, source: None }
                    if message.contains("rank 1 failed in micro-batch 0 of 2")),
                "{peer:?}"
            );
        }
    }
}
