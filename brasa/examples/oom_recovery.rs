//! Recovering from an out of memory: catch it, empty the cache, halve the
//! batch, retry — as a PyTorch user does with `torch.cuda.OutOfMemoryError`.
//!
//! ```text
//! cargo run --release --example oom_recovery
//! ```
//!
//! The model trains on logical host device `cpu:1`, limited to 64 MiB, so a
//! batch of 8192 rows (32 MiB per hidden activation) does not fit. Every
//! brasa error answers `as_out_of_memory()`: `Some` report (device, bytes
//! requested, what the allocator held) for an out of memory, wherever in the
//! step it happened — copying the batch, a layer's forward, backward, the
//! optimizer's step — and `None` for anything else, which is not retried.

use brasa::alloc::format_size;
use brasa::prelude::*;

type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The limited device's index and its memory limit.
pub const DEVICE_INDEX: usize = 1;
/// 64 MiB: a batch of 8192 does not fit, a batch of 2048 does.
pub const MEMORY_LIMIT: usize = 64 << 20;
/// The batch the training starts with.
pub const START_BATCH: usize = 8192;
/// Optimizer steps to complete.
pub const STEPS: usize = 20;
const FEATURES: usize = 256;
const HIDDEN: usize = 1024;
const CLASSES: usize = 10;
const ROWS: usize = 8192;

/// What happened during training.
#[derive(Debug)]
pub struct Report {
    /// Each out of memory met: the device, the bytes requested and the batch
    /// that was being tried.
    pub ooms: Vec<(String, usize, usize)>,
    /// The batch training ended with.
    pub final_batch: usize,
    /// Steps completed.
    pub steps: usize,
    /// The loss of the first completed step.
    pub first_loss: f64,
    /// The loss of the last completed step.
    pub last_loss: f64,
}

impl Report {
    /// The line the example ends with.
    pub fn summary(&self) -> String {
        format!(
            "oom_recovery: trained {} steps after {} out-of-memory retr{}, batch {} -> {}, loss {:.4} -> {:.4}",
            self.steps,
            self.ooms.len(),
            if self.ooms.len() == 1 { "y" } else { "ies" },
            START_BATCH,
            self.final_batch,
            self.first_loss,
            self.last_loss
        )
    }
}

/// Creates the logical host devices and limits [`DEVICE_INDEX`] to
/// [`MEMORY_LIMIT`] (before anything is allocated on it).
pub fn limited_device() -> AnyResult<Device> {
    brasa::tensor::set_host_device_count(2)?;
    brasa::tensor::set_host_memory_limit(DEVICE_INDEX, Some(MEMORY_LIMIT))?;
    Ok(Device::cpu(DEVICE_INDEX))
}

/// A synthetic task on `cpu:0` (unlimited): the class of a row is the index
/// of the largest of its first ten features.
fn dataset() -> AnyResult<(Tensor, Tensor)> {
    let mut x = Vec::with_capacity(ROWS * FEATURES);
    let mut y = Vec::with_capacity(ROWS);
    for i in 0..ROWS {
        let row: Vec<f32> = (0..FEATURES).map(|j| ((i * 7919 + j * 104_729) as f32 * 0.618).sin()).collect();
        let class = (0..CLASSES).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap_or(0);
        x.extend_from_slice(&row);
        y.push(class as i64);
    }
    Ok((Tensor::from_vec_on(x, [ROWS, FEATURES], Device::cpu(0))?, Tensor::from_vec_on(y, [ROWS], Device::cpu(0))?))
}

/// One step on rows `start..start + batch`: everything that allocates on the
/// device, so an out of memory anywhere in it comes back as the error.
fn step(
    model: &Sequential,
    opt: &mut Sgd,
    data: &(Tensor, Tensor),
    start: usize,
    batch: usize,
    dev: Device,
) -> Result<f64, NnError> {
    let x = Var::new(data.0.narrow(0, start, batch)?.to(dev)?);
    let y = data.1.narrow(0, start, batch)?.to(dev)?;
    let loss = cross_entropy(&model.forward(&x)?, &y)?;
    loss.backward()?;
    opt.step()?;
    opt.zero_grad()?;
    loss.item().map_err(NnError::from)
}

/// Trains a 256-1024-1024-10 MLP on `dev` for [`STEPS`] steps, starting with
/// batches of [`START_BATCH`]; on an out of memory it frees what the failed
/// step left (gradients, cached blocks), halves the batch and retries.
pub fn train(dev: Device) -> AnyResult<Report> {
    manual_seed(0);
    let data = dataset()?;
    let model = Sequential::new()
        .push(Linear::new(FEATURES, HIDDEN, dev)?)
        .push(Relu)
        .push(Linear::new(HIDDEN, HIDDEN, dev)?)
        .push(Relu)
        .push(Linear::new(HIDDEN, CLASSES, dev)?);
    let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() })?;
    let mut batch = START_BATCH;
    let mut ooms = Vec::new();
    let mut losses = Vec::new();
    let mut start = 0;
    while losses.len() < STEPS {
        match step(&model, &mut opt, &data, start, batch, dev) {
            Ok(loss) => {
                losses.push(loss);
                start = (start + batch) % ROWS;
            }
            Err(error) => {
                // Anything but an out of memory is a real failure.
                let Some(oom) = error.as_out_of_memory() else { return Err(error.into()) };
                println!(
                    "step {}: out of memory on {} asking for {} with a batch of {batch} ({} allocated, {} reserved)",
                    losses.len(),
                    oom.device,
                    format_size(oom.requested_bytes),
                    format_size(oom.allocated_bytes),
                    format_size(oom.reserved_bytes),
                );
                ooms.push((oom.device.clone(), oom.requested_bytes, batch));
                if batch == 1 {
                    return Err(error.into());
                }
                // The failed step's graph is gone with its error; drop the
                // gradients it may have left and give the cache back.
                opt.zero_grad()?;
                memory::empty_cache(dev)?;
                batch /= 2;
                println!("  emptied the cache; retrying with a batch of {batch}");
            }
        }
    }
    println!("peak on {dev}: {}", format_size(memory::max_allocated(dev)?));
    Ok(Report { ooms, final_batch: batch, steps: losses.len(), first_loss: losses[0], last_loss: losses[STEPS - 1] })
}

#[allow(dead_code)] // the test includes this file and runs `train` itself
fn main() -> AnyResult<()> {
    let report = train(limited_device()?)?;
    println!("{}", report.summary());
    Ok(())
}
