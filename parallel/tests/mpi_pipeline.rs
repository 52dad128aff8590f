//! `Pipeline::over_ranks` across 2 MPI processes: stage `r` on rank `r`,
//! activations and gradients through the communicator's `send`/`recv`.
//! Each test re-runs this binary under `mpirun -np 2` (the launch pattern
//! of `tests/mpi.rs`: `BRASA_MPI_TEST_CHILD` selects the rank's part, every
//! job bounded by the communicator's timeout, `mpirun --timeout 60` and
//! `timeout -k 10 120`, and a panic on a rank aborts the job).
//!
//! Run: `cargo test -p brasa-parallel --features mpi --test mpi_pipeline`.

#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_autograd::Var;
use brasa_nn::functional::cross_entropy;
use brasa_nn::optim::{Optimizer, Sgd, SgdConfig};
use brasa_nn::{Linear, Module, ModuleExt, Parameters, Sequential, Tanh, Walk, WalkMut};
use brasa_parallel::pipeline::{Partition, Pipeline, PipelineConfig, PipelineRng, Schedule};
use brasa_parallel::{abort_job_on_panic, init_from_env, CommOptions, ParallelError};
use brasa_tensor::{Device, Generator, Tensor};
use std::io::Write;
use std::time::{Duration, Instant};

#[path = "support/launch.rs"]
mod launch;
use launch::{launcher, CASE, CHILD};

/// Runs `test` of this binary on 2 ranks with `case`; returns (exit code, output, elapsed).
fn mpirun(test: &str, case: &str) -> (Option<i32>, String, Duration) {
    let mpirun_args = ["-np", "2", "--oversubscribe", "--bind-to", "none", "--timeout", "60"];
    let transport = ["--mca", "pml", "ob1", "--mca", "btl", "self,vader", "--mca", "oob_tcp_if_include", "lo"];
    let args: Vec<&str> = mpirun_args.iter().chain(&transport).copied().collect();
    let mut command = launcher("mpirun", &args, test, case);
    let start = Instant::now();
    let output = command.output().expect("mpirun (Open MPI) on PATH");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.code(), text, start.elapsed())
}

fn is_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

fn linear(g: &mut Generator, inputs: usize, outputs: usize) -> Linear {
    let bound = 1.0 / (inputs as f32).sqrt();
    let mut tensor = |dims: &[usize]| {
        let mut values = vec![0f32; dims.iter().product()];
        g.fill_uniform_f32(&mut values, -bound, bound).unwrap();
        Var::param(Tensor::from_vec_on(values, dims, Device::CPU).unwrap()).unwrap()
    };
    let weight = tensor(&[outputs, inputs]);
    Linear { weight, bias: Some(tensor(&[outputs])) }
}

/// The same 6 layers on every rank (a local generator); `fail` inserts a
/// layer that fails on its third call at the start of stage 1.
fn mlp(fail: bool) -> Sequential {
    let mut g = Generator::new(3);
    let mut model = Sequential::new().push(linear(&mut g, 10, 16)).push(Tanh).push(linear(&mut g, 16, 16));
    if fail {
        model = model.push(FailThird(std::sync::atomic::AtomicUsize::new(0)));
    }
    model.push(Tanh).push(linear(&mut g, 16, 16)).push(linear(&mut g, 16, 4))
}

struct FailThird(std::sync::atomic::AtomicUsize);

impl Parameters for FailThird {
    fn visit(&self, _walk: &mut Walk<'_>) {}
    fn visit_mut(&mut self, _walk: &mut WalkMut<'_>) -> brasa_nn::Result<()> {
        Ok(())
    }
}

impl Module for FailThird {
    fn forward(&self, input: &Var) -> brasa_nn::Result<Var> {
        if self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 2 {
            return Err(brasa_nn::NnError::invalid("FailThird", "was told to fail"));
        }
        Ok(input.clone())
    }
}

fn data() -> (Tensor, Tensor) {
    let mut g = Generator::new(8);
    let mut values = vec![0f32; 12 * 10];
    g.fill_uniform_f32(&mut values, -1.0, 1.0).unwrap();
    let x = Tensor::from_vec_on(values, [12, 10], Device::CPU).unwrap();
    let y = Tensor::from_vec_on((0..12).map(|i| (i * 3 % 4) as i64).collect::<Vec<_>>(), [12], Device::CPU).unwrap();
    (x, y)
}

fn loss_fn(out: &Var, y: &Tensor) -> brasa_nn::Result<Var> {
    cross_entropy(out, y)
}

#[test]
fn a_pipeline_over_two_ranks_trains_like_the_unsplit_model() {
    const TEST: &str = "a_pipeline_over_two_ranks_trains_like_the_unsplit_model";
    if is_child() {
        abort_job_on_panic();
        let schedule = if std::env::var(CASE).unwrap() == "gpipe" { Schedule::GPipe } else { Schedule::OneFOneB };
        let comm = init_from_env(&CommOptions::default().timeout(Duration::from_secs(20))).unwrap();
        let rank = comm.rank();
        let config = PipelineConfig::new(Partition::Boundaries(vec![3]), 4).schedule(schedule).rng(PipelineRng::Shared);
        let mut pipe = Pipeline::over_ranks(mlp(false), loss_fn, comm.clone(), config).unwrap();
        let sgd = SgdConfig { lr: 0.2, momentum: 0.9, ..Default::default() };
        let mut opt = Sgd::new(pipe.parameters(), sgd).unwrap();
        let reference = mlp(false);
        let mut reference_opt = Sgd::new(reference.parameters(), sgd).unwrap();
        let (x, y) = data();
        for step in 0..3 {
            let loss = pipe.step(&x, &y).unwrap();
            let want = cross_entropy(&reference.forward(&Var::new(x.clone())).unwrap(), &y).unwrap();
            want.backward().unwrap();
            assert!((loss - want.item().unwrap()).abs() < 1e-5, "rank {rank} step {step}: {loss} vs {want:?}");
            opt.step().unwrap();
            opt.zero_grad().unwrap();
            reference_opt.step().unwrap();
            reference_opt.zero_grad().unwrap();
        }
        // This rank's stage against the same layers of the unsplit model.
        let ours = pipe.parameters();
        let layers = pipe.stages()[rank].clone();
        let theirs: Vec<Var> = layers.filter_map(|i| reference.get(i)).flat_map(|l| l.parameters()).collect();
        assert_eq!(ours.len(), theirs.len());
        for (p, r) in ours.iter().zip(&theirs) {
            let (p, r) = (p.tensor().to_vec::<f32>().unwrap(), r.tensor().to_vec::<f32>().unwrap());
            for (a, b) in p.iter().zip(&r) {
                assert!((a - b).abs() <= 1e-5 + 1e-4 * b.abs(), "rank {rank}: {a} vs {b}");
            }
        }
        println!("PIPELINE_OK rank {rank} {}", pipe.report().unwrap().stages[0].spans.len());
        drop(pipe);
        drop(comm);
        return;
    }
    for case in ["gpipe", "1f1b"] {
        let (code, output, elapsed) = mpirun(TEST, case);
        assert_eq!(code, Some(0), "{case}: job failed after {elapsed:?}:\n{output}");
        for rank in 0..2 {
            assert!(
                output.contains(&format!("PIPELINE_OK rank {rank} 8")),
                "{case}: no marker of rank {rank}:\n{output}"
            );
        }
    }
}

#[test]
fn a_failing_stage_on_one_rank_fails_step_on_both_without_hanging() {
    const TEST: &str = "a_failing_stage_on_one_rank_fails_step_on_both_without_hanging";
    if is_child() {
        abort_job_on_panic();
        // Rank 0 learns of rank 1's failure within this timeout at the latest.
        let comm = init_from_env(&CommOptions::default().timeout(Duration::from_secs(3))).unwrap();
        let rank = comm.rank();
        let config = PipelineConfig::new(Partition::Boundaries(vec![3]), 4).rng(PipelineRng::Shared);
        let mut pipe = Pipeline::over_ranks(mlp(true), loss_fn, comm.clone(), config).unwrap();
        let (x, y) = data();
        let start = Instant::now();
        let error = pipe.step(&x, &y).unwrap_err();
        let what = match &error {
            ParallelError::Stage { stage, micro_batch, .. } => format!("stage {stage} micro-batch {micro_batch:?}"),
            other => format!("{other}"),
        };
        println!("STEP_ERR rank {rank} after {:.1}s: {what}: {error}", start.elapsed().as_secs_f64());
        std::io::stdout().flush().unwrap();
        // Let the other rank fail and print before this process leaves
        // (leaving without finalizing MPI makes mpirun end the job).
        std::thread::sleep(Duration::from_secs(if rank == 1 { 6 } else { 1 }));
        std::process::exit(0);
    }
    let (code, output, elapsed) = mpirun(TEST, "");
    assert!(!matches!(code, Some(124) | Some(137) | None), "the job hung ({elapsed:?}):\n{output}");
    assert!(elapsed < Duration::from_secs(25), "took {elapsed:?}:\n{output}");
    assert!(output.contains("STEP_ERR rank 1") && output.contains("stage 1 micro-batch Some(2)"), "{output}");
    assert!(output.contains("STEP_ERR rank 0"), "rank 0's step did not fail:\n{output}");
    let rank0 = output.lines().find(|l| l.contains("STEP_ERR rank 0")).unwrap_or_default();
    let seconds: f64 =
        rank0.split("after ").nth(1).and_then(|s| s.split('s').next()).and_then(|s| s.parse().ok()).unwrap();
    assert!(seconds < 5.0, "rank 0 failed only after {seconds} s: {rank0}");
}
