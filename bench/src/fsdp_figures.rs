//! The measurements behind the fully sharded figures of the `parallel.*`
//! group (each runs in its own child process, see `parallel_figures`):
//!
//! - `parallel.fsdp_memory_ratio_4`: the per-rank peak of parameters +
//!   gradients + Adam state (the allocator's bytes of those three
//!   categories together, watched through two steps after two warm-ups) under
//!   FSDP ÷ under DDP, 4 ranks, a model of 8 equal units (512-wide linear
//!   layers). The formula is the states' 1/4 plus two units' gathered
//!   parameters and two units' unsharded gradients, printed beside it; the
//!   target is the formula within 5 %.
//! - `parallel.fsdp_overlap`: the share of all-gather and reduce-scatter
//!   bytes whose transfer overlapped computation (prefetched gathers,
//!   reductions started while backward had more to compute), 2 ranks, the
//!   8-unit model at batch 64, mean over steps. Target ≥ 0.8.
//! - `parallel.fsdp_step_ratio`: an SGD step of that model under FSDP ÷
//!   under DDP, 2 ranks (one thread each), interleaved rounds, median of
//!   the ratios. Target ≤ 1.2.

use brasa_alloc::{MemoryCategory, TraceAction, TraceEntry};
use brasa_autograd::Var;
use brasa_nn::functional::{mse_loss, Reduction};
use brasa_nn::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use brasa_nn::{Linear, ModuleExt, Relu, Sequential};
use brasa_parallel::{
    ensure_host_devices, run_in_process, CommOptions, DdpConfig, DistributedDataParallel, FsdpConfig,
    FullyShardedDataParallel, LaunchOptions,
};
use brasa_tensor::{memory, DType, Device, Tensor};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type Outcome = Result<f64, String>;

const UNITS: usize = 8;
const WIDTH: usize = 512;
const BATCH: usize = 64;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn options() -> LaunchOptions {
    LaunchOptions { comm: CommOptions::default().timeout(Duration::from_secs(120)), threads_per_rank: Some(1) }
}

fn units(dev: Device) -> brasa_nn::Result<Sequential> {
    let mut model = Sequential::new();
    for _ in 0..UNITS {
        model = model.push(Linear::new(WIDTH, WIDTH, dev)?).push(Relu);
    }
    Ok(model)
}

/// The peak of a device's parameter, gradient and optimizer-state bytes
/// together while it lives (the allocator's events, block sizes).
struct ModelStatesPeak {
    device: Device,
    counts: Arc<Mutex<(i64, i64)>>,
}

impl ModelStatesPeak {
    fn watch(device: Device) -> brasa_parallel::Result<ModelStatesPeak> {
        let counts = Arc::new(Mutex::new((0i64, 0i64)));
        let seen = Arc::clone(&counts);
        let counted = |c: MemoryCategory| {
            matches!(c, MemoryCategory::Parameter | MemoryCategory::Gradient | MemoryCategory::OptimizerState)
        };
        let observer = move |entry: &TraceEntry| {
            let size = entry.size as i64;
            let delta = match entry.action {
                TraceAction::Alloc if counted(entry.category) => size,
                TraceAction::FreeCompleted if counted(entry.category) => -size,
                TraceAction::Retag { from } if counted(from) != counted(entry.category) => {
                    if counted(entry.category) {
                        size
                    } else {
                        -size
                    }
                }
                _ => 0,
            };
            let mut c = seen.lock().unwrap_or_else(|e| e.into_inner());
            c.0 += delta;
            c.1 = c.1.max(c.0);
        };
        memory::set_observer(device, Some(Arc::new(observer)))?;
        Ok(ModelStatesPeak { device, counts })
    }

    fn peak(&self) -> usize {
        self.counts.lock().unwrap_or_else(|e| e.into_inner()).1.max(0) as usize
    }
}

impl Drop for ModelStatesPeak {
    fn drop(&mut self) {
        let _ = memory::set_observer(self.device, None);
    }
}

/// A wrapped model's forward.
type Forward = Box<dyn Fn(&Var) -> brasa_parallel::Result<Var>>;

/// One rank's model under FSDP or DDP: its forward, its optimizer (over
/// the shards or the whole parameters) and the overlap of its last step.
struct Trainer {
    forward: Forward,
    opt: Box<dyn Optimizer>,
    overlap: Box<dyn Fn() -> f64>,
}

impl Trainer {
    fn new(
        sharded: bool,
        comm: &brasa_parallel::Communicator,
        optimizer: impl FnOnce(Vec<Var>) -> brasa_nn::Result<Box<dyn Optimizer>>,
    ) -> brasa_parallel::Result<Trainer> {
        let dev = comm.device();
        if sharded {
            let fsdp = Arc::new(FullyShardedDataParallel::new(units(dev)?, comm.clone(), FsdpConfig::default())?);
            let (f, s) = (Arc::clone(&fsdp), Arc::clone(&fsdp));
            Ok(Trainer {
                opt: optimizer(fsdp.parameters())?,
                forward: Box::new(move |x| f.forward(x)),
                overlap: Box::new(move || s.stats().overlap()),
            })
        } else {
            let ddp = Arc::new(DistributedDataParallel::new(units(dev)?, comm.clone(), DdpConfig::default())?);
            let (f, s) = (Arc::clone(&ddp), Arc::clone(&ddp));
            Ok(Trainer {
                opt: optimizer(ddp.module().parameters())?,
                forward: Box::new(move |x| f.forward(x)),
                overlap: Box::new(move || s.stats().overlap()),
            })
        }
    }

    fn step(&mut self, x: &Var, y: &Var) -> brasa_parallel::Result<()> {
        mse_loss(&(self.forward)(x)?, y, Reduction::Mean)?.backward()?;
        self.opt.step()?;
        self.opt.zero_grad()?;
        Ok(())
    }
}

/// Rank 0's peak of model states (Adam) through steps 3 and 4, with what
/// it held before them: (bytes, bytes of the model's parameters).
fn peak_model_states(world: usize, sharded: bool) -> Result<(usize, usize), String> {
    let results = run_in_process(world, &options(), |comm| {
        let dev = comm.device();
        let adam = AdamConfig { lr: 1e-4, ..Default::default() };
        let x = Var::new(Tensor::randn_on([8, WIDTH], DType::F32, dev)?);
        let y = Var::new(Tensor::zeros_on([8, WIDTH], DType::F32, dev)?);
        let model_bytes = units(dev)?.parameters().iter().map(|p| p.tensor().storage().size_in_bytes()).sum();
        let mut trainer = Trainer::new(sharded, &comm, |params| Ok(Box::new(Adam::new(params, adam)?)))?;
        // Two warm-up steps: the first makes the optimizer state, the
        // second lets DDP rebuild its buckets (both buffers exist then).
        for _ in 0..2 {
            trainer.step(&x, &y)?;
        }
        let before = memory::stats(dev)?;
        let held = [MemoryCategory::Parameter, MemoryCategory::Gradient, MemoryCategory::OptimizerState]
            .iter()
            .map(|&c| before.by_category.get(c).current.max(0) as usize)
            .sum::<usize>();
        let watch = ModelStatesPeak::watch(dev)?;
        for _ in 0..2 {
            trainer.step(&x, &y)?;
        }
        Ok((held + watch.peak(), model_bytes))
    })
    .map_err(err)?;
    Ok(results[0])
}

pub fn fsdp_memory_ratio_4(_quick: bool) -> Outcome {
    const WORLD: usize = 4;
    ensure_host_devices(WORLD).map_err(err)?;
    let (fsdp, model) = peak_model_states(WORLD, true)?;
    let (ddp, _) = peak_model_states(WORLD, false)?;
    // Adam: P + G + 2P = 4P in all; a unit is P / 8. The formula's bytes
    // against the DDP peak measured beside it.
    let unit = model as f64 / UNITS as f64;
    let formula_bytes = 4.0 * model as f64 / WORLD as f64 + 4.0 * unit;
    let formula = formula_bytes / ddp as f64;
    let measured = fsdp as f64 / ddp as f64;
    eprintln!(
        "    per-rank peak of model states: FSDP {:.2} MiB (formula {:.2} MiB: 1/4 of the states + 2 units' \
         parameters + 2 units' gradients), DDP {:.2} MiB; ratio {measured:.3}, formula {formula:.3} ({:+.1} %)",
        fsdp as f64 / (1 << 20) as f64,
        formula_bytes / (1 << 20) as f64,
        ddp as f64 / (1 << 20) as f64,
        (measured / formula - 1.0) * 100.0
    );
    Ok(measured)
}

fn sgd(params: Vec<Var>) -> brasa_nn::Result<Sgd> {
    Sgd::new(params, SgdConfig { lr: 1e-3, momentum: 0.9, ..Default::default() })
}

/// Seconds per step and mean overlap of `steps` steps after 2 warm-ups, 2
/// ranks, half the batch each.
fn timed_steps(sharded: bool, steps: usize) -> Result<(f64, f64), String> {
    let results = run_in_process(2, &options(), |comm| {
        let dev = comm.device();
        let x = Var::new(Tensor::randn_on([BATCH / 2, WIDTH], DType::F32, dev)?);
        let y = Var::new(Tensor::zeros_on([BATCH / 2, WIDTH], DType::F32, dev)?);
        let mut trainer = Trainer::new(sharded, &comm, |params| Ok(Box::new(sgd(params)?)))?;
        for _ in 0..2 {
            trainer.step(&x, &y)?;
        }
        comm.barrier()?;
        let start = Instant::now();
        let mut overlaps = 0.0;
        for _ in 0..steps {
            trainer.step(&x, &y)?;
            overlaps += (trainer.overlap)();
        }
        comm.barrier()?;
        Ok((start.elapsed().as_secs_f64() / steps as f64, overlaps / steps as f64))
    })
    .map_err(err)?;
    Ok(results[0])
}

pub fn fsdp_overlap(quick: bool) -> Outcome {
    ensure_host_devices(2).map_err(err)?;
    Ok(timed_steps(true, if quick { 2 } else { 5 })?.1)
}

pub fn fsdp_step_ratio(quick: bool) -> Outcome {
    ensure_host_devices(2).map_err(err)?;
    let (rounds, steps) = if quick { (1, 2) } else { (5, 5) };
    let mut ratios = Vec::new();
    for _ in 0..rounds {
        let (fsdp, _) = timed_steps(true, steps)?;
        let (ddp, _) = timed_steps(false, steps)?;
        eprintln!("    2 ranks: FSDP {:.2} ms/step, DDP {:.2} ms/step", fsdp * 1e3, ddp * 1e3);
        ratios.push(fsdp / ddp);
    }
    ratios.sort_by(f64::total_cmp);
    Ok(ratios[ratios.len() / 2])
}
