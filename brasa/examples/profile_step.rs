//! The profiler's API on a real training step: a schedule that skips the
//! first steps, warms up and records a few, a user range around each phase,
//! the op table (by self time, then grouped by input shape), a Chrome /
//! Perfetto trace, the HTML memory timeline, and a utilization snapshot.
//!
//! ```text
//! cargo run --release --example profile_step            # writes target/profile/step_trace.json and step_memory.html
//! ```

use brasa::nn::functional::cross_entropy;
use brasa::nn::optim::{Optimizer, Sgd, SgdConfig};
use brasa::prelude::*;
use brasa::profile::{record_function, schedule, utilization, Profiler, SortBy, TableOptions};
use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    manual_seed(0);
    let dev = Device::CPU;
    let model = Sequential::new()
        .push(Linear::new(784, 512, dev)?)
        .push(Relu)
        .push(Linear::new(512, 512, dev)?)
        .push(Relu)
        .push(Linear::new(512, 10, dev)?);
    let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() })?;
    let x = Var::new(Tensor::randn_on([128, 784], DType::F32, dev)?);
    let y = Tensor::from_vec_on((0..128).map(|i| i % 10).collect::<Vec<i64>>(), [128], dev)?;

    // PyTorch's schedule: wait 1 step, warm up 1, record 2, once.
    let mut profiler = Profiler::builder()
        .record_shapes(true)
        .profile_memory(true)
        .schedule(schedule(1, 1, 2, 1, 0)?)
        .on_trace_ready(|result| {
            eprintln!("trace ready: {} ranges, {} memory events", result.ranges.len(), result.memory.len())
        })
        .start()?;
    for _ in 0..6 {
        let loss = {
            let _forward = record_function("forward");
            cross_entropy(&model.forward(&x)?, &y)?
        };
        {
            let _backward = record_function("backward");
            loss.backward()?;
        }
        {
            let _step = record_function("optimizer.step");
            opt.step()?;
            opt.zero_grad()?;
        }
        profiler.step();
    }
    let result = profiler.stop();

    println!("{}", result.key_averages().table(&TableOptions::default().sort_by(SortBy::SelfCpu).row_limit(12)));
    println!("grouped by input shape:");
    println!(
        "{}",
        result.key_averages_by_input_shape().table(&TableOptions::default().sort_by(SortBy::CpuTotal).row_limit(8))
    );

    let dir = Path::new("target/profile");
    std::fs::create_dir_all(dir)?;
    result.export_chrome_trace(dir.join("step_trace.json"))?;
    result.export_memory_timeline(dir.join("step_memory.html"))?;
    println!(
        "wrote {} (open in ui.perfetto.dev) and {}",
        dir.join("step_trace.json").display(),
        dir.join("step_memory.html").display()
    );
    println!("\n{}", utilization());
    Ok(())
}
