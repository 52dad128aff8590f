//! The MPI backend across real processes. Each test re-runs this test
//! binary under `mpirun` (2 ranks, shared memory on one machine, or TCP
//! between two network namespaces), with `BRASA_MPI_TEST_CHILD` set so
//! that the same test function runs its rank's part instead; the parent
//! checks the job's exit code and the marker lines the ranks print.
//!
//! Every job is bounded three times: the communicators' timeouts, `mpirun
//! --timeout 60`, and `timeout -k 10 120` around `mpirun`. Every rank
//! installs `abort_job_on_panic`, so a failed assertion in a rank ends the
//! job at once and fails the parent with the ranks' output.
//!
//! Needs Open MPI's `mpirun` on PATH (the `mpi` feature needs it to build
//! anyway). Run: `cargo test -p brasa-parallel --features mpi --test mpi`.
#![cfg(feature = "mpi")]
// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use brasa_nn::functional::cross_entropy;
use brasa_nn::optim::Optimizer;
use brasa_nn::{Module, ModuleExt};
use brasa_parallel::{
    init_from_env, CommOptions, Communicator, DdpConfig, DistributedDataParallel, ParallelError, ReduceOp, Result,
};
use brasa_tensor::{DType, Device, Tensor};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "support/ddp_case.rs"]
mod ddp_case;
#[path = "support/fsdp_case.rs"]
mod fsdp_case;
#[path = "support/job.rs"]
mod job;
#[path = "support/launch.rs"]
mod launch;
use ddp_case::{ddp_batch, ddp_model, parameter_values, sgd};
use fsdp_case::check_fsdp;
use job::{case, is_child, join, local_mpirun, run, Job, Log};
use launch::launcher;

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];
const SIZES: [usize; 5] = [0, 1, 17, 4097, 300_007];
const REDUCE_OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];

// ---------------------------------------------------------------- parent side

// ------------------------------------------------------------------ rank side

/// Rank `rank`'s input at element `i`: small integers and halves, exact in
/// every dtype, as are their sums.
fn value(rank: usize, i: usize) -> f64 {
    ((i * 7 + rank * 13) % 23) as f64 * 0.5 - 5.0
}

fn input(rank: usize, n: usize, dtype: DType) -> Result<Tensor> {
    let data: Vec<f64> = (0..n).map(|i| value(rank, i)).collect();
    Ok(Tensor::from_vec_on(data, [n], Device::CPU)?.to_dtype(dtype)?)
}

fn values(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.to_dtype(DType::F64)?.contiguous()?.to_vec::<f64>()?)
}

/// The naive reference: element `i` reduced over `world` ranks in f64.
fn reference(op: ReduceOp, world: usize, i: usize) -> f64 {
    let values = (0..world).map(|r| value(r, i));
    match op {
        ReduceOp::Sum => values.sum(),
        ReduceOp::Avg => values.sum::<f64>() / world as f64,
        ReduceOp::Max => values.fold(f64::MIN, f64::max),
        ReduceOp::Min => values.fold(f64::MAX, f64::min),
    }
}

fn assert_close(got: &[f64], want: impl Fn(usize) -> f64, dtype: DType, what: &str) {
    let tolerance = match dtype {
        DType::F16 => 1e-2,
        DType::BF16 => 5e-2,
        _ => 1e-9,
    };
    for (i, g) in got.iter().enumerate() {
        let w = want(i);
        assert!((g - w).abs() <= tolerance * w.abs().max(1.0), "{what} {dtype} element {i}: got {g}, want {w}");
    }
}

fn check_collectives(comm: &Communicator) -> Result<()> {
    let (rank, world) = (comm.rank(), comm.world_size());
    for dtype in FLOATS {
        for n in SIZES {
            for op in REDUCE_OPS {
                let x = input(rank, n, dtype)?;
                comm.all_reduce(&x, op)?;
                assert_close(&values(&x)?, |i| reference(op, world, i), dtype, &format!("all_reduce {op:?} n={n}"));

                let big = input(rank, world * n, dtype)?;
                let out = Tensor::zeros_on([n], dtype, Device::CPU)?;
                comm.reduce_scatter(&out, &big, op)?;
                let want = |i| reference(op, world, rank * n + i);
                assert_close(&values(&out)?, want, dtype, &format!("reduce_scatter {op:?} n={n}"));
            }
            check_copies(comm, dtype, n)?;
        }
    }
    // Copies move any dtype, bit for bit.
    for dtype in [DType::Bool, DType::U8, DType::I64] {
        for n in [0, 1, 17, 100_003] {
            check_copies(comm, dtype, n)?;
        }
    }
    comm.barrier()?;
    Ok(())
}

/// Broadcast, all-gather (out of place and in place) and send/recv of `n`
/// elements of `dtype`, against the inputs every rank can recompute.
fn check_copies(comm: &Communicator, dtype: DType, n: usize) -> Result<()> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let what = format!("{dtype} n={n}");
    for root in 0..world {
        let x = input(rank, n, dtype)?;
        comm.broadcast(&x, root)?;
        assert_eq!(values(&x)?, values(&input(root, n, dtype)?)?, "broadcast from {root}, {what}");
    }
    let mine = input(rank, n, dtype)?;
    let all = Tensor::zeros_on([world * n], dtype, Device::CPU)?;
    comm.all_gather(&all, &mine)?;
    let gathered = values(&all)?;
    for r in 0..world {
        assert_eq!(gathered[r * n..(r + 1) * n], values(&input(r, n, dtype)?)?[..], "all_gather slot {r}, {what}");
    }
    let flat = Tensor::zeros_on([world * n], dtype, Device::CPU)?;
    let slot = flat.narrow(0, rank * n, n)?;
    slot.copy_(&mine)?;
    comm.all_gather(&flat, &slot)?;
    assert_eq!(values(&flat)?, gathered, "in-place all_gather, {what}");

    // A ring: even ranks send first, odd ranks receive first.
    let next = (rank + 1) % world;
    let prev = (rank + world - 1) % world;
    let into = Tensor::zeros_on([n], dtype, Device::CPU)?;
    if world > 1 {
        if rank % 2 == 0 {
            comm.send(&mine, next)?;
            comm.recv(&into, prev)?;
        } else {
            comm.recv(&into, prev)?;
            comm.send(&mine, next)?;
        }
        assert_eq!(values(&into)?, values(&input(prev, n, dtype)?)?, "send/recv from {prev}, {what}");
    }
    Ok(())
}

/// NaN wins max and min whichever rank has it; sums and averages of it are NaN.
fn check_nan(comm: &Communicator) -> Result<()> {
    let rank = comm.rank();
    for dtype in FLOATS {
        for op in REDUCE_OPS {
            // Rank r puts a NaN at element r; element `world` has none.
            let mut data: Vec<f64> = vec![rank as f64 + 1.0; comm.world_size() + 1];
            data[rank] = f64::NAN;
            let x = Tensor::from_vec_on(data, [comm.world_size() + 1], Device::CPU)?.to_dtype(dtype)?;
            comm.all_reduce(&x, op)?;
            let got = values(&x)?;
            for (i, g) in got.iter().enumerate().take(comm.world_size()) {
                assert!(g.is_nan(), "{op:?} {dtype}: element {i} should be NaN, got {g}");
            }
            assert!(!got[comm.world_size()].is_nan(), "{op:?} {dtype}: no NaN went into the last element");
        }
    }
    Ok(())
}

/// Several non-blocking collectives in flight while this thread computes;
/// all must complete correctly, in submission order.
fn check_async_overlap(comm: &Communicator) -> Result<()> {
    let (rank, world, n) = (comm.rank(), comm.world_size(), 250_001);
    let xs: Vec<Tensor> = (0..4).map(|_| input(rank, n, DType::F32)).collect::<Result<_>>()?;
    let mine = input(rank, n, DType::BF16)?;
    let all = Tensor::zeros_on([world * n], DType::BF16, Device::CPU)?;
    let b = input(rank, n, DType::F64)?;
    let mut works: Vec<_> = xs.iter().map(|x| comm.all_reduce_async(x, ReduceOp::Sum)).collect();
    works.push(comm.all_gather_async(&all, &mine));
    works.push(comm.broadcast_async(&b, world - 1));
    works.push(comm.barrier_async());
    // Compute while they run (a matmul chain), polling now and then.
    let a = Tensor::full_on([96, 96], 0.01, DType::F32, Device::CPU)?;
    let mut acc = a.clone();
    let mut polls_in_flight = 0;
    for _ in 0..40 {
        acc = acc.matmul(&a)?;
        if !works.iter().all(|w| w.is_completed()) {
            polls_in_flight += 1;
        }
    }
    for work in works {
        work.wait()?;
    }
    println!("rank {rank}: {polls_in_flight} of 40 compute steps overlapped communication");
    for x in &xs {
        assert_close(&values(x)?, |i| reference(ReduceOp::Sum, world, i), DType::F32, "async all_reduce");
    }
    let gathered = values(&all)?;
    for r in 0..world {
        assert_eq!(gathered[r * n..(r + 1) * n], values(&input(r, n, DType::BF16)?)?[..], "async all_gather");
    }
    assert_eq!(values(&b)?, values(&input(world - 1, n, DType::F64)?)?, "async broadcast");
    Ok(())
}

// ---------------------------------------------------------------------- tests

#[test]
fn every_collective_and_dtype_matches_a_naive_reference() {
    if is_child() {
        let comm = join(Duration::from_secs(40));
        // MPI initialises once per process: a second world is an error.
        let again = init_from_env(&CommOptions::default()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(again.contains("already has its MPI world communicator"), "{again}");
        check_collectives(&comm).unwrap();
        check_nan(&comm).unwrap();
        check_async_overlap(&comm).unwrap();
        println!("BRASA-COLLECTIVES-OK rank={}", comm.rank());
        // Dropping says goodbye; every rank does, so MPI finalizes and the
        // job exits 0.
        drop(comm);
        return;
    }
    let job = run(local_mpirun("every_collective_and_dtype_matches_a_naive_reference", ""));
    job.assert_success();
    job.assert_marker("BRASA-COLLECTIVES-OK rank=0");
    job.assert_marker("BRASA-COLLECTIVES-OK rank=1");
}

#[test]
fn ranks_that_disagree_get_errors_naming_both() {
    if is_child() {
        let comm = join(Duration::from_secs(30));
        let rank = comm.rank();
        let peer = 1 - rank;
        let f32x = |n: usize| Tensor::zeros_on([n], DType::F32, Device::CPU).unwrap();
        let (result, expected): (Result<()>, [String; 2]) = match case().as_str() {
            "sizes" => {
                let n = if rank == 0 { 10 } else { 12 };
                (comm.all_reduce(&f32x(n), ReduceOp::Sum), ["10 f32".into(), "12 f32".into()])
            }
            "dtypes" => {
                let dtype = if rank == 0 { DType::F32 } else { DType::BF16 };
                let x = Tensor::zeros_on([4], dtype, Device::CPU).unwrap();
                (comm.all_reduce(&x, ReduceOp::Max), ["4 f32".into(), "4 bf16".into()])
            }
            "collectives" => {
                let x = f32x(8);
                let result = if rank == 0 { comm.all_reduce(&x, ReduceOp::Avg) } else { comm.broadcast(&x, 0) };
                (
                    result,
                    ["all_reduce of 8 f32 elements (avg)".into(), "broadcast of 8 f32 elements from root 0".into()],
                )
            }
            "both-send" => (comm.send(&f32x(3), peer), ["sending".into(), "sending".into()]),
            other => panic!("unknown case {other:?}"),
        };
        let error = result.expect_err("ranks that disagree must get an error");
        let text = error.to_string();
        match &error {
            ParallelError::Mismatch { rank: r, peer: p, .. } => assert!(*r == rank && *p == peer, "{text}"),
            other => panic!("expected a Mismatch, got {other:?}"),
        }
        assert!(text.contains(&format!("rank {rank}")) && text.contains(&format!("rank {peer}")), "{text}");
        for what in &expected {
            assert!(text.contains(what.as_str()), "`{what}` missing from: {text}");
        }
        // The communicator refuses further work, as after any failure.
        assert!(comm.is_broken());
        assert!(matches!(comm.barrier(), Err(ParallelError::Broken { .. })));
        println!("BRASA-MISMATCH rank={rank}: {text}");
        // No data moved and every rank knows: the group is still in step,
        // so dropping finalizes cleanly and the job exits 0.
        drop(comm);
        return;
    }
    for case in ["sizes", "dtypes", "collectives", "both-send"] {
        let job = run(local_mpirun("ranks_that_disagree_get_errors_naming_both", case));
        job.assert_success();
        job.assert_marker("BRASA-MISMATCH rank=0: rank 0:");
        job.assert_marker("BRASA-MISMATCH rank=1: rank 1:");
    }
}

#[test]
fn a_panicking_rank_ends_the_job_at_once() {
    if is_child() {
        let comm = join(Duration::from_secs(50));
        if comm.rank() == 1 {
            std::thread::sleep(Duration::from_millis(300));
            panic!("rank 1 exploded on purpose");
        }
        let x = Tensor::zeros_on([1000], DType::F32, Device::CPU).unwrap();
        let outcome = comm.all_reduce(&x, ReduceOp::Sum);
        // Not reached: the panic hook's MPI_Abort kills this rank first.
        println!("BRASA-UNREACHABLE rank 0 returned from the all-reduce: {outcome:?}");
        std::thread::sleep(Duration::from_secs(30));
        return;
    }
    let job = run(local_mpirun("a_panicking_rank_ends_the_job_at_once", ""));
    // Well before rank 0's 50 s timeout: the job was aborted, not timed out.
    job.assert_failed_without_hanging(Duration::from_secs(30));
    job.assert_marker("rank 1 exploded on purpose");
    assert!(!job.output.contains("BRASA-UNREACHABLE"), "{}", job.describe());
}

#[test]
fn a_stalled_rank_is_a_timeout_not_a_hang() {
    if is_child() {
        // Short, but long enough that both ranks' start-up (which this
        // timeout bounds too) fits in it on a loaded machine.
        let comm = join(Duration::from_secs(5));
        if comm.rank() == 1 {
            // Stalls (a real hang, as far as rank 0 can tell); the job ends
            // long before this returns.
            std::thread::sleep(Duration::from_secs(45));
            return;
        }
        let x = Tensor::zeros_on([1000], DType::F32, Device::CPU).unwrap();
        let start = Instant::now();
        let error = comm.all_reduce(&x, ReduceOp::Sum).expect_err("rank 1 never arrives");
        let waited = start.elapsed();
        assert!(matches!(error, ParallelError::Timeout { rank: 0, op: "all_reduce", .. }), "{error:?}");
        assert!(waited >= Duration::from_secs(4) && waited < Duration::from_secs(15), "the timeout took {waited:?}");
        assert!(comm.is_broken());
        assert!(matches!(comm.all_reduce(&x, ReduceOp::Sum), Err(ParallelError::Broken { .. })));
        // The tensor is usable again: the worker let go of it.
        assert_eq!(x.to_vec::<f32>().unwrap()[0], 0.0);
        println!("BRASA-TIMEOUT-OK rank=0 after {waited:.1?}: {error}");
        // Dropping a communicator whose group is out of step returns at once
        // and does not finalize MPI; exiting without it ends the job.
        let start = Instant::now();
        drop(comm);
        assert!(start.elapsed() < Duration::from_secs(5), "drop took {:?}", start.elapsed());
        return;
    }
    let job = run(local_mpirun("a_stalled_rank_is_a_timeout_not_a_hang", ""));
    job.assert_marker("BRASA-TIMEOUT-OK rank=0");
    // Rank 0 left after its 5 s timeout; the job ended then, not when rank
    // 1 would have woken up (45 s).
    job.assert_failed_without_hanging(Duration::from_secs(30));
}

#[test]
fn a_rank_that_returns_early_fails_its_peer_fast() {
    if is_child() {
        let comm = join(Duration::from_secs(40));
        if comm.rank() == 1 {
            // Returns without taking part: its communicator says goodbye.
            drop(comm);
            println!("BRASA-EARLY rank=1 left");
            // The process lives on a little (as a program doing other work
            // would), so that rank 0 reports before the job ends.
            std::thread::sleep(Duration::from_secs(3));
            return;
        }
        let x = Tensor::zeros_on([1000], DType::F32, Device::CPU).unwrap();
        let start = Instant::now();
        let error = comm.all_reduce(&x, ReduceOp::Sum).expect_err("rank 1 left");
        assert!(matches!(error, ParallelError::PeerFailed { rank: 0, peer: 1, .. }), "{error:?}");
        assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
        println!("BRASA-PEER-LEFT-OK rank=0 after {:.1?}: {error}", start.elapsed());
        drop(comm);
        return;
    }
    let job = run(local_mpirun("a_rank_that_returns_early_fails_its_peer_fast", ""));
    job.assert_marker("BRASA-EARLY rank=1 left");
    job.assert_marker("BRASA-PEER-LEFT-OK rank=0");
    // Neither rank finalized (the group broke up mid-way): the job fails,
    // well before the 40 s timeout.
    job.assert_failed_without_hanging(Duration::from_secs(30));
}

// ------------------------------------------------------- DDP across processes

/// Rank's part: DDP over the job's ranks, step for step equal to one
/// process on the full batch (computed here too), with small buckets (so
/// the rebuild happens) and a no_sync micro-batch in every other step.
/// Prints a marker line when every step matched.
fn check_ddp(comm: &Communicator, steps: usize) -> Result<()> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let reference = ddp_model()?;
    let mut reference_opt = sgd(reference.parameters())?;
    let config = DdpConfig { first_bucket_bytes: 64, bucket_cap_bytes: 256, ..DdpConfig::default() };
    let ddp = DistributedDataParallel::new(ddp_model()?, comm.clone(), config)?;
    let mut opt = sgd(ddp.module().parameters())?;
    for step in 0..steps {
        // Odd steps accumulate a second micro-batch under no_sync first.
        let micro: Vec<usize> = if step % 2 == 1 { vec![100 + step, step] } else { vec![step] };
        for (k, &batch) in micro.iter().enumerate() {
            let (full_x, full_y) = ddp_batch(batch, 0, 1)?;
            cross_entropy(&reference.forward(&brasa_autograd::Var::new(full_x))?, &full_y)?.backward()?;
            let (x, y) = ddp_batch(batch, rank, world)?;
            if k + 1 < micro.len() {
                let _local = ddp.no_sync();
                cross_entropy(&ddp.forward(&brasa_autograd::Var::new(x))?, &y)?.backward()?;
            } else {
                cross_entropy(&ddp.forward(&brasa_autograd::Var::new(x))?, &y)?.backward()?;
            }
        }
        reference_opt.step()?;
        reference_opt.zero_grad()?;
        opt.step()?;
        opt.zero_grad()?;
        let (got, want) = (parameter_values(ddp.module())?, parameter_values(&reference)?);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "rank {rank} step {step} parameter {i}: {g} vs {w}");
        }
    }
    assert!(ddp.buckets_rebuilt(), "the buckets were not rebuilt");
    assert!(ddp.bucket_bytes().len() >= 3, "expected several buckets, got {:?}", ddp.bucket_bytes());
    println!("BRASA-DDP-OK rank={rank} steps={steps} buckets={}", ddp.bucket_bytes().len());
    Ok(())
}

#[test]
fn ddp_over_two_processes_matches_one_process() {
    if is_child() {
        let comm = join(Duration::from_secs(40));
        check_ddp(&comm, 6).unwrap();
        drop(comm);
        return;
    }
    let job = run(local_mpirun("ddp_over_two_processes_matches_one_process", ""));
    job.assert_success();
    job.assert_marker("BRASA-DDP-OK rank=0");
    job.assert_marker("BRASA-DDP-OK rank=1");
}

// ------------------------------------------------ two hosts: network namespaces

/// Two network namespaces joined by a veth pair, each a "host" with one
/// address of 10.77.0.0/24 (mpi.md's recipe), named after this process so
/// concurrent runs never meet. Dropping deletes them (and the veth pair
/// with them), after ending any process still inside that this test
/// started there.
struct Hosts {
    names: [String; 2],
    dir: PathBuf,
}

const HOST_A: &str = "10.77.0.1";
const HOST_B: &str = "10.77.0.2";

fn ip(args: &[&str]) -> std::result::Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

impl Hosts {
    fn create() -> std::result::Result<Hosts, String> {
        let pid = std::process::id();
        let dir = std::env::temp_dir().join(format!("brasa-mpi-hosts-{pid}"));
        let hosts = Hosts { names: [format!("brasa-a-{pid}"), format!("brasa-b-{pid}")], dir };
        let [a, b] = &hosts.names;
        let (va, vb) = (format!("bva{pid}"), format!("bvb{pid}"));
        ip(&["netns", "add", a])?;
        ip(&["netns", "add", b])?;
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        ip(&["link", "set", &va, "netns", a])?;
        ip(&["link", "set", &vb, "netns", b])?;
        ip(&["-n", a, "addr", "add", &format!("{HOST_A}/24"), "dev", &va])?;
        ip(&["-n", b, "addr", "add", &format!("{HOST_B}/24"), "dev", &vb])?;
        for (ns, dev) in [(a, &va), (b, &vb)] {
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        std::fs::create_dir_all(&hosts.dir).map_err(|e| e.to_string())?;
        // The rsh agent: "logging in" to a host is entering its namespace.
        let agent = format!(
            "#!/bin/sh\nhost=$1; shift\ncase \"$host\" in {HOST_A}) ns={a} ;; {HOST_B}) ns={b} ;; *) echo \"nsrsh: \
             unknown host $host\" >&2; exit 1 ;; esac\nexec ip netns exec \"$ns\" sh -c \"$*\"\n"
        );
        std::fs::write(hosts.agent(), agent).map_err(|e| e.to_string())?;
        let status = Command::new("chmod").arg("+x").arg(hosts.agent()).status().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err("chmod +x on the rsh agent failed".into());
        }
        std::fs::write(hosts.hostfile(), format!("{HOST_A} slots=1\n{HOST_B} slots=1\n")).map_err(|e| e.to_string())?;
        Ok(hosts)
    }

    fn agent(&self) -> PathBuf {
        self.dir.join("nsrsh")
    }

    fn hostfile(&self) -> PathBuf {
        self.dir.join("hosts")
    }

    /// mpirun started inside host A, one rank per host, TCP only, over
    /// the veth alone (both for MPI traffic and Open MPI's own).
    fn mpirun(&self, test: &str, case: &str) -> Command {
        let (agent, hostfile) = (path_str(&self.agent()), path_str(&self.hostfile()));
        launcher(
            "ip",
            &[
                "netns",
                "exec",
                &self.names[0],
                "mpirun",
                "-np",
                "2",
                "--hostfile",
                &hostfile,
                "--mca",
                "plm_rsh_agent",
                &agent,
                "--mca",
                "pml",
                "ob1",
                "--mca",
                "btl",
                "self,tcp",
                "--mca",
                "btl_tcp_if_include",
                "10.77.0.0/24",
                "--mca",
                "oob_tcp_if_include",
                "10.77.0.0/24",
                // Open MPI's daemons notice a silent peer through TCP
                // keepalives, by default after 300 s idle and 9 probes 20 s
                // apart; a cluster wants seconds, as here, or a cut link
                // leaves mpirun waiting for --timeout.
                "--mca",
                "oob_tcp_keepalive_time",
                "2",
                "--mca",
                "oob_tcp_keepalive_intvl",
                "1",
                "--mca",
                "oob_tcp_keepalive_probes",
                "3",
                "--bind-to",
                "none",
                "--timeout",
                "60",
            ],
            test,
            case,
        )
    }
}

fn path_str(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for name in &self.names {
            // Only processes inside this test's own namespaces: what it started.
            if let Ok(out) = Command::new("ip").args(["netns", "pids", name]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-KILL", pid]).status();
                }
            }
            let _ = ip(&["netns", "del", name]);
        }
        // The veth pair goes with the namespaces; this is for a creation
        // that failed before moving it into them (named after this process).
        if Command::new("ip")
            .args(["link", "show", &format!("bva{}", std::process::id())])
            .output()
            .is_ok_and(|o| o.status.success())
        {
            let _ = ip(&["link", "del", &format!("bva{}", std::process::id())]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Why this machine cannot run the two-host test, if it cannot.
fn two_hosts_unavailable() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if uid.as_deref() != Some("0") {
        return Some("not root (network namespaces need CAP_SYS_ADMIN)".into());
    }
    if Command::new("ip").arg("-V").output().map(|o| !o.status.success()).unwrap_or(true) {
        return Some("`ip` (iproute2) is not installed".into());
    }
    None
}

/// The namespace this process is in, as `ip netns identify` names it.
fn own_namespace() -> String {
    Command::new("ip")
        .args(["netns", "identify", &std::process::id().to_string()])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

#[test]
fn two_hosts_over_network_namespaces() {
    const TEST: &str = "two_hosts_over_network_namespaces";
    if is_child() {
        // The cut is noticed by this timeout or by Open MPI's keepalives
        // (about 5 s), whichever comes first.
        let comm = join(Duration::from_secs(10));
        let rank = comm.rank();
        println!("BRASA-HOST rank={rank} namespace={}", own_namespace());
        let n = 1 << 20;
        match case().as_str() {
            "all-reduce" => {
                for op in [ReduceOp::Sum, ReduceOp::Max] {
                    let x = input(rank, n, DType::F32).unwrap();
                    comm.all_reduce(&x, op).unwrap();
                    assert_close(&values(&x).unwrap(), |i| reference(op, 2, i), DType::F32, "all_reduce over TCP");
                }
                println!("BRASA-TCP-OK rank={rank}");
                drop(comm);
            }
            "ddp" => {
                check_ddp(&comm, 6).unwrap();
                drop(comm);
            }
            "fsdp" => {
                check_fsdp(&comm, 4, brasa_parallel::FsdpConfig::default()).unwrap();
                drop(comm);
            }
            "cut" => {
                // DDP training until the parent cuts the link; then a step
                // must fail (or Open MPI ends the job), never hang.
                let ddp =
                    DistributedDataParallel::new(ddp_model().unwrap(), comm.clone(), DdpConfig::default()).unwrap();
                let mut opt = sgd(ddp.module().parameters()).unwrap();
                let start = Instant::now();
                let mut round = 0u64;
                while start.elapsed() < Duration::from_secs(50) {
                    let (x, y) = ddp_batch(round as usize % 7, rank, 2).unwrap();
                    let outcome = ddp.forward(&brasa_autograd::Var::new(x)).and_then(|out| {
                        cross_entropy(&out, &y)?.backward()?;
                        opt.step()?;
                        opt.zero_grad()?;
                        Ok(())
                    });
                    match outcome {
                        Ok(()) => {
                            if round == 0 {
                                println!("BRASA-LOOPING rank={rank}");
                            }
                            round += 1;
                        }
                        Err(error) => {
                            println!("BRASA-CUT-ERROR rank={rank} after {round} steps: {error}");
                            return;
                        }
                    }
                }
                panic!("the link was cut but training kept working for 50 s");
            }
            other => panic!("unknown case {other:?}"),
        }
        return;
    }
    if let Some(why) = two_hosts_unavailable() {
        println!("{TEST}: skipped: {why}");
        return;
    }
    let hosts = Hosts::create().unwrap_or_else(|e| panic!("cannot create the two network namespaces: {e}"));

    // 1. One rank per namespace, over TCP between them: correct results.
    let job = run(hosts.mpirun(TEST, "all-reduce"));
    job.assert_success();
    job.assert_marker(&format!("BRASA-HOST rank=0 namespace={}", hosts.names[0]));
    job.assert_marker(&format!("BRASA-HOST rank=1 namespace={}", hosts.names[1]));
    job.assert_marker("BRASA-TCP-OK rank=0");
    job.assert_marker("BRASA-TCP-OK rank=1");

    // 2. DDP across the two hosts: the same parameters as one process.
    let job = run(hosts.mpirun(TEST, "ddp"));
    job.assert_success();
    job.assert_marker("BRASA-DDP-OK rank=0");
    job.assert_marker("BRASA-DDP-OK rank=1");

    // 3. FSDP across the two hosts: the same parameters as one process.
    let job = run(hosts.mpirun(TEST, "fsdp"));
    job.assert_success();
    job.assert_marker("BRASA-FSDP-OK rank=0 world=2");
    job.assert_marker("BRASA-FSDP-OK rank=1 world=2");

    // 4. Cut the link while they train: the job ends with an error.
    let log = Log::new();
    let mut command = hosts.mpirun(TEST, "cut");
    log.attach(&mut command);
    let start = Instant::now();
    let mut child = command.spawn().expect("cannot start mpirun");
    while log.read().matches("BRASA-LOOPING").count() < 2 && start.elapsed() < Duration::from_secs(90) {
        if child.try_wait().ok().flatten().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        log.read().matches("BRASA-LOOPING").count(),
        2,
        "the ranks never reported all-reducing:\n{}",
        log.read()
    );
    let [_, b] = &hosts.names;
    ip(&["-n", b, "link", "set", &format!("bvb{}", std::process::id()), "down"]).expect("cutting the link");
    let cut = Instant::now();
    let status = child.wait().expect("waiting for mpirun");
    let after_cut = cut.elapsed();
    let job = Job { status, output: log.read(), elapsed: after_cut };
    println!("{TEST}: the job ended {after_cut:.1?} after the cut, exit {:?}", status.code());
    // Ended by the communicators' 10 s timeout or Open MPI noticing the
    // lost daemon, well before mpirun --timeout (60 s from the start).
    job.assert_failed_without_hanging(Duration::from_secs(40));
    assert!(
        job.output.contains("BRASA-CUT-ERROR") || job.output.contains("lost communication"),
        "neither a rank nor Open MPI reported the cut: {}",
        job.describe()
    );
    drop(hosts);
}
