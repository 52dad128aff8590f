//! The FSDP case the MPI test files share: the DDP case's model and
//! batches, sharded, against one process on the full batch.
// Each test file uses the part it needs.
#![allow(dead_code)]

use super::ddp_case::{ddp_batch, ddp_model, sgd};
use brasa_autograd::Var;
use brasa_nn::functional::cross_entropy;
use brasa_nn::optim::Optimizer;
use brasa_nn::{Module, ModuleExt};
use brasa_parallel::{Communicator, FsdpConfig, FullyShardedDataParallel, Result};

/// Trains the DDP case's MLP sharded over `comm` for `steps` steps (odd
/// steps accumulate a second micro-batch under `no_sync` first) and checks
/// the full state dict against one process after every step; prints
/// `BRASA-FSDP-OK rank=N` at the end.
pub fn check_fsdp(comm: &Communicator, steps: usize, config: FsdpConfig) -> Result<()> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let reference = ddp_model()?;
    let mut reference_opt = sgd(reference.parameters())?;
    let fsdp = FullyShardedDataParallel::new(ddp_model()?, comm.clone(), config)?;
    let mut opt = sgd(fsdp.parameters())?;
    for step in 0..steps {
        let micro: Vec<usize> = if step % 2 == 1 { vec![100 + step, step] } else { vec![step] };
        for (k, &batch) in micro.iter().enumerate() {
            let (full_x, full_y) = ddp_batch(batch, 0, 1)?;
            cross_entropy(&reference.forward(&Var::new(full_x))?, &full_y)?.backward()?;
            let (x, y) = ddp_batch(batch, rank, world)?;
            let _local = (k + 1 < micro.len()).then(|| fsdp.no_sync());
            cross_entropy(&fsdp.forward(&Var::new(x))?, &y)?.backward()?;
        }
        reference_opt.step()?;
        reference_opt.zero_grad()?;
        opt.step()?;
        opt.zero_grad()?;
        let full = fsdp.full_state_dict()?;
        if let Some(full) = full {
            for (name, want) in reference.state_dict().iter() {
                let got = full.get(name).unwrap_or_else(|| panic!("no {name} in the full state dict"));
                for (g, w) in got.to_vec::<f32>()?.iter().zip(want.to_vec::<f32>()?) {
                    assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "step {step} {name}: {g} vs {w}");
                }
            }
        }
    }
    println!("BRASA-FSDP-OK rank={rank} world={world}");
    Ok(())
}
