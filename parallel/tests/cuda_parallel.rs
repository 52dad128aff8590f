//! Collectives, DDP and FSDP on CUDA tensors: two in-process ranks sharing
//! `cuda:0` (their tensors staged through page-locked host memory), equal
//! to one process. Skipped, with one line, without a CUDA device.
//!
//! Run: `cargo test -p brasa-parallel --features cuda --test cuda_parallel`.
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::Var;
use brasa_nn::functional::cross_entropy;
use brasa_nn::optim::{Optimizer, Sgd, SgdConfig};
use brasa_nn::{Linear, Module, ModuleExt, Relu, Sequential};
use brasa_parallel::{
    run_on_devices, DdpConfig, DistributedDataParallel, FsdpConfig, FullyShardedDataParallel, LaunchOptions, ReduceOp,
    Result,
};
use brasa_tensor::{cuda_device_count, DType, Device, Tensor};

fn gpus() -> Option<[Device; 2]> {
    if cuda_device_count() == 0 {
        println!("skipped: no CUDA device");
        return None;
    }
    Some([Device::Cuda(0), Device::Cuda(0)])
}

#[test]
fn collectives_on_cuda_tensors_are_correct() -> Result<()> {
    let Some(devices) = gpus() else { return Ok(()) };
    let results = run_on_devices(&devices, &LaunchOptions::default(), |comm| {
        let dev = comm.device();
        let r = comm.rank() as f32;
        let x = Tensor::from_vec_on(vec![r + 1.0; 5], [5], dev)?;
        comm.all_reduce(&x, ReduceOp::Sum)?;
        let gathered = Tensor::zeros_on([4], DType::F32, dev)?;
        comm.all_gather(&gathered, &Tensor::from_vec_on(vec![r, r + 10.0], [2], dev)?)?;
        let scattered = Tensor::zeros_on([2], DType::F32, dev)?;
        comm.reduce_scatter(&scattered, &Tensor::from_vec_on(vec![1.0f32, 2.0, 3.0, 4.0], [4], dev)?, ReduceOp::Avg)?;
        assert_eq!(x.device(), dev);
        Ok((x.to_vec::<f32>()?, gathered.to_vec::<f32>()?, scattered.to_vec::<f32>()?))
    })?;
    assert_eq!(results[0].0, vec![3.0; 5]);
    assert_eq!(results[1].1, [0.0, 10.0, 1.0, 11.0]);
    assert_eq!(results[0].2, [1.0, 2.0]);
    assert_eq!(results[1].2, [3.0, 4.0]);
    Ok(())
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

#[test]
fn ddp_and_fsdp_on_one_gpu_match_one_process() -> Result<()> {
    let Some(devices) = gpus() else { return Ok(()) };
    let reference = model(Device::CPU)?;
    let mut opt = sgd(reference.parameters())?;
    for step in 0..3 {
        let (x, y) = batch(step, 0..16, Device::CPU)?;
        cross_entropy(&reference.forward(&x)?, &y)?.backward()?;
        opt.step()?;
        opt.zero_grad()?;
    }
    let want: Vec<f32> = reference.parameters().iter().flat_map(|p| p.tensor().to_vec::<f32>().unwrap()).collect();
    let got = run_on_devices(&devices, &LaunchOptions::default(), |comm| {
        let dev = comm.device();
        let rows = comm.rank() * 8..comm.rank() * 8 + 8;
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
        for (g, w) in values.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{what}: {g} vs {w}");
        }
    }
    Ok(())
}
