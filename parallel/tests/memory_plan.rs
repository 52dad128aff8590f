//! Plans of distributed steps equal the runs they predict, rank by rank and
//! to the byte: DDP, DDP with ZeRO-1 and ZeRO-2, and FSDP over two logical host
//! devices, each rank planned on a meta device imitating its own device,
//! then run there. A pipeline's stages, whose hand-offs depend on thread
//! timing, are exact up to the messages in flight.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_alloc::AllocatorConfig;
use brasa_autograd::Var;
use brasa_nn::functional::cross_entropy;
use brasa_nn::optim::{Adam, AdamConfig, Optimizer};
use brasa_nn::optim::{Sgd, SgdConfig};
use brasa_nn::{Linear, ModuleExt, Relu, Sequential};
use brasa_parallel::pipeline::{Partition, Pipeline, PipelineConfig, Schedule};
use brasa_parallel::{
    plan_in_process, run_on_devices, CommOptions, Communicator, DdpConfig, DistributedDataParallel, FsdpConfig,
    FullyShardedDataParallel, LaunchOptions, Result, ZeroOptimizer, ZeroStage,
};
use brasa_tensor::memory::{self, category_scope, MemoryCategory, PLANNED_STEPS};
use brasa_tensor::{DType, Device, MemoryTarget, Tensor};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const HOST_DEVICES: usize = 48;
static NEXT_DEVICE: AtomicUsize = AtomicUsize::new(1);

fn options() -> LaunchOptions {
    LaunchOptions { comm: CommOptions::default().timeout(Duration::from_secs(30)), threads_per_rank: Some(1) }
}

/// Two fresh logical host devices with `config`.
fn fresh_pair(expandable: bool) -> [Device; 2] {
    brasa_tensor::set_host_device_count(HOST_DEVICES).unwrap();
    [0, 1].map(|_| {
        let index = NEXT_DEVICE.fetch_add(1, Ordering::Relaxed);
        assert!(index < HOST_DEVICES, "raise HOST_DEVICES");
        let config = AllocatorConfig::builder().expandable_segments(expandable).build().unwrap();
        brasa_tensor::set_host_allocator_config(index, Some(config)).unwrap();
        Device::cpu(index)
    })
}

type Step = Box<dyn FnMut() -> Result<()>>;

/// A rank's DDP model, its optimizer (ZeRO-sharded or not) and its batch.
fn rank_setup(comm: Communicator, zero: Option<ZeroStage>, batch: usize) -> Result<Step> {
    let device = comm.device();
    let model = Sequential::new()
        .push(Linear::new(128, 512, device)?)
        .push(Relu)
        .push(Linear::new(512, 512, device)?)
        .push(Relu)
        .push(Linear::new(512, 10, device)?);
    let config = DdpConfig { zero, bucket_cap_bytes: 256 << 10, ..DdpConfig::default() };
    let ddp = DistributedDataParallel::new(model, comm, config)?;
    let adam = AdamConfig { lr: 0.01, ..Default::default() };
    let opt: Box<dyn Optimizer> = match zero {
        None => Box::new(Adam::new(ddp.module().parameters(), adam)?),
        Some(_) => Box::new(ZeroOptimizer::new(&ddp, |shards| Adam::new(shards, adam))?),
    };
    training_step(device, batch, move |x| ddp.forward(x), opt)
}

/// A rank's FSDP model (each linear layer a unit), Adam over its shards,
/// and its batch.
fn fsdp_setup(comm: Communicator, batch: usize) -> Result<Step> {
    let device = comm.device();
    let model = Sequential::new()
        .push(Linear::new(128, 512, device)?)
        .push(Relu)
        .push(Linear::new(512, 512, device)?)
        .push(Relu)
        .push(Linear::new(512, 512, device)?)
        .push(Relu)
        .push(Linear::new(512, 10, device)?);
    let fsdp = FullyShardedDataParallel::new(model, comm, FsdpConfig::default())?;
    let opt = Box::new(Adam::new(fsdp.parameters(), AdamConfig { lr: 0.01, ..Default::default() })?);
    training_step(device, batch, move |x| fsdp.forward(x), opt)
}

/// One training step on a batch of `batch` rows of 128 features made here
/// (counted as input), through `forward` and `opt`.
fn training_step(
    device: Device,
    batch: usize,
    forward: impl Fn(&Var) -> Result<Var> + 'static,
    mut opt: Box<dyn Optimizer>,
) -> Result<Step> {
    let (x, y) = {
        let _input = category_scope(MemoryCategory::Input);
        (Tensor::randn_on([batch, 128], DType::F32, device)?, Tensor::zeros_on([batch], DType::I64, device)?)
    };
    Ok(Box::new(move || {
        cross_entropy(&forward(&Var::new(x.clone()))?, &y)?.backward()?;
        opt.step()?;
        opt.zero_grad()?;
        Ok(())
    }))
}

fn plans_equal_runs(zero: Option<ZeroStage>) {
    plans_equal_runs_of(&format!("{zero:?}"), |comm, batch| rank_setup(comm, zero, batch));
}

fn plans_equal_runs_of(what: &str, setup: impl Fn(Communicator, usize) -> Result<Step> + Sync) {
    for batch in [16, 256] {
        for expandable in [false, true] {
            let devices = fresh_pair(expandable);
            let targets = devices.map(|d| MemoryTarget::like(d).unwrap());
            let plans = plan_in_process(&targets, &options(), |comm| setup(comm, batch)).unwrap();
            run_on_devices(&devices, &options(), |comm| {
                let mut step = setup(comm, batch)?;
                for _ in 0..PLANNED_STEPS {
                    step()?;
                }
                Ok(())
            })
            .unwrap();
            for (rank, (plan, device)) in plans.iter().zip(devices).enumerate() {
                let label = format!("{what}, batch {batch}, expandable {expandable}, rank {rank}");
                assert_eq!(plan.peak_allocated, memory::max_allocated(device).unwrap(), "{label}\n{plan}");
                assert_eq!(plan.peak_reserved, memory::max_reserved(device).unwrap(), "{label}\n{plan}");
            }
        }
    }
}

#[test]
fn ddp_plans_equal_runs() {
    plans_equal_runs(None);
}

#[test]
fn zero1_plans_equal_runs() {
    plans_equal_runs(Some(ZeroStage::One));
}

#[test]
fn zero2_plans_equal_runs() {
    plans_equal_runs(Some(ZeroStage::Two));
}

#[test]
fn fsdp_plans_equal_runs() {
    plans_equal_runs_of("FSDP", fsdp_setup);
}

/// A collective's job holds handles on its tensors; they must be gone
/// when the caller's wait returns, or a tensor the caller drops next is
/// freed whenever the communication thread is next scheduled, and the
/// run's peaks depend on thread timing (a DDP plan once missed its run by
/// the 512-byte block of the bucket order broadcast).
#[test]
fn a_collective_keeps_no_handle_after_its_wait() {
    let devices = fresh_pair(false);
    run_on_devices(&devices, &options(), |comm| {
        let device = comm.device();
        let before = memory::allocated(device)?;
        for round in 0..200 {
            let order = Tensor::zeros_on([6], DType::F32, device)?;
            if round % 2 == 0 {
                comm.broadcast(&order, 0)?;
            } else {
                comm.all_reduce_async(&order, brasa_parallel::ReduceOp::Sum).wait()?;
            }
            drop(order);
            assert_eq!(memory::allocated(device)?, before, "round {round}: the collective still holds the tensor");
        }
        Ok(())
    })
    .unwrap();
}

#[test]
fn a_rank_that_does_not_fit_is_named() {
    let small = [MemoryTarget::cuda(64 << 30), MemoryTarget::cuda(1 << 20)];
    let error = plan_in_process(&small, &options(), |comm| rank_setup(comm, None, 64)).unwrap_err();
    assert!(
        matches!(&error, brasa_parallel::ParallelError::Invalid { op: "plan_in_process", message }
            if message.contains("rank 1 does not fit")),
        "{error:?}"
    );
}

/// A 2-stage pipeline (the model on the first device, its second half
/// moved to the second) and SGD with momentum.
fn pipeline_setup(devices: &[Device], schedule: Schedule, batch: usize) -> Result<Step> {
    let first = devices[0];
    let model = Sequential::new()
        .push(Linear::new(128, 512, first)?)
        .push(Relu)
        .push(Linear::new(512, 512, first)?)
        .push(Relu)
        .push(Linear::new(512, 10, first)?);
    let mut config = PipelineConfig::new(Partition::Boundaries(vec![2]), 4).schedule(schedule).threads_per_stage(1);
    config.devices = Some(devices.to_vec());
    let mut pipe = Pipeline::new(model, cross_entropy, config)?;
    let mut opt = Sgd::new(pipe.parameters(), SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() })?;
    let (x, y) = {
        let _input = category_scope(MemoryCategory::Input);
        (Tensor::randn_on([batch, 128], DType::F32, first)?, Tensor::zeros_on([batch], DType::I64, first)?)
    };
    Ok(Box::new(move || {
        pipe.step(&x, &y)?;
        opt.step()?;
        opt.zero_grad()?;
        Ok(())
    }))
}

#[test]
fn pipeline_plans_equal_runs() {
    for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
        let devices = fresh_pair(false);
        let targets = devices.map(|d| MemoryTarget::like(d).unwrap());
        let plans = memory::plan_devices(&targets, PLANNED_STEPS, |metas| pipeline_setup(metas, schedule, 64)).unwrap();
        {
            let mut step = pipeline_setup(&devices, schedule, 64).unwrap();
            for _ in 0..PLANNED_STEPS {
                step().unwrap();
            }
        }
        // Stage threads hand each other activations and gradients through
        // queues: when the receiver picks one up (and the sender's copy is
        // freed) depends on timing, in a real run as in a plan. So each
        // device's peak is exact up to the messages in flight: at most two
        // [16, 512] f32 tensors here.
        let message = 16 * 512 * 4;
        for (stage, (plan, device)) in plans.iter().zip(devices).enumerate() {
            let label = format!("{schedule:?}, stage {stage}");
            let (allocated, reserved) = (memory::max_allocated(device).unwrap(), memory::max_reserved(device).unwrap());
            assert!(plan.peak_allocated.abs_diff(allocated) <= 2 * message, "{label}: {allocated}\n{plan}");
            assert!(plan.peak_reserved.abs_diff(reserved) <= 2 << 20, "{label}: {reserved}\n{plan}");
        }
    }
}
