//! `cuda.*` (feature `cuda`, a GPU present): brasa on `cuda:0` next to
//! PyTorch on the same GPU, interleaved (brasa, PyTorch, brasa, PyTorch; medians).
//!
//! - `cuda.matmul_{f32,bf16}_tflops` and `_vs_torch`: one 4096³ product
//!   (`Tensor::matmul`, cuBLAS; TF32 off in both, as PyTorch's default).
//! - `cuda.alloc_pair_vs_cudamalloc`: `cuMemAlloc` + `cuMemFree` pairs ÷
//!   the same pairs served by brasa's caching allocator, over the mixed sizes
//!   of `alloc.speedup_vs_system` (512 B – 64 MiB, log-uniform);
//!   `cuda.alloc_pair_1mib_vs_cudamalloc`: the same with 1 MiB only.
//! - `cuda.mlp_train_vs_torch`, `cuda.cnn_train_vs_torch`: the training
//!   steps of `nn.*` (the same models, SGD momentum, batch 128 and 64) on the
//!   GPU, samples/s ÷ PyTorch's.
//!
//! Device work is asynchronous: every timing synchronizes the device before
//! it starts and before it stops. PyTorch's side is
//! `bench/peers/torch_cuda.py` (interpreter `$BRASA_TORCH_PYTHON`, else
//! `python3`). Without a GPU the group prints one line and no figure.

use crate::measure::{median, time, value_and_ratio, Better, Figure, Options};
use brasa_alloc::{Backend, CachingAllocator, CudaBackend, StreamId};
use brasa_autograd::Var;
use brasa_nn::functional::cross_entropy;
use brasa_nn::optim::{Optimizer, Sgd, SgdConfig};
use brasa_nn::{ModuleExt, NnError, Result};
use brasa_tensor::{cuda_device_count, manual_seed, synchronize, DType, Device, Tensor};
use std::hint::black_box;
use std::process::Command;

const GPU: Device = Device::cuda(0);

/// Parent side: the figures, or one line saying why there are none.
pub fn run(options: &Options) -> Vec<Figure> {
    if cuda_device_count() == 0 {
        eprintln!("cuda: no CUDA device (or no driver): the cuda.* figures are left out");
        return Vec::new();
    }
    let python = crate::measure::torch_python();
    // Two rounds: each PyTorch round pays its import and CUDA start-up.
    let rounds = options.reps(2, 1);
    let mut figures = Vec::new();
    for (dtype, flag, tflops_name, vs_name) in [
        (DType::F32, "f32", "cuda.matmul_f32_tflops", "cuda.matmul_f32_vs_torch"),
        (DType::BF16, "bf16", "cuda.matmul_bf16_tflops", "cuda.matmul_bf16_vs_torch"),
    ] {
        if !options.wants(vs_name) && !options.wants(tflops_name) {
            continue;
        }
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            match matmul_tflops(dtype, options.quick) {
                Ok(v) => ours.push(v),
                Err(e) => eprintln!("cuda: matmul {flag}: {e}"),
            }
            if let Some(v) = torch_value(&python, &format!("matmul_{flag}")) {
                theirs.push(v);
            }
        }
        figures.extend(value_and_ratio(tflops_name, "TFLOP/s", vs_name, Better::Higher, &mut ours, &mut theirs));
    }
    let mixed = crate::alloc_figures::mixed_sizes(2_000);
    let one_mib = vec![1 << 20; 2_000];
    for (name, sizes) in [("cuda.alloc_pair_vs_cudamalloc", &mixed), ("cuda.alloc_pair_1mib_vs_cudamalloc", &one_mib)] {
        if options.wants(name) {
            match alloc_pair_ratio(sizes, options.quick) {
                Ok(v) => figures.push(Figure::new(name, v, "x", Better::Higher)),
                Err(e) => eprintln!("cuda: {name}: {e}"),
            }
        }
    }
    for (cnn, rate_name, vs_name, torch_name) in [
        (false, "cuda.mlp_train_samples_per_s", "cuda.mlp_train_vs_torch", "mlp"),
        (true, "cuda.cnn_train_samples_per_s", "cuda.cnn_train_vs_torch", "cnn"),
    ] {
        if !options.wants(vs_name) && !options.wants(rate_name) {
            continue;
        }
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            match train_samples_per_s(cnn, options.quick) {
                Ok(v) => ours.push(v),
                Err(e) => eprintln!("cuda: {torch_name} training: {e}"),
            }
            if let Some(v) = torch_value(&python, torch_name) {
                theirs.push(v);
            }
        }
        figures.extend(value_and_ratio(rate_name, "samples/s", vs_name, Better::Higher, &mut ours, &mut theirs));
    }
    figures
}

/// PyTorch's value for one bench of `torch_cuda.py` (its last JSON line's
/// `value`; earlier JSON lines, details such as the kernels it ran, are
/// echoed on stderr), or `None` (said on stderr).
pub(crate) fn torch_value(python: &str, bench: &str) -> Option<f64> {
    let script = crate::measure::peer_script("torch_cuda.py");
    let script = script.as_str();
    let output = Command::new(python).args([script, "--bench", bench]).output();
    let output = match output {
        Ok(o) if o.status.success() => o,
        Ok(o) => {
            eprintln!("cuda: torch {bench} failed: {}", String::from_utf8_lossy(&o.stderr).trim());
            return None;
        }
        Err(e) => {
            eprintln!("cuda: running {python} {script}: {e}");
            return None;
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with('{')).collect();
    let line = lines.pop()?;
    for detail in lines {
        eprintln!("  torch {bench}: {detail}");
    }
    serde_json::from_str::<serde_json::Value>(line).ok()?["value"].as_f64()
}

fn matmul_tflops(dtype: DType, quick: bool) -> Result<f64> {
    let n = 4096;
    let a = Tensor::randn_on([n, n], DType::F32, GPU)?.to_dtype(dtype)?;
    let b = Tensor::randn_on([n, n], DType::F32, GPU)?.to_dtype(dtype)?;
    for _ in 0..3 {
        black_box(a.matmul(&b)?);
    }
    let iters = if quick { 5 } else { 50 };
    synchronize(GPU)?;
    let mut outcome = Ok(());
    let seconds = time(|| {
        for _ in 0..iters {
            if let Err(e) = a.matmul(&b) {
                outcome = Err(e);
            }
        }
        if let Err(e) = synchronize(GPU) {
            outcome = Err(e);
        }
    });
    outcome?;
    Ok(2.0 * (n as f64).powi(3) * iters as f64 / seconds / 1e12)
}

/// Driver pair time ÷ cached pair time over `sizes` (each size allocated
/// and freed once per pass; passes alternate between the two).
fn alloc_pair_ratio(sizes: &[usize], quick: bool) -> std::result::Result<f64, String> {
    let raw = CudaBackend::new(0).map_err(|e| e.to_string())?;
    let cache = CachingAllocator::new(CudaBackend::new(0).map_err(|e| e.to_string())?);
    let cached_pass = || {
        for &size in sizes {
            black_box(cache.allocate(size, StreamId::DEFAULT).ok());
        }
    };
    cached_pass();
    let mut ratios = Vec::new();
    for _ in 0..if quick { 3 } else { 9 } {
        let cached = time(cached_pass);
        let mut failure = None;
        let driver = time(|| {
            for &size in sizes {
                match raw.allocate(size) {
                    // SAFETY: the address came from `allocate` just now and nothing uses it.
                    Ok(addr) => unsafe { raw.free(addr, size) },
                    Err(e) => failure = Some(e.to_string()),
                }
            }
        });
        if let Some(e) = failure {
            return Err(e);
        }
        ratios.push(driver / cached);
    }
    Ok(median(&mut ratios))
}

/// nn's MLP (batch 128) or CNN (batch 64) trained on the GPU: samples/s.
fn train_samples_per_s(cnn: bool, quick: bool) -> Result<f64> {
    let batch = if cnn { 64 } else { 128 };
    let mut step = training_step(cnn)?;
    for i in 0..10 {
        step(i)?;
    }
    let steps = if quick { 20 } else { 200 };
    synchronize(GPU)?;
    let mut outcome = Ok(());
    let seconds = time(|| {
        for i in 0..steps {
            if outcome.is_ok() {
                outcome = step(i);
            }
        }
        if outcome.is_ok() {
            outcome = synchronize(GPU).map_err(Into::into);
        }
    });
    outcome?;
    Ok((steps * batch) as f64 / seconds)
}

/// One training step of nn's MLP (batch 128) or CNN (batch 64) on the GPU,
/// as a closure over the step index (8 fixed synthetic batches).
fn training_step(cnn: bool) -> Result<impl FnMut(usize) -> Result<()>> {
    manual_seed(0);
    if cnn {
        training_step_of(crate::nn_figures::cnn_on(GPU)?, 64, vec![64, 1, 28, 28])
    } else {
        training_step_of(crate::nn_figures::mlp_on(GPU)?, 128, vec![128, 784])
    }
}

/// One SGD-momentum training step of `model` (plain, or wrapped in DDP) on
/// batches of `dims` (`batch` rows) on the GPU, as a closure over the step
/// index (8 fixed synthetic batches).
pub(crate) fn training_step_of<M: brasa_nn::Module>(
    model: M,
    batch: usize,
    dims: Vec<usize>,
) -> Result<impl FnMut(usize) -> Result<()>> {
    let mut opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() })?;
    let batches: Vec<(Var, Tensor)> = (0..8)
        .map(|i| -> Result<(Var, Tensor)> {
            let x = Var::new(Tensor::randn_on(dims.clone(), DType::F32, GPU)?);
            let y: Vec<i64> = (0..batch).map(|j| ((i * 7 + j * 3) % 10) as i64).collect();
            Ok((x, Tensor::from_vec_on(y, [batch], GPU)?))
        })
        .collect::<Result<_>>()?;
    Ok(move |i: usize| -> Result<()> {
        let (x, y) = &batches[i % batches.len()];
        cross_entropy(&model.forward(x)?, y)?.backward()?;
        opt.step()?;
        opt.zero_grad()
    })
}

/// `brasa-bench --cuda-profile`: the op table (by self CPU time) of five
/// MLP and five CNN training steps on the GPU, to see where the host waits.
pub fn profile_steps() -> Result<()> {
    use brasa_profile::{Profiler, SortBy, TableOptions};
    for cnn in [false, true] {
        let mut step = training_step(cnn)?;
        for i in 0..10 {
            step(i)?;
        }
        synchronize(GPU)?;
        let profiler =
            Profiler::builder().record_shapes(false).start().map_err(|e| NnError::invalid("profile", e.to_string()))?;
        let started = std::time::Instant::now();
        for i in 0..5 {
            step(i)?;
        }
        synchronize(GPU)?;
        let seconds = started.elapsed().as_secs_f64();
        let result = profiler.stop();
        println!("{} on cuda:0, 5 steps in {:.2} ms", if cnn { "CNN" } else { "MLP" }, seconds * 1e3);
        println!("{}", result.key_averages().table(&TableOptions::default().sort_by(SortBy::SelfCpu).row_limit(25)));
    }
    Ok(())
}
