//! The CUDA cases `cuda_parallel.rs` (in-process engine, tensors staged
//! through host memory) and `nccl.rs` (NCCL) share: every collective on
//! `cuda:N` tensors with results known in closed form, and DDP and FSDP
//! step for step against one process on the host.
// Each test file uses the part it needs.
#![allow(dead_code)]

use brasa_autograd::Var;
use brasa_nn::functional::cross_entropy;
use brasa_nn::optim::{Optimizer, Sgd, SgdConfig};
use brasa_nn::{Linear, Module, ModuleExt, Relu, Sequential};
use brasa_parallel::{
    run_on_devices, DdpConfig, DistributedDataParallel, FsdpConfig, FullyShardedDataParallel, LaunchOptions, ReduceOp,
    Result,
};
use brasa_tensor::{cuda_device_count, DType, Device, Tensor};

/// The first CUDA device, or `None` after printing one line.
pub fn first_gpu() -> Option<Device> {
    if cuda_device_count() == 0 {
        println!("skipped: no CUDA device");
        return None;
    }
    Some(Device::cuda(0))
}

/// What each rank saw, in a form two engines' runs can be compared in.
#[derive(Debug, PartialEq)]
pub struct CollectiveResults {
    pub sums: Vec<f32>,
    pub averages: Vec<f32>,
    pub maxima: Vec<f32>,
    pub minima: Vec<f32>,
    pub bf16_sums: Vec<f32>,
    pub gathered: Vec<f32>,
    pub gathered_i64: Vec<i64>,
    pub scattered: Vec<f32>,
    pub broadcast: Vec<f32>,
    pub received: Vec<f32>,
}

/// Every collective on the ranks' devices, each result checked against its
/// closed form; returns what each rank saw.
pub fn collectives_match(devices: &[Device], options: &LaunchOptions) -> Result<Vec<CollectiveResults>> {
    let world = devices.len();
    let results = run_on_devices(devices, options, |comm| {
        let dev = comm.device();
        let (rank, n) = (comm.rank(), comm.world_size());
        let r = rank as f32;
        let reduced = |op: ReduceOp, dtype: DType| -> Result<Vec<f32>> {
            let x = Tensor::from_vec_on(vec![r + 1.0; 5], [5], dev)?.to_dtype(dtype)?;
            comm.all_reduce(&x, op)?;
            assert_eq!(x.device(), dev);
            Ok(x.to_dtype(DType::F32)?.to_vec::<f32>()?)
        };
        let sums = reduced(ReduceOp::Sum, DType::F32)?;
        let averages = reduced(ReduceOp::Avg, DType::F32)?;
        let maxima = reduced(ReduceOp::Max, DType::F32)?;
        let minima = reduced(ReduceOp::Min, DType::F32)?;
        let bf16_sums = reduced(ReduceOp::Sum, DType::BF16)?;
        let gathered = Tensor::zeros_on([2 * n], DType::F32, dev)?;
        comm.all_gather(&gathered, &Tensor::from_vec_on(vec![r, r + 10.0], [2], dev)?)?;
        let gathered_i64 = Tensor::zeros_on([n], DType::I64, dev)?;
        comm.all_gather(&gathered_i64, &Tensor::from_vec_on(vec![rank as i64 * 1_000_000_007], [1], dev)?)?;
        let scattered = Tensor::zeros_on([2], DType::F32, dev)?;
        let input: Vec<f32> = (0..2 * n).map(|i| i as f32 + 1.0).collect();
        comm.reduce_scatter(&scattered, &Tensor::from_vec_on(input, [2 * n], dev)?, ReduceOp::Avg)?;
        let root = n - 1;
        let broadcast = Tensor::from_vec_on(vec![r * 7.0 + 1.0; 3], [3], dev)?;
        comm.broadcast(&broadcast, root)?;
        // A ring of sends: even ranks send first, odd ranks receive first.
        let received = Tensor::zeros_on([4], DType::F32, dev)?;
        if n > 1 {
            let (next, previous) = ((rank + 1) % n, (rank + n - 1) % n);
            let mine = Tensor::from_vec_on(vec![r + 0.5; 4], [4], dev)?;
            if rank % 2 == 0 {
                comm.send(&mine, next)?;
                comm.recv(&received, previous)?;
            } else {
                comm.recv(&received, previous)?;
                comm.send(&mine, next)?;
            }
        }
        comm.barrier()?;
        Ok(CollectiveResults {
            sums,
            averages,
            maxima,
            minima,
            bf16_sums,
            gathered: gathered.to_vec::<f32>()?,
            gathered_i64: gathered_i64.to_vec::<i64>()?,
            scattered: scattered.to_vec::<f32>()?,
            broadcast: broadcast.to_vec::<f32>()?,
            received: received.to_vec::<f32>()?,
        })
    })?;
    let w = world as f32;
    for (rank, got) in results.iter().enumerate() {
        assert_eq!(got.sums, vec![w * (w + 1.0) / 2.0; 5], "rank {rank}: sum");
        assert_eq!(got.averages, vec![(w + 1.0) / 2.0; 5], "rank {rank}: avg");
        assert_eq!(got.maxima, vec![w; 5], "rank {rank}: max");
        assert_eq!(got.minima, vec![1.0; 5], "rank {rank}: min");
        assert_eq!(got.bf16_sums, vec![w * (w + 1.0) / 2.0; 5], "rank {rank}: bf16 sum");
        let gathered: Vec<f32> = (0..world).flat_map(|q| [q as f32, q as f32 + 10.0]).collect();
        assert_eq!(got.gathered, gathered, "rank {rank}: all_gather");
        let gathered_i64: Vec<i64> = (0..world as i64).map(|q| q * 1_000_000_007).collect();
        assert_eq!(got.gathered_i64, gathered_i64, "rank {rank}: all_gather i64");
        // Every rank passed 1..=2w: the average is the input itself.
        assert_eq!(got.scattered, [2.0 * rank as f32 + 1.0, 2.0 * rank as f32 + 2.0], "rank {rank}: reduce_scatter");
        assert_eq!(got.broadcast, vec![(w - 1.0) * 7.0 + 1.0; 3], "rank {rank}: broadcast");
        let previous = if world > 1 { ((rank + world - 1) % world) as f32 + 0.5 } else { 0.0 };
        assert_eq!(got.received, vec![previous; 4], "rank {rank}: send/recv");
    }
    Ok(results)
}

fn model(dev: Device) -> Result<Sequential> {
    let model = Sequential::new().push(Linear::new(6, 16, dev)?).push(Relu).push(Linear::new(16, 3, dev)?);
    for (k, p) in model.parameters().iter().enumerate() {
        let v: Vec<f32> = (0..p.numel()).map(|i| (((i * 31 + k * 17) % 41) as f32 - 20.0) / 80.0).collect();
        p.tensor().copy_(&Tensor::from_vec_on(v, p.dims().to_vec(), dev)?)?;
    }
    Ok(model)
}

fn batch(step: usize, rows: std::ops::Range<usize>, dev: Device) -> Result<(Var, Tensor)> {
    let x: Vec<f32> = (0..16 * 6).map(|i| (((i * 37 + step * 11) % 29) as f32 - 14.0) / 7.0).collect();
    let y: Vec<i64> = (0..16).map(|i| ((i * 5 + step) % 3) as i64).collect();
    let (x, y) = (Tensor::from_vec_on(x, [16, 6], dev)?, Tensor::from_vec_on(y, [16], dev)?);
    let n = rows.len();
    Ok((Var::new(x.narrow(0, rows.start, n)?.contiguous()?), y.narrow(0, rows.start, n)?.contiguous()?))
}

fn sgd(params: Vec<Var>) -> Result<Sgd> {
    Ok(Sgd::new(params, SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() })?)
}

/// Three SGD steps of DDP and of FSDP over `devices` (16 rows split among
/// the ranks) equal three steps of one process on the host.
pub fn ddp_and_fsdp_match_one_process(devices: &[Device], options: &LaunchOptions) -> Result<()> {
    let reference = model(Device::CPU)?;
    let mut opt = sgd(reference.parameters())?;
    for step in 0..3 {
        let (x, y) = batch(step, 0..16, Device::CPU)?;
        cross_entropy(&reference.forward(&x)?, &y)?.backward()?;
        opt.step()?;
        opt.zero_grad()?;
    }
    let want: Vec<f32> = reference.parameters().iter().flat_map(|p| p.tensor().to_vec::<f32>().unwrap()).collect();
    let rows = 16 / devices.len();
    let got = run_on_devices(devices, options, |comm| {
        let dev = comm.device();
        let rows = comm.rank() * rows..(comm.rank() + 1) * rows;
        let ddp = DistributedDataParallel::new(model(dev)?, comm.clone(), DdpConfig::default())?;
        let mut ddp_opt = sgd(ddp.module().parameters())?;
        let fsdp = FullyShardedDataParallel::new(model(dev)?, comm.clone(), FsdpConfig::default())?;
        let mut fsdp_opt = sgd(fsdp.parameters())?;
        for step in 0..3 {
            let (x, y) = batch(step, rows.clone(), dev)?;
            cross_entropy(&ddp.forward(&x)?, &y)?.backward()?;
            ddp_opt.step()?;
            ddp_opt.zero_grad()?;
            cross_entropy(&fsdp.forward(&x)?, &y)?.backward()?;
            fsdp_opt.step()?;
            fsdp_opt.zero_grad()?;
        }
        let ddp_values: Vec<f32> =
            ddp.module().parameters().iter().flat_map(|p| p.tensor().to_vec::<f32>().unwrap()).collect();
        let full = fsdp.full_state_dict()?;
        let fsdp_values: Option<Vec<f32>> = full.map(|d| {
            ["0.weight", "0.bias", "2.weight", "2.bias"]
                .iter()
                .flat_map(|n| d.get(n).unwrap().to_vec::<f32>().unwrap())
                .collect()
        });
        Ok((ddp_values, fsdp_values))
    })?;
    for (what, values) in [("ddp", &got[0].0), ("fsdp", got[0].1.as_ref().unwrap())] {
        assert_eq!(values.len(), want.len(), "{what}");
        for (g, w) in values.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{what}: {g} vs {w}");
        }
    }
    Ok(())
}
