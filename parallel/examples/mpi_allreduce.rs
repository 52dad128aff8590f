//! In-place all-reduce bandwidth through the MPI backend: 64 MiB of f32,
//! summed over the ranks, best of 5 timed runs after a warm-up, the result
//! checked every time. Prints the bus bandwidth as nccl-tests defines it,
//! busbw = S/t · 2(n−1)/n (S the buffer's bytes, t the time, n the
//! ranks), so MPI, in-process and NCCL numbers share one unit.
//!
//! ```text
//! cargo build --release -p brasa-parallel --features mpi --example mpi_allreduce
//! mpirun -np 2 --oversubscribe --bind-to none --mca pml ob1 --mca btl self,vader \
//!     --mca oob_tcp_if_include lo target/release/examples/mpi_allreduce
//! ```
//!
//! (As root, also set `OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1`.)

use brasa_parallel::{abort_job_on_panic, init_from_env, CommOptions, ParallelError, ReduceOp, Result};
use brasa_tensor::{DType, Device, Tensor};
use std::time::Instant;

const BYTES: usize = 64 << 20;
const RUNS: usize = 5;

fn main() -> Result<()> {
    abort_job_on_panic();
    let comm = init_from_env(&CommOptions::default())?;
    let (rank, world) = (comm.rank(), comm.world_size());
    let n = BYTES / std::mem::size_of::<f32>();
    let x = Tensor::zeros_on([n], DType::F32, Device::CPU)?;
    // Rank r contributes r + 1 everywhere: the sum is n(n+1)/2, exact in f32.
    let expected = (world * (world + 1) / 2) as f32;
    let mut best = f64::INFINITY;
    for run in 0..=RUNS {
        x.fill_((rank + 1) as f64)?;
        comm.barrier()?;
        let start = Instant::now();
        comm.all_reduce(&x, ReduceOp::Sum)?;
        let local = start.elapsed().as_secs_f64();
        // The slowest rank's time is the collective's time.
        let slowest = Tensor::full_on([1], local, DType::F64, Device::CPU)?;
        comm.all_reduce(&slowest, ReduceOp::Max)?;
        let seconds = slowest.to_vec::<f64>()?[0];
        let values = x.to_vec::<f32>()?;
        if let Some(i) = values.iter().position(|v| *v != expected) {
            return Err(ParallelError::invalid(
                "mpi_allreduce",
                format!("run {run}: element {i} is {} instead of {expected}", values[i]),
            ));
        }
        if run > 0 {
            best = best.min(seconds); // run 0 is the warm-up
        }
    }
    if rank == 0 {
        let algbw = BYTES as f64 / best / 1e9;
        let busbw = algbw * 2.0 * (world as f64 - 1.0) / world as f64;
        println!(
            "mpi_allreduce: {world} ranks, {} MiB f32 in place, best of {RUNS}: {:.2} ms",
            BYTES >> 20,
            best * 1e3
        );
        println!("parallel.mpi_allreduce_algbw_gbs={algbw:.3}");
        println!("parallel.mpi_allreduce_busbw_gbs={busbw:.3}");
        println!("cpu={}", cpu_model());
    }
    drop(comm);
    Ok(())
}

/// `lscpu`'s model name, or what went wrong asking for it.
fn cpu_model() -> String {
    match std::process::Command::new("lscpu").output() {
        Ok(out) => String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|line| line.strip_prefix("Model name:").map(|m| m.trim().to_string()))
            .unwrap_or_else(|| "unknown (lscpu printed no model name)".into()),
        Err(e) => format!("unknown (lscpu: {e})"),
    }
}
