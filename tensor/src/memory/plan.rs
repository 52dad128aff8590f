//! Memory plans: a training step run on a meta device imitating the
//! target, answering before the run what it will take: peak allocated and
//! peak reserved bytes (exact on host targets; on CUDA targets exact up to
//! cuDNN's convolution workspaces, which the plan lists among its
//! [`MemoryPlan::assumptions`], see [`plan`]), what is alive at the peak
//! and for what, and the first allocation that would fail.
//!
//! ```
//! use brasa_tensor::memory;
//! use brasa_tensor::{DType, MemoryTarget, Tensor};
//!
//! // A 4096² f32 product chain planned for a 40 GiB GPU, on any machine.
//! let plan = memory::plan(&MemoryTarget::cuda(40 << 30), |device| {
//!     let w = Tensor::randn_on([4096, 4096], DType::F32, device)?;
//!     Ok::<_, brasa_tensor::TensorError>(move || {
//!         let x = Tensor::randn_on([4096, 4096], DType::F32, device)?;
//!         let _y = x.matmul(&w)?.relu()?;
//!         Ok(())
//!     })
//! })?;
//! assert!(plan.fits);
//! assert_eq!(plan.peak_allocated, 4 * (64 << 20));   // w, x, x·w and its relu at once
//! println!("{plan}");
//! # Ok::<(), brasa_tensor::TensorError>(())
//! ```

use crate::backend::meta::{FailedAllocation, LiveTensor, MetaDevice, PlanAssumption};
use crate::backend::target::MemoryTarget;
use crate::device::Device;
use crate::error::{Result, SharedError, TensorError};
use brasa_alloc::{format_size, MemoryCategory};
use std::fmt;
use std::time::{Duration, Instant};

/// How many times [`plan`] runs the step: the first step creates state
/// (optimizer moments, cached casts) that the second one keeps, so the
/// second is the steady state.
pub const PLANNED_STEPS: usize = 2;

/// What a step will take on a target device, from a run on a meta device.
#[derive(Clone, Debug, serde::Serialize)]
pub struct MemoryPlan {
    /// The target, in words.
    pub target: String,
    /// The target's capacity in bytes.
    pub capacity: usize,
    /// Whether the setup and every step ran without running out of memory.
    pub fits: bool,
    /// Steps run (after the setup).
    pub steps: usize,
    /// The highest allocated bytes (`max_memory_allocated`).
    pub peak_allocated: usize,
    /// The highest reserved bytes (`max_memory_reserved`).
    pub peak_reserved: usize,
    /// Allocated bytes by category at the peak of allocated bytes (they add
    /// up to `peak_allocated`); categories with no bytes are left out.
    pub peak_by_category: Vec<(MemoryCategory, usize)>,
    /// The tensors alive at the peak, largest first.
    pub peak_tensors: Vec<LiveTensor>,
    /// The first allocation that would fail, when the step does not fit.
    pub failure: Option<FailedAllocation>,
    /// Where the plan modelled something the run may do differently (on a
    /// CUDA target with cuDNN switched on: convolutions planned on im2col);
    /// empty when the plan is exact.
    pub assumptions: Vec<PlanAssumption>,
    /// Seconds the plan took (setup and steps on the meta device).
    pub seconds: f64,
}

impl MemoryPlan {
    /// The plan as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|error| format!("{{\"error\": \"{error}\"}}"))
    }

    /// Bytes of the target still free at the peak of reserved memory (0
    /// when it does not fit).
    pub fn headroom(&self) -> usize {
        if self.fits {
            self.capacity.saturating_sub(self.peak_reserved)
        } else {
            0
        }
    }
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let size = |bytes: usize| format_size(bytes);
        writeln!(f, "Memory plan for {} ({} capacity), {} step(s):", self.target, size(self.capacity), self.steps)?;
        match &self.failure {
            None => writeln!(f, "  fits: yes, {} to spare", size(self.headroom()))?,
            Some(failure) => writeln!(
                f,
                "  fits: NO - {} asked for {} ({}) with {} allocated and {} reserved",
                failure.op,
                size(failure.requested),
                failure.category,
                size(failure.allocated),
                size(failure.reserved)
            )?,
        }
        writeln!(f, "  peak allocated: {:>12}  ({} bytes)", size(self.peak_allocated), self.peak_allocated)?;
        writeln!(f, "  peak reserved:  {:>12}  ({} bytes)", size(self.peak_reserved), self.peak_reserved)?;
        writeln!(f, "  at the peak, by category:")?;
        for (category, bytes) in &self.peak_by_category {
            let share = 100.0 * *bytes as f64 / self.peak_allocated.max(1) as f64;
            writeln!(f, "    {:<16} {:>12}  {share:5.1} %", category.to_string(), size(*bytes))?;
        }
        writeln!(f, "  largest tensors at the peak:")?;
        for tensor in self.peak_tensors.iter().take(8) {
            writeln!(
                f,
                "    {:>12}  {:<5} {:<16} made by {}",
                size(tensor.block_bytes),
                tensor.dtype,
                tensor.category.to_string(),
                tensor.op
            )?;
        }
        for assumed in &self.assumptions {
            writeln!(f, "  assumes: {} ({} call(s)) {}", assumed.op, assumed.calls, assumed.assumption)?;
        }
        write!(f, "  planned in {:.3} s", self.seconds)
    }
}

/// Plans a training step for `target`: runs `setup` on a meta device
/// imitating it (building the model, optimizer and whatever the step
/// keeps), then the step it returns [`PLANNED_STEPS`] times, and reports
/// what they allocated and reserved. Nothing touches device memory.
///
/// Out of memory on the target is an answer, not an error: the plan says
/// it does not fit and which allocation would fail. Any other error of the
/// setup or step (reading a value on the meta device, a shape mistake) is
/// a [`TensorError::Plan`] carrying it.
///
/// For a CUDA target the plan follows the CUDA backend's allocations,
/// scratch included (split reductions' partial sums, the convolutions'
/// im2col column buffers), with one deliberate gap: convolutions are
/// planned on the im2col path. With cuDNN loaded and enabled a GPU run
/// instead allocates cuDNN's workspaces, whose size depends on the
/// algorithm cuDNN picks on the GPU at run time and cannot be known here;
/// the plan is exact for a run with `crate::cudnn::set_enabled(false)`
/// (or without cuDNN), and otherwise an estimate for convolutional models,
/// which the plan says: each convolution call so planned is counted in
/// [`MemoryPlan::assumptions`] (and printed as an `assumes:` line).
pub fn plan<Setup, Step, E>(target: &MemoryTarget, setup: Setup) -> Result<MemoryPlan>
where
    Setup: FnOnce(Device) -> std::result::Result<Step, E>,
    Step: FnMut() -> std::result::Result<(), E>,
    E: std::error::Error + Send + Sync + 'static,
{
    plan_steps(target, PLANNED_STEPS, setup)
}

/// [`plan`] with `steps` runs of the step.
pub fn plan_steps<Setup, Step, E>(target: &MemoryTarget, steps: usize, setup: Setup) -> Result<MemoryPlan>
where
    Setup: FnOnce(Device) -> std::result::Result<Step, E>,
    Step: FnMut() -> std::result::Result<(), E>,
    E: std::error::Error + Send + Sync + 'static,
{
    plan_on(&MetaDevice::new(target.clone())?, steps, setup)
}

/// [`plan_steps`] on a meta device made beforehand (for example one per
/// rank of a group, each planning its share of a distributed step). The
/// plan covers everything the device saw since it was made.
pub fn plan_on<Setup, Step, E>(meta: &MetaDevice, steps: usize, setup: Setup) -> Result<MemoryPlan>
where
    Setup: FnOnce(Device) -> std::result::Result<Step, E>,
    Step: FnMut() -> std::result::Result<(), E>,
    E: std::error::Error + Send + Sync + 'static,
{
    let device = meta.device();
    let started = Instant::now();
    let outcome = run(device, steps, setup);
    let elapsed = started.elapsed();
    match outcome {
        Ok(()) => Ok(report(meta, steps, elapsed)),
        Err(error) if brasa_alloc::find_out_of_memory(&error).is_some() => Ok(report(meta, steps, elapsed)),
        Err(error) => Err(TensorError::Plan {
            op: "memory::plan",
            device,
            target: meta.target().name().to_string(),
            source: SharedError::new(error),
        }),
    }
}

/// Plans a step that uses several devices at once (model parallelism, a
/// pipeline's stages): `setup` gets one meta device per target, in order,
/// and the step runs `steps` times; one plan per device, each covering
/// what that device saw. An out-of-memory on any device ends the step and
/// is reported by that device's plan.
pub fn plan_devices<Setup, Step, E>(targets: &[MemoryTarget], steps: usize, setup: Setup) -> Result<Vec<MemoryPlan>>
where
    Setup: FnOnce(&[Device]) -> std::result::Result<Step, E>,
    Step: FnMut() -> std::result::Result<(), E>,
    E: std::error::Error + Send + Sync + 'static,
{
    let metas = targets.iter().map(|target| MetaDevice::new(target.clone())).collect::<Result<Vec<_>>>()?;
    let devices: Vec<Device> = metas.iter().map(MetaDevice::device).collect();
    let started = Instant::now();
    let outcome = run_with(steps, || setup(&devices));
    let elapsed = started.elapsed();
    match outcome {
        Ok(()) => {}
        Err(error) if brasa_alloc::find_out_of_memory(&error).is_some() => {}
        Err(error) => {
            return Err(TensorError::Plan {
                op: "memory::plan_devices",
                device: devices.first().copied().unwrap_or(Device::CPU),
                target: targets.iter().map(MemoryTarget::name).collect::<Vec<_>>().join(", "),
                source: SharedError::new(error),
            })
        }
    }
    Ok(metas.iter().map(|meta| report(meta, steps, elapsed)).collect())
}

/// The setup, then the step `steps` times; everything they made is
/// dropped before this returns (so the allocator's state is final).
fn run<Setup, Step, E>(device: Device, steps: usize, setup: Setup) -> std::result::Result<(), E>
where
    Setup: FnOnce(Device) -> std::result::Result<Step, E>,
    Step: FnMut() -> std::result::Result<(), E>,
{
    run_with(steps, || setup(device))
}

/// [`run`] with a setup that needs no arguments.
fn run_with<Setup, Step, E>(steps: usize, setup: Setup) -> std::result::Result<(), E>
where
    Setup: FnOnce() -> std::result::Result<Step, E>,
    Step: FnMut() -> std::result::Result<(), E>,
{
    let mut step = setup()?;
    for _ in 0..steps {
        // What a step makes and does not keep is a temporary (autograd
        // re-tags what it saves as activations, gradients as gradients).
        let _temporary = super::category_scope(MemoryCategory::Temporary);
        step()?;
    }
    Ok(())
}

fn report(meta: &MetaDevice, steps: usize, elapsed: Duration) -> MemoryPlan {
    let state = meta.state();
    let stats = state.allocator.stats();
    let ledger = state.ledger();
    let mut peak_tensors = ledger.peak_tensors();
    peak_tensors.sort_by(|a, b| b.block_bytes.cmp(&a.block_bytes).then_with(|| a.op.cmp(&b.op)));
    let peak_by_category = MemoryCategory::ALL
        .iter()
        .map(|&category| {
            let bytes = peak_tensors.iter().filter(|t| t.category == category).map(|t| t.block_bytes).sum();
            (category, bytes)
        })
        .filter(|&(_, bytes)| bytes > 0)
        .collect();
    let failure = ledger.first_failure();
    MemoryPlan {
        target: state.target.name().to_string(),
        capacity: state.target.capacity(),
        fits: failure.is_none(),
        steps,
        peak_allocated: stats.allocated_bytes.all.peak as usize,
        peak_reserved: stats.reserved_bytes.all.peak as usize,
        peak_by_category,
        peak_tensors,
        failure,
        assumptions: ledger.assumptions(),
        seconds: elapsed.as_secs_f64(),
    }
}

/// The result of [`max_batch_size`].
#[derive(Clone, Debug, serde::Serialize)]
pub struct BatchSearch {
    /// The largest batch that fits (0 when not even one does).
    pub batch: usize,
    /// The plan of that batch (of batch 1 when none fits).
    pub plan: MemoryPlan,
    /// The next batch, `batch + 1`, when it was within the search.
    pub next: Option<usize>,
    /// How many more bytes the target would need for the next batch: its
    /// peak reserved on an unlimited target minus the target's capacity.
    pub next_lacks: Option<usize>,
    /// Plans run by the search.
    pub plans: usize,
    /// Whether one real step of `batch` ran on the real device.
    pub confirmed: bool,
}

/// The largest batch, up to `limit`, whose step fits `device`: found by
/// plans on a meta device imitating it (doubling, then bisecting), then
/// confirmed by one real run of the setup and one step on `device`.
/// `setup(device, batch)` builds what the step needs and returns the step.
///
/// The confirming run uses the real device's memory; pass `confirm: false`
/// to skip it (planning a device this machine does not have).
pub fn max_batch_size<Setup, Step, E>(
    target_device: Device,
    limit: usize,
    confirm: bool,
    mut setup: Setup,
) -> Result<BatchSearch>
where
    Setup: FnMut(Device, usize) -> std::result::Result<Step, E>,
    Step: FnMut() -> std::result::Result<(), E>,
    E: std::error::Error + Send + Sync + 'static,
{
    let target = MemoryTarget::like(target_device)?;
    let mut search = search_batches(&target, limit, &mut setup)?;
    if confirm && search.batch > 0 {
        let outcome = run(target_device, 1, |device| setup(device, search.batch));
        outcome.map_err(|error| TensorError::Plan {
            op: "max_batch_size",
            device: target_device,
            target: format!("the confirming step of batch {} on the real device", search.batch),
            source: SharedError::new(error),
        })?;
        search.confirmed = true;
    }
    Ok(search)
}

/// [`max_batch_size`] for a target with no device here: plans only.
pub fn max_batch_size_for<Setup, Step, E>(target: &MemoryTarget, limit: usize, mut setup: Setup) -> Result<BatchSearch>
where
    Setup: FnMut(Device, usize) -> std::result::Result<Step, E>,
    Step: FnMut() -> std::result::Result<(), E>,
    E: std::error::Error + Send + Sync + 'static,
{
    search_batches(target, limit, &mut setup)
}

fn search_batches<Setup, Step, E>(target: &MemoryTarget, limit: usize, setup: &mut Setup) -> Result<BatchSearch>
where
    Setup: FnMut(Device, usize) -> std::result::Result<Step, E>,
    Step: FnMut() -> std::result::Result<(), E>,
    E: std::error::Error + Send + Sync + 'static,
{
    if limit == 0 {
        return Err(TensorError::invalid("max_batch_size", "the batch limit must be at least 1"));
    }
    let mut plans = 0;
    // Doubling until a batch does not fit (or the limit), then bisecting
    // between the last that fit and the first that did not.
    let first = plan_batch(target, setup, 1, &mut plans)?;
    if !first.fits {
        let search = BatchSearch { batch: 0, plan: first, next: Some(1), next_lacks: None, plans: 0, confirmed: false };
        return finish(target, search, plans, setup);
    }
    let (mut good, mut good_plan) = (1usize, first);
    let mut bad = None;
    while bad.is_none() && good < limit {
        let batch = good.saturating_mul(2).min(limit);
        let candidate = plan_batch(target, setup, batch, &mut plans)?;
        if candidate.fits {
            (good, good_plan) = (batch, candidate);
        } else {
            bad = Some(batch);
        }
    }
    if let Some(mut high) = bad {
        while high - good > 1 {
            let mid = good + (high - good) / 2;
            let candidate = plan_batch(target, setup, mid, &mut plans)?;
            if candidate.fits {
                (good, good_plan) = (mid, candidate);
            } else {
                high = mid;
            }
        }
    }
    let next = (good < limit).then_some(good + 1);
    let search = BatchSearch { batch: good, plan: good_plan, next, next_lacks: None, plans: 0, confirmed: false };
    finish(target, search, plans, setup)
}

fn plan_batch<Setup, Step, E>(
    target: &MemoryTarget,
    setup: &mut Setup,
    batch: usize,
    plans: &mut usize,
) -> Result<MemoryPlan>
where
    Setup: FnMut(Device, usize) -> std::result::Result<Step, E>,
    Step: FnMut() -> std::result::Result<(), E>,
    E: std::error::Error + Send + Sync + 'static,
{
    *plans += 1;
    plan(target, |device| setup(device, batch))
}

/// Fills in how much the next batch lacks: its peak reserved with room to spare.
fn finish<Setup, Step, E>(
    target: &MemoryTarget,
    mut search: BatchSearch,
    plans: usize,
    setup: &mut Setup,
) -> Result<BatchSearch>
where
    Setup: FnMut(Device, usize) -> std::result::Result<Step, E>,
    Step: FnMut() -> std::result::Result<(), E>,
    E: std::error::Error + Send + Sync + 'static,
{
    search.plans = plans;
    if let Some(next) = search.next {
        let roomy = target.clone().with_capacity(usize::MAX >> 1);
        let unlimited = plan(&roomy, |device| setup(device, next))?;
        search.plans += 1;
        search.next_lacks = Some(unlimited.peak_reserved.saturating_sub(target.capacity()));
    }
    Ok(search)
}
