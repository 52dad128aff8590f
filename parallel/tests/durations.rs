//! Every duration a user gives the parallel crate, from 0 to
//! `Duration::MAX`, through every door (`CommOptions`, `LaunchOptions`,
//! `DataParallelConfig`, `PipelineConfig`, `Work::wait_timeout` and
//! `BRASA_COMM_TIMEOUT_S`): a clear error or a run that works, never a
//! panic, an abort in a `Drop`, or a hang.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_nn::functional::cross_entropy;
use brasa_nn::optim::{Sgd, SgdConfig};
use brasa_nn::{Linear, Sequential, Tanh};
use brasa_parallel::pipeline::{Partition, Pipeline, PipelineConfig, PipelineRng};
use brasa_parallel::{
    ensure_host_devices, in_process_group, run_in_process, CommOptions, DataParallel, DataParallelConfig,
    LaunchOptions, ParallelError, ReduceOp,
};
use brasa_tensor::{DType, Device, Tensor};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The environment is process-wide: tests that set it, and tests that
/// read it through `CommOptions::default()`, take turns.
static ENV: Mutex<()> = Mutex::new(());

fn env_lock() -> std::sync::MutexGuard<'static, ()> {
    ensure_host_devices(4).unwrap();
    ENV.lock().unwrap_or_else(|e| e.into_inner())
}

/// Durations from nothing to the largest there is.
fn durations() -> Vec<Duration> {
    vec![
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_millis(1),
        Duration::from_secs(30),
        Duration::from_secs(u64::MAX / 2),
        Duration::from_secs(u64::MAX),
        Duration::MAX,
    ]
}

/// A timeout of zero refused by the options' check, the message saying so.
fn zero_refused(error: &ParallelError) -> bool {
    matches!(error, ParallelError::Invalid { op: "CommOptions", message } if message.contains("timeout of 0"))
}

/// An invalid `BRASA_COMM_TIMEOUT_S` refused by the options' check, the
/// message naming the variable to fix.
fn names_the_variable(error: &ParallelError) -> bool {
    matches!(error, ParallelError::Invalid { op: "CommOptions", message } if message.contains("BRASA_COMM_TIMEOUT_S"))
}

fn collectives(timeout: Duration) -> brasa_parallel::Result<Vec<f32>> {
    let options = LaunchOptions { comm: CommOptions::default().timeout(timeout), threads_per_rank: Some(1) };
    let sums = run_in_process(2, &options, |comm| {
        let t = Tensor::full_on([4], comm.rank() as f64 + 1.0, DType::F32, comm.device())?;
        comm.all_reduce(&t, ReduceOp::Sum)?;
        comm.barrier()?;
        let work = comm.all_reduce_async(&t, ReduceOp::Sum);
        work.wait_timeout(timeout.max(Duration::from_secs(30)))?;
        Ok(t.to_vec::<f32>()?[0])
    })?;
    Ok(sums)
}

#[test]
fn communicator_timeouts_from_zero_to_max_work_or_are_refused() {
    let _env = env_lock();
    for timeout in durations() {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| collectives(timeout)));
        let outcome = outcome.unwrap_or_else(|_| panic!("a timeout of {timeout:?} panicked"));
        if timeout.is_zero() {
            let error = outcome.unwrap_err();
            assert!(zero_refused(&error), "{error:?}");
        } else if timeout >= Duration::from_secs(30) {
            assert_eq!(outcome.unwrap(), [6.0, 6.0], "{timeout:?}");
        }
        // 1 ns and 1 ms may time out or not; neither may panic.
    }
}

#[test]
fn a_long_timeout_still_ends_when_a_peer_leaves() {
    let _env = env_lock();
    for timeout in [Duration::from_secs(u64::MAX), Duration::MAX] {
        let options = LaunchOptions { comm: CommOptions::default().timeout(timeout), threads_per_rank: Some(1) };
        let start = Instant::now();
        let outcome = run_in_process(2, &options, |comm| {
            if comm.rank() == 1 {
                return Ok(());
            }
            comm.barrier()
        });
        assert!(matches!(outcome, Err(ParallelError::PeerFailed { peer: 1, .. })), "{outcome:?}");
        assert!(start.elapsed() < Duration::from_secs(20));
    }
}

#[test]
fn dropping_communicators_with_any_timeout_does_not_panic() {
    let _env = env_lock();
    for timeout in durations().into_iter().filter(|t| !t.is_zero()) {
        let comms =
            in_process_group(&[Device::cpu(0), Device::cpu(1)], &CommOptions::default().timeout(timeout)).unwrap();
        let work = comms[0].barrier_async();
        drop(comms);
        // The barrier cannot complete: rank 1 left.
        assert!(work.wait_timeout(Duration::MAX).is_err());
    }
}

#[test]
fn work_wait_timeout_takes_any_duration() {
    let _env = env_lock();
    let options = CommOptions::default().timeout(Duration::from_secs(30));
    let t = Tensor::ones_on([3], DType::F32, Device::cpu(0)).unwrap();
    for timeout in durations() {
        // A wait that times out breaks its communicator: one group each.
        let comms = in_process_group(&[Device::cpu(0)], &options).unwrap();
        let outcome = comms[0].all_reduce_async(&t, ReduceOp::Sum).wait_timeout(timeout);
        if timeout >= Duration::from_secs(30) {
            assert!(outcome.is_ok(), "{timeout:?}: {outcome:?}");
            // Completed work returns at once whatever the timeout.
            let work = comms[0].barrier_async();
            std::thread::sleep(Duration::from_millis(10));
            assert!(work.wait_timeout(timeout).is_ok());
        }
    }
}

/// Runs `body` with `BRASA_COMM_TIMEOUT_S` set to `value` (unset after).
fn with_env<T>(value: &str, body: impl FnOnce() -> T) -> T {
    // Tests that touch the environment hold ENV: no other thread of this
    // test binary reads or writes it meanwhile.
    std::env::set_var("BRASA_COMM_TIMEOUT_S", value);
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
    std::env::remove_var("BRASA_COMM_TIMEOUT_S");
    out.unwrap_or_else(|_| panic!("BRASA_COMM_TIMEOUT_S={value} panicked"))
}

#[test]
fn comm_timeout_env_is_checked_or_saturated() {
    let _env = env_lock();
    // Fine, or more than a Duration holds: waiting "forever" is what was asked.
    for (value, want) in [
        ("2.5", Duration::from_millis(2500)),
        (" 60 ", Duration::from_secs(60)),
        ("1e19", Duration::from_secs_f64(1e19)),
        ("1e30", Duration::MAX),
        ("1e308", Duration::MAX),
        ("inf", Duration::MAX),
    ] {
        with_env(value, || {
            let options = CommOptions::from_env().unwrap_or_else(|e| panic!("{value}: {e}"));
            assert_eq!(options.timeout, want, "{value}");
            assert_eq!(CommOptions::default().timeout, want, "{value}");
            assert_eq!(collectives(CommOptions::default().timeout).unwrap(), [6.0, 6.0], "{value}");
            let comm = brasa_parallel::init_from_env(&CommOptions::default()).unwrap();
            comm.barrier().unwrap();
        });
    }
    // Not a positive number of seconds: an error naming the variable, from
    // `from_env` and from every communicator started with the defaults.
    for value in ["NaN", "-1", "-inf", "0", "-0", "abc", "", "1e-400"] {
        with_env(value, || {
            let error = CommOptions::from_env().unwrap_err();
            assert!(names_the_variable(&error), "{value}: {error:?}");
            let error = brasa_parallel::init_from_env(&CommOptions::default()).unwrap_err();
            assert!(names_the_variable(&error), "{value}: {error:?}");
            let launch = LaunchOptions::default();
            let error = run_in_process(2, &launch, |_| Ok(())).unwrap_err();
            assert!(names_the_variable(&error), "{value}: {error:?}");
            // The API wins over the variable.
            let explicit = CommOptions::default().timeout(Duration::from_secs(30));
            brasa_parallel::init_from_env(&explicit).unwrap().barrier().unwrap();
        });
    }
}

fn mlp(device: Device) -> brasa_nn::Result<Sequential> {
    Ok(Sequential::new().push(Linear::new(4, 8, device)?).push(Tanh).push(Linear::new(8, 3, device)?))
}

#[test]
fn data_parallel_takes_any_timeout() {
    let _env = env_lock();
    let x = Tensor::ones_on([6, 4], DType::F32, Device::CPU).unwrap();
    let y = Tensor::zeros_on([6], DType::I64, Device::CPU).unwrap();
    for timeout in durations() {
        let config = DataParallelConfig {
            comm: CommOptions::default().timeout(timeout),
            threads_per_device: Some(1),
            ..Default::default()
        };
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> brasa_parallel::Result<f64> {
            let devices = [Device::cpu(0), Device::cpu(1)];
            let mut dp = DataParallel::with_config(
                &devices,
                mlp,
                |params| Sgd::new(params, SgdConfig { lr: 0.1, ..Default::default() }),
                config.clone(),
            )?;
            let loss = dp.step(&x, &y, cross_entropy)?;
            drop(dp);
            Ok(loss)
        }));
        let outcome = outcome.unwrap_or_else(|_| panic!("DataParallel with a timeout of {timeout:?} panicked"));
        if timeout.is_zero() {
            let error = outcome.unwrap_err();
            assert!(zero_refused(&error), "{error:?}");
        } else if timeout >= Duration::from_secs(30) {
            assert!(outcome.unwrap().is_finite());
        }
    }
}

#[test]
fn pipeline_takes_any_timeout() {
    let _env = env_lock();
    let x = Tensor::ones_on([4, 4], DType::F32, Device::cpu(0)).unwrap();
    let y = Tensor::zeros_on([4], DType::I64, Device::cpu(0)).unwrap();
    for timeout in durations() {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> brasa_parallel::Result<f64> {
            let config = PipelineConfig::new(Partition::Boundaries(vec![2]), 2)
                .rng(PipelineRng::Shared)
                .threads_per_stage(1)
                .timeout(timeout);
            let mut pipe = Pipeline::new(mlp(Device::cpu(0))?, cross_entropy, config)?;
            let loss = pipe.step(&x, &y)?;
            drop(pipe);
            Ok(loss)
        }));
        let outcome = outcome.unwrap_or_else(|_| panic!("a pipeline with a timeout of {timeout:?} panicked"));
        if timeout.is_zero() {
            let error = outcome.unwrap_err();
            assert!(zero_refused(&error), "{error:?}");
        } else if timeout >= Duration::from_secs(30) {
            assert!(outcome.unwrap().is_finite());
        }
    }
}

#[test]
fn pipeline_defaults_check_the_env() {
    let _env = env_lock();
    for value in ["NaN", "abc", "-3"] {
        with_env(value, || {
            let x = Tensor::ones_on([4, 4], DType::F32, Device::cpu(0)).unwrap();
            let y = Tensor::zeros_on([4], DType::I64, Device::cpu(0)).unwrap();
            let config = PipelineConfig::new(Partition::Boundaries(vec![2]), 2);
            let error = Pipeline::new(mlp(Device::cpu(0)).unwrap(), cross_entropy, config)
                .and_then(|mut p| p.step(&x, &y))
                .unwrap_err();
            assert!(names_the_variable(&error), "{value}: {error:?}");
        });
    }
    with_env("1e30", || {
        assert_eq!(PipelineConfig::new(Partition::Boundaries(vec![2]), 2).timeout, Duration::MAX);
    });
}
