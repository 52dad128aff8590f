//! `profile.*`: what profiling costs a training step — the MLP step of
//! `nn.mlp_train_samples_per_s` (784-512-512-10, batch 128, SGD momentum).
//!
//! - `profile.overhead_off_pct`: the hooks are always compiled in; while no
//!   profiler runs each is one relaxed atomic load and an early return. The
//!   figure is (ranges one step opens when profiling is on) × (cost of one
//!   disabled hook, timed over millions of calls) ÷ (step time), in percent:
//!   the difference to a build without the hooks, measured without needing
//!   a second build.
//! - `profile.overhead_on_pct`: step time with a profiler recording ranges,
//!   shapes and memory events, over step time without, interleaved, medians.

use crate::measure::{median, time, Better, Figure, Options};
use crate::nn_figures::mlp;
use brasa_autograd::Var;
use brasa_nn::functional::cross_entropy;
use brasa_nn::optim::{Optimizer, Sgd, SgdConfig};
use brasa_nn::{ModuleExt, Result};
use brasa_profile::{record_op, Profiler};
use brasa_tensor::{manual_seed, DType, Device, Tensor};
use std::hint::black_box;

const DEV: Device = Device::CPU;

pub fn run(options: &Options) -> Vec<Figure> {
    match figures(options) {
        Ok(figures) => figures,
        Err(e) => {
            eprintln!("  profile figures failed: {e}");
            Vec::new()
        }
    }
}

fn figures(options: &Options) -> Result<Vec<Figure>> {
    manual_seed(0);
    let model = mlp()?;
    let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() })?;
    let x = Var::new(Tensor::randn_on([128, 784], DType::F32, DEV)?);
    let y = Tensor::from_vec_on((0..128).map(|i| (i % 10) as i64).collect::<Vec<_>>(), [128], DEV)?;
    let mut step = || -> Result<()> {
        let loss = cross_entropy(&brasa_nn::Module::forward(&model, &x)?, &y)?;
        loss.backward()?;
        opt.step()?;
        opt.zero_grad()?;
        Ok(())
    };
    let steps_per_sample = options.reps(10, 3);
    let timed = |step: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        let mut outcome = Ok(());
        let seconds = time(|| {
            for _ in 0..steps_per_sample {
                if outcome.is_ok() {
                    outcome = step();
                }
            }
        });
        outcome?;
        Ok(seconds / steps_per_sample as f64)
    };
    for _ in 0..5 {
        step()?;
    }

    // How many ranges one step opens.
    let profiler = Profiler::builder().start().map_err(|e| brasa_nn::NnError::invalid("profiler", e.to_string()))?;
    step()?;
    let ranges_per_step = profiler.stop().ranges.len();

    // One disabled hook, amortised over many calls.
    let calls = if options.quick { 1_000_000 } else { 20_000_000 };
    let shapes: &[&[usize]] = &[&[128, 784]];
    let per_hook_s = time(|| {
        for _ in 0..calls {
            let _range = black_box(record_op(black_box("matmul"), black_box(shapes)));
        }
    }) / calls as f64;

    let mut off = Vec::new();
    let mut on = Vec::new();
    for _ in 0..options.reps(15, 3) {
        off.push(timed(&mut step)?);
        let profiler = Profiler::builder()
            .record_shapes(true)
            .profile_memory(true)
            .start()
            .map_err(|e| brasa_nn::NnError::invalid("profiler", e.to_string()))?;
        on.push(timed(&mut step)?);
        drop(profiler.stop());
    }
    let off = median(&mut off);
    let on = median(&mut on);
    Ok(vec![
        Figure::new("profile.overhead_off_pct", 100.0 * ranges_per_step as f64 * per_hook_s / off, "%", Better::Lower),
        Figure::new("profile.overhead_on_pct", 100.0 * (on / off - 1.0), "%", Better::Lower),
    ])
}
