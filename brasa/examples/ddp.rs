//! DistributedDataParallel across processes: the same program runs alone
//! (one rank) or under `mpirun`, where every process is one rank of Open
//! MPI's world — on one machine or several.
//!
//! ```text
//! cargo run --release --example ddp                                  # one rank
//! cargo build --release --features mpi --example ddp
//! mpirun -np 2 target/release/examples/ddp                           # two ranks
//! cargo build --release --features mpi,cuda --example ddp
//! mpirun -np 2 target/release/examples/ddp --device cuda             # two GPUs over NCCL
//! ```
//!
//! With `--device cuda`, rank r trains on `cuda:(r mod GPUs)` and the ranks
//! talk over NCCL, its id broadcast over MPI's world (`nccl_from`).
//!
//! Each rank trains the MLP of `train_digits` on its share of every global
//! batch of the bundled digits; gradients are averaged across ranks during
//! backward, so every rank holds the same weights after every step and the
//! accuracy is that of one process on the whole batch. Rank 0 prints the
//! progress, the last step's DDP statistics (buckets, overlap) and
//! `test_accuracy=`.

use brasa::nn::data::{DataLoader, Digits};
use brasa::nn::functional::cross_entropy;
use brasa::nn::optim::{Adam, AdamConfig, Optimizer};
use brasa::nn::{Linear, Module, ModuleExt, Relu, Sequential};
use brasa::parallel::{init_from_env, CommOptions, DdpConfig, DistributedDataParallel};
use brasa::prelude::*;

type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> AnyResult<()> {
    #[cfg(feature = "mpi")]
    brasa::parallel::abort_job_on_panic();
    let world_comm = init_from_env(&CommOptions::default())?;
    let comm = match std::env::args().skip(1).collect::<Vec<_>>().as_slice() {
        [] => world_comm,
        [flag, device] if flag == "--device" && device == "cuda" => on_gpus(&world_comm)?,
        other => return Err(format!("unexpected arguments {other:?}; usage: ddp [--device cuda]").into()),
    };
    let (rank, world, dev) = (comm.rank(), comm.world_size(), comm.device());
    manual_seed(0);
    let (train, test) = Digits::load()?.train_test()?;
    let model = Sequential::new().push(Linear::new(64, 128, dev)?).push(Relu).push(Linear::new(128, 10, dev)?);
    let ddp = DistributedDataParallel::new(model, comm.clone(), DdpConfig::default())?; // rank 0's weights everywhere
    let mut opt = Adam::new(ddp.module().parameters(), AdamConfig { lr: 2e-3, ..Default::default() })?;
    // Every rank shuffles with the same seed and takes its rows of each batch.
    let loader = DataLoader::builder(train).batch_size(32).shuffle(true).seed(0).device(dev).build()?;
    if rank == 0 {
        println!("ddp: {world} rank(s), backend {}, {} parameters", comm.backend(), ddp.module().num_parameters());
    }
    for epoch in 0..30 {
        let (mut loss_sum, mut batches) = (0.0, 0);
        for batch in loader.epoch(epoch) {
            let (x, y) = batch?;
            let rows = x.dims()[0];
            if rows < world {
                continue;
            }
            let (start, end) = (rows * rank / world, rows * (rank + 1) / world);
            let x = Var::new(x.narrow(0, start, end - start)?.contiguous()?);
            let loss = cross_entropy(&ddp.forward(&x)?, &y.narrow(0, start, end - start)?)?;
            loss.backward()?;
            opt.step()?;
            opt.zero_grad()?;
            loss_sum += loss.item()?;
            batches += 1;
        }
        if rank == 0 && (epoch + 1) % 10 == 0 {
            println!("epoch {:>2}  loss {:.4} (rank 0's shards)", epoch + 1, loss_sum / batches.max(1) as f64);
        }
    }
    // Every rank holds the same weights: check it across ranks.
    let sum = ddp.module().parameters()[0].tensor().sum_all()?.item::<f64>()?;
    let (max, min) = (Tensor::full_on([1], sum, DType::F64, dev)?, Tensor::full_on([1], sum, DType::F64, dev)?);
    comm.all_reduce(&max, brasa::parallel::ReduceOp::Max)?;
    comm.all_reduce(&min, brasa::parallel::ReduceOp::Min)?;
    if max.to_vec::<f64>()? != min.to_vec::<f64>()? {
        return Err("ranks ended with different weights".into());
    }
    if rank == 0 {
        let stats = ddp.stats();
        println!(
            "last step: {} bucket(s), {} gradient bytes, {:.0}% launched during backward",
            stats.buckets,
            stats.total_bytes,
            100.0 * stats.overlap()
        );
        let _no_grad = no_grad();
        let logits = ddp.module().forward(&Var::new(test.features().to(dev)?))?;
        let correct = logits.tensor().argmax(&[-1], false)?.eq(&test.labels().to(dev)?)?.to_dtype(DType::F64)?;
        println!("test_accuracy={:.4}", correct.sum_all()?.item::<f64>()? / test.len() as f64);
    }
    comm.barrier()?;
    Ok(())
}

/// An NCCL communicator over the ranks of `world_comm`, rank r on
/// `cuda:(r mod GPUs)`.
#[cfg(feature = "cuda")]
fn on_gpus(world_comm: &brasa::parallel::Communicator) -> AnyResult<brasa::parallel::Communicator> {
    let gpus = brasa::tensor::cuda_device_count();
    if gpus == 0 {
        return Err("--device cuda: no CUDA device is visible".into());
    }
    let device = Device::cuda(world_comm.rank() % gpus);
    Ok(brasa::parallel::nccl::nccl_from(world_comm, device, &CommOptions::default())?)
}

#[cfg(not(feature = "cuda"))]
fn on_gpus(_world_comm: &brasa::parallel::Communicator) -> AnyResult<brasa::parallel::Communicator> {
    Err("--device cuda needs the `cuda` feature: build with --features mpi,cuda".into())
}
