//! Training through an out of memory: the step splits itself.
//!
//! ```text
//! cargo run --release --example oom_recovery
//! ```
//!
//! The model trains on logical host device `cpu:1`, limited to 64 MiB, so a
//! batch of 8192 rows (32 MiB per hidden activation) does not fit.
//! [`AutoMicroBatch`] keeps the batch at 8192 — the optimizer sees the same
//! batch, the learning rate needs no change — and when a step runs out of
//! memory it drops what the attempt held, empties the cache and runs the
//! step again in twice as many micro-batches, accumulating their
//! gradients. The split that worked is kept for the following steps.
//!
//! Out of memory is recognised by type, not by message: every brasa error
//! answers `as_out_of_memory()` (`Some` report with the device, the bytes
//! requested and what the allocator held; `None` for anything else, which
//! is returned, not retried). The manual version of the same recipe —
//! catch, `zero_grad`, `empty_cache`, halve — is in the guide's
//! out-of-memory chapter.

use brasa::alloc::format_size;
use brasa::prelude::*;

type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The limited device's index and its memory limit.
pub const DEVICE_INDEX: usize = 1;
/// 64 MiB: a batch of 8192 does not fit, a batch of 2048 does.
pub const MEMORY_LIMIT: usize = 64 << 20;
/// The device batch, the same for every step.
pub const BATCH: usize = 8192;
/// Optimizer steps to complete.
pub const STEPS: usize = 5;
const FEATURES: usize = 256;
const HIDDEN: usize = 1024;
const CLASSES: usize = 10;
const ROWS: usize = 8192;

/// What happened during training.
#[derive(Debug)]
pub struct Report {
    /// Each out of memory met: the device, the bytes requested and the
    /// micro-batches of the attempt that failed.
    pub ooms: Vec<(String, usize, usize)>,
    /// The micro-batches training settled on.
    pub micro_batches: usize,
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
            "oom_recovery: trained {} steps of {BATCH} rows after {} out-of-memory retr{}, in {} micro-batches of {}, loss {:.4} -> {:.4}",
            self.steps,
            self.ooms.len(),
            if self.ooms.len() == 1 { "y" } else { "ies" },
            self.micro_batches,
            BATCH.div_ceil(self.micro_batches),
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

/// The loss of rows `rows` of the batch starting at `start` (forward only:
/// [`AutoMicroBatch`] weighs it and runs backward). Everything that
/// allocates on the device, copying the rows included, is inside, so an out
/// of memory anywhere in it comes back as the error.
fn micro_batch_loss(
    model: &Sequential,
    data: &(Tensor, Tensor),
    start: usize,
    rows: std::ops::Range<usize>,
    dev: Device,
) -> Result<Var, NnError> {
    let x = Var::new(data.0.narrow(0, start + rows.start, rows.len())?.to(dev)?);
    let y = data.1.narrow(0, start + rows.start, rows.len())?.to(dev)?;
    cross_entropy(&model.forward(&x)?, &y)
}

/// Trains a 256-1024-1024-10 MLP on `dev` for [`STEPS`] steps of [`BATCH`]
/// rows, each through [`AutoMicroBatch`].
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
    let mut auto = AutoMicroBatch::new();
    let mut ooms = Vec::new();
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let start = (step * BATCH) % ROWS;
        // The loss of the whole batch, for the report: each micro-batch's
        // mean, weighed by its rows (an attempt that fails starts over).
        let mut loss = 0.0;
        let report = auto.step(BATCH, &mut opt, |rows| {
            if rows.start == 0 {
                loss = 0.0;
            }
            let share = rows.len() as f64 / BATCH as f64;
            let micro = micro_batch_loss(&model, &data, start, rows, dev)?;
            loss += micro.item()? * share;
            Ok::<_, NnError>(micro)
        })?;
        for retry in &report.retries {
            if let Some(oom) = &retry.out_of_memory {
                println!(
                    "step {step}: out of memory on {} asking for {} in {} micro-batch(es) ({} allocated, {} reserved)",
                    oom.device,
                    format_size(oom.requested_bytes),
                    retry.micro_batches,
                    format_size(oom.allocated_bytes),
                    format_size(oom.reserved_bytes),
                );
                ooms.push((oom.device.clone(), oom.requested_bytes, retry.micro_batches));
            }
        }
        if report.changed_split() {
            println!("  step {step}: {report}");
        }
        losses.push(loss);
    }
    println!("peak on {dev}: {}", format_size(memory::max_allocated(dev)?));
    Ok(Report {
        ooms,
        micro_batches: auto.micro_batches(),
        steps: losses.len(),
        first_loss: losses[0],
        last_loss: losses[STEPS - 1],
    })
}

#[allow(dead_code)] // the test includes this file and runs `train` itself
fn main() -> AnyResult<()> {
    let report = train(limited_device()?)?;
    println!("{}", report.summary());
    Ok(())
}
