//! The NCCL engine. Without NCCL (CI): the error names every place
//! searched. With a GPU and NCCL: every collective equals the in-process
//! engine's results, DDP and FSDP equal one process, a rank that never
//! joins is a timeout, and two ranks on one GPU are refused clearly where
//! the NCCL loaded refuses them. The world is two ranks on `cuda:0` and
//! `cuda:1` with two GPUs, two ranks sharing `cuda:0` with NCCL 2.30 or
//! later and `NCCL_MULTI_RANK_GPU_ENABLE=1`, else one rank; each test
//! prints which it ran.
//!
//! Run: `cargo test -p brasa-parallel --features cuda --test nccl`.
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/cuda_case.rs"]
mod cuda_case;

use brasa_nn::functional::cross_entropy;
use brasa_nn::optim::{Sgd, SgdConfig};
use brasa_nn::{Linear, ModuleExt, Relu, Sequential};
use brasa_parallel::nccl::{nccl_communicator, nccl_from, nccl_group, nccl_library_path, nccl_version, NcclUniqueId};
use brasa_parallel::{
    in_process_group, CommBackend, CommOptions, DataParallel, DataParallelConfig, LaunchOptions, ParallelError,
    ReduceOp, Result,
};
use brasa_tensor::{cuda_device_count, Device, Tensor};
use cuda_case::{collectives_match, ddp_and_fsdp_match_one_process, first_gpu};
use std::time::{Duration, Instant};

/// The GPU and the NCCL version, or `None` after printing why not.
fn gpu_and_nccl() -> Option<(Device, (u32, u32, u32))> {
    let gpu = first_gpu()?;
    match nccl_version() {
        Ok(version) => {
            println!("NCCL {version:?} from {}", nccl_library_path().unwrap().display());
            Some((gpu, version))
        }
        Err(error) => {
            println!("skipped: no NCCL ({error})");
            None
        }
    }
}

/// The largest world this machine's GPUs and NCCL allow (see the file's doc).
fn world_devices(version: (u32, u32, u32)) -> Vec<Device> {
    let shared_gpu =
        (version.0, version.1) >= (2, 30) && std::env::var("NCCL_MULTI_RANK_GPU_ENABLE").is_ok_and(|v| v == "1");
    let devices = match cuda_device_count() {
        n if n >= 2 => vec![Device::cuda(0), Device::cuda(1)],
        _ if shared_gpu => vec![Device::cuda(0), Device::cuda(0)],
        _ => vec![Device::cuda(0)],
    };
    println!("world of {} on {devices:?}", devices.len());
    devices
}

fn nccl_options() -> LaunchOptions {
    LaunchOptions {
        comm: CommOptions::default().timeout(Duration::from_secs(60)).backend(CommBackend::Nccl),
        threads_per_rank: Some(1),
    }
}

#[test]
fn a_missing_library_is_an_error_naming_where_it_looked() {
    match nccl_version() {
        Ok(version) => println!("NCCL {version:?} is present; the missing-library error is not reachable here"),
        Err(error) => {
            let text = error.to_string();
            println!("as expected without NCCL: {text}");
            for expected in ["NCCL", "BRASA_NCCL_PATH", "libnccl.so.2"] {
                assert!(text.contains(expected), "the error should name {expected}: {text}");
            }
            // The group constructor reports the same, not a panic.
            let group = nccl_group(&[Device::cuda(0)], &CommOptions::default());
            assert!(group.is_err());
        }
    }
}

#[test]
fn nccl_refuses_host_devices_by_name() {
    let error = nccl_group(&[Device::CPU], &CommOptions::default()).unwrap_err();
    // Either NCCL is missing (named) or the device is refused (named).
    let text = error.to_string();
    assert!(text.contains("cpu") || text.contains("NCCL"), "{text}");
}

#[test]
fn every_collective_equals_the_in_process_engine() -> Result<()> {
    let Some((_, version)) = gpu_and_nccl() else { return Ok(()) };
    let devices = world_devices(version);
    let on_nccl = collectives_match(&devices, &nccl_options())?;
    let in_process = collectives_match(&devices, &LaunchOptions::default())?;
    assert_eq!(on_nccl, in_process);
    Ok(())
}

#[test]
fn ddp_and_fsdp_on_nccl_match_one_process() -> Result<()> {
    let Some((_, version)) = gpu_and_nccl() else { return Ok(()) };
    ddp_and_fsdp_match_one_process(&world_devices(version), &nccl_options())
}

#[test]
fn data_parallel_on_nccl_equals_the_in_process_engine() -> Result<()> {
    let Some((_, version)) = gpu_and_nccl() else { return Ok(()) };
    let devices = world_devices(version);
    let train = |backend: CommBackend| -> Result<Vec<f32>> {
        let config = DataParallelConfig { comm: CommOptions::default().backend(backend), ..Default::default() };
        let make_model = |dev: Device| -> brasa_nn::Result<Sequential> {
            let model = Sequential::new().push(Linear::new(6, 8, dev)?).push(Relu).push(Linear::new(8, 3, dev)?);
            for (k, p) in model.parameters().iter().enumerate() {
                let v: Vec<f32> = (0..p.numel()).map(|i| ((i * 13 + k * 5) % 17) as f32 / 17.0 - 0.5).collect();
                p.tensor().copy_(&Tensor::from_vec_on(v, p.dims().to_vec(), dev)?)?;
            }
            Ok(model)
        };
        let make_optimizer = |params| Sgd::new(params, SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() });
        let mut dp = DataParallel::with_config(&devices, make_model, make_optimizer, config)?;
        for step in 0..3 {
            let x: Vec<f32> = (0..12 * 6).map(|i| (((i * 7 + step * 3) % 11) as f32 - 5.0) / 5.0).collect();
            let y: Vec<i64> = (0..12).map(|i| ((i + step) % 3) as i64).collect();
            let (x, y) = (Tensor::from_vec_on(x, [12, 6], devices[0])?, Tensor::from_vec_on(y, [12], devices[0])?);
            dp.step(&x, &y, cross_entropy)?;
        }
        let mut values = Vec::new();
        for p in dp.module().parameters() {
            values.extend(p.tensor().to_vec::<f32>()?);
        }
        Ok(values)
    };
    let (on_nccl, in_process) = (train(CommBackend::Nccl)?, train(CommBackend::InProcess)?);
    assert_eq!(on_nccl.len(), in_process.len());
    for (a, b) in on_nccl.iter().zip(&in_process) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
    }
    Ok(())
}

#[test]
fn a_collective_waits_for_the_kernels_that_made_its_input() -> Result<()> {
    let Some((gpu, _)) = gpu_and_nccl() else { return Ok(()) };
    let mut comms = nccl_group(&[gpu], &CommOptions::default())?;
    let comm = comms.remove(0);
    // A chain of kernels on the compute stream, queued just before the
    // collective: without the ready event NCCL would read zeros or a
    // partial result.
    let mut x = Tensor::zeros_on([1 << 24], brasa_tensor::DType::F32, gpu)?;
    for _ in 0..20 {
        x = x.add_scalar(1.0)?;
    }
    comm.all_reduce(&x, ReduceOp::Max)?;
    let values = x.to_vec::<f32>()?;
    assert!(values.iter().all(|v| *v == 20.0));
    Ok(())
}

#[test]
fn a_rank_that_never_joins_is_a_timeout() -> Result<()> {
    let Some((gpu, _)) = gpu_and_nccl() else { return Ok(()) };
    let id = NcclUniqueId::new()?;
    let options = CommOptions::default().timeout(Duration::from_secs(3));
    let started = Instant::now();
    // Rank 1 of 2 never comes.
    let error = nccl_communicator(0, 2, gpu, &id, &options).unwrap_err();
    assert!(matches!(error, ParallelError::Timeout { rank: 0, .. }), "{error}");
    assert!(started.elapsed() < Duration::from_secs(30));
    Ok(())
}

#[test]
fn two_ranks_on_one_gpu_are_refused_where_nccl_refuses_them() -> Result<()> {
    let Some((gpu, version)) = gpu_and_nccl() else { return Ok(()) };
    if (version.0, version.1) >= (2, 30) {
        println!("NCCL {version:?} can share a GPU: covered by the world tests");
        return Ok(());
    }
    let error = nccl_group(&[gpu, gpu], &CommOptions::default()).unwrap_err();
    let text = error.to_string();
    assert!(text.contains("refuses two ranks on one GPU") && text.contains("InProcess"), "{text}");
    Ok(())
}

#[test]
fn an_id_bootstrapped_over_another_communicator_starts_nccl() -> Result<()> {
    let Some((gpu, _)) = gpu_and_nccl() else { return Ok(()) };
    let mut bootstrap = in_process_group(&[Device::CPU], &CommOptions::default())?;
    let comm = nccl_from(&bootstrap.remove(0), gpu, &CommOptions::default())?;
    assert_eq!((comm.rank(), comm.world_size(), comm.backend()), (0, 1, "nccl"));
    let x = Tensor::from_vec_on(vec![2.0f32; 3], [3], gpu)?;
    comm.all_reduce(&x, ReduceOp::Sum)?;
    assert_eq!(x.to_vec::<f32>()?, [2.0; 3]);
    assert!(NcclUniqueId::from_bytes(&[0u8; 5]).is_err());
    Ok(())
}
