//! The DDP case the MPI test files share: a small MLP and batches from
//! formulas, the same in every process and in the one-process reference.
// Each test file uses the part it needs.
#![allow(dead_code)]

use brasa_nn::optim::{Sgd, SgdConfig};
use brasa_nn::{Linear, ModuleExt, Relu, Sequential};
use brasa_parallel::Result;
use brasa_tensor::{Device, Tensor};

pub const DDP_BATCH: usize = 16;

/// A small MLP with parameters from a formula (the same in every process
/// and in the single-process reference).
pub fn ddp_model() -> Result<Sequential> {
    let dev = Device::CPU;
    let model = Sequential::new().push(Linear::new(6, 16, dev)?).push(Relu).push(Linear::new(16, 3, dev)?);
    for (k, p) in model.parameters().iter().enumerate() {
        let scale = 1.0 / (p.dims().last().copied().unwrap_or(1) as f32).sqrt();
        let v: Vec<f32> = (0..p.numel()).map(|i| (((i * 31 + k * 17) % 41) as f32 - 20.0) / 20.0 * scale).collect();
        p.tensor().copy_(&Tensor::from_vec_on(v, p.dims().to_vec(), dev)?)?;
    }
    Ok(model)
}

/// Rank `rank`'s rows of the batch of `step` (`world` 1: the full batch).
pub fn ddp_batch(step: usize, rank: usize, world: usize) -> Result<(Tensor, Tensor)> {
    let x: Vec<f32> = (0..DDP_BATCH * 6).map(|i| (((i * 37 + step * 11) % 29) as f32 - 14.0) / 7.0).collect();
    let y: Vec<i64> = (0..DDP_BATCH).map(|i| ((i * 5 + step) % 3) as i64).collect();
    let (x, y) =
        (Tensor::from_vec_on(x, [DDP_BATCH, 6], Device::CPU)?, Tensor::from_vec_on(y, [DDP_BATCH], Device::CPU)?);
    let rows = DDP_BATCH / world;
    Ok((x.narrow(0, rank * rows, rows)?.contiguous()?, y.narrow(0, rank * rows, rows)?.contiguous()?))
}

pub fn sgd(params: Vec<brasa_autograd::Var>) -> Result<Sgd> {
    Ok(Sgd::new(params, SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() })?)
}

pub fn parameter_values(model: &Sequential) -> Result<Vec<f32>> {
    let mut all = Vec::new();
    for p in model.parameters() {
        all.extend(p.tensor().to_vec::<f32>()?);
    }
    Ok(all)
}
